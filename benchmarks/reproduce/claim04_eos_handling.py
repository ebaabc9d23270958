"""The missing-EOS -1 favours responses that end; padding with EOS stops SFT from stopping.

Huang et al. (2024): a response with no EOS gets a fixed reward of -1 (the "EOS
trick"), which both defines every reward and favours responses that end; and if
padding uses the EOS token itself, EOS is masked as padding during supervised training
and the model never learns to stop. Two experiments:

- the -1: TinyLMWorld (every response enumerated, a sizeable reference share of
  responses with no EOS), its gold reward, PPO at prefopt's defaults (beta = 0.1, 100
  steps of 64), with ``missing_eos_reward=-1.0`` (the default) or ``None`` (a response
  without EOS keeps its own score); the outcome is the exact probability that the final
  policy's response ends, averaged over prompts;
- pad = EOS: the review world's supervised fine-tuning (5 epochs, learning rate 3e-3,
  batch 32, as claim 14) with a distinct pad token (the default) or
  ``pad_token="eos"`` (the experiment-only switch: EOS masked out of the loss as a
  collator that marks padding by its id does); the outcome is the share of 2 samples
  per prompt that end (fewer words than the ``max_new_tokens_`` sampled: the world's
  tokenizer is word-level), and the model's mean probability of EOS right after each
  prompt's reference completion.

Settings and verdict rule, fixed before the first full run: 5 seeds for each (the
seed drives PPO's rollouts, or the SFT model's initial weights and batches). Two
parts, on 95% t-intervals of paired differences over seeds:

- "the -1 favours responses that end": P(ended) with -1 minus without lies above 0;
- "pad = EOS stops SFT from learning to stop": the ended share with pad = EOS minus
  with a distinct pad lies below 0.

"reproduced" if both hold, "partly reproduced" if one does, else "not reproduced".

Run::

    python benchmarks/reproduce/claim04_eos_handling.py          # ~6 min on 2 cores
    python benchmarks/reproduce/claim04_eos_handling.py --quick  # seconds

One seed of the full setting (2 PPO runs, 2 SFT fits, their samples) took 60 s of CPU
time (2 minutes of wall time on a busy 2-core machine): 5 seeds take about 5-6 minutes
on a quiet machine, 10 on a busy one.
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
    pinned_ppo,
)
from _common import settings as choose

from prefopt import PPOPolicy, SFTPolicy
from prefopt.worlds import ReviewWorld, TinyLMWorld

FULL = dict(
    seeds=5,
    ppo_steps=100,
    ppo_batch=64,
    n_reviews=2000,
    sft_epochs=5,
    eval_prompts=None,  # all of them
)
QUICK = dict(seeds=2, ppo_steps=3, ppo_batch=16, n_reviews=200, sft_epochs=1, eval_prompts=16)
BETA = 0.1
COLUMNS = ["seed", "experiment", "arm", "ended", "p_eos_after_reference", "length"]
# Verdict rule: see the docstring; computed in main() below.


def missing_eos_runs(s):
    """PPO on TinyLMWorld with and without the missing-EOS reward: exact P(ended)."""
    world = TinyLMWorld(random_state=0)
    ended = world.ended_
    rows = [
        {
            "seed": -1,
            "experiment": "missing_eos_reward",
            "arm": "reference",
            "ended": float(world.reference_probs()[:, ended].sum(1).mean()),
            "p_eos_after_reference": float("nan"),
            "length": float("nan"),
        }
    ]
    for seed in range(s["seeds"]):
        for arm, value in (("-1", -1.0), ("None", None)):
            policy = PPOPolicy(
                **pinned_ppo(
                    model=world.policy_model(),
                    beta=BETA,
                    n_steps=s["ppo_steps"],
                    batch_size=s["ppo_batch"],
                    missing_eos_reward=value,
                    min_eos_share=None,
                    random_state=seed,
                )
            ).fit(world.prompts, world.reward)
            probs = world.policy_probs(policy)
            rows.append(
                {
                    "seed": seed,
                    "experiment": "missing_eos_reward",
                    "arm": arm,
                    "ended": float(probs[:, ended].sum(1).mean()),
                    "p_eos_after_reference": float("nan"),
                    "length": float("nan"),
                }
            )
            print(rows[-1], flush=True)
    return rows


def pad_runs(s):
    """SFT on the review world with a distinct pad token or pad = EOS: who stops."""
    world = ReviewWorld(n_reviews=s["n_reviews"], random_state=0)
    prompts = world.prompts[: s["eval_prompts"]]
    references = world.references.iloc[: len(prompts)]
    rows = []
    for seed in range(s["seeds"]):
        for arm in ("distinct", "eos"):
            sft = SFTPolicy(
                model=world.model_config(),
                n_epochs=s["sft_epochs"],
                learning_rate=3e-3,
                batch_size=32,
                pad_token=arm,
                random_state=seed,
            ).fit(world.demonstrations)
            completions = [c for g in sft.sample(prompts, n=2, random_state=seed) for c in g]
            words = np.array([len(c.split()) for c in completions])
            ref_p, ref_c = references["prompt"].tolist(), references["completion"].tolist()
            with_eos = sft.log_prob(ref_p, ref_c, add_eos=True, temperature=1.0)
            without = sft.log_prob(ref_p, ref_c, add_eos=False, temperature=1.0)
            rows.append(
                {
                    "seed": seed,
                    "experiment": "pad_token",
                    "arm": arm,
                    "ended": float(np.mean(words < sft.max_new_tokens_)),
                    "p_eos_after_reference": float(np.mean(np.exp(with_eos - without))),
                    "length": float(words.mean()),
                }
            )
            print(rows[-1], flush=True)
    return rows


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    rows = missing_eos_runs(s) + pad_runs(s)

    def get(experiment, arm, key="ended"):
        return np.array([r[key] for r in rows if r["experiment"] == experiment and r["arm"] == arm])

    eos_reward = paired_ci(get("missing_eos_reward", "-1"), get("missing_eos_reward", "None"))
    pad = paired_ci(get("pad_token", "eos"), get("pad_token", "distinct"))
    parts = {
        "the -1 favours responses that end": eos_reward[1] > 0,
        "pad = EOS stops SFT from learning to stop": pad[2] < 0,
    }

    fig, (left, right) = new_figure(2)
    arms = [("reference", "π_ref"), ("-1", "missing EOS → −1"), ("None", "own score")]
    for i, (arm, _) in enumerate(arms):
        values = get("missing_eos_reward", arm)
        left.scatter([i] * len(values), values, color=f"C{i}")
        left.errorbar([i], [values.mean()], color="k", marker="_", ms=20)
    left.set_xticks(range(len(arms)), [label for _, label in arms])
    left.set_ylabel("P(response ends with EOS), exact")
    left.set_title(f"PPO on TinyLMWorld, β = {BETA}")
    for i, arm in enumerate(("distinct", "eos")):
        values = get("pad_token", arm)
        right.scatter([i] * len(values), values, color=f"C{i}")
    right.set_xticks([0, 1], ["pad ≠ EOS", "pad = EOS"])
    right.set_ylabel("share of SFT samples that end")
    right.set_ylim(-0.05, 1.05)
    right.set_title("SFT on the review world")

    return finish(
        args,
        "claim04_eos_handling",
        rows,
        fig,
        number=4,
        claim="The missing-EOS -1 favours responses that end; padding with the EOS token "
        "itself stops SFT from learning to stop",
        source="Huang et al. 2024",
        setting=f"TinyLMWorld PPO (beta {BETA}, {s['ppo_steps']} steps of {s['ppo_batch']}) "
        f"with missing_eos_reward -1 vs None; review world SFT ({s['sft_epochs']} epochs) "
        f"with pad distinct vs pad = EOS; {s['seeds']} seeds each",
        result=f"P(ended): reference {get('missing_eos_reward', 'reference')[0]:.3f}, with -1 "
        f"{fmt(*mean_ci(get('missing_eos_reward', '-1')))}, without "
        f"{fmt(*mean_ci(get('missing_eos_reward', 'None')))}, difference {fmt(*eos_reward)}; "
        f"SFT samples that end: pad distinct {fmt(*mean_ci(get('pad_token', 'distinct')))}, "
        f"pad = EOS {fmt(*mean_ci(get('pad_token', 'eos')))}, difference {fmt(*pad)}; "
        "P(EOS after the reference) "
        f"{np.mean(get('pad_token', 'distinct', 'p_eos_after_reference')):.3f} vs "
        f"{np.mean(get('pad_token', 'eos', 'p_eos_after_reference')):.3g}",
        verdict=compound_verdict(parts),
        reason=parts_reason(parts),
    )


if __name__ == "__main__":
    main()
