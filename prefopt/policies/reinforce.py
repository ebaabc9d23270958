"""REINFORCE with a moving-average baseline (Ahmadian et al., 2024, eq. 8).

The baseline is the mean KL-shaped reward of all *earlier* batches; the current
batch's rewards join it only after the update (Ahmadian et al. 2024), so the
estimator stays unbiased. At the first step there is no earlier reward and the
baseline is 0.
"""

from __future__ import annotations

import torch

from ..backend import distributed
from ._base import BasePolicy, make_init
from ._docs import fill
from .rloo import sequence_policy_gradient_loss

__all__ = ["ReinforcePolicy", "MovingAverageBaseline"]


class MovingAverageBaseline:
    """Running mean of all rewards seen so far, excluding the ones being scored.

    Examples
    --------
    >>> b = MovingAverageBaseline()
    >>> b.value
    0.0
    >>> b.add([1.0, 3.0]); b.value
    2.0
    >>> b.add([5.0]); b.value
    3.0
    """

    def __init__(self):
        self.total = 0.0
        self.count = 0

    def state_dict(self) -> dict:
        """The running sum and count, for checkpoints.

        Returns
        -------
        state : dict
        """
        return {"total": self.total, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output.

        Parameters
        ----------
        state : dict
            From :meth:`state_dict`.
        """
        self.total, self.count = float(state["total"]), int(state["count"])

    @property
    def value(self) -> float:
        return self.total / self.count if self.count else 0.0

    def add(self, rewards) -> None:
        rewards = torch.as_tensor(rewards, dtype=torch.float64)
        self.total += float(rewards.sum())
        self.count += int(rewards.numel())


class ReinforcePolicy(BasePolicy):
    """REINFORCE on whole responses with a moving-average baseline.

    One sample per prompt; advantage R - b_MA with b_MA the mean of all earlier
    KL-shaped rewards; loss -(R - b_MA) * sum_t log pi(y_t).

    Parameters
    ----------
    {common_parameters}

    Attributes
    ----------
    {common_attributes}
    baseline_ : MovingAverageBaseline
        The running baseline after the last step.

    See Also
    --------
    RLOOPolicy, PPOPolicy

    Notes
    -----
    ``n_epochs`` defaults to 1 (2 minibatches): with no ratio the estimator is
    on-policy, so each batch is used once (Ahmadian et al. 2024).

    References
    ----------
    R. J. Williams, "Simple statistical gradient-following algorithms for
    connectionist reinforcement learning", Machine Learning, 1992.
    A. Ahmadian et al., "Back to Basics", ACL 2024.

    Examples
    --------
    >>> import prefopt
    >>> from prefopt import ReinforcePolicy, RewardModel
    >>> from prefopt.worlds import PreferenceWorld
    >>> prefopt.set_config(show_progress_bar=False)
    >>> world = PreferenceWorld(random_state=0)
    >>> rm = RewardModel().fit(world.comparisons(1000, random_state=0))
    >>> pg = ReinforcePolicy(model=world.policy_model(), beta=0.3, learning_rate=0.3,
    ...                      optimizer="sgd", n_steps=3, random_state=0).fit(world.prompts, rm)
    >>> pg.baseline_.count
    192
    """

    tiny_model_learning_rate = 3e-4  # learning_rate=None on a tiny model: LR_SWEEP.md, rule 2
    loss_reduction = "sequence_mean"  # sequence_policy_gradient_loss: a mean over the rows

    # Only what this algorithm changes of the common parameters (policies/_params.py)
    # and its own parameters; make_init writes the explicit keyword-only signature.
    __init__ = make_init(n_minibatches=2)

    def _setup(self, reward, start_model, *, seed: int) -> str | None:
        start_key = super()._setup(reward, start_model, seed=seed)
        self.baseline_ = MovingAverageBaseline()
        return start_key

    def compute_advantages(self, batch):
        """The KL-shaped sequence reward minus the mean of all earlier ones.

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts.

        Returns
        -------
        advantages : torch.Tensor of shape (n,)
        """
        return batch.sequence_rewards - self.baseline_.value

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
        return loss, {"loss/policy": loss.item(), "policy/baseline": self.baseline_.value}

    def after_update(self, batch) -> None:
        """Add this step's rewards to the baseline, after the update.

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts.
        """
        # Distributed fits: every rank's rewards, so all ranks keep one global baseline.
        self.baseline_.add(distributed.gather(batch.sequence_rewards, across_ranks=True))


ReinforcePolicy.__doc__ = fill(ReinforcePolicy)
