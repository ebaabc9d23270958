"""DPO as an implicit reward model is less accurate on held-out comparisons than the explicit one.

Huang et al. (2024): a DPO model trained on the same preference data, read as an
implicit reward model, has lower validation accuracy than the explicit reward model
at every model size and seed. Here: the review world at three model widths (GPT-2,
2 layers, n_embd 32, 64 and 128); for each width an SFT policy, then for each seed
2,000 rater comparisons of SFT samples to train on and 500 more to hold out (drawn
with the seed), a ``RewardModel`` (Bradley-Terry, linear head on the SFT trunk) and a
``DPOPolicy`` (beta 0.1, the DPO paper's) both started from the SFT policy and fitted
on the same comparisons with the same optimiser budget: one epoch (the papers' one
epoch of reward-model training), batch 16, learning rate 1e-3 (prefopt's for tiny
models). Accuracy: ``DPOPolicy.score`` (implicit reward beta log pi/pi_ref) against
``RewardModel.score`` on the held-out comparisons; the reward model is not normalised
(an affine map leaves its pairwise accuracy unchanged).

Settings and verdict rule, fixed before the first full run: 5 seeds per width. At
each width, the 95% t-interval of the paired difference (reward model - DPO) over
seeds. "reproduced" if the reward model is more accurate in every (width, seed) and
the interval lies above 0 at every width; "partly reproduced" if the interval lies
above 0 at some width; "not reproduced" otherwise.

Run::

    python benchmarks/reproduce/claim15_dpo_implicit_reward.py          # ~8 min (est.)
    python benchmarks/reproduce/claim15_dpo_implicit_reward.py --quick  # seconds
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from _common import finish, fmt, mean_ci, new_figure, paired_ci, parse_args, review_sft
from _common import settings as choose

from prefopt import DPOPolicy, RewardModel

FULL = dict(
    n_reviews=2000, sft_epochs=5, widths=(32, 64, 128), train=2000, held_out=500, epochs=1, seeds=5
)
QUICK = dict(n_reviews=200, sft_epochs=1, widths=(32,), train=32, held_out=32, epochs=1, seeds=2)
COLUMNS = ["width", "seed", "rm_accuracy", "dpo_accuracy", "difference", "dpo_train_accuracy"]
# Verdict rule (see the docstring): reward model - DPO held-out accuracy > 0 in every
# (width, seed) and by the paired 95% t-interval at every width.


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    rows = []
    for width in s["widths"]:
        world, sft = review_sft(s["n_reviews"], s["sft_epochs"], n_embd=width)
        for seed in range(s["seeds"]):
            train = world.comparisons(sft, s["train"], random_state=seed)
            held = world.comparisons(sft, s["held_out"], random_state=10_000 + seed)
            budget = dict(
                model=sft,
                learning_rate=1e-3,
                n_epochs=s["epochs"],
                batch_size=16,
                random_state=seed,
            )
            rm = RewardModel(normalize=False, **budget).fit(train)
            dpo = DPOPolicy(beta=0.1, **budget).fit(train)
            rm_acc, dpo_acc = rm.score(held), dpo.score(held)
            rows.append(
                {
                    "width": width,
                    "seed": seed,
                    "rm_accuracy": rm_acc,
                    "dpo_accuracy": dpo_acc,
                    "difference": rm_acc - dpo_acc,
                    "dpo_train_accuracy": dpo.history_[-1]["rewards/accuracy"],
                }
            )
            print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)[COLUMNS]

    per_width, parts = [], []
    for width, sub in frame.groupby("width"):
        ci = paired_ci(sub["rm_accuracy"], sub["dpo_accuracy"])
        per_width.append(ci[1] > 0)
        parts.append(
            f"n_embd {width}: RM {fmt(*mean_ci(sub['rm_accuracy']))}, DPO "
            f"{fmt(*mean_ci(sub['dpo_accuracy']))}, RM - DPO {fmt(*ci)}"
        )
    everywhere = bool((frame["difference"] > 0).all())
    verdict = (
        "reproduced"
        if everywhere and all(per_width)
        else "partly reproduced"
        if any(per_width)
        else "not reproduced"
    )

    fig, axes = new_figure(2)
    widths = sorted(frame["width"].unique())
    for name, color, column in (
        ("reward model", "C0", "rm_accuracy"),
        ("DPO", "C1", "dpo_accuracy"),
    ):
        stats = [mean_ci(frame.loc[frame.width == w, column]) for w in widths]
        m = np.array([v[0] for v in stats])
        err = [m - np.array([v[1] for v in stats]), np.array([v[2] for v in stats]) - m]
        axes[0].errorbar(widths, m, yerr=err, fmt="o-", capsize=3, color=color, label=name)
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("model width (n_embd)")
    axes[0].set_ylabel("held-out pairwise accuracy")
    axes[0].legend()
    for w in widths:
        sub = frame[frame.width == w]
        axes[1].scatter(np.full(len(sub), w), sub["difference"], s=14, color="C2")
    axes[1].axhline(0, color="grey", lw=0.8)
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("model width (n_embd)")
    axes[1].set_ylabel("reward model - DPO accuracy (one point a seed)")
    n_pos = int((frame["difference"] > 0).sum())
    return finish(
        args,
        "claim15_dpo_implicit_reward",
        frame,
        fig,
        number=15,
        claim="DPO read as an implicit reward model has lower held-out pairwise accuracy than "
        "the explicit reward model, at every model size and seed",
        source="Huang et al. 2024",
        setting=f"review world, GPT-2 2 layers n_embd {'/'.join(map(str, s['widths']))}, "
        f"{s['train']} train / {s['held_out']} held-out rater comparisons of SFT samples, "
        f"{s['epochs']} epoch, batch 16, lr 1e-3, DPO beta 0.1, {s['seeds']} seeds",
        result="; ".join(parts),
        verdict=verdict,
        reason=f"the reward model is more accurate in {n_pos} of {len(frame)} (width, seed) "
        f"pairs; the paired interval lies above 0 at {sum(per_width)} of {len(per_width)} widths",
    )


if __name__ == "__main__":
    main()
