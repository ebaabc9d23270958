"""False alarms and recall of the run-health detectors on the suite's worlds.

A detector that fires on a run that learns is a bug (at most 1 alarm in 20 healthy
runs: ``/work/shared/DESIGN.md``'s run-health rule, issue 35); one that stays silent on
a collapse is useless. This script fits, with ``on_unhealthy="ignore"`` (every detector
is judged and recorded, nothing stops):

* **healthy runs**, at prefopt's defaults but for the budget (or, on the arithmetic
  world, at 3e-4: the rate of claims 19 and 21, whose flagged runs ended as good as
  the unflagged ones), each of which is checked to end above its start by a measure
  the detectors do not read:

  - ``preference``: :class:`~prefopt.worlds.PreferenceWorld` (seed 0), a
    :class:`~prefopt.RewardModel` on 1,000 comparisons, PPO, RLOO, GRPO, REINFORCE,
    REINFORCE++ and RAFT, 40 steps of 16; rose = exact objective share > 0;
  - ``tiny_lm-gpt2`` and ``tiny_lm-llama``: :class:`~prefopt.worlds.TinyLMWorld`
    (seed 0, both shapes) on its gold reward, the same six policies, 40 steps of 16
    (the learning-rate sweep's budget); rose = exact objective share > 0;
  - ``arithmetic``: :class:`~prefopt.worlds.ArithmeticWorld` (seed 0) from its SFT
    start (4,000 demonstrations, 5 epochs), GRPO at 3e-4 on the correctness reward, 120
    steps of 64 (claim 21's setting); rose = held-out pass@1 (100 problems, 8 samples
    each) not below the start's by more than 0.02 (claim 21's margin: GRPO at this rate
    barely moves, +0.001 on average).

* **constructed failures**, each of which a detector must catch: RLOO at 0.05 on the
  tests' tiny GPT-2 and a reward in {0, 1} (the reward rises, then every answer turns
  empty and scores 0) and GRPO at 1e-3 on the arithmetic world, 30 steps of 64 (its
  training reward falls from about 0.35 to under 0.1 within 10 steps and stays there).
  The other failure classes (empty and repeated answers, dead groups, no learning, a
  non-finite number) have their constructed failures in ``tests/test_health.py``.

For each run it writes one row to ``benchmarks/health_false_alarms.csv``: the detectors
that fired (and at which step), the largest value each reached (its margin to its
threshold; for ``no_learning``, which fires below its threshold, its final value), and
the start and end score; then prints, per detector, the alarms on the healthy runs that
ended above their start and their value closest to the threshold, and what each failure
fired. Seeds from ``--first-seed`` (2020 unless told; the thresholds were chosen on the
samples from 2000 and 2010, so 2020 is a fresh one): none of the tests', the sweep's or
the reproductions'. Numbers in ``benchmarks/README.md``.

Run::

    python benchmarks/health_false_alarms.py                    # ~3-5 min on one core
    python benchmarks/health_false_alarms.py --first-seed 2000  # a design sample
    python benchmarks/health_false_alarms.py --quick            # a smoke run, a temp file
    python benchmarks/health_false_alarms.py --rows DIR         # each run's history_ (JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

import prefopt  # noqa: E402
from prefopt import (  # noqa: E402
    GRPOPolicy,
    PPOPolicy,
    RAFTPolicy,
    ReinforcePlusPlusPolicy,
    ReinforcePolicy,
    RewardModel,
    RLOOPolicy,
    SFTPolicy,
)
from prefopt.metrics import make_pass_at_k_scorer  # noqa: E402
from prefopt.worlds import ArithmeticWorld, PreferenceWorld, TinyLMWorld  # noqa: E402

HERE = Path(__file__).resolve().parent
POLICIES = {
    "PPO": PPOPolicy,
    "RLOO": RLOOPolicy,
    "GRPO": GRPOPolicy,
    "REINFORCE": ReinforcePolicy,
    "REINFORCE++": ReinforcePlusPlusPolicy,
    "RAFT": RAFTPolicy,
}
SEEDS = (0, 1)  # added to --first-seed
ARITHMETIC_SEEDS = (0, 1, 2, 3, 4, 5, 6, 7)
ARITHMETIC_MARGIN = 0.02  # claim 21's margin of pass@1
EVAL_SEED = 4321


# ----- the worlds ---------------------------------------------------------------------
def preference_task() -> dict:
    world = PreferenceWorld(random_state=0)
    rm = RewardModel().fit(world.comparisons(1000, random_state=0))
    return {"world": world, "reward": rm, "prompts": world.prompts}


def tiny_lm_task(arch: str) -> dict:
    world = TinyLMWorld(random_state=0, architecture=arch)
    return {"world": world, "reward": world.reward, "prompts": world.prompts}


def arithmetic_task(quick: bool) -> dict:
    world = ArithmeticWorld(n_demonstrations=200 if quick else 4000, random_state=0)
    sft = SFTPolicy(model=world.model_config(), n_epochs=1 if quick else 5, random_state=0).fit(
        world.demonstrations
    )
    n_eval = 20 if quick else 100
    task = {
        "world": world,
        "sft": sft,
        "held": (world.eval_prompts[:n_eval], world.eval_answers[:n_eval]),
    }
    task["start"] = pass_at_1(task, sft)
    return task


def pass_at_1(task, policy) -> float:
    """Held-out pass@1 (Chen et al.'s estimator from 8 samples of each problem)."""
    world = task["world"]
    scorer = make_pass_at_k_scorer(
        world.correctness_reward, k=1, n_samples=8, random_state=EVAL_SEED
    )
    return float(scorer(policy, *task["held"]))


# ----- one run ------------------------------------------------------------------------
def fit(policy, prompts, reward) -> tuple:
    began = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        policy.fit(prompts, reward)
    return policy, time.perf_counter() - began


def record(kind, world, name, policy, seconds, start, end, rose, rows_dir) -> dict:
    health = policy.health_["detectors"]
    out = {
        "kind": kind,
        "world": world,
        "policy": name,
        "learning_rate": policy.learning_rate_,
        "seed": policy.random_state,
        "n_steps": policy.n_iter_,
        "batch_size": policy.batch_size,
        "start": start,
        "end": end,
        "rose": rose,
        "fired": ";".join(f"{d}@{v['first_step']}" for d, v in health.items() if v["fired"]),
        "seconds": round(seconds, 2),
    }
    for d in health:  # the largest value the detector reached: its margin to its threshold
        values = [row[f"health/{d}"] for row in policy.history_]
        below = d == "no_learning"  # fires below its threshold, judged at the end
        out[f"peak/{d}"] = health[d]["value"] if below else float(np.nanmax(values))
    if rows_dir is not None:
        path = (
            Path(rows_dir)
            / f"{kind}-{world}-{name}-{policy.learning_rate_:g}-{policy.random_state}.json"
        )
        path.write_text(json.dumps({"health": policy.health_, "rows": policy.history_}))
    return out


def exact_run(task, world_name, name, seed, budget, rows_dir, kind="healthy", **params):
    world = task["world"]
    policy = POLICIES[name](
        model=world.policy_model(), random_state=seed, on_unhealthy="ignore", **budget, **params
    )
    policy, seconds = fit(policy, task["prompts"], task["reward"])
    share = world.objective_share(policy, task["reward"], policy.beta_)
    return record(kind, world_name, name, policy, seconds, 0.0, share, share > 0, rows_dir)


def arithmetic_run(task, name, seed, budget, rows_dir, kind="healthy", **params):
    world = task["world"]
    policy = POLICIES[name](
        model=task["sft"], random_state=seed, on_unhealthy="ignore", **budget, **params
    )
    policy, seconds = fit(policy, world.prompts, world.correctness_reward)
    end = pass_at_1(task, policy)
    rose = end >= task["start"] - ARITHMETIC_MARGIN
    return record(kind, "arithmetic", name, policy, seconds, task["start"], end, rose, rows_dir)


def collapse_run(rows_dir, quick: bool) -> dict:
    """The tests' tiny GPT-2, RLOO at 0.05 on a reward in {0, 1}: a rise, then empty answers."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from _tiny import tiny_lm

    def says_good(prompts, completions):
        return np.array([float("good" in c.split()) for c in completions])

    policy = RLOOPolicy(
        model=tiny_lm(),
        k=4,
        batch_size=32,
        n_steps=6 if quick else 12,
        max_new_tokens=6,
        missing_eos_reward=None,
        learning_rate=0.05,
        random_state=0,
        on_unhealthy="ignore",
    )
    prompts = ["the movie was", "the plot was", "the movie", "the plot"]
    policy, seconds = fit(policy, prompts, says_good)
    rewards = [row["objective/reward"] for row in policy.history_]
    start, end = float(np.mean(rewards[:5])), float(np.mean(rewards[-3:]))
    return record(
        "failure", "tests-tiny", "RLOO", policy, seconds, start, end, end > start, rows_dir
    )


# ----- the measurement ----------------------------------------------------------------
def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 steps a run, a temp CSV")
    parser.add_argument("--rows", default=None, help="a folder for each run's history_")
    parser.add_argument(
        "--first-seed",
        type=int,
        default=2020,
        help="the first seed (2000 and 2010: the samples the thresholds were chosen on)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    prefopt.set_config(show_progress_bar=False)
    if args.rows:
        Path(args.rows).mkdir(parents=True, exist_ok=True)
    exact_budget = {"n_steps": 2 if args.quick else 40, "batch_size": 16}
    arith_budget = {"n_steps": 2 if args.quick else 120, "batch_size": 64}
    seeds = [args.first_seed + s for s in SEEDS[: 1 if args.quick else None]]
    arithmetic_seeds = [args.first_seed + s for s in ARITHMETIC_SEEDS]
    out = []
    tasks = {"preference": preference_task()}
    tasks.update({f"tiny_lm-{a}": tiny_lm_task(a) for a in ("gpt2", "llama")})
    for world_name, task in tasks.items():
        for name in POLICIES:
            for seed in seeds:
                out.append(exact_run(task, world_name, name, seed, exact_budget, args.rows))
                print(_line(out[-1]), flush=True)
    arithmetic = arithmetic_task(args.quick)
    for seed in arithmetic_seeds[: 1 if args.quick else None]:
        out.append(
            arithmetic_run(arithmetic, "GRPO", seed, arith_budget, args.rows, learning_rate=3e-4)
        )
        print(_line(out[-1]), flush=True)
    # the constructed failures
    out.append(collapse_run(args.rows, args.quick))
    print(_line(out[-1]), flush=True)
    fail_budget = {"n_steps": 2 if args.quick else 30, "batch_size": 64}
    for seed in arithmetic_seeds[: 1 if args.quick else 3]:
        out.append(
            arithmetic_run(
                arithmetic, "GRPO", seed, fail_budget, args.rows, kind="failure", learning_rate=1e-3
            )
        )
        print(_line(out[-1]), flush=True)
    frame = pd.DataFrame(out)
    path = (Path(tempfile.mkdtemp()) if args.quick else HERE) / "health_false_alarms.csv"
    frame.to_csv(path, index=False)
    print(summary(frame))
    print(f"wrote {path}")
    return frame


def _line(row: dict) -> str:
    return (
        f"{row['kind']:8s} {row['world']:14s} {row['policy']:11s} lr {row['learning_rate']:<7g} "
        f"seed {row['seed']}: start {row['start']:.3f} end {row['end']:.3f} "
        f"fired [{row['fired']}] ({row['seconds']:.1f} s)"
    )


def summary(frame: pd.DataFrame) -> str:
    """Per detector: alarms on the healthy runs that rose, the peak beside the threshold."""
    healthy = frame[(frame["kind"] == "healthy") & frame["rose"].astype(bool)]
    lines = [
        f"{len(healthy)} healthy runs that ended above their start "
        f"(of {int((frame['kind'] == 'healthy').sum())} at healthy settings)"
    ]
    for column in [c for c in frame.columns if c.startswith("peak/")]:
        name = column.split("/", 1)[1]
        alarms = healthy["fired"].fillna("").str.contains(f"{name}@").sum()
        values = healthy[column].dropna()
        # no_learning fires below its threshold: its closest healthy value is the smallest
        closest = values.min() if name == "no_learning" else values.max()
        lines.append(
            f"  {name:22s} alarms {alarms:2d} of {len(values):2d}; closest healthy value "
            f"{closest:.4g}, median {values.median():.4g}"
        )
    failures = frame[frame["kind"] == "failure"]
    for _, row in failures.iterrows():
        lines.append(
            f"  failure {row['world']} {row['policy']} lr {row['learning_rate']:g} seed "
            f"{row['seed']}: fired [{row['fired']}]; reward_collapse peak "
            f"{row['peak/reward_collapse']:.3f}, kl_blowup peak {row['peak/kl_blowup']:.3f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
