"""A step's rollout: sampling, old and reference log-probs, values, reward, KL.

:class:`Rollout` owns what it reads (the fit's :class:`~prefopt.policies.loop._view.StepView`,
its sampling engine, the prompts and their tokens, the reward, the run's random
streams) and returns a :class:`~prefopt.policies.loop._batch.RolloutBatch` that
carries everything it measured: the engine's log-probs, the phases' seconds and
the per-reward and resampling statistics (``batch.stats``).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ...backend import sequence_values, uses_bf16
from ...kl import kl_estimate
from ...rewards import WeightedRewards, call_with_columns, check_rewards, check_token_rewards
from ._batch import RolloutBatch, last_token_index
from ._dynamic import dynamic_batch
from ._episodes import episode_token_scores


class Rollout:
    """The rollouts of one fit's steps.

    Parameters
    ----------
    view : StepView
        What the step needs of the policy.
    sampler : NativeSampler or VLLMSampler
        The sampling engine (:func:`prefopt.backend.samplers.sampler_for`).
    run : RunState
        The random streams and the prompt stream (resampling draws more prompts).
    prompts : list of str
    prompt_tokens : list of list of int
        The prompts' token ids.
    reward : callable
        The reward (an online refit replaces it between steps).
    columns : dict of str to list, default=None
        The prompt table's other columns, one value per prompt, for the reward.
    scores_tokens : bool, default=False
        The reward scores the policy's token ids directly (same vocabulary).
    """

    def __init__(
        self, view, sampler, *, run, prompts, prompt_tokens, reward, columns=None,
        scores_tokens=False,
    ):  # fmt: skip
        self.view = view
        self.sampler = sampler
        self.run = run
        self.prompts = prompts
        self.prompt_tokens = prompt_tokens
        self.reward = reward
        self.columns = columns or {}
        self.scores_tokens = scores_tokens

    def __call__(self, prompt_rows: np.ndarray, *, beta: float, step: int) -> RolloutBatch:
        """Sample and score ``view.k`` responses for each prompt of ``prompt_rows``.

        ``beta`` is the KL coefficient in force (from before this step's update),
        ``step`` the step's number (for messages). With several rewards each
        one's mean and std go into ``batch.stats``; with resampling declared
        (``dynamic_sampling``) the groups whose rewards all tie are replaced
        (:func:`~prefopt.policies.loop._dynamic.dynamic_batch`).
        """
        batch, parts = self.once(prompt_rows, beta=beta, step=step)
        stats = dict(batch.stats)  # the episodes' figures, when the sampler runs episodes
        if self.view.resample_tied_groups is not None:
            batch, parts, stats = dynamic_batch(self, batch, parts, beta=beta, step=step)
        for name, values in parts.items():
            stats[f"rewards/{name}/mean"] = float(np.mean(values))
            stats[f"rewards/{name}/std"] = float(np.std(values))
        batch.stats = stats
        return batch

    def once(self, prompt_rows: np.ndarray, *, beta: float, step: int):
        """The rollouts of ``prompt_rows``, and each reward's values when there are several."""
        view = self.view
        parts: dict = {}
        rows = np.repeat(prompt_rows, view.k)
        index = torch.as_tensor(rows)  # equal values: one prompt, run once in every pass
        prompts = view.encode([self.prompt_tokens[i] for i in rows])
        clock = [_now(view.device)]
        sampled = self.sampler.sample(
            view.model,
            prompts,
            max_new_tokens=view.max_new_tokens,
            temperature=view.temperature,
            generator=self.run.generator,
            pad_token_id=view.pad_token_id,
            suppress_ids=view.suppress_ids,
            stop_ids=view.stop_ids,
            prompt_index=index,
        )
        response_ids, response_mask, ended = (
            sampled.response_ids, sampled.response_mask, sampled.ended
        )  # fmt: skip
        # Episodes (an EpisodeSampler): the passes attend to the whole transcript, and
        # every log-prob, KL and value outside the policy's own tokens is 0.
        seen = getattr(sampled, "attention_mask", None)
        attend = response_mask if seen is None else seen
        clock.append(_now(view.device))
        # The reference pass goes in chunks of the update's passes (a minibatch, or a
        # micro-batch): its peak memory (logits over the whole vocabulary) is then no more
        # than a training pass's, and on a CPU the smaller chunks stay in cache.
        chunk = view.pass_rows(len(rows))
        behaviour = getattr(sampled, "behaviour_logprobs", None)
        if (
            not sampled.full_pass
            and (
                (view.recomputes_old_logprobs and view.training_temperature == view.temperature)
                or uses_bf16(view.device)
            )
        ) or behaviour is not None:  # older weights sampled: the current ones' (proximal)
            # Old log-probs from a full forward pass identical to the training pass, so the
            # ratio is exactly 1 at the first epoch (Huang et al. 2024); in bf16 the cached
            # sampling pass differs from a full pass too much. In micro-batches, when the
            # update takes them, so that this pass is no larger than the training passes.
            part = chunk if view.micro_batch_size is not None else len(rows)
            old = view.logprobs(view.model, prompts, response_ids, attend, index, part)
            if seen is not None:
                old = old.masked_fill(response_mask == 0, 0.0)
        else:
            # The sampling pass's own log-probs (fp32, tempered, equal to a fresh forward
            # pass up to float rounding) serve the KL; no extra pass. A sampler whose
            # log-probs come from a full forward pass already (vLLM's: the engine samples,
            # the policy's own pass scores) needs none either way.
            old = sampled.logprobs.masked_fill(response_mask == 0, 0.0)
        if view.needs_reference:
            with view.reference() as reference:
                ref = view.logprobs(reference, prompts, response_ids, attend, index, chunk)
            if seen is not None:
                ref = ref.masked_fill(response_mask == 0, 0.0)
        else:  # the KL weighs nothing (GRPO at beta = 0): no reference pass, a KL of 0
            ref = old.clone()
        values = None
        if view.value_model is not None:
            values = sequence_values(
                view.value_model, prompts, response_ids, attend, prompt_index=index
            )
            values = values * response_mask
        clock.append(_now(view.device))
        texts = [self.prompts[i] for i in rows]
        # Any callable is a reward; one with score_per_token pays per token.
        if callable(getattr(self.reward, "score_per_token", None)):
            token_scores = per_token_scores(
                self.reward, view, texts, response_ids, response_mask, ended, step=step
            )
        else:
            scores = score_responses(
                self, texts, prompts, response_ids, attend, ended, rows=rows,
                parts=parts, step=step,
            )  # fmt: skip
            token_scores = torch.zeros_like(old)
            last = last_token_index(response_mask)  # the EOS, or the last token
            token_scores[torch.arange(len(rows)), last] = scores
            if seen is not None:  # each turn's reward at its last token
                token_scores = episode_token_scores(token_scores, sampled, last, view)
        # A per-token reward's sum is its score, so every bandit algorithm reading
        # scores or sequence_rewards optimises the total the tokens were paid.
        scores = token_scores.sum(1)
        clock.append(_now(view.device))
        # The KL uses the rollout-time log-probs, fixed for all epochs (Huang et al. 2024).
        kl = kl_estimate(old, ref, view.kl_estimator) * response_mask
        in_reward = view.kl_penalty == "reward"
        rewards = token_scores - beta * kl if in_reward else token_scores
        engine = sampled.engine_logprobs
        if engine is not None:
            engine = engine.float() * response_mask
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
            behaviour_logprobs=None if behaviour is None else behaviour.float() * response_mask,
            staleness=getattr(sampled, "staleness", 0),
            stats=dict(getattr(sampled, "stats", {})),
            attention_mask=seen,
        )
        return batch, parts


