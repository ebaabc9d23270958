"""GRPO's per-response length normalisation lets wrong responses grow longer; Dr. GRPO's does not.

Liu et al. (2025), "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv:2503.20783, abstract: "we identify an optimization bias in Group Relative Policy
Optimization (GRPO), which artificially increases response length (especially for
incorrect outputs) during training. To address this, we introduce Dr. GRPO, an unbiased
optimization method that improves token efficiency while maintaining reasoning
performance." The mechanism: GRPO divides each response's token losses by its own length
|o_i|, so a long incorrect response (negative advantage) is pushed down less per token
than a short one; Dr. GRPO divides by a constant (``max_new_tokens``).

Setting: the arithmetic world (two-digit sums, SFT start as ``benchmarks/verifiable_world.py``),
``GRPOPolicy`` with ``loss_type="grpo"`` against ``loss_type="dr_grpo"``, everything else
the same: k = 8, beta 0 (Liu et al.'s and TRL's setting; ``log_kl=True`` so the KL is still
measured for the health detectors), ``max_new_tokens=8`` (twice the longest answer and
its EOS, so that a response has room to grow), ``missing_eos_reward=None`` (a cut
response scores 0 from the correctness reward alone, as in the paper, rather than a
penalty that would itself punish length), rewarded by ``world.correctness_reward``.
A second reward of weight 0, ``incorrect_length`` (a response's characters where it is
wrong, else 0), only logs ``rewards/incorrect_length/mean`` per step; divided by the
share of wrong responses it is the mean length of the incorrect responses of that step.

Each loss type is tuned on its own (its normaliser sets its gradient's scale: Dr. GRPO's
is |o_i| / max_new_tokens of GRPO's): learning rates 1e-4, 3e-4, 1e-3 on tuning seeds
100 and 101 with ``compare(tune=...)``, ranked by the mean training reward of the last 10
steps, a candidate with an unhealthy tuning run ranking after every healthy one. The
selected rate then runs on evaluation seeds 0-7. The measured quantity, per run: the
growth of the incorrect responses' mean length, the mean over the last 10 steps minus the
mean over the first 5 (characters; a cut response counts its 8).

Verdict rule, fixed before the first full run. Margin 0.25 characters: SFT's wrong
answers are 2-3 characters and can grow by at most 5 here, so 0.25 is a quarter of the
wrong answers gaining one character, 5% of the room to grow; a smaller change is called
no change. With 95% t-intervals over the evaluation seeds and
:func:`prefopt.model_selection.verdict` at that margin, three parts: (A) GRPO's growth is
above 0 ("better"); (B) Dr. GRPO's growth is not ("equivalent" or "worse"); (C) the
paired difference GRPO - Dr. GRPO is above 0 ("better"). A part whose interval is
"inconclusive" is undecided, and one that contradicts it is refuted. "reproduced" if all
three hold, "not reproduced" if all are refuted, "partly reproduced" for a mix, and
"inconclusive" if any is undecided. Unhealthy runs (any detector of ``health_`` fired)
are failures, counted and reported with their detectors. (Issue 36 changed the rule after
this run, and the verdict was regenerated from the committed CSV: every seed counts, an
unhealthy run with the growth it ended with, where a seed with an unhealthy run in either
arm left the comparison and under 6 of 8 such seeds gave "inconclusive"; the parts are
read by the monotone margin rule.) With 8 seeds the
minimum detectable difference at 80% power is about 1.15 standard deviations of the
per-seed differences, reported beside each interval.

Run::

    python benchmarks/reproduce/claim19_dr_grpo_length.py          # ~8 min on 2 cores (est.)
    python benchmarks/reproduce/claim19_dr_grpo_length.py --quick  # under a minute
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
    first=5,
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
    first=1,
    last=1,
    jobs=1,
)
ARMS = {"GRPO": "grpo", "Dr. GRPO": "dr_grpo"}
MAX_NEW_TOKENS = 8
MARGIN = 0.25  # characters of the incorrect responses' mean length (see the docstring)
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
    "incorrect_length_start",
    "incorrect_length_end",
    "incorrect_length_growth",
    "correct_length_end",
    "length_end",
]
# Verdict rule (see the docstring), margin 0.25 characters, 8 evaluation seeds: A GRPO's
# growth "better"; B Dr. GRPO's growth "equivalent" or "worse"; C GRPO - Dr. GRPO "better";
# any part undecided: "inconclusive" (every seed counts, issue 36).


def make_incorrect_length(world):
    """The weight-0 reward that logs the wrong responses' lengths (0 for a right one)."""

    def incorrect_length(prompts, completions, **columns):
        right = world.correctness_reward(prompts, completions)
        return np.array([0.0 if r else float(len(c)) for r, c in zip(right, completions)])

    return incorrect_length


