"""Open question: is PPO's short-answer mode an artefact of a two-value learning-rate sweep?

Ahmadian et al. (2024) swept PPO's learning rate over two values and report its
responses on helpful-harmless data at 16.5 tokens against 39-104 for the other
methods, which reads as PPO settling into a short-answer mode. Here the learning rate
is swept over six values, a factor of 300, for PPO and for RLOO (k = 4) alike, with
the paper's two gradient steps per batch for both (as claim 10), beta 0.05, on the
review world (SFT policy and proxy reward model as claim 14). Measured: the mean words
of 2 samples of every prompt at the end (and the SFT policy's, for scale), the proxy
reward and the EOS share. A run that diverges (prefopt stops it with an error) is
recorded as diverged and left out of the intervals.

Settings and verdict rule, fixed before the first full run: learning rates 1e-4,
3e-4, 1e-3, 3e-3, 1e-2, 3e-2; 30 steps of 64 episodes; 5 seeds. At each learning rate,
the 95% t-interval of PPO's minus RLOO's mean words, paired by seed. "reproduced"
(the short-answer mode is PPO's, not the sweep's) if PPO is shorter at every learning
rate (interval below 0); "partly reproduced" if at some learning rates only (it
depends on the learning rate, so a two-value sweep can find or miss it); "not
reproduced" if at none.

Run::

    python benchmarks/reproduce/claim18_ppo_length_vs_lr.py          # ~10 min (est.)
    python benchmarks/reproduce/claim18_ppo_length_vs_lr.py --quick  # seconds
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from _common import (
    REVIEW_FULL,
    REVIEW_METRICS,
    REVIEW_QUICK,
    finish,
    fit_or_none,
    fmt,
    mean_ci,
    new_figure,
    paired_ci,
    parse_args,
    review_metrics,
    review_setup,
)
from _common import settings as choose

from prefopt import PPOPolicy, RLOOPolicy

FULL = dict(
    **REVIEW_FULL,
    steps=30,
    batch_size=64,
    seeds=5,
    eval_prompts=None,
    learning_rates=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2),
)
QUICK = dict(
    **REVIEW_QUICK, steps=1, batch_size=4, seeds=2, eval_prompts=4, learning_rates=(1e-3, 1e-2)
)
COLUMNS = [
    "algorithm",
    "learning_rate",
    "seed",
    "diverged",
    "words",
    "proxy",
    "gold",
    "kl",
    "eos_share",
]
# Verdict rule (see the docstring): PPO - RLOO words, paired 95% t-interval, at each
# learning rate: below 0 at all "reproduced", at some "partly reproduced", at none "not".


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    world, sft, rm = review_setup(**{k: s[k] for k in REVIEW_FULL})
    prompts = world.prompts[: s["eval_prompts"]]
    rows = []
    for seed in range(s["seeds"]):
        rows.append(
            {
                "diverged": False,
                "algorithm": "SFT",
                "learning_rate": 0.0,
                "seed": seed,
                **review_metrics(world, sft, rm, prompts, seed=seed),
            }
        )
        for lr in s["learning_rates"]:
            common = dict(
                model=sft,
                beta=0.05,
                learning_rate=lr,
                batch_size=s["batch_size"],
                n_steps=s["steps"],
                n_epochs=1,
                n_minibatches=2,
                random_state=seed,
            )
            for algorithm, policy in (
                ("PPO", PPOPolicy(**common)),
                ("RLOO", RLOOPolicy(k=4, **common)),
            ):
                fitted = fit_or_none(policy, world.prompts, rm)
                m = (
                    review_metrics(world, fitted, rm, prompts, seed=seed)
                    if fitted is not None
                    else dict.fromkeys(REVIEW_METRICS, float("nan"))
                )
                rows.append(
                    {
                        "algorithm": algorithm,
                        "learning_rate": lr,
                        "seed": seed,
                        "diverged": fitted is None,
                        **m,
                    }
                )
                print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)[COLUMNS]

    def col(algorithm, lr, metric):
        sub = frame[(frame.algorithm == algorithm) & (frame.learning_rate == lr)]
        return sub.sort_values("seed")[metric].to_numpy()

    shorter, parts = [], []
    for lr in s["learning_rates"]:
        ci = paired_ci(col("PPO", lr, "words"), col("RLOO", lr, "words"))
        shorter.append(ci[2] < 0)
        diverged = frame[(frame.learning_rate == lr) & frame.diverged]
        parts.append(
            f"lr {lr:g}: PPO {mean_ci(col('PPO', lr, 'words'))[0]:.1f}, RLOO "
            f"{mean_ci(col('RLOO', lr, 'words'))[0]:.1f} words, PPO - RLOO {fmt(*ci, digits=1)}"
            + (f" ({len(diverged)} runs diverged)" if len(diverged) else "")
        )
    verdict = (
        "reproduced" if all(shorter) else "partly reproduced" if any(shorter) else "not reproduced"
    )
    sft_words = mean_ci(frame.loc[frame.algorithm == "SFT", "words"])

    fig, axes = new_figure(2)
    lrs = np.array(s["learning_rates"])
    for algorithm, color in (("PPO", "C1"), ("RLOO", "C0")):
        for ax, metric in zip(axes, ("words", "proxy")):
            stats = [mean_ci(col(algorithm, lr, metric)) for lr in lrs]
            m = np.array([v[0] for v in stats])
            lo, hi = np.array([v[1] for v in stats]), np.array([v[2] for v in stats])
            ax.plot(lrs, m, "o-", color=color, label=algorithm)
            ax.fill_between(lrs, lo, hi, color=color, alpha=0.2)
    axes[0].axhline(sft_words[0], color="grey", ls="--", lw=1, label="SFT")
    for ax, label in zip(axes, ("mean words per response", "proxy reward")):
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel(label)
    axes[0].legend()
    axes[0].set_title(f"{s['seeds']} seeds, 95% CI")
    findings = (
        f"PPO is shorter than RLOO at {sum(shorter)} of {len(shorter)} learning rates "
        f"(SFT writes {sft_words[0]:.1f} words): "
        + "; ".join(parts)
        + ". "
        + (
            "Its short answers do not depend on the learning rate."
            if all(shorter)
            else "Whether PPO answers short depends on the learning rate."
            if any(shorter)
            else "No learning rate gives PPO shorter answers than RLOO."
        )
    )
    return finish(
        args,
        "claim18_ppo_length_vs_lr",
        frame,
        fig,
        number=18,
        claim="Open question: is PPO's short-answer mode (16.5 tokens against 39-104 for the "
        "others) an artefact of a two-value learning-rate sweep?",
        source="Ahmadian et al. 2024",
        setting=f"review world, PPO and RLOO k=4, 2 gradient steps a batch, beta 0.05, "
        f"{s['steps']} steps of {s['batch_size']}, lr {', '.join(f'{v:g}' for v in lrs)}, "
        f"{s['seeds']} seeds",
        result="; ".join(parts),
        verdict=verdict,
        reason=findings,
    )


if __name__ == "__main__":
    main()
