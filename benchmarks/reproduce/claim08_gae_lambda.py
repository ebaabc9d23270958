"""Lowering GAE's lambda (1 -> 0.95 -> 0.5 -> 0) lowers the reward PPO reaches.

Ahmadian et al. (2024), on helpful-harmless data with Llama 7B, found PPO's reward
curve falls in order as lambda goes from 1 to 0.95, 0.5 and 0, the opposite of what
one would see if variance were the main problem, and explain it by how concentrated
the supervised model's predictions are: after the first token it puts about 60% of
its probability on the single most likely next token and over 90% on its top 16.
Here: the review world's SFT policy and a reward model fitted on 2,000 rater
comparisons (as claim 14 and the demo), PPO at beta = 0.05 for 30 steps of 64
episodes (prefopt's defaults otherwise: 4 epochs, clip 0.2, Adam 1e-3 annealed, the
value model a copy of the reward model) at each lambda, the same seeds for the four;
the SFT model's next-token distribution at every completion position after the first,
teacher-forced on the world's reference completions (its own distribution,
temperature 1).

Settings and verdict rule, fixed before the first full run: 5 seeds; the reward a run
reached is the mean proxy reward (``objective/reward``) of its last 5 steps. Two parts:

- "reward falls as lambda falls": each of the three paired differences between
  neighbouring lambdas (1 - 0.95, 0.95 - 0.5, 0.5 - 0) has a positive mean over
  seeds, and the 95% t-interval of the paired difference lambda 1 - lambda 0 lies
  above 0;
- "the SFT model is concentrated": its mean top-1 probability after the first token
  is at least 0.5 and its mean top-16 mass at least 0.9 (the papers' 60% and 90%).

"reproduced" if both hold, "partly reproduced" if one does, else "not reproduced".

Run::

    python benchmarks/reproduce/claim08_gae_lambda.py          # ~8 min on 2 cores
    python benchmarks/reproduce/claim08_gae_lambda.py --quick  # seconds

One seed of claim 6's full setting (the SFT policy and reward model, then two PPO runs
of 20 steps) took 77 s of CPU time (3 minutes of wall time on a busy 2-core machine):
about 45 s for the models, once, and about 0.75 s a PPO step of 64 episodes.
Here 20 runs of 30 steps:
about 8 minutes on a quiet machine, 16 on a busy one.
"""

from __future__ import annotations

import numpy as np
import torch
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
    models=dict(n_reviews=2000, sft_epochs=5, comparisons=2000, rm_epochs=3),
    concentration_rows=256,
)
QUICK = dict(
    seeds=2,
    steps=2,
    batch_size=8,
    models=dict(n_reviews=200, sft_epochs=1, comparisons=64, rm_epochs=1, normalize_samples=16),
    concentration_rows=16,
)
LAMBDAS = (1.0, 0.95, 0.5, 0.0)
BETA = 0.05
LAST = 5  # steps averaged for the reward a run reached
COLUMNS = ["seed", "gae_lambda", "reward", "kl", "length", "top1_sft", "top16_sft"]
# Verdict rule: see the docstring; computed in main() below.


