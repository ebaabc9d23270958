"""Comparing algorithms over the same seeds: :func:`compare` and its :class:`Comparison`.

Re-exported by :mod:`prefopt.model_selection`; see its docstring.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.base import clone
from sklearn.metrics import check_scoring
from sklearn.utils.parallel import Parallel, delayed

from .._config import config_context, get_config
from ..data import check_prompts
from ._stats import _check_seeds, t_interval

# ----- comparing algorithms ---------------------------------------------------------------


@dataclass
class Comparison:
    """What :func:`compare` returns.

    Parameters
    ----------
    results : pandas.DataFrame
        Tidy: one row per (``algorithm``, ``seed``, ``metric``) with its ``value``.
    summary : pandas.DataFrame
        One row per (``algorithm``, ``metric``): ``n_seeds``, ``mean``, ``std``
        (``ddof=1``), ``ci_low``, ``ci_high``; with a baseline also
        ``diff_mean`` (algorithm minus baseline, paired by seed),
        ``diff_ci_low``, ``diff_ci_high`` and ``p_value`` (the paired t-test
        ``scipy.stats.ttest_rel(algorithm, baseline)``, two-sided, and its
        ``confidence_interval``), NaN on the baseline's own rows.
    seeds : list of int
        The seeds every algorithm was fitted with.
    confidence : float
        Coverage of the intervals in ``summary``.
    baseline : str or None, default=None
        The algorithm the others are compared with.
    fit_times : pandas.DataFrame or None, default=None
        Seconds per fit: ``algorithm``, ``seed``, ``fit_time``.
    estimators : dict of str to list, or None, default=None
        The fitted estimators, one per seed, when ``return_estimators=True``.

    See Also
    --------
    compare, prefopt.plotting.plot_comparison

    Examples
    --------
    >>> import pandas as pd
    >>> from prefopt.model_selection import Comparison
    >>> results = pd.DataFrame({"algorithm": "A", "seed": [0, 1], "metric": "score",
    ...                         "value": [1.0, 1.2]})
    >>> summary = pd.DataFrame({"algorithm": ["A"], "metric": "score", "n_seeds": 2,
    ...                         "mean": [1.1], "std": [0.14], "ci_low": [0.2], "ci_high": [2.0]})
    >>> Comparison(results, summary, seeds=[0, 1], confidence=0.95).summary["mean"].tolist()
    [1.1]
    """

    results: pd.DataFrame
    summary: pd.DataFrame
    seeds: list
    confidence: float
    baseline: str | None = None
    fit_times: pd.DataFrame | None = field(default=None, repr=False)
    estimators: dict | None = field(default=None, repr=False)


def _fit_and_score_seed(estimator, prompts, fit_params, seed_param, seed, scorer, keep, config):
    # The caller's prefopt configuration travels with the task, so worker processes
    # (loky, Ray) use the same device and progress-bar settings as the caller.
    with config_context(**config):
        estimator = clone(estimator).set_params(**{seed_param: seed})
        start = time.perf_counter()
        estimator.fit(prompts, **fit_params)
        fit_time = time.perf_counter() - start
        scores = scorer(estimator, prompts)
    scores = dict(scores) if isinstance(scores, dict) else {"score": scores}
    return {k: float(v) for k, v in scores.items()}, fit_time, estimator if keep else None


def compare(
    estimators: dict,
    prompts,
    *,
    reward_model,
    seeds=5,
    scoring=None,
    baseline=None,
    n_jobs=None,
    confidence: float = 0.95,
    seed_param: str = "random_state",
    return_estimators: bool = False,
) -> Comparison:
    """Fit several algorithms on the same seeds and prompts and compare them.

    Every estimator is cloned, given each seed as its ``random_state`` and
    fitted with ``fit(prompts, reward_model=reward_model)``, then scored on
    ``prompts``. Because every algorithm runs under the same seeds, the
    comparison with a baseline is paired by seed.

    Parameters
    ----------
    estimators : dict of str to estimator
        Names (used as ``algorithm``) and unfitted estimators.
    prompts : list of str or table with a ``prompt`` column, or comparisons
        Training prompts; scores are taken on them too. With
        ``reward_model=None``, any data the estimators fit on, passed as given
        (comparisons for :class:`~prefopt.DPOPolicy`).
    reward_model : callable or None
        The reward every estimator is fitted against (``None``: fit with the
        data only).
    seeds : int or list of int, default=5
        ``n`` means seeds ``0, ..., n-1``.
    scoring : str, callable, list, tuple, dict or None, default=None
        As in :class:`SeedSearchCV`; ``None`` uses each estimator's ``score``.
    baseline : str, default=None
        Name of the algorithm every other one is compared with.
    n_jobs : int, default=None
        (algorithm, seed) fits run in parallel through joblib.
    confidence : float, default=0.95
        Coverage of the intervals.
    seed_param : str, default="random_state"
        The parameter the seed is set on.
    return_estimators : bool, default=False
        Keep the fitted estimators (``Comparison.estimators``).

    Returns
    -------
    comparison : Comparison
        ``results`` (tidy: algorithm, seed, metric, value) and ``summary``.

    See Also
    --------
    SeedSearchCV, prefopt.plotting.plot_comparison

    Notes
    -----
    Ahmadian et al. (2024) compare PPO, RLOO, REINFORCE and RAFT this way on
    language models; in the exact worlds the closed-form optimum tells which
    algorithm got closest, not only which one scored highest.

    References
    ----------
    .. [1] Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
       Optimization for Learning from Human Feedback in LLMs", ACL 2024.

    Examples
    --------
    >>> import prefopt
    >>> from prefopt import RAFTPolicy, RewardModel, RLOOPolicy
    >>> from prefopt.model_selection import compare
    >>> from prefopt.worlds import PreferenceWorld
    >>> prefopt.set_config(show_progress_bar=False)
    >>> world = PreferenceWorld(random_state=0)
    >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
    >>> small = dict(beta=0.3, optimizer="sgd", n_steps=3, batch_size=16)
    >>> algorithms = {
    ...     "RLOO": RLOOPolicy(model=world.policy_model(), learning_rate=2.0, **small),
    ...     "RAFT": RAFTPolicy(model=world.policy_model(), learning_rate=0.3, **small)}
    >>> result = compare(algorithms, world.prompts, reward_model=rm, seeds=2, baseline="RLOO",
    ...                  scoring={"kl": world.scorer("kl")})
    >>> result.results.shape  # 2 algorithms x 2 seeds x 1 metric
    (4, 4)
    >>> result.summary[["algorithm", "metric", "n_seeds"]].values.tolist()
    [['RLOO', 'kl', 2], ['RAFT', 'kl', 2]]
    """
    if not isinstance(estimators, dict) or not estimators:
        raise TypeError("estimators must be a non-empty dict of name -> estimator.")
    if baseline is not None and baseline not in estimators:
        raise ValueError(f"baseline {baseline!r} is not one of the estimators {list(estimators)}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence!r}.")
    seeds = _check_seeds(seeds)
    # With no reward the data pass as given (comparisons, for DPOPolicy); prompts are checked.
    if reward_model is not None:  # prompts are checked; a table keeps its reward columns
        check_prompts(prompts)
    fit_params = {} if reward_model is None else {"reward_model": reward_model}
    for name, est in estimators.items():
        if seed_param not in est.get_params():
            raise ValueError(
                f"{name}: {type(est).__name__} has no parameter {seed_param!r} to "
                "set the seed on; name it with seed_param=."
            )
    scorers = {name: check_scoring(est, scoring) for name, est in estimators.items()}
    jobs = [(name, seed) for name in estimators for seed in seeds]
    out = Parallel(n_jobs=n_jobs)(
        delayed(_fit_and_score_seed)(
            estimators[name],
            prompts,
            fit_params,
            seed_param,
            seed,
            scorers[name],
            return_estimators,
            get_config(),
        )
        for name, seed in jobs
    )

    rows = [
        {"algorithm": name, "seed": seed, "metric": metric, "value": value}
        for (name, seed), (scores, _, _) in zip(jobs, out)
        for metric, value in scores.items()
    ]
    results = pd.DataFrame(rows, columns=["algorithm", "seed", "metric", "value"])
    fit_times = pd.DataFrame(
        [
            {"algorithm": name, "seed": seed, "fit_time": t}
            for (name, seed), (_, t, _) in zip(jobs, out)
        ]
    )
    kept = None
    if return_estimators:
        kept = {
            name: [est for (n, _), (_, _, est) in zip(jobs, out) if n == name]
            for name in estimators
        }
    summary = _summarise(results, list(estimators), seeds, baseline, confidence)
    return Comparison(
        results=results,
        summary=summary,
        seeds=seeds,
        confidence=confidence,
        baseline=baseline,
        fit_times=fit_times,
        estimators=kept,
    )


def _summarise(results, names, seeds, baseline, confidence) -> pd.DataFrame:
    # Not pivot_table: it drops a metric that is NaN on every seed (and then has no seed
    # columns at all); such a metric keeps its rows, with a NaN mean and a warning.
    table = (
        results.set_index(["algorithm", "metric", "seed"])["value"]
        .astype(np.float64)
        .unstack("seed")
        .reindex(columns=seeds)
    )
    metrics = list(dict.fromkeys(results["metric"]))
    rows = []
    for name in names:
        for metric in metrics:
            if (name, metric) not in table.index:
                continue
            values = table.loc[(name, metric)].to_numpy(dtype=np.float64)
            if np.isnan(values).all():
                warnings.warn(
                    f"compare: {metric!r} of {name!r} is NaN on every seed ({seeds}); its "
                    "summary is NaN. Check the scorer, and whether the fits diverged.",
                    RuntimeWarning,
                    stacklevel=3,
                )
            mean, std, low, high = t_interval(values, confidence)
            row = {
                "algorithm": name,
                "metric": metric,
                "n_seeds": len(values),
                "mean": float(mean),
                "std": float(std),
                "ci_low": float(low),
                "ci_high": float(high),
            }
            if baseline is not None:
                row.update(
                    diff_mean=np.nan, diff_ci_low=np.nan, diff_ci_high=np.nan, p_value=np.nan
                )
                if name != baseline and (baseline, metric) in table.index:
                    base = table.loc[(baseline, metric)].to_numpy(dtype=np.float64)
                    with warnings.catch_warnings():  # one seed, or identical runs: NaN, silently
                        warnings.simplefilter("ignore", RuntimeWarning)
                        test = stats.ttest_rel(values, base)
                        diff = test.confidence_interval(confidence)
                    row.update(
                        diff_mean=float(np.mean(values - base)),
                        diff_ci_low=float(diff.low),
                        diff_ci_high=float(diff.high),
                        p_value=float(test.pvalue),
                    )
            rows.append(row)
    return pd.DataFrame(rows)
