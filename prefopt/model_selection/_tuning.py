"""Tuning each algorithm of a comparison on its own grid, over seeds kept apart from evaluation.

Private to :mod:`prefopt.model_selection`; :func:`~prefopt.model_selection.compare`
calls :func:`tune_algorithms` with ``tune=``. Selecting a setting and measuring it
on the same seeds overstates it (the winner's curse: the selected candidate is
the one whose seeds happened to run well), so the selected setting is run again
on fresh evaluation seeds (Henderson et al. 2018; Agarwal et al. 2021).
"""

from __future__ import annotations

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


def tune_algorithms(
    estimators, tune, X, fit_params, *, seeds, scoring, metric, confidence, n_jobs, seed_param
):
    """Run a :class:`SeedSearchCV` per tuned algorithm; the selected settings and the table.

    The rule is the search's ranking: a candidate with any unhealthy (or failed)
    tuning run ranks after every candidate without one, and the mean of
    ``metric`` over the tuning seeds orders each group.
    """
    chosen, tables = {}, []
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
        ).fit(X, **fit_params)
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
                }
            )
    return chosen, pd.DataFrame(tables)