def score_responses(
    rollout, prompts, encoded, response_ids, response_mask, ended, *, rows=None, parts=None,
    step=None,
) -> torch.Tensor:  # fmt: skip
    """The reward of each response, checked, with the missing-EOS rule applied.

    ``rows`` (the prompt of each response) picks the prompt table's column values
    the reward receives; for several rewards, each one's values go into the dict
    ``parts`` by name.
    """
    view, reward = rollout.view, rollout.reward
    columns = {}
    if rows is not None and rollout.columns:
        columns = {name: [values[i] for i in rows] for name, values in rollout.columns.items()}
    source = f"the reward model (step {step})"
    if rollout.scores_tokens:
        # Same vocabulary: score the ids directly, no decoding and re-encoding.
        raw = reward.score_tokens(encoded, response_ids, response_mask)
    elif isinstance(reward, WeightedRewards):
        each = reward.score_each(prompts, view.decode(response_ids, response_mask), **columns)
        if parts is not None:
            parts.update(each)
        raw = reward.combine(each)
        source = f"the weighted rewards (step {step})"
    else:
        raw = call_with_columns(reward, prompts, view.decode(response_ids, response_mask), columns)
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
    if view.missing_eos_reward is not None and view.stop_ids:
        # A response with no stop token (EOS) gets a fixed reward (-1) *replacing* its
        # score, not offsetting it (Huang et al. 2024).
        scores = torch.where(ended, scores, torch.full_like(scores, view.missing_eos_reward))
    return scores


def per_token_scores(
    reward, view, prompts, response_ids, response_mask, ended, *, step=None
) -> torch.Tensor:
    """Per-token rewards of a reward with ``score_per_token``, checked, missing-EOS rule applied.

    The reward receives the prompts and completions as text and the response
    token ids and mask, and returns one value per response token. A response
    with no EOS gets ``missing_eos_reward`` as its *total*: the values paid
    along it stay, and its last token gets the difference, as the sequence
    score of a plain reward is replaced (Huang et al. 2024).
    """
    completions = view.decode(response_ids, response_mask)
    raw = reward.score_per_token(prompts, completions, response_ids, response_mask)
    source = f"the reward's score_per_token (step {step})"
    checked = check_token_rewards(raw, response_mask, source)
    values = torch.as_tensor(checked, dtype=torch.float32, device=response_ids.device)
    bad = torch.nonzero(~torch.isfinite(values))
    if len(bad):  # finite in float64, not in the training dtype (|r| > 3.4e38)
        i, t = (int(v) for v in bad[0])
        raise ValueError(
            f"{source} returned {checked[i, t]:.3g} for token {t} of completion {i}, which is "
            "not finite in float32, the dtype training uses; rescale the reward."
        )
    if view.missing_eos_reward is not None and view.stop_ids:
        last = (response_mask.sum(1) - 1).clamp(min=0)
        rows = torch.nonzero(~ended).flatten()
        values[rows, last[rows]] += view.missing_eos_reward - values[rows].sum(1)
    return values


# The rollout's phases, timed into history_ (seconds): sampling; the old, reference and
# value passes; the reward.
_PHASES = ("time/generation", "time/logprobs", "time/reward")


def _now(device) -> float:
    """Wall time, after the device's queued work (a CUDA synchronisation)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
