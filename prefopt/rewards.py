"""Reward models and reward wrappers.

A *reward* is any callable ``reward(prompts, completions) -> array (n,)`` on
text. prefopt's :class:`RewardModel` is one; it is fitted on comparisons with
the Bradley-Terry loss.
"""

from __future__ import annotations

from numbers import Real

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.linear_model import LogisticRegression
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from .data import check_comparisons

__all__ = ["RewardModel", "NoisyReward", "check_rewards"]


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
    ValueError: the reward returned a non-finite value (nan) for completion 1; a reward must be a finite number for every completion.
    """
    try:
        arr = np.asarray(values.detach().cpu() if hasattr(values, "detach") else values,
                         dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{source} must return numbers, one per completion; got "
                        f"{type(values).__name__}.") from None
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.shape != (n,):
        raise ValueError(f"{source} returned shape {arr.shape} for {n} completions; it must "
                         f"return an array of shape ({n},), one number per completion.")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"{source} returned a non-finite value ({arr[bad[0]]}) for completion "
                         f"{bad[0]}; a reward must be a finite number for every completion.")
    return arr


class RewardModel(BaseEstimator):
    """A reward model fitted on pairwise comparisons with the Bradley-Terry loss.

    ``P(chosen > rejected) = sigmoid(r(x, chosen) - r(x, rejected))``.

    With ``model=None`` the reward is linear in features of the response,
    ``r(x, y) = w . f(x, y)``, fitted by logistic regression on feature
    differences (each pair is also added mirrored, so no intercept is needed).
    The features come from ``features`` or from the comparisons (the exact
    worlds attach theirs).

    Parameters
    ----------
    model : None, default=None
        ``None`` fits the linear feature reward.
    features : callable, default=None
        ``features(prompts, completions) -> ndarray (n, d)``. ``None`` takes the
        featurizer carried by the comparisons.
    alpha : float, default=0.0
        L2 penalty on the linear weights (0 is plain maximum likelihood).

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
        Weights of the linear reward.
    featurizer_ : callable
        The feature function used to score responses.
    n_comparisons_ : int
        Comparisons seen in ``fit``.

    See Also
    --------
    prefopt.worlds.PreferenceWorld.comparisons

    References
    ----------
    R. A. Bradley and M. E. Terry, "Rank analysis of incomplete block designs",
    Biometrika, 1952.

    Examples
    --------
    >>> from prefopt import RewardModel
    >>> from prefopt.worlds import PreferenceWorld
    >>> world = PreferenceWorld(random_state=0)
    >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
    >>> rm.predict([world.prompts[0]], [world.responses[0]]).shape
    (1,)
    >>> 0.5 < rm.score(world.comparisons(200, random_state=1)) <= 1.0
    True
    """

    _parameter_constraints = {
        "model": [None],
        "features": [callable, None],
        "alpha": [Interval(Real, 0, None, closed="left")],
    }

    def __init__(self, *, model=None, features=None, alpha: float = 0.0):
        self.model = model
        self.features = features
        self.alpha = alpha

    def fit(self, X, y=None):
        """Fit the reward on comparisons.

        Parameters
        ----------
        X : Comparisons, DataFrame, datasets.Dataset or rows
            Comparisons with ``prompt``, ``chosen`` and ``rejected``.
        y : None
            Ignored.

        Returns
        -------
        self : RewardModel
        """
        self._validate_params()
        data = check_comparisons(X)
        featurizer = self.features if self.features is not None else data.featurizer
        if featurizer is None:
            raise ValueError(
                "RewardModel(model=None) fits a linear reward on features, but these "
                "comparisons carry no featurizer; pass features=callable(prompts, "
                "completions) -> (n, d) array, or comparisons from a prefopt world.")
        f_chosen = self._features(featurizer, data.prompt, data.chosen)
        f_rejected = self._features(featurizer, data.prompt, data.rejected)
        diff = f_chosen - f_rejected
        X_bt = np.vstack([diff, -diff])
        y_bt = np.r_[np.ones(len(diff)), np.zeros(len(diff))]
        C = np.inf if self.alpha == 0 else 1.0 / self.alpha
        logreg = LogisticRegression(C=C, fit_intercept=False, max_iter=1000).fit(X_bt, y_bt)
        self.coef_ = logreg.coef_.ravel().copy()
        self.featurizer_ = featurizer
        self.n_comparisons_ = len(data)
        return self

    @staticmethod
    def _features(featurizer, prompts, completions) -> np.ndarray:
        F = np.asarray(featurizer(list(prompts), list(completions)), dtype=np.float64)
        if F.ndim != 2 or F.shape[0] != len(prompts):
            raise ValueError(f"features returned shape {F.shape} for {len(prompts)} "
                             "responses; it must return an (n, d) array.")
        return F

    def predict(self, prompts, completions) -> np.ndarray:
        """Reward of each (prompt, completion) pair.

        Parameters
        ----------
        prompts, completions : list of str
            Equal-length lists.

        Returns
        -------
        rewards : ndarray of shape (n,)
        """
        check_is_fitted(self)
        prompts = list(prompts)
        completions = list(completions)
        if len(prompts) != len(completions):
            raise ValueError(f"Got {len(prompts)} prompts and {len(completions)} completions; "
                             "pass one prompt per completion.")
        if not prompts:
            return np.zeros(0)
        return self._features(self.featurizer_, prompts, completions) @ self.coef_

    def __call__(self, prompts, completions) -> np.ndarray:
        return self.predict(prompts, completions)

    def score(self, X, y=None) -> float:
        """Pairwise accuracy: the share of comparisons whose chosen response scores higher.

        Parameters
        ----------
        X : comparisons
        y : None
            Ignored.

        Returns
        -------
        accuracy : float
        """
        data = check_comparisons(X)
        r_chosen = self.predict(data.prompt, data.chosen)
        r_rejected = self.predict(data.prompt, data.rejected)
        return float(np.mean(r_chosen > r_rejected))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = False
        tags.input_tags.two_d_array = False
        tags.input_tags.string = True
        return tags


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

    def __call__(self, prompts, completions) -> np.ndarray:
        clean = check_rewards(self.reward(prompts, completions), len(completions))
        return clean + self._rng.normal(0.0, self.std, size=clean.shape)

