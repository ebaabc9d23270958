"""Figures from ``history_`` and from the exact worlds.

Every function draws on the matplotlib Axes it is given (``ax=``) or on a new
figure, and returns what it drew on, so figures compose: a run in the preference
world next to its closed-form optimum is :func:`plot_exact_path` on the left and
:func:`plot_response_probs` on the right. matplotlib is imported only when a
function is called; it is the optional ``plot`` extra (``pip install 'prefopt[plot]'``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["plot_exact_path", "plot_history", "plot_response_probs"]

DEFAULT_HISTORY_KEYS = ("objective/reward", "objective/kl", "objective/beta", "policy/clipfrac")

_PATH_LABELS = {
    "reward": "reward",
    "true_quality": "true quality",
    "kl": "KL (nats)",
    "objective": "objective",
}


def _pyplot():
    """``matplotlib.pyplot``, imported on first use: matplotlib is the optional ``plot`` extra."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "prefopt.plotting needs matplotlib, which is not installed; install it with "
            "pip install 'prefopt[plot]'"
        ) from error
    return plt


def _new_axes(figsize, **subplots):
    """The Axes of a new figure with constrained layout (``subplots`` as in plt.subplots)."""
    return _pyplot().subplots(figsize=figsize, layout="constrained", **subplots)[1]


def _as_histories(histories) -> list[list[dict]]:
    """One history, several, or fitted estimators -> a list of histories."""
    if hasattr(histories, "history_"):
        return [list(histories.history_)]
    histories = list(histories)
    if not histories:
        raise ValueError("plot_history needs at least one history; got an empty list.")
    if all(isinstance(row, Mapping) for row in histories):
        return [histories]
    out = []
    for i, h in enumerate(histories):
        rows = list(h.history_) if hasattr(h, "history_") else list(h)
        if not rows or not all(isinstance(row, Mapping) for row in rows):
            raise ValueError(
                f"History {i} is not a non-empty list of dicts (a fitted policy's history_)."
            )
        out.append(rows)
    return out


