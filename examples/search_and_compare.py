"""Seed-aware search over beta and k, and a comparison of algorithms, on the preference world.

Every candidate and algorithm is fitted on the same 5 seeds; the figures show means
with 95% confidence intervals, never the best seed. Saves two PNGs.

Run::

    python examples/search_and_compare.py --out-dir docs
"""

from __future__ import annotations

import argparse
from pathlib import Path

try:
    import matplotlib
except ModuleNotFoundError:  # the figure is the plot extra's
    raise SystemExit(
        "examples/search_and_compare.py draws its figure with matplotlib: "
        'pip install "prefopt[plot]".'
    ) from None

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import prefopt  # noqa: E402
from prefopt import (
    PPOPolicy,
    RAFTPolicy,
    ReinforcePolicy,
    RewardModel,
    RLOOPolicy,  # noqa: E402
    SeedSearchCV,
    compare,
)
from prefopt.plotting import plot_comparison, plot_search  # noqa: E402
from prefopt.worlds import PreferenceWorld  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out-dir", default=".")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    prefopt.set_config(show_progress_bar=False)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    world = PreferenceWorld(rater_bias=1.0, random_state=0)
    rm = RewardModel().fit(world.comparisons(1000, random_state=0))

    search = SeedSearchCV(
        RLOOPolicy(
            model=world.policy_model(),
            learning_rate=2.0,
            optimizer="sgd",
            batch_size=64,
            n_steps=args.steps,
        ),
        {"beta": [0.03, 0.1, 0.3, 1.0, 3.0], "k": [2, 4]},
        seeds=args.seeds,
        scoring=world.scorer("true_quality"),
        n_jobs=1,
    )
    search.fit(world.prompts, reward_model=rm)
    print("search: best", search.best_params_, f"true quality {search.best_score_:.3f}")
    ax = plot_search(search, param="beta", group="k")
    ax.set_xscale("log")
    ax.set_ylabel("true quality (exact)")
    ax.figure.savefig(out / "search.png", dpi=110, bbox_inches="tight")

    common = dict(beta=0.3, batch_size=64, n_steps=args.steps, optimizer="sgd")
    algorithms = {
        "PPO": PPOPolicy(model=world.policy_model(), learning_rate=0.3, **common),
        "RLOO": RLOOPolicy(model=world.policy_model(), k=4, learning_rate=2.0, **common),
        "REINFORCE": ReinforcePolicy(model=world.policy_model(), learning_rate=2.0, **common),
        # ranked by the score alone (Dong et al.), RAFT ignores beta
        "RAFT": RAFTPolicy(
            model=world.policy_model(), k=4, rank_by="score", learning_rate=0.3, **common
        ),
    }
    comparison = compare(
        algorithms,
        world.prompts,
        reward_model=rm,
        seeds=args.seeds,
        scoring={
            "objective": world.scorer("objective"),
            "true_quality": world.scorer("true_quality"),
        },
        baseline="RLOO",
    )
    print(comparison.summary.round(4).to_string())
    optimum = world.optimum(rm, 0.3)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    plot_comparison(comparison, "objective", reference=optimum["objective"], ax=axes[0])
    plot_comparison(comparison, "true_quality", reference=optimum["true_quality"], ax=axes[1])
    fig.tight_layout()
    fig.savefig(out / "comparison.png", dpi=110)
    print(f"saved {out / 'search.png'} and {out / 'comparison.png'}")


if __name__ == "__main__":
    main()
