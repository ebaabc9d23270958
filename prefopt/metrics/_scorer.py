"""Scorers that average over completions sampled from the policy.

:class:`_SampledScorer` draws the completions; its subclasses say what to
average (reward, -KL, the KL-regularised objective). The win-rate scorers in
:mod:`prefopt.metrics._win_rate` share the same base.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral, Real

import numpy as np

from ..data import check_prompt_table
from ..rewards import call_with_columns, check_reward_columns, check_rewards

__all__ = [
    "gold_reward_scorer",
    "make_kl_scorer",
    "make_objective_scorer",
    "make_reward_scorer",
]

# ----- drawing completions ------------------------------------------------------------


def _check_n_samples(n_samples) -> int:
    if not isinstance(n_samples, Integral) or isinstance(n_samples, bool) or n_samples < 1:
        raise ValueError(f"n_samples must be an integer >= 1; got {n_samples!r}.")
    return int(n_samples)


def _sample_groups(estimator, prompts: list[str], n_samples: int, random_state) -> list:
    """``n_samples`` completions for each prompt, one list per prompt."""
    if hasattr(estimator, "sample"):
        groups = estimator.sample(prompts, n=n_samples, random_state=random_state)
    elif hasattr(getattr(estimator, "steps", None), "__getitem__") and hasattr(
        estimator.steps[-1][1], "sample"
    ):
        # A Pipeline has no sample(): its last step samples what the steps before pass
        # on (predict would give the greedy completion, not a draw from the policy).
        prompts_in = estimator[:-1].transform(prompts) if len(estimator.steps) > 1 else prompts
        groups = estimator.steps[-1][1].sample(prompts_in, n=n_samples, random_state=random_state)
    elif hasattr(estimator, "predict"):
        # Anything else with predict only: its one completion per prompt.
        groups = [[c] for c in estimator.predict(prompts)]
    else:
        raise TypeError(
            f"{type(estimator).__name__} has neither sample() nor predict(); a "
            "sampled scorer needs a fitted policy."
        )
    if len(groups) != len(prompts):
        raise ValueError(
            f"{type(estimator).__name__}.sample returned {len(groups)} groups "
            f"for {len(prompts)} prompts."
        )
    return groups


def _draw(estimator, prompts: list[str], n_samples: int, random_state, columns=None):
    """``n_samples`` completions per prompt: (repeated prompts, completions), flat.

    With ``columns`` (the prompt table's other columns), also those columns with
    each prompt's values repeated for its completions, as ``fit`` passes them.
    """
    groups = _sample_groups(estimator, prompts, n_samples, random_state)
    rep = [p for p, group in zip(prompts, groups) for _ in group]
    completions = [c for group in groups for c in group]
    if columns is None:
        return rep, completions
    rows = [i for i, group in enumerate(groups) for _ in group]
    return rep, completions, {name: [v[i] for i in rows] for name, v in columns.items()}


class _SampledScorer:
    """Base of the scorers: draws the completions, subclasses say what to average."""

    _name = "score"
    _reads_reward = False  # the reward and objective scorers call a reward

    def __init__(self, n_samples: int, random_state):
        self.n_samples = _check_n_samples(n_samples)
        self.random_state = random_state

    def __call__(self, estimator, X, y=None) -> float:
        prompts, columns = check_prompt_table(X)
        self._check_columns(estimator, columns)
        rep, completions, columns = _draw(
            estimator, prompts, self.n_samples, self.random_state, columns
        )
        return float(self._value(estimator, rep, completions, columns))

    def _check_columns(self, estimator, columns) -> None:
        """Refuse, before sampling, a reward that names a column the prompts lack."""
        if self._reads_reward:
            reward = _reward_of(estimator, self.reward)
            check_reward_columns(reward, list(columns), f"{self._name} scorer")

    def _value(self, estimator, prompts, completions, columns):  # pragma: no cover - abstract
        raise NotImplementedError

    def _args(self) -> str:
        return f"n_samples={self.n_samples}, random_state={self.random_state!r}"

    def __repr__(self) -> str:
        return f"{self._name}({self._args()})"


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
    _reads_reward = True

    def __init__(self, reward, n_samples, random_state, name="make_reward_scorer"):
        super().__init__(n_samples, random_state)
        if reward is not None and not callable(reward):
            raise TypeError(
                f"reward must be callable as reward(prompts, completions); got "
                f"{type(reward).__name__}."
            )
        self.reward = reward
        self._name = name

    def _value(self, estimator, prompts, completions, columns):
        reward = _reward_of(estimator, self.reward)
        raw = call_with_columns(reward, prompts, completions, columns)
        return check_rewards(raw, len(prompts)).mean()


class _KLScorer(_SampledScorer):
    _name = "make_kl_scorer"

    def _value(self, estimator, prompts, completions, columns):
        return -_log_ratio(estimator, prompts, completions).mean()


class _ObjectiveScorer(_SampledScorer):
    _name = "make_objective_scorer"
    _reads_reward = True

    def __init__(self, reward, beta, n_samples, random_state):
        super().__init__(n_samples, random_state)
        if beta is not None and (not isinstance(beta, Real) or beta < 0):
            raise ValueError(f"beta must be a number >= 0 or None; got {beta!r}.")
        self.reward = reward
        self.beta = beta

    def _value(self, estimator, prompts, completions, columns):
        reward = _reward_of(estimator, self.reward)
        beta = self.beta if self.beta is not None else getattr(estimator, "beta", None)
        if beta is None:
            raise ValueError(f"{type(estimator).__name__} has no beta; give the scorer one.")
        r = check_rewards(call_with_columns(reward, prompts, completions, columns), len(prompts))
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
        reward the estimator was fitted on (``estimator.reward_model_``). As
        in ``fit``, the other columns of a prompt table ``X`` reach it as
        keyword arguments (``reward(prompts, completions, answer)``), each
        prompt's value repeated for its samples.
    n_samples : int, default=4
        Completions drawn per prompt.
    random_state : int, default=0
        Seed of the sampling, so the score is deterministic.

    Returns
    -------
    scorer : callable
        ``scorer(estimator, X, y=None) -> float``: the mean over prompts in
        ``X`` (a list, or a table with a ``prompt`` column) and their samples.

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
    (``world.true_quality`` in the exact worlds), to measure over-optimisation:
    a proxy reward that keeps rising while the gold reward falls (Gao et al. 2023).

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

    References
    ----------
    .. [1] Gao et al. 2023, "Scaling Laws for Reward Model Overoptimization",
       ICML 2023.

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

    References
    ----------
    .. [1] Ziegler et al. 2019, "Fine-Tuning Language Models from Human
       Preferences", arXiv:1909.08593.

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

    The objective that RLHF maximises (Ziegler et al. 2019; Stiennon et al. 2020;
    Ouyang et al. 2022); its maximiser is pi_ref(y|x) exp(r(x, y) / beta) / Z(x).

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

    References
    ----------
    .. [1] Ziegler et al. 2019, "Fine-Tuning Language Models from Human
       Preferences", arXiv:1909.08593.
    .. [2] Stiennon et al. 2020, "Learning to summarize from human feedback",
       NeurIPS 2020.
    .. [3] Ouyang et al. 2022, "Training language models to follow instructions
       with human feedback", NeurIPS 2022.

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
