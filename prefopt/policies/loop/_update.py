"""A step's update: ``n_epochs`` x ``n_minibatches`` gradient steps on the algorithm's loss.

:class:`Update` owns what it reads (the fit's
:class:`~prefopt.policies.loop._view.StepView`, the optimiser, the random stream of
the minibatch order, the pretraining tokens, the modules its training passes go
through) and returns an :class:`UpdateResult`. It calls the algorithm's
``compute_loss`` and adds the terms every algorithm gets (the entropy bonus and
the pretraining loss).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...backend import distributed, gradient_step, response_logprobs, sequence_values, vllm_engine
from ...backend._shared_prompts import is_transformers_model
from ...backend.memory import micro_batches, training_passes
from ...kl import kl_estimate
from ._batch import Minibatch, RolloutBatch, masked_mean, minibatch_order
from ._overlap import off_policy_weights
from ._rollout import _now


@dataclass
class UpdateResult:
    """What one update did: its statistics for ``history_`` and its optimiser steps."""

    stats: dict
    gradient_steps: int


class Update:
    """The updates of one fit's steps.

    To every minibatch's loss it adds, for any algorithm, the entropy bonus
    ``-entropy_coef * H`` (the masked mean per-token entropy, with gradients) and
    the pretraining term ``ptx_coef * CE`` (next-token cross-entropy on a
    minibatch of ``ptx_data``, Ouyang et al. 2022's PPO-ptx).

    Parameters
    ----------
    view : StepView
    optimizer : torch.optim.Optimizer
    generator : torch.Generator
        The stream of the minibatch order and the pretraining draws.
    ptx_tokens : list of (list of int, list of int), default=None
        The pretraining texts as (context, continuation) ids.
    models : tuple of (torch.nn.Module, torch.nn.Module or None), default=None
        The policy and value model the training passes go through (their
        DistributedDataParallel wrappers in a distributed fit); ``None``: the
        view's own.
    """

    def __init__(self, view, optimizer, generator, *, ptx_tokens=None, models=None):
        self.view = view
        self.optimizer = optimizer
        self.generator = generator
        self.ptx_tokens = ptx_tokens
        self.model, self.value_model = view.models if models is None else models

    def __call__(self, batch: RolloutBatch, *, step: int) -> UpdateResult:
        """The gradient steps on ``batch`` (with advantages); ``step`` numbers messages."""
        view = self.view
        size = max(1, len(batch) // view.n_minibatches)
        totals: dict[str, float] = {}
        entropies: list = []
        started = _now(view.device)
        with training_passes(view.model, view.value_model):  # checkpointing: train mode
            count = self._passes(batch, size, step, totals, entropies)
        out = {key: value / count for key, value in totals.items()}
        out["policy/entropy"] = float(np.mean(entropies))
        out["time/update"] = _now(view.device) - started
        return UpdateResult({**out, **batch.timings}, count)  # with the rollout's phases

    def _passes(self, batch, size, step, totals, entropies) -> int:
        """The gradient steps; sums each stat into ``totals``, returns the steps taken."""
        view = self.view
        n = len(batch)
        ptx = self.ptx_tokens if view.ptx_coef > 0 else None
        count = 0
        for _ in range(view.n_epochs):
            # Whole groups of a prompt's samples in a minibatch, so that a transformers model
            # runs each prompt once for its group (one sample a prompt: a shuffle of the rows).
            perm = minibatch_order(
                batch.prompt_index, self.generator, is_transformers_model(view.model)
            ).to(view.device)
            for start in range(0, n, size):
                rows = perm[start : start + size]
                micro = view.micro_batch_size
                if micro is None or micro >= len(rows):
                    stats, mean_entropy = self._whole(batch, rows, step, ptx)
                else:
                    stats, mean_entropy = self._accumulated(batch, rows, step, ptx)
                entropies.append(mean_entropy)
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + float(value)
                count += 1
        return count

    def _forward(self, batch, rows) -> Minibatch:
        """The current policy's (and value model's) outputs on ``rows``."""
        view = self.view
        index = batch.prompt_index[rows.cpu()]
        logprobs, entropy = response_logprobs(
            self.model,
            batch.prompts[rows],
            batch.response_ids[rows],
            batch.seen_mask[rows],  # an episode's whole transcript
            temperature=view.training_temperature,
            suppress_ids=view.suppress_ids,
            with_entropy=True,
            entropy_grad=view.entropy_coef > 0,  # the default builds no extra graph
            prompt_index=index,
        )
        if batch.attention_mask is not None:
            # An episode's environment tokens: no log-prob, no entropy, no gradient.
            outside = batch.response_mask[rows] == 0
            logprobs = logprobs.masked_fill(outside, 0.0)
            entropy = entropy.masked_fill(outside, 0.0)
        values = None
        if self.value_model is not None:
            values = sequence_values(
                self.value_model,
                batch.prompts[rows],
                batch.response_ids[rows],
                batch.seen_mask[rows],
                prompt_index=index,
            )
        return Minibatch(batch, rows, logprobs, entropy, values)

    def _loss(self, batch, minibatch: Minibatch):
        """The algorithm's loss on ``minibatch``, importance-weighted, and its stats."""
        view = self.view
        cap = view.importance_sampling_cap
        engine_weights = importance_weights(minibatch, cap)
        # overlapped rollouts: times the behaviour policy's weights (_overlap.py)
        weights = off_policy_weights(minibatch, view.off_policy_cap, engine_weights)
        if weights is not None:  # each token's gradient times its weight, values same
            minibatch.logprobs = scale_gradient(minibatch.logprobs, weights)
        loss, stats = view.compute_loss(batch, minibatch)
        stats = dict(stats)
        if engine_weights is not None:
            stats.update(weight_statistics(engine_weights, minibatch.mask, cap))
        return loss, stats

    def _whole(self, batch, rows, step, ptx):
        """One gradient step on the minibatch ``rows``, its passes at once."""
        view = self.view
        minibatch = self._forward(batch, rows)
        loss, stats = self._loss(batch, minibatch)
        mean_entropy = masked_mean(minibatch.entropy, minibatch.mask, across_ranks=True)
        if view.entropy_coef > 0:
            bonus = view.entropy_coef * mean_entropy
            loss = loss - bonus
            stats["loss/entropy_bonus"] = bonus.item()
        if ptx is not None:
            ptx_loss = self.pretraining_loss(ptx, len(rows))
            loss = loss + view.ptx_coef * ptx_loss
            stats["loss/ptx"] = ptx_loss.item()
        gradient_step(
            self.optimizer, loss, who=view.name, step=step, max_grad_norm=view.max_grad_norm
        )
        return stats, float(mean_entropy.detach())

    def _accumulated(self, batch, rows, step, ptx):
        """One gradient step on the minibatch ``rows``, its passes in ``micro_batch_size`` parts.

        Each part's terms are weighted so that the accumulated gradient is the whole
        minibatch's: the entropy bonus (a token mean) by the part's share of the
        response tokens, the pretraining loss by its share of the pretraining
        tokens, and the algorithm's loss as its ``loss_reduction`` declares (for
        ``"minibatch"``, through :meth:`_cached`).
        """
        view = self.view
        # One process (a distributed fit refuses micro_batch_size): the counts and means
        # here are over this process's parts.
        parts = micro_batches(rows, view.micro_batch_size)
        tokens = _shares([float(batch.response_mask[part].sum()) for part in parts])
        ptx_part = None if ptx is None else self.pretraining_parts(ptx, [len(p) for p in parts])
        self.optimizer.zero_grad(set_to_none=True)
        if view.loss_reduction == "minibatch":
            stats, mean_entropy = self._cached(batch, rows, parts, step, ptx_part)
        else:
            stats, mean_entropy = self._one_pass_each(batch, parts, tokens, step, ptx_part)
        if view.entropy_coef > 0:
            stats["loss/entropy_bonus"] = view.entropy_coef * mean_entropy
        gradient_step(
            self.optimizer, None, who=view.name, step=step, max_grad_norm=view.max_grad_norm
        )
        return stats, mean_entropy

    def _one_pass_each(self, batch, parts, tokens, step, ptx_part):
        """The parts' backward passes for a declared reduction: the parts' losses, weighted."""
        view = self.view
        rows = _shares([float(len(part)) for part in parts])
        shares = {"token_mean": tokens, "sequence_mean": rows, "sum": [1.0] * len(parts)}
        shares = shares[view.loss_reduction]
        summed = view.loss_reduction == "sum"
        each, mean_entropy, ptx_total = [], 0.0, 0.0
        for j, part in enumerate(parts):
            minibatch = self._forward(batch, part)
            loss, stats = self._loss(batch, minibatch)
            part_entropy = masked_mean(minibatch.entropy, minibatch.mask, across_ranks=False)
            total = shares[j] * loss
            if view.entropy_coef > 0:
                total = total - tokens[j] * view.entropy_coef * part_entropy
            if ptx_part is not None:
                ptx_loss = ptx_part(j)
                total = total + view.ptx_coef * ptx_loss
                ptx_total += ptx_loss.item()
            self._check_finite(total, step)
            total.backward()
            each.append(stats)
            mean_entropy += tokens[j] * float(part_entropy.detach())
        stats = _merged(each, rows if summed else shares, summed=summed)
        if ptx_part is not None:
            stats["loss/ptx"] = ptx_total
        return stats, mean_entropy

    def _cached(self, batch, rows, parts, step, ptx_part):
        """The parts' backward passes for a loss of the whole minibatch (gradient caching).

        The parts' forward passes without gradients give the whole minibatch's
        outputs; the loss on them (a leaf each) gives its gradient with respect to
        each output; each part's forward pass is then run again with gradients and
        taken backward with its slice of those gradients (Gao et al. 2021). By the
        chain rule the accumulated gradient is the whole minibatch's.
        """
        view = self.view
        with torch.no_grad():
            outputs = [self._forward(batch, part) for part in parts]
        names = ["logprobs", "entropy", "values"]
        wanted = {"logprobs": True, "entropy": view.entropy_coef > 0, "values": True}
        leaves = {}
        for name in names:
            if getattr(outputs[0], name) is not None:
                joined = torch.cat([getattr(out, name) for out in outputs])
                leaves[name] = joined.requires_grad_(wanted[name])
        minibatch = Minibatch(
            batch, rows, leaves["logprobs"], leaves["entropy"], leaves.get("values")
        )
        loss, stats = self._loss(batch, minibatch)
        mean_entropy = masked_mean(leaves["entropy"], minibatch.mask, across_ranks=False)
        if view.entropy_coef > 0:
            loss = loss - view.entropy_coef * mean_entropy
        self._check_finite(loss, step)
        taking = [name for name in leaves if leaves[name].requires_grad]
        grads = torch.autograd.grad(loss, [leaves[name] for name in taking], allow_unused=True)
        ptx_total, start = 0.0, 0
        for j, part in enumerate(parts):
            out = self._forward(batch, part)
            stop = start + len(part)
            tensors, slices = [], []
            for name, grad in zip(taking, grads):
                if grad is not None:  # a loss may not read every output (values)
                    tensors.append(getattr(out, name))
                    slices.append(grad[start:stop])
            if ptx_part is not None:
                ptx_loss = ptx_part(j)
                tensors.append(view.ptx_coef * ptx_loss)
                slices.append(torch.ones_like(ptx_loss))
                ptx_total += ptx_loss.item()
            if tensors:
                torch.autograd.backward(tensors, slices)
            start = stop
        if ptx_part is not None:
            stats["loss/ptx"] = ptx_total
        return stats, float(mean_entropy.detach())

    def _check_finite(self, loss, step) -> None:
        """Refuse a non-finite loss before its gradient counts (none of the minibatch's is kept)."""
        if not torch.isfinite(loss.detach()).all():
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"{self.view.name}: the loss became {loss.item()} at step {step}; lower "
                "learning_rate or check the data and the reward."
            )

    def pretraining_parts(self, texts, sizes):
        """The pretraining loss of ``sum(sizes)`` draws, as terms that add up to it.

        The draws are those of :meth:`pretraining_loss` (one ``randint`` from the
        run's generator); ``part(j)`` is the next-token cross-entropy summed over
        the tokens of the ``j``-th ``sizes[j]`` draws, divided by the tokens of
        all of them, so the terms add up to their mean (one forward pass a part).
        """
        view = self.view
        picks = torch.randint(len(texts), (sum(sizes),), generator=self.generator).tolist()
        contexts = view.encode([texts[i][0] for i in picks])
        ids, mask = view.pad_responses([texts[i][1] for i in picks])
        mask = mask.float()
        count = mask.sum().clamp(min=1.0)
        bounds = np.cumsum([0, *sizes]).tolist()

        def part(j: int) -> torch.Tensor:
            lo, hi = bounds[j], bounds[j + 1]
            logprobs = response_logprobs(
                self.model, contexts[lo:hi], ids[lo:hi], mask[lo:hi], temperature=1.0,
                suppress_ids=view.suppress_ids,
            )  # fmt: skip
            return -(logprobs * mask[lo:hi]).sum() / count

        return part

    def pretraining_loss(self, texts, n: int) -> torch.Tensor:
        """Next-token cross-entropy of the policy on ``n`` pretraining texts drawn at random.

        ``texts`` is what the loop made of ``ptx_data`` once per fit
        (``ptx_tokens``): ``(context, continuation)`` token lists, the context being the
        tokenizer's BOS prefix or the text's first token. The rows are drawn with
        replacement from the run's generator; the loss is the mean over their
        predicted tokens, at temperature 1 (the pretraining distribution itself).
        """
        view = self.view
        picks = torch.randint(len(texts), (n,), generator=self.generator).tolist()
        contexts = view.encode([texts[i][0] for i in picks])
        ids, mask = view.pad_responses([texts[i][1] for i in picks])
        logprobs = response_logprobs(
            self.model, contexts, ids, mask, temperature=1.0, suppress_ids=view.suppress_ids
        )
        return -masked_mean(logprobs, mask, across_ranks=True)


