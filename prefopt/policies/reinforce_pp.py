"""REINFORCE++: per-token KL-shaped returns, normalised over the whole batch, PPO's clip.

Hu 2025 ("REINFORCE++: A Simple and Efficient Approach for Aligning Large
Language Models"). No critic and no group baseline: the return of a token is the
sum of the rewards from it to the end of the response (the score at the last
token, -beta * KL at every token), and the advantages are these returns
whitened over every response token of the batch, a global normalisation that
the author argues is more stable than a per-prompt (GRPO) one.
"""

from __future__ import annotations

from numbers import Integral, Real

import torch

from ..validation import Interval
from ._base import BasePolicy, make_init
from ._docs import fill
from ._group import clipped_surrogate
from .loop import Minibatch, RolloutBatch, masked_mean, masked_whiten

__all__ = ["ReinforcePlusPlusPolicy", "reinforce_pp_advantages"]


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    scores: torch.Tensor | None = None,
    k: int = 1,
    *,
    across_ranks: bool = False,
) -> torch.Tensor:
    """REINFORCE++'s advantages: returns G_t = sum_{s >= t} r_s, whitened over the batch.

    With ``k > 1`` samples per prompt the group's mean score is first taken
    from each sample's last-token reward (the "REINFORCE++-baseline" variant
    of Hu 2025, v2); the KL terms stay. Whitening: (G - mean) / std over every
    response token of the batch (population std, over all ranks in a
    distributed fit), 0 outside the mask.

    Parameters
    ----------
    rewards : torch.Tensor of shape (n, length)
        Per-token rewards (``batch.rewards``: the score at the last token minus
        beta * KL at every token).
    mask : torch.Tensor of shape (n, length)
    scores : torch.Tensor of shape (n,), default=None
        The scores, for the group baseline (``k > 1``).
    across_ranks : bool, default=False
        Whiten over every rank's tokens in a distributed fit.
    k : int, default=1
        Samples per prompt, each prompt's together.

    Returns
    -------
    advantages : torch.Tensor of shape (n, length)

    Examples
    --------
    >>> import torch
    >>> r = torch.tensor([[0.0, 1.0], [0.0, 3.0]])   # scores 1 and 3 at the last tokens
    >>> m = torch.ones(2, 2)
    >>> [round(a, 4) for a in reinforce_pp_advantages(r, m).flatten().tolist()]  # G = 1,1,3,3
    [-1.0, -1.0, 1.0, 1.0]
    """
    mask = mask.to(rewards.dtype)
    rewards = rewards * mask
    if k > 1:
        last = (mask.sum(1) - 1).clamp(min=0).long()
        baseline = scores.reshape(-1, k).mean(1, keepdim=True).expand(-1, k).reshape(-1)
        rewards = rewards.clone()
        rewards[torch.arange(rewards.shape[0]), last] -= baseline.to(rewards.dtype)
    returns = torch.flip(torch.cumsum(torch.flip(rewards, [1]), 1), [1]) * mask
    return masked_whiten(returns, mask, across_ranks=across_ranks)


