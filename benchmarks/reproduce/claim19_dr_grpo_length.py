"""GRPO's per-response length normalisation lets wrong responses grow longer; Dr. GRPO's does not.

Liu et al. (2025), "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv:2503.20783, abstract: "we identify an optimization bias in Group Relative Policy
Optimization (GRPO), which artificially increases response length (especially for
incorrect outputs) during training. To address this, we introduce Dr. GRPO, an unbiased
optimization method that improves token efficiency while maintaining reasoning
performance." The mechanism: GRPO divides each response's token losses by its own length
|o_i|, so a long incorrect response (negative advantage) is pushed down less per token
than a short one; Dr. GRPO divides by a constant (``max_new_tokens``).

Issue 36, point 6 (rule committed before any full run of this version). The first run
could not decide the claim: the answers were 2-3 characters long, 80 steps, and the two
loss types were tuned to rates 3x apart. This run gives length room to move and one rate:

Setting: the scratchpad world (``_rlvr.py``: two-digit sums whose demonstrations show
their column work, 8-20 tokens with EOS, 17.3 on average; the answer after the last step
is rewarded). GRPO as :data:`_rlvr.GRPO_SETTINGS` but ``loss_type="grpo"`` against
``loss_type="dr_grpo"``, everything else the same: k = 8, beta 0 (Liu et al.'s and TRL's
setting; ``log_kl=True`` keeps the KL measured for the health detectors),
``max_new_tokens=40`` (twice the longest worked answer and its EOS: room to grow), no
missing-EOS reward (a cut response scores what the correctness reward gives it), one
shared rate for both loss types (:func:`_rlvr.rlvr_rate`, an AdaptiveLR), 1,000 steps
of 64 episodes (8 prompts a step: at 4 prompts, probes lost held-out pass@1 at every
rate tried, the updates' noise outweighing the reward's signal). A second reward of
weight 0, ``incorrect_length`` (a response's
characters where it is wrong, else 0), logs ``rewards/incorrect_length/mean``; divided
by the share of wrong responses it is the mean length of the step's incorrect responses.
The measured quantity, per run: their growth, the mean over the last 50 steps minus the
mean over the first 50 (characters).

The gate, on tuning seeds 100 and 101 (:func:`_rlvr.gate`), for each loss type: every
tuning run healthy and its held-out pass@1 (300 problems x 16 samples) at least 0.10
above the start's; and the regime of the claim: demonstrations of 10-20 tokens on
average, at least 1,000 steps. If the gate fails the claim is not decided
("inconclusive", the reason names the failed condition with its numbers).

Verdict rule, when the gate passes. Evaluation seeds 0-3, every seed counted (an
unhealthy run keeps the growth it ended with). Margin 1 character (a token; 6% of the
mean worked answer): a smaller change is called no change. With 95% t-intervals over the
seeds and the monotone margin rule (:func:`_common.part_status`), three parts: (A) GRPO's
growth is above 0, "better"; (B) Dr. GRPO's is not, "equivalent" or "worse"; (C) the
paired difference GRPO - Dr. GRPO, "better". "reproduced" if all three hold, "not
reproduced" if all are refuted, "partly reproduced" for a mix, "inconclusive" if any is
undecided.

Controls (issue 36, point 4): the GRPO loss type, same rate and budget, against a random
reward and the world's format reward on evaluation seed 0; their pass@1 gains
and incorrect-length growths are reported beside the real reward's.

Run::

    python benchmarks/reproduce/claim19_dr_grpo_length.py --jobs 7   # ~4 min on 7 free cores (est.)
    python benchmarks/reproduce/claim19_dr_grpo_length.py --quick    # under a minute
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from _common import (
    environ_threads,
    finish,
    fmt,
    fmt_mdd,
    interval_with_mdd,
    mean_ci,
    new_figure,
    parse_args,
    part_status,
    parts_verdict,
)
from _common import settings as choose
from _rlvr import (
    NO_STAT,
    SCRATCHPAD_FULL,
    SCRATCHPAD_QUICK,
    TUNING_SEEDS,
    control_rewards,
    control_summary,
    correct_counts,
    deadline_of,
    finished_by_phase,
    gate,
    grpo,
    late_note,
    run_fits,
    scratchpad_sft,
)
from sklearn.base import clone

FULL = dict(
    **SCRATCHPAD_FULL,
    steps=1000,
    batch_size=64,
    seeds=4,
    control_seeds=1,
    tuning_seeds=TUNING_SEEDS,
    first=50,
    last=50,
    eval_problems=300,
    samples=16,
    jobs=7,
)
QUICK = dict(
    **SCRATCHPAD_QUICK,
    steps=2,
    batch_size=16,
    seeds=2,
    control_seeds=1,
    tuning_seeds=(100,),
    first=1,
    last=1,
    eval_problems=8,
    samples=2,
    jobs=1,
)
ARMS = {"GRPO": "grpo", "Dr. GRPO": "dr_grpo"}
MAX_NEW_TOKENS = 40
MIN_STEPS = 1000  # issue 36: at least 1,000 steps for length to move
DEMO_TOKENS = (10, 20)  # issue 36: scratchpad demonstrations of 10-20 tokens
MARGIN = 1.0  # characters of the incorrect responses' mean length (see the docstring)
COLUMNS = [
    "phase",
    "arm",
    "reward_name",
    "seed",
    "finished",
    "healthy",
    "fired",
    "pass1",
    "train_reward",
    "incorrect_length_start",
    "incorrect_length_end",
    "incorrect_length_growth",
    "length_end",
]
# Rule (see the docstring): gate on tuning seeds 100, 101 per loss type (gain >= 0.10,
# healthy), demonstrations of 10-20 tokens, >= 1,000 steps; then margin 1 character, 4
# evaluation seeds: A GRPO's growth "better"; B Dr. GRPO's "equivalent" or "worse"; C GRPO -
# Dr. GRPO "better"; any part undecided: "inconclusive".


class IncorrectLength:
    """The weight-0 reward that logs the wrong responses' lengths (0 for a right one)."""

    __name__ = "incorrect_length"

    def __init__(self, world):
        self.world = world

    def __call__(self, prompts, completions, **columns):
        right = self.world.correctness_reward(prompts, completions)
        return np.array([0.0 if r else float(len(c)) for r, c in zip(right, completions)])


