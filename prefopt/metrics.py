"""Scorers for policies: callables ``(estimator, X, y=None) -> float``, larger is better.

Each ``make_*`` function returns a scorer that can be given as ``scoring=`` to
:class:`~prefopt.model_selection.SeedSearchCV`, :func:`~prefopt.model_selection.compare`,
``GridSearchCV`` or ``cross_validate`` (alone or in a dict of named scorers).
A scorer draws ``n_samples`` completions per prompt with the policy's
``sample(X, n=..., random_state=...)`` at a fixed ``random_state`` (an
estimator without ``sample`` is asked for ``predict(X)``), so the same policy
always gets the same score, scorers with the same ``random_state`` in one dict
see the same completions, and two candidates of a search are scored on common
random numbers.

The KL scorer is *negated* (``-KL``), as scikit-learn scorers are
"larger is better"; the other scorers return the quantity itself.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Real

import numpy as np

from ._sampled import _SampledScorer
from ._win_rate import (
    DEFAULT_LENGTH_BINS,
    length_binned_win_rate,
    make_length_binned_win_rate,
    make_win_rate_scorer,
)
from .rewards import check_rewards

__all__ = [
    "DEFAULT_LENGTH_BINS",
    "gold_reward_scorer",
    "length_binned_win_rate",
    "make_kl_scorer",
    "make_length_binned_win_rate",
    "make_objective_scorer",
    "make_reward_scorer",
    "make_win_rate_scorer",
]


def _reward_of(estimator, reward):
    if reward is not None:
        return reward
    fitted = getattr(estimator, "reward_model_", None)
    if fitted is None:
        raise ValueError(
            f"{type(estimator).__name__} has no reward_model_: give the scorer "
            "a reward, or score a policy fitted with one."
        )
    return fitted


def _log_ratio(estimator, prompts, completions) -> np.ndarray:
    """log pi(y|x) - log pi_ref(y|x) for each sampled completion (the k1 estimator)."""
    if not hasattr(estimator, "log_prob"):
        raise TypeError(
            f"{type(estimator).__name__} has no log_prob(); the KL scorers need "
            "a fitted prefopt policy."
        )
    # log-probs are deterministic: score each distinct (prompt, completion) pair once
    # (many samples repeat in small worlds and with peaked policies).
    pairs = list(dict.fromkeys(zip(prompts, completions)))
    index = {pair: i for i, pair in enumerate(pairs)}
    rows = np.array([index[pair] for pair in zip(prompts, completions)])
    unique_prompts, unique_completions = [p for p, _ in pairs], [c for _, c in pairs]
    logp = np.asarray(estimator.log_prob(unique_prompts, unique_completions), dtype=np.float64)
    ref = np.asarray(
        estimator.log_prob(unique_prompts, unique_completions, reference=True), dtype=np.float64
    )
    return (logp - ref)[rows]


class _RewardScorer(_SampledScorer):
    def __init__(self, reward, n_samples, random_state, name="make_reward_scorer"):
        super().__init__(n_samples, random_state)
        if reward is not None and not callable(reward):
            raise TypeError(
                f"reward must be callable as reward(prompts, completions); got "
                f"{type(reward).__name__}."
            )
        self.reward = reward
        self._name = name

    def _value(self, estimator, prompts, completions):
        reward = _reward_of(estimator, self.reward)
        return check_rewards(reward(prompts, completions), len(prompts)).mean()


class _KLScorer(_SampledScorer):
    _name = "make_kl_scorer"

    def _value(self, estimator, prompts, completions):
        return -_log_ratio(estimator, prompts, completions).mean()


class _ObjectiveScorer(_SampledScorer):
    _name = "make_objective_scorer"

    def __init__(self, reward, beta, n_samples, random_state):
        super().__init__(n_samples, random_state)
        if beta is not None and (not isinstance(beta, Real) or beta < 0):
            raise ValueError(f"beta must be a number >= 0 or None; got {beta!r}.")
        self.reward = reward
        self.beta = beta

    def _value(self, estimator, prompts, completions):
        reward = _reward_of(estimator, self.reward)
        beta = self.beta if self.beta is not None else getattr(estimator, "beta", None)
        if beta is None:
            raise ValueError(f"{type(estimator).__name__} has no beta; give the scorer one.")
        r = check_rewards(reward(prompts, completions), len(prompts))
        return (r - beta * _log_ratio(estimator, prompts, completions)).mean()


# ----- public constructors ------------------------------------------------------------


def make_reward_scorer(
    reward: Callable | None = None, *, n_samples: int = 4, random_state=0
) -> Callable:
    """Mean reward of sampled completions.

    Parameters
    ----------
    reward : callable, default=None
        ``reward(prompts, completions) -> array (n,)``; ``None`` uses the
        reward the estimator was fitted on (``estimator.reward_model_``).
    n_samples : int, default=4
        Completions drawn per prompt.
    random_state : int, default=0
        Seed of the sampling, so the score is deterministic.

    Returns
    -------
    scorer : callable
        ``scorer(estimator, X, y=None) -> float``: the mean over prompts in
        ``X`` and their samples.

    See Also
    --------
    gold_reward_scorer, make_objective_scorer

    Examples
    --------
    >>> from prefopt.metrics import make_reward_scorer
    >>> class Policy:  # anything with sample(X, n, random_state) works
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["good"] * n for _ in X]
    >>> length = lambda prompts, completions: [len(c) for c in completions]
    >>> make_reward_scorer(length)(Policy(), ["q1", "q2"])
    4.0
    """
    return _RewardScorer(reward, n_samples, random_state)


def gold_reward_scorer(gold: Callable, *, n_samples: int = 4, random_state=0) -> Callable:
    """Mean gold ("true") reward of sampled completions.

    The same as :func:`make_reward_scorer` with a required reward; the name
    says that the reward is the one the proxy reward model stands in for
    (``world.true_quality`` in the exact worlds), to measure over-optimisation.

    Parameters
    ----------
    gold : callable
        ``gold(prompts, completions) -> array (n,)``.
    n_samples : int, default=4
        Completions drawn per prompt.
    random_state : int, default=0
        Seed of the sampling.

    Returns
    -------
    scorer : callable

    Examples
    --------
    >>> from prefopt.metrics import gold_reward_scorer
    >>> class Policy:
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["yes", "no"][:n] for _ in X]
    >>> gold = lambda prompts, completions: [c == "yes" for c in completions]
    >>> gold_reward_scorer(gold, n_samples=2)(Policy(), ["q"])
    0.5
    """
    if not callable(gold):
        raise TypeError(
            f"gold must be callable as gold(prompts, completions); got {type(gold).__name__}."
        )
    return _RewardScorer(gold, n_samples, random_state, name="gold_reward_scorer")


def make_kl_scorer(*, n_samples: int = 4, random_state=0) -> Callable:
    """Negated KL(pi || pi_ref), estimated from sampled completions.

    KL is estimated by the mean of ``log pi(y|x) - log pi_ref(y|x)`` over
    completions sampled from the policy (the unbiased k1 estimator), with
    the policy's ``log_prob(prompts, completions)`` and
    ``log_prob(..., reference=True)``.

    Parameters
    ----------
    n_samples : int, default=4
        Completions drawn per prompt.
    random_state : int, default=0
        Seed of the sampling.

    Returns
    -------
    scorer : callable
        Returns **-KL** in nats (larger is better: closer to the reference).

    Examples
    --------
    >>> from prefopt.metrics import make_kl_scorer
    >>> class Policy:
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["a"] * n for _ in X]
    ...     def log_prob(self, prompts, completions, *, reference=False):
    ...         return [-1.0 if reference else -0.25 for _ in completions]
    >>> make_kl_scorer()(Policy(), ["q"])
    -0.75
    """
    return _KLScorer(n_samples, random_state)


def make_objective_scorer(
    reward: Callable | None = None, beta: float | None = None, *, n_samples: int = 4, random_state=0
) -> Callable:
    """The KL-regularised objective E[r] - beta KL(pi || pi_ref), from samples.

    Parameters
    ----------
    reward : callable, default=None
        ``None`` uses the estimator's ``reward_model_``.
    beta : float, default=None
        ``None`` uses the estimator's ``beta`` parameter.
    n_samples : int, default=4
        Completions drawn per prompt.
    random_state : int, default=0
        Seed of the sampling.

    Returns
    -------
    scorer : callable
        The mean over samples of ``r(x, y) - beta * (log pi(y|x) - log pi_ref(y|x))``.

    Examples
    --------
    >>> from prefopt.metrics import make_objective_scorer
    >>> class Policy:
    ...     beta = 0.5
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["a"] * n for _ in X]
    ...     def log_prob(self, prompts, completions, *, reference=False):
    ...         return [-1.0 if reference else 0.0 for _ in completions]
    >>> one = lambda prompts, completions: [1.0] * len(completions)
    >>> make_objective_scorer(one)(Policy(), ["q"])  # 1 - 0.5 * 1
    0.5
    """
    return _ObjectiveScorer(reward, beta, n_samples, random_state)
