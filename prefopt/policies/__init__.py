"""Policy estimators: one algorithm per file on the shared loop of ``_base.py``."""

from ._base import BasePolicy
from ._batch import RolloutBatch
from .ppo import PPOPolicy
from .raft import RAFTPolicy
from .reinforce import ReinforcePolicy
from .rloo import RLOOPolicy
from .sft import SFTPolicy

__all__ = [
    "BasePolicy",
    "RolloutBatch",
    "PPOPolicy",
    "RLOOPolicy",
    "ReinforcePolicy",
    "RAFTPolicy",
    "SFTPolicy",
]
