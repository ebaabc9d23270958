"""SeedSearchCV: a grid search that fits every candidate under several seeds.

Re-exported by :mod:`prefopt.model_selection`; see its docstring.
"""

from __future__ import annotations

import inspect
from numbers import Integral, Real

import numpy as np
from scipy import stats
from sklearn.base import clone
from sklearn.model_selection import ParameterGrid
from sklearn.model_selection._search import (
    BaseSearchCV,
    _yield_masked_array_for_each_param,
)
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from .._config import config_context, get_config
from ._stats import _check_seeds, t_interval

__all__ = ["SeedSearchCV"]


def _rank(means: np.ndarray) -> np.ndarray:
    """1 for the best mean; a NaN mean (a failed fit) ties with the worst, as in scikit-learn."""
    if np.isnan(means).all():
        return np.ones(len(means), dtype=np.int32)
    filled = np.where(np.isnan(means), np.nanmin(means) - 1, means)
    return stats.rankdata(-filled, method="min").astype(np.int32)


class _AllPrompts:
    """A splitter with one split: train on all prompts, score on the same prompts.

    An RL policy is usually judged on the prompts it was trained on, and seeds,
    not folds, are the replicates; ``SeedSearchCV(cv=None)`` uses this.
    """

    def split(self, X, y=None, groups=None):
        idx = np.arange(len(X))
        yield idx, idx

    def get_n_splits(self, X=None, y=None, groups=None):
        return 1

    def __repr__(self) -> str:
        return "AllPrompts()"


class _WithConfig:
    """An estimator that fits and is scored under the prefopt configuration it carries.

    ``BaseSearchCV`` sends each candidate to its workers (loky processes, Ray
    actors), which start from prefopt's defaults; wrapped in this, a candidate
    takes the caller's ``set_config`` settings (device, dtype, progress bars,
    compile, distributed) with it, as ``compare`` hands them to its tasks. Its
    parameters, tags and every other attribute are the wrapped estimator's.
    """

    def __init__(self, estimator, config: dict):
        self.estimator, self.config = estimator, dict(config)

    def get_params(self, deep=True):
        return self.estimator.get_params(deep=deep)

    def set_params(self, **params):
        self.estimator.set_params(**params)
        return self

    def __sklearn_clone__(self):
        return _WithConfig(clone(self.estimator), self.config)

    def __sklearn_tags__(self):
        return self.estimator.__sklearn_tags__()

    def fit(self, X, y=None, **params):
        with config_context(**self.config):
            self.estimator.fit(X, y, **params)
        return self

    def __getattr__(self, name):
        if name.startswith("__") or name in ("estimator", "config"):
            raise AttributeError(name)
        value = getattr(self.estimator, name)
        if not inspect.ismethod(value):  # data, and callables it holds (model_, a reward)
            return value

        def under_config(*args, **kwargs):  # score, sample, predict, ... as the fit ran
            with config_context(**self.config):
                return value(*args, **kwargs)

        return under_config

    def __repr__(self) -> str:
        return repr(self.estimator)


class _ScoreUnderConfig:
    """A scorer that runs under a prefopt configuration (in the worker that scores)."""

    def __init__(self, scorer, config: dict):
        self.scorer, self.config = scorer, config

    def __call__(self, estimator, *args, **kwargs):
        with config_context(**self.config):
            return self.scorer(estimator, *args, **kwargs)