def _shares(weights: list) -> list:
    """Each weight over their sum (all 0 when the sum is: nothing to average over)."""
    total = sum(weights)
    return [w / total if total > 0 else 0.0 for w in weights]


def _merged(each: list, weights: list, *, summed: bool = False) -> dict:
    """The parts' stats as one minibatch's: means with ``weights``; ``loss/`` keys summed
    when ``summed`` (the parts' losses add up to the minibatch's)."""
    out: dict = {}
    for stats, weight in zip(each, weights):
        for key, value in stats.items():
            scale = 1.0 if summed and key.startswith("loss/") else weight
            out[key] = out.get(key, 0.0) + scale * float(value)
    return out


# The smallest KL a token policy_change reports (nats): far above float32 rounding, far
# below any useful target (AdaptiveLR's default is 0.01).
NO_CHANGE = 1e-9


def policy_change(view, batch: RolloutBatch) -> float:
    """The update's measured policy change: mean KL(pi_before || pi_after) per response token.

    One forward pass without gradients over the step's own responses (in chunks
    of the update's passes, :meth:`StepView.pass_rows`) gives the updated policy's log-probs; the
    policy before the update gave ``batch.old_logprobs``, on the same tokens at
    the same (sampling) temperature. The tokens were sampled from the policy
    before, so Schulman (2020)'s k3 estimator, ``(r - 1) - log r`` with ``r =
    pi_after / pi_before``, is unbiased and never negative; its mean over the
    response tokens, over every rank, is what :class:`~prefopt.AdaptiveLR` reads
    (the KL between the policies before and after an update that rsl_rl's and
    rl_games' adaptive schedules read). A change of ``NO_CHANGE`` (1e-9) or less is 0.
    """
    after = view.logprobs(
        view.model, batch.prompts, batch.response_ids, batch.seen_mask, batch.prompt_index,
        view.pass_rows(len(batch)),
    )  # fmt: skip
    mask = batch.response_mask
    if batch.attention_mask is not None:  # an episode: the policy's own tokens
        after = after.masked_fill(mask == 0, 0.0)
    kl = kl_estimate(batch.old_logprobs, after.float(), "k3") * mask
    change = float(distributed.mean(kl.sum() / mask.sum().clamp(min=1), across_ranks=True))
    # The sampling pass and a full pass of an unchanged policy differ by float32 rounding
    # (a KL of about 1e-14 a token, measured when every advantage is 0): no change, which
    # must not read as a small one (AdaptiveLR would raise the rate for it).
    return change if change > NO_CHANGE else 0.0


