"""The passes of one step: the rollout (sampling, reference, values, reward, KL) and the update.

The loop in ``_base.py`` calls these once per step; they read the policy's fitted
state and its algorithm's declarations (``kl_penalty``, ``uses_ratio``,
``training_temperature``) and call its ``compute_loss``.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..backend import gradient_step, response_logprobs, sequence_values, uses_bf16
from ..backend._shared_prompts import is_transformers_model
from ..kl import kl_estimate
from ..rewards import check_rewards, check_token_rewards
from ._batch import Minibatch, RolloutBatch, masked_mean, minibatch_order


def sample_and_score(policy, prompt_rows: np.ndarray) -> RolloutBatch:
    """One step's rollouts: sample, old and reference log-probs, values, scores, KL, rewards."""
    rows = np.repeat(prompt_rows, policy._samples_per_prompt())
    index = torch.as_tensor(rows)  # equal values: one prompt, run once in every pass
    prompts = policy._encode([policy._prompt_tokens[i] for i in rows])
    clock = [_now(policy.device_)]
    response_ids, response_mask, ended, sampled = policy._generate(
        prompts, policy._run.generator, return_logprobs=True, prompt_index=index
    )
    clock.append(_now(policy.device_))
    if (policy.uses_ratio and policy._training_temperature() == policy.temperature_) or (
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
    # a CPU the smaller chunks stay in cache (2 x 32 rows: 12% faster than 64).
    chunk = max(1, len(rows) // policy.n_minibatches)
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
    values = None
    if policy.value_model_ is not None:
        values = sequence_values(
            policy.value_model_, prompts, response_ids, response_mask, prompt_index=index
        )
        values = values * response_mask
    clock.append(_now(policy.device_))
    texts = [policy._prompts[i] for i in rows]
    if callable(getattr(policy.reward_model_, "score_per_token", None)):  # pays per token
        token_scores = per_token_scores(policy, texts, response_ids, response_mask, ended)
    else:
        scores = score_responses(policy, texts, prompts, response_ids, response_mask, ended)
        token_scores = torch.zeros_like(old)
        last = (response_mask.sum(1) - 1).clamp(min=0)  # the EOS, or the last token
        token_scores[torch.arange(len(rows)), last] = scores
    # A per-token reward's sum is its score, so every bandit algorithm reading
    # scores or sequence_rewards optimises the total the tokens were paid.
    scores = token_scores.sum(1)
    clock.append(_now(policy.device_))
    policy._phase_seconds = dict(zip(_PHASES, np.diff(clock).tolist()))
    # The KL uses the rollout-time log-probs, fixed for all epochs (Huang et al. 2024).
    kl = kl_estimate(old, ref, policy.kl_estimator) * response_mask
    beta = policy.kl_.beta_  # the coefficient from before this step's update
    in_reward = policy.kl_penalty == "reward"
    rewards = token_scores - beta * kl if in_reward else token_scores
    return RolloutBatch(
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
    )


def score_responses(policy, prompts, encoded, response_ids, response_mask, ended) -> torch.Tensor:
    """The reward of each response, checked, with the missing-EOS rule applied."""
    reward = policy.reward_model_
    if policy._scores_tokens:
        # Same vocabulary: score the ids directly, no decoding and re-encoding.
        raw = reward.score_tokens(encoded, response_ids, response_mask)
    else:
        raw = reward(prompts, policy._decode(response_ids, response_mask))
    source = f"the reward model (step {policy.n_iter_ + 1})"
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


def update(policy, batch: RolloutBatch) -> dict:
    """``n_epochs`` passes of ``n_minibatches`` gradient steps on the algorithm's loss.

    To every minibatch's loss the loop adds, for any algorithm, the entropy
    bonus ``-entropy_coef * H`` (the masked mean per-token entropy, with
    gradients) and the pretraining term ``ptx_coef * CE`` (next-token
    cross-entropy on a minibatch of ``ptx_data``, Ouyang et al. 2022's PPO-ptx).
    """
    n = len(batch)
    size = max(1, n // policy.n_minibatches)
    temperature = policy._training_temperature()
    entropy_coef = float(policy.entropy_coef)
    ptx = getattr(policy, "_ptx_tokens", None) if policy.ptx_coef > 0 else None
    totals: dict[str, float] = {}
    count = 0
    entropies = []
    started = _now(policy.device_)
    for _ in range(policy.n_epochs):
        # Whole groups of a prompt's samples in a minibatch, so that a transformers model
        # runs each prompt once for its group (one sample a prompt: a shuffle of the rows).
        perm = minibatch_order(
            batch.prompt_index, policy._run.generator, is_transformers_model(policy.model_)
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
            loss, stats = policy.compute_loss(batch, minibatch)
            stats = dict(stats)
            mean_entropy = masked_mean(entropy, minibatch.mask)
            if entropy_coef > 0:
                bonus = entropy_coef * mean_entropy
                loss = loss - bonus
                stats["loss/entropy_bonus"] = bonus.item()
            if ptx is not None:
                ptx_loss = pretraining_loss(policy, ptx, len(rows))
                loss = loss + policy.ptx_coef * ptx_loss
                stats["loss/ptx"] = ptx_loss.item()
            gradient_step(
                policy._run.optimizer,
                loss,
                who=type(policy).__name__,
                step=policy.n_iter_ + 1,
                max_grad_norm=policy.max_grad_norm,
            )
            entropies.append(float(mean_entropy.detach()))
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + float(value)
            count += 1
    out = {key: value / count for key, value in totals.items()}
    out["policy/entropy"] = float(np.mean(entropies))
    out["time/update"] = _now(policy.device_) - started
    return {**out, **getattr(policy, "_phase_seconds", {})}


# The rollout's phases, timed into history_ (seconds): sampling; the old, reference and
# value passes; the reward.
_PHASES = ("time/generation", "time/logprobs", "time/reward")


def _now(device) -> float:
    """Wall time, after the device's queued work (a CUDA synchronisation)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def pretraining_loss(policy, texts, n: int) -> torch.Tensor:
    """Next-token cross-entropy of the policy on ``n`` pretraining texts drawn at random.

    ``texts`` is what :meth:`BasePolicy._tokenize_ptx` made of ``ptx_data`` once
    per fit: ``(context, continuation)`` token lists, the context being the
    tokenizer's BOS prefix or the text's first token. The rows are drawn with
    replacement from the run's generator; the loss is the mean over their
    predicted tokens, at temperature 1 (the pretraining distribution itself).
    """
    picks = torch.randint(len(texts), (n,), generator=policy._run.generator).tolist()
    contexts = policy._encode([texts[i][0] for i in picks])
    ids, mask = policy._pad_responses([texts[i][1] for i in picks])
    logprobs = response_logprobs(
        policy.model_, contexts, ids, mask, temperature=1.0, suppress_ids=policy._suppress_ids
    )
    return -masked_mean(logprobs, mask)
