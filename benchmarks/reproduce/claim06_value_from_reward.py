"""A value model initialised from the reward model learns faster early than a fresh head.

Ziegler et al. (2019) and Huang et al. (2024) initialise PPO's value model from the
reward model, "which makes the early value estimates and so the early policy gradients
sensible". Here: the review world's SFT policy and a reward model fitted on 2,000
rater comparisons (as claim 14 and the demo); PPO at beta = 0.05, 20 steps of 64
episodes, prefopt's defaults otherwise, with its value model either a copy of the
reward model (prefopt's default for a language-model reward, ``value_model=None``)
or a fresh head: a copy of the SFT policy's trunk with a zero-initialised scalar head
(what the original code does for the value head, and prefopt's fallback when the
reward is not a language model), given as ``value_model=``. Same seeds for both.

Settings and verdict rule, fixed before the first full run: 10 seeds. "Early" is the
first 10 of the 20 steps. "reproduced" if the 95% t-interval of the paired difference
(reward-model init - fresh head) of the mean proxy reward over the early steps lies
above 0; else "not reproduced". The value loss's explained variance over the same
steps is reported beside it.

Run::

    python benchmarks/reproduce/claim06_value_from_reward.py          # ~6 min on 2 cores
    python benchmarks/reproduce/claim06_value_from_reward.py --quick  # seconds

One seed of claim 6's full setting (the SFT policy and reward model, then two PPO runs
of 20 steps) took 77 s of CPU time (3 minutes of wall time on a busy 2-core machine):
about 45 s for the models, once, and about 0.75 s a PPO step of 64 episodes.
Here 20 runs of 20 steps:
about 6 minutes on a quiet machine, 12-15 on a busy one.
"""

from __future__ import annotations

import copy

import numpy as np
from _common import (
    direction_verdict,
    finish,
    fmt,
    mean_ci,
    new_figure,
    paired_ci,
    parse_args,
    pinned_ppo,
    review_setup,
)
from _common import settings as choose

from prefopt import PPOPolicy
from prefopt.backend import ScalarHeadModel

FULL = dict(
    seeds=10,
    steps=20,
    early=10,
    batch_size=64,
    models=dict(n_reviews=2000, sft_epochs=5, comparisons=2000, rm_epochs=3),
)
QUICK = dict(
    seeds=2,
    steps=3,
    early=2,
    batch_size=8,
    models=dict(n_reviews=200, sft_epochs=1, comparisons=64, rm_epochs=1, normalize_samples=16),
)
BETA = 0.05
COLUMNS = ["seed", "value_init", "early_reward", "final_reward", "early_explained_variance"]
# Verdict rule: "reproduced" if the 95% t-interval of the paired difference of the mean
# proxy reward over the early steps (reward-model init - fresh head) lies above 0.


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    world, sft, rm = review_setup(**s["models"])
    fresh = ScalarHeadModel(copy.deepcopy(sft.model_.base_model), head_std=0.0)
    arms = {"reward model": None, "fresh head": fresh}
    rows, curves = [], {}
    for seed in range(s["seeds"]):
        for name, value_model in arms.items():
            policy = PPOPolicy(
                **pinned_ppo(
                    model=sft,
                    beta=BETA,
                    n_steps=s["steps"],
                    batch_size=s["batch_size"],
                    value_model=value_model,
                    min_eos_share=None,
                    random_state=seed,
                )
            ).fit(world.prompts, rm)
            history = policy.history_
            reward = [r["objective/reward"] for r in history]
            curves.setdefault(name, []).append(reward)
            early = history[: s["early"]]
            rows.append(
                {
                    "seed": seed,
                    "value_init": name,
                    "early_reward": float(np.mean(reward[: s["early"]])),
                    "final_reward": float(np.mean(reward[-3:])),
                    "early_explained_variance": float(
                        np.mean([r["val/explained_variance"] for r in early])
                    ),
                }
            )
            print(rows[-1], flush=True)

    get = lambda name, key: np.array([r[key] for r in rows if r["value_init"] == name])  # noqa: E731
    diff = paired_ci(get("reward model", "early_reward"), get("fresh head", "early_reward"))
    ev = paired_ci(
        get("reward model", "early_explained_variance"),
        get("fresh head", "early_explained_variance"),
    )
    verdict = direction_verdict(diff[1], diff[2], "positive")

    fig, (left, right) = new_figure(2)
    for i, name in enumerate(arms):
        c = np.array(curves[name])
        x = np.arange(1, c.shape[1] + 1)
        left.plot(x, c.mean(0), color=f"C{i}", label=f"value from the {name}")
        left.fill_between(x, c.min(0), c.max(0), color=f"C{i}", alpha=0.15)
        right.scatter(
            [i] * len(get(name, "early_reward")), get(name, "early_reward"), color=f"C{i}"
        )
    left.axvspan(0.5, s["early"] + 0.5, color="grey", alpha=0.1, label="early steps")
    left.set_xlabel("step")
    left.set_ylabel("proxy reward (mean; band: range over seeds)")
    left.legend(fontsize=7)
    left.set_title(f"PPO on the review world, β = {BETA}")
    for seed in range(s["seeds"]):
        right.plot(
            [0, 1],
            [get(n, "early_reward")[seed] for n in arms],
            color="grey",
            lw=0.5,
        )
    right.set_xticks([0, 1], [f"from the {n}" for n in arms])
    right.set_ylabel(f"mean reward, first {s['early']} steps")
    right.set_title("one line per seed")

    reason = (
        f"the paired interval of the early reward lies above 0 ({fmt(*diff)})"
        if verdict == "reproduced"
        else f"the paired interval of the early reward ({fmt(*diff)}) does not lie above 0"
        + (" (its estimate favours the fresh head)" if diff[0] < 0 else "")
    )
    return finish(
        args,
        "claim06_value_from_reward",
        rows,
        fig,
        number=6,
        claim="A value model initialised from the reward model learns faster early than a "
        "fresh head",
        source="Ziegler et al. 2019; Huang et al. 2024",
        setting=f"review world, PPO beta {BETA}, {s['steps']} steps of {s['batch_size']}, "
        f"early = first {s['early']} steps, value from the reward model vs SFT trunk + zero "
        f"head, {s['seeds']} seeds",
        result="early reward: from the reward model "
        f"{fmt(*mean_ci(get('reward model', 'early_reward')))}, fresh head "
        f"{fmt(*mean_ci(get('fresh head', 'early_reward')))}; paired "
        f"difference {fmt(*diff)}; early explained variance difference {fmt(*ev)}",
        verdict=verdict,
        reason=reason,
    )


if __name__ == "__main__":
    main()
