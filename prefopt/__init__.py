"""prefopt: RLHF as scikit-learn estimators.

Fit a reward model from comparisons, optimise a policy against it with PPO,
RLOO, GRPO, REINFORCE or RAFT, or fit the policy on the comparisons directly with
DPO, and compare algorithms exactly where the answer is known.
"""

# First, so that this is where tqdm.auto is imported: see backend.progress (no ipywidgets warning).
from .backend import progress  # noqa: F401  # isort: skip
from . import exceptions, metrics  # noqa: F401  (prefopt.exceptions, as sklearn's)
from ._config import config_context, get_config, set_config
from .data import PreferenceData
from .exceptions import RunHealthError, RunHealthWarning
from .kl import AdaptiveKLController, FixedKLController, KLController, kl_estimate
from .learning_rate import AdaptiveLR
from .lm import load, save
from .model_selection import SeedSearchCV, compare
from .policies import (
    DPOPolicy,
    GRPOPolicy,
    PPOPolicy,
    RAFTPolicy,
    ReinforcePlusPlusPolicy,
    ReinforcePolicy,
    RLOOPolicy,
    SFTPolicy,
)
from .rewards import NoisyReward, RewardModel, WeightedRewards

__version__ = "0.1.0"

__all__ = [
    "AdaptiveKLController",
    "AdaptiveLR",
    "DPOPolicy",
    "FixedKLController",
    "GRPOPolicy",
    "KLController",
    "NoisyReward",
    "PPOPolicy",
    "PreferenceData",
    "RAFTPolicy",
    "SeedSearchCV",
    "compare",
    "metrics",
    "RLOOPolicy",
    "ReinforcePlusPlusPolicy",
    "ReinforcePolicy",
    "RewardModel",
    "RunHealthError",
    "RunHealthWarning",
    "WeightedRewards",
    "SFTPolicy",
    "config_context",
    "get_config",
    "kl_estimate",
    "load",
    "save",
    "set_config",
    "__version__",
]