def _curve(history: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    steps = np.array([row.get("step", i + 1) for i, row in enumerate(history)], dtype=float)
    values = np.array(
        [np.nan if row.get(key) is None else row[key] for row in history], dtype=float
    )
    return steps, values


def plot_history(
    histories,
    keys: Sequence[str] = DEFAULT_HISTORY_KEYS,
    *,
    band: str = "std",
    ax=None,
    color=None,
    label=None,
):
    """Training curves from one ``history_`` or from several (one per seed).

    One panel per key. With one history each panel shows its curve; with
    several, the mean over histories at each step and a shaded band: mean
    +- 1 standard deviation (``band="std"``, population std over the
    histories) or the minimum to maximum (``band="minmax"``). Histories are
    aligned on their ``"step"`` values; a step missing from some histories
    is averaged over the others.

    Parameters
    ----------
    histories : list of dict, list of lists of dict, or fitted policies
        A fitted policy's ``history_``, several of them, or the fitted
        policies themselves.
    keys : sequence of str, default=DEFAULT_HISTORY_KEYS
        ``("objective/reward", "objective/kl", "objective/beta", "policy/clipfrac")``.
        History keys to plot. Keys that no history records (RLOO has no
        ``policy/clipfrac``) are skipped.
    band : {"std", "minmax"}, default="std"
        The band drawn around the mean of several histories.
    ax : matplotlib Axes or sequence of Axes, default=None
        One Axes per plotted key; ``None`` makes a new figure with one row of
        panels.
    color : matplotlib color, default=None
        Line and band color (``None`` is "C0"); pass one per call to draw
        several runs on the same Axes.
    label : str, default=None
        Legend label of the line.

    Returns
    -------
    axes : ndarray of matplotlib Axes
        One per plotted key.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from prefopt.plotting import plot_history
    >>> runs = [[{"step": s, "objective/reward": s * seed} for s in (1, 2, 3)]
    ...         for seed in (1, 2)]
    >>> axes = plot_history(runs, keys=["objective/reward", "objective/kl"])
    >>> len(axes)  # "objective/kl" is not recorded
    1
    >>> axes[0].lines[0].get_ydata().tolist()  # the mean over the two seeds
    [1.5, 3.0, 4.5]
    """
    if band not in ("std", "minmax"):
        raise ValueError(f"band must be 'std' or 'minmax'; got {band!r}.")
    if isinstance(keys, str):
        keys = [keys]
    runs = _as_histories(histories)
    recorded = [k for k in keys if any(row.get(k) is not None for h in runs for row in h)]
    if not recorded:
        raise ValueError(f"None of the keys {list(keys)} is recorded in the histories.")
    if ax is None:
        ax = _new_axes((3.6 * len(recorded), 3.0), ncols=len(recorded), squeeze=False)
    axes = np.ravel(np.array(ax, dtype=object))
    if len(axes) != len(recorded):
        raise ValueError(f"Got {len(axes)} Axes for {len(recorded)} recorded keys {recorded}.")

    for a, key in zip(axes, recorded):
        curves = [_curve(h, key) for h in runs]
        steps = np.unique(np.concatenate([s for s, _ in curves]))
        table = np.full((len(curves), len(steps)), np.nan)
        for i, (s, v) in enumerate(curves):
            table[i, np.searchsorted(steps, s)] = v
        c = "C0" if color is None else color
        if len(runs) == 1:
            a.plot(steps, table[0], color=c, label=label)
        else:
            with warnings.catch_warnings():  # a step no run recorded gives NaN, silently
                warnings.simplefilter("ignore", RuntimeWarning)
                mean = np.nanmean(table, axis=0)
                if band == "std":
                    spread = np.nanstd(table, axis=0)
                    low, high = mean - spread, mean + spread
                else:
                    low, high = np.nanmin(table, axis=0), np.nanmax(table, axis=0)
            a.plot(steps, mean, color=c, label=label or f"mean of {len(runs)} runs")
            a.fill_between(
                steps,
                low,
                high,
                color=c,
                alpha=0.25,
                linewidth=0,
                label=None if label else ("±1 std" if band == "std" else "min–max"),
            )
            if a is axes[0] and label is None:  # one legend says it for every panel
                a.legend(fontsize="small")
        a.set_title(key)
        a.set_xlabel("step")
    return axes


def plot_exact_path(
    path: Sequence[Mapping],
    optimum: Mapping,
    keys: Sequence[str] = ("reward", "true_quality", "kl"),
    *,
    ax=None,
):
    """Exact expectations of a policy along training, with the optimum dashed.

    Parameters
    ----------
    path : sequence of dict
        One dict per evaluated step with ``"step"`` and each of ``keys``, for
        example ``dict(step=t, **world.evaluate(policy, reward_model, beta))``.
    optimum : dict
        The closed-form optimum's values of ``keys``
        (:meth:`~prefopt.worlds.PreferenceWorld.optimum`).
    keys : sequence of str, default=("reward", "true_quality", "kl")
        What to plot; each key gets a solid line and, in the same colour, a
        dashed horizontal line at the optimum.
    ax : matplotlib Axes, default=None
        ``None`` makes a new figure.

    Returns
    -------
    ax : matplotlib Axes

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from prefopt.plotting import plot_exact_path
    >>> path = [{"step": 0, "reward": 0.7, "true_quality": 0.9, "kl": 0.0},
    ...         {"step": 1, "reward": 1.2, "true_quality": 1.4, "kl": 0.3}]
    >>> optimum = {"reward": 1.7, "true_quality": 1.7, "kl": 0.7}
    >>> ax = plot_exact_path(path, optimum)
    >>> len(ax.lines)  # a solid and a dashed line per key
    6
    """
    if not path:
        raise ValueError("plot_exact_path needs a non-empty path.")
    missing = [k for k in ("step", *keys) if k not in path[0]]
    missing += [f"optimum[{k!r}]" for k in keys if k not in optimum]
    if missing:
        raise ValueError(
            f"Missing keys {missing}: path rows need 'step' and {list(keys)}, "
            "the optimum needs the same keys."
        )
    if ax is None:
        ax = _new_axes((5.5, 4.0))
    steps = [row["step"] for row in path]
    handles = []
    for i, key in enumerate(keys):
        color = f"C{i}"
        (line,) = ax.plot(
            steps, [row[key] for row in path], color=color, label=_PATH_LABELS.get(key, key)
        )
        ax.axhline(optimum[key], color=color, linestyle="--", linewidth=1.2)
        handles.append(line)
    handles.append(
        _pyplot().Line2D([], [], color="0.4", linestyle="--", label="closed-form optimum")
    )
    ax.legend(handles=handles, fontsize="small")
    ax.set_xlabel("step")
    ax.set_xlim(min(steps), max(steps))
    return ax


def plot_response_probs(
    before,
    after,
    labels: Sequence[str],
    *,
    optimum=None,
    names: Sequence[str] = ("before", "after"),
    ax=None,
):
    """Grouped bars: each response type's probability before and after training.

    Parameters
    ----------
    before, after : array-like of shape (n_prompts, n_responses) or (n_responses,)
        Probabilities of each response type, for instance
        ``world.reference_probs()`` and ``world.policy_probs(policy)``; a 2-D
        table is averaged over prompts.
    labels : sequence of str
        A short name per response type.
    optimum : array-like of the same shape, default=None
        When given (``world.optimal_probs(reward_model, beta)``), the optimum's
        probability is marked by a dashed tick across each pair of bars.
    names : pair of str, default=("before", "after")
        Legend entries of the two sets of bars.
    ax : matplotlib Axes, default=None
        ``None`` makes a new figure.

    Returns
    -------
    ax : matplotlib Axes

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from prefopt.plotting import plot_response_probs
    >>> ax = plot_response_probs([[0.5, 0.5], [0.7, 0.3]], [0.9, 0.1], ["good", "bad"])
    >>> [round(float(bar.get_height()), 2) for bar in ax.patches]  # before (averaged), then after
    [0.6, 0.4, 0.9, 0.1]
    """

    def mean_probs(p, name):
        p = np.asarray(p, dtype=float)
        p = p.mean(axis=0) if p.ndim == 2 else p
        if p.shape != (len(labels),):
            raise ValueError(
                f"{name} has {p.shape[-1] if p.ndim else 0} response types but "
                f"{len(labels)} labels were given."
            )
        return p

    before, after = mean_probs(before, "before"), mean_probs(after, "after")
    if ax is None:
        ax = _new_axes((5.5, 4.0))
    x = np.arange(len(labels))
    width = 0.38
    ax.bar(x - width / 2, before, width, label=names[0], color="0.65")
    ax.bar(x + width / 2, after, width, label=names[1], color="C0")
    if optimum is not None:
        optimum = mean_probs(optimum, "optimum")
        ax.hlines(
            optimum,
            x - width,
            x + width,
            colors="k",
            linestyles="--",
            linewidth=1.2,
            label="closed-form optimum",
        )
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_ylabel("probability (mean over prompts)")
    ax.legend(fontsize="small")
    return ax


# ----- seed-aware searches and comparisons (prefopt.model_selection) ----------------------

__all__ += ["plot_comparison", "plot_search"]


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
    spread the ranking ignores (it ranks by the mean) stays visible.

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
    results = search if isinstance(search, Mapping) else search.cv_results_
    metric = _search_metric(results, metric, getattr(search, "refit", None))
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
    if np.all(x.astype(float) > 0) and x.astype(float).max() >= 10 * x.astype(float).min():
        ax.set_xscale("log")
    ax.set_xlabel(param)
    confidence = getattr(search, "confidence", None)
    interval = f"{confidence:.0%} CI" if confidence is not None else "CI"
    ax.set_ylabel(f"{metric}: mean of {len(seed_keys)} seeds, {interval}")
    if group is not None:
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
    for i, name in enumerate(names):
        values = results[(results["algorithm"] == name) & (results["metric"] == metric)]["value"]
        ax.plot(
            np.full(len(values), x[i] + 0.12),
            values,
            linestyle="none",
            marker=".",
            color="0.5",
            alpha=0.6,
            label="seeds" if i == 0 else None,
        )
    if reference is not None:
        ax.axhline(reference, color="k", linestyle="--", linewidth=1.2, label=reference_label)
    ax.set_xticks(x, names)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylabel(metric)
    ax.legend(fontsize="small")
    return ax
