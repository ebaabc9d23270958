"""Rewards as plain callables: the output check every caller applies, and wrappers."""

from __future__ import annotations

import numpy as np
from sklearn.utils import check_random_state

from ._calling import call_plan

__all__ = ["NoisyReward", "check_rewards", "check_token_rewards"]


def check_rewards(values, n: int, source: str = "the reward") -> np.ndarray:
    """Check that a reward returned one finite number per completion.

    Parameters
    ----------
    values : array-like
        What the reward returned.
    n : int
        Number of completions it was given.
    source : str, default="the reward"
        Named in the error message.

    Returns
    -------
    rewards : ndarray of shape (n,), float64

    Examples
    --------
    >>> check_rewards([1, 2], 2)
    array([1., 2.])
    >>> check_rewards([1.0, float("nan")], 2)
    Traceback (most recent call last):
    ...
    ValueError: the reward returned a non-finite value (nan) for completion 1; ...
    >>> check_rewards(["1.0", "2"], 2)
    Traceback (most recent call last):
    ...
    TypeError: the reward returned text ('1.0' for completion 0), not numbers; ...
    """
    values = values.detach().cpu() if hasattr(values, "detach") else values
    text = _first_text(values)
    if text is not None:
        # numpy would turn "1.0" into 1.0 silently: a reward returning text is a bug upstream.
        raise TypeError(
            f"{source} returned text ({text[1]!r} for completion {text[0]}), not numbers; "
            "a reward must return numbers, one per completion: convert them inside the "
            "reward (float(...))."
        )
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(
            f"{source} must return numbers, one per completion; got {type(values).__name__}."
        ) from None
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.shape != (n,):
        raise ValueError(
            f"{source} returned shape {arr.shape} for {n} completions; it must "
            f"return an array of shape ({n},), one number per completion."
        )
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(
            f"{source} returned a non-finite value ({arr[bad[0]]}) for completion "
            f"{bad[0]}; a reward must be a finite number for every completion."
        )
    return arr


def check_token_rewards(values, mask, source: str = "the reward") -> np.ndarray:
    """Check that a per-token reward returned one finite number per response token.

    What ``score_per_token`` returns (see :class:`~prefopt.policies.BasePolicy`):
    an array of shape ``(n, length)``, the shape of the response ids it was
    given. Values outside ``mask`` (after a response's EOS) are ignored and
    returned as 0; they need not be finite.

    Parameters
    ----------
    values : array-like of shape (n, length)
        What the reward returned.
    mask : array-like of shape (n, length)
        The response mask: 1 up to and including each response's EOS.
    source : str, default="the reward"
        Named in the error message.

    Returns
    -------
    rewards : ndarray of shape (n, length), float64
        Zero outside the mask.

    Examples
    --------
    >>> check_token_rewards([[0.5, 1.0, 7.0]], [[1, 1, 0]])
    array([[0.5, 1. , 0. ]])
    >>> check_token_rewards([1.0, 2.0], [[1, 1]])
    Traceback (most recent call last):
    ...
    ValueError: the reward returned shape (2,) for responses of shape (1, 2); ...
    """
    values = values.detach().cpu() if hasattr(values, "detach") else values
    mask = np.asarray(mask.detach().cpu() if hasattr(mask, "detach") else mask).astype(bool)
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(
            f"{source} must return numbers, one per response token; got {type(values).__name__}."
        ) from None
    if arr.shape != mask.shape:
        raise ValueError(
            f"{source} returned shape {arr.shape} for responses of shape {mask.shape}; "
            "score_per_token must return one number per response token, the shape of "
            "the response ids it was given."
        )
    arr = np.where(mask, arr, 0.0)
    bad = np.argwhere(~np.isfinite(arr))
    if bad.size:
        i, t = bad[0]
        raise ValueError(
            f"{source} returned a non-finite value ({arr[i, t]}) for token {t} of "
            f"completion {i}; a reward must be a finite number for every response token."
        )
    return arr


def _first_text(values):
    """``(index, value)`` of the first str or bytes among the values, or None."""
    if isinstance(values, (str, bytes)):
        return 0, values
    kind = getattr(getattr(values, "dtype", None), "kind", "O")
    if hasattr(values, "detach") or kind not in "USO" or not hasattr(values, "__iter__"):
        return None  # tensors and numeric arrays hold no text
    for i, row in enumerate(values):
        if isinstance(row, (int, float, np.number)):
            continue
        items = row if isinstance(row, (list, tuple, np.ndarray)) else [row]
        for v in np.ravel(np.asarray(items, dtype=object)):
            if isinstance(v, (str, bytes)):
                return i, (str(v) if isinstance(v, str) else bytes(v))
    return None


class NoisyReward:
    """Add Gaussian noise of standard deviation ``std`` to a reward.

    The RLOO paper's robustness experiment adds N(0, sigma^2) noise to the
    reward model's output (sigma in {1, 3, 5}).

    Parameters
    ----------
    reward : callable
        ``reward(prompts, completions) -> array (n,)``.
    std : float, default=1.0
        Noise standard deviation.
    random_state : int, RandomState instance or None, default=None

    Examples
    --------
    >>> noisy = NoisyReward(lambda p, c: [0.0] * len(c), std=1.0, random_state=0)
    >>> noisy(["a", "b"], ["x", "y"]).shape
    (2,)
    """

    def __init__(self, reward, std: float = 1.0, random_state=None):
        if std < 0:
            raise ValueError(f"std must be >= 0; got {std!r}.")
        self.reward = reward
        self.std = std
        self.random_state = random_state
        self._rng = check_random_state(random_state)

    def __call__(self, prompts, completions, **columns) -> np.ndarray:
        # The wrapped reward is called as a fit calls it: by its declared names, with the
        # columns it takes (a TRL-style reward(completions, answer) inside stays right).
        raw = call_plan(self.reward, list(columns)).call(self.reward, prompts, completions, columns)
        clean = check_rewards(raw, len(completions))
        return clean + self._rng.normal(0.0, self.std, size=clean.shape)
