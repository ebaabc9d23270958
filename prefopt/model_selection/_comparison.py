"""What :func:`~prefopt.model_selection.compare` returns, and how its summary is built.

Re-exported by :mod:`prefopt.model_selection`; see its docstring.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from itertools import permutations

import numpy as np
import pandas as pd
from scipy import stats

from ._aggregates import improvement, stratified_bootstrap_ci
from ._stats import decision_p_value, holm, minimum_detectable_difference, t_interval, verdict

BUDGETS = ("episodes", "tokens", "gradient_steps", "seconds")


@dataclass
class Comparison:
    """What :func:`compare` returns.

    Parameters
    ----------
    results : pandas.DataFrame
        Tidy: one row per (``algorithm``, ``seed``, ``metric``) with its ``value``.
    summary : pandas.DataFrame
        One row per (``algorithm``, ``metric``): ``n_seeds``, ``mean``, ``std``
        (``ddof=1``), ``ci_low``, ``ci_high``, ``n_unhealthy`` (runs whose
        ``health_`` says unhealthy); with a baseline also ``diff_mean``
        (algorithm minus baseline, paired by seed), ``diff_ci_low``,
        ``diff_ci_high``, ``p_value`` (the paired t-test
        ``scipy.stats.ttest_rel(algorithm, baseline)``, two-sided, and its
        ``confidence_interval``), ``mdd`` and ``verdict`` (as in ``verdicts``),
        NaN on the baseline's own rows, and ``p_holm`` and ``verdict_holm`` (as
        in ``verdicts``); ``iqm``, ``iqm_ci_low`` and ``iqm_ci_high`` (the
        interquartile mean over seeds and its bootstrap interval,
        :func:`stratified_bootstrap_ci`); ``empty_floor`` where the metric is a
        win rate (the ``floor`` of :func:`~prefopt.metrics.make_win_rate_scorer`).
        Every seed counts (intention to treat): an unhealthy run keeps the score
        it ended with and is counted in ``n_unhealthy``, never dropped.
    seeds : list of int
        The evaluation seeds every algorithm was fitted with.
    confidence : float
        Coverage of the intervals in ``summary``.
    baseline : str or None, default=None
        The algorithm the others are compared with.
    fit_times : pandas.DataFrame or None, default=None
        Seconds per fit: ``algorithm``, ``seed``, ``fit_time``.
    estimators : dict of str to list, or None, default=None
        The fitted estimators, one per seed, when ``return_estimators=True``.
    runs : pandas.DataFrame or None, default=None
        One row per fit: ``algorithm``, ``seed``, ``healthy`` (``health_["healthy"]``;
        ``None`` for an estimator without ``health_``), ``fit_time`` and the
        ``budget_`` it spent (``episodes``, ``tokens``, ``gradient_steps``,
        ``seconds``; NaN for an estimator without ``budget_``).
    budgets : pandas.DataFrame or None, default=None
        Per algorithm, the mean of each budget over its seeds.
    verdicts : pandas.DataFrame or None, default=None
        Every ordered pair of algorithms per metric: ``algorithm``, ``other``,
        ``metric``, ``diff_mean``, ``diff_ci_low``, ``diff_ci_high``,
        ``p_value``, ``mdd`` (:func:`minimum_detectable_difference` at the
        seeds used) and ``verdict`` (:func:`verdict`; for a metric where lower
        is better, such as a positive KL, "better" means lower), with the
        ``margin`` used; ``prob_improvement`` (the chance that a run of
        ``algorithm`` beats a run of ``other``, ties half: Agarwal et al.
        2021); ``p_decision`` (the p-value of the test behind the verdict,
        :func:`decision_p_value`), ``p_holm`` (Holm-adjusted over every
        unordered pair and metric of this comparison, one family) and
        ``verdict_holm`` (the verdict when ``p_holm`` stays below
        ``(1 - confidence) / 2``, else "inconclusive": read it when several
        verdicts are read together).
    tuning : pandas.DataFrame or None, default=None
        With ``tune=``: one row per (algorithm, candidate) of the tuning, its
        mean, interval, ``n_unhealthy``, ``rank``, whether it was ``selected``
        and ``catchable_failure_rate``: the smallest rate of unhealthy runs the
        tuning seeds show at least once with probability 0.9 (nine seeds catch
        one run in four; fewer warn).
    tuned_params : dict or None, default=None
        The selected setting of each tuned algorithm.
    tuning_seeds : list of int or None, default=None
        The seeds the tuning ran on (disjoint from ``seeds``).
    controls : pandas.DataFrame or None, default=None
        With ``controls=``: per algorithm, control and metric the paired
        ``gain`` of the algorithm over its control run, ``gain_ci_low``,
        ``gain_ci_high``, ``p_value``, ``mdd``, ``verdict`` and, corrected
        over this table (Holm), ``p_holm`` and ``verdict_holm``. The control
        runs' own rows are in ``results`` and ``summary`` as
        ``"<algorithm> [<control> control]"``.
    environment : dict or None, default=None
        What the comparison ran with (:func:`environment`): versions, CPU and
        GPU, threads, commit.
    correction : str or None, default=None
        The multiple-comparison correction behind ``verdict_holm``, stated:
        the method, the family's size and the level each verdict is tested at.

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
    runs: pd.DataFrame | None = field(default=None, repr=False)
    budgets: pd.DataFrame | None = field(default=None, repr=False)
    verdicts: pd.DataFrame | None = field(default=None, repr=False)
    tuning: pd.DataFrame | None = field(default=None, repr=False)
    tuned_params: dict | None = field(default=None, repr=False)
    tuning_seeds: list | None = field(default=None, repr=False)
    controls: pd.DataFrame | None = field(default=None, repr=False)
    environment: dict | None = field(default=None, repr=False)
    correction: str | None = None

    def wide(self) -> pd.DataFrame:
        """The summary with one row per algorithm: ``<metric>``, ``<metric>_ci_low``, ...

        Returns
        -------
        table : pandas.DataFrame
            Indexed by algorithm; per metric its ``mean`` (as ``<metric>``),
            ``_std``, ``_ci_low``, ``_ci_high`` and, with a baseline,
            ``_diff``, ``_p_value``, ``_mdd``, ``_verdict`` and ``_verdict_holm``
            (and ``_iqm``, where the summary has it); then
            ``n_unhealthy`` and the mean budgets.

        Examples
        --------
        >>> import pandas as pd
        >>> from prefopt.model_selection import Comparison
        >>> summary = pd.DataFrame({"algorithm": ["A", "A"], "metric": ["gold", "kl"],
        ...                         "n_seeds": 2, "mean": [1.1, 0.3], "std": [0.1, 0.1],
        ...                         "ci_low": [0.2, 0.1], "ci_high": [2.0, 0.5]})
        >>> table = Comparison(pd.DataFrame(), summary, seeds=[0, 1], confidence=0.95).wide()
        >>> table[["gold", "kl", "kl_ci_high"]].to_dict("records")
        [{'gold': 1.1, 'kl': 0.3, 'kl_ci_high': 0.5}]
        """
        columns = {
            "mean": "",
            "std": "_std",
            "ci_low": "_ci_low",
            "ci_high": "_ci_high",
            "diff_mean": "_diff",
            "p_value": "_p_value",
            "mdd": "_mdd",
            "verdict": "_verdict",
            "verdict_holm": "_verdict_holm",
            "iqm": "_iqm",
            "empty_floor": "_empty_floor",
        }
        names = list(dict.fromkeys(self.summary["algorithm"]))
        table = pd.DataFrame(index=pd.Index(names, name="algorithm"))
        for metric in dict.fromkeys(self.summary["metric"]):
            rows = self.summary[self.summary["metric"] == metric].set_index("algorithm")
            for column, suffix in columns.items():
                if column in rows:
                    table[f"{metric}{suffix}"] = rows[column].reindex(names)
        if "n_unhealthy" in self.summary:
            table["n_unhealthy"] = self.summary.groupby("algorithm")["n_unhealthy"].first()
        if self.budgets is not None:
            table = table.join(self.budgets.set_index("algorithm"))
        return table


