"""prefopt's main demo: RLHF on a review task, from supervised fine-tuning to PPO and RLOO.

Everything is built locally, nothing is downloaded:

1. ``ReviewWorld`` writes a corpus of short reviews from a seeded grammar, trains a
   word-level tokenizer and gives a tiny GPT-2 config.
2. ``SFTPolicy`` fits the model to the reviews (it learns to stop: pad != EOS).
3. Raters compare pairs of SFT samples by their VADER sentiment plus noise and a
   length bias; ``RewardModel`` (the SFT trunk plus a scalar head) learns from 2,000
   of them, normalised on SFT samples and shifted so reference completions score 0.
4. ``RLOOPolicy`` and ``PPOPolicy`` optimise the SFT policy against that learned
   (proxy) reward with a KL penalty to the SFT model.
5. The same RLOO with beta = 0 shows over-optimisation: the proxy reward keeps
   rising while the text degenerates into repeated words (the distinct-word share
   collapses), as in Ziegler et al. (2019)'s mock sentiment task; depending on the seed the gold
   (VADER) reward falls, or VADER is itself fooled by the repetition, as the papers'
   sentiment classifier was ("These These These ... easily easily", +8 log odds).

It prints a table (gold reward, proxy reward, KL, length, EOS share, episodes/s per
algorithm), completions before and after, and saves a figure of the training curves.
Under five minutes on 2 CPU cores; ``--quick`` is a seconds-long smoke run.

Run::

    python examples/demo.py --out demo.png
"""

from __future__ import annotations

import argparse
import time

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import prefopt  # noqa: E402
from prefopt import PPOPolicy, RewardModel, RLOOPolicy, SFTPolicy  # noqa: E402
from prefopt.plotting import plot_history  # noqa: E402
from prefopt.worlds import ReviewWorld  # noqa: E402

FULL = dict(
    n_reviews=2000,
    sft_epochs=5,
    comparisons=2000,
    rm_epochs=3,
    steps=40,
    overopt_steps=60,
    eval_prompts=None,
    samples=4,
)
QUICK = dict(
    n_reviews=300,
    sft_epochs=1,
    comparisons=200,
    rm_epochs=1,
    steps=3,
    overopt_steps=4,
    eval_prompts=16,
    samples=2,
)


