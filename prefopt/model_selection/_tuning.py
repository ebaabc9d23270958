"""Tuning each algorithm of a comparison on its own grid, over seeds kept apart from evaluation.

Private to :mod:`prefopt.model_selection`; :func:`~prefopt.model_selection.compare`
calls :func:`tune_algorithms` with ``tune=``. Selecting a setting and measuring it
on the same seeds overstates it (the winner's curse: the selected candidate is
the one whose seeds happened to run well), so the selected setting is run again
on fresh evaluation seeds (Henderson et al. 2018; Agarwal et al. 2021).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from sklearn.model_selection import ParameterGrid

from ._search import SeedSearchCV


def check_tune(tune, estimators: dict, seed_param: str) -> dict:
    """``tune`` as ``{name: param_grid}``, every name an algorithm and every parameter its own."""
    if not isinstance(tune, dict) or not tune:
        raise TypeError(
            f"tune must be a non-empty dict of algorithm name -> param_grid; got {tune!r}."
        )
    for name, grid in tune.items():
        if name not in estimators:
            raise ValueError(
                f"tune names {name!r}, which is not one of the estimators {list(estimators)}."
            )
        known = estimators[name].get_params()
        try:
            grids = ParameterGrid(grid).param_grid
        except (TypeError, ValueError) as error:
            raise ValueError(f"tune[{name!r}] is not a parameter grid: {error}") from error
        for one in grids:
            unknown = sorted(set(one) - set(known))
            if unknown:
                raise ValueError(
                    f"tune[{name!r}] names {unknown}, which {type(estimators[name]).__name__} "
                    f"does not take; its parameters are {sorted(known)}."
                )
            if seed_param in one:
                raise ValueError(
                    f"tune[{name!r}] sets {seed_param!r}; the seeds are given as "
                    "tuning_seeds= and seeds=."
                )
    return tune


SCREEN_POWER = 0.9  # the chance a health screen must have of seeing a failing candidate fail
SCREEN_RATE = 0.25  # the failure rate it must catch: 1 run in 4


def catchable_failure_rate(n_seeds: int, power: float = SCREEN_POWER) -> float:
    """The smallest per-run failure rate that ``n_seeds`` runs show at least once w.p. ``power``.

    A candidate whose runs fail independently with rate q shows no failure in n
    runs with probability (1 - q)^n; the screen catches it with probability
    ``power`` when q >= 1 - (1 - power)^(1/n). Two seeds catch only q >= 0.68;
    nine catch one run in four (0.226).

    Examples
    --------
    >>> round(catchable_failure_rate(2), 3), round(catchable_failure_rate(9), 3)
    (0.684, 0.226)
    """
    return float(1 - (1 - power) ** (1 / n_seeds))


def seeds_to_catch(rate: float = SCREEN_RATE, power: float = SCREEN_POWER) -> int:
    """The fewest seeds that catch a failure rate ``rate`` with probability ``power``.

    Examples
    --------
    >>> seeds_to_catch()  # 1 - 0.75**9 = 0.925 >= 0.9 > 1 - 0.75**8 = 0.8999
    9
    """
    return int(np.ceil(np.log(1 - power) / np.log(1 - rate)))


def tune_algorithms(
    estimators, tune, X, fit_params, *, seeds, scoring, metric, confidence, n_jobs, seed_param
):
    """Run a :class:`SeedSearchCV` per tuned algorithm; the selected settings and the table.

    The rule is the search's ranking: a candidate with any unhealthy (or failed)
    tuning run ranks after every candidate without one, and the mean of
    ``metric`` over the tuning seeds orders each group.
    """
    chosen, tables = {}, []
    catches = catchable_failure_rate(len(seeds))
    if catches > SCREEN_RATE:
        warnings.warn(
            f"compare: {len(seeds)} tuning seeds screen the grid for unhealthy runs only "
            f"down to a failure rate of {catches:.2f} (seen at least once with probability "
            f"{SCREEN_POWER}); a setting that fails 1 run in 4 passes unseen with probability "
            f"{(1 - SCREEN_RATE) ** len(seeds):.2f}. Use tuning_seeds={seeds_to_catch()} or "
            "more to catch it (the evaluation seeds count every failure either way).",
            UserWarning,
            stacklevel=3,
        )
    for name, grid in tune.items():
        search = SeedSearchCV(
            estimators[name],
            grid,
            seeds=seeds,
            scoring=scoring,
            refit=False,
            confidence=confidence,
            n_jobs=n_jobs,
            seed_param=seed_param,
        )
        # compare takes no error_score: say what its user can do to see the error.
        search._error_hint = (
            f"compare keeps tuning past it (the failed setting ranks last); to see the error, "
            f"fit estimators[{name!r}] with these parameters alone."
        )
        search.fit(X, **fit_params)
        results = search.cv_results_
        key = "score" if not search.multimetric_ else metric
        if f"rank_test_{key}" not in results:
            metrics = [k[10:] for k in results if k.startswith("rank_test_")]
            raise ValueError(
                f"tuning_metric={metric!r} is not a metric of scoring; use one of {metrics}."
            )
        rank = np.asarray(results[f"rank_test_{key}"])
        best = int(np.argmin(rank))
        unhealthy = results.get("n_unhealthy", np.zeros(len(rank), dtype=int))
        chosen[name] = dict(results["params"][best])
        for i, params in enumerate(results["params"]):
            tables.append(
                {
                    "algorithm": name,
                    "params": dict(params),
                    **{f"param_{k}": v for k, v in params.items()},
                    "metric": key,
                    "mean": float(results[f"mean_test_{key}"][i]),
                    "std": float(results[f"std_test_{key}"][i]),
                    "ci_low": float(results[f"ci_low_test_{key}"][i]),
                    "ci_high": float(results[f"ci_high_test_{key}"][i]),
                    "n_unhealthy": int(unhealthy[i]),
                    "rank": int(rank[i]),
                    "selected": i == best,
                    "catchable_failure_rate": catches,
                }
            )
    return chosen, pd.DataFrame(tables)