def summarise(
    results, names, seeds, baseline, confidence, runs, margins, lower, compared=None
) -> tuple:
    """``summary`` and ``verdicts`` of :class:`Comparison` from the tidy ``results``.

    ``compared``: the algorithms the verdicts pair (default: all ``names``; control runs
    are summarised but compared only with their own algorithm, in :func:`control_gains`).
    """
    compared = names if compared is None else compared
    # Not pivot_table: it drops a metric that is NaN on every seed (and then has no seed
    # columns at all); such a metric keeps its rows, with a NaN mean and a warning.
    table = (
        results.set_index(["algorithm", "metric", "seed"])["value"]
        .astype(np.float64)
        .unstack("seed")
        .reindex(columns=seeds)
    )
    metrics = list(dict.fromkeys(results["metric"]))
    unhealthy = runs.assign(bad=runs["healthy"].eq(False)).groupby("algorithm")["bad"].sum()
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
                "n_unhealthy": int(unhealthy.get(name, 0)),
                **_iqm_interval(values, confidence),
            }
            if baseline is not None:
                row.update(
                    diff_mean=np.nan,
                    diff_ci_low=np.nan,
                    diff_ci_high=np.nan,
                    p_value=np.nan,
                    mdd=np.nan,
                    verdict=None,
                )
                if name != baseline and (baseline, metric) in table.index:
                    base = table.loc[(baseline, metric)].to_numpy(dtype=np.float64)
                    row.update(_paired(values, base, confidence, margins[metric], metric in lower))
            rows.append(row)
    pairs = []
    for metric in metrics:
        for a, b in permutations([n for n in compared if (n, metric) in table.index], 2):
            a_values = table.loc[(a, metric)].to_numpy(dtype=np.float64)
            b_values = table.loc[(b, metric)].to_numpy(dtype=np.float64)
            test = _paired(a_values, b_values, confidence, margins[metric], metric in lower)
            test["prob_improvement"] = _improvement(a_values, b_values, metric in lower)
            pairs.append({"algorithm": a, "other": b, "metric": metric, **test})
            pairs[-1]["margin"] = margins[metric]
    pairs = correct_holm(pd.DataFrame(pairs), confidence).drop(columns="leaning", errors="ignore")
    summary = pd.DataFrame(rows).drop(columns="leaning", errors="ignore")
    if baseline is not None and not pairs.empty:  # the baseline's pairs, from the family
        corrected = pairs[pairs["other"] == baseline].set_index(["algorithm", "metric"])
        at = list(zip(summary["algorithm"], summary["metric"]))
        for column in ("p_holm", "verdict_holm"):
            summary[column] = [corrected[column].get(k, np.nan) for k in at]
        summary.loc[summary["algorithm"] == baseline, "verdict_holm"] = None
    return summary, pairs


