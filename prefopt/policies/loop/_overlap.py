"""Overlapped rollouts: the next batches are sampled in another process while this one trains.

With ``max_staleness=s`` the fit's sampler is an :class:`OverlapPipeline`: at
step t (the policy holding the weights after t - 1 updates) it queues the
sampling of batch t + s with those weights in a
:class:`~prefopt.backend._sampler_process.SamplerProcess`, then hands the
rollout batch t, which was queued s steps earlier. Sampling batch t + 1 thus
runs while step t's log-prob passes, reward and update run, and a batch is at
most s updates older than the policy it trains (the first s batches less:
there were no updates yet). The rollout then computes, with the current
weights, the *proximal* log-probs (``old_logprobs``: the ratio's denominator
and the KL's), and the batch carries the *behaviour* policy's, the sampler's
(``behaviour_logprobs``).

The off-policy correction (:func:`off_policy_weights`) multiplies each
response token's gradient through the current log-probs by the detached weight

    w_t = min(pi_prox(y_t | ...) / mu(y_t | ...), C),   C = ``off_policy_cap``

with mu the behaviour (sampling) policy and pi_prox the policy before this
step's update. For a loss without a ratio (RLOO, REINFORCE, RAFT, GRPO at one
epoch, whose ratio is 1) this is truncated importance sampling, -E_mu[w_t A
grad log pi(y_t)] (Ionides 2008; Espeholt et al. 2018's truncated weights; Yao
et al. 2025 for LLM rollouts). For a clipped loss (PPO, GRPO and REINFORCE++
with more than one epoch) it is the decoupled PPO objective of AReaL (Fu et
al. 2025, eq. 5 and Hilton et al. 2022): E_mu[w_t min(r_t A, clip(r_t, 1 -
eps, 1 + eps) A)] with r_t = pi_theta / pi_prox, the clip around the proximal
policy and the importance weight from the behaviour one. Both are the gradient
of one weighted loss, so one mechanism serves every algorithm; AReaL leaves w
untruncated (``off_policy_cap=inf`` here), truncation bounds its variance.
``off_policy_cap=None`` applies no weight (the ablation: stale samples
treated as on-policy).

With ``max_staleness=0`` the process samples each batch with the current
weights and the run's own random stream, and nothing is corrected: the fit
equals the synchronous one exactly.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import torch

from ..._config import get_config
from ...backend import distributed
from ...backend._sampler_process import SamplerProcess
from ...backend.samplers import Samples
from ...backend.vllm_engine import truncated_importance_weights
from ...lm._health import Detector, smoothed

# The largest seed of the sampler's own stream (torch seeds are 64-bit; numpy's draws 63).
_SEED = 2**62


def check_overlap(view) -> None:
    """Refuse, before any work, what overlapped rollouts cannot serve, saying where."""
    if view.max_staleness is None:
        return
    name = view.name
    where = "prefopt/policies/loop/_overlap.py"
    if distributed.world_size() > 1 and distributed.sharded():
        raise ValueError(
            f"{name}(max_staleness={view.max_staleness}) with set_config(distributed='fsdp') "
            f"({distributed.world_size()} ranks): each rank's sampler process ({where}) holds "
            "the whole model, which FSDP keeps in shards across the ranks. Use "
            "distributed='ddp' (each rank then overlaps its own sampling and training), or "
            "max_staleness=None."
        )
    if get_config()["generation"] != "native":  # "vllm" or an engine object
        raise ValueError(
            f"{name}(max_staleness={view.max_staleness}) with set_config(generation='vllm'): "
            f"overlap runs the native sampler in a process of its own ({where}); the vLLM "
            "engine is not yet fed from it. Use generation='native', or max_staleness=None."
        )
    if torch.device(view.device).type not in ("cpu", "cuda"):
        raise ValueError(
            f"{name}(max_staleness={view.max_staleness}) on {view.device}: the sampler "
            f"process ({where}) runs on the CPU or a CUDA device. Use max_staleness=None "
            "there."
        )


class OverlapPipeline:
    """The sampler of an overlapped fit: batches queued ahead, handed to the rollout in order.

    It answers the rollout's ``sample`` call as
    :class:`~prefopt.backend.samplers.NativeSampler` does, its
    :class:`~prefopt.backend.samplers.Samples` carrying ``behaviour_logprobs``
    and ``staleness``; the loop asks it for each step's prompt rows
    (:meth:`next_rows`).

    Parameters
    ----------
    view : StepView
    run : RunState
        The run's streams: prompt rows are drawn from it; with ``max_staleness=0``
        the samples too, else a seed of the sampler's own stream (once per fit).
    prompt_tokens : list of list of int
    state : dict, default=None
        What :meth:`state_dict` saved (a resumed run).
    """

    def __init__(self, view, run, *, prompt_tokens, state=None):
        self.view, self.run = view, run
        self.staleness = int(view.max_staleness)
        self.prompt_tokens = prompt_tokens
        self.pending: deque = deque()
        self.step = 0  # updates the current weights have had (the loop's n_iter)
        self.due = False  # whether the queued head batch is this step's, not yet handed
        self.seconds = 0.0  # the sampler process's own seconds for the last batch handed
        self.start_state = None  # the first request's generator state (resumed runs)
        self.seed = None
        if state and "ranks" in state:  # a distributed run's checkpoint: each rank its own
            if len(state["ranks"]) != distributed.world_size():
                raise ValueError(
                    f"This checkpoint's overlapped rollouts were in flight on "
                    f"{len(state['ranks'])} rank(s); resume it on as many (this run has "
                    f"{distributed.world_size()}), since each rank samples its own batches."
                )
            state = state["ranks"][distributed.rank()]
        if self.staleness > 0:
            if state:
                self.start_state = state["generator"]
                for entry in state["pending"]:
                    entry = dict(entry)
                    entry["rows"] = np.asarray(entry["rows"], dtype=np.int64)
                    entry["samples"] = tuple(entry["samples"])
                    self.pending.append(entry)
            else:
                self.seed = int(torch.randint(_SEED, (1,), generator=run.generator))
        self.last_state = self.start_state
        self.process = SamplerProcess(
            view.model, n_buffers=self.staleness + 2,
            generator_device=str(run.generator.device),
        )  # fmt: skip

    # ----- what the loop asks ---------------------------------------------------------
    def next_rows(self, draw, step: int) -> np.ndarray:
        """This step's prompt rows; first queues the batches up to ``max_staleness`` ahead.

        ``draw()`` draws a batch's rows from the run's prompt stream, ``step``
        is the number of updates the current weights have had.
        """
        self.step = step
        if self.staleness == 0:
            return draw()
        self.due = True  # the step's first sample call takes the queued batch
        while len(self.pending) < self.staleness + 1:
            rows = draw()
            number = self._submit(np.repeat(rows, self.view.k))
            self.pending.append({"rows": rows, "number": number, "version": step, "samples": None})
        return self.pending[0]["rows"]

    def sample(self, model, prompts, *, generator, prompt_index=None, **options):
        """The samples of ``prompts``: the queued batch, or (other rows) drawn now."""
        index = None if prompt_index is None else np.asarray(prompt_index.cpu())
        if self.staleness == 0:
            number = self._submit(index, generator_state=generator.get_state())
            samples, state, self.seconds = self.process.receive(number)
            generator.set_state(state)  # the run's stream, as if sampled here
            return samples
        head = self.pending[0] if self.pending and self.due else None
        if head is not None and np.array_equal(np.repeat(head["rows"], self.view.k), index):
            self.pending.popleft()
            self.due = False
            samples, staleness = self._samples_of(head), self.step - head["version"]
        else:  # rows of a resampling round (dynamic_sampling): drawn now, current weights
            samples, self.last_state, self.seconds = self.process.receive(self._submit(index))
            staleness = 0
        samples.behaviour_logprobs = samples.logprobs
        samples.staleness = staleness
        return samples

    def _submit(self, rows, generator_state=None) -> int:
        """Queue the sampling of the prompts of ``rows`` (one a sample) with the current weights."""
        view = self.view
        if generator_state is None and self.start_state is not None:
            generator_state, self.start_state = self.start_state, None
        seed, self.seed = self.seed, None
        prompts = view.encode([self.prompt_tokens[i] for i in rows])
        return self.process.submit(
            view.model, prompts, generator_state=generator_state, seed=seed,
            max_new_tokens=view.max_new_tokens, temperature=view.temperature,
            pad_token_id=view.pad_token_id, suppress_ids=view.suppress_ids,
            stop_ids=view.stop_ids, prompt_index=torch.as_tensor(rows),
        )  # fmt: skip

    def _samples_of(self, entry):
        """The samples of a queued batch (waiting for them), as backend Samples."""
        if entry["samples"] is None:
            samples, self.last_state, self.seconds = self.process.receive(entry["number"])
            return samples
        ids, mask, ended, logprobs = (t.to(self.view.device) for t in entry["samples"])
        self.seconds = float(entry.get("seconds", 0.0))
        return Samples(ids, mask, ended.bool(), logprobs)

    # ----- checkpoints ----------------------------------------------------------------
    def state_dict(self) -> dict:
        """The batches in flight (waited for) and the sampler's stream after them.

        A checkpoint then holds what the uninterrupted run will train on next, so a
        resumed run equals it; with ``max_staleness=0`` there is nothing in flight.
        In a distributed fit (a collective) every rank's, under ``"ranks"``, in rank
        order: each rank samples its own share of the prompts.
        """
        if self.staleness == 0:
            return {}
        if distributed.world_size() > 1:
            return {"ranks": distributed.gather_objects(self._own_state())}
        return self._own_state()

    def _own_state(self) -> dict:
        """This process's batches in flight and its sampler's stream."""
        for entry in self.pending:
            if entry["samples"] is None:
                samples, self.last_state, seconds = self.process.receive(entry["number"])
                entry["samples"] = (
                    samples.response_ids,
                    samples.response_mask,
                    samples.ended,
                    samples.logprobs,
                )
                entry["seconds"] = seconds
        pending = [
            {
                "rows": np.asarray(e["rows"], dtype=np.int64),
                "version": int(e["version"]),
                "seconds": float(e.get("seconds", 0.0)),
                "samples": [t.cpu() for t in e["samples"]],
            }
            for e in self.pending
        ]
        return {"pending": pending, "generator": self.last_state}

    def close(self) -> None:
        """End the sampler process."""
        self.process.close()


def overlapped(view, run, *, prompt_tokens, state=None) -> OverlapPipeline | None:
    """The fit's :class:`OverlapPipeline`, or ``None`` for a synchronous fit."""
    if view.max_staleness is None:
        return None
    check_overlap(view)
    return OverlapPipeline(view, run, prompt_tokens=prompt_tokens, state=state)


