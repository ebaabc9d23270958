"""RLOO > REINFORCE (moving-average baseline) >= vanilla PG > PPO, in reward and win rate.

Ahmadian et al. (2024) report RLOO beating PPO (their central statement), and, along
the way, RLOO beating REINFORCE with a moving-average baseline, which ties vanilla
policy gradient on Pythia and beats it on Llama, which beats PPO, in reward-model
reward and in GPT-4 win rate against reference completions. Here: the review world's
SFT policy and proxy reward model (as claim 14), then each algorithm for the same
steps, episodes and seeds, with the paper's two gradient steps per batch for every
algorithm (``n_epochs=1, n_minibatches=2``; ``matched_budget="gradient_steps"``),
beta 0.05, RLOO k = 4. Vanilla policy gradient is ``PPOPolicy(clip=False,
use_ratio=False, gae_lambda=1)``: reward-to-go minus a learned value baseline, no
ratio, no clip. Reward = the proxy reward model's mean score of 2 samples of every
prompt at the end; win rate = share of those samples whose gold (VADER) reward beats
the reference completion's (ties half), the judge the papers' GPT-4 stands for.

What changed from the first run (798301a: one shared, untuned rate 1e-3, 10 seeds,
no health check), and why (issue 25's audit: at that rate RLOO's runs collapsed in 4
of 10 seeds, vanilla PG's in 4, REINFORCE's in 3 and PPO's in none, so failures
decided the links; and the source's central statement, RLOO > PPO, was not tested):

- Each algorithm is tuned on its own learning-rate grid, 1e-4, 3e-4, 1e-3, with
  ``compare(tune=...)`` on tuning seeds 100 and 101 (disjoint from the evaluation
  seeds), ranked by the KL-regularised objective all four maximise
  (``objective/rlhf_reward``, mean of the last 5 steps); a candidate with an
  unhealthy tuning run ranks after every healthy one. The first run's 1e-3 is the
  top of the grid: in timing fits on seed 100 (40 steps of 64) every algorithm
  tripped ``kl_blowup`` at 3e-3, and RLOO and vanilla PG at 1e-3, while all four
  were healthy at 3e-4 (the paper, too, kept rates well below the point of collapse).
- Unhealthy runs (any detector of ``health_`` fired; ``on_unhealthy="ignore"`` so that
  it still records) are failures, counted per algorithm with the detectors' names,
  never averaged into an interval.
- The central statement RLOO > PPO is a part of the rule, beside the three links.
- 16 evaluation seeds (0-15) instead of 10, for a smaller minimum detectable difference.
- Beside every win rate, the floor: the win rate of the empty answer and of the SFT
  start against the same references (an empty answer ties or beats a poor reference
  about half the time here, so a collapsed run's win rate sits near 0.52).

Verdict rule, fixed before the full run. Four comparisons, each in win rate (margin
0.02: 2 points, a smaller difference is called none) and in proxy reward (margin 0.1:
a tenth of the SFT samples' reward spread, the unit the reward model is normalised
in), 8 parts in all, each the 95% t-interval of the paired difference over the
evaluation seeds judged by :func:`prefopt.model_selection.verdict`: (C) the central
statement RLOO - PPO "better"; (L1) RLOO - REINFORCE "better"; (L2) REINFORCE - VPG
"better" or "equivalent" (a tie is allowed); (L3) VPG - PPO "better". A part holds when
its verdict is one named, is undecided when "inconclusive", and is refuted otherwise.
(Issue 36 changed two things after this run, and its verdict was regenerated from the
committed CSV: every evaluation seed counts, an unhealthy run with the score it ended
with, where the first rule compared only seeds healthy in both runs and left a
comparison with under 12 of 16 such seeds undecided; and the margin rule is monotone,
"better" meaning better by at least the margin, "better or equivalent" an interval
above -margin.) "reproduced" if all 8
parts hold, "not reproduced" if all are refuted, "partly reproduced" for a mix,
"inconclusive" if any is undecided; the central statement's status is reported first.
With 16 seeds the minimum detectable difference at 80% power is about 0.75 standard
deviations of the per-seed differences (more where pairs were unhealthy), reported
beside each interval; the first run's win-rate differences had standard deviations
of 0.17-0.26, which would put the MDD near 0.13-0.2.

Run::

    python benchmarks/reproduce/claim10_rloo_reinforce_vpg_ppo.py          # ~6.5 min on 2 cores
    python benchmarks/reproduce/claim10_rloo_reinforce_vpg_ppo.py --quick  # under a minute

(Estimate: 88 fits of 40 steps at 5-9 s each, 24 of them tuning, and 80 evaluations
at about 1 s, on 2 processes, plus 25 s for the SFT policy and reward model.)
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from _common import (
    REVIEW_FULL,
    REVIEW_QUICK,
    HistoryMean,
    environ_threads,
    finish,
    fired_detectors,
    fmt,
    fmt_mdd,
    interval_with_mdd,
    mean_ci,
    new_figure,
    parse_args,
    part_status,
    parts_verdict,
    review_metrics,
    review_setup,
)
from _common import settings as choose
from sklearn.utils.parallel import Parallel, delayed

from prefopt import PPOPolicy, ReinforcePolicy, RLOOPolicy
from prefopt.model_selection import compare

FULL = dict(
    **REVIEW_FULL,
    steps=40,
    batch_size=64,
    seeds=16,
    eval_prompts=None,
    learning_rates=(1e-4, 3e-4, 1e-3),
    tuning_seeds=(100, 101),
    last=5,
    jobs=2,
)
QUICK = dict(
    **REVIEW_QUICK,
    steps=2,
    batch_size=8,
    seeds=2,
    eval_prompts=4,
    learning_rates=(3e-4, 1e-3),
    tuning_seeds=(100,),
    last=1,
    jobs=1,
)
ALGORITHMS = ("RLOO", "REINFORCE", "VPG", "PPO")
BETA = 0.05
MARGINS = {"win_rate": 0.02, "proxy": 0.1}  # win-rate points; SFT-sample reward std
# (part, first, second, verdicts under which the part holds)
COMPARISONS = [
    ("C RLOO > PPO (central)", "RLOO", "PPO", ("better",)),
    ("L1 RLOO > REINFORCE", "RLOO", "REINFORCE", ("better",)),
    ("L2 REINFORCE >= VPG", "REINFORCE", "VPG", ("better", "equivalent")),
    ("L3 VPG > PPO", "VPG", "PPO", ("better",)),
]
COLUMNS = [
    "phase",
    "algorithm",
    "learning_rate",
    "seed",
    "healthy",
    "fired",
    "n_unhealthy",
    "selected",
    "objective",
    "proxy",
    "win_rate",
    "gold",
    "kl",
    "words",
    "distinct",
    "eos_share",
]
# Verdict rule (see the docstring), 16 evaluation seeds: C RLOO - PPO, L1 RLOO - REINFORCE,
# L3 VPG - PPO "better", L2 REINFORCE - VPG "better" or "equivalent", each in win rate
# (margin 0.02) and proxy reward (margin 0.1); a comparison with under 12 of 16 seeds
# healthy in both runs is undecided; any part undecided: "inconclusive".


def decide(ev: pd.DataFrame) -> tuple:
    """The rule on the evaluation rows: ``(stats, parts, n_healthy, verdict)``.

    Issue 36: every evaluation seed counts (an unhealthy run keeps the score it ended
    with), and each part is read by :func:`_common.part_status` (the monotone margin
    rule; "better or equivalent" holds when the interval lies above -margin).
    ``n_healthy`` counts the seeds healthy in both runs of a pair, for the report.
    """
    healthy = ev.pivot(index="seed", columns="algorithm", values="healthy").astype(bool)
    stats, parts, n_healthy = {}, {}, {}
    for part, a, b, holds_when in COMPARISONS:
        n_healthy[a, b] = int((healthy[a] & healthy[b]).sum())
        for metric, margin in MARGINS.items():
            wide = ev.pivot(index="seed", columns="algorithm", values=metric)
            stats[a, b, metric] = interval_with_mdd(wide[a] - wide[b], margin)
            parts[f"{part} in {metric}"] = part_status(stats[a, b, metric], holds_when)
    return stats, parts, n_healthy, parts_verdict(parts)


def make_policy(name, sft, s):
    """One of the four at 2 gradient steps a batch, recording health without stopping."""
    common = dict(
        model=sft,
        beta=BETA,
        batch_size=s["batch_size"],
        n_steps=s["steps"],
        n_epochs=1,
        n_minibatches=2,
        on_unhealthy="ignore",  # health_ still records every detector
    )
    if name == "RLOO":
        return RLOOPolicy(k=4, **common)
    if name == "REINFORCE":
        return ReinforcePolicy(**common)
    if name == "VPG":
        return PPOPolicy(clip=False, use_ratio=False, gae_lambda=1.0, **common)
    return PPOPolicy(**common)


def measure(world, rm, prompts, policy, seed):
    """Health and end metrics of a fitted policy (the SFT start: healthy, as it is)."""
    health = getattr(policy, "health_", None) or {}
    return {
        "healthy": bool(health.get("healthy", True)),
        "fired": fired_detectors(policy),
        **review_metrics(world, policy, rm, prompts, seed=seed),
    }


def empty_win_rate(world, prompts) -> float:
    """The win rate of the empty answer against the references (gold judge, ties half)."""
    ref_text = dict(zip(world.references["prompt"], world.references["completion"]))
    empty = world.gold_reward(prompts, [""] * len(prompts))
    ref = world.gold_reward(prompts, [ref_text[p] for p in prompts])
    return float(np.mean((empty > ref) + 0.5 * (empty == ref)))


def main(argv=None):
    environ_threads()
    args = parse_args(__doc__, argv, jobs=(int, None, "parallel fits (default: 2, 1 quick)"))
    s = choose(args, FULL, QUICK)
    s["jobs"] = args.jobs or s["jobs"]
    world, sft, rm = review_setup(**{k: s[k] for k in REVIEW_FULL})
    prompts = world.prompts[: s["eval_prompts"]]
    seeds = list(range(s["seeds"]))
    result = compare(
        {name: make_policy(name, sft, s) for name in ALGORITHMS},
        world.prompts,
        reward_model=rm,
        seeds=seeds,
        tune={name: {"learning_rate": list(s["learning_rates"])} for name in ALGORITHMS},
        tuning_seeds=list(s["tuning_seeds"]),
        scoring={"objective": HistoryMean("objective/rlhf_reward", s["last"])},
        matched_budget="gradient_steps",
        return_estimators=True,
        n_jobs=s["jobs"],
    )
    rate = {name: result.tuned_params[name]["learning_rate"] for name in ALGORITHMS}
    rows = [
        {
            "phase": "tuning",
            "algorithm": t.algorithm,
            "learning_rate": t.param_learning_rate,
            "n_unhealthy": t.n_unhealthy,
            "selected": t.selected,
            "objective": t.mean,
        }
        for t in result.tuning.itertuples()
    ]
    tasks = [
        (name, rate[name], est, seed)
        for name in ALGORITHMS
        for seed, est in zip(result.seeds, result.estimators[name])
    ]
    tasks += [("SFT", 0.0, sft, seed) for seed in seeds]
    measured = Parallel(n_jobs=s["jobs"])(
        delayed(measure)(world, rm, prompts, policy, seed) for _, _, policy, seed in tasks
    )
    for (name, lr, policy, seed), m in zip(tasks, measured):
        rows.append(
            {
                "phase": "evaluation",
                "algorithm": name,
                "learning_rate": lr,
                "seed": seed,
                "objective": (
                    np.nan
                    if name == "SFT"
                    else HistoryMean("objective/rlhf_reward", s["last"])(policy, None)
                ),
                **m,
            }
        )
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    ev = frame[frame.phase == "evaluation"]
    floor = empty_win_rate(world, prompts)
    sft_win = mean_ci(ev[ev.algorithm == "SFT"].win_rate)[0]

    stats, parts, n_healthy, verdict = decide(ev)

    def healthy_values(name, metric):  # every seed (intention to treat), despite the name
        return ev[ev.algorithm == name][metric].to_numpy(dtype=float)

    unhealthy = []
    for name in ALGORITHMS:
        sub = ev[ev.algorithm == name]
        bad = sub[~sub.healthy.astype(bool)]
        fired = sorted({f for f in bad.fired if f})
        unhealthy.append(
            f"{name} {len(bad)} of {len(sub)}" + (f" ({', '.join(fired)})" if fired else "")
        )
    tuning_bad = frame[(frame.phase == "tuning") & (frame.n_unhealthy > 0)]

    fig, axes = new_figure(2)
    x = np.arange(len(ALGORITHMS))
    for ax, metric, label in zip(
        axes, ("win_rate", "proxy"), ("win rate vs references (gold judge)", "proxy reward")
    ):
        ci = [mean_ci(healthy_values(name, metric)) for name in ALGORITHMS]
        m = np.array([v[0] for v in ci])
        err = [m - np.array([v[1] for v in ci]), np.array([v[2] for v in ci]) - m]
        ax.errorbar(x, m, yerr=err, fmt="o", capsize=4)
        ax.set_xticks(x, [f"{n}\n{rate[n]:g}" for n in ALGORITHMS])
        ax.set_ylabel(label)
    axes[0].axhline(floor, color="0.5", ls=":", lw=1, label="empty answer")
    axes[0].axhline(sft_win, color="0.5", ls="--", lw=1, label="SFT start")
    axes[0].legend()
    axes[0].set_title(f"all {len(seeds)} seeds, 95% CI")
    central = parts["C RLOO > PPO (central) in win_rate"]
    chosen = ", ".join(f"{n} {rate[n]:g}" for n in ALGORITHMS)
    reason = (
        f"Central statement RLOO > PPO: win rate {central}, proxy "
        f"{parts['C RLOO > PPO (central) in proxy']}. "
        + "; ".join(f"{k}: {v}" for k, v in parts.items())
        + ". Paired differences over every evaluation seed (intention to treat): "
        + "; ".join(
            f"{a} - {b} win rate {fmt_mdd(stats[a, b, 'win_rate'])}, proxy "
            f"{fmt_mdd(stats[a, b, 'proxy'])}"
            for _, a, b, _ in COMPARISONS
        )
        + f" (margins: win rate {MARGINS['win_rate']}, proxy {MARGINS['proxy']}). Floor: the "
        f"empty answer wins {floor:.2f}, the SFT start {sft_win:.2f}. Learning rates tuned "
        f"on seeds {list(result.tuning_seeds)}: {chosen}"
        + (
            "; unhealthy tuning candidates: "
            + ", ".join(
                f"{t.algorithm} {t.learning_rate:g} ({t.n_unhealthy} of {len(result.tuning_seeds)})"
                for t in tuning_bad.itertuples()
            )
            if len(tuning_bad)
            else ""
        )
        + ". Unhealthy evaluation runs: "
        + "; ".join(unhealthy)
        + ". Seeds healthy in both runs: "
        + ", ".join(f"{a}/{b} {n} of {len(seeds)}" for (a, b), n in n_healthy.items())
        + " (every seed counts; an unhealthy run keeps its score)."
    )
    return finish(
        args,
        "claim10_rloo_reinforce_vpg_ppo",
        frame,
        fig,
        number=10,
        claim="RLOO beats PPO; on the way, RLOO beats REINFORCE with a moving-average baseline, "
        "which ties or beats vanilla policy gradient, which beats PPO, in reward and in win "
        "rate against references",
        source="Ahmadian et al. 2024",
        setting=f"review world, beta {BETA}, 2 gradient steps a batch for all, {s['steps']} "
        f"steps of {s['batch_size']}, RLOO k=4, lr tuned per algorithm over "
        f"{', '.join(f'{v:g}' for v in s['learning_rates'])} on {len(s['tuning_seeds'])} "
        f"tuning seeds, {len(seeds)} evaluation seeds, unhealthy runs counted as failures, kept",
        result="; ".join(
            f"{n} (lr {rate[n]:g}) win {fmt(*mean_ci(healthy_values(n, 'win_rate')), digits=2)}, "
            f"reward {fmt(*mean_ci(healthy_values(n, 'proxy')), digits=2)}"
            for n in ALGORITHMS
        )
        + f" (all seeds; empty answer wins {floor:.2f}, SFT {sft_win:.2f}); unhealthy: "
        + ", ".join(unhealthy),
        verdict=verdict,
        reason=reason,
    )


if __name__ == "__main__":
    main()
