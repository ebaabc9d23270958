"""Issue 25's acceptance check of the tiny-model defaults: RLOO, GRPO, PPO and REINFORCE on
the review world at their default learning rates, 5 seeds, no health warning, held-out gold
above the SFT model's on every seed.

The setting is the demo's (``examples/demo.py``): ``ReviewWorld(random_state=0)`` (2,000
reviews), an SFT model (5 epochs, rate 3e-3, batch 32) and a ``RewardModel`` on 2,000
comparisons of SFT samples (3 epochs, rate 1e-3, batch 16, shifted by the references) as
the (learned, proxy) reward. Each policy trains on 2/3 of the distinct prompts (a fixed
permutation, seed 0) with its defaults (``learning_rate=None``: the rate its class
declares for tiny models, from ``benchmarks/lr_sweep.py``) except the demo's budget, 30
steps of 64 episodes, and ``random_state`` 0-4 (not the sweep's seeds 1000-1004). The held
out 1/3 is scored by the gold (VADER) reward of 4 samples a prompt (sampling seed 4321),
the SFT model's by the same measurement. Every ``RunHealthWarning`` is counted.

Run::

    python benchmarks/review_defaults.py --workers 2    # writes benchmarks/review_defaults.csv
    python benchmarks/review_defaults.py --quick        # a smoke run, a temp folder only
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from joblib import Parallel, delayed  # noqa: E402

import prefopt  # noqa: E402
from prefopt import (  # noqa: E402
    GRPOPolicy,
    PPOPolicy,
    ReinforcePolicy,
    RewardModel,
    RLOOPolicy,
    SFTPolicy,
)
from prefopt.exceptions import RunHealthWarning  # noqa: E402
from prefopt.worlds import ReviewWorld  # noqa: E402

HERE = Path(__file__).resolve().parent
POLICIES = {"RLOO": RLOOPolicy, "GRPO": GRPOPolicy, "PPO": PPOPolicy, "REINFORCE": ReinforcePolicy}
SEEDS = (0, 1, 2, 3, 4)
EVAL_SEED = 4321


def setup(quick: bool) -> dict:
    """The world, SFT model, reward model and the train / held-out prompts."""
    world = ReviewWorld(n_reviews=300 if quick else 2000, random_state=0)
    sft = SFTPolicy(
        model=world.model_config(),
        n_epochs=1 if quick else 5,
        learning_rate=3e-3,
        batch_size=32,
        random_state=0,
    ).fit(world.demonstrations)
    comparisons = world.comparisons(sft, 200 if quick else 2000, random_state=0)
    rm = RewardModel(
        model=sft, learning_rate=1e-3, n_epochs=1 if quick else 3, batch_size=16, random_state=0
    ).fit(comparisons, references=world.references)
    order = np.random.RandomState(0).permutation(len(world.prompts))
    cut = len(order) * 2 // 3
    spec = {
        "world": world,
        "sft": sft,
        "rm": rm,
        "train": [world.prompts[i] for i in order[:cut]],
        "held": [world.prompts[i] for i in order[cut:]][: 16 if quick else None],
    }
    spec["start"] = gold(spec, sft)
    return spec


def gold(spec, policy) -> float:
    """Mean gold (VADER) reward of 4 samples of each held-out prompt."""
    held, n = spec["held"], 4
    completions = [c for row in policy.sample(held, n=n, random_state=EVAL_SEED) for c in row]
    return float(spec["world"].gold_reward([p for p in held for _ in range(n)], completions).mean())


def one_run(spec, name: str, seed: int, n_steps: int) -> dict:
    torch.set_num_threads(1)
    prefopt.set_config(show_progress_bar=False)
    began = time.perf_counter()
    policy = POLICIES[name](model=spec["sft"], n_steps=n_steps, batch_size=64, random_state=seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy.fit(spec["train"], spec["rm"])
    health = [
        str(w.message).split(":")[1].strip() for w in caught if w.category is RunHealthWarning
    ]
    fired = [d for d, v in policy.health_["detectors"].items() if v["fired"]]
    end = gold(spec, policy)
    return {
        "policy": name,
        "seed": seed,
        "learning_rate": policy.learning_rate_,
        "health warnings": len(health),
        "fired": ";".join(fired),
        "SFT gold": spec["start"],
        "end gold": end,
        "above SFT": end > spec["start"],
        "kl": float(np.mean([h["objective/kl"] for h in policy.history_[-3:]])),
        "seconds": time.perf_counter() - began,
    }


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="seconds; a temp folder only")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    prefopt.set_config(show_progress_bar=False)
    out = Path(tempfile.mkdtemp(prefix="review_defaults_")) if args.quick else HERE
    began = time.perf_counter()
    spec = setup(args.quick)
    print(f"setup {time.perf_counter() - began:.0f} s; SFT held-out gold {spec['start']:.4f}")
    seeds = SEEDS[:2] if args.quick else SEEDS
    n_steps = 2 if args.quick else 30
    jobs = [(name, seed) for name in POLICIES for seed in seeds]
    rows = Parallel(n_jobs=args.workers, backend="loky")(
        delayed(one_run)(spec, name, seed, n_steps) for name, seed in jobs
    )
    table = pd.DataFrame(rows)
    table.to_csv(out / "review_defaults.csv", index=False)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for name, g in table.groupby("policy", sort=False):
        ok = bool((g["health warnings"] == 0).all() and g["above SFT"].all())
        print(
            f"{name} (learning rate {g.learning_rate.iloc[0]:g}): health warnings "
            f"{int(g['health warnings'].sum())}, above SFT on {int(g['above SFT'].sum())}/"
            f"{len(g)} seeds: {'PASS' if ok else 'FAIL'}"
        )
    print(f"({time.perf_counter() - began:.0f} s; {out / 'review_defaults.csv'})")
    return table


if __name__ == "__main__":
    main()
