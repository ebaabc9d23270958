"""Rewards: the Bradley-Terry :class:`RewardModel` and small wrappers.

A *reward* is any callable ``reward(prompts, completions) -> array (n,)`` on
text; one that names columns of the prompt table (``reward(prompts,
completions, answer)``) receives them, and :class:`WeightedRewards` sums
several. prefopt's :class:`RewardModel` is one; it is fitted on comparisons with
the Bradley-Terry loss (Bradley and Terry 1952; Ziegler et al. 2019).
"""

from ._combined import WeightedRewards, call_with_columns, check_reward_columns, reward_columns
from ._reward_model import RewardModel
from ._wrappers import NoisyReward, check_rewards, check_token_rewards

__all__ = [
    "NoisyReward",
    "RewardModel",
    "WeightedRewards",
    "call_with_columns",
    "check_reward_columns",
    "check_rewards",
    "check_token_rewards",
    "reward_columns",
]
