"""Multi-turn throughput with a tool: prefopt's GRPOPolicy against TRL's GRPOTrainer with ``tools``.

Both train GRPO on the same task (``_throughput_tools.py``): the same tiny GPT-2 (2
layers, width 64) fitted by SFT to call a calculator, the same tokenizer and chat
template (ChatML turns, Hermes-format tool calls), the same conversational prompts
(two-digit products of ``prefopt.worlds.CalculatorWorld``), the same ``calculator``
function and the same reward (1 when the final turn is the product). An episode is up
to ``--max-turns`` policy turns: a turn that calls the tool gets its result as a tool
message and the policy goes on; a turn without a call ends the episode.

    python benchmarks/throughput_tools.py --threads 1                # prefopt and TRL, one pair
    python benchmarks/throughput_tools.py --threads 1 --repeats 3    # three pairs
    python benchmarks/throughput_tools.py --threads 1 --peer none    # prefopt alone

Each run is a fresh Python subprocess (the two of a pair alternate which goes first);
it prints episodes/s over the measured steps, tool calls per episode (the tools each
implementation ran: prefopt's ``tools/calls`` in ``history_``, TRL's tool messages in the
completions it scores), the reward (one function reads both) and the time split by phase.
The starting model is fitted once and kept in ``--cache``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the _throughput_* modules

from _throughput_measure import PeakMemory, StepClock  # noqa: E402
from _throughput_tables import PHASES, _versions  # noqa: E402
from _throughput_tools import build_tool_task, product_reward, tool_calls  # noqa: E402


class ToolReward:
    """The task's reward, recording each batch's mean and, for TRL's conversational
    completions, the tool messages and transcript tokens of each episode."""

    __name__ = "product_reward"

    def __init__(self):
        self.means: list[float] = []
        self.calls: list[float] = []
        self.tokens: list[float] = []

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        rewards = product_reward(list(prompts), list(completions))
        self.means.append(float(rewards.mean()))
        if completion_ids is None:  # prefopt: an array (its history_ counts the calls)
            return rewards
        self.calls.append(float(np.mean([tool_calls(c) for c in completions])))
        self.tokens.append(float(np.mean([len(ids) for ids in completion_ids])))
        return rewards.tolist()


def _tools():
    from prefopt.worlds import CalculatorWorld

    return CalculatorWorld(n_eval=1, n_demonstrations=1, random_state=0).tools


def run_prefopt(spec: dict, prompts: list) -> dict:
    import prefopt
    from prefopt import GRPOPolicy

    prefopt.set_config(device=spec["device"], dtype=spec["dtype"], show_progress_bar=False)
    reward = ToolReward()
    policy = GRPOPolicy(
        model=spec["path"],
        tools=_tools(),
        max_turns=spec["max_turns"],
        max_new_tokens=spec["max_tokens"],  # a turn may take what is left of the budget,
        max_episode_tokens=spec["max_tokens"],  # as TRL's max_completion_length lets it
        k=spec["k"],
        batch_size=spec["batch_size"],
        n_steps=spec["warmup"] + spec["steps"],
        beta=spec["beta"],
        learning_rate=spec["learning_rate"],
        temperature=spec["temperature"],
        # TRL GRPOTrainer's defaults: DAPO aggregation, rewards scaled within each group,
        # one pass cut into 2 optimiser steps; no missing-EOS reward (TRL has none).
        loss_type="dapo",
        scale_rewards="group",
        n_epochs=1,
        n_minibatches=2,
        missing_eos_reward=None,
        max_grad_norm=1.0,
        random_state=spec["seed"],
    )
    clock, rows = StepClock(), []

    def on_step(_, row):
        clock.tick()
        rows.append(row)

    memory = PeakMemory(spec["device"])
    memory.start()
    policy.fit(prompts, reward, callback=on_step)
    peak, _ = memory.stop()
    measured = rows[spec["warmup"] :]
    mean = lambda key: float(np.mean([r.get(key, np.nan) for r in measured]))  # noqa: E731
    return {
        **clock.rates(spec["warmup"], spec["batch_size"], [0.0] * len(rows)),
        **{key: mean(key) for key in PHASES},
        # prefopt's own count: the tools it ran (errors included) an episode.
        "tool_calls": mean("tools/calls"),
        "turns": mean("episode/turns"),
        "transcript_tokens": mean("episode/length"),
        "reward": float(np.mean(reward.means[spec["warmup"] :])),
        "peak_mb": peak,
    }


def run_trl(spec: dict, prompts: list) -> dict:
    import tempfile

    from _throughput_trl import PhaseTimer, rollout_clock, trl_config
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    reward = ToolReward()
    clock = StepClock()
    with tempfile.TemporaryDirectory() as out:
        args = trl_config({**spec, "algorithm": "grpo", "max_new_tokens": spec["max_tokens"]}, out)
        # TRL's turn limit counts tool rounds: max_turns policy turns are max_turns - 1 of them.
        args.max_tool_calling_iterations = spec["max_turns"] - 1

        tokenizer = AutoTokenizer.from_pretrained(spec["path"], padding_side="left")
        memory = PeakMemory(spec["device"])
        memory.start()
        trainer = GRPOTrainer(
            model=spec["path"],
            reward_funcs=reward,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
            tools=_tools(),
            callbacks=[rollout_clock(args, clock)],
        )
        phases = PhaseTimer(trainer)
        trainer.train()
        peak, _ = memory.stop()
    return {
        **clock.rates(spec["warmup"], spec["batch_size"], [0.0] * len(clock.wall)),
        **phases.per_step(clock, spec["warmup"]),
        # TRL's own count: the tool messages of each completion (its tools/call_frequency).
        "tool_calls": float(np.mean(reward.calls[spec["warmup"] :])),
        "transcript_tokens": float(np.mean(reward.tokens[spec["warmup"] :])),
        "reward": float(np.mean(reward.means[spec["warmup"] :])),
        "peak_mb": peak,
    }


def worker(spec: dict) -> dict:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    with open(os.path.join(spec["path"], "prompts.json")) as f:
        prompts = json.load(f)
    result = (run_trl if spec["impl"] == "trl" else run_prefopt)(spec, prompts)
    result["threads"] = torch.get_num_threads()
    return result


def run_spec(spec: dict, in_process: bool) -> dict:
    if in_process:
        return worker(spec)
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    sys.exit(f"The {spec['impl']} run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def _line(impl: str, r: dict) -> str:
    calls = f"{r['tool_calls']:.2f}"
    return (
        f"{impl:<8} {r['episodes_per_s']:7.1f} episodes/s  {r['seconds_per_step']:.3f} s/step  "
        f"tool calls/episode {calls}  reward {r['reward']:.3f}  transcript tokens "
        f"{r['transcript_tokens']:.1f}  peak RSS {r['peak_mb']:.0f} MB"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=["trl", "none"], default="trl")
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="tokens of an episode after its prompt (TRL: max_completion_length)",
                        )  # fmt: skip
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--n-prompts", type=int, default=512)
    parser.add_argument("--sft-epochs", type=int, default=12)
    parser.add_argument("--n-demonstrations", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--cache", default=None,
                        help="folder of the starting model, fitted once (default: /tmp/"
                        "prefopt-throughput-tools-e<epochs>-d<demonstrations>-p<prompts>)",
                        )  # fmt: skip
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    name = f"e{args.sft_epochs}-d{args.n_demonstrations}-p{args.n_prompts}"
    cache = args.cache or f"/tmp/prefopt-throughput-tools-{name}"
    task = build_tool_task(cache, n_prompts=args.n_prompts, sft_epochs=args.sft_epochs,
                           n_demonstrations=args.n_demonstrations)  # fmt: skip
    from transformers import AutoTokenizer

    spec = dict(
        path=task["path"], batch_size=args.batch_size, k=args.k, max_turns=args.max_turns,
        max_tokens=args.max_tokens, steps=args.steps, warmup=args.warmup,
        learning_rate=args.learning_rate, beta=args.beta, temperature=args.temperature,
        threads=args.threads, device=args.device, dtype=args.dtype,
        pad_token_id=AutoTokenizer.from_pretrained(task["path"]).pad_token_id,
    )  # fmt: skip
    prompts_a_step = args.batch_size // args.k
    print(
        f"task: tiny GPT-2 ({task['n_params'] / 1e6:.2f}M parameters, {task['vocab']} tokens), "
        f"SFT {task['sft_epochs']} epochs on {task['n_demonstrations']} demonstrations "
        f"({task['tool_share']:.0%} call the tool); prompts of ~{task['prompt_tokens']} tokens "
        f"(chat template, tools rendered)\n{_versions(args.peer == 'trl')}; GRPO beta "
        f"{args.beta}, DAPO, group-scaled rewards; batch {args.batch_size} ({prompts_a_step}"
        f" prompts x k={args.k}), up to {args.max_turns} turns and {args.max_tokens} tokens an "
        f"episode, temperature {args.temperature}, lr {args.learning_rate:g}; {args.warmup} "
        f"warm-up + {args.steps} measured steps; each run in its own process"
    )
    results: dict = {"prefopt": [], "trl": []}
    for repeat in range(args.repeats):
        impls = ["prefopt"] + (["trl"] if args.peer == "trl" else [])
        if repeat % 2:
            impls.reverse()
        for impl in impls:
            result = run_spec({**spec, "impl": impl, "seed": args.seed + repeat}, args.in_process)
            results[impl].append(result)
            print(f"[pair {repeat + 1}/{args.repeats}] {_line(impl, result)}", flush=True)
        if args.peer == "trl":
            a, b = results["prefopt"][-1], results["trl"][-1]
            print(f"[pair {repeat + 1}/{args.repeats}] prefopt / TRL episodes/s "
                  f"{a['episodes_per_s'] / b['episodes_per_s']:.2f}x", flush=True)  # fmt: skip
    print(f"\nwhere the time goes, s/step: {'generation':>10} {'log-probs':>9} {'reward':>7} "
          f"{'update':>7}   (generation: every turn and the tool calls)")  # fmt: skip
    for impl, runs in results.items():
        if runs:
            cells = [statistics.median(r[key] for r in runs) for key in PHASES]
            print(f"{impl:<10}{'':>18}" + " ".join(f"{c:>9.3f}" for c in cells))
    if args.peer == "trl":
        ratios = [a["episodes_per_s"] / b["episodes_per_s"]
                  for a, b in zip(results["prefopt"], results["trl"])]  # fmt: skip
        print(f"\nprefopt / TRL, multi-turn episodes/s: median {statistics.median(ratios):.2f}x "
              f"over {len(ratios)} pair(s) [{', '.join(f'{r:.2f}' for r in ratios)}]")  # fmt: skip


if __name__ == "__main__":
    main()
