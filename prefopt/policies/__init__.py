"""Policy estimators: one algorithm per file on the shared loop of ``_base.py``.

:class:`BasePolicy` documents the contract a new algorithm implements; it reads
a :class:`RolloutBatch` and a :class:`Minibatch`.
"""

from ._base import BasePolicy, store_params
from ._batch import Minibatch, RolloutBatch, masked_mean, masked_whiten
from .dpo import DPOPolicy
from .grpo import GRPOPolicy
from .ppo import PPOPolicy
from .raft import RAFTPolicy
from .reinforce import ReinforcePolicy
from .rloo import RLOOPolicy
from .sft import SFTPolicy

__all__ = [
    "BasePolicy",
    "DPOPolicy",
    "GRPOPolicy",
    "Minibatch",
    "PPOPolicy",
    "RAFTPolicy",
    "RLOOPolicy",
    "ReinforcePolicy",
    "RolloutBatch",
    "SFTPolicy",
    "masked_mean",
    "masked_whiten",
    "store_params",
]