# ----- the correction -----------------------------------------------------------------
def importance_ratio(current, behaviour, mask, cap) -> torch.Tensor:
    """:func:`~prefopt.backend.vllm_engine.truncated_importance_weights`, 1 outside ``mask``.

    ``current`` and ``behaviour`` are the sampled tokens' log-probs under the
    proximal (current) and the behaviour (sampling) policy, ``cap`` the truncation
    (``inf``: none). Outside ``mask`` the weight is 1, so it leaves the other
    factors of a token's loss as they are.
    """
    weights = truncated_importance_weights(current, behaviour, cap=cap)
    return torch.where(mask.bool(), weights, torch.ones_like(weights))


def off_policy_weights(minibatch, cap, weights=None):
    """The off-policy weights of a minibatch's tokens (times ``weights``), or ``weights``.

    ``min(exp(old_logprobs - behaviour_logprobs), cap)``: the proximal policy
    (before this step's update) over the behaviour policy that sampled, truncated
    (see the module's docstring for the objective each algorithm then optimises).
    A synchronous batch (no behaviour log-probs) or ``cap=None`` (no correction)
    returns ``weights`` unchanged, ``None`` meaning none.
    """
    behaviour = minibatch.batch.behaviour_logprobs
    if behaviour is None or cap is None:
        return weights
    w = importance_ratio(minibatch.old_logprobs, behaviour[minibatch.rows], minibatch.mask, cap)
    return w if weights is None else w * weights


