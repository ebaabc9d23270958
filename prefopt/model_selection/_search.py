"""SeedSearchCV: a grid search that fits every candidate under several seeds.

Re-exported by :mod:`prefopt.model_selection`; see its docstring. Built on
scikit-learn's public API alone (``cross_validate`` fits and scores one cell,
``ParameterGrid``, ``check_cv``, ``check_scoring`` and joblib's ``Parallel``
spread the cells), so a scikit-learn release that reworks ``BaseSearchCV``'s
internals leaves it as it is.
"""

from __future__ import annotations

import copy
import time
from numbers import Integral, Real

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, MetaEstimatorMixin, clone, is_classifier
from sklearn.model_selection import ParameterGrid, check_cv
from sklearn.utils import get_tags
from sklearn.utils.parallel import Parallel, delayed

from .._config import get_config
from ..backend.progress import verbose_log
from ._best import _BestEstimatorMethods
from ._cells import (
    STOP_AT_ERROR,
    _AllPrompts,
    _cell,
    _param_arrays,
    _rank,
    _scorers,
    _tied_with_best,
    _with_eval_prompts,
    member,
    tracked_group,
)
from ._stats import _check_seeds, split_seeds, t_interval

__all__ = ["SeedSearchCV"]


def _run_name(cell: str, split: int, splits: list) -> str:
    """A cell's tracked run: ``candidate=<i>-seed=<s>``, with ``-split=<k>`` under folds."""
    return cell + (f"-split={split}" if len(splits) > 1 else "")


