"""Aggregates and intervals of careful RL evaluation (Agarwal et al. 2021), over seeds and tasks.

Re-exported by :mod:`prefopt.model_selection`. The interquartile mean of all runs,
stratified bootstrap intervals (runs resampled within each task), the probability
of improvement and performance profiles, the set ``rliable`` implements, built on
``scipy.stats`` (``trim_mean``, ``bootstrap``, ``mannwhitneyu``) so that no further
dependency is needed. Scores come as one array per task (its runs, one per seed:
tasks may have different numbers of seeds), as a dict of task -> runs, or as one
array of shape (n_runs, n_tasks); a 1-d array is one task.
"""

from __future__ import annotations

import inspect

import numpy as np
from scipy import stats

# scipy 1.15 renamed bootstrap's random_state to rng; the oldest supported scipy (1.13) has
# only random_state. Both take a Generator and draw the same resamples from it.
_SEED_KEYWORD = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"


def _tasks(scores) -> list[np.ndarray]:
    """The runs of every task, as a list of 1-d float arrays (NaN runs kept: see callers)."""
    if isinstance(scores, dict):
        tasks = [np.asarray(v, dtype=np.float64).ravel() for v in scores.values()]
    else:
        array = np.asarray(scores, dtype=np.float64)
        if array.ndim == 1:
            tasks = [array]
        elif array.ndim == 2:
            tasks = [array[:, j] for j in range(array.shape[1])]
        else:
            raise ValueError(
                f"scores must be one task's runs (1-d), an array of shape (n_runs, n_tasks) or "
                f"a dict of task -> runs; got an array of shape {array.shape}."
            )
    if not tasks or any(len(t) == 0 for t in tasks):
        raise ValueError("scores must hold at least one run of every task.")
    if any(np.isnan(t).any() for t in tasks):
        raise ValueError(
            "scores hold NaN: a run that failed has no score to aggregate. Give it the score "
            "it ended with (intention to treat), or the scale's worst value, rather than "
            "dropping it."
        )
    return tasks


def iqm(scores) -> float:
    """Interquartile mean of all runs of all tasks: the mean of the middle 50% of scores.

    Parameters
    ----------
    scores : array-like of shape (n_runs,) or (n_runs, n_tasks), or dict of task -> runs
        One score per run (seed), per task.

    Returns
    -------
    iqm : float
        ``scipy.stats.trim_mean(all_scores, 0.25)``: the 25% lowest and 25%
        highest scores of the pooled runs are dropped (a share of a run at a
        boundary, as ``trim_mean`` cuts whole runs only: ``int(0.25 n)`` of
        each end). Less sensitive to one outlying run than the mean, far less
        variable over few seeds than the median (Agarwal et al. 2021).

    References
    ----------
    .. [1] Agarwal, Schwarzer, Castro, Courville & Bellemare 2021, "Deep
       Reinforcement Learning at the Edge of the Statistical Precipice",
       NeurIPS 2021.

    Examples
    --------
    >>> from prefopt.model_selection import iqm
    >>> iqm([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 100.0])  # mean of 3, 4, 5, 6
    4.5
    """
    return float(stats.trim_mean(np.concatenate(_tasks(scores)), 0.25))


def _pooled_iqm(*samples, axis=-1):
    """IQM over the concatenation of the resampled tasks, vectorised over the batch axis."""
    return stats.trim_mean(np.concatenate(samples, axis=axis), 0.25, axis=axis)


def stratified_bootstrap_ci(
    scores,
    statistic=None,
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    method: str = "percentile",
    random_state=0,
):
    """An aggregate of runs over tasks and its stratified bootstrap confidence interval.

    Parameters
    ----------
    scores : array-like of shape (n_runs,) or (n_runs, n_tasks), or dict of task -> runs
        One score per run (seed), per task.
    statistic : callable, default=None
        ``statistic(*tasks, axis=-1)``: the aggregate of one resample, given
        each task's resampled runs (vectorised along ``axis``, as
        ``scipy.stats.bootstrap`` calls it); ``None`` is the IQM of the
        pooled runs (:func:`iqm`).
    confidence : float, default=0.95
        Coverage of the interval.
    n_resamples : int, default=2000
        Bootstrap resamples.
    method : {"percentile", "basic", "BCa"}, default="percentile"
        The interval of ``scipy.stats.bootstrap`` (``rliable``'s default is
        the percentile interval).
    random_state : int or numpy.random.Generator, default=0
        Seeds the resampling, so the interval repeats exactly.

    Returns
    -------
    value, low, high : float
        The statistic on the scores and its interval. NaN bounds when a task
        has a single run (nothing to resample within it).

    Notes
    -----
    Each task's runs are passed to ``scipy.stats.bootstrap`` as a separate
    sample with ``paired=False``, so every resample draws each task's runs
    from that task alone: the stratified bootstrap of Agarwal et al. (2021),
    which keeps every task in every resample and works with 3-10 runs a task,
    where a percentile interval per task would not.

    Examples
    --------
    >>> import numpy as np
    >>> from prefopt.model_selection import stratified_bootstrap_ci
    >>> runs = np.array([[0.1, 0.5], [0.2, 0.6], [0.3, 0.7], [0.4, 0.8]])  # 4 seeds x 2 tasks
    >>> value, low, high = stratified_bootstrap_ci(runs)
    >>> round(value, 4), bool(low <= value <= high)  # the IQM of 0.2, 0.3, 0.5, 0.6
    (0.45, True)
    """
    tasks = _tasks(scores)
    statistic = _pooled_iqm if statistic is None else statistic
    value = statistic(*tasks, axis=-1)
    if min(len(t) for t in tasks) < 2:
        nan = np.full_like(np.asarray(value, dtype=np.float64), np.nan)
        return value, nan, nan.copy()
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence!r}.")
    with np.errstate(invalid="ignore"):
        result = stats.bootstrap(
            tuple(tasks),
            statistic,
            n_resamples=n_resamples,
            paired=False,
            vectorized=True,
            confidence_level=confidence,
            method=method,
            **{_SEED_KEYWORD: np.random.default_rng(random_state)},
        )
    low, high = result.confidence_interval
    if np.ndim(value) == 0:
        return float(value), float(low), float(high)
    return np.asarray(value), np.asarray(low), np.asarray(high)