def overlap_statistics(view, batch, pipeline) -> dict:
    """The step's ``overlap/`` columns; {} for a synchronous fit.

    ``overlap/staleness`` (updates between the sampling weights and the current
    ones), ``overlap/is_weight_mean`` and ``overlap/is_truncated_share`` (the
    weights ``min(pi_prox / mu, cap)`` over the response tokens, untruncated
    when ``off_policy_cap`` is None or inf: then the share is of weights above
    2), ``overlap/kl`` (KL(mu || pi_prox) per response token, Schulman's k3
    estimate on mu's samples, never negative) and ``time/sampling_process`` (the
    sampler process's own seconds for the batch).
    """
    if pipeline is None:
        return {}
    out = {"overlap/staleness": float(batch.staleness), "time/sampling_process": pipeline.seconds}
    mask = batch.response_mask.bool()
    behaviour = batch.behaviour_logprobs
    if behaviour is None or not mask.any():
        return {**out, "overlap/is_weight_mean": 1.0, "overlap/is_truncated_share": 0.0,
                "overlap/kl": 0.0}  # fmt: skip
    cap = view.off_policy_cap
    bound = 2.0 if cap is None or not math.isfinite(cap) else float(cap)
    log_ratio = (batch.old_logprobs.float() - behaviour.float())[mask]
    raw = log_ratio.exp()
    weights = raw if cap is None else raw.clamp(max=cap)
    return {
        **out,
        "overlap/is_weight_mean": float(weights.mean()),
        "overlap/is_truncated_share": float((raw > bound).float().mean()),
        "overlap/kl": float((raw - 1 - log_ratio).mean()),
    }


# ----- health -------------------------------------------------------------------------
# A run whose importance weights run away: the smoothed share of response tokens whose
# weight pi_prox / mu exceeds the cap (2 by default). Healthy staleness-1 runs on the exact
# worlds stay far below it (benchmarks/overlap_exact.py; numbers in docs/guide/overlap.rst).
RUNAWAY_WEIGHTS = 0.2


def overlap_detectors(view) -> list:
    """The detector of runaway importance weights, for an overlapped fit; else none."""
    if view.max_staleness is None or view.max_staleness == 0:
        return []
    return [
        Detector(
            "runaway_importance_weights",
            RUNAWAY_WEIGHTS,
            lambda rows: smoothed([r["overlap/is_truncated_share"] for r in rows]),
            advice="The sampling policy is far from the one that learns (overlap/kl in "
            "history_): lower max_staleness or learning_rate.",
        )
    ]
