"""The passes of a rollout: sampling, old and reference log-probs, values, reward, KL.

:meth:`PolicyLoop.rollout <prefopt.policies.loop._loop.PolicyLoop.rollout>` calls
:func:`sample_and_score` once per step; it reads the loop's prompts and random
streams, the policy's fitted state and its algorithm's declarations
(``kl_penalty``, ``recomputes_old_logprobs``, ``training_temperature``).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ...backend import response_logprobs, sequence_values, uses_bf16, vllm_engine
from ...kl import kl_estimate
from ...rewards import WeightedRewards, call_with_columns, check_rewards, check_token_rewards
from ._batch import RolloutBatch
from ._dynamic import dynamic_batch


def sample_and_score(loop, prompt_rows: np.ndarray) -> RolloutBatch:
    """One step's rollouts: sample, old and reference log-probs, values, scores, KL, rewards.

    ``loop`` is the fit's :class:`~prefopt.policies.loop._loop.PolicyLoop`; the phases'
    seconds go into the batch's ``timings``. With several rewards, each one's mean
    and std go into ``loop.rollout_stats``; with ``dynamic_sampling`` (DAPO) the
    groups whose rewards all tie are replaced (:func:`dynamic_batch`).
    """
    loop.rollout_stats = {}
    batch, parts = rollout_once(loop, prompt_rows)
    if getattr(loop.policy, "dynamic_sampling", False):
        batch, parts = dynamic_batch(loop, batch, parts, rollout_once)
    for name, values in parts.items():
        loop.rollout_stats[f"rewards/{name}/mean"] = float(np.mean(values))
        loop.rollout_stats[f"rewards/{name}/std"] = float(np.std(values))
    return batch


def rollout_once(loop, prompt_rows: np.ndarray) -> tuple[RolloutBatch, dict]:
    """The rollouts of ``prompt_rows``, and each reward's values when there are several."""
    policy = loop.policy
    parts: dict = {}
    rows = np.repeat(prompt_rows, policy._samples_per_prompt())
    index = torch.as_tensor(rows)  # equal values: one prompt, run once in every pass
    prompts = policy._encode([loop.prompt_tokens[i] for i in rows])
    clock = [_now(policy.device_)]
    response_ids, response_mask, ended, sampled = policy._generate(
        prompts, loop.run.generator, return_logprobs=True, prompt_index=index
    )
    engine = sampled_by_engine(response_mask)
    clock.append(_now(policy.device_))
    recompute = policy.recomputes_old_logprobs
    if (recompute and policy._training_temperature() == policy.temperature_) or (
        uses_bf16(policy.device_)
    ):
        # Old log-probs from a full forward pass identical to the training pass, so the
        # ratio is exactly 1 at the first epoch (Huang et al. 2024); in bf16 the cached
        # sampling pass differs from a full pass too much.
        old = response_logprobs(
            policy.model_,
            prompts,
            response_ids,
            response_mask,
            temperature=policy.temperature_,
            suppress_ids=policy._suppress_ids,
            prompt_index=index,
        )
    else:
        # The sampling pass's own log-probs (fp32, tempered, equal to a fresh forward
        # pass up to float rounding) serve the KL; no extra pass.
        old = sampled.masked_fill(response_mask == 0, 0.0)
    # The reference pass goes in chunks of the update's minibatch size: its peak memory
    # (logits over the whole vocabulary) is then no more than a training pass's, and on
    # a CPU the smaller chunks stay in cache.
    chunk = max(1, len(rows) // policy.n_minibatches)
    if getattr(policy, "needs_reference", True):
        with policy._reference() as reference:
            ref = torch.cat(
                [
                    response_logprobs(
                        reference,
                        prompts[i : i + chunk],
                        response_ids[i : i + chunk],
                        response_mask[i : i + chunk],
                        temperature=policy.temperature_,
                        suppress_ids=policy._suppress_ids,
                        prompt_index=index[i : i + chunk],
                    )
                    for i in range(0, len(rows), chunk)
                ]
            )
    else:  # the KL weighs nothing (GRPO at beta = 0): no reference pass, a KL of 0
        ref = old.clone()
    values = None
    if policy.value_model_ is not None:
        values = sequence_values(
            policy.value_model_, prompts, response_ids, response_mask, prompt_index=index
        )
        values = values * response_mask
    clock.append(_now(policy.device_))
    texts = [loop.prompts[i] for i in rows]
    # Any callable is a reward; one with score_per_token pays per token.
    if callable(getattr(policy.reward_model_, "score_per_token", None)):
        token_scores = per_token_scores(policy, texts, response_ids, response_mask, ended)
    else:
        scores = score_responses(
            loop, texts, prompts, response_ids, response_mask, ended, rows=rows, parts=parts
        )
        token_scores = torch.zeros_like(old)
        last = (response_mask.sum(1) - 1).clamp(min=0)  # the EOS, or the last token
        token_scores[torch.arange(len(rows)), last] = scores
    # A per-token reward's sum is its score, so every bandit algorithm reading
    # scores or sequence_rewards optimises the total the tokens were paid.
    scores = token_scores.sum(1)
    clock.append(_now(policy.device_))
    # The KL uses the rollout-time log-probs, fixed for all epochs (Huang et al. 2024).
    kl = kl_estimate(old, ref, policy.kl_estimator) * response_mask
    beta = policy.kl_.beta_  # the coefficient from before this step's update
    in_reward = policy.kl_penalty == "reward"
    rewards = token_scores - beta * kl if in_reward else token_scores
    batch = RolloutBatch(
        prompts=prompts,
        prompt_index=torch.as_tensor(rows),
        response_ids=response_ids,
        response_mask=response_mask,
        ended=ended,
        old_logprobs=old,
        ref_logprobs=ref,
        scores=scores,
        kl=kl,
        rewards=rewards,
        beta=beta,
        kl_in_reward=in_reward,
        values=values,
        timings=dict(zip(_PHASES, np.diff(clock).tolist())),
        engine_logprobs=engine,
    )
    return batch, parts


def sampled_by_engine(response_mask: torch.Tensor) -> torch.Tensor | None:
    """The engine's log-probs of the responses just sampled, or ``None`` (the native sampler).

    Under ``set_config(generation="vllm")`` the engine keeps its own log-probs of
    the tokens it sampled (after temperature, ``vllm_engine.last_logprobs``);
    the loss never uses them, the gap metric and the truncated importance
    weights do.
    """
    engine = vllm_engine.last_logprobs().get("engine")
    if engine is None or engine.shape != response_mask.shape:
        return None
    return engine.float() * response_mask


def score_responses(
    loop, prompts, encoded, response_ids, response_mask, ended, *, rows=None, parts=None
) -> torch.Tensor:
    """The reward of each response, checked, with the missing-EOS rule applied.

    ``rows`` (the prompt of each response) picks the prompt table's column values
    the reward receives; for several rewards, each one's values go into the dict
    ``parts`` by name.
    """
    policy = loop.policy
    reward = policy.reward_model_
    columns = {}
    if rows is not None and loop.columns:
        columns = {name: [values[i] for i in rows] for name, values in loop.columns.items()}
    source = f"the reward model (step {policy.n_iter_ + 1})"
    if loop.scores_tokens:
        # Same vocabulary: score the ids directly, no decoding and re-encoding.
        raw = reward.score_tokens(encoded, response_ids, response_mask)
    elif isinstance(reward, WeightedRewards):
        each = reward.score_each(prompts, policy._decode(response_ids, response_mask), **columns)
        if parts is not None:
            parts.update(each)
        raw = reward.combine(each)
        source = f"the weighted rewards (step {policy.n_iter_ + 1})"
    else:
        raw = call_with_columns(
            reward, prompts, policy._decode(response_ids, response_mask), columns
        )
    checked = check_rewards(raw, len(prompts), source)
    scores = torch.as_tensor(checked, dtype=torch.float32, device=response_ids.device)
    bad = torch.nonzero(~torch.isfinite(scores)).flatten()
    if len(bad):  # finite in float64, not in the training dtype (|r| > 3.4e38)
        i = int(bad[0])
        raise ValueError(
            f"{source} returned {checked[i]:.3g} for completion {i}, which is not finite in "
            "float32, the dtype training uses; rescale the reward (normalised rewards are "
            "of order 1)."
        )
    if policy.missing_eos_reward is not None and policy._stop_ids():
        # A response with no stop token (EOS) gets a fixed reward (-1) *replacing* its
        # score, not offsetting it (Huang et al. 2024).
        scores = torch.where(ended, scores, torch.full_like(scores, policy.missing_eos_reward))
    return scores


def per_token_scores(policy, prompts, response_ids, response_mask, ended) -> torch.Tensor:
    """Per-token rewards of a reward with ``score_per_token``, checked, missing-EOS rule applied.

    The reward receives the prompts and completions as text and the response
    token ids and mask, and returns one value per response token. A response
    with no EOS gets ``missing_eos_reward`` as its *total*: the values paid
    along it stay, and its last token gets the difference, as the sequence
    score of a plain reward is replaced (Huang et al. 2024).
    """
    reward = policy.reward_model_
    completions = policy._decode(response_ids, response_mask)
    raw = reward.score_per_token(prompts, completions, response_ids, response_mask)
    source = f"the reward's score_per_token (step {policy.n_iter_ + 1})"
    checked = check_token_rewards(raw, response_mask, source)
    values = torch.as_tensor(checked, dtype=torch.float32, device=response_ids.device)
    bad = torch.nonzero(~torch.isfinite(values))
    if len(bad):  # finite in float64, not in the training dtype (|r| > 3.4e38)
        i, t = (int(v) for v in bad[0])
        raise ValueError(
            f"{source} returned {checked[i, t]:.3g} for token {t} of completion {i}, which is "
            "not finite in float32, the dtype training uses; rescale the reward."
        )
    if policy.missing_eos_reward is not None and policy._stop_ids():
        last = (response_mask.sum(1) - 1).clamp(min=0)
        rows = torch.nonzero(~ended).flatten()
        values[rows, last[rows]] += policy.missing_eos_reward - values[rows].sum(1)
    return values


# The rollout's phases, timed into history_ (seconds): sampling; the old, reference and
# value passes; the reward.
_PHASES = ("time/generation", "time/logprobs", "time/reward")


def _now(device) -> float:
    """Wall time, after the device's queued work (a CUDA synchronisation)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
