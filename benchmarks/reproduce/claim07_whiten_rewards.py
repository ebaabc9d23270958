"""Whitening the rewards gives shorter responses and the same score at a given length.

Huang et al. (2024): whitening the rewards as well as the advantages gives shorter
summaries and a lower raw win rate, but the same win rate at a given length. Here: the
review world's SFT policy and a reward model fitted on 2,000 rater comparisons (raters
who over-rate length, as claim 14 and the demo); PPO at beta = 0.05, 30 steps of 64
episodes, prefopt's defaults otherwise, with ``whiten_rewards=False`` (the default) or
``True``, same seeds for both. The score is the gold reward (VADER sentiment, which the
raters aimed at) of 2 samples per prompt after training; length is in words.

"At a given length": each seed's samples of both runs are pooled and cut into 5
length bins at the pooled quantiles; the length-adjusted difference is the mean over
bins of (whitened - plain) mean gold, weighted by the pooled count of the bin (bins
where one run has no sample are left out).

Settings and verdict rule, fixed before the first full run: 5 seeds. Two parts, on
95% t-intervals of paired differences over seeds:

- "shorter": the interval of the mean length difference (whitened - plain) lies below 0;
- "same score at a given length": the interval of the length-adjusted gold difference
  lies within +-0.1 (an equivalence margin of 0.1 on VADER's [-1, 1] scale, fixed here).

"reproduced" if both hold, "partly reproduced" if one does, else "not reproduced". The
raw gold difference is reported beside them.

Run::

    python benchmarks/reproduce/claim07_whiten_rewards.py          # ~5 min on 2 cores
    python benchmarks/reproduce/claim07_whiten_rewards.py --quick  # seconds

One seed of claim 6's full setting (the SFT policy and reward model, then two PPO runs
of 20 steps) took 77 s of CPU time (3 minutes of wall time on a busy 2-core machine):
about 45 s for the models, once, and about 0.75 s a PPO step of 64 episodes.
Here 10 runs of 30 steps
and their samples: about 5 minutes on a quiet machine, 10 on a busy one.
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
    review_setup,
)
from _common import settings as choose

from prefopt import PPOPolicy

FULL = dict(
    seeds=5,
    steps=30,
    batch_size=64,
    eval_prompts=None,  # all of them
    models=dict(n_reviews=2000, sft_epochs=5, comparisons=2000, rm_epochs=3),
)
QUICK = dict(
    seeds=2,
    steps=2,
    batch_size=8,
    eval_prompts=16,
    models=dict(n_reviews=200, sft_epochs=1, comparisons=64, rm_epochs=1, normalize_samples=16),
)
BETA = 0.05
MARGIN = 0.1  # equivalence margin on the length-adjusted gold difference
N_BINS = 5
COLUMNS = ["seed", "whiten_rewards", "gold", "length", "proxy", "kl", "adjusted_gold_diff"]
# Verdict rule: see the docstring; computed in main() below.


def adjusted_difference(gold_a, len_a, gold_b, len_b, n_bins=N_BINS):
    """Length-adjusted mean difference a - b: within pooled-quantile bins, count-weighted."""
    pooled = np.concatenate([len_a, len_b])
    edges = np.unique(np.quantile(pooled, np.linspace(0, 1, n_bins + 1)))
    bin_a = np.clip(np.searchsorted(edges, len_a, side="right") - 1, 0, len(edges) - 2)
    bin_b = np.clip(np.searchsorted(edges, len_b, side="right") - 1, 0, len(edges) - 2)
    diffs, weights = [], []
    for b in range(len(edges) - 1):
        in_a, in_b = bin_a == b, bin_b == b
        if in_a.any() and in_b.any():
            diffs.append(gold_a[in_a].mean() - gold_b[in_b].mean())
            weights.append(in_a.sum() + in_b.sum())
    return float(np.average(diffs, weights=weights)) if diffs else float("nan")


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    world, sft, rm = review_setup(**s["models"])
    eval_prompts = world.prompts[: s["eval_prompts"]]
    prompts = [p for p in eval_prompts for _ in range(2)]
    rows, samples = [], {}
    for seed in range(s["seeds"]):
        for whiten in (False, True):
            policy = PPOPolicy(
                model=sft,
                beta=BETA,
                n_steps=s["steps"],
                batch_size=s["batch_size"],
                whiten_rewards=whiten,
                min_eos_share=None,
                random_state=seed,
            ).fit(world.prompts, rm)
            completions = [
                c for group in policy.sample(eval_prompts, n=2, random_state=seed) for c in group
            ]
            gold = world.gold_reward(prompts, completions)
            length = np.array([len(c.split()) for c in completions], dtype=float)
            samples[seed, whiten] = (gold, length)
            rows.append(
                {
                    "seed": seed,
                    "whiten_rewards": whiten,
                    "gold": float(gold.mean()),
                    "length": float(length.mean()),
                    "proxy": float(np.mean(rm.predict(prompts, completions))),
                    "kl": float(np.mean([r["objective/kl"] for r in policy.history_[-5:]])),
                    "adjusted_gold_diff": float("nan"),
                }
            )
            print(rows[-1], flush=True)
        adjusted = adjusted_difference(*samples[seed, True], *samples[seed, False])
        rows[-1]["adjusted_gold_diff"] = rows[-2]["adjusted_gold_diff"] = adjusted

    get = lambda w, key: np.array([r[key] for r in rows if r["whiten_rewards"] == w])  # noqa: E731
    shorter = paired_ci(get(True, "length"), get(False, "length"))
    raw = paired_ci(get(True, "gold"), get(False, "gold"))
    adjusted = mean_ci(get(True, "adjusted_gold_diff"))
    parts = {
        "shorter": shorter[2] < 0,
        f"same score at a given length (within +-{MARGIN})": -MARGIN < adjusted[1]
        and adjusted[2] < MARGIN,
    }

    fig, (left, right) = new_figure(2)
    for whiten, color in ((False, "C0"), (True, "C1")):
        gold = np.concatenate([samples[k][0] for k in samples if k[1] == whiten])
        length = np.concatenate([samples[k][1] for k in samples if k[1] == whiten])
        lengths = np.unique(length)
        means = [gold[length == n].mean() for n in lengths]
        counts = [(length == n).sum() for n in lengths]
        label = "whitened rewards" if whiten else "plain rewards"
        left.plot(lengths, means, color=color, marker="o", ms=3, label=label)
        right.bar(lengths + (0.2 if whiten else -0.2), counts, width=0.4, color=color, label=label)
    left.set_xlabel("length (words)")
    left.set_ylabel("gold reward (mean over samples and seeds)")
    left.legend(fontsize=7)
    left.set_title("score at a given length")
    right.set_xlabel("length (words)")
    right.set_ylabel("samples")
    right.legend(fontsize=7)
    right.set_title(f"lengths, PPO β = {BETA}")

    return finish(
        args,
        "claim07_whiten_rewards",
        rows,
        fig,
        number=7,
        claim="Whitening the rewards gives shorter responses and the same score at a given length",
        source="Huang et al. 2024",
        setting=f"review world, PPO beta {BETA}, {s['steps']} steps of {s['batch_size']}, "
        f"whiten_rewards False/True, gold (VADER) of 2 samples a prompt, {N_BINS} length "
        f"bins, equivalence margin {MARGIN}, {s['seeds']} seeds",
        result=f"length plain {fmt(*mean_ci(get(False, 'length')), digits=1)}, whitened "
        f"{fmt(*mean_ci(get(True, 'length')), digits=1)} (difference {fmt(*shorter, digits=2)}); "
        f"raw gold difference {fmt(*raw)}; length-adjusted gold difference {fmt(*adjusted)}",
        verdict=compound_verdict(parts),
        reason=parts_reason(parts),
    )


if __name__ == "__main__":
    main()