def evaluate(world, reward_model, policy, prompts, n, seed):
    """Gold and proxy reward, length and completions of ``n`` samples per prompt."""
    completions = [c for row in policy.sample(prompts, n=n, random_state=seed) for c in row]
    repeated = [p for p in prompts for _ in range(n)]
    words = [c.split() for c in completions]
    return {
        "gold": float(world.gold_reward(repeated, completions).mean()),
        "proxy": float(reward_model.predict(repeated, completions).mean()),
        "length": float(np.mean([len(w) for w in words])),
        # Distinct-1 (share of distinct words in a completion): falls as text degenerates.
        "distinct": float(np.mean([len(set(w)) / len(w) for w in words if w])),
        "completions": completions,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--beta", type=float, default=0.05, help="KL coefficient of RLOO and PPO")
    parser.add_argument("--out", default="demo.png", help="where to save the training curves")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run (seconds)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    torch.set_num_threads(1)  # tiny models: a second thread only adds synchronisation
    prefopt.set_config(show_progress_bar=not args.no_progress)
    began = time.perf_counter()

    world = ReviewWorld(n_reviews=settings["n_reviews"], random_state=args.seed)
    sft = SFTPolicy(
        model=world.model_config(),
        n_epochs=settings["sft_epochs"],
        learning_rate=3e-3,
        batch_size=32,
        random_state=args.seed,
    )
    sft.fit(world.demonstrations)
    comparisons = world.comparisons(sft, settings["comparisons"], random_state=args.seed)
    # A tiny trunk needs more than the papers' single epoch to read these noisy labels.
    rm = RewardModel(
        model=sft,
        learning_rate=1e-3,
        n_epochs=settings["rm_epochs"],
        batch_size=16,
        random_state=args.seed,
    )
    rm.fit(comparisons, references=world.references)
    held_out = world.comparisons(
        sft, max(100, settings["comparisons"] // 4), random_state=args.seed + 1
    )
    print(
        f"SFT: {len(world.demonstrations)} demonstrations, final loss "
        f"{sft.history_[-1]['loss/sft']:.3f}; reward model: {len(comparisons)} comparisons, "
        f"pairwise accuracy {rm.score(comparisons):.3f} (train), {rm.score(held_out):.3f} "
        "(held out)"
    )

    prompts = world.prompts
    common = dict(model=sft, learning_rate=1e-3, batch_size=64, random_state=args.seed)
    policies = {
        f"RLOO (k=4, beta={args.beta:g})": RLOOPolicy(
            beta=args.beta, k=4, n_steps=settings["steps"], **common
        ),
        f"PPO (beta={args.beta:g})": PPOPolicy(beta=args.beta, n_steps=settings["steps"], **common),
        "RLOO (k=4, beta=0)": RLOOPolicy(
            beta=0.0,
            k=4,
            n_steps=settings["overopt_steps"],
            lr_schedule="constant",
            **{**common, "learning_rate": 2e-3},
        ),
    }
    eval_prompts = (
        prompts if settings["eval_prompts"] is None else prompts[: settings["eval_prompts"]]
    )
    n = settings["samples"]
    rows = {"SFT": evaluate(world, rm, sft, eval_prompts, n, seed=123)}
    overopt_path = []

    def track(policy, row):  # gold vs proxy along the beta = 0 run, every few steps
        if row["step"] % max(1, settings["overopt_steps"] // 6) == 0:
            r = evaluate(world, rm, policy, eval_prompts[:64], 2, seed=7)
            overopt_path.append((row["step"], r["proxy"], r["gold"], r["distinct"]))

    for name, policy in policies.items():
        policy.fit(prompts, rm, callback=track if "beta=0)" in name else None)
        rows[name] = evaluate(world, rm, policy, eval_prompts, n, seed=123)
        history = policy.history_[-1]
        rows[name].update(
            kl=history["objective/kl"],
            eos=history["response/eos_share"],
            speed=float(np.median([h["time/episodes_per_s"] for h in policy.history_])),
        )

    print(
        f"\nGold reward (VADER) and proxy reward (the learned reward model) of {n} samples "
        f"per prompt on {len(eval_prompts)} prompts:"
    )
    header = (
        f"  {'':<24}{'gold':>8}{'proxy':>8}{'KL':>8}{'length':>8}{'distinct':>9}"
        f"{'EOS':>7}{'ep/s':>8}"
    )
    print(header)
    for name, r in rows.items():
        kl = f"{r['kl']:8.2f}" if "kl" in r else f"{'0':>8}"
        eos = f"{r['eos']:7.2f}" if "eos" in r else f"{'':>7}"
        speed = f"{r['speed']:8.0f}" if "speed" in r else f"{'':>8}"
        print(
            f"  {name:<24}{r['gold']:8.3f}{r['proxy']:8.3f}{kl}{r['length']:8.1f}"
            f"{r['distinct']:9.2f}{eos}{speed}"
        )
    if overopt_path:
        print("\nOver-optimisation (RLOO, beta=0): step, proxy, gold, distinct-word share")
        for step, proxy, gold, distinct in overopt_path:
            print(f"  {step:>4} {proxy:8.3f} {gold:8.3f} {distinct:8.2f}")

    print("\nCompletions of the first prompts, before and after:")
    for i in range(min(3, len(eval_prompts))):
        print(f"  prompt: {eval_prompts[i]!r}")
        for name, r in rows.items():
            print(f"    {name:<24} {r['completions'][i * n]!r}")

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    trained = {k: v for k, v in policies.items()}
    for ax, key in zip(axes[:3], ("objective/reward", "objective/kl", "response/length")):
        for i, (name, policy) in enumerate(trained.items()):
            plot_history(policy, keys=(key,), ax=ax, color=f"C{i}", label=name)
        ax.set_title(key)
        ax.legend(fontsize=7)
    if overopt_path:
        steps, proxy, gold, distinct = zip(*overopt_path)
        axes[3].plot(steps, proxy, marker="o", color="C2", label="proxy (learned reward)")
        axes[3].plot(steps, gold, marker="o", color="k", label="gold (VADER)")
        axes[3].plot(steps, distinct, marker="s", color="C3", label="distinct-word share")
        axes[3].set_title("beta = 0: over-optimisation")
        axes[3].set_xlabel("step")
        axes[3].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"\nSaved {args.out} in {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
