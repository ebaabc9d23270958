"""Activation memory of an RL policy's update with and without gradient accumulation.

One step (``n_steps=1``) of a policy on the benchmark's word task
(``_throughput_task.py``: its 36 prompts, its lexicon reward plus 0.01 a character,
``missing_eos_reward=None``: random weights seldom stop) with a causal LM built from a
config (GPT-2's architecture; ``--layers``, ``--width``, ``--vocab``; random weights,
nothing downloaded), once per ``micro_batch_size`` (``None``, then each of
``--micro``), every fit with the same seed. Per algorithm and setting it prints:

* **saved activations**: the most bytes autograd keeps for one backward pass, over
  the step's backward passes (``torch.autograd.graph.saved_tensors_hooks`` over the
  forward passes, each storage once, the trained weights left out; the count restarts at each
  ``torch.autograd.backward``, after which the graph is freed). Deterministic, on any
  device; its ratio to ``None``'s is the column ``x saved``;
* **peak update memory** (CUDA only): ``torch.cuda.max_memory_allocated`` during the
  update (the gradient passes, after the rollout) above what was allocated before it;
  it includes the weights' gradients, the same in every setting, which bound its
  ratio from below;
* **update seconds** (``time/update`` of the step's ``history_`` row), for information;
* **max |grad difference|** to ``None``'s gradient after the step (the last
  minibatch's), which accumulation leaves equal up to float rounding, beside the
  gradient's largest entry.

RAFT's loss (a mean over the kept responses' tokens) declares ``loss_reduction =
"minibatch"``: its parts are accumulated through the cached gradients, one more
forward pass without gradients a part, which its update seconds show.

    python benchmarks/accumulation.py --threads 1                      # CPU, a few seconds
    python benchmarks/accumulation.py --batch 32 --micro 16,8,4,2 --algorithms rloo
    python benchmarks/accumulation.py --device cuda --layers 12 --width 768 --vocab 50257 \\
        --batch 64 --response 64 --micro 16,8

Results are in ``docs/guide/scaling.rst`` ("Gradient accumulation").
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import prefopt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _throughput_task import _StandInWorld, lexicon_reward, padded_tokenizer  # noqa: E402

ALGORITHMS = {
    "rloo": (prefopt.RLOOPolicy, {"k": 4, "n_minibatches": 1}),
    "grpo": (prefopt.GRPOPolicy, {"k": 4}),
    "ppo": (prefopt.PPOPolicy, {"n_epochs": 1, "n_minibatches": 1}),
    "raft": (prefopt.RAFTPolicy, {"k": 4, "n_epochs": 1}),
}


def reward(prompts, completions):
    """The lexicon reward plus 0.01 a character: random weights' completions seldom tie on it."""
    characters = np.array([len(c) for c in completions], dtype=float)
    return lexicon_reward(prompts, completions) + 0.01 * characters


def build(args, tokenizer):
    config = GPT2Config(
        n_layer=args.layers,
        n_embd=args.width,
        n_head=args.heads,
        vocab_size=len(tokenizer),
        n_positions=256,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPT2LMHeadModel(config)


class SavedBytes:
    """The most bytes autograd holds for one backward pass while the block runs."""

    def __init__(self, policy):
        self.policy, self.held, self.peak = policy, {}, 0

    def pack(self, t):
        modules = [getattr(self.policy, name, None) for name in ("model_", "value_model_")]
        weights = {p.untyped_storage().data_ptr() for m in modules if m for p in m.parameters()}
        key = t.untyped_storage().data_ptr()
        if key not in weights:
            self.held[key] = t.untyped_storage().nbytes()
            self.peak = max(self.peak, sum(self.held.values()))
        return t

    def __enter__(self):
        self.original = torch.autograd.backward

        def backward(*args, **kwargs):
            self.held.clear()  # the graph taken backward is freed
            return self.original(*args, **kwargs)

        torch.autograd.backward = backward
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)
        torch.autograd.backward = self.original


class UpdatePeak:
    """CUDA: the peak bytes allocated during each update, above those before it."""

    def __init__(self, device):
        self.cuda, self.peak = torch.device(device).type == "cuda", None

    def __enter__(self):
        from prefopt.policies.loop import _update

        self.update, self.original = _update.Update, _update.Update.__call__

        def measured(update, batch, *, step):
            if not self.cuda:
                return self.original(update, batch, step=step)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = self.original(update, batch, step=step)
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - before
            return out

        self.update.__call__ = measured
        return self

    def __exit__(self, *exc):
        self.update.__call__ = self.original


def run(args, name, micro, world, tokenizer):
    cls, extra = ALGORITHMS[name]
    policy = cls(
        model=build(args, tokenizer),
        tokenizer=tokenizer,
        batch_size=args.batch,
        max_new_tokens=args.response,
        n_steps=1,
        micro_batch_size=micro,
        random_state=0,
        on_unhealthy="ignore",
        missing_eos_reward=None,  # a response that does not end keeps its score
        **extra,
    )
    with UpdatePeak(args.device) as update, SavedBytes(policy) as saved:
        policy.fit(world.prompts, reward)
    grads = {n: p.grad.detach().cpu() for n, p in policy.model_.named_parameters()}
    return {
        "saved": saved.peak,
        "peak": update.peak,
        "seconds": policy.history_[0]["time/update"],
        "grads": grads,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algorithms", default="rloo,grpo,ppo,raft")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--micro", default="8,4,2", help="micro_batch_size values")
    parser.add_argument("--response", type=int, default=16, help="max_new_tokens")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    world = _StandInWorld()
    tokenizer = padded_tokenizer(world.tokenizer, args.vocab)
    micros = [None, *(int(m) for m in args.micro.split(","))]
    print(
        f"GPT-2 architecture, {args.layers} layers, width {args.width}, vocabulary "
        f"{args.vocab}; batch {args.batch}, {args.response} new tokens; {args.device}"
    )
    print(
        f"{'algorithm':<9} {'micro':>5} {'saved MB':>9} {'x saved':>7} {'peak MB':>8} "
        f"{'x peak':>6} {'update s':>8} {'max |grad diff|':>15} {'max |grad|':>10}"
    )
    with prefopt.config_context(device=args.device, show_progress_bar=False):
        for name in args.algorithms.split(","):
            base = None
            for micro in micros:
                out = run(args, name, micro, world, tokenizer)
                base = base or out
                diff = max(
                    float((out["grads"][n] - base["grads"][n]).abs().max()) for n in out["grads"]
                )
                scale = max(float(g.abs().max()) for g in out["grads"].values())
                peak = "-" if out["peak"] is None else f"{out['peak'] / 2**20:.1f}"
                ratio = "-" if out["peak"] is None else f"{out['peak'] / base['peak']:.2f}"
                print(
                    f"{name:<9} {str(micro):>5} {out['saved'] / 2**20:>9.2f} "
                    f"{out['saved'] / base['saved']:>7.3f} {peak:>8} {ratio:>6} "
                    f"{out['seconds']:>8.3f} {diff:>15.2e} {scale:>10.2e}"
                )


if __name__ == "__main__":
    main()