def _iqm_interval(values, confidence) -> dict:
    """The IQM over seeds and its bootstrap interval (NaN with a NaN seed or one seed)."""
    if np.isnan(values).any():
        return {"iqm": np.nan, "iqm_ci_low": np.nan, "iqm_ci_high": np.nan}
    value, low, high = stratified_bootstrap_ci(values, confidence=confidence)
    return {"iqm": float(value), "iqm_ci_low": float(low), "iqm_ci_high": float(high)}


def _improvement(values, other, lower_is_better) -> float:
    """P(a run of one beats a run of the other) over seeds, ties half (NaN with a NaN seed)."""
    if np.isnan(values).any() or np.isnan(other).any():
        return np.nan
    sign = -1.0 if lower_is_better else 1.0
    return improvement(sign * values, sign * other)


def control_gains(results, algorithms, controls, confidence, margins, lower) -> pd.DataFrame:
    """Each algorithm's paired gain over each of its control runs, per metric, Holm-corrected.

    ``controls`` maps a control run's row name to ``(algorithm, control)``. A gain
    whose ``verdict_holm`` is not "better" is not shown to come from the reward: the
    control run, with the same settings, tuning and budget, moved as far.
    """
    table = results.set_index(["algorithm", "metric", "seed"])["value"].unstack("seed")
    rows = []
    for row_name, (algorithm, control) in controls.items():
        for metric in dict.fromkeys(results["metric"]):
            if (algorithm, metric) not in table.index or (row_name, metric) not in table.index:
                continue
            a = table.loc[(algorithm, metric)].to_numpy(dtype=np.float64)
            c = table.loc[(row_name, metric)].to_numpy(dtype=np.float64)
            test = _paired(a, c, confidence, margins[metric], metric in lower)
            rows.append({"algorithm": algorithm, "control": control, "metric": metric, **test})
    if not rows:
        return pd.DataFrame()
    out = pd.DataFrame(rows).rename(
        columns={"diff_mean": "gain", "diff_ci_low": "gain_ci_low", "diff_ci_high": "gain_ci_high"}
    )
    out = out.drop(columns="leaning")
    level = (1 - confidence) / 2
    out["p_holm"] = holm(out["p_decision"].to_numpy())
    out["verdict_holm"] = np.where(
        (out["p_holm"] < level) & (out["verdict"] != "inconclusive"), out["verdict"], "inconclusive"
    )
    return out


