"""The rollout batch every algorithm reads, and masked statistics over it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...backend import EncodedPrompts, distributed


def masked_mean(x: torch.Tensor, mask: torch.Tensor, *, across_ranks: bool = False) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (over all ranks with ``across_ranks``).

    A loss says ``across_ranks=True``: in a distributed fit a token-mean loss (and
    the whitening built on this) is then normalised by the global token count;
    see :func:`prefopt.backend.distributed.masked_mean`. In one process the flag
    changes nothing.

    Parameters
    ----------
    x : torch.Tensor
        Values.
    mask : torch.Tensor
        1 where a value counts.
    across_ranks : bool, default=False
        Over every rank's positions in a distributed fit (a collective: every
        rank calls it at the same point).

    Returns
    -------
    mean : torch.Tensor
        A scalar; 0 when the mask is empty.

    Examples
    --------
    >>> import torch
    >>> masked_mean(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1, 1, 0]))
    tensor(2.)
    """
    return distributed.masked_mean(x, mask, across_ranks=across_ranks)


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    *,
    across_ranks: bool = False,
) -> torch.Tensor:
    """Whiten ``x`` over masked positions with the population variance.

    With ``shift_mean=False`` the mean is added back (reward whitening keeps the
    mean, as the original code of Ziegler et al. 2019). Padded positions are
    returned as 0.

    Parameters
    ----------
    x : torch.Tensor
        Values.
    mask : torch.Tensor
        1 where a value counts.
    shift_mean : bool, default=True
        Subtract the mean (``False`` keeps it).
    eps : float, default=1e-8
        Added to the variance.
    across_ranks : bool, default=False
        Mean and variance over every rank's positions in a distributed fit.

    Returns
    -------
    whitened : torch.Tensor

    Examples
    --------
    >>> import torch
    >>> masked_whiten(torch.tensor([[1.0, 3.0, 100.0]]), torch.tensor([[1, 1, 0]]))
    tensor([[-1.,  1.,  0.]])
    """
    mean = masked_mean(x, mask, across_ranks=across_ranks)
    var = masked_mean((x - mean) ** 2, mask, across_ranks=across_ranks)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last position of each row where ``mask`` is 1 (0 for an empty row).

    For a mask that is a prefix of ones this is its sum minus one; in an
    episode's mask (the policy's turns, with the environment's tokens between
    them) it is the policy's last token.

    Parameters
    ----------
    mask : torch.Tensor of shape (n, length)

    Returns
    -------
    index : torch.Tensor of shape (n,), long

    Examples
    --------
    >>> import torch
    >>> last_token_index(torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]])).tolist()
    [1, 2, 0]
    """
    positions = torch.arange(mask.shape[1], device=mask.device).expand(mask.shape)
    return (positions * (mask != 0)).amax(1) if mask.shape[1] else mask.sum(1).long()


def minibatch_order(
    prompt_index: torch.Tensor, generator: torch.Generator, grouped: bool = True
) -> torch.Tensor:
    """A random order of a batch's rows; with ``grouped``, each prompt's samples stay together.

    The groups are the runs of equal ``prompt_index`` (the k samples of a prompt sit
    together), shuffled with one ``randperm`` over the groups; when no two neighbouring
    rows share a prompt this is ``torch.randperm(n, generator=generator)``, draw for draw.

    Parameters
    ----------
    prompt_index : torch.Tensor of shape (n,)
    generator : torch.Generator
    grouped : bool, default=True
        ``False`` shuffles the rows.

    Returns
    -------
    order : torch.Tensor of shape (n,), long

    Examples
    --------
    >>> import torch
    >>> order = minibatch_order(torch.tensor([4, 4, 9, 9, 9]), torch.Generator().manual_seed(0))
    >>> order.tolist() in ([0, 1, 2, 3, 4], [2, 3, 4, 0, 1])
    True
    """
    n = prompt_index.shape[0]
    if not grouped:
        return torch.randperm(n, generator=generator)
    index = prompt_index.cpu()
    starts = torch.ones(n, dtype=torch.bool)
    starts[1:] = index[1:] != index[:-1]
    group = starts.long().cumsum(0) - 1
    order = torch.randperm(int(group[-1]) + 1, generator=generator) if n else group
    # Rows of the shuffled groups, each group's rows in their order.
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.shape[0])
    return torch.sort(rank[group] * n + torch.arange(n)).indices


@dataclass
class RolloutBatch:
    """Everything one step's rollouts produced; every algorithm reads the same batch.

    Parameters
    ----------
    prompts : EncodedPrompts
        Left-padded prompt ids and mask, one row per sample.
    prompt_index : torch.Tensor of shape (n,)
        Index of each sample's prompt; the k samples of a prompt sit together.
    response_ids, response_mask : torch.Tensor of shape (n, max_new_tokens)
        Responses truncated after the first EOS, and the mask up to and
        including it.
    ended : torch.Tensor of bool, shape (n,)
        Whether each response contains an EOS.
    old_logprobs, ref_logprobs : torch.Tensor of shape (n, max_new_tokens)
        Per-token log-probs under the sampling policy and the reference.
    scores : torch.Tensor of shape (n,)
        Reward-model scores (a missing EOS replaced by ``missing_eos_reward``);
        for a reward paid per token, the sum of its per-token values.
    kl : torch.Tensor of shape (n, max_new_tokens)
        Per-token KL estimate, 0 outside the mask.
    rewards : torch.Tensor of shape (n, max_new_tokens)
        Per-token reward: the score at the last token (a per-token reward's
        values at their tokens), plus -beta * kl at every token when the
        algorithm puts the KL in the reward.
    beta : float
        The KL coefficient in force when the batch was sampled.
    kl_in_reward : bool
        Whether -beta * kl is part of ``rewards`` (the algorithm's ``kl_penalty``).
    values : torch.Tensor or None
        V(s_t) under the value model at sampling time (PPO).
    advantages, returns : torch.Tensor or None
        What the algorithm's ``compute_advantages`` returned.
    timings : dict of str to float
        Seconds of the rollout's phases (``time/generation``, ``time/logprobs``:
        the old, reference and value passes, ``time/reward``), which the step's
        ``history_`` row reports.
    engine_logprobs : torch.Tensor of shape (n, max_new_tokens) or None
        Per-token log-probs of the sampled tokens under the sampling engine
        (``set_config(generation="vllm")``), 0 outside the mask; ``None`` with
        the native sampler, which samples from the policy itself. The loss
        never reads them: the step logs their gap to ``old_logprobs``, and
        ``vllm_importance_sampling_cap`` weighs the gradient with them.
    stats : dict of str to float
        What the rollout measured besides the tensors, for the step's
        ``history_`` row: each reward's mean and std when there are several
        (``rewards/<name>/mean``), the resampling counts (``sampling/...``) and
        the episodes' figures (``episode/...``, ``tools/...``).
    behaviour_logprobs : torch.Tensor of shape (n, max_new_tokens) or None
        Overlapped rollouts (``max_staleness``): the log-probs of the policy that
        sampled (the behaviour policy, up to ``staleness`` updates old), 0
        outside the mask; ``old_logprobs`` are then the current (proximal)
        policy's, and the loss weighs each token by their ratio
        (``policies/loop/_overlap.py``). ``None`` in a synchronous fit.
    staleness : int
        Updates between the weights that sampled the batch and those it trains.
    attention_mask : torch.Tensor of shape (n, length) or None
        Multi-turn episodes (an ``environment`` or ``tools``): 1 on every token
        of the transcript after the prompt, the policy's and the environment's,
        which the forward passes attend to; ``response_mask`` is then 1 on the
        policy's own tokens only, so every loss, KL, entropy bonus and value
        target reads those alone. ``None``: one response a row, whose mask is
        both.
    """

    prompts: EncodedPrompts
    prompt_index: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    ended: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    scores: torch.Tensor
    kl: torch.Tensor
    rewards: torch.Tensor
    beta: float
    kl_in_reward: bool = True
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    timings: dict = field(default_factory=dict)
    engine_logprobs: torch.Tensor | None = None
    stats: dict = field(default_factory=dict)
    behaviour_logprobs: torch.Tensor | None = None
    staleness: int = 0
    attention_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def seen_mask(self) -> torch.Tensor:
        """The tokens a forward pass attends to: ``attention_mask``, else ``response_mask``."""
        return self.response_mask if self.attention_mask is None else self.attention_mask

    def clone(self) -> RolloutBatch:
        """A copy whose tensors are ordinary ones.

        Rollouts run under ``torch.inference_mode`` (cheaper than ``no_grad``), whose
        tensors cannot take part in a gradient computation; cloned outside it, they can.
        """

        def copy(value):
            if isinstance(value, torch.Tensor):
                return value.clone()
            if isinstance(value, EncodedPrompts):
                return EncodedPrompts(value.input_ids.clone(), value.attention_mask.clone())
            if isinstance(value, dict):
                return dict(value)
            return value

        return RolloutBatch(**{name: copy(value) for name, value in vars(self).items()})

    @property
    def sequence_rewards(self) -> torch.Tensor:
        """The sequence reward the algorithm optimises: ``rewards`` summed over the response.

        score - beta * sum_t kl_t when the KL is in the reward, the score alone
        when it is in the loss; for a reward paid per token the score is the sum
        of its per-token values, so a bandit algorithm optimises their total.
        """
        if self.kl_in_reward:
            return self.scores - self.beta * self.kl.sum(1)
        return self.scores

    @property
    def rlhf_rewards(self) -> torch.Tensor:
        """The KL-regularised objective of each sample, score - beta * sum_t kl_t."""
        return self.scores - self.beta * self.kl.sum(1)

    @property
    def last_index(self) -> torch.Tensor:
        """Index of each response's last valid token (its EOS when it has one).

        In an episode, the policy's last token (the environment's tokens may follow).
        """
        return last_token_index(self.response_mask)


@dataclass
class Minibatch:
    """One minibatch of a step's rollouts with the current policy's outputs on it.

    What an algorithm's ``compute_loss`` receives. The rollout-time tensors of
    the minibatch's rows are read through properties.

    Parameters
    ----------
    batch : RolloutBatch
        The whole step's rollouts.
    rows : torch.Tensor of shape (m,)
        Which rows of ``batch`` this minibatch holds.
    logprobs : torch.Tensor of shape (m, max_new_tokens)
        Per-token log-probs of the responses under the current policy, with
        gradients, at the algorithm's ``training_temperature``.
    entropy : torch.Tensor of shape (m, max_new_tokens)
        Per-token entropy of the current policy at the training temperature;
        with gradients only when ``entropy_coef > 0`` (the loop adds the bonus).
    values : torch.Tensor or None
        The value model's current predictions, with gradients (PPO).
    """

    batch: RolloutBatch
    rows: torch.Tensor
    logprobs: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.rows.shape[0]

    @property
    def mask(self) -> torch.Tensor:
        """Response mask of the rows."""
        return self.batch.response_mask[self.rows]

    @property
    def advantages(self) -> torch.Tensor:
        """Advantages of the rows, as ``compute_advantages`` returned them."""
        return self.batch.advantages[self.rows]

    @property
    def returns(self) -> torch.Tensor:
        """Value targets of the rows (algorithms with a value model)."""
        return self.batch.returns[self.rows]

    @property
    def old_logprobs(self) -> torch.Tensor:
        """Rollout-time log-probs of the rows (the denominator of the ratio)."""
        return self.batch.old_logprobs[self.rows]

    @property
    def ref_logprobs(self) -> torch.Tensor:
        """Reference log-probs of the rows."""
        return self.batch.ref_logprobs[self.rows]

    @property
    def engine_logprobs(self) -> torch.Tensor | None:
        """The sampling engine's log-probs of the rows; ``None`` with the native sampler."""
        engine = self.batch.engine_logprobs
        return None if engine is None else engine[self.rows]

    @property
    def old_values(self) -> torch.Tensor:
        """Rollout-time values of the rows."""
        return self.batch.values[self.rows]