def incorrect_lengths(history) -> np.ndarray:
    """Per step: the mean length of the incorrect responses (NaN where all were right)."""
    wrong = np.array([1.0 - r["rewards/correctness_reward/mean"] for r in history])
    total = np.array([r["rewards/incorrect_length/mean"] for r in history])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(wrong > 0, total / np.where(wrong > 0, wrong, 1.0), np.nan)


def correct_lengths(history) -> np.ndarray:
    """Per step: the mean length of the correct responses, in characters (NaN: none right).

    ``response/length`` counts tokens with the EOS; a character is a token here.
    """
    right = np.array([r["rewards/correctness_reward/mean"] for r in history])
    tokens = np.array([r["response/length"] for r in history])
    ended = np.array([r["response/eos_share"] for r in history])
    chars = tokens - ended  # the EOS tokens are not characters of the text
    wrong_total = (1.0 - right) * np.nan_to_num(incorrect_lengths(history))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(right > 0, (chars - wrong_total) / np.where(right > 0, right, 1.0), np.nan)


def decide(ev: pd.DataFrame) -> tuple:
    """The rule on the evaluation rows: ``(grpo, dr, diff, parts, verdict)``.

    Issue 36: every evaluation seed counts (an unhealthy run keeps the growth it ended
    with; the first rule used only seeds healthy in both arms and called too few
    inconclusive), and each part is read by :func:`_common.part_status` (the monotone
    margin rule).
    """
    wide = ev.pivot(index="seed", columns="arm", values="incorrect_length_growth")
    grpo = interval_with_mdd(wide["GRPO"], MARGIN)
    dr = interval_with_mdd(wide["Dr. GRPO"], MARGIN)
    diff = interval_with_mdd(wide["GRPO"] - wide["Dr. GRPO"], MARGIN)
    parts = {
        "A GRPO's incorrect responses grow": part_status(grpo, ("better",)),
        "B Dr. GRPO's do not": part_status(dr, ("equivalent", "worse")),
        "C GRPO grows them more than Dr. GRPO": part_status(diff, ("better",)),
    }
    return grpo, dr, diff, parts, parts_verdict(parts)


