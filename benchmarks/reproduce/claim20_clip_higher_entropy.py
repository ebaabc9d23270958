"""Clip-higher (a wider upper clip, 0.2/0.28) keeps the policy's entropy from collapsing.

Yu et al. (2025), "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476, list among their techniques "Clip-Higher, which promotes the diversity
of the system and avoids entropy collapse", having observed with naive PPO or GRPO that
the entropy of the policy decreases quickly as training progresses (their section 3.1).
The mechanism: the upper clip bound 1 + epsilon caps how far a low-probability token with
a positive advantage can rise in one update, while a likely token is barely limited, so
a symmetric clip favours exploitation; ``epsilon_high=0.28`` with ``clip_coef=0.2``
(``epsilon_low``) relaxes the cap.

Setting: the arithmetic world (two-digit sums, SFT start as ``benchmarks/verifiable_world.py``),
``GRPOPolicy`` at prefopt's defaults (k = 8, DAPO's token-level ``loss_type="dapo"``,
the SFT model's ``max_new_tokens``, the missing-EOS reward) with beta 0 (DAPO's and TRL's
setting; ``log_kl=True`` keeps the KL measured for the health detectors) and
``n_minibatches=4``: four gradient steps per batch, so the ratio leaves 1 and the clip
binds (with one gradient step a batch the ratio is 1 and neither clip ever acts).
Symmetric clip (``epsilon_high=None``, 0.2 both sides) against clip-higher
(``epsilon_high=0.28``), everything else the same, including the learning rate: the
clip does not change the gradient's scale, so one rate isolates it. That rate is tuned
for the symmetric clip (the configuration the claim says collapses) over 1e-4, 3e-4 and
1e-3 on tuning seeds 100 and 101 with ``compare(tune=...)``, ranked by the mean training
reward of the last 10 steps, a candidate with an unhealthy run ranking after every
healthy one; both arms then run at it on evaluation seeds 0-7. Rewarded by
``world.correctness_reward``. The measured quantity: ``policy/entropy`` (the mean
per-token entropy of the policy on its sampled responses, at the sampling temperature,
in nats), at the end (the mean of the last 10 steps) and at the start (step 1, the
starting policy's samples).

Verdict rule, fixed before the first full run. Margin: a tenth of the starting policy's
entropy (the mean step-1 entropy of all evaluation runs; the entropy can fall at most by
all of it, so a tenth is the smallest change we call a collapse or a rescue). With 95%
t-intervals over the evaluation seeds and :func:`prefopt.model_selection.verdict` at that
margin, two parts: (A) under the symmetric clip the entropy falls, end minus start
"worse"; (B) clip-higher keeps more, the paired end-entropy difference clip-higher -
symmetric "better". A part whose interval is "inconclusive" is undecided, and one that
contradicts it is refuted. "reproduced" if both hold, "not reproduced" if both are
refuted, "partly reproduced" for a mix (for example clip-higher keeps more entropy
although the symmetric clip did not collapse), "inconclusive" if either is undecided.
Unhealthy runs (any detector of ``health_`` fired) are failures, counted and reported
with their detectors. (Issue 36 changed the rule after this run, and the verdict was
regenerated from the committed CSV: every seed counts, an unhealthy run with the entropy
it ended with, where a seed with an unhealthy run left the comparison and under 6 of 8
such seeds gave "inconclusive"; the parts are read by the monotone margin rule.)
With 8 seeds the minimum detectable difference at 80% power is about 1.15 standard
deviations of the per-seed differences, reported beside each interval.

Run::

    python benchmarks/reproduce/claim20_clip_higher_entropy.py          # ~7 min on 2 cores (est.)
    python benchmarks/reproduce/claim20_clip_higher_entropy.py --quick  # under a minute
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from _common import (
    ARITHMETIC_FULL,
    ARITHMETIC_QUICK,
    HistoryMean,
    arithmetic_sft,
    environ_threads,
    finish,
    fired_detectors,
    fmt_mdd,
    interval_with_mdd,
    new_figure,
    parse_args,
    part_status,
    parts_verdict,
)
from _common import settings as choose

from prefopt import GRPOPolicy
from prefopt.model_selection import compare

FULL = dict(
    **ARITHMETIC_FULL,
    steps=80,
    batch_size=64,
    seeds=8,
    learning_rates=(1e-4, 3e-4, 1e-3),
    tuning_seeds=(100, 101),
    last=10,
    jobs=2,
)
QUICK = dict(
    **ARITHMETIC_QUICK,
    steps=3,
    batch_size=16,
    seeds=2,
    learning_rates=(1e-4, 1e-3),
    tuning_seeds=(100,),
    last=1,
    jobs=1,
)
ARMS = {"symmetric": None, "clip-higher": 0.28}  # epsilon_high; clip_coef (epsilon_low) 0.2
MARGIN_SHARE = 0.1  # of the starting entropy (see the docstring)
COLUMNS = [
    "phase",
    "arm",
    "learning_rate",
    "seed",
    "healthy",
    "fired",
    "n_unhealthy",
    "selected",
    "train_reward",
    "entropy_start",
    "entropy_end",
    "entropy_change",
    "clipfrac",
]
# Verdict rule (see the docstring), margin 0.1 x the starting entropy, 8 evaluation seeds:
# A symmetric end - start "worse"; B clip-higher - symmetric end entropy "better"; any part
# undecided: "inconclusive" (every seed counts, issue 36).


def make(sft, s, epsilon_high, learning_rate=None):
    return GRPOPolicy(
        model=sft,
        k=8,
        beta=0.0,
        log_kl=True,
        n_minibatches=4,
        clip_coef=0.2,
        epsilon_high=epsilon_high,
        learning_rate=learning_rate,
        on_unhealthy="ignore",  # health_ still records every detector
        n_steps=s["steps"],
        batch_size=s["batch_size"],
    )


def decide(ev: pd.DataFrame) -> tuple:
    """The rule on the evaluation rows: ``(margin, fall, fall_higher, kept, parts, verdict)``.

    Issue 36: every evaluation seed counts (an unhealthy run keeps the entropy it ended
    with) and each part is read by :func:`_common.part_status` (the monotone margin rule).
    """
    margin = MARGIN_SHARE * float(ev.entropy_start.mean())
    change = ev.pivot(index="seed", columns="arm", values="entropy_change")
    end = ev.pivot(index="seed", columns="arm", values="entropy_end")
    fall = interval_with_mdd(change["symmetric"], margin)
    fall_higher = interval_with_mdd(change["clip-higher"], margin)
    kept = interval_with_mdd(end["clip-higher"] - end["symmetric"], margin)
    parts = {
        "A the symmetric clip's entropy falls": part_status(fall, ("worse",)),
        "B clip-higher keeps more entropy": part_status(kept, ("better",)),
    }
    return margin, fall, fall_higher, kept, parts, parts_verdict(parts)


def main(argv=None):
    environ_threads()
    args = parse_args(__doc__, argv, jobs=(int, None, "parallel fits (default: 2, 1 quick)"))
    s = choose(args, FULL, QUICK)
    s["jobs"] = args.jobs or s["jobs"]
    world, sft = arithmetic_sft(s["n_demonstrations"], s["sft_epochs"])
    common = dict(
        reward_model=world.correctness_reward,
        seeds=list(range(s["seeds"])),
        scoring={"train_reward": HistoryMean("objective/reward", s["last"])},
        return_estimators=True,
        n_jobs=s["jobs"],
    )
    # The rate is tuned for the symmetric clip, whose evaluation runs come with it...
    symmetric = compare(
        {"symmetric": make(sft, s, ARMS["symmetric"])},
        world.prompts,
        tune={"symmetric": {"learning_rate": list(s["learning_rates"])}},
        tuning_seeds=list(s["tuning_seeds"]),
        **common,
    )
    lr = symmetric.tuned_params["symmetric"]["learning_rate"]
    # ...and clip-higher runs at the same rate on the same evaluation seeds.
    higher = compare(
        {"clip-higher": make(sft, s, ARMS["clip-higher"], learning_rate=lr)},
        world.prompts,
        **common,
    )
    fitted = {
        "symmetric": symmetric.estimators["symmetric"],
        "clip-higher": higher.estimators["clip-higher"],
    }
    rows, curves = [], {}
    for t in symmetric.tuning.itertuples():
        rows.append(
            {
                "phase": "tuning",
                "arm": t.algorithm,
                "learning_rate": t.param_learning_rate,
                "n_unhealthy": t.n_unhealthy,
                "selected": t.selected,
                "train_reward": t.mean,
            }
        )
    for arm in ARMS:
        for seed, policy in zip(symmetric.seeds, fitted[arm]):
            entropy = np.array([r["policy/entropy"] for r in policy.history_])
            curves[arm, seed] = entropy
            rows.append(
                {
                    "phase": "evaluation",
                    "arm": arm,
                    "learning_rate": lr,
                    "seed": seed,
                    "healthy": policy.health_["healthy"],
                    "fired": fired_detectors(policy),
                    "train_reward": HistoryMean("objective/reward", s["last"])(policy, None),
                    "entropy_start": float(entropy[0]),
                    "entropy_end": float(np.mean(entropy[-s["last"] :])),
                    "entropy_change": float(np.mean(entropy[-s["last"] :]) - entropy[0]),
                    "clipfrac": float(np.mean([r["policy/clipfrac"] for r in policy.history_])),
                }
            )
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    ev = frame[frame.phase == "evaluation"]
    healthy = ev.pivot(index="seed", columns="arm", values="healthy").astype(bool)
    end = ev.pivot(index="seed", columns="arm", values="entropy_end")
    margin, fall, fall_higher, kept, parts, verdict = decide(ev)
    n_unhealthy = {arm: int((~healthy[arm]).sum()) for arm in ARMS}
    fired = {arm: sorted({f for f in ev[ev.arm == arm].fired if f}) for arm in ARMS}
    clipfrac = {arm: float(ev[ev.arm == arm].clipfrac.mean()) for arm in ARMS}

    fig, axes = new_figure(2)
    for i, arm in enumerate(ARMS):
        values = np.array([curves[arm, seed] for seed in symmetric.seeds])
        steps = np.arange(1, values.shape[1] + 1)
        axes[0].plot(steps, values.mean(axis=0), color=f"C{i}", label=arm)
        for row in values:
            axes[0].plot(steps, row, color=f"C{i}", alpha=0.15, lw=0.8)
        m = float(end[arm].mean()) if len(end) else np.nan
        axes[1].plot([i] * len(end), end[arm], "o", color=f"C{i}", alpha=0.5)
        axes[1].plot([i], [m], "_", color="k", ms=20)
    axes[0].set_xlabel(f"step ({s['batch_size']} responses each, 4 gradient steps)")
    axes[0].set_ylabel("policy entropy (nats per token)")
    axes[0].legend()
    axes[1].set_xticks([0, 1], list(ARMS))
    axes[1].set_ylabel(f"entropy, mean of the last {s['last']} steps")
    axes[1].set_title(f"all {len(end)} seeds; clip-higher - symmetric {kept['mean']:.3f}")
    reason = (
        "; ".join(f"{k}: {v}" for k, v in parts.items())
        + f". Entropy (nats/token) end minus start: symmetric {fmt_mdd(fall)}, clip-higher "
        f"{fmt_mdd(fall_higher)}; end entropy clip-higher - symmetric {fmt_mdd(kept)}; margin "
        f"{margin:.3f} (a tenth of the start's {ev.entropy_start.mean():.3f}). Learning rate "
        f"tuned for the symmetric clip on seeds {list(symmetric.tuning_seeds)}: {lr:g}. Mean "
        f"clip fraction: symmetric {clipfrac['symmetric']:.4f}, clip-higher "
        f"{clipfrac['clip-higher']:.4f}. Unhealthy "
        + ", ".join(
            f"{a} {n_unhealthy[a]} of {len(healthy)}"
            + (f" ({', '.join(fired[a])})" if fired[a] else "")
            for a in ARMS
        )
        + " (kept: every seed counts)"
        + ". Training reward at the end: "
        + ", ".join(f"{a} {ev[ev.arm == a].train_reward.mean():.3f}" for a in ARMS)
        + "."
    )
    return finish(
        args,
        "claim20_clip_higher_entropy",
        frame,
        fig,
        number=20,
        claim="Clip-higher (epsilon_low 0.2, epsilon_high 0.28) keeps the policy's entropy from "
        "collapsing, compared with a symmetric clip of 0.2",
        source="Yu et al. 2025 (DAPO), arXiv:2503.14476",
        setting=f"arithmetic world (2-digit sums), GRPOPolicy defaults (dapo loss, k=8) with "
        f"beta 0 and 4 minibatches a batch, {s['steps']} steps of {s['batch_size']}, one lr "
        f"tuned for the symmetric clip over {', '.join(f'{v:g}' for v in s['learning_rates'])} "
        f"on {len(s['tuning_seeds'])} tuning seeds, {s['seeds']} evaluation seeds",
        result=f"entropy change symmetric {fmt_mdd(fall)}; end entropy clip-higher - symmetric "
        f"{fmt_mdd(kept)}",
        verdict=verdict,
        reason=reason,
    )


if __name__ == "__main__":
    main()
