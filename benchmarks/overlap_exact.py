"""What staleness costs on the exact worlds: overlapped rollouts against synchronous ones.

For each world (the preference world, TinyLMWorld), algorithm (RLOO, GRPO, PPO) and seed,
three fits from the same seed: synchronous (``max_staleness=None``), one step off-policy
with the correction (``max_staleness=1``, ``off_policy_cap=2``: truncated importance
sampling, or AReaL's decoupled objective for a clipped loss) and without it
(``off_policy_cap=None``). Each reports the objective share it reached (the
closed-form optimum's KL-regularised objective is 1, the reference's 0); the table
gives, per cell, the mean share of each mode and the mean paired difference from the
synchronous run with its 95% t-interval over the seeds, and the largest
``overlap/is_truncated_share`` and ``overlap/kl`` any overlapped step saw (what the
``runaway_importance_weights`` detector reads).

    python benchmarks/overlap_exact.py                          # both worlds, 5 seeds
    python benchmarks/overlap_exact.py --worlds preference --seeds 3 --algorithms rloo
    python benchmarks/overlap_exact.py --worlds tiny_lm --n-steps 30   # a shorter budget
    python benchmarks/overlap_exact.py --worlds tiny_lm --jobs 8       # 8 fits at a time
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from scipy import stats

MODES = {
    "sync": dict(max_staleness=None),
    "stale1": dict(max_staleness=1),
    "stale1-uncorrected": dict(max_staleness=1, off_policy_cap=None),
}


def fit_one(world_name: str, algorithm: str, seed: int, mode: str, n_steps=None) -> dict:
    """One fit; its objective share and the largest overlap columns of its history."""
    import prefopt
    from prefopt.worlds import PreferenceWorld, TinyLMWorld

    prefopt.set_config(show_progress_bar=False)
    cls = {"rloo": prefopt.RLOOPolicy, "grpo": prefopt.GRPOPolicy, "ppo": prefopt.PPOPolicy}
    beta = 0.1
    if world_name == "preference":
        world = PreferenceWorld(random_state=0)
        reward, extra = world.true_quality, {}
    else:
        world = TinyLMWorld(random_state=0)
        reward, extra = world.reward, {"learning_rate": 1e-3}  # the README's rate there
    if n_steps is not None:  # fewer than the default 100: a matched, shorter budget
        extra["n_steps"] = n_steps
    policy = cls[algorithm](
        model=world.policy_model(), beta=beta, random_state=seed, **extra, **MODES[mode]
    )
    start = time.perf_counter()
    policy.fit(world.prompts, reward)
    rows = policy.history_
    return {
        "world": world_name,
        "algorithm": algorithm,
        "seed": seed,
        "mode": mode,
        "share": float(world.objective_share(policy, reward, beta)),
        "max_truncated_share": max(r.get("overlap/is_truncated_share", 0) for r in rows),
        "max_kl": max(r.get("overlap/kl", 0) for r in rows),
        "seconds": time.perf_counter() - start,
    }


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def interval(values) -> tuple[float, float, float]:
    """Mean and 95% t-interval."""
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))
    return mean, mean - half, mean + half


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", default="preference,tiny_lm")
    parser.add_argument("--algorithms", default="rloo,grpo,ppo")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--n-steps", type=int, help="steps a fit (default: the policy's, 100)")
    parser.add_argument("--out", help="write every run as JSON lines here")
    parser.add_argument(
        "--jobs", type=int, default=1,
        help="fits at a time, each in its own process with one torch thread (1: here, in turn)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    cells = [
        (world, algorithm, seed, mode, args.n_steps)
        for world in args.worlds.split(",")
        for algorithm in args.algorithms.split(",")
        for seed in range(args.seeds)
        for mode in MODES
    ]
    if args.jobs == 1:
        results = (fit_one(*cell) for cell in cells)
    else:  # the seeds and settings decide each fit's numbers, not the number of processes
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        pool = ProcessPoolExecutor(args.jobs, get_context("spawn"), initializer=_one_thread)
        results = pool.map(fit_one, *zip(*cells))
    runs = []
    for run in results:
        runs.append(run)
        print(json.dumps(run), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(run) + "\n")
    print("\nworld       algorithm  mode                share mean   minus sync [95% CI]")
    for world in args.worlds.split(","):
        for algorithm in args.algorithms.split(","):
            cell = [r for r in runs if r["world"] == world and r["algorithm"] == algorithm]
            sync = {r["seed"]: r["share"] for r in cell if r["mode"] == "sync"}
            for mode in MODES:
                mine = [r for r in cell if r["mode"] == mode]
                mean = np.mean([r["share"] for r in mine])
                diff = interval([r["share"] - sync[r["seed"]] for r in mine])
                extra = ""
                if mode != "sync":
                    extra = (
                        f"  (max truncated share {max(r['max_truncated_share'] for r in mine):.3f},"
                        f" max overlap/kl {max(r['max_kl'] for r in mine):.4f})"
                    )
                print(
                    f"{world:<11} {algorithm:<10} {mode:<19} {mean:.4f}     "
                    f"{diff[0]:+.4f} [{diff[1]:+.4f}, {diff[2]:+.4f}]{extra}"
                )


if __name__ == "__main__":
    main()
