"""Performance profiles: the share of runs above each score, one curve per algorithm."""

from __future__ import annotations

import numpy as np

from ._common import _new_axes


def _task_runs(scores) -> list[np.ndarray]:
    """One 1-d array of runs per task, from a 1-d or (n_runs, n_tasks) array or a dict."""
    if isinstance(scores, dict):
        return [np.asarray(v, dtype=np.float64).ravel() for v in scores.values()]
    array = np.asarray(scores, dtype=np.float64)
    if array.ndim not in (1, 2) or array.size == 0:
        raise ValueError(
            "each algorithm's scores must be one task's runs (1-d), an array of shape "
            f"(n_runs, n_tasks) or a dict of task -> runs; got shape {array.shape}."
        )
    return [array] if array.ndim == 1 else [array[:, j] for j in range(array.shape[1])]


def plot_performance_profile(scores: dict, thresholds=None, *, ax=None):
    """Performance profiles: for each score tau, the share of runs that score above it.

    One curve per algorithm, the mean over tasks of each task's share of runs
    (seeds) above tau, as :func:`prefopt.model_selection.performance_profile`
    computes it (Agarwal et al. 2021). A curve above another is better at every
    level; crossing curves show one algorithm's runs more spread.

    Parameters
    ----------
    scores : dict of str to array-like or dict
        Per algorithm, its runs: a 1-d array (one task), an array of shape
        (n_runs, n_tasks), or a dict of task -> runs.
    thresholds : array-like, default=None
        The taus; ``None`` takes 101 from the lowest to the highest score.
    ax : matplotlib Axes, default=None
        ``None`` makes a new figure.

    Returns
    -------
    ax : matplotlib Axes

    Raises
    ------
    ImportError
        Without matplotlib, naming the command that installs it
        (``pip install 'prefopt[plot]'``).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from prefopt.plotting import plot_performance_profile
    >>> ax = plot_performance_profile({"PPO": [0.2, 0.6, 0.9], "RLOO": [0.1, 0.3, 0.5]},
    ...                               thresholds=[0.0, 0.4, 1.0])
    >>> [line.get_ydata().round(3).tolist() for line in ax.lines]
    [[1.0, 0.667, 0.0], [1.0, 0.333, 0.0]]
    """
    if not isinstance(scores, dict) or not scores:
        raise TypeError("scores must be a non-empty dict of algorithm name -> its runs.")
    runs = {name: _task_runs(value) for name, value in scores.items()}
    if thresholds is None:
        pooled = np.concatenate([t for tasks in runs.values() for t in tasks])
        thresholds = np.linspace(np.nanmin(pooled), np.nanmax(pooled), 101)
    taus = np.asarray(thresholds, dtype=np.float64)
    ax = ax if ax is not None else _new_axes((5, 3.5))
    for name, tasks in runs.items():
        share = np.mean([(t[:, None] > taus[None, :]).mean(axis=0) for t in tasks], axis=0)
        ax.step(taus, share, where="post", label=name)
    ax.set_xlabel("score tau")
    ax.set_ylabel("share of runs with score > tau")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    return ax
