"""Online reward refits against offline collection on the review task, at equal KL.

Ziegler et al. (2019) found that collecting labels on the current policy's samples
during training ("online") mattered for summarisation. Here: the review world's SFT
policy and a reward model fitted once on 2,000 rater comparisons of SFT samples (as
the demo); then RLOO (k = 4) optimises against it for the same number of steps with
the same seeds, either with that reward fixed (offline) or refitting a copy of it
every ``--refit-every`` steps on the raters' labels of the policy's own samples
(online, ``refit_every=`` with ``labeler=world.labeler``). Both runs steer beta with
the same adaptive KL controller (target 6 nats), so they end at about equal KL.

Settings and verdict rule, fixed before the first full run: 5 seeds; 40 steps of 64
episodes; refits every 2 steps (20 refits, two disjoint pairs of each prompt's 4
samples, up to 32 new labels each); gold (VADER) reward of 2 samples of every prompt
at the end. "Online wins" if the 95% t-interval of the paired difference
(online - offline, over seeds) of the final gold reward lies above 0; "offline wins"
if below; otherwise "no difference detected".

Run::

    python benchmarks/online_refits.py            # ~10 minutes on one busy CPU core
    python benchmarks/online_refits.py --quick    # seconds
"""

from __future__ import annotations

import argparse
import csv
import time

import numpy as np
import torch
from scipy import stats

import prefopt
from prefopt import AdaptiveKLController, RewardModel, RLOOPolicy, SFTPolicy
from prefopt.worlds import ReviewWorld

FULL = dict(n_reviews=2000, sft_epochs=5, comparisons=2000, rm_epochs=3, steps=40, seeds=5)
QUICK = dict(n_reviews=300, sft_epochs=1, comparisons=200, rm_epochs=1, steps=4, seeds=2)


def t_interval(values, level=0.95):
    """Mean and the half-width of its t-interval."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float(values.mean()), float("nan")
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1)
    return float(values.mean()), float(half / np.sqrt(len(values)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--refit-every", type=int, default=2)
    parser.add_argument("--csv", default="online_refits.csv")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    torch.set_num_threads(1)
    prefopt.set_config(show_progress_bar=False)
    began = time.perf_counter()

    world = ReviewWorld(n_reviews=settings["n_reviews"], random_state=0)
    sft = SFTPolicy(
        model=world.model_config(),
        n_epochs=settings["sft_epochs"],
        learning_rate=3e-3,
        batch_size=32,
        random_state=0,
    ).fit(world.demonstrations)
    rm = RewardModel(
        model=sft, learning_rate=1e-3, n_epochs=settings["rm_epochs"], batch_size=16, random_state=0
    ).fit(
        world.comparisons(sft, settings["comparisons"], random_state=0), references=world.references
    )

    rows = []
    for seed in range(settings["seeds"]):
        for mode in ("offline", "online"):
            policy = RLOOPolicy(
                model=sft,
                beta=0.05,
                k=4,
                kl=AdaptiveKLController(target=6.0, gain=1.0),
                learning_rate=1e-3,
                batch_size=64,
                n_steps=settings["steps"],
                refit_every=args.refit_every if mode == "online" else None,
                random_state=seed,
            )
            labeler = world.labeler if mode == "online" else None
            policy.fit(world.prompts, rm, labeler=labeler)
            prompts = [p for p in world.prompts for _ in range(2)]
            samples = [
                c for row in policy.sample(world.prompts, n=2, random_state=seed) for c in row
            ]
            kl = float(
                np.mean(
                    policy.log_prob(prompts, samples)
                    - policy.log_prob(prompts, samples, reference=True)
                )
            )
            last = policy.history_[-1]
            rows.append(
                {
                    "seed": seed,
                    "mode": mode,
                    "gold": float(world.gold_reward(prompts, samples).mean()),
                    "proxy_fixed": float(rm.predict(prompts, samples).mean()),
                    "kl": kl,
                    "beta": last["objective/beta"],
                    "labels": last.get("reward/labels", 0.0),
                }
            )
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()})

    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    gold = {m: np.array([r["gold"] for r in rows if r["mode"] == m]) for m in ("offline", "online")}
    kls = {m: np.array([r["kl"] for r in rows if r["mode"] == m]) for m in ("offline", "online")}
    for mode in ("offline", "online"):
        mean, half = t_interval(gold[mode])
        kl_mean, kl_half = t_interval(kls[mode])
        print(f"{mode:8s} gold {mean:.3f} ± {half:.3f}   KL {kl_mean:.2f} ± {kl_half:.2f}")
    mean, half = t_interval(gold["online"] - gold["offline"])
    verdict = (
        "online wins"
        if mean - half > 0
        else "offline wins"
        if mean + half < 0
        else "no difference detected"
    )
    print(
        f"online - offline: {mean:+.3f} ± {half:.3f} (95% t-interval, paired over seeds): {verdict}"
    )
    print(f"{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