def _paired(values, base, confidence, margin, lower_is_better) -> dict:
    """The paired t-test of ``values - base`` over seeds, its MDD, verdict and decision p."""
    with warnings.catch_warnings():  # one seed, or identical runs: NaN, silently
        warnings.simplefilter("ignore", RuntimeWarning)
        test = stats.ttest_rel(values, base)
        diff = test.confidence_interval(confidence)
    low, high = float(diff.low), float(diff.high)
    d = values - base
    if np.all(values == base):  # identical runs: a zero difference, known exactly
        low = high = 0.0
    # A lower-is-better metric: the verdict reads the negated interval.
    said = verdict(-high, -low, margin) if lower_is_better else verdict(low, high, margin)
    sign = -1.0 if lower_is_better else 1.0
    n = int(np.sum(~np.isnan(d)))
    se = float(np.nanstd(d, ddof=1) / np.sqrt(n)) if n > 1 else np.nan
    leaning, p_decision = decision_p_value(sign * float(np.nanmean(d)), se, n - 1, margin)
    return {
        "diff_mean": float(np.mean(d)),
        "diff_ci_low": float(diff.low),
        "diff_ci_high": float(diff.high),
        "p_value": float(test.pvalue),
        "mdd": minimum_detectable_difference(d, confidence),
        "verdict": said,
        "leaning": leaning,
        "p_decision": p_decision,
    }


def correction_note(pairs: pd.DataFrame, confidence: float) -> str | None:
    """The sentence that states the correction of ``verdict_holm`` (None without pairs)."""
    if pairs is None or pairs.empty:
        return None
    m = len(pairs) // 2  # a pair and its mirror are one verdict
    return (
        f"Holm (1979) over the {m} verdicts of this comparison (unordered pairs x metrics): "
        f"verdict_holm keeps a verdict whose adjusted p-value is below "
        f"{(1 - confidence) / 2:g}, the level of each one-sided test behind a "
        f"{confidence:g} interval; verdict is uncorrected."
    )


def correct_holm(pairs: pd.DataFrame, confidence: float) -> pd.DataFrame:
    """``p_holm`` and ``verdict_holm``: the verdicts corrected as one family (Holm 1979).

    The family is every unordered pair of algorithms on every metric (a pair
    and its mirror are one verdict). A verdict survives when its decision
    p-value (:func:`decision_p_value`), Holm-adjusted over the family, stays
    below ``(1 - confidence) / 2``, the level of each one-sided test behind a
    two-sided interval; else it reads "inconclusive".
    """
    if pairs.empty:
        return pairs.assign(p_holm=[], verdict_holm=[])
    key = [
        (metric, *sorted((a, b)))
        for a, b, metric in zip(pairs.algorithm, pairs.other, pairs.metric)
    ]
    first = pd.Series(range(len(key))).groupby(pd.Series(key).astype(str)).first()
    adjusted = dict(zip(first.index, holm(pairs["p_decision"].to_numpy()[first.to_numpy()])))
    p_holm = np.array([adjusted[str(k)] for k in key])
    level = (1 - confidence) / 2
    survives = (p_holm < level) & (pairs["verdict"] != "inconclusive").to_numpy()
    return pairs.assign(
        p_holm=p_holm, verdict_holm=np.where(survives, pairs["verdict"], "inconclusive")
    )
