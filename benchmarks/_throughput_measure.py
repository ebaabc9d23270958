"""Measuring a run: peak memory, step clock, the final policy's reward."""

from __future__ import annotations

import sys
import time

EVAL_SEED = 1234


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
