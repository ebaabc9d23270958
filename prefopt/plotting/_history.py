"""Training curves, exact paths and response probabilities."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from ._common import _new_axes, _pyplot

DEFAULT_HISTORY_KEYS = ("objective/reward", "objective/kl", "objective/beta", "policy/clipfrac")

_PATH_LABELS = {
    "reward": "reward",
    "true_quality": "true quality",
    "kl": "KL (nats)",
    "objective": "objective",
}


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