class ReinforcePlusPlusPolicy(BasePolicy):
    """REINFORCE++ (Hu 2025): KL-shaped token returns, batch-normalised, with PPO's clip.

    Per step: sample ``k`` responses per prompt (one by default), shape the
    reward with -beta * KL per token (Ziegler et al. 2019's k1), give each
    token the return G_t = sum_{s >= t} r_s, whiten the returns over the whole
    batch's tokens, A = (G - mean) / std, and minimise the token mean of
    -min(rho A, clip(rho, 1 - eps, 1 + eps) A), rho = pi/pi_old.

    Parameters
    ----------
    {common_parameters}
    k : int, default=1
        Samples per prompt. With k > 1 each score first loses its group's
        mean (REINFORCE++-baseline, Hu 2025 v2), the KL terms kept.
    clip_coef : float, default=0.2
        Epsilon of the clipped ratio, in (0, 1) (PPO's; Hu 2025 uses 0.2).

    Attributes
    ----------
    {common_attributes}

    See Also
    --------
    GRPOPolicy, ReinforcePolicy, PPOPolicy

    Notes
    -----
    The normalisation is global: the mean and std are over every response
    token of the step's batch, not a prompt's group (GRPO) or a running
    baseline (:class:`ReinforcePolicy`). ``history_`` adds ``loss/policy``,
    ``policy/clipfrac`` and ``policy/approxkl``. With one gradient step per
    batch (``n_epochs=1``, ``n_minibatches=1``) the ratio is 1 and the clip
    never binds.

    References
    ----------
    J. Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models", arXiv:2501.03262, 2025.

    Examples
    --------
    >>> import prefopt
    >>> from prefopt import ReinforcePlusPlusPolicy
    >>> from prefopt.worlds import PreferenceWorld
    >>> prefopt.set_config(show_progress_bar=False)
    >>> world = PreferenceWorld(random_state=0)
    >>> pp = ReinforcePlusPlusPolicy(model=world.policy_model(), beta=0.1, learning_rate=0.3,
    ...                              optimizer="sgd", n_steps=2, random_state=0)
    >>> pp.fit(world.prompts, world.true_quality).history_[-1]["step"]
    2
    """

    _parameter_constraints = {
        **BasePolicy._parameter_constraints,
        "k": [Interval(Integral, 1, None, closed="left")],
        # 1 - clip_coef is the ratio's lower bound: at 1 or more, clipping below never acts.
        "clip_coef": [Interval(Real, 0, 1, closed="neither")],
    }

    samples_per_prompt = "k"
    tiny_model_learning_rate = 3e-4  # learning_rate=None on a tiny model: LR_SWEEP.md, rule 2
    kl_penalty = "reward"
    loss_reduction = "token_mean"  # the surrogate's mean over the response tokens

    @property
    def uses_ratio(self) -> bool:
        """Whether the loss needs old log-probs from a separate pass (several gradient steps)."""
        return self.n_epochs > 1 or self.n_minibatches > 1

    # Only what this algorithm changes of the common parameters (policies/_params.py)
    # and its own parameters; make_init writes the explicit keyword-only signature.
    __init__ = make_init(beta=0.01, k=1, clip_coef=0.2)

    def compute_advantages(self, batch: RolloutBatch):
        """Per-token returns of the KL-shaped rewards, whitened over the batch.

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts.

        Returns
        -------
        advantages : torch.Tensor of shape (n, length)
        """
        return reinforce_pp_advantages(
            batch.rewards, batch.response_mask, batch.scores, self.k, across_ranks=True
        )

    def compute_loss(self, batch: RolloutBatch, minibatch: Minibatch):
        """The token mean of PPO's clipped surrogate on the whitened returns.

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts, with advantages.
        minibatch : Minibatch
            The rows and the current policy's log-probs.

        Returns
        -------
        loss : torch.Tensor
        stats : dict
        """
        mask, logprobs = minibatch.mask, minibatch.logprobs
        old = minibatch.old_logprobs if self.uses_ratio else logprobs.detach()
        surrogate, unclipped, clipped = clipped_surrogate(
            logprobs - old, minibatch.advantages, self.clip_coef, self.clip_coef
        )
        loss = masked_mean(surrogate, mask, across_ranks=True)
        log_ratio = (logprobs - old).detach()
        return loss, {
            "loss/policy": loss.item(),
            "policy/clipfrac": masked_mean(
                (clipped < unclipped).float(), mask, across_ranks=True
            ).item(),
            "policy/approxkl": 0.5 * masked_mean(log_ratio**2, mask, across_ranks=True).item(),
        }


ReinforcePlusPlusPolicy.__doc__ = fill(ReinforcePlusPlusPolicy)
