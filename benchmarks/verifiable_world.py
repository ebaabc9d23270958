"""GRPO, RLOO and PPO on the arithmetic world: held-out pass@1 and pass@8 before and after.

The verifiable-reward check: an SFT model of :class:`prefopt.worlds.ArithmeticWorld`
(world seed 0 unless ``--world-seed``, ``SFTPolicy(n_epochs=6, random_state=0)`` on its
4,000 demonstrations: the world's recipe, which starts every world seed measured, 0-3, between
10% and 50% held-out pass@1, where 5 epochs left seeds 1 and 3 below 10%), then each
algorithm at prefopt's defaults except ``n_steps`` and ``batch_size``, at each learning
rate of ``--learning-rate`` (prefopt's default for tiny models and 1e-4 unless told),
trained on the world's training problems with
:meth:`~prefopt.worlds.ArithmeticWorld.correctness_reward` as the reward, one run per
seed. Held-out pass@1 and pass@8 (Chen et al. 2021's unbiased estimator from 16
samples of each of the 200 held-out problems, sampled at the policy's temperature
with a fixed seed) of the SFT model and of every trained policy, and whether pass@1
rose on every seed, with the health detectors that fired in each run. The measured table
is in ``ArithmeticWorld``'s docstring; the runs at prefopt's defaults are in
``benchmarks/verifiable_world_defaults.csv``, those at 1e-3 and 1e-4 of an earlier commit
(5 SFT epochs) in ``benchmarks/verifiable_world.csv``.

Run::

    python benchmarks/verifiable_world.py                          # 3 seeds, 2 rates
    python benchmarks/verifiable_world.py --learning-rate default  # one rate
    python benchmarks/verifiable_world.py --learning-rate default --world-seed 1
    python benchmarks/verifiable_world.py --quick                  # seconds: a smoke run
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import pandas as pd
import torch

import prefopt
from prefopt import GRPOPolicy, PPOPolicy, RLOOPolicy, SFTPolicy
from prefopt.metrics import make_pass_at_k_scorer
from prefopt.worlds import ArithmeticWorld

ALGORITHMS = {"GRPO": GRPOPolicy, "RLOO": RLOOPolicy, "PPO": PPOPolicy}
EVAL_SAMPLES, EVAL_SEED = 16, 1234


def held_out(policy, world, eval_prompts, eval_answers) -> dict:
    """Held-out pass@1 and pass@8 from the same 16 samples of each problem."""
    out = {}
    for k in (1, 8):
        scorer = make_pass_at_k_scorer(
            world.correctness_reward, k=k, n_samples=EVAL_SAMPLES, random_state=EVAL_SEED
        )
        out[f"pass@{k}"] = scorer(policy, eval_prompts, eval_answers)
    return out


def markdown(table: pd.DataFrame) -> str:
    """The table as Markdown, numbers to 3 decimals (learning rates as given)."""

    def cell(value) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    for row in table.itertuples(index=False):
        cells = [f"{v:g}" if c == "learning_rate" else cell(v) for c, v in zip(table.columns, row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--n-steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--learning-rate",
        default="default,1e-4",
        help="comma-separated rates, 'default' for prefopt's (default: default,1e-4)",
    )
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--world-seed", type=int, default=0, help="the world's random_state")
    parser.add_argument(
        "--sft-epochs", type=int, default=6, help="epochs of the SFT start (the world's recipe)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny settings, seconds")
    parser.add_argument("--csv", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    prefopt.set_config(show_progress_bar=False)

    n_demos, sft_epochs, n_eval = (200, 1, 20) if args.quick else (4000, args.sft_epochs, 200)
    n_steps, seeds = (2, 1) if args.quick else (args.n_steps, args.seeds)
    world = ArithmeticWorld(n_demonstrations=n_demos, random_state=args.world_seed)
    eval_prompts, eval_answers = world.eval_prompts[:n_eval], world.eval_answers[:n_eval]
    sft = SFTPolicy(model=world.model_config(), n_epochs=sft_epochs, random_state=0)
    sft.fit(world.demonstrations)
    start = held_out(sft, world, eval_prompts, eval_answers)
    print(f"SFT: held-out pass@1 {start['pass@1']:.3f}, pass@8 {start['pass@8']:.3f}")

    rates = [None if r == "default" else float(r) for r in args.learning_rate.split(",")]
    rows = []
    for name, rate, seed in itertools.product(args.algorithms.split(","), rates, range(seeds)):
        policy = ALGORITHMS[name](
            model=sft,
            n_steps=n_steps,
            batch_size=args.batch_size,
            learning_rate=rate,
            random_state=seed,
        )
        began = time.perf_counter()
        policy.fit(world.prompts, world.correctness_reward)
        seconds = time.perf_counter() - began
        end = held_out(policy, world, eval_prompts, eval_answers)
        fired = [d for d, v in policy.health_["detectors"].items() if v["fired"]]
        reward = [row["objective/reward"] for row in policy.history_]
        kl = [row["objective/kl"] for row in policy.history_]
        rows.append(
            {
                "algorithm": name,
                "seed": seed,
                "learning_rate": policy.learning_rate_,
                "start pass@1": start["pass@1"],
                "end pass@1": end["pass@1"],
                "start pass@8": start["pass@8"],
                "end pass@8": end["pass@8"],
                "reward, first 10 steps": float(np.mean(reward[:10])),
                "reward, last 10 steps": float(np.mean(reward[-10:])),
                "max kl": float(np.max(kl)),
                "health warnings": ";".join(fired) or "-",
                "fit s": seconds,
            }
        )
        print(
            f"{name} lr {policy.learning_rate_:g} seed {seed}: pass@1 {end['pass@1']:.3f}, "
            f"pass@8 {end['pass@8']:.3f} ({seconds:.0f} s)",
            flush=True,
        )
    table = pd.DataFrame(rows)
    raised = table.groupby(["algorithm", "learning_rate"], sort=False).apply(
        lambda g: bool((g["end pass@1"] > g["start pass@1"]).all()), include_groups=False
    )
    print()
    print(markdown(table))
    print()
    for (name, rate), ok in raised.items():
        print(f"{name} at learning rate {rate:g}: held-out pass@1 rose on every seed: {ok}")
    if args.csv:
        table.to_csv(args.csv, index=False)
    return table


if __name__ == "__main__":
    main()
