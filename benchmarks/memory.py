"""Activation memory and step time with and without gradient checkpointing.

One training pass of prefopt's (``response_logprobs`` on ``[prompt | response]``, the
pass SFT, DPO and every policy's update take gradients through, then ``backward``)
on a causal LM of GPT-2 small's shape built from a config (12 layers, width 768,
12 heads, vocabulary 50257; random weights, nothing downloaded), with
``gradient_checkpointing`` off and on (``prefopt.backend.memory``, transformers'
own checkpointing, non-reentrant). Each setting runs in its own fresh Python process
(``--child off`` / ``--child on``; the parent starts them one after the other and
compares), with the same seeded model, built the same way, and the same inputs. Per
setting it prints:

* **saved activations**: the bytes autograd keeps for the backward pass, counted by
  ``torch.autograd.graph.saved_tensors_hooks`` over the forward pass, each storage
  once and the weights left out (deterministic; under checkpointing this includes
  the layer inputs the recompute keeps);
* **peak step memory (CPU RSS growth)**, on the CPU: the process's peak resident set
  during the first forward + backward (``resource.getrusage(RUSAGE_SELF).ru_maxrss``
  after it, KiB on Linux) minus its resident set just before it (``VmRSS`` of
  ``/proc/self/status``, after the model and the inputs are built). It includes
  everything the step makes resident: the activations, the recompute's temporaries,
  the weights' gradients (allocated by this step in both settings, about 475 MiB
  in float32: they are the same in both and bound the ratio from below) and whatever
  the allocators (glibc malloc, oneDNN's scratch) hold on to. It is the first step
  of the process in both settings, so one-time costs (lazy imports and
  initialisation) are in both alike. ``ru_maxrss`` is a high-water mark of the whole
  process that cannot be reset, which is why each setting needs a fresh process: in
  one process the second setting's peak would be hidden under the first's. When the
  step does not raise the mark above where it already was (a peak while building the
  model), the figure is only an upper bound and is marked so;
* **peak step memory** (CUDA): ``torch.cuda.max_memory_allocated`` during a step
  above what was allocated before it (gradients included);
* **step time**: the median of ``--repeats`` forward + backward passes;
* **max |grad difference|** between the two settings' gradients of the measured
  step (each child saves them to a temporary file the parent compares).

    python benchmarks/memory.py --threads 1              # batch 4, 64 + 64 tokens, CPU
    python benchmarks/memory.py --batch 2 --prompt 32 --response 32 --repeats 1
    python benchmarks/memory.py --device cuda --batch 16 --prompt 256 --response 256

Results are in README.md ("Gradient checkpointing, measured").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
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


def resident_kib() -> int:
    """The process's resident set now (``VmRSS``), KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def peak_resident_kib() -> int:
    """The process's high-water resident set so far (``ru_maxrss``, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


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


def child(args) -> None:
    """One setting in this fresh process; prints its figures as one JSON line."""
    on = args.child == "on"
    device = torch.device(args.device)
    prefopt.set_config(device=args.device, dtype="float32", show_progress_bar=False)
    batch = inputs(args, device)
    model = build(device)
    if on:
        enable_gradient_checkpointing(model)
    with training_passes(model):
        model.zero_grad(set_to_none=True)  # the step allocates the gradients in both settings
        if device.type == "cuda":
            torch.cuda.synchronize()
        rss_before, mark_before = resident_kib(), peak_resident_kib()
        loss_of(model, batch).backward()  # the measured step: the process's first
        if device.type == "cuda":
            torch.cuda.synchronize()
        mark_after = peak_resident_kib()
        torch.save([p.grad for p in model.parameters()], args.grads)
        model.zero_grad(set_to_none=True)
        saved = saved_activation_bytes(model, batch)
        cuda_peak = peak_step_bytes(model, batch, device)
        seconds = step_seconds(model, batch, device, args.repeats)
    print(
        json.dumps(
            {
                "parameters": sum(p.numel() for p in model.parameters()),
                "threads": torch.get_num_threads(),
                "saved": saved,
                "rss_before_kib": rss_before,
                "mark_before_kib": mark_before,
                "mark_after_kib": mark_after,
                "rss_growth": (mark_after - rss_before) * 1024,
                "rss_upper_bound": mark_after <= mark_before,
                "cuda_peak": cuda_peak,
                "seconds": seconds,
            }
        )
    )


def run_child(args, setting: str, grads: str) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", setting, "--grads", grads]
    command += ["--batch", str(args.batch), "--prompt", str(args.prompt)]
    command += ["--response", str(args.response), "--repeats", str(args.repeats)]
    command += ["--device", args.device]
    if args.threads:
        command += ["--threads", str(args.threads)]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def max_grad_difference(off_path: str, on_path: str) -> float:
    off = torch.load(off_path, mmap=True, weights_only=True)
    on = torch.load(on_path, mmap=True, weights_only=True)
    return max(float((a - b).abs().max()) for a, b in zip(off, on, strict=True))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per row")
    parser.add_argument("--response", type=int, default=64, help="response tokens per row")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per setting")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    parser.add_argument("--grads", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        child(args)
        return
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        paths = {on: os.path.join(folder, f"grads_{on}.pt") for on in (False, True)}
        for on in (False, True):  # one after the other: never two models resident at once
            rows[on] = run_child(args, "on" if on else "off", paths[on])
        diff = max_grad_difference(paths[False], paths[True])
    print(
        f"GPT-2 small's shape: 12 layers, width 768, 12 heads, vocabulary 50257 "
        f"({rows[False]['parameters'] / 1e6:.1f}M parameters), float32, {args.device}, "
        f"{rows[False]['threads']} threads; batch {args.batch} x ({args.prompt} prompt + "
        f"{args.response} response) tokens, one forward + backward of the token-mean loss, "
        "each setting in its own process"
    )
    cuda = args.device.startswith("cuda")
    peak_title = "peak step memory" if cuda else "peak step memory (CPU RSS growth)"
    print(
        f"{'gradient_checkpointing':<24}{'saved activations':>20}{peak_title:>36}{'step time':>12}"
    )
    for on, row in rows.items():
        if cuda:
            peak_text = f"{row['cuda_peak'] / 2**20:.1f} MiB"
        else:
            bound = " (upper bound)" if row["rss_upper_bound"] else ""
            peak_text = f"{row['rss_growth'] / 2**20:.1f} MiB{bound}"
        print(
            f"{str(on):<24}{row['saved'] / 2**20:>16.1f} MiB{peak_text:>36}"
            f"{row['seconds']:>10.2f} s"
        )
    off, on = rows[False], rows[True]
    peak_key = "cuda_peak" if cuda else "rss_growth"
    print(
        f"checkpointing / plain: saved activations {on['saved'] / off['saved']:.3f}, "
        f"{peak_title} {on[peak_key] / off[peak_key]:.3f}, step time "
        f"{on['seconds'] / off['seconds']:.2f}; max |grad difference| {diff:.1e}"
    )
    if not cuda:
        for on_, row in rows.items():
            before, mark = row["rss_before_kib"] / 1024, row["mark_before_kib"] / 1024
            after = row["mark_after_kib"] / 1024
            print(
                f"  checkpointing {on_}: resident before the step {before:.1f} MiB, "
                f"high-water mark before it {mark:.1f} MiB, after it {after:.1f} MiB"
            )


if __name__ == "__main__":
    main()