class SeedSearchCV(_BestEstimatorMethods, MetaEstimatorMixin, BaseEstimator):
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
    evaluation_seeds : int or list of int, default=None
        Fresh seeds, disjoint from ``seeds`` (an overlapping list is an
        error; a count ``n`` takes the first ``n`` seeds not searched): the
        selected candidate is fitted and scored again on each, on the same
        splits, since its score on the seeds that selected it is overstated
        (the best of several noisy means). The refit then uses the first
        evaluation seed.
    eval_prompts : list of str or table with a ``prompt`` column, default=None
        Held-out prompts every fit is scored on (with ``cv=None``); ``None``
        scores on the training prompts, which overstates a policy that learnt
        its prompts rather than the task.

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
        ``rank_test_<m>`` (by the mean, a candidate with any unhealthy run
        after every one without), ``tied_with_best_test_<m>`` (True where the
        paired t-interval (at ``confidence``) over seeds of the best minus this one
        reaches 0: the seeds cannot tell the two apart; True for the best);
        when the fits report ``health_``,
        ``seed<j>_healthy`` (no fit of that seed was unhealthy or failed:
        ``health_["healthy"]`` is False, or the fit raised; a fit without
        ``health_`` counts as healthy) and ``n_unhealthy`` (such fits of the
        candidate); ``mean_fit_time``, ``std_fit_time``,
        ``mean_score_time``, ``std_score_time`` over all of a candidate's fits.
    seeds_ : list of int
        The seeds; ``seed<j>`` in ``cv_results_`` is ``seeds_[j]``.
    evaluation_seeds_ : list of int
        With ``evaluation_seeds``: those seeds.
    evaluation_results_ : pandas.DataFrame
        With ``evaluation_seeds``: one row per evaluation seed, its ``seed``,
        ``healthy`` (``False`` for an unhealthy or failed fit, ``None`` for an
        estimator without ``health_``) and ``test_<m>`` (mean over splits).
    evaluation_score_ : float
        With ``evaluation_seeds``: the best candidate's mean score over them
        (by the metric that picked it), the figure to report.
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
     'ci_low_test_score', 'ci_high_test_score', 'rank_test_score', 'tied_with_best_test_score']
    >>> search.best_estimator_.random_state  # refit with the first seed
    0
    """

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
        evaluation_seeds=None,
        eval_prompts=None,
    ):
        self.estimator = estimator
        self.param_grid = param_grid
        self.seeds = seeds
        self.cv = cv
        self.scoring = scoring
        self.n_jobs = n_jobs
        self.refit = refit
        self.confidence = confidence
        self.verbose = verbose
        self.pre_dispatch = pre_dispatch
        self.error_score = error_score
        self.return_train_score = return_train_score
        self.seed_param = seed_param
        self.evaluation_seeds = evaluation_seeds
        self.eval_prompts = eval_prompts

    def __sklearn_tags__(self):
        # The search takes what its estimator takes (prompts: strings), as GridSearchCV does.
        tags = super().__sklearn_tags__()
        inner = get_tags(self.estimator)
        tags.estimator_type, tags.input_tags = inner.estimator_type, copy.copy(inner.input_tags)
        return tags

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
            Passed to every fit, e.g. ``reward_model=rm``; ``groups`` goes to
            the ``cv`` splitter instead.

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
        self._check_params()
        self.seeds_ = _check_seeds(self.seeds)
        grid = ParameterGrid(self.param_grid)
        for one in grid.param_grid:
            if self.seed_param in one:
                raise ValueError(
                    f"param_grid sets {self.seed_param!r}, which SeedSearchCV sets "
                    "to each seed; give the seeds as seeds=[...]."
                )
        if self.seed_param not in self.estimator.get_params():
            raise ValueError(
                f"{type(self.estimator).__name__} has no parameter "
                f"{self.seed_param!r} to set the seed on; name it with seed_param=."
            )
        self.scorer_ = _scorers(self.estimator, self.scoring)
        if isinstance(self.scorer_, dict):
            self._check_refit(list(self.scorer_))
        params = dict(params)
        groups = params.pop("groups", None)
        cv = (
            _AllPrompts()
            if self.cv is None
            else check_cv(self.cv, y, classifier=is_classifier(self.estimator))
        )
        X_train = X
        if self.eval_prompts is not None:  # fit on X, score on the held-out prompts after it
            X, splits = _with_eval_prompts(X, self.eval_prompts, self.cv, y)
        else:
            splits = list(cv.split(X, y, groups))
        self.n_splits_ = len(splits)
        # Seeds vary fastest: candidate g under seed j is entry g * n_seeds + j.
        candidates = [(p, seed) for p in grid for seed in self.seeds_]
        if self.verbose > 0:
            verbose_log.info(
                f"Fitting {self.n_splits_} folds for each of {len(grid)} candidates x "
                f"{len(self.seeds_)} seeds, totalling {len(candidates) * self.n_splits_} fits"
            )
        config = get_config()  # every cell carries the caller's set_config settings
        # With report_to: one tracked run per (candidate, seed) (and split), grouped.
        with tracked_group(self) as group:
            out = Parallel(
                n_jobs=self.n_jobs, pre_dispatch=self.pre_dispatch, verbose=self.verbose
            )(
                delayed(_cell)(
                    clone(self.estimator).set_params(
                        **clone(p, safe=False), **{self.seed_param: seed}
                    ),
                    X,
                    y,
                    split,
                    self.scorer_,
                    params,
                    self.return_train_score,
                    self.error_score,
                    config,
                    f"{p} with {self.seed_param}={seed} on split {i}",
                    (group, _run_name(f"candidate={c // len(self.seeds_)}-seed={seed}", i, splits)),
                    getattr(self, "_error_hint", STOP_AT_ERROR),  # compare's tuning: its own
                )
                for c, (p, seed) in enumerate(candidates)
                for i, split in enumerate(splits)
            )
            self.cv_results_ = self._results(list(grid), out, folds=self.cv is not None)
            self._select_best()
            refit_seed = self.seeds_[0]
            if self.evaluation_seeds is not None:
                self._evaluate(X, y, splits, params, config, group)
                refit_seed = self.evaluation_seeds_[0]
            if self.refit:
                best = {**clone(self.best_params_, safe=False), self.seed_param: refit_seed}
                self.best_estimator_ = clone(self.estimator).set_params(**best)
                start = time.perf_counter()
                with member(group, f"refit-seed={refit_seed}"):
                    self.best_estimator_.fit(X_train, y, **params)
                self.refit_time_ = time.perf_counter() - start
        return self

    def _evaluate(self, X, y, splits, params, config, group=None) -> None:
        """Fit and score the selected candidate on every evaluation seed."""
        if not hasattr(self, "best_params_"):
            raise ValueError(
                "SeedSearchCV: evaluation_seeds needs a selected candidate; with several "
                "metrics, name the one that selects it with refit=."
            )
        self.evaluation_seeds_, _ = split_seeds(self.evaluation_seeds, self.seeds_)
        best = self.best_params_
        out = Parallel(n_jobs=self.n_jobs, pre_dispatch=self.pre_dispatch, verbose=self.verbose)(
            delayed(_cell)(
                clone(self.estimator).set_params(**clone(best, safe=False), **{self.seed_param: s}),
                X,
                y,
                split,
                self.scorer_,
                params,
                False,
                self.error_score,
                config,
                f"{best} with {self.seed_param}={s} on split {i} (evaluation)",
                (group, _run_name(f"evaluation-seed={s}", i, splits)),
            )
            for s in self.evaluation_seeds_
            for i, split in enumerate(splits)
        )
        n_splits = len(splits)
        rows = []
        for j, seed in enumerate(self.evaluation_seeds_):
            cells = out[j * n_splits : (j + 1) * n_splits]
            health = [0.0 if "failed" in c else c.get("healthy", np.nan) for c in cells]
            row = {"seed": seed, "healthy": None if np.isnan(health).all() else 0.0 not in health}
            for key in [k for k in cells[0] if k.startswith("test_")] or []:
                row[key] = float(np.mean([c.get(key, self.error_score) for c in cells]))
            rows.append(row)
        table = pd.DataFrame(rows)
        metric = "test_" + (self.refit if isinstance(self.refit, str) else "score")
        if metric not in table:
            metric = next((k for k in table if k.startswith("test_")), None)
        self.evaluation_results_ = table
        self.evaluation_score_ = float(table[metric].mean()) if metric else float("nan")

    def _check_params(self) -> None:
        if not hasattr(self.estimator, "fit") or not hasattr(self.estimator, "get_params"):
            raise TypeError(f"estimator must be a scikit-learn estimator; got {self.estimator!r}.")

        def real(value):
            return isinstance(value, Real) and not isinstance(value, bool)

        c, e, r, n = self.confidence, self.error_score, self.refit, self.n_jobs
        checks = [  # (name, value, whether it is valid, what it must be)
            ("confidence", c, real(c) and 0 < c < 1, "a number strictly between 0 and 1"),
            ("error_score", e, e == "raise" or real(e), "'raise' or a number (np.nan)"),
            ("refit", r, isinstance(r, (bool, str)) or callable(r), "True, False, a metric's name "
             "or a callable"),
            ("n_jobs", n, n is None or isinstance(n, Integral), "an int or None"),
            ("verbose", self.verbose, isinstance(self.verbose, Integral), "an int"),
            ("return_train_score", self.return_train_score,
             isinstance(self.return_train_score, bool), "True or False"),
            ("seed_param", self.seed_param, isinstance(self.seed_param, str), "a parameter name"),
        ]  # fmt: skip
        if self.evaluation_seeds is not None:
            split_seeds(self.evaluation_seeds, self.seeds)  # overlapping seeds fail before any fit
        for name, value, ok, expected in checks:
            if not ok:
                raise ValueError(f"SeedSearchCV: {name}={value!r} must be {expected}.")

    def _check_refit(self, metrics: list) -> None:
        if self.refit is not False and not callable(self.refit) and self.refit not in metrics:
            raise ValueError(
                f"SeedSearchCV scores several metrics {metrics}: refit must name the one that "
                f"picks the best candidate, be a callable, or be False; got refit={self.refit!r}."
            )

    def _results(self, candidate_params: list, out: list, folds: bool) -> dict:
        scored = [o for o in out if "failed" not in o]
        if not scored:
            raise ValueError(
                f"All the {len(out)} fits of SeedSearchCV failed; set error_score='raise' to "
                "see the error."
            )
        names = [k[5:] for k in scored[0] if k.startswith("test_")]
        self.multimetric_ = isinstance(self.scorer_, dict) or names != ["score"]
        if self.multimetric_:
            self._check_refit(names)
        n_seeds, n_splits = len(self.seeds_), self.n_splits_

        def cells(key):  # (candidate, seed, split); a failed cell scores error_score
            values = [o.get(key, self.error_score) for o in out]
            return np.asarray(values, dtype=np.float64).reshape(-1, n_seeds, n_splits)

        results = {}
        for key in ("fit_time", "score_time"):
            times = cells(key)
            results[f"mean_{key}"] = times.mean(axis=(1, 2))
            results[f"std_{key}"] = times.std(axis=(1, 2))
        results.update(_param_arrays(candidate_params))
        results["params"] = candidate_params
        # 1, 0 or NaN (no health_: unknown, taken as healthy); a failed fit is unhealthy.
        healthy = np.asarray(
            [0.0 if "failed" in o else o.get("healthy", np.nan) for o in out], dtype=np.float64
        ).reshape(-1, n_seeds, n_splits)
        n_unhealthy = (healthy == 0).sum(axis=(1, 2))
        for which in ["test"] + (["train"] if self.return_train_score else []):
            for name in names:
                key = f"{which}_{name}"
                rank = n_unhealthy if which == "test" else None
                self._store(results, key, cells(key), rank=rank, folds=folds)
        if not np.isnan([o.get("healthy", np.nan) for o in out]).all():  # some fit has health_
            for j in range(n_seeds):
                results[f"seed{j}_healthy"] = ~np.any(healthy[:, j] == 0, axis=1)
            results["n_unhealthy"] = n_unhealthy
        return results

    def _store(self, results: dict, key: str, scores: np.ndarray, rank, folds: bool):
        # rank: None, or the candidates' unhealthy counts to rank ``key`` with.
        if folds:
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
        if rank is not None:
            results[f"rank_{key}"] = _rank(mean, rank)
            results[f"tied_with_best_{key}"] = _tied_with_best(
                per_seed, results[f"rank_{key}"], self.confidence
            )

    def _select_best(self) -> None:
        """``best_index_``, ``best_score_`` and ``best_params_``, as ``GridSearchCV`` sets them."""
        if self.refit is False and self.multimetric_:
            return
        results = self.cv_results_
        if callable(self.refit):
            best = self.refit(results)
            if not isinstance(best, Integral) or not 0 <= best < len(results["params"]):
                raise ValueError(
                    f"SeedSearchCV: refit returned {best!r}; it must return the index of a "
                    f"candidate, an int in [0, {len(results['params'])})."
                )
        else:
            metric = self.refit if self.multimetric_ else "score"
            best = results[f"rank_test_{metric}"].argmin()
            self.best_score_ = results[f"mean_test_{metric}"][best]
        self.best_index_ = best
        self.best_params_ = results["params"][best]
