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

Every run is a fresh Python subprocess (``--in-process`` runs them all in this
one), so each peak is that run's own and the runs cannot warm each other up.
The prompts and word-level tokenizer are the review world's (a stand-in when
``prefopt.worlds.review`` is missing). The reward is a function of the completion
text that prefopt and TRL both call: by default the mean VADER-lexicon valence of
its words (cheap, so the RL machinery is what gets timed), or ``--reward gold``,
the world's gold reward. See README.md for results and how to read them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ALGORITHMS = ("ppo", "rloo", "reinforce", "raft")
NAMES = {"ppo": "PPO", "rloo": "RLOO", "reinforce": "REINFORCE", "raft": "RAFT"}
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
}
EVAL_SEED = 1234


# ----- the task: prompts, tokenizer, reward ---------------------------------------------
def load_world(n_reviews: int = 1000):
    """The review world if it imports, else a small stand-in with the same attributes."""
    try:
        from prefopt.worlds.review import ReviewWorld
    except ImportError:
        return _StandInWorld()
    return ReviewWorld(n_reviews=n_reviews, random_state=0)


class _StandInWorld:
    """A word-level tokenizer and 36 prompts, used when ReviewWorld is not available."""

    WORDS = [
        "the",
        "movie",
        "film",
        "plot",
        "acting",
        "was",
        "and",
        "but",
        "i",
        "it",
        ".",
        "good",
        "great",
        "wonderful",
        "fun",
        "loved",
        "bad",
        "awful",
        "boring",
        "dull",
    ]

    def __init__(self):
        self.tokenizer = word_tokenizer(["[PAD]", "[UNK]", "</s>"] + self.WORDS)
        self.prompts = [
            f"{a} {b} {c}"
            for a in ("the", "i", "it")
            for c in ("was", "and", "but")
            for b in ("movie", "film", "plot", "acting")
        ]
        self.max_new_tokens = 16


