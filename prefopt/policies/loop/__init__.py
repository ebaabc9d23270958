"""The policy loop: one step of every policy-optimisation algorithm, and the contract it reads.

    rollout (sample, score, KL) -> advantages (the algorithm) -> update -> beta

- ``_contract.py``: :class:`Algorithm`, what an algorithm declares and supplies;
- ``_batch.py``: :class:`RolloutBatch` and :class:`Minibatch`, what it reads, and the
  masked statistics over them;
- ``_loop.py``: :class:`PolicyLoop`, the state and the steps of one fit;
- ``_rollout.py``: a rollout's passes (sampling, log-probs, values, reward, KL);
  ``_dynamic.py``: DAPO's resampling of tied groups;
- ``_update.py``: an update's gradient passes;
- ``_overlap.py``: overlapped rollouts (``max_staleness``), the next batches sampled in
  another process while this one trains, and the off-policy correction;
- ``_health.py``: the run-health figures and detectors of a step; ``_online.py``: the
  online refits of the reward; ``_value.py``: building a value model.

:class:`~prefopt.policies.BasePolicy` (``policies/_base.py``) is the estimator that
validates, builds the fitted state and hands the steps to a :class:`PolicyLoop`; the
algorithms (``policies/rloo.py``, ``ppo.py``, ...) subclass it.
"""

from ._batch import Minibatch, RolloutBatch, masked_mean, masked_whiten
from ._contract import Algorithm

__all__ = ["Algorithm", "Minibatch", "RolloutBatch", "masked_mean", "masked_whiten"]
