"""Rewards: the Bradley-Terry :class:`RewardModel` and small wrappers.

A *reward* is any callable ``reward(prompts, completions) -> array (n,)`` on
text. prefopt's :class:`RewardModel` is one; it is fitted on comparisons with
the Bradley-Terry loss (Bradley and Terry 1952; Ziegler et al. 2019).
"""

from ._reward_model import RewardModel
from ._wrappers import NoisyReward, check_rewards, check_token_rewards

__all__ = ["NoisyReward", "RewardModel", "check_rewards", "check_token_rewards"]
