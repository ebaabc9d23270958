"""The gradient passes of one step: ``n_epochs`` x ``n_minibatches`` steps on the loss.

:meth:`PolicyLoop.update <prefopt.policies.loop._loop.PolicyLoop.update>` calls
:func:`update` once per step; it calls the algorithm's ``compute_loss`` and adds
the terms every algorithm gets (the entropy bonus and the pretraining loss).
"""

from __future__ import annotations

import numpy as np
import torch

from ...backend import gradient_step, response_logprobs, sequence_values, vllm_engine
from ...backend._shared_prompts import is_transformers_model
from ...backend.memory import training_passes
from ._batch import Minibatch, RolloutBatch, masked_mean, minibatch_order
from ._rollout import _now


def update(loop, batch: RolloutBatch) -> dict:
    """``n_epochs`` passes of ``n_minibatches`` gradient steps on the algorithm's loss.

    To every minibatch's loss the loop adds, for any algorithm, the entropy
    bonus ``-entropy_coef * H`` (the masked mean per-token entropy, with
    gradients) and the pretraining term ``ptx_coef * CE`` (next-token
    cross-entropy on a minibatch of ``ptx_data``, Ouyang et al. 2022's PPO-ptx).
    """
    policy = loop.policy
    n = len(batch)
    size = max(1, n // policy.n_minibatches)
    temperature = policy._training_temperature()
    entropy_coef = float(policy.entropy_coef)
    ptx = loop.ptx_tokens if policy.ptx_coef > 0 else None
    totals: dict[str, float] = {}
    entropies: list = []
    started = _now(policy.device_)
    with training_passes(policy.model_, policy.value_model_):  # checkpointing: train mode
        count = _passes(loop, batch, size, temperature, entropy_coef, ptx, totals, entropies)
    out = {key: value / count for key, value in totals.items()}
    out["policy/entropy"] = float(np.mean(entropies))
    out["time/update"] = _now(policy.device_) - started
    return {**out, **batch.timings}  # the rollout's phases


def _passes(loop, batch, size, temperature, entropy_coef, ptx, totals, entropies) -> int:
    """The update's gradient steps; sums each stat into ``totals``, returns the steps taken."""
    policy = loop.policy
    n = len(batch)
    count = 0
    for _ in range(policy.n_epochs):
        # Whole groups of a prompt's samples in a minibatch, so that a transformers model
        # runs each prompt once for its group (one sample a prompt: a shuffle of the rows).
        perm = minibatch_order(
            batch.prompt_index, loop.run.generator, is_transformers_model(policy.model_)
        ).to(policy.device_)
        for start in range(0, n, size):
            rows = perm[start : start + size]
            index = batch.prompt_index[rows.cpu()]
            logprobs, entropy = response_logprobs(
                policy.model_,
                batch.prompts[rows],
                batch.response_ids[rows],
                batch.response_mask[rows],
                temperature=temperature,
                suppress_ids=policy._suppress_ids,
                with_entropy=True,
                entropy_grad=entropy_coef > 0,  # the default pass builds no extra graph
                prompt_index=index,
            )
            values = None
            if policy.value_model_ is not None:
                values = sequence_values(
                    policy.value_model_,
                    batch.prompts[rows],
                    batch.response_ids[rows],
                    batch.response_mask[rows],
                    prompt_index=index,
                )
            minibatch = Minibatch(batch, rows, logprobs, entropy, values)
            weights = importance_weights(policy, minibatch)
            if weights is not None:  # each token's gradient times its weight, values unchanged
                minibatch.logprobs = scale_gradient(logprobs, weights)
            loss, stats = policy.compute_loss(batch, minibatch)
            stats = dict(stats)
            if weights is not None:
                stats.update(weight_statistics(weights, minibatch.mask, policy))
            mean_entropy = masked_mean(entropy, minibatch.mask)
            if entropy_coef > 0:
                bonus = entropy_coef * mean_entropy
                loss = loss - bonus
                stats["loss/entropy_bonus"] = bonus.item()
            if ptx is not None:
                ptx_loss = pretraining_loss(loop, ptx, len(rows))
                loss = loss + policy.ptx_coef * ptx_loss
                stats["loss/ptx"] = ptx_loss.item()
            gradient_step(
                loop.run.optimizer,
                loss,
                who=type(policy).__name__,
                step=policy.n_iter_ + 1,
                max_grad_norm=policy.max_grad_norm,
            )
            entropies.append(float(mean_entropy.detach()))
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + float(value)
            count += 1
    return count


def pretraining_loss(loop, texts, n: int) -> torch.Tensor:
    """Next-token cross-entropy of the policy on ``n`` pretraining texts drawn at random.

    ``texts`` is what the loop made of ``ptx_data`` once per fit
    (``loop.ptx_tokens``): ``(context, continuation)`` token lists, the context being the
    tokenizer's BOS prefix or the text's first token. The rows are drawn with
    replacement from the run's generator; the loss is the mean over their
    predicted tokens, at temperature 1 (the pretraining distribution itself).
    """
    policy = loop.policy
    picks = torch.randint(len(texts), (n,), generator=loop.run.generator).tolist()
    contexts = policy._encode([texts[i][0] for i in picks])
    ids, mask = policy._pad_responses([texts[i][1] for i in picks])
    logprobs = response_logprobs(
        policy.model_, contexts, ids, mask, temperature=1.0, suppress_ids=policy._suppress_ids
    )
    return -masked_mean(logprobs, mask)


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


def importance_weights(policy, minibatch: Minibatch) -> torch.Tensor | None:
    """The truncated importance-sampling weights of a minibatch's tokens, or ``None``.

    With ``vllm_importance_sampling_cap=C`` and a batch sampled by the engine:
    ``min(exp(old_logprobs - engine_logprobs), C)`` per response token (Yao et
    al. 2025; TRL's ``vllm_importance_sampling_correction``), 0 outside the
    mask. The native sampler samples from the policy itself, whose weights are
    exactly 1: ``None``, nothing is changed.
    """
    cap = getattr(policy, "vllm_importance_sampling_cap", None)
    engine = minibatch.engine_logprobs
    if cap is None or engine is None:
        return None
    return vllm_engine.truncated_importance_weights(
        minibatch.old_logprobs, engine, minibatch.mask, cap=cap
    )


def weight_statistics(weights: torch.Tensor, mask: torch.Tensor, policy) -> dict:
    """The minibatch's mean weight and share of truncated tokens, for ``history_``."""
    valid = mask.bool()
    w = weights[valid]
    if w.numel() == 0:
        return {"engine/is_weight_mean": 1.0, "engine/is_truncated_share": 0.0}
    cap = float(policy.vllm_importance_sampling_cap)
    return {
        "engine/is_weight_mean": float(w.mean()),
        "engine/is_truncated_share": float((w >= cap).float().mean()),
    }
