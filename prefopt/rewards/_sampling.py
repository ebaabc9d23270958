"""Bradley-Terry labels of pairs: a fitted reward's ``sample`` and the worlds' raters.

``RewardModel.sample`` and the exact worlds' ``labeler`` draw the same way: row ``i``
is 0 (``a`` preferred) with probability ``sigmoid(logit_i)``, one uniform draw a row.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit
from sklearn.utils import check_random_state

from ..data import check_texts

__all__ = ["bradley_terry_labels", "check_label_rows", "preference_labels"]


def check_label_rows(prompts, completions_a, completions_b, who: str) -> tuple[list, list, list]:
    """Three equal-length lists, or an error naming the lengths."""
    prompts, completions_a, completions_b = list(prompts), list(completions_a), list(completions_b)
    if not len(prompts) == len(completions_a) == len(completions_b):
        raise ValueError(
            f"{who} got {len(prompts)} prompts, {len(completions_a)} completions_a and "
            f"{len(completions_b)} completions_b; pass one prompt and two completions per row."
        )
    return prompts, completions_a, completions_b


def bradley_terry_labels(logit, random_state) -> np.ndarray:
    """0 where ``a`` is preferred (probability ``sigmoid(logit)``), else 1.

    One uniform draw per row from ``random_state``: the label of
    :meth:`prefopt.RewardModel.sample` (the index of the preferred completion).

    Parameters
    ----------
    logit : array-like of shape (n,)
        Log-odds that ``a`` is preferred.
    random_state : int, RandomState instance or None
        Draws the labels.

    Returns
    -------
    labels : ndarray of shape (n,), dtype int

    Examples
    --------
    >>> bradley_terry_labels([50.0, -50.0], random_state=0).tolist()
    [0, 1]
    """
    rng = check_random_state(random_state)
    # Bradley and Terry (1952): P(a preferred) = sigmoid(r_a - r_b).
    p_a = expit(np.asarray(logit, dtype=np.float64))
    return (rng.uniform(size=len(p_a)) >= p_a).astype(int)


def preference_labels(reward, prompts, completions_a, completions_b, rng) -> np.ndarray:
    """Bradley-Terry labels on ``reward(prompts, a) - reward(prompts, b)``, texts checked.

    ``reward(prompts, completions)`` scores the rows; ``rng`` draws the labels.
    """
    prompts = check_texts(prompts, "prompt", "RewardModel.sample")
    completions_a = check_texts(completions_a, "completion", "RewardModel.sample")
    completions_b = check_texts(completions_b, "completion", "RewardModel.sample")
    prompts, a, b = check_label_rows(prompts, completions_a, completions_b, "RewardModel.sample")
    return bradley_terry_labels(reward(prompts, a) - reward(prompts, b), rng)
