"""GRPO and RLOO with a calculator tool, from the SFT start: held-out gold success per seed.

The world is :class:`prefopt.worlds.CalculatorWorld` (two-digit products, which a tiny
model cannot compute, and a calculator it can call). One SFT start (world seed 0) is
fitted on the demonstrations (half of them use the tool) and saved; each algorithm then
runs from it with ``tools=world.tools`` for each seed, and the held-out gold success
(one episode on each of the 200 held-out problems) is measured before and after, with
the share of episodes that call the tool and the run-health warnings.

    python benchmarks/calculator_world.py --seeds 0 1 2 3 4 --n-steps 40
"""

import argparse
import csv
import os
import time
import warnings

import prefopt
from prefopt import GRPOPolicy, RLOOPolicy, SFTPolicy
from prefopt.exceptions import RunHealthWarning
from prefopt.worlds import CalculatorWorld

ALGORITHMS = {"GRPO": GRPOPolicy, "RLOO": RLOOPolicy}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--n-steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sft-epochs", type=int, default=4)
    parser.add_argument("--start", default="/tmp/prefopt-calculator-sft")
    parser.add_argument("--out", default="benchmarks/calculator_world.csv")
    parser.add_argument(
        "--sft-only", action="store_true",
        help="fit and save the SFT start (--start) and stop: parallel runs then share it",
    )  # fmt: skip
    args = parser.parse_args()
    prefopt.set_config(show_progress_bar=False)
    world = CalculatorWorld(random_state=0)
    if os.path.isdir(args.start):
        sft = prefopt.load(args.start)
    else:
        sft = SFTPolicy(model=world.model_config(), n_epochs=args.sft_epochs, random_state=0)
        sft.fit(world.demonstrations)
        prefopt.save(sft, args.start)
    if args.sft_only:
        return
    rows = []
    for name in args.algorithms:
        for seed in args.seeds:
            policy = ALGORITHMS[name](
                model=sft, tools=world.tools, max_turns=3, max_new_tokens=world.max_new_tokens,
                n_steps=args.n_steps, batch_size=args.batch_size, random_state=seed,
            )  # fmt: skip
            start = policy.set_params(n_steps=0).fit(world.prompts, world.correctness_reward)
            before = world.gold_success(start, random_state=seed)
            calls_before = world.calls_tool(start.sample_episodes(world.eval_prompts)["transcript"])
            policy.set_params(n_steps=args.n_steps)
            began = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RunHealthWarning)
                policy.fit(world.prompts, world.correctness_reward)
            seconds = time.perf_counter() - began
            health = sorted({str(w.message).split(":")[0] for w in caught
                             if issubclass(w.category, RunHealthWarning)})  # fmt: skip
            after = world.gold_success(policy, random_state=seed)
            episodes = policy.sample_episodes(world.eval_prompts, random_state=seed)
            last = policy.history_[-1]
            row = {
                "algorithm": name, "seed": seed, "n_steps": args.n_steps,
                "gold_before": before, "gold_after": after,
                "tool_calls_before": float(calls_before.mean()),
                "tool_calls_after": float(world.calls_tool(episodes["transcript"]).mean()),
                "tool_error_share": last.get("tools/error_share"),
                "truncated_share": last.get("episode/truncated_share"),
                "turns": last.get("episode/turns"), "max_kl": max(
                    r["objective/kl"] for r in policy.history_),
                "health_warnings": "; ".join(health), "seconds": round(seconds, 1),
            }  # fmt: skip
            rows.append(row)
            print(row, flush=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