def incorrect_lengths(history) -> np.ndarray:
    """Per step: the mean length of the incorrect responses (NaN where all were right).

    The first reward's mean is the share of right responses under the real reward only;
    under a control the wrong share is counted from the logged lengths' own reward.
    """
    right = np.array([r["rewards/correctness_reward/mean"] for r in history])
    total = np.array([r["rewards/incorrect_length/mean"] for r in history])
    wrong = 1.0 - right
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(wrong > 0, total / np.where(wrong > 0, wrong, 1.0), np.nan)


class Measure:
    """Held-out pass@1 and the incorrect responses' length growth of a fit (a worker)."""

    def __init__(self, world, prompts, samples: int, first: int, last: int):
        self.world, self.prompts, self.samples = world, prompts, samples
        self.first, self.last = first, last

    def __call__(self, policy) -> dict:
        counts = correct_counts(policy, self.world, self.prompts, self.samples)
        wrong = incorrect_lengths(policy.history_)
        start = float(np.nanmean(wrong[: self.first]))
        end = float(np.nanmean(wrong[-self.last :]))
        chars = [r["response/length"] - r["response/eos_share"] for r in policy.history_]
        return {
            "pass1": float(counts.mean() / self.samples),
            "train_reward": float(np.mean([r["objective/reward"] for r in policy.history_][-50:])),
            "incorrect_length_start": start,
            "incorrect_length_end": end,
            "incorrect_length_growth": end - start,
            "length_end": float(np.mean(chars[-self.last :])),
            "curve": wrong,
        }


