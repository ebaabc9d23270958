"""RL responses grow longer than SFT's; the length-binned win rate shows where the gain comes from.

Huang et al. (2024): PPO summaries are longer than the SFT model's; binned by length
relative to the reference summary, PPO wins in every bin and its win rate rises with
length. Here: the review world's SFT policy and proxy reward model (as claim 14; the
simulated raters over-rate long completions, as labellers are thought to), then PPO
with Huang et al.'s defaults as prefopt ships them (beta 0.05, 4 epochs, GAE lambda
0.95) against the proxy. For the SFT policy and each PPO run, 2 samples of every
prompt are judged against the prompt's reference completion by the gold (VADER)
reward, and binned by the ratio of their word counts with
``prefopt.metrics.length_binned_win_rate`` (bins 0-0.5-0.8-1.25-2-inf).

Settings and verdict rule, fixed before the first full run: 5 seeds (the SFT policy is
scored on the same 5 sampling seeds), 40 steps of 64 episodes, learning rate 1e-3.
(A) RL is longer: the 95% t-interval of PPO's mean words minus SFT's, paired by seed,
lies above 0. (B) The gain holds at equal length: in every bin that holds at least 20
judged pairs for both policies in every seed, the paired interval of PPO's minus SFT's
win rate lies above 0. "reproduced" if A and B; "partly reproduced" if A only (the
gain is, at least in part, length); "not reproduced" if A fails.

Run::

    python benchmarks/reproduce/claim13_length_binned_win_rate.py          # ~4 min (est.)
    python benchmarks/reproduce/claim13_length_binned_win_rate.py --quick  # seconds
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from _common import (
    REVIEW_FULL,
    REVIEW_QUICK,
    finish,
    fmt,
    mean_ci,
    new_figure,
    paired_ci,
    parse_args,
    review_setup,
)
from _common import settings as choose

from prefopt import PPOPolicy
from prefopt.metrics import length_binned_win_rate

FULL = dict(**REVIEW_FULL, steps=40, batch_size=64, seeds=5, eval_prompts=None, min_pairs=20)
QUICK = dict(**REVIEW_QUICK, steps=1, batch_size=8, seeds=2, eval_prompts=16, min_pairs=1)
COLUMNS = ["seed", "policy", "bin", "low", "high", "n", "wins", "ties", "win_rate", "words"]
# Verdict rule (see the docstring): A PPO words - SFT words > 0; B in every bin populated
# (>= min_pairs pairs for both policies, every seed) PPO win rate - SFT win rate > 0.


def judge(world):
    def gold_difference(prompt, completion, reference):
        return float(np.subtract(*world.gold_reward([prompt] * 2, [completion, reference])))

    return gold_difference


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    world, sft, rm = review_setup(**{k: s[k] for k in REVIEW_FULL})
    prompts = world.prompts[: s["eval_prompts"]]
    rows = []
    for seed in range(s["seeds"]):
        ppo = PPOPolicy(
            model=sft,
            beta=0.05,
            learning_rate=1e-3,
            batch_size=s["batch_size"],
            n_steps=s["steps"],
            random_state=seed,
        ).fit(world.prompts, rm)
        for name, policy in (("SFT", sft), ("PPO", ppo)):
            table = length_binned_win_rate(
                policy, prompts, judge(world), world.references, n_samples=2, random_state=seed
            )
            texts = [c for g in policy.sample(prompts, n=2, random_state=seed) for c in g]
            words = float(np.mean([len(t.split()) for t in texts]))
            for rec in table.to_dict("records"):
                rows.append({"seed": seed, "policy": name, **rec, "words": words})
        print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)[COLUMNS]

    per_seed = frame.drop_duplicates(["seed", "policy"]).pivot(
        index="seed", columns="policy", values="words"
    )
    length = paired_ci(per_seed["PPO"], per_seed["SFT"])
    a = length[1] > 0
    bins, parts = [], []
    for label, group in frame.groupby("bin", sort=False):
        wide = group.pivot(index="seed", columns="policy", values=["win_rate", "n"])
        if (wide["n"] >= s["min_pairs"]).all().all():
            ci = paired_ci(wide["win_rate"]["PPO"], wide["win_rate"]["SFT"])
            bins.append(ci[1] > 0)
            parts.append(f"{label}: PPO - SFT {fmt(*ci, digits=2)}")
        else:
            parts.append(f"{label}: too few pairs")
    b = bool(bins) and all(bins)
    verdict = "reproduced" if a and b else "partly reproduced" if a else "not reproduced"

    fig, axes = new_figure(2)
    for name, color in (("SFT", "C0"), ("PPO", "C1")):
        sub = frame[frame.policy == name]
        stats = sub.groupby("bin", sort=False)["win_rate"].apply(lambda v: mean_ci(v))
        x = np.arange(len(stats))
        m = np.array([v[0] for v in stats])
        lo, hi = np.array([v[1] for v in stats]), np.array([v[2] for v in stats])
        axes[0].errorbar(
            x + (0.1 if name == "PPO" else -0.1),
            m,
            yerr=[m - lo, hi - m],
            fmt="o",
            capsize=3,
            color=color,
            label=name,
        )
        counts = sub.groupby("bin", sort=False)["n"].sum()
        axes[1].bar(
            x + (0.2 if name == "PPO" else -0.2),
            counts / counts.sum(),
            width=0.4,
            color=color,
            label=name,
        )
    for ax in axes:
        ax.set_xticks(range(len(stats)), list(stats.index), rotation=20)
        ax.set_xlabel("completion length / reference length (words)")
    axes[0].axhline(0.5, color="grey", lw=0.8)
    axes[0].set_ylabel("win rate vs reference (gold judge)")
    axes[1].set_ylabel("share of samples")
    axes[0].legend()
    return finish(
        args,
        "claim13_length_binned_win_rate",
        frame,
        fig,
        number=13,
        claim="RL responses grow longer than SFT's; the win rate binned by length relative to "
        "the reference shows where the gain comes from (PPO wins in every bin)",
        source="Huang et al. 2024",
        setting=f"review world (raters biased to length), PPO beta 0.05, lr 1e-3, {s['steps']} "
        f"steps of {s['batch_size']}, {s['seeds']} seeds, gold (VADER) judge",
        result=f"words SFT {fmt(*mean_ci(per_seed['SFT']), digits=1)}, PPO "
        f"{fmt(*mean_ci(per_seed['PPO']), digits=1)}; PPO - SFT {fmt(*length, digits=1)}",
        verdict=verdict,
        reason=("longer: " if a else "not longer: ")
        + f"PPO - SFT words {fmt(*length, digits=1)}; "
        + "win rate by bin: "
        + "; ".join(parts),
    )


if __name__ == "__main__":
    main()
