"""Drawing preference labels from a reward's Bradley-Terry model."""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from ..data import check_texts


def preference_labels(reward, prompts, completions_a, completions_b, rng) -> np.ndarray:
    """0 where ``a`` is drawn as preferred, with probability ``sigmoid(r(a) - r(b))``, else 1.

    ``reward(prompts, completions)`` scores the rows; ``rng`` is a ``RandomState``.
    """
    prompts = check_texts(prompts, "prompt", "RewardModel.sample")
    completions_a = check_texts(completions_a, "completion", "RewardModel.sample")
    completions_b = check_texts(completions_b, "completion", "RewardModel.sample")
    if not len(prompts) == len(completions_a) == len(completions_b):
        raise ValueError(
            f"RewardModel.sample got {len(prompts)} prompts, {len(completions_a)} "
            f"completions_a and {len(completions_b)} completions_b; pass one prompt and "
            "two completions per row."
        )
    # Bradley and Terry (1952): P(a preferred) = sigmoid(r_a - r_b).
    p_a = expit(reward(prompts, completions_a) - reward(prompts, completions_b))
    return (rng.uniform(size=len(prompts)) >= p_a).astype(int)