def word_tokenizer(words: list[str]):
    """A whitespace word-level tokenizer; ids in list order, the first three [PAD] [UNK] </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        eos_token="</s>",
        clean_up_tokenization_spaces=False,
    )


def padded_tokenizer(tokenizer, vocab_size: int):
    """The same words plus filler words up to ``vocab_size`` (GPT-2's LM head is 50257 wide)."""
    vocab = tokenizer.get_vocab()
    words = sorted(vocab, key=vocab.get)
    if vocab_size < len(words):
        raise ValueError(f"vocab_size={vocab_size} is below the tokenizer's {len(words)} words.")
    assert [tokenizer.pad_token, tokenizer.unk_token, tokenizer.eos_token] == words[:3]
    return word_tokenizer(words + [f"w{i}" for i in range(len(words), vocab_size)])


def lexicon_reward(prompts, completions) -> np.ndarray:
    """Mean VADER-lexicon valence of the completion's words, divided by 4 (so in [-1, 1]).

    Deterministic, a function of the completion text only, and cheap (one dict
    look-up a word), so the benchmark times the RL machinery, not the reward.
    """
    lexicon = _lexicon()
    out = np.zeros(len(completions))
    for i, text in enumerate(completions):
        words = text.lower().split()
        if words:
            out[i] = sum(lexicon.get(w, 0.0) for w in words) / (4.0 * len(words))
    return out


_LEXICON: dict = {}


def _lexicon() -> dict:
    if not _LEXICON:
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

        _LEXICON.update(SentimentIntensityAnalyzer().lexicon)
    return _LEXICON


def make_reward(name: str, n_reviews: int):
    """``lexicon`` (default), or ``gold``: the review world's gold reward (VADER compound)."""
    if name == "lexicon":
        return lexicon_reward
    world = load_world(n_reviews)
    if not hasattr(world, "gold_reward"):
        sys.exit("--reward gold needs prefopt.worlds.review.ReviewWorld.")
    return world.gold_reward


class RecordingReward:
    """A text reward that records each batch's mean and response token count.

    prefopt calls it as ``reward(prompts, completions)``; TRL as
    ``reward(prompts=..., completions=..., completion_ids=..., **kwargs)``.
    """

    __name__ = "reward"

    def __init__(self, reward):
        self.reward = reward
        self.means: list[float] = []
        self.tokens: list[int] = []

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        rewards = self.reward(list(prompts), list(completions))
        self.means.append(float(rewards.mean()))
        if completion_ids is None:
            return rewards
        self.tokens.append(sum(len(ids) for ids in completion_ids))
        return rewards.tolist()


def build_model_dir(
    size: str,
    world,
    out_dir: str,
    *,
    seed: int = 0,
    n_layer: int | None = None,
    vocab_size: int | None = None,
    max_new_tokens: int = 64,
) -> dict:
    """Build the starting model from a config; save it, its tokenizer and the prompts."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config

    tok = world.tokenizer
    if vocab_size and vocab_size != len(tok):
        tok = padded_tokenizer(tok, vocab_size)
    longest = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in world.prompts)
    positions = max(64, longest + max_new_tokens)
    layers = {} if n_layer is None else {"n_layer": n_layer}
    if SIZES[size]["model"] == "world" and hasattr(world, "model_config"):
        config = world.model_config(n_positions=positions, vocab_size=len(tok), **layers)
    else:
        if SIZES[size]["model"] == "world":  # the stand-in world: the review world's shape
            shape = dict(n_layer=2, n_embd=64, n_head=4, n_positions=positions)
        else:  # GPT-2 small
            shape = dict(n_layer=12, n_embd=768, n_head=12, n_positions=max(1024, positions))
        config = GPT2Config(
            **{**shape, **layers},
            vocab_size=len(tok),
            bos_token_id=tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "prompts.json"), "w") as f:
        json.dump(list(world.prompts), f)
    return {
        "path": out_dir,
        "n_layer": config.n_layer,
        "n_embd": config.n_embd,
        "n_head": config.n_head,
        "vocab": config.vocab_size,
        "n_params": sum(p.numel() for p in model.parameters()),
    }


# ----- measuring ------------------------------------------------------------------------
class PeakMemory:
    """Peak memory of a block: RSS high-water mark on the CPU, allocator peak on CUDA.

    On Linux the kernel's high-water mark (VmHWM) is reset at ``start`` by writing
    5 to /proc/self/clear_refs, so the peak is this block's even in a process that
    ran something before; elsewhere it falls back to ``ru_maxrss`` (whole process).
    """

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    @staticmethod
    def _status_mb(key: str) -> float | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(key + ":"):
                        return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def start(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated() / 2**20
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        self.base = self._status_mb("VmRSS") or 0.0

    def stop(self) -> tuple[float, float]:
        """Return (peak MB, peak minus the memory at ``start`` in MB)."""
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**20
        else:
            peak = self._status_mb("VmHWM")
            if peak is None:
                import resource

                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                peak = rss / 2**20 if sys.platform == "darwin" else rss / 1024
        return peak, peak - self.base


class StepClock:
    """Wall and CPU time at the end of every step (a step = one rollout batch)."""

    def __init__(self):
        self.started = time.perf_counter()
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def tick(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())

    def rates(self, warmup: int, episodes_per_step: int, tokens: list[float]) -> dict:
        """Episodes/s and tokens/s over the steps after ``warmup`` (ends of steps)."""
        n = len(self.wall) - warmup
        wall = self.wall[-1] - self.wall[warmup - 1]
        cpu = self.cpu[-1] - self.cpu[warmup - 1]
        return {
            "episodes_per_s": n * episodes_per_step / wall,
            "tokens_per_s": sum(tokens[warmup:]) / wall,
            "episodes_per_cpu_s": n * episodes_per_step / cpu,
            "seconds_per_step": wall / n,
            "warmup_seconds": self.wall[warmup - 1] - self.started,
            "step_seconds": [b - a for a, b in zip(self.wall[warmup - 1 :], self.wall[warmup:])],
        }


def evaluate(
    model,
    tokenizer,
    prompts,
    reward,
    *,
    n_episodes: int,
    max_new_tokens: int,
    temperature: float,
    batch_size: int = 64,
) -> float:
    """Mean reward of ``n_episodes`` samples of a final policy, drawn the same way for every
    implementation: prefopt's sampler, one seed, the pad token never sampled."""
    import torch

    from prefopt.backend import (
        EncodedPrompts,
        encode_prompts,
        make_generator,
        sample,
        truncate_after_eos,
    )

    device = next(model.parameters()).device
    rows = [prompts[i % len(prompts)] for i in range(n_episodes)]
    generator = make_generator(EVAL_SEED)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    model.eval()
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            enc = encode_prompts(tokenizer, chunk)
            enc = EncodedPrompts(enc.input_ids.to(device), enc.attention_mask.to(device))
            raw = sample(
                model,
                enc,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                generator=generator,
                suppress_ids=(pad,),
            )
            ids, mask, _ = truncate_after_eos(raw, eos, pad)
            texts = tokenizer.batch_decode(
                [r[m.bool()].tolist() for r, m in zip(ids.cpu(), mask.cpu())],
                skip_special_tokens=True,
            )
            total += float(reward(chunk, texts).sum())
    return total / len(rows)


# ----- one run (in a worker process) ------------------------------------------------------
def _policy(spec: dict):
    from prefopt import PPOPolicy, RAFTPolicy, ReinforcePolicy, RLOOPolicy

    cls = {"ppo": PPOPolicy, "rloo": RLOOPolicy, "reinforce": ReinforcePolicy, "raft": RAFTPolicy}[
        spec["algorithm"]
    ]
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
    return cls(**kwargs)


def run_prefopt(spec: dict, prompts: list[str], reward) -> dict:
    import prefopt

    prefopt.set_config(
        device=spec["device"],
        dtype=spec["dtype"],
        show_progress_bar=False,
        compile=spec.get("compile") or False,
    )
    recorder = RecordingReward(reward)
    policy = _policy(spec)
    clock, tokens = StepClock(), []

    def on_step(_, row):
        clock.tick()
        tokens.append(row["response/length"] * spec["batch_size"])

    memory = PeakMemory(spec["device"])
    memory.start()
    policy.fit(prompts, recorder, callback=on_step)
    peak, delta = memory.stop()
    params = policy.get_params()
    return {
        **clock.rates(spec["warmup"], spec["batch_size"], tokens),
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


def trl_config(spec: dict, output_dir: str):
    """TRL's RLOOConfig at prefopt RLOOPolicy's settings (README: what cannot match)."""
    from trl import RLOOConfig

    from prefopt import RLOOPolicy

    defaults = RLOOPolicy().get_params()
    n_epochs, n_minibatches = defaults["n_epochs"], defaults["n_minibatches"]
    cuda = spec["device"].startswith("cuda")
    # prefopt neither checkpoints activations nor uses bf16 on the CPU; TRL's defaults do.
    # (transformers 5 renamed gradient_checkpointing to activation_checkpointing.)
    names = {f.name for f in dataclasses.fields(RLOOConfig)}
    checkpointing = (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )
    return RLOOConfig(
        **{checkpointing: False},
        output_dir=output_dir,
        seed=spec["seed"],
        use_cpu=not cuda,
        # batch_size episodes a step (batch_size/k prompts, k samples each), cut into
        # n_minibatches optimiser steps, n_epochs passes over it: prefopt's loop.
        per_device_train_batch_size=spec["batch_size"] // n_minibatches,
        steps_per_generation=n_minibatches,
        gradient_accumulation_steps=1,
        num_iterations=n_epochs,
        num_generations=spec["k"],
        max_steps=(spec["warmup"] + spec["steps"]) * n_minibatches * n_epochs,
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        generation_kwargs={"suppress_tokens": [spec["pad_token_id"]]},
        beta=spec["beta"],
        learning_rate=spec["learning_rate"],
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        adam_epsilon=1e-5,
        max_grad_norm=1.0,
        bf16=cuda and spec["dtype"] in ("auto", "bfloat16"),
        disable_dropout=True,
        report_to="none",
        save_strategy="no",
        logging_steps=10,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def run_trl(spec: dict, prompts: list[str], reward) -> dict:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import RLOOTrainer

    recorder = RecordingReward(reward)
    clock = StepClock()
    with tempfile.TemporaryDirectory() as out:
        args = trl_config(spec, out)
        per_rollout = args.steps_per_generation * args.num_iterations

        class Clock(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step % per_rollout == 0:
                    clock.tick()

        tokenizer = AutoTokenizer.from_pretrained(spec["path"], padding_side="left")
        memory = PeakMemory(spec["device"])
        memory.start()
        trainer = RLOOTrainer(
            model=spec["path"],
            reward_funcs=recorder,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
            callbacks=[Clock()],
        )
        trainer.train()
        peak, delta = memory.stop()
    return {
        **clock.rates(spec["warmup"], spec["batch_size"], recorder.tokens),
        "peak_mb": peak,
        "delta_mb": delta,
        "updates": f"{args.num_iterations}x{args.steps_per_generation}",
        "train_reward": _last_quarter(recorder.means),
        "final_reward": evaluate(
            trainer.model,
            tokenizer,
            prompts,
            reward,
            n_episodes=spec["eval_episodes"],
            max_new_tokens=spec["max_new_tokens"],
            temperature=spec["temperature"],
        ),
    }


def _last_quarter(values: list[float]) -> float:
    tail = values[-max(1, len(values) // 4) :]
    return sum(tail) / len(tail)


def worker(spec: dict) -> dict:
    import torch

    # Import everything both implementations load lazily before the memory baseline, so
    # "+MB run" counts tensors and buffers, not modules.
    import torch.optim  # noqa: F401
    import transformers.models.gpt2.modeling_gpt2  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401

    import prefopt  # noqa: F401

    _quiet_transformers()
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
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    sys.exit(
        f"The {spec['impl']} {spec['algorithm']} run failed (exit {proc.returncode}):\n"
        f"{proc.stderr[-4000:]}"
    )


# ----- the tables ------------------------------------------------------------------------
def _median(results: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)


def _prefopt_version() -> str:
    """prefopt's commit, and whether prefopt/ has uncommitted changes (read-only git)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "prefopt"],
            cwd=root,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        import prefopt

        return f"prefopt {prefopt.__version__}"
    return f"prefopt {sha}{' + uncommitted changes' if dirty else ''}"


def _versions(peer: bool) -> str:
    import torch
    import transformers

    out = (
        f"{_prefopt_version()}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    if peer:
        import trl

        out += f", trl {trl.__version__}"
    return out


def _model_words(model: dict) -> str:
    return (
        f"GPT-2 config n_layer={model['n_layer']}, n_embd={model['n_embd']}, "
        f"n_head={model['n_head']}, vocab={model['vocab']} "
        f"({model['n_params'] / 1e6:.2f}M parameters, random weights)"
    )


def print_table(results: dict, memory_label: str) -> None:
    print(
        f"{'algorithm':<10} {'impl':<8} {'updates':>7} {'episodes/s':>10} {'tokens/s':>9} "
        f"{'s/step':>7} {memory_label:>11} {'+MB run':>8} {'reward end':>10} {'train end':>9}"
    )
    for (algorithm, impl), runs in results.items():
        print(
            f"{NAMES[algorithm]:<10} {impl:<8} {runs[0]['updates']:>7} "
            f"{_median(runs, 'episodes_per_s'):>10.2f} {_median(runs, 'tokens_per_s'):>9.0f} "
            f"{_median(runs, 'seconds_per_step'):>7.3f} {_median(runs, 'peak_mb'):>11.0f} "
            f"{_median(runs, 'delta_mb'):>8.0f} {_median(runs, 'final_reward'):>10.3f} "
            f"{_median(runs, 'train_reward'):>9.3f}"
        )


def print_peer(spec: dict, pf: list[dict], peer: list[dict], memory_label: str) -> None:
    config = trl_config({**spec, "device": "cpu"}, tempfile.gettempdir())
    print("\nRLOO settings, side by side")
    rows = [
        ("model", "the saved weights (path)", "the same path; reference reloaded from it"),
        ("prompts", "the same list, reshuffled stream", "the same list, RepeatSampler"),
        ("reward", f"{spec['reward']} (text only)", "the same callable"),
        (
            "episodes a step",
            f"batch_size={spec['batch_size']}",
            f"per_device_train_batch_size={config.per_device_train_batch_size} x "
            f"steps_per_generation={config.steps_per_generation}",
        ),
        ("samples per prompt", f"k={spec['k']}", f"num_generations={config.num_generations}"),
        (
            "epochs x minibatches",
            pf[0]["updates"],
            f"num_iterations={config.num_iterations} x {config.steps_per_generation}",
        ),
        (
            "response length",
            f"max_new_tokens={spec['max_new_tokens']}, cut after the EOS",
            f"max_completion_length={config.max_completion_length}, stops once all ended",
        ),
        ("temperature", spec["temperature"], f"{config.temperature} (top_p=1, top_k=0)"),
        ("pad token", "never sampled", "suppress_tokens=[pad]"),
        ("beta (k1 KL, in reward)", spec["beta"], config.beta),
        (
            "learning rate",
            f"{spec['learning_rate']:g}, linear to 0 by step",
            f"{config.learning_rate:g}, linear to 0 by optimiser step",
        ),
        (
            "optimiser",
            "AdamW eps=1e-5, wd=0",
            f"{getattr(config.optim, 'value', config.optim)} eps={config.adam_epsilon:g}, "
            f"wd={config.weight_decay:g}",
        ),
        ("max_grad_norm", 1.0, config.max_grad_norm),
        ("missing EOS", "missing_eos_reward=None", "(no such option)"),
        ("loss", "-(R - b) sum_t log pi, no ratio", "PPO-clip on the sequence ratio, eps=0.2"),
        ("grad checkpointing, bf16", "none; bf16 autocast on CUDA", "off; bf16 on CUDA only"),
    ]
    for name, a, b in rows:
        print(f"  {name:<25} {str(a):<38} {b}")
    ratios = [a["episodes_per_s"] / b["episodes_per_s"] for a, b in zip(pf, peer)]
    cpu = [a["episodes_per_cpu_s"] / b["episodes_per_cpu_s"] for a, b in zip(pf, peer)]
    mem = [a["peak_mb"] / b["peak_mb"] for a, b in zip(pf, peer)]
    delta = [a["delta_mb"] / b["delta_mb"] for a, b in zip(pf, peer)]
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    print(f"\nprefopt/TRL, RLOO: median of {len(ratios)} paired runs [each pair]")
    print(f"  episodes/s (wall)      {statistics.median(ratios):6.2f}   [{fmt(ratios)}]")
    print(f"  episodes per CPU-s     {statistics.median(cpu):6.2f}   [{fmt(cpu)}]")
    print(f"  {memory_label:<22} {statistics.median(mem):6.2f}   [{fmt(mem)}]")
    print(f"  +MB during the run     {statistics.median(delta):6.2f}   [{fmt(delta)}]")
    final = [a["final_reward"] - b["final_reward"] for a, b in zip(pf, peer)]
    print(f"  final reward, prefopt - TRL  {statistics.mean(final):+.3f}   [{fmt(final)}]")
    print(
        f"  final reward           prefopt {_mean_sd(pf, 'final_reward')}, TRL "
        f"{_mean_sd(peer, 'final_reward')} (start {spec['start_reward']:.3f}; mean reward of "
        f"{spec['eval_episodes']} samples of each final policy, one sampler and one seed for "
        f"all; training seeds {spec['seed']}..{spec['seed'] + len(pf) - 1}, one per pair)"
    )


def _mean_sd(results: list[dict], key: str) -> str:
    values = [r[key] for r in results]
    if len(values) < 2:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} (sd {statistics.stdev(values):.3f})"


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
        args.size,
        world,
        os.path.join(tmp, "model"),
        seed=args.seed,
        n_layer=args.n_layer,
        vocab_size=settings["vocab_size"],
        max_new_tokens=settings["max_new_tokens"],
    )
    memory_label = "peak GPU MB" if args.device.startswith("cuda") else "peak RSS MB"
    spec = make_spec(args, settings, model)
    where = "all in one process" if args.in_process else "each in its own process"
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
        runs = [(a, "prefopt") for a in args.algorithms]
        if args.peer == "trl":
            # Alternate which of the pair goes first, so a slow spell hits both alike.
            runs = runs + [("rloo", "trl")] if repeat % 2 == 0 else [("rloo", "trl")] + runs
        for algorithm, impl in runs:
            # Each repeat trains from its own seed (the same one for both of a pair), so the
            # final rewards show seed spread, not one seed's luck.
            result = run_spec(
                {**spec, "algorithm": algorithm, "impl": impl, "seed": args.seed + repeat},
                args.in_process,
            )
            results.setdefault((algorithm, impl), []).append(result)
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
    if args.peer == "trl":
        spec["start_reward"] = start_reward(spec)
        print_peer(spec, results[("rloo", "prefopt")], results[("rloo", "trl")], memory_label)


def scaling(args, settings: dict, world, tmp: str) -> None:
    """Episodes/s and memory as batch size, response length and depth double."""
    base_layers = args.n_layer or (2 if SIZES[args.size]["model"] == "world" else 12)
    b, t = settings["batch_size"], settings["max_new_tokens"]
    factors = [int(f) for f in args.factors.split(",")]
    models = {
        factor: build_model_dir(
            args.size,
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
        default=",".join(ALGORITHMS),
        help="comma-separated, from: " + ", ".join(ALGORITHMS),
    )
    parser.add_argument(
        "--peer",
        choices=["trl"],
        default=None,
        help="also run TRL's RLOOTrainer at the same settings",
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
    parser.add_argument("--repeats", type=int, default=1, help="runs of each; medians reported")
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
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return

    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.algorithms = [a.strip().lower() for a in args.algorithms.split(",") if a.strip()]
    unknown = sorted(set(args.algorithms) - set(ALGORITHMS))
    if unknown:
        parser.error(f"unknown algorithm(s) {unknown}; choose from {', '.join(ALGORITHMS)}")
    if args.peer == "trl":
        import importlib.util

        if importlib.util.find_spec("trl") is None:
            parser.error("--peer trl needs TRL: pip install 'trl>=1.0'")
        if "rloo" not in args.algorithms:
            parser.error("--peer trl compares RLOO; include rloo in --algorithms")
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
        (scaling if args.scaling else benchmark)(args, settings, world, tmp)


if __name__ == "__main__":
    main()