def improvement(x: np.ndarray, y: np.ndarray, axis: int = -1):
    """Mann-Whitney ``U / (n m)``: the share of (x, y) pairs with x higher, ties half."""
    return stats.mannwhitneyu(x, y, axis=axis).statistic / (x.shape[axis] * y.shape[axis])


def probability_of_improvement(
    scores_x, scores_y, *, confidence: float = 0.95, n_resamples: int = 2000, random_state=0
):
    """P(X > Y): the chance a run of X beats a run of Y on a random task, with its interval.

    Parameters
    ----------
    scores_x, scores_y : array-like of shape (n_runs,) or (n_runs, n_tasks), or dict
        The two algorithms' runs on the same tasks (the runs need not be paired).
    confidence : float, default=0.95
        Coverage of the stratified bootstrap interval.
    n_resamples : int, default=2000
    random_state : int or numpy.random.Generator, default=0

    Returns
    -------
    probability, low, high : float
        The mean over tasks of the Mann-Whitney ``U / (n m)`` of each task
        (pairs where X's run scores higher, ties counted half), Agarwal et
        al. (2021)'s probability of improvement; 0.5 means neither is
        ahead. The interval resamples each algorithm's runs within each task.

    Examples
    --------
    >>> from prefopt.model_selection import probability_of_improvement
    >>> p, low, high = probability_of_improvement([3.0, 4.0, 5.0], [1.0, 2.0, 4.0])
    >>> round(p, 4)  # 7 of the 9 pairs higher, 1 tied: (7 + 0.5) / 9
    0.8333
    """
    xs, ys = _tasks(scores_x), _tasks(scores_y)
    if len(xs) != len(ys):
        raise ValueError(
            f"scores_x has {len(xs)} tasks and scores_y {len(ys)}: give both on the same tasks."
        )
    n = len(xs)

    def statistic(*samples, axis=-1):
        out = [improvement(x, y, axis) for x, y in zip(samples[:n], samples[n:])]
        return np.mean(out, axis=0)

    return stratified_bootstrap_ci(
        {**{f"x{i}": x for i, x in enumerate(xs)}, **{f"y{i}": y for i, y in enumerate(ys)}},
        statistic,
        confidence=confidence,
        n_resamples=n_resamples,
        random_state=random_state,
    )


def performance_profile(scores, thresholds) -> np.ndarray:
    """The share of runs scoring above each threshold (the run-score distribution).

    Parameters
    ----------
    scores : array-like of shape (n_runs,) or (n_runs, n_tasks), or dict of task -> runs
    thresholds : array-like of shape (n_thresholds,)

    Returns
    -------
    profile : ndarray of shape (n_thresholds,)
        For each threshold tau, the mean over tasks of the share of that
        task's runs with a score above tau (Agarwal et al. 2021, Dolan & Moré
        2002): a curve that lies higher is better at every level, and curves
        that cross show where one algorithm's runs are more reliable.

    See Also
    --------
    prefopt.plotting.plot_performance_profile

    Examples
    --------
    >>> from prefopt.model_selection import performance_profile
    >>> performance_profile({"a": [0.1, 0.5], "b": [0.3, 0.9]}, [0.0, 0.4, 1.0]).tolist()
    [1.0, 0.5, 0.0]
    """
    tasks = _tasks(scores)
    taus = np.asarray(thresholds, dtype=np.float64)
    return np.mean([(t[:, None] > taus[None, :]).mean(axis=0) for t in tasks], axis=0)
