"""The worked preference-world example: PPO reaches the closed-form optimum's reward.

The plate's workshop: a reward model fitted to 1,000 comparisons from raters with
bias 1; PPO on the world's six-parameter policy with 64 rollouts a step, the reward
r(y) - beta log(pi/pi_ref), advantages normalised over the batch, 4 epochs of plain
gradient ascent (SGD) on the clipped surrogate at step size 0.3, clip 0.2, beta = 0.3,
60 steps (``examples/preference_world.py``'s setting; the step is annealed linearly to
0, prefopt's default). Every quantity is an exact expectation of the final policy.
Each seed draws its own comparisons (so its own reward model) and its own rollouts.
The same runs are repeated at 15, 30, 120 and 240 steps (the same step size, annealed
over the run) to see whether the gap to the optimum shrinks with more episodes.

Settings and verdict rule, fixed before the first full run: 10 seeds. The claim has
four parts, each judged on a 95% t-interval over seeds:

- "within 0.012": the upper bound of the mean |reward - optimum's reward| at 60 steps
  is at most 0.012;
- "true quality rises": the interval of (final - start) true quality lies above 0;
- "leaves wrong and hedged": the interval of the change in the probability of the
  wrong (2 types) and hedged (2 types) answers lies below 0;
- "gap shrinks": the interval of the paired difference of the objective gap
  (optimum - policy, >= 0) at 240 steps minus at 60 steps lies below 0.

"reproduced" if all four hold, "partly reproduced" if some do, else "not reproduced".

Run::

    python benchmarks/reproduce/claim01_ppo_worked_example.py          # ~3 min on 2 cores
    python benchmarks/reproduce/claim01_ppo_worked_example.py --quick  # seconds

One seed of the full setting (465 PPO steps) took 23 s of CPU time, imports included
(44 s of wall time on a busy 2-core machine): 10 seeds take about 3 minutes on a quiet
machine, 7 on a busy one.
"""

from __future__ import annotations

import numpy as np
from _common import (
    compound_verdict,
    finish,
    fmt,
    mean_ci,
    new_figure,
    paired_ci,
    parse_args,
    parts_reason,
)
from _common import settings as choose

from prefopt import PPOPolicy, RewardModel
from prefopt.worlds import PreferenceWorld

FULL = dict(seeds=10, comparisons=1000, steps=[15, 30, 60, 120, 240], main_steps=60)
QUICK = dict(seeds=2, comparisons=200, steps=[3, 6], main_steps=3)
BETA = 0.3
TOLERANCE = 0.012  # the plate's "within 0.012 of the reward the closed form predicts"
WRONG, HEDGED = (4, 5), (2, 3)  # the world's response types, in its order
COLUMNS = [
    "seed",
    "steps",
    "episodes",
    "reward",
    "true_quality",
    "kl",
    "objective",
    "opt_reward",
    "opt_true_quality",
    "opt_kl",
    "opt_objective",
    "start_reward",
    "start_true_quality",
    "p_wrong",
    "p_hedged",
    "start_p_wrong",
    "start_p_hedged",
]
# Verdict rule: see the docstring; the four parts are computed in main() below.


