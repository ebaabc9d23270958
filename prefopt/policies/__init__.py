"""Policy estimators: one algorithm per file on the common loop (``_loop.py``).

:class:`BasePolicy` is the estimator a new algorithm subclasses; :class:`Algorithm`
documents what it declares and supplies; it reads a :class:`RolloutBatch` and a
:class:`Minibatch`.
"""

from ._base import BasePolicy, make_init, store_params
from .dpo import DPOPolicy
from .grpo import GRPOPolicy
from .loop import Algorithm, Minibatch, RolloutBatch, masked_mean, masked_whiten
from .ppo import PPOPolicy
from .raft import RAFTPolicy
from .reinforce import ReinforcePolicy
from .reinforce_pp import ReinforcePlusPlusPolicy
from .rloo import RLOOPolicy
from .sft import SFTPolicy

__all__ = [
    "Algorithm",
    "BasePolicy",
    "DPOPolicy",
    "GRPOPolicy",
    "Minibatch",
    "PPOPolicy",
    "RAFTPolicy",
    "RLOOPolicy",
    "ReinforcePlusPlusPolicy",
    "ReinforcePolicy",
    "RolloutBatch",
    "SFTPolicy",
    "masked_mean",
    "make_init",
    "masked_whiten",
    "store_params",
]
