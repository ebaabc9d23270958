"""prefopt's main demo: RLHF on a review task, from supervised fine-tuning to PPO and RLOO.

Everything is built locally, nothing is downloaded:

1. ``ReviewWorld`` writes a corpus of short reviews from a seeded grammar, trains a
   word-level tokenizer and gives a tiny GPT-2 config.
2. ``SFTPolicy`` fits the model to the reviews (it learns to stop: pad != EOS).
3. Raters compare pairs of SFT samples by their VADER sentiment plus noise and a
   length bias; ``RewardModel`` (the SFT trunk plus a scalar head) learns from 2,000
   of them, normalised on SFT samples and shifted so reference completions score 0.
4. Four ways of optimising the SFT policy against that learned (proxy) reward, each
   with three seeds and otherwise the same settings: RLOO and PPO with a fixed KL
   penalty (beta = 0.05) to the SFT model, RLOO whose beta an adaptive controller
   steers towards a target KL, and RLOO with beta = 0.
5. Without the penalty the policy over-optimises: the proxy reward keeps rising, the
   KL runs far from the SFT model and the text degenerates into repeated words (the
   distinct-word share collapses), as in Ziegler et al. (2019)'s mock sentiment task.
   Depending on the seed the gold (VADER) reward falls, or VADER is itself fooled by
   the repetition, as the papers' sentiment classifier was ("These These These ...
   easily easily", +8 log odds).

It prints a table (gold reward, proxy reward, KL, length, distinct-word share, EOS
share as mean +- sd over the seeds, how many runs ended healthy, episodes/s; with
``--readme README.md`` it writes it into the README), gold reward and KL of every run, and
completions before and after, and saves a figure: gold reward, proxy reward and
distinct-word share against KL (one point per seed), and the training curves. It runs
in one thread: about 1.5 minutes on an idle CPU core, nearer 3 on a busy shared machine;
``--quick`` is a seconds-long smoke run.

Run::

    python examples/demo.py --out demo.png
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

try:
    import matplotlib
except ModuleNotFoundError:  # the figure is the plot extra's; ./dev demo installs it
    raise SystemExit(
        'examples/demo.py draws its figure with matplotlib: pip install "prefopt[plot]" '
        '(the review task also needs "prefopt[worlds]"; pip install "prefopt[plot,worlds]" '
        "installs both)."
    ) from None

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import prefopt  # noqa: E402
from prefopt import (  # noqa: E402
    AdaptiveKLController,
    PPOPolicy,
    RewardModel,
    RLOOPolicy,
    SFTPolicy,
)
from prefopt.plotting import plot_history  # noqa: E402
from prefopt.worlds import ReviewWorld  # noqa: E402

# One setting for every policy: the same steps, batch, learning rate (decayed linearly
# to 0) and evaluation. 30 steps of 64 episodes keep twelve runs (four algorithms,
# three seeds) within the demo's two minutes.
FULL = dict(
    n_reviews=2000,
    sft_epochs=5,
    comparisons=2000,
    rm_epochs=3,
    steps=30,
    eval_prompts=None,  # all of the world's prompts (207)
    samples=2,
    n_seeds=3,
)
QUICK = dict(
    n_reviews=300,
    sft_epochs=1,
    comparisons=200,
    rm_epochs=1,
    steps=2,
    eval_prompts=16,
    samples=2,
    n_seeds=2,
)
# The adaptive controller's target: 6 nats, the value Ziegler et al. (2019) used for
# their sentiment and descriptiveness tasks; a modest KL, well below where the fixed
# beta = 0.05 runs end here (about 15-20 nats). Its gain is 1 (beta moves at most 20%
# a step) rather than the default 0.1 (2% a step, made for runs of hundreds of steps),
# so that beta can reach the level that holds the KL near the target within 30 steps.
KL_TARGET = 6.0
KL_GAIN = 1.0
COLORS = {"RLOO": "C0", "PPO": "C1", "target": "C2", "beta=0": "C3"}


def evaluate(world, reward_model, policy, prompts, n, seed, reference=False):
    """Gold and proxy reward, KL to the SFT model, length and words of ``n`` samples each."""
    completions = [c for row in policy.sample(prompts, n=n, random_state=seed) for c in row]
    repeated = [p for p in prompts for _ in range(n)]
    words = [c.split() for c in completions]
    if reference:  # the SFT policy is the reference: KL 0
        kl = 0.0
    else:  # mean of log pi(y|x) - log pi_sft(y|x) over the samples (the k1 estimator)
        kl = float(
            np.mean(
                policy.log_prob(repeated, completions)
                - policy.log_prob(repeated, completions, reference=True)
            )
        )
    return {
        "gold": float(world.gold_reward(repeated, completions).mean()),
        "proxy": float(reward_model.predict(repeated, completions).mean()),
        "kl": kl,
        "length": float(np.mean([len(w) for w in words])),
        # Distinct-1 (share of distinct words in a completion): falls as text degenerates.
        "distinct": float(np.mean([len(set(w)) / len(w) for w in words if w])),
        "completions": completions,
    }


# The README's copy of the table sits between these lines; --readme README.md rewrites it,
# and tests/test_demo.py checks it against a fresh run.
TABLE_START = "<!-- demo table: written by python examples/demo.py --readme README.md -->"
TABLE_END = "<!-- end of demo table -->"


def health(runs) -> str:
    """How many of an algorithm's runs ended healthy (no run-health detector fired)."""
    return f"{sum(r['healthy'] for r in runs)}/{len(runs)} ok"


