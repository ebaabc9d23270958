"""Searches and comparisons across seeds, with confidence intervals."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from ._common import _new_axes


def _search_metric(results: Mapping, metric, refit) -> str:
    metrics = [k[len("mean_test_") :] for k in results if k.startswith("mean_test_")]
    if metric is None:
        if len(metrics) == 1:
            return metrics[0]
        if isinstance(refit, str) and refit in metrics:
            return refit
        raise ValueError(f"The search scored several metrics {metrics}; choose one with metric=.")
    if metric not in metrics:
        raise ValueError(f"metric {metric!r} is not in the search's results; it has {metrics}.")
    return metric


def _param_values(results: Mapping, name: str) -> np.ndarray:
    key = f"param_{name}"
    if key not in results:
        names = [k[len("param_") :] for k in results if k.startswith("param_")]
        raise ValueError(f"The search has no parameter {name!r}; it searched {names}.")
    return np.asarray(np.ma.getdata(results[key]), dtype=object)


def plot_search(
    search, param: str = "beta", group: str | None = "k", metric: str | None = None, *, ax=None
):
    """A seed-aware search's mean score against one parameter, one line per group.

    Each point is a candidate's mean over seeds with its confidence interval as
    an error bar; the scores of the single seeds are the small dots around it, so the
    spread the ranking ignores (it ranks by the mean) stays visible. A seed whose
    run was unhealthy (``seed<j>_healthy`` is False) is a red cross.

    Parameters
    ----------
    search : SeedSearchCV or dict
        A fitted :class:`~prefopt.model_selection.SeedSearchCV`, or its
        ``cv_results_``.
    param : str, default="beta"
        The parameter on the x axis (a log scale when its values are positive
        and span a factor of 10 or more).
    group : str or None, default="k"
        One line per value of this parameter; ``None`` (or a parameter the
        search did not vary) draws one line. Any other parameter must take a
        single value.
    metric : str, default=None
        The metric of a multi-metric search; ``None`` takes the only one, or
        the one ``refit`` names.
    ax : matplotlib Axes, default=None
        ``None`` makes a new figure.

    Returns
    -------
    ax : matplotlib Axes

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from prefopt.plotting import plot_search
    >>> results = {"params": [{"beta": 0.1, "k": 2}, {"beta": 1.0, "k": 2}],
    ...            "param_beta": [0.1, 1.0], "param_k": [2, 2],
    ...            "mean_test_score": [1.0, 2.0], "ci_low_test_score": [0.5, 1.8],
    ...            "ci_high_test_score": [1.5, 2.2],
    ...            "seed0_test_score": [0.9, 2.1], "seed1_test_score": [1.1, 1.9]}
    >>> ax = plot_search(results)
    >>> ax.lines[0].get_ydata().tolist(), ax.get_xscale()
    ([1.0, 2.0], 'log')
    """
    fitted = not isinstance(search, Mapping)  # a SeedSearchCV, or its cv_results_
    results = search.cv_results_ if fitted else search
    metric = _search_metric(results, metric, search.refit if fitted else None)
    x = _param_values(results, param)
    varied = {
        k[len("param_") :]
        for k in results
        if k.startswith("param_")
        and len(set(map(repr, _param_values(results, k[len("param_") :])))) > 1
    }
    if group is not None and group not in varied:
        group = None
    others = sorted(varied - {param} - ({group} if group else set()))
    if others:
        raise ValueError(
            f"The search also varies {others}; plot a search over {param!r} "
            f"{'and ' + repr(group) + ' ' if group else ''}only, or group by one "
            "of them."
        )
    mean = np.asarray(results[f"mean_test_{metric}"], dtype=float)
    low = np.asarray(results[f"ci_low_test_{metric}"], dtype=float)
    high = np.asarray(results[f"ci_high_test_{metric}"], dtype=float)
    pattern = re.compile(rf"seed(\d+)_test_{re.escape(metric)}")
    seed_keys = sorted(
        (k for k in results if pattern.fullmatch(k)),
        key=lambda k: int(pattern.fullmatch(k).group(1)),
    )
    seeds = np.array([np.asarray(results[k], dtype=float) for k in seed_keys]).reshape(
        len(seed_keys), len(mean)
    )
    # seed<j>_healthy (when the fits report health_); seeds without it count as healthy.
    healthy = [
        np.asarray(results.get(f"seed{pattern.fullmatch(k).group(1)}_healthy", True), dtype=bool)
        * np.ones(len(mean), dtype=bool)
        for k in seed_keys
    ]
    marked = False
    groups = [None] if group is None else sorted(set(_param_values(results, group)), key=repr)
    if ax is None:
        ax = _new_axes((5.5, 4.0))
    for i, g in enumerate(groups):
        rows = (
            np.arange(len(mean))
            if g is None
            else np.flatnonzero([v == g for v in _param_values(results, group)])
        )
        rows = rows[np.argsort(x[rows].astype(float))]
        xs = x[rows].astype(float)
        color = f"C{i}"
        ax.errorbar(
            xs,
            mean[rows],
            yerr=[mean[rows] - low[rows], high[rows] - mean[rows]],
            color=color,
            marker="o",
            capsize=3,
            label=None if g is None else f"{group}={g}",
        )
        for s in seeds:
            ax.plot(xs, s[rows], linestyle="none", marker=".", color=color, alpha=0.35)
        for s, ok in zip(seeds, healthy):  # the seeds whose run was unhealthy: a red cross
            bad = ~ok[rows]
            if bad.any():
                ax.plot(xs[bad], s[rows][bad], linestyle="none", marker="x", color="C3",
                        label=None if marked else "unhealthy run")  # fmt: skip
                marked = True
    if np.all(x.astype(float) > 0) and x.astype(float).max() >= 10 * x.astype(float).min():
        ax.set_xscale("log")
    ax.set_xlabel(param)
    confidence = search.confidence if fitted else None
    interval = f"{confidence:.0%} CI" if confidence is not None else "CI"
    ax.set_ylabel(f"{metric}: mean of {len(seed_keys)} seeds, {interval}")
    if group is not None or marked:
        ax.legend(fontsize="small")
    return ax


def plot_comparison(
    comparison,
    metric: str | None = None,
    *,
    reference: float | None = None,
    reference_label: str = "closed-form optimum",
    ax=None,
):
    """Each algorithm's mean score with its confidence interval, and each seed's score.

    Seeds whose run was unhealthy (``comparison.runs["healthy"]`` is False)
    are marked with a red cross, so a mean pulled down by failed runs shows
    as such.

    Parameters
    ----------
    comparison : Comparison
        What :func:`~prefopt.model_selection.compare` returned.
    metric : str, default=None
        The metric to show; ``None`` takes the first one scored.
    reference : float, default=None
        A value to mark with a dashed line, e.g. the closed-form optimum's
        ``world.optimum(rm, beta)["objective"]``.
    reference_label : str, default="closed-form optimum"
        Its legend entry.
    ax : matplotlib Axes, default=None
        ``None`` makes a new figure.

    Returns
    -------
    ax : matplotlib Axes

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import pandas as pd
    >>> from prefopt.model_selection import Comparison
    >>> from prefopt.plotting import plot_comparison
    >>> results = pd.DataFrame({"algorithm": ["A", "A", "B", "B"], "seed": [0, 1, 0, 1],
    ...                         "metric": "score", "value": [1.0, 1.2, 2.0, 2.4]})
    >>> summary = pd.DataFrame({"algorithm": ["A", "B"], "metric": "score", "n_seeds": 2,
    ...                         "mean": [1.1, 2.2], "std": [0.14, 0.28],
    ...                         "ci_low": [0.2, 0.4], "ci_high": [2.0, 4.0]})
    >>> ax = plot_comparison(Comparison(results, summary, seeds=[0, 1], confidence=0.95))
    >>> ax.lines[0].get_ydata().tolist(), [t.get_text() for t in ax.get_xticklabels()]
    ([1.1, 2.2], ['A', 'B'])
    """
    summary, results = comparison.summary, comparison.results
    metrics = list(dict.fromkeys(summary["metric"]))
    if metric is None:
        metric = metrics[0]
    elif metric not in metrics:
        raise ValueError(f"metric {metric!r} is not in the comparison; it has {metrics}.")
    rows = summary[summary["metric"] == metric]
    names = rows["algorithm"].tolist()
    mean = rows["mean"].to_numpy(dtype=float)
    low, high = rows["ci_low"].to_numpy(dtype=float), rows["ci_high"].to_numpy(dtype=float)
    if ax is None:
        ax = _new_axes((1.2 * len(names) + 2.5, 4.0))
    x = np.arange(len(names))
    ax.errorbar(
        x,
        mean,
        yerr=[mean - low, high - mean],
        linestyle="none",
        marker="o",
        color="C0",
        capsize=4,
        label=f"mean, {comparison.confidence:.0%} CI",
    )
    unhealthy = _unhealthy_seeds(comparison)
    marked = False
    for i, name in enumerate(names):
        seeds = results[(results["algorithm"] == name) & (results["metric"] == metric)]
        ax.plot(
            np.full(len(seeds), x[i] + 0.12),
            seeds["value"],
            linestyle="none",
            marker=".",
            color="0.5",
            alpha=0.6,
            label="seeds" if i == 0 else None,
        )
        bad = seeds[seeds["seed"].isin(unhealthy.get(name, ()))]["value"]
        if len(bad):
            ax.plot(
                np.full(len(bad), x[i] + 0.12),
                bad,
                linestyle="none",
                marker="x",
                markersize=8,
                color="C3",
                label=None if marked else "unhealthy run",
            )
            marked = True
    if reference is not None:
        ax.axhline(reference, color="k", linestyle="--", linewidth=1.2, label=reference_label)
    ax.set_xticks(x, names)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylabel(metric)
    ax.legend(fontsize="small")
    return ax


def _unhealthy_seeds(comparison) -> dict:
    """``{algorithm: [seed, ...]}`` of the runs whose health says unhealthy."""
    runs = getattr(comparison, "runs", None)
    if runs is None or "healthy" not in runs:
        return {}
    bad = runs[runs["healthy"].eq(False)]
    return bad.groupby("algorithm")["seed"].apply(list).to_dict()
