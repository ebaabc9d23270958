"""The rollout batch every algorithm reads, and masked statistics over it."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..backend import EncodedPrompts


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Whiten ``x`` over masked positions with the population variance.

    With ``shift_mean=False`` the mean is added back (reward whitening keeps the
    mean; implementation details 9-11). Padded positions are returned as 0.

    Examples
    --------
    >>> import torch
    >>> masked_whiten(torch.tensor([[1.0, 3.0, 100.0]]), torch.tensor([[1, 1, 0]]))
    tensor([[-1.,  1.,  0.]])
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


@dataclass
class RolloutBatch:
    """Everything one step's rollouts produced; every algorithm reads the same batch.

    Attributes
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
        Reward-model scores (a missing EOS replaced by ``missing_eos_reward``).
    kl : torch.Tensor of shape (n, max_new_tokens)
        Per-token KL estimate, 0 outside the mask.
    rewards : torch.Tensor of shape (n, max_new_tokens)
        Shaped per-token reward: -beta * kl, plus the score at the last token.
    values : torch.Tensor or None
        V(s_t) under the value model at sampling time (PPO).
    advantages, returns : torch.Tensor or None
        Filled by the algorithm.
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
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.response_ids.shape[0]

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
            return value

        return RolloutBatch(**{f.name: copy(getattr(self, f.name)) for f in fields(self)})

    @property
    def sequence_rewards(self) -> torch.Tensor:
        """The KL-shaped sequence reward R(x, y) = score - beta * sum_t kl_t."""
        return self.scores - self.beta * self.kl.sum(1)

    @property
    def last_index(self) -> torch.Tensor:
        """Index of each response's last valid token (its EOS when it has one)."""
        return (self.response_mask.sum(1) - 1).clamp(min=0)