def run(world, rm, steps, seed):
    """One PPO run of the worked example's setting; its exact final metrics."""
    ppo = PPOPolicy(
        model=world.policy_model(),
        beta=BETA,
        batch_size=64,
        n_steps=steps,
        n_epochs=4,
        clip_coef=0.2,
        learning_rate=0.3,
        optimizer="sgd",
        random_state=seed,
    ).fit(world.prompts, rm)
    probs = world.policy_probs(ppo).mean(0)
    return ppo, world.evaluate(ppo, rm, BETA), probs


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    rows = []
    bars = {}
    for seed in range(s["seeds"]):
        world = PreferenceWorld(rater_bias=1.0, random_state=seed)
        rm = RewardModel().fit(world.comparisons(s["comparisons"], random_state=seed))
        start = world.evaluate(world.reference_probs(), rm, BETA)
        optimum = world.optimum(rm, BETA)
        ref_probs = world.reference_probs().mean(0)
        for steps in s["steps"]:
            _, final, probs = run(world, rm, steps, seed)
            if steps == s["main_steps"]:
                bars.setdefault("reference", []).append(ref_probs)
                bars.setdefault("PPO", []).append(probs)
                bars.setdefault("optimum", []).append(world.optimal_probs(rm, BETA).mean(0))
            rows.append(
                {
                    "seed": seed,
                    "steps": steps,
                    "episodes": steps * 64,
                    **final,
                    **{f"opt_{k}": v for k, v in optimum.items()},
                    "start_reward": start["reward"],
                    "start_true_quality": start["true_quality"],
                    "p_wrong": float(probs[list(WRONG)].sum()),
                    "p_hedged": float(probs[list(HEDGED)].sum()),
                    "start_p_wrong": float(ref_probs[list(WRONG)].sum()),
                    "start_p_hedged": float(ref_probs[list(HEDGED)].sum()),
                }
            )
            print({k: rows[-1][k] for k in ("seed", "steps", "reward", "opt_reward")}, flush=True)

    main_rows = [r for r in rows if r["steps"] == s["main_steps"]]
    col = lambda rs, k: np.array([r[k] for r in rs])  # noqa: E731
    abs_gap = mean_ci(np.abs(col(main_rows, "reward") - col(main_rows, "opt_reward")))
    signed_gap = mean_ci(col(main_rows, "reward") - col(main_rows, "opt_reward"))
    quality = paired_ci(col(main_rows, "true_quality"), col(main_rows, "start_true_quality"))
    leaves = paired_ci(
        col(main_rows, "p_wrong") + col(main_rows, "p_hedged"),
        col(main_rows, "start_p_wrong") + col(main_rows, "start_p_hedged"),
    )
    obj_gap = {
        n: col([r for r in rows if r["steps"] == n], "opt_objective")
        - col([r for r in rows if r["steps"] == n], "objective")
        for n in s["steps"]
    }
    shrink = paired_ci(obj_gap[max(s["steps"])], obj_gap[s["main_steps"]])
    parts = {
        f"within {TOLERANCE} (upper bound {abs_gap[2]:.4f})": abs_gap[2] <= TOLERANCE,
        "true quality rises": quality[1] > 0,
        "leaves wrong and hedged": leaves[2] < 0,
        f"gap shrinks from {s['main_steps']} to {max(s['steps'])} steps": shrink[2] < 0,
    }
    verdict = compound_verdict(parts)

    fig, (left, mid, right) = new_figure(3)
    episodes = [n * 64 for n in s["steps"]]
    for key, color, label in (
        ("objective", "C0", "objective gap (optimum - PPO)"),
        ("reward", "C1", "|reward gap|"),
    ):
        per_n = [
            np.abs(
                col([r for r in rows if r["steps"] == n], f"opt_{key}")
                - col([r for r in rows if r["steps"] == n], key)
            )
            for n in s["steps"]
        ]
        for n_episodes, values in zip(episodes, per_n):
            left.scatter([n_episodes] * len(values), values, color=color, s=6, alpha=0.4)
        left.plot(episodes, [v.mean() for v in per_n], color=color, marker="o", label=label)
    left.axhline(TOLERANCE, color="grey", ls=":", label=f"{TOLERANCE}")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("episodes (64 a step)")
    left.set_ylabel("gap to the closed form (dots: seeds)")
    left.legend(fontsize=7)
    left.set_title(f"β = {BETA}: gap against episodes")
    for name, key, color in (
        ("reward", "reward", "C1"),
        ("true quality", "true_quality", "C2"),
        ("KL", "kl", "C3"),
    ):
        mid.scatter([name] * len(main_rows), col(main_rows, key), color=color, s=12, label="PPO")
        mid.scatter(
            [name] * len(main_rows), col(main_rows, f"opt_{key}"), color="k", marker="_", s=80
        )
    mid.set_title(f"after {s['main_steps']} steps (dots), optimum (dashes)")
    labels = ["correct", "long+flat.", "corr. hedged", "hedged", "wrong", "wrong+flat."]
    x = np.arange(len(labels))
    for i, (name, values) in enumerate(bars.items()):
        right.bar(x + (i - 1) * 0.27, np.mean(values, 0), width=0.27, label=name)
    right.set_xticks(x, labels, rotation=35, fontsize=7)
    right.set_ylabel("probability (mean over questions and seeds)")
    right.legend(fontsize=7)
    right.set_title("where the probability went")

    return finish(
        args,
        "claim01_ppo_worked_example",
        rows,
        fig,
        number=1,
        claim="PPO (64 rollouts a step, 4 epochs at step 0.3, clip 0.2, 1,000 comparisons, "
        "rater bias 1) reaches the closed-form reward within about 0.012 at beta 0.3 in 60 "
        "steps; true quality rises; probability leaves wrong and hedged answers; the gap "
        "to the optimum shrinks with more episodes",
        source="the worked preference-world example",
        setting=f"preference world, PPO as the example (SGD, step annealed), beta {BETA}, "
        f"{s['comparisons']} comparisons, {s['main_steps']} steps (also {s['steps']}), "
        f"{s['seeds']} seeds",
        result=f"reward - optimum {fmt(*signed_gap, digits=4)} (|gap| "
        f"{fmt(*abs_gap, digits=4)}); true quality change {fmt(*quality)}; P(wrong or "
        f"hedged) change {fmt(*leaves)}; objective gap at {max(s['steps'])} minus at "
        f"{s['main_steps']} steps {fmt(*shrink, digits=4)}",
        verdict=verdict,
        reason=parts_reason(parts),
    )


if __name__ == "__main__":
    main()