def decide(ev: pd.DataFrame) -> tuple:
    """The rule on the evaluation rows: ``(grpo, dr, diff, parts, verdict)``."""
    wide = ev.pivot(index="seed", columns="arm", values="incorrect_length_growth")
    grpo_stat = interval_with_mdd(wide["GRPO"], MARGIN)
    dr = interval_with_mdd(wide["Dr. GRPO"], MARGIN)
    diff = interval_with_mdd(wide["GRPO"] - wide["Dr. GRPO"], MARGIN)
    parts = {
        "A GRPO's incorrect responses grow": part_status(grpo_stat, ("better",)),
        "B Dr. GRPO's do not": part_status(dr, ("equivalent", "worse")),
        "C GRPO grows them more than Dr. GRPO": part_status(diff, ("better",)),
    }
    return grpo_stat, dr, diff, parts, parts_verdict(parts)


def main(argv=None):
    environ_threads()
    args = parse_args(
        __doc__,
        argv,
        jobs=(int, None, "parallel fits (default: 7, 1 quick)"),
        gate_only=(int, 0, "1: only the gate's tuning fits; print the gate, write no files"),
        deadline=(float, None, "seconds from the start after which unfinished fits are left out"),
    )
    s = choose(args, FULL, QUICK)
    s["jobs"] = args.jobs or s["jobs"]
    world, sft = scratchpad_sft(s["n_demonstrations"], s["sft_epochs"])
    prompts = world.eval_prompts[: s["eval_problems"]]
    start_pass1 = float(correct_counts(sft, world, prompts, s["samples"]).mean() / s["samples"])
    logger = IncorrectLength(world)
    estimators = {
        arm: grpo(
            sft,
            beta=0.0,
            loss_type=loss_type,
            max_new_tokens=MAX_NEW_TOKENS,
            reward_weights=[1.0, 0.0],
            n_steps=s["steps"],
            batch_size=s["batch_size"],
        )
        for arm, loss_type in ARMS.items()
    }
    seeds = list(range(s["seeds"]))
    real = [world.correctness_reward, logger]
    tasks = [
        {"phase": phase, "arm": arm, "reward_name": "correctness", "seed": seed, "reward": real}
        for phase, phase_seeds in (("tuning", s["tuning_seeds"]), ("evaluation", seeds))
        for arm in ARMS
        for seed in phase_seeds
    ]
    # A control keeps the correctness reward's column at weight 0 so its length is logged
    # the same way: the control pays, correctness and the lengths are only recorded.
    tasks += [
        {
            "phase": "control",
            "arm": "GRPO",
            "reward_name": name,
            "seed": seed,
            "reward": [control, world.correctness_reward, logger],
        }
        for name, control in control_rewards(world).items()
        for seed in seeds[: s["control_seeds"]]
    ]
    for task in tasks:
        base = estimators[task["arm"]]
        if task["phase"] == "control":
            base = clone(base).set_params(reward_weights=[1.0, 0.0, 0.0])
        task["estimator"] = base
    if args.gate_only:
        tasks = [t for t in tasks if t["phase"] == "tuning"]
    rows = run_fits(
        tasks,
        world.prompts,
        Measure(world, prompts, s["samples"], s["first"], s["last"]),
        s["jobs"],
        deadline_of(args),
    )
    by_phase = finished_by_phase(rows)
    late = late_note(rows)
    demo_tokens = float(world.demonstrations.completion.str.len().mean() + 1)
    passed, gate_text = gate(
        [r for r in rows if r["phase"] == "tuning"],
        start_pass1,
        {
            f"demonstrations of {DEMO_TOKENS[0]}-{DEMO_TOKENS[1]} tokens": (
                DEMO_TOKENS[0] <= demo_tokens <= DEMO_TOKENS[1],
                f"mean {demo_tokens:.1f} with EOS",
            ),
            f"at least {MIN_STEPS} steps": (s["steps"] >= MIN_STEPS, f"{s['steps']}"),
        },
    )
    print(gate_text, flush=True)
    if args.gate_only:
        return {"gate": gate_text, "rows": rows}
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    ev = frame[(frame.phase == "evaluation") & frame.finished.eq(True)]
    if ev.groupby("arm").seed.nunique().reindex(list(ARMS)).fillna(0).min() >= 2:
        grpo_stat, dr, diff, parts, verdict = decide(ev)
    else:
        grpo_stat, dr, diff, parts, verdict = NO_STAT, NO_STAT, NO_STAT, {}, ""
    if not passed or late:
        verdict = "inconclusive"
    controls = control_summary(
        [r for r in by_phase["evaluation"] if r["arm"] == "GRPO"],
        by_phase["control"],
        start_pass1,
        "GRPO",
    )
    control_growth = "; ".join(
        f"{name} control growth "
        + fmt(
            *mean_ci(
                [
                    r["incorrect_length_growth"]
                    for r in by_phase["control"]
                    if r["reward_name"] == name
                ]
            )
        )
        for name in sorted({r["reward_name"] for r in by_phase["control"]})
    )
    unhealthy = {
        arm: [
            f"{r['seed']} ({r['fired']})"
            for r in by_phase["evaluation"]
            if r["arm"] == arm and not r["healthy"]
        ]
        for arm in ARMS
    }

    fig, axes = new_figure(2)
    for i, arm in enumerate(ARMS):
        lengths = np.array([r["curve"] for r in by_phase["evaluation"] if r["arm"] == arm])
        if not len(lengths):
            continue
        steps = np.arange(1, lengths.shape[1] + 1)
        axes[0].plot(steps, np.nanmean(lengths, axis=0), color=f"C{i}", label=arm)
        stat = (grpo_stat, dr)[i]
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
    axes[1].set_title(f"gate {'passed' if passed else 'failed'}; margin shaded")
    decided = "; ".join(f"{k}: {v}" for k, v in parts.items())
    reason = (
        f"{gate_text[0].upper()}{gate_text[1:]}. "
        + (
            decided
            if passed
            else f"Not decided (the gate failed); the rule would have read: {decided}"
        )
        + f". Growth of the incorrect responses' mean length (chars): GRPO {fmt_mdd(grpo_stat)}, "
        f"Dr. GRPO {fmt_mdd(dr)}, GRPO - Dr. GRPO {fmt_mdd(diff)}; margin {MARGIN}. Start "
        f"pass@1 {start_pass1:.3f}. Controls: {controls}; {control_growth}. Unhealthy "
        + ", ".join(
            f"{a} {len(unhealthy[a])} of {len(seeds)}"
            + (f" ({', '.join(unhealthy[a])})" if unhealthy[a] else "")
            for a in ARMS
        )
        + " (kept: every seed counts). Mean response length at the end (chars): "
        + ", ".join(f"{a} {ev[ev.arm == a].length_end.mean():.2f}" for a in ARMS)
        + "."
        + late
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
        setting=f"scratchpad arithmetic world (2-digit sums with their column work, 8-20 "
        f"tokens), GRPO loss_type grpo vs dr_grpo, k 8, beta 0, max_new_tokens "
        f"{MAX_NEW_TOKENS}, no missing-EOS penalty, one AdaptiveLR for both (from 3e-5, target "
        f"0.002, in [1e-6, 3e-4]), {s['steps']} steps of {s['batch_size']}; gate on "
        f"{len(s['tuning_seeds'])} tuning seeds, {s['seeds']} evaluation seeds, random and "
        f"format controls on {s['control_seeds']}",
        result=f"gate {'passed' if passed else 'failed'}; incorrect-length growth GRPO "
        f"{fmt_mdd(grpo_stat)}, Dr. GRPO {fmt_mdd(dr)}; difference {fmt_mdd(diff)}; {controls}",
        verdict=verdict,
        reason=reason,
    )


if __name__ == "__main__":
    main()