class SeedSearchCV(BaseSearchCV):
    """Grid search that fits every candidate under several seeds and reports their spread.

    Each candidate of ``param_grid`` is fitted once per seed, the seed set as
    the estimator's ``random_state`` (``seed_param``), and, when ``cv`` is
    given, once per fold of the prompts. A seed's score is its mean over
    folds; the candidate's ``mean``, ``std`` and confidence interval are taken
    over its seeds, and candidates are ranked by the mean, never by the best
    seed.

    Parameters
    ----------
    estimator : estimator
        A prefopt policy, or any estimator with the parameter ``seed_param``.
    param_grid : dict or list of dict
        As in ``GridSearchCV``; must not contain ``seed_param``.
    seeds : int or list of int, default=5
        ``n`` means seeds ``0, ..., n-1``; a list gives the seeds themselves.
    cv : int, cross-validation generator, iterable or None, default=None
        ``None`` trains and scores on all the prompts (one "split"); otherwise
        as in ``GridSearchCV`` (folds of the prompts: score on held-out ones).
    scoring : str, callable, list, tuple, dict or None, default=None
        As in ``GridSearchCV``; ``None`` uses the estimator's ``score``
        (the mean reward of one sample per prompt). See :mod:`prefopt.metrics`
        and ``world.scorer(...)`` for others.
    n_jobs : int, default=None
        Fits run in parallel through joblib (seeds x folds x candidates).
    refit : bool, str or callable, default=True
        Refit the best candidate on all prompts with the **first** seed, as
        ``best_estimator_``; with a dict ``scoring``, the name of the metric
        that picks the best. With ``cv=None`` the refit repeats that seed's
        fit exactly.
    confidence : float, default=0.95
        Coverage of the Student-t interval over seeds.
    verbose : int, default=0
        Progress messages, as in ``GridSearchCV``.
    pre_dispatch : int or str, default="2*n_jobs"
        As in ``GridSearchCV``.
    error_score : "raise" or float, default=np.nan
        The score of a failed fit (a diverged run raises ``FloatingPointError``);
        a NaN seed makes the candidate's mean NaN, ranked last.
    return_train_score : bool, default=False
        Also aggregate training-fold scores (``train`` in place of ``test``).
    seed_param : str, default="random_state"
        The parameter the seed is set on.

    Attributes
    ----------
    cv_results_ : dict of ndarray
        One entry per candidate (seeds aggregated): ``params``,
        ``param_<name>``; for each metric ``<m>`` (``score`` for a single
        one) ``seed<j>_test_<m>`` (the j-th seed's score), with ``cv``
        also ``split<i>_seed<j>_test_<m>``; ``mean_test_<m>``,
        ``std_test_<m>`` (over seeds, ``ddof=1``, unlike ``GridSearchCV``'s
        ``ddof=0`` over folds: seeds are a sample, and this std is the one
        the interval uses), ``ci_low_test_<m>``, ``ci_high_test_<m>`` and
        ``rank_test_<m>`` (by the mean); ``mean_fit_time``, ``std_fit_time``,
        ``mean_score_time``, ``std_score_time`` over all of a candidate's fits.
    seeds_ : list of int
        The seeds; ``seed<j>`` in ``cv_results_`` is ``seeds_[j]``.
    best_estimator_ : estimator
        The best candidate refitted on all prompts with ``seeds_[0]``.
    best_index_ : int
    best_params_ : dict
        Without the seed.
    best_score_ : float
        The best candidate's mean score over seeds.
    n_splits_ : int
        Folds (1 when ``cv=None``).
    refit_time_ : float
    scorer_ : callable or dict
    multimetric_ : bool

    See Also
    --------
    compare : several algorithms on the same seeds, with paired tests.

    Notes
    -----
    The interval treats the seeds as independent draws and the seed's score
    (a mean over folds) as one measurement, so it covers the seed-to-seed
    variability of training *and* of the scorer's sampling. With few seeds it
    is wide: the t quantile is 4.30 for 3 seeds and 2.78 for 5.

    Examples
    --------
    >>> import prefopt
    >>> from prefopt import RewardModel, RLOOPolicy
    >>> from prefopt.model_selection import SeedSearchCV
    >>> from prefopt.worlds import PreferenceWorld
    >>> prefopt.set_config(show_progress_bar=False)
    >>> world = PreferenceWorld(random_state=0)
    >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
    >>> policy = RLOOPolicy(model=world.policy_model(), learning_rate=2.0, optimizer="sgd",
    ...                     n_steps=3, batch_size=16)
    >>> search = SeedSearchCV(policy, {"beta": [0.1, 1.0]}, seeds=2,
    ...                       scoring=world.scorer("objective"))
    >>> search = search.fit(world.prompts, reward_model=rm)
    >>> [k for k in search.cv_results_ if k.endswith("test_score")]
    ... # doctest: +NORMALIZE_WHITESPACE
    ['seed0_test_score', 'seed1_test_score', 'mean_test_score', 'std_test_score',
     'ci_low_test_score', 'ci_high_test_score', 'rank_test_score']
    >>> search.best_estimator_.random_state  # refit with the first seed
    0
    """

    _parameter_constraints: dict = {
        **BaseSearchCV._parameter_constraints,
        "param_grid": [dict, list],
        "seeds": [Interval(Integral, 1, None, closed="left"), list, tuple, np.ndarray],
        "confidence": [Interval(Real, 0, 1, closed="neither")],
        "seed_param": [str],
    }

    def __init__(
        self,
        estimator,
        param_grid,
        *,
        seeds=5,
        cv=None,
        scoring=None,
        n_jobs=None,
        refit=True,
        confidence=0.95,
        verbose=0,
        pre_dispatch="2*n_jobs",
        error_score=np.nan,
        return_train_score=False,
        seed_param="random_state",
    ):
        super().__init__(
            estimator=estimator,
            scoring=scoring,
            n_jobs=n_jobs,
            refit=refit,
            cv=cv,
            verbose=verbose,
            pre_dispatch=pre_dispatch,
            error_score=error_score,
            return_train_score=return_train_score,
        )
        self.param_grid = param_grid
        self.seeds = seeds
        self.confidence = confidence
        self.seed_param = seed_param

    def fit(self, X, y=None, **params):
        """Fit every candidate under every seed (and fold), then refit the best.

        Parameters
        ----------
        X : list of str or table with a ``prompt`` column
            Prompts.
        y : callable, default=None
            The reward, as in a policy's ``fit(prompts, reward_model)``: it is
            passed to every fit as ``reward_model=y``.
        **params : dict
            Passed to every fit, e.g. ``reward_model=rm``.

        Returns
        -------
        self : object

        Examples
        --------
        >>> from prefopt import RewardModel, RLOOPolicy
        >>> from prefopt.model_selection import SeedSearchCV
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
        >>> policy = RLOOPolicy(model=world.policy_model(), learning_rate=2.0, optimizer="sgd",
        ...                     n_steps=3, batch_size=16)
        >>> search = SeedSearchCV(policy, {"beta": [0.1, 1.0]}, seeds=2)
        >>> search.fit(world.prompts, rm).seeds_  # the reward as y, as for a policy
        [0, 1]
        >>> search.best_params_
        {'beta': 0.1}
        """
        if y is not None and callable(y):
            # A reward is not an array that folds can split: pass it as the fit parameter.
            if "reward_model" in params:
                raise ValueError("Give the reward once: as y or as reward_model=, not both.")
            params, y = {**params, "reward_model": y}, None
        self._validate_params()
        self.seeds_ = _check_seeds(self.seeds)
        for grid in ParameterGrid(self.param_grid).param_grid:
            if self.seed_param in grid:
                raise ValueError(
                    f"param_grid sets {self.seed_param!r}, which SeedSearchCV sets "
                    "to each seed; give the seeds as seeds=[...]."
                )
        if self.seed_param not in self.estimator.get_params():
            raise ValueError(
                f"{type(self.estimator).__name__} has no parameter "
                f"{self.seed_param!r} to set the seed on; name it with seed_param=."
            )
        # BaseSearchCV reads self.estimator (refit) and self.cv: for the duration of the fit
        # the template carries the first seed, so the refit uses it (every candidate sets its
        # own), and cv=None becomes the all-prompts split.
        estimator, cv = self.estimator, self.cv
        first = clone(estimator).set_params(**{self.seed_param: self.seeds_[0]})
        # Every candidate carries the caller's set_config settings to its worker.
        self.estimator = _WithConfig(first, get_config())
        if cv is None:
            self.cv = _AllPrompts()
        try:
            super().fit(X, y, **params)
        finally:
            self.estimator, self.cv = estimator, cv
        if isinstance(getattr(self, "best_estimator_", None), _WithConfig):
            self.best_estimator_ = self.best_estimator_.estimator
        return self

    def _get_scorers(self):
        scorers, refit_metric = super()._get_scorers()
        if not isinstance(self.estimator, _WithConfig):
            return scorers, refit_metric
        config = self.estimator.config  # scoring in a worker sees the caller's settings too
        inner = getattr(scorers, "_scorers", None)  # a multi-metric scorer's own scorers
        if isinstance(inner, dict):
            scorers._scorers = {k: _ScoreUnderConfig(v, config) for k, v in inner.items()}
            return scorers, refit_metric
        return _ScoreUnderConfig(scorers, config), refit_metric

    def _run_search(self, evaluate_candidates):
        # Seeds vary fastest: candidate g under seed j is entry g * n_seeds + j.
        evaluate_candidates(
            [
                {**params, self.seed_param: seed}
                for params in ParameterGrid(self.param_grid)
                for seed in self.seeds_
            ]
        )

    def _format_results(self, candidate_params, n_splits, out, more_results=None):
        n_seeds = len(self.seeds_)
        n_candidates = len(candidate_params) // n_seeds
        params = [
            {k: v for k, v in p.items() if k != self.seed_param}
            for p in candidate_params[::n_seeds]
        ]

        def cells(values):  # (candidate, seed, split)
            return np.asarray(values, dtype=np.float64).reshape(n_candidates, n_seeds, n_splits)

        results = {key: np.asarray(value) for key, value in (more_results or {}).items()}
        for key in ("fit_time", "score_time"):
            times = cells([o[key] for o in out])
            results[f"mean_{key}"] = times.mean(axis=(1, 2))
            results[f"std_{key}"] = times.std(axis=(1, 2))
        for name, masked in _yield_masked_array_for_each_param(params):
            results[name] = masked
        results["params"] = params
        sets = ["test"] + (["train"] if self.return_train_score else [])
        for which in sets:
            for metric, values in _by_metric([o[f"{which}_scores"] for o in out]).items():
                self._store(results, f"{which}_{metric}", cells(values), rank=which == "test")
        return results

    def _store(self, results: dict, key: str, scores: np.ndarray, rank: bool) -> None:
        if not isinstance(self.cv, _AllPrompts):
            for j in range(scores.shape[1]):
                for i in range(scores.shape[2]):
                    results[f"split{i}_seed{j}_{key}"] = scores[:, j, i]
        per_seed = scores.mean(axis=2)  # a seed's score is its mean over folds
        for j in range(per_seed.shape[1]):
            results[f"seed{j}_{key}"] = per_seed[:, j]
        mean, std, low, high = t_interval(per_seed, self.confidence, axis=1)
        results[f"mean_{key}"] = mean
        results[f"std_{key}"] = std
        results[f"ci_low_{key}"] = low
        results[f"ci_high_{key}"] = high
        if rank:
            results[f"rank_{key}"] = _rank(mean)

    def sample(self, X, n: int = 1, **kwargs):
        """Sample ``n`` completions per prompt from ``best_estimator_``.

        Parameters
        ----------
        X : list of str or table with a ``prompt`` column
            Prompts.
        n : int, default=1
            Completions per prompt.
        **kwargs : dict
            Passed to ``best_estimator_.sample`` (e.g. ``random_state``).

        Returns
        -------
        completions : list of list of str
            ``n`` completions per prompt.

        Examples
        --------
        >>> from prefopt import RewardModel, RLOOPolicy
        >>> from prefopt.model_selection import SeedSearchCV
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
        >>> policy = RLOOPolicy(model=world.policy_model(), learning_rate=2.0, optimizer="sgd",
        ...                     n_steps=3, batch_size=16)
        >>> search = SeedSearchCV(policy, {"beta": [0.1, 1.0]}, seeds=2).fit(world.prompts, rm)
        >>> [len(group) for group in search.sample(world.prompts[:2], n=3)]
        [3, 3]
        """
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.sample(X, n, **kwargs)

    def log_prob(self, prompts, completions, **kwargs):
        """Log-probability of each completion under ``best_estimator_``.

        Parameters
        ----------
        prompts : list of str
            One prompt per completion.
        completions : list of str
            The completions to score.
        **kwargs : dict
            Passed to ``best_estimator_.log_prob`` (e.g. ``reference=True``).

        Returns
        -------
        logprobs : ndarray of shape (n,)

        Examples
        --------
        >>> from prefopt import RewardModel, RLOOPolicy
        >>> from prefopt.model_selection import SeedSearchCV
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
        >>> policy = RLOOPolicy(model=world.policy_model(), learning_rate=2.0, optimizer="sgd",
        ...                     n_steps=3, batch_size=16)
        >>> search = SeedSearchCV(policy, {"beta": [0.1, 1.0]}, seeds=2).fit(world.prompts, rm)
        >>> prompts = world.prompts[:2]
        >>> completions = [group[0] for group in search.sample(prompts)]
        >>> search.log_prob(prompts, completions).shape
        (2,)
        """
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.log_prob(prompts, completions, **kwargs)


def _by_metric(scores: list) -> dict:
    """A list of floats or of dicts (one per fit) -> {metric: list of floats}."""
    if scores and isinstance(scores[0], dict):
        return {name: [s[name] for s in scores] for name in scores[0]}
    return {"score": list(scores)}
