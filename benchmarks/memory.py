"""Activation memory and step time with and without gradient checkpointing.

One training pass of prefopt's (``response_logprobs`` on ``[prompt | response]``, the
pass SFT, DPO and every policy's update take gradients through, then ``backward``)
on a causal LM of GPT-2 small's shape built from a config (12 layers, width 768,
12 heads, vocabulary 50257; random weights, nothing downloaded), with
``gradient_checkpointing`` off and on (``prefopt.backend.memory``, transformers'
own checkpointing, non-reentrant). Per setting it prints:

* **saved activations**: the bytes autograd keeps for the backward pass, counted by
  ``torch.autograd.graph.saved_tensors_hooks`` over the forward pass, each storage
  once and the weights left out (deterministic; under checkpointing this includes
  the layer inputs the recompute keeps);
* **peak step memory** (CUDA only): ``torch.cuda.max_memory_allocated`` during the
  step above what was allocated before it (gradients included); the CPU has no such
  allocator record, so there the saved activations are the measure;
* **step time**: the median of ``--repeats`` forward + backward passes;
* **max |grad difference|** between the two settings (the same gradients).

    python benchmarks/memory.py                          # batch 4, 64 + 64 tokens, CPU
    python benchmarks/memory.py --batch 2 --prompt 32 --response 32 --repeats 1
    python benchmarks/memory.py --device cuda --batch 16 --prompt 256 --response 256

Results are in README.md ("Gradient checkpointing, measured").
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import prefopt
from prefopt.backend import EncodedPrompts, disable_dropout, response_logprobs
from prefopt.backend.memory import enable_gradient_checkpointing, training_passes


def build(device):
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config)
    return disable_dropout(model).to(device).eval()  # as every prefopt estimator holds it


def inputs(args, device):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50257, (args.batch, args.prompt + args.response), generator=g)
    ids = ids.to(device)
    prompts = EncodedPrompts(ids[:, : args.prompt], torch.ones_like(ids[:, : args.prompt]))
    response = ids[:, args.prompt :]
    return prompts, response, torch.ones_like(response)


def loss_of(model, batch):
    prompts, response, mask = batch
    logprobs = response_logprobs(model, prompts, response, mask, temperature=1.0)
    return -(logprobs * mask).sum() / mask.sum()  # SFT's token-mean loss


def saved_activation_bytes(model, batch) -> int:
    """Bytes of the tensors autograd keeps for the backward, each storage once, weights left out."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, total = set(), [0]

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in weights and key not in seen:
            seen.add(key)
            total[0] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(model, batch)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return total[0]


def peak_step_bytes(model, batch, device) -> int | None:
    """CUDA: peak bytes allocated during one forward + backward, above those before it."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss_of(model, batch).backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    model.zero_grad(set_to_none=True)
    return peak


def step_seconds(model, batch, device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        loss_of(model, batch).backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
        model.zero_grad(set_to_none=True)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per row")
    parser.add_argument("--response", type=int, default=64, help="response tokens per row")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per setting")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    prefopt.set_config(device=args.device, dtype="float32", show_progress_bar=False)
    batch = inputs(args, device)
    model = build(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"GPT-2 small's shape: 12 layers, width 768, 12 heads, vocabulary 50257 "
        f"({n_params / 1e6:.1f}M parameters), float32, {device}, {torch.get_num_threads()} "
        f"threads; batch {args.batch} x ({args.prompt} prompt + {args.response} response) "
        "tokens, one forward + backward of the token-mean loss"
    )
    rows, gradients = {}, {}
    for on in (False, True):
        if on:
            enable_gradient_checkpointing(model)
        with training_passes(model):
            loss_of(model, batch).backward()  # warm-up; its gradients are compared below
            gradients[on] = [p.grad.clone() for p in model.parameters()]
            model.zero_grad(set_to_none=True)
            rows[on] = (
                saved_activation_bytes(model, batch),
                peak_step_bytes(model, batch, device),
                step_seconds(model, batch, device, args.repeats),
            )
    diff = max(float((a - b).abs().max()) for a, b in zip(gradients[False], gradients[True]))
    print(
        f"{'gradient_checkpointing':<24}{'saved activations':>20}{'peak step memory':>20}"
        f"{'step time':>12}"
    )
    for on, (saved, peak, seconds) in rows.items():
        peak_text = "n/a (CPU)" if peak is None else f"{peak / 2**20:.1f} MiB"
        print(f"{str(on):<24}{saved / 2**20:>16.1f} MiB{peak_text:>20}{seconds:>10.2f} s")
    off, on = rows[False], rows[True]
    peak_ratio = "" if off[1] is None else f", peak step memory {on[1] / off[1]:.3f}"
    print(
        f"checkpointing / plain: saved activations {on[0] / off[0]:.3f}{peak_ratio}, step "
        f"time {on[2] / off[2]:.2f}; max |grad difference| {diff:.1e}"
    )


if __name__ == "__main__":
    main()
