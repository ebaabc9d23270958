"""No KL penalty: high proxy reward, degenerate text; an entropy bonus does not prevent it.

Ziegler et al. (2019): trained with no KL penalty against a sentiment classifier,
even with an entropy bonus, the policy writes text like "These These These sound
flowed instantly easily easily" that the classifier scores as extremely positive.
Here: the review world's SFT policy and proxy reward model (as claim 14), then PPO
(Ziegler et al.'s algorithm, prefopt's defaults otherwise) in three conditions with
the same seeds and steps: beta = 0.05 (the KL penalty on), beta = 0 (off), and beta =
0 with an entropy bonus (``entropy_coef=0.01``, PPO's usual coefficient, Schulman et
al. 2017; the paper targeted 30 nats of entropy with a controller prefopt does not
have). Measured on 2 samples of every prompt at the end: the proxy reward, the gold
(VADER) reward, and the distinct-word share of each completion (distinct words over
words: repetition lowers it).

Settings and verdict rule, fixed before the first full run: 5 seeds, 60 steps of 64
episodes, learning rate 1e-3. With paired 95% t-intervals over seeds, (A) proxy of
no-KL minus KL-on > 0; (B) degenerate text without KL: distinct share and gold reward
of no-KL minus KL-on both < 0; (C) the same two for no-KL + entropy bonus minus KL-on.
"reproduced" if A, B and C all hold; "partly reproduced" if A holds and at least one
of the four comparisons of B and C; "not reproduced" otherwise.

Run::

    python benchmarks/reproduce/claim02_no_kl_degenerate.py          # ~14 min (est.)
    python benchmarks/reproduce/claim02_no_kl_degenerate.py --quick  # seconds
"""

from __future__ import annotations

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
    review_metrics,
    review_setup,
)
from _common import settings as choose

from prefopt import PPOPolicy

FULL = dict(**REVIEW_FULL, steps=60, batch_size=64, seeds=5, eval_prompts=None)
QUICK = dict(**REVIEW_QUICK, steps=1, batch_size=8, seeds=2, eval_prompts=8)
CONDITIONS = {  # name: (beta, entropy_coef)
    "kl": (0.05, 0.0),
    "no_kl": (0.0, 0.0),
    "no_kl_entropy": (0.0, 0.01),
}
COLUMNS = [
    "seed",
    "condition",
    "beta",
    "entropy_coef",
    "proxy",
    "gold",
    "distinct",
    "words",
    "kl",
    "entropy",
    "example",
]
# Verdict rule (see the docstring): A proxy(no_kl) > proxy(kl); B distinct and gold of no_kl
# below kl; C the same for no_kl_entropy; each by the paired 95% t-interval over seeds.


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    world, sft, rm = review_setup(**{k: s[k] for k in REVIEW_FULL})
    prompts = world.prompts[: s["eval_prompts"]]
    rows = []
    for seed in range(s["seeds"]):
        for name, (beta, entropy_coef) in CONDITIONS.items():
            policy = PPOPolicy(
                model=sft,
                beta=beta,
                entropy_coef=entropy_coef,
                learning_rate=1e-3,
                batch_size=s["batch_size"],
                n_steps=s["steps"],
                random_state=seed,
            ).fit(world.prompts, rm)
            m = review_metrics(world, policy, rm, prompts, seed=seed)
            example = policy.sample(prompts[:1], n=1, random_state=seed)[0][0]
            rows.append(
                {
                    "seed": seed,
                    "condition": name,
                    "beta": beta,
                    "entropy_coef": entropy_coef,
                    **m,
                    "entropy": policy.history_[-1].get("policy/entropy", float("nan")),
                    "example": example.strip(),
                }
            )
            print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)[COLUMNS]

    def col(name, metric):
        return frame.loc[frame.condition == name, metric].to_numpy()

    a = paired_ci(col("no_kl", "proxy"), col("kl", "proxy"))
    found = {
        (cond, metric): paired_ci(col(cond, metric), col("kl", metric))
        for cond in ("no_kl", "no_kl_entropy")
        for metric in ("distinct", "gold")
    }
    below = {key: ci[2] < 0 for key, ci in found.items()}
    b = below[("no_kl", "distinct")] and below[("no_kl", "gold")]
    c = below[("no_kl_entropy", "distinct")] and below[("no_kl_entropy", "gold")]
    a_holds = a[1] > 0
    if a_holds and b and c:
        verdict = "reproduced"
    elif a_holds and any(below.values()):
        verdict = "partly reproduced"
    else:
        verdict = "not reproduced"

    fig, axes = new_figure(3)
    for ax, metric, label in zip(
        axes,
        ("proxy", "gold", "distinct"),
        ("proxy reward", "gold reward (VADER)", "distinct-word share"),
    ):
        for i, name in enumerate(CONDITIONS):
            m, lo, hi = mean_ci(col(name, metric))
            ax.errorbar([i], [m], yerr=[[m - lo], [hi - m]], fmt="o", capsize=4)
        ax.set_xticks(range(len(CONDITIONS)), ["beta 0.05", "beta 0", "beta 0\n+ entropy"])
        ax.set_ylabel(label)
    axes[0].set_title(f"PPO, {s['steps']} steps, {s['seeds']} seeds")
    examples = frame.loc[frame.seed == 0].set_index("condition")["example"]
    reason = (
        f"A (proxy rises without KL): no-KL - KL {fmt(*a)} ({'holds' if a_holds else 'fails'}); "
        + "; ".join(
            f"{cond} - kl {metric} {fmt(*ci)} ({'below' if below[(cond, metric)] else 'not below'})"
            for (cond, metric), ci in found.items()
        )
        + f". Seed 0's first sample after {prompts[0]!r}: "
        + "; ".join(f"{name}: {examples[name]!r}" for name in CONDITIONS)
    )
    return finish(
        args,
        "claim02_no_kl_degenerate",
        frame,
        fig,
        number=2,
        claim="Without a KL penalty the policy reaches a high proxy reward with degenerate text; "
        "an entropy bonus does not prevent it",
        source="Ziegler et al. 2019",
        setting=f"review world, PPO lr 1e-3, {s['steps']} steps of {s['batch_size']}, beta 0.05 "
        f"vs 0 vs 0 + entropy_coef 0.01, {s['seeds']} seeds",
        result="; ".join(
            f"{name}: proxy {fmt(*mean_ci(col(name, 'proxy')))}, "
            f"gold {fmt(*mean_ci(col(name, 'gold')))}, "
            f"distinct {fmt(*mean_ci(col(name, 'distinct')))}"
            for name in CONDITIONS
        ),
        verdict=verdict,
        reason=reason,
    )


if __name__ == "__main__":
    main()