def write_readme(path, table) -> None:
    """Replace the table between ``TABLE_START`` and ``TABLE_END`` in ``path``."""
    text = Path(path).read_text()
    pattern = re.compile(re.escape(TABLE_START) + r".*?" + re.escape(TABLE_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no demo table between {TABLE_START!r} and {TABLE_END!r}.")
    block = "\n".join([TABLE_START, "```", *table, "```", TABLE_END])
    Path(path).write_text(pattern.sub(lambda _: block, text, count=1))


def mean_sd(values, width, digits):
    """``mean ± sd`` (sample sd over the seeds), right-aligned in ``width`` characters."""
    values = np.asarray(values, dtype=float)
    sd = values.std(ddof=1) if len(values) > 1 else 0.0
    return f"{values.mean():.{digits}f} ± {sd:.{digits}f}".rjust(width)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the world, the SFT and the reward model"
    )
    parser.add_argument(
        "--n-seeds",
        type=int,
        default=None,
        help="seeds of each policy, random_state 0, 1, ... (default 3; 2 with --quick)",
    )
    parser.add_argument("--beta", type=float, default=0.05, help="KL coefficient of RLOO and PPO")
    parser.add_argument("--out", default="demo.png", help="where to save the figure")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run (seconds)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument(
        "--readme", default=None, help="write the table into this README (between its markers)"
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    seeds = list(range(max(1, args.n_seeds or settings["n_seeds"])))
    torch.set_num_threads(1)  # tiny models: a second thread only adds synchronisation
    # "auto": bars in a terminal, none in a log (./dev demo > log); --no-progress: none at all.
    prefopt.set_config(show_progress_bar=False if args.no_progress else "auto")
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
    eval_prompts = (
        prompts if settings["eval_prompts"] is None else prompts[: settings["eval_prompts"]]
    )
    n = settings["samples"]

    # Every policy: the same steps, batch and learning rate; they differ only in the
    # algorithm and the KL penalty. beta = 0 is the over-optimisation row.
    def make(algorithm, seed):
        common = dict(
            model=sft,
            learning_rate=1e-3,
            batch_size=64,
            n_steps=settings["steps"],
            random_state=seed,
        )
        if algorithm == "RLOO":
            return RLOOPolicy(beta=args.beta, k=4, **common)
        if algorithm == "PPO":
            return PPOPolicy(beta=args.beta, **common)
        if algorithm == "target":  # starts at the same beta, then steered to the target
            kl = AdaptiveKLController(target=KL_TARGET, gain=KL_GAIN)
            return RLOOPolicy(beta=args.beta, k=4, kl=kl, **common)
        return RLOOPolicy(beta=0.0, k=4, **common)

    names = {
        "RLOO": f"RLOO (k=4, beta={args.beta:g})",
        "PPO": f"PPO (beta={args.beta:g})",
        "target": f"RLOO (k=4, KL target {KL_TARGET:g})",
        "beta=0": "RLOO (k=4, beta=0)",
    }
    sft_row = evaluate(world, rm, sft, eval_prompts, n, seed=123, reference=True)
    runs = {key: [] for key in names}  # per algorithm, one result per seed
    fitted = {key: [] for key in names}
    for key in names:
        for seed in seeds:
            policy = make(key, seed).fit(prompts, rm)
            result = evaluate(world, rm, policy, eval_prompts, n, seed=123)
            result.update(
                seed=seed,
                beta=policy.history_[-1]["objective/beta"],
                eos=policy.history_[-1]["response/eos_share"],  # of the last training batch
                speed=float(np.median([h["time/episodes_per_s"] for h in policy.history_])),
                healthy=bool(policy.health_["healthy"]),
                fired=[k for k, v in policy.health_["detectors"].items() if v["fired"]],
            )
            runs[key].append(result)
            fitted[key].append(policy)

    print(
        f"\nGold reward (VADER), proxy reward (the learned reward model) and KL to the SFT "
        f"model (nats) of {n} samples per prompt on {len(eval_prompts)} prompts; each policy "
        f"row: mean ± sd over {len(seeds)} seeds, {settings['steps']} steps of 64 episodes:"
    )
    columns = (("gold", 2), ("proxy", 2), ("KL", 1), ("length", 1), ("distinct", 2), ("EOS", 2))
    width = 13
    table = [f"  {'':<26}" + "".join(f"{c:>{width}}" for c, _ in columns)]
    table[0] += f"{'health':>9}{'ep/s':>7}"
    keys = {"KL": "kl", "EOS": "eos"}
    sft_cells = "".join(
        f"{sft_row[keys.get(c, c)]:.{d}f}".rjust(width) if c != "EOS" else " " * width
        for c, d in columns
    )
    table.append(f"  {'SFT':<26}{sft_cells}".rstrip())
    for key, name in names.items():
        cells = "".join(
            mean_sd([r[keys.get(c, c)] for r in runs[key]], width, d) for c, d in columns
        )
        speed = np.median([r["speed"] for r in runs[key]])
        table.append(f"  {name:<26}{cells}{health(runs[key]):>9}{speed:7.0f}")
    print("\n".join(table))
    print(
        "health: the runs no run-health detector warned about (RunHealthWarning); ep/s: "
        "episodes per second, the median step"
    )
    if args.readme:
        write_readme(args.readme, table)
        print(f"(table written into {args.readme})")

    print(
        "\nGold reward against KL, each run (seed: KL, gold; the adaptive run's final beta; "
        "[the detectors that fired]):"
    )
    print(f"  {'SFT':<26}{'':>3}{0:6.1f}, {sft_row['gold']:.2f}")
    for key, name in names.items():
        cells = "".join(
            f"{r['seed']:>3}:{r['kl']:6.1f}, {r['gold']:.2f}"
            + (f"; {r['beta']:.3f}" if key == "target" else "")
            + (f" [{', '.join(r['fired'])}]" if r["fired"] else "")
            for r in runs[key]
        )
        print(f"  {name:<26}{cells}")

    print("\nCompletions of the first prompts, before and after (seed 0):")
    for i in range(min(3, len(eval_prompts))):
        print(f"  prompt: {eval_prompts[i]!r}")
        print(f"    {'SFT':<26} {sft_row['completions'][i * n]!r}")
        for key, name in names.items():
            print(f"    {name:<26} {runs[key][0]['completions'][i * n]!r}")

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (metric, label) in zip(
        axes[0],
        (
            ("gold", "gold reward (VADER)"),
            ("proxy", "proxy reward (reward model)"),
            ("distinct", "distinct-word share"),
        ),
    ):
        ax.scatter([0], [sft_row[metric]], color="k", marker="*", s=120, label="SFT", zorder=3)
        for key, name in names.items():
            kls = [r["kl"] for r in runs[key]]
            values = [r[metric] for r in runs[key]]
            ax.scatter(kls, values, color=COLORS[key], label=name, alpha=0.8, zorder=2)
        ax.axvline(KL_TARGET, color=COLORS["target"], lw=0.8, ls=":")
        ax.set_xlabel("KL to the SFT model (nats)")
        ax.set_title(f"{label} against KL")
    curves = {
        "objective/reward": "proxy reward",
        "objective/kl": "KL to the SFT model (nats)",
        "objective/beta": "beta (KL coefficient)",
    }
    for ax, (key, label) in zip(axes[1], curves.items()):
        for algorithm, name in names.items():
            plot_history(fitted[algorithm], keys=(key,), ax=ax, color=COLORS[algorithm], label=name)
        if key == "objective/kl":
            ax.axhline(KL_TARGET, color=COLORS["target"], lw=0.8, ls=":")
        ax.set_xlabel("training step")
        ax.set_title(f"training: {label}, mean ± sd over seeds")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(args.out, dpi=100)
    print(f"\nSaved {args.out} in {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