@torch.no_grad()
def concentration(sft, world, n_rows):
    """Mean top-1 probability and top-16 mass of ``sft`` after each completion's first token.

    Teacher-forced on the world's reference completions (prompt + completion + EOS,
    the word-level tokenizer adds no special tokens), the model's own distribution.
    """
    tok, model = sft.tokenizer_, sft.model_
    top1, top16 = [], []
    for prompt, completion in world.references[["prompt", "completion"]].values[:n_rows]:
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        c_ids = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = torch.tensor([p_ids + c_ids], device=sft.device_)
        probs = torch.softmax(model(ids).logits[0].float(), -1)
        # Position i predicts token i + 1: predictions of completion tokens 2, 3, ...
        rows = probs[len(p_ids) : len(p_ids) + len(c_ids) - 1]
        top = rows.sort(-1, descending=True).values
        top1.extend(top[:, 0].tolist())
        top16.extend(top[:, :16].sum(-1).tolist())
    return float(np.mean(top1)), float(np.mean(top16))


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    world, sft, rm = review_setup(**s["models"])
    top1, top16 = concentration(sft, world, s["concentration_rows"])
    rows, curves = [], {}
    for seed in range(s["seeds"]):
        for lam in LAMBDAS:
            policy = PPOPolicy(
                model=sft,
                beta=BETA,
                gae_lambda=lam,
                n_steps=s["steps"],
                batch_size=s["batch_size"],
                min_eos_share=None,
                random_state=seed,
            ).fit(world.prompts, rm)
            history = policy.history_
            curves.setdefault(lam, []).append([r["objective/reward"] for r in history])
            tail = history[-LAST:]
            rows.append(
                {
                    "seed": seed,
                    "gae_lambda": lam,
                    "reward": float(np.mean([r["objective/reward"] for r in tail])),
                    "kl": float(np.mean([r["objective/kl"] for r in tail])),
                    "length": float(np.mean([r["response/length"] for r in tail])),
                    "top1_sft": top1,
                    "top16_sft": top16,
                }
            )
            print(rows[-1], flush=True)

    reward = {
        lam: np.array([r["reward"] for r in rows if r["gae_lambda"] == lam]) for lam in LAMBDAS
    }
    steps = [paired_ci(reward[a], reward[b]) for a, b in zip(LAMBDAS, LAMBDAS[1:])]
    ends = paired_ci(reward[LAMBDAS[0]], reward[LAMBDAS[-1]])
    parts = {
        "reward falls as lambda falls": all(d[0] > 0 for d in steps) and ends[1] > 0,
        f"the SFT model is concentrated (top-1 {top1:.2f}, top-16 {top16:.2f})": top1 >= 0.5
        and top16 >= 0.9,
    }

    fig, (left, right) = new_figure(2)
    for i, lam in enumerate(LAMBDAS):
        c = np.array(curves[lam])
        x = np.arange(1, c.shape[1] + 1)
        left.plot(x, c.mean(0), color=f"C{i}", label=f"λ = {lam:g}")
        left.fill_between(x, c.min(0), c.max(0), color=f"C{i}", alpha=0.15)
        m, lo, hi = mean_ci(reward[lam])
        right.errorbar([i], [m], yerr=[[m - lo], [hi - m]], color=f"C{i}", marker="o", capsize=4)
    left.set_xlabel("step")
    left.set_ylabel("proxy reward (mean; band: range over seeds)")
    left.legend(fontsize=7)
    left.set_title(f"PPO on the review world, β = {BETA}")
    right.set_xticks(range(len(LAMBDAS)), [f"λ = {lam:g}" for lam in LAMBDAS])
    right.set_ylabel(f"reward, last {LAST} steps (mean, 95% CI)")
    right.set_title(f"SFT after the first token: top-1 {top1:.2f}, top-16 {top16:.2f}")

    differences = ", ".join(
        f"{a:g} - {b:g}: {fmt(*d)}" for (a, b), d in zip(zip(LAMBDAS, LAMBDAS[1:]), steps)
    )
    return finish(
        args,
        "claim08_gae_lambda",
        rows,
        fig,
        number=8,
        claim="Lowering GAE lambda (1 -> 0.95 -> 0.5 -> 0) lowers the reward reached; the "
        "supervised model's top-token probability after the first token is high",
        source="Ahmadian et al. 2024",
        setting=f"review world, PPO beta {BETA}, {s['steps']} steps of {s['batch_size']}, "
        f"defaults otherwise, {s['seeds']} seeds; reward = mean of the last {LAST} steps",
        result="reward "
        + ", ".join(f"λ {lam:g}: {fmt(*mean_ci(reward[lam]))}" for lam in LAMBDAS)
        + f"; paired {differences}; 1 - 0: {fmt(*ends)}; SFT top-1 {top1:.3f}, "
        f"top-16 {top16:.3f}",
        verdict=compound_verdict(parts),
        reason=parts_reason(parts),
    )


if __name__ == "__main__":
    main()