class _ScaleGradient(torch.autograd.Function):
    """The identity, whose backward pass multiplies the gradient by a fixed tensor."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(scale)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        (scale,) = ctx.saved_tensors
        return grad * scale, None


def scale_gradient(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` itself, whose gradient is multiplied by ``scale`` (detached) elementwise."""
    return _ScaleGradient.apply(x, scale.detach().to(x.dtype))


def importance_weights(minibatch: Minibatch, cap: float | None) -> torch.Tensor | None:
    """The truncated importance-sampling weights of a minibatch's tokens, or ``None``.

    With ``vllm_importance_sampling_cap=C`` and a batch sampled by the engine:
    ``min(exp(old_logprobs - engine_logprobs), C)`` per response token (Yao et
    al. 2025; TRL's ``vllm_importance_sampling_correction``), 0 outside the
    mask. The native sampler samples from the policy itself, whose weights are
    exactly 1: ``None``, nothing is changed.
    """
    engine = minibatch.engine_logprobs
    if cap is None or engine is None:
        return None
    return vllm_engine.truncated_importance_weights(
        minibatch.old_logprobs, engine, minibatch.mask, cap=cap
    )


def weight_statistics(weights: torch.Tensor, mask: torch.Tensor, cap: float) -> dict:
    """The minibatch's mean weight and share of truncated tokens, for ``history_``."""
    valid = mask.bool()
    w = weights[valid]
    if w.numel() == 0:
        return {"engine/is_weight_mean": 1.0, "engine/is_truncated_share": 0.0}
    cap = float(cap)
    return {
        "engine/is_weight_mean": float(w.mean()),
        "engine/is_truncated_share": float((w >= cap).float().mean()),
    }