def main(argv=None):
    environ_threads()
    args = parse_args(__doc__, argv, jobs=(int, None, "parallel fits (default: 2, 1 quick)"))
    s = choose(args, FULL, QUICK)
    s["jobs"] = args.jobs or s["jobs"]
    world, sft = arithmetic_sft(s["n_demonstrations"], s["sft_epochs"])
    rewards = [world.correctness_reward, make_incorrect_length(world)]
    estimators = {
        arm: GRPOPolicy(
            model=sft,
            k=8,
            beta=0.0,
            log_kl=True,
            loss_type=loss_type,
            max_new_tokens=MAX_NEW_TOKENS,
            missing_eos_reward=None,
            reward_weights=[1.0, 0.0],
            on_unhealthy="ignore",  # health_ still records every detector
            n_steps=s["steps"],
            batch_size=s["batch_size"],
        )
        for arm, loss_type in ARMS.items()
    }
    result = compare(
        estimators,
        world.prompts,
        reward_model=rewards,
        seeds=list(range(s["seeds"])),
        tune={arm: {"learning_rate": list(s["learning_rates"])} for arm in ARMS},
        tuning_seeds=list(s["tuning_seeds"]),
        scoring={"train_reward": HistoryMean("objective/reward", s["last"])},
        matched_budget="episodes",
        return_estimators=True,
        n_jobs=s["jobs"],
    )
    rows, curves = [], {}
    for t in result.tuning.itertuples():
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
        lr = result.tuned_params[arm]["learning_rate"]
        for seed, policy in zip(result.seeds, result.estimators[arm]):
            wrong = incorrect_lengths(policy.history_)
            curves[arm, seed] = wrong
            start = float(np.nanmean(wrong[: s["first"]]))
            end = float(np.nanmean(wrong[-s["last"] :]))
            chars = np.array(
                [r["response/length"] - r["response/eos_share"] for r in policy.history_]
            )
            rows.append(
                {
                    "phase": "evaluation",
                    "arm": arm,
                    "learning_rate": lr,
                    "seed": seed,
                    "healthy": policy.health_["healthy"],
                    "fired": fired_detectors(policy),
                    "train_reward": HistoryMean("objective/reward", s["last"])(policy, None),
                    "incorrect_length_start": start,
                    "incorrect_length_end": end,
                    "incorrect_length_growth": end - start,
                    "correct_length_end": float(
                        np.nanmean(correct_lengths(policy.history_)[-s["last"] :])
                    ),
                    "length_end": float(np.mean(chars[-s["last"] :])),
                }
            )
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    ev = frame[frame.phase == "evaluation"]
    wide = ev.pivot(index="seed", columns="arm", values="incorrect_length_growth")
    healthy = ev.pivot(index="seed", columns="arm", values="healthy").astype(bool)
    grpo, dr, diff, parts, verdict = decide(ev)
    n_unhealthy = {arm: int((~healthy[arm]).sum()) for arm in ARMS}
    fired = {arm: sorted({f for f in ev[ev.arm == arm].fired if f}) for arm in ARMS}

    fig, axes = new_figure(2)
    for i, arm in enumerate(ARMS):
        lengths = np.array([curves[arm, seed] for seed in result.seeds])
        steps = np.arange(1, lengths.shape[1] + 1)
        axes[0].plot(steps, np.nanmean(lengths, axis=0), color=f"C{i}", label=arm)
        for row in lengths:
            axes[0].plot(steps, row, color=f"C{i}", alpha=0.15, lw=0.8)
        stat = (grpo, dr)[i]
        axes[1].errorbar(
            [i],
            [stat["mean"]],
            yerr=[[stat["mean"] - stat["low"]], [stat["high"] - stat["mean"]]],
            fmt="o",
            capsize=4,
            color=f"C{i}",
        )
    axes[0].set_xlabel(f"step ({s['batch_size']} responses each)")
    axes[0].set_ylabel("mean length of incorrect responses (chars)")
    axes[0].legend()
    axes[1].axhspan(-MARGIN, MARGIN, color="0.9")
    axes[1].axhline(0, color="0.5", lw=0.8)
    axes[1].set_xticks([0, 1], list(ARMS))
    axes[1].set_ylabel("growth, last minus first steps (chars)")
    axes[1].set_title(f"all {len(wide)} seeds, 95% CI; margin shaded")
    chosen = ", ".join(f"{a} {result.tuned_params[a]['learning_rate']:g}" for a in ARMS)
    reason = (
        "; ".join(f"{k}: {v}" for k, v in parts.items())
        + f". Growth of the incorrect responses' mean length (chars): GRPO {fmt_mdd(grpo)}, "
        f"Dr. GRPO {fmt_mdd(dr)}, GRPO - Dr. GRPO {fmt_mdd(diff)}; margin {MARGIN}. "
        f"Learning rates tuned on seeds {list(result.tuning_seeds)}: {chosen}. Unhealthy "
        + ", ".join(
            f"{a} {n_unhealthy[a]} of {len(wide)}"
            + (f" ({', '.join(fired[a])})" if fired[a] else "")
            for a in ARMS
        )
        + " (kept: every seed counts)"
        + ". Mean response length at the end (chars): "
        + ", ".join(f"{a} {ev[ev.arm == a].length_end.mean():.2f}" for a in ARMS)
        + "."
    )
    return finish(
        args,
        "claim19_dr_grpo_length",
        frame,
        fig,
        number=19,
        claim="GRPO's per-response length normalisation lets incorrect responses grow longer "
        "during training, while Dr. GRPO's constant normaliser does not",
        source="Liu et al. 2025, arXiv:2503.20783",
        setting=f"arithmetic world (2-digit sums), GRPOPolicy loss_type grpo vs dr_grpo, k=8, "
        f"beta 0, max_new_tokens {MAX_NEW_TOKENS}, no missing-EOS penalty, {s['steps']} steps "
        f"of {s['batch_size']}, lr tuned per arm over "
        f"{', '.join(f'{v:g}' for v in s['learning_rates'])} on {len(s['tuning_seeds'])} "
        f"tuning seeds, {s['seeds']} evaluation seeds",
        result=f"incorrect-length growth GRPO {fmt_mdd(grpo)}, Dr. GRPO {fmt_mdd(dr)}; "
        f"difference {fmt_mdd(diff)}",
        verdict=verdict,
        reason=reason,
    )


if __name__ == "__main__":
    main()
