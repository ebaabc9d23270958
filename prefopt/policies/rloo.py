"""RLOO: REINFORCE with a leave-one-out baseline over k samples per prompt.

The whole response is one action (a bandit): its reward is the KL-shaped
sequence reward R = score - beta * sum_t kl_t, the baseline of sample i is the
mean reward of the other k - 1 samples of the same prompt, and the loss is
-(R_i - b_i) * sum_t log pi(y_t). No ratio, no clipping, no std division.
"""

from __future__ import annotations

from numbers import Integral

import torch

from ..validation import Interval
from ._base import BasePolicy, make_init
from ._docs import fill

__all__ = ["RLOOPolicy", "leave_one_out_advantages"]


def leave_one_out_advantages(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """R_i - mean of the other k - 1 rewards of the same prompt.

    ``rewards`` holds the k samples of each prompt together. The result equals
    k/(k-1) * (R_i - group mean) and sums to 0 within each group.

    Examples
    --------
    >>> import torch
    >>> leave_one_out_advantages(torch.tensor([1.0, 3.0, 0.0, 4.0]), k=2).tolist()
    [-2.0, 2.0, -4.0, 4.0]
    """
    if k < 2:
        raise ValueError(f"RLOO needs k >= 2 samples per prompt; got k={k}.")
    if rewards.shape[0] % k:
        raise ValueError(f"{rewards.shape[0]} rewards do not split into groups of k={k}.")
    grouped = rewards.reshape(-1, k)
    baseline = (grouped.sum(1, keepdim=True) - grouped) / (k - 1)
    return (grouped - baseline).reshape(-1)


def sequence_policy_gradient_loss(
    advantages: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """-mean_i A_i * sum_t log pi(y_{i,t}): the REINFORCE loss on whole sequences.

    Token log-probs are summed, not averaged (Ahmadian et al. 2024 treat the
    whole response as one action), so long and short responses get the weight
    of their sequence probability.

    Parameters
    ----------
    advantages : torch.Tensor of shape (n,)
        One advantage per response.
    logprobs : torch.Tensor of shape (n, length)
        Per-token log-probs under the current policy.
    mask : torch.Tensor of shape (n, length)
        Response mask.

    Returns
    -------
    loss : torch.Tensor

    Examples
    --------
    >>> import torch
    >>> sequence_policy_gradient_loss(torch.tensor([1.0]), torch.tensor([[-1.0, -2.0]]),
    ...                               torch.tensor([[1, 0]]))
    tensor(1.)
    """
    return -(advantages * (logprobs * mask).sum(1)).mean()


class RLOOPolicy(BasePolicy):
    """REINFORCE Leave-One-Out (Ahmadian et al., 2024).

    Parameters
    ----------
    {common_parameters}
    k : int, default=4
        Samples per prompt (``batch_size / k`` prompts per step).

    Attributes
    ----------
    {common_attributes}

    See Also
    --------
    ReinforcePolicy, PPOPolicy, RAFTPolicy

    Notes
    -----
    ``n_epochs`` defaults to 1 (2 minibatches): with no ratio the estimator is
    on-policy, so each batch is used once (Ahmadian et al. 2024); PPO's
    clipped ratio is what lets it reuse a batch for 4 epochs.

    ``batch_size=256`` (64 prompts a step, as many as the single-sample
    policies' default 64 episodes): with the default adaptive rate, a batch
    of 64 (16 prompts; the default until issue 35) learns ArithmeticWorld
    barely or not at all (held-out pass@1 0.331 -> 0.340 after 300 steps,
    mean of five seeds, two of them at or below the start), a batch of 256
    does (0.391-0.399 on every seed; Llama's shape 0.149 -> 0.178;
    ``benchmarks/defaults_5seeds.py``):
    each update's policy change is held near a fixed target, so the
    gradient's noise, which a larger batch averages away, decides how much
    of that change is learning (``GRPOPolicy``'s Notes).

    For k = 2 the loss is the contrastive objective
    1/2 (R(y+) - R(y-)) (log pi(y+) - log pi(y-)), maximised.

    References
    ----------
    A. Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization
    for Learning from Human Feedback in LLMs", ACL 2024.

    Examples
    --------
    >>> import prefopt
    >>> from prefopt import RLOOPolicy, RewardModel
    >>> from prefopt.worlds import PreferenceWorld
    >>> prefopt.set_config(show_progress_bar=False)
    >>> world = PreferenceWorld(random_state=0)
    >>> rm = RewardModel().fit(world.comparisons(1000, random_state=0))
    >>> rloo = RLOOPolicy(model=world.policy_model(), beta=0.3, k=4, learning_rate=0.3,
    ...                   optimizer="sgd", n_steps=5, random_state=0).fit(world.prompts, rm)
    >>> rloo.history_[-1]["step"]
    5
    """

    _parameter_constraints = {
        **BasePolicy._parameter_constraints,
        "k": [Interval(Integral, 2, None, closed="left")],
    }

    # Only what this algorithm changes of the common parameters (policies/_params.py)
    # and its own parameters; make_init writes the explicit keyword-only signature.
    __init__ = make_init(batch_size=256, n_minibatches=2, k=4)

    samples_per_prompt = "k"
    tiny_model_learning_rate = 1e-4  # learning_rate=None on a tiny model: LR_SWEEP.md, rule 2
    loss_reduction = "sequence_mean"  # sequence_policy_gradient_loss: a mean over the rows

    def compute_advantages(self, batch):
        """Leave-one-out advantages of the KL-shaped sequence rewards.

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts, k samples per prompt together.

        Returns
        -------
        advantages : torch.Tensor of shape (n,)
        """
        return leave_one_out_advantages(batch.sequence_rewards, self.k)

    def compute_loss(self, batch, minibatch):
        """The REINFORCE loss on whole sequences.

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts.
        minibatch : Minibatch
            The rows and the current policy's log-probs.

        Returns
        -------
        loss : torch.Tensor
        stats : dict
        """
        loss = sequence_policy_gradient_loss(
            minibatch.advantages, minibatch.logprobs, minibatch.mask
        )
        return loss, {"loss/policy": loss.item()}


RLOOPolicy.__doc__ = fill(RLOOPolicy)
