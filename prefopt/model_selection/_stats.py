"""Statistics over seeds shared by the searches and the comparisons."""

from __future__ import annotations

import warnings
from numbers import Integral

import numpy as np
from scipy import stats


def t_interval(values, confidence: float = 0.95, axis: int = -1):
    """Mean, sample standard deviation and Student-t confidence interval over seeds.

    Parameters
    ----------
    values : array-like
        Scores, one per seed along ``axis``.
    confidence : float, default=0.95
        Coverage of the interval.
    axis : int, default=-1
        The seed axis.

    Returns
    -------
    mean, std, low, high : ndarray or float
        ``std`` uses ``ddof=1`` (the unbiased variance of the seed-to-seed
        spread, and the one the t interval is built from); the interval is
        ``mean +- t_{(1+confidence)/2, n-1} std / sqrt(n)``, the one of
        ``scipy.stats.ttest_1samp(values, 0).confidence_interval(confidence)``.
        With one seed ``std``, ``low`` and ``high`` are NaN.

    Examples
    --------
    >>> from prefopt.model_selection import t_interval
    >>> mean, std, low, high = t_interval([1.0, 2.0, 3.0])
    >>> float(mean), float(std)
    (2.0, 1.0)
    >>> round(float(low), 4), round(float(high), 4)  # 2 -+ 4.3027 / sqrt(3)
    (-0.4841, 4.4841)
    """
    values = np.asarray(values, dtype=np.float64)
    mean = values.mean(axis=axis)
    if values.shape[axis] < 2:
        nan = np.full_like(mean, np.nan)
        return mean, nan, nan.copy(), nan.copy()
    with warnings.catch_warnings():  # seeds that all score the same: a zero-width interval
        warnings.simplefilter("ignore", RuntimeWarning)
        interval = stats.ttest_1samp(values, 0.0, axis=axis).confidence_interval(confidence)
    return mean, values.std(axis=axis, ddof=1), interval.low, interval.high


def _check_seeds(seeds) -> list[int]:
    """Seeds as a list of distinct ints in [0, 2**32), the range numpy's RandomState takes."""
    if isinstance(seeds, Integral) and not isinstance(seeds, (bool, np.bool_)):
        if seeds < 1:
            raise ValueError(f"seeds must be >= 1 or a list of seeds; got {seeds!r}.")
        if seeds > _N_SEEDS:
            raise ValueError(
                f"seeds={seeds!r} asks for more seeds than there are ({_N_SEEDS}); pass a "
                "smaller number."
            )
        return list(range(int(seeds)))
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise TypeError(
            f"seeds must be an int n (seeds 0..n-1) or a list of int seeds; got {seeds!r}."
        )
    out = list(seeds)
    for s in out:
        # int(1.5) would silently be seed 1, and a seed past 2**32 - 1 fails in every fit
        # (numpy's RandomState), leaving a ranking of NaN scores.
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, Integral):
            raise TypeError(
                f"seeds must be integers; got {s!r} ({type(s).__name__}) in {seeds!r}. "
                "Pass whole numbers such as [0, 1, 2]."
            )
        if not 0 <= s < _N_SEEDS:
            raise ValueError(
                f"seeds must be in [0, 2**32) (numpy's RandomState takes no other); got {s!r} "
                f"in {seeds!r}."
            )
    out = [int(s) for s in out]
    if not out or len(set(out)) != len(out):
        raise ValueError(f"seeds must be a non-empty list of distinct seeds; got {seeds!r}.")
    return out


_N_SEEDS = 2**32


def split_seeds(seeds, tuning_seeds) -> tuple[list[int], list[int]]:
    """Evaluation and tuning seeds, disjoint.

    Two lists must not overlap (a clear error names the shared seeds). A count
    ``n`` takes the first ``n`` seeds ``0, 1, ...`` not in the other list;
    with two counts the evaluation seeds are ``0..n-1`` and the tuning seeds
    the next ones.
    """
    counts = [isinstance(s, Integral) and not isinstance(s, bool) for s in (seeds, tuning_seeds)]
    if counts[0] and not counts[1]:
        tuning = _check_seeds(tuning_seeds)
        return _first_free(_check_seeds(seeds), set(tuning)), tuning
    evaluation = _check_seeds(seeds)
    if counts[1]:
        return evaluation, _first_free(_check_seeds(tuning_seeds), set(evaluation))
    tuning = _check_seeds(tuning_seeds)
    shared = sorted(set(evaluation) & set(tuning))
    if shared:
        raise ValueError(
            f"tuning_seeds {tuning} and seeds {evaluation} share {shared}: a setting "
            "selected on a seed and measured on it again is overstated. Give disjoint "
            "lists, or counts (the tuning seeds then follow the evaluation seeds)."
        )
    return evaluation, tuning


def _first_free(count: list[int], taken: set) -> list[int]:
    """As many seeds as ``count`` holds (``0..n-1``), the first ones not in ``taken``."""
    out, seed = [], 0
    while len(out) < len(count) and seed < _N_SEEDS:
        if seed not in taken:
            out.append(seed)
        seed += 1
    return out


def minimum_detectable_difference(
    differences, confidence: float = 0.95, power: float = 0.8
) -> float:
    """The smallest true mean difference a paired t-test over these seeds would likely find.

    Parameters
    ----------
    differences : array-like
        Paired differences, one per seed (algorithm minus baseline).
    confidence : float, default=0.95
        ``1 - alpha`` of the two-sided test.
    power : float, default=0.8
        The chance of finding a true difference of the returned size.

    Returns
    -------
    mdd : float
        ``(t_{1-alpha/2, n-1} + t_{power, n-1}) * s_d / sqrt(n)``, with ``s_d``
        the standard deviation of the differences (``ddof=1``) and ``n`` the
        seeds: the usual approximation of a paired t-test's power (Cohen
        1988, ch. 2), with the t quantiles for the few seeds of RL runs. NaN
        with fewer than two seeds.

    Examples
    --------
    >>> from prefopt.model_selection import minimum_detectable_difference
    >>> round(minimum_detectable_difference([0.1, -0.1, 0.3, 0.1, 0.1]), 4)
    0.2351
    """
    d = np.asarray(differences, dtype=np.float64)
    d = d[~np.isnan(d)]
    n = len(d)
    if n < 2:
        return float("nan")
    alpha = 1.0 - confidence
    quantiles = stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)
    return float(quantiles * d.std(ddof=1) / np.sqrt(n))


VERDICTS = ("worse", "equivalent", "better")  # the regions of the line, low to high


def _region(x: float, margin: float | None) -> int:
    """0, 1 or 2: the region of ``verdict``'s partition that the point ``x`` lies in.

    With a margin m the line is cut at -m and +m: worse ``(-inf, -m]``, equivalent
    ``(-m, m)``, better ``[m, inf)``; without one it is cut at 0 and the point 0 is in no
    region (returned as 1, "equivalent", which no interval without a margin reaches as a
    whole: see :func:`verdict`).
    """
    cut = 0.0 if margin is None else float(margin)
    if margin is None:
        return 0 if x < 0 else (2 if x > 0 else 1)
    return 0 if x <= -cut else (2 if x >= cut else 1)


def verdict(ci_low: float, ci_high: float, margin: float | None = None) -> str:
    """``"better"``, ``"worse"``, ``"equivalent"`` or ``"inconclusive"`` from a difference's CI.

    Parameters
    ----------
    ci_low, ci_high : float
        The confidence interval of the mean difference (algorithm minus
        baseline, larger is better).
    margin : float, default=None
        The smallest difference that matters: differences within
        ``(-margin, margin)`` are called none. ``None``: no equivalence verdict,
        and any difference of the right sign matters.

    Returns
    -------
    verdict : str
        The margin cuts the line into three regions, worse ``(-inf, -margin]``,
        equivalent ``(-margin, margin)`` and better ``[margin, inf)`` (without
        a margin: worse below 0, better above 0). The verdict is the region
        that holds the **whole** interval, and ``"inconclusive"`` when the
        interval reaches into two or three of them (or is NaN):

        ======================================  =================
        where the interval lies                  verdict
        ======================================  =================
        ``high <= -margin``                      ``"worse"``
        ``low <= -margin < high < margin``       ``"inconclusive"``
        ``low <= -margin``, ``high >= margin``   ``"inconclusive"``
        ``-margin < low``, ``high < margin``     ``"equivalent"``
        ``-margin < low < margin <= high``       ``"inconclusive"``
        ``low >= margin``                        ``"better"``
        ======================================  =================

        Without a margin: ``"better"`` when ``low > 0``, ``"worse"`` when
        ``high < 0``, else ``"inconclusive"``.

    Notes
    -----
    The rule is monotone in two senses. A narrower interval inside a wider
    one never gets another decisive verdict (more seeds can only settle an
    inconclusive verdict, never turn "equivalent" into "better"), and moving
    the interval up moves the verdict along worse, inconclusive, equivalent,
    inconclusive, better, never back. The older reading, "equivalent" inside
    the margin, else "better" when the interval excludes 0, broke the first:
    [0.001, 0.019] with margin 0.02 read "equivalent" and the noisier
    [0.001, 0.021] "better". "better" with a margin is thus better by at least
    the margin (a minimum-effect test, Murphy & Myors 1999), "equivalent" the
    two one-sided tests of Schuirmann (1987), each at the interval's level
    (Lakens et al. 2018 tabulate the same regions).

    References
    ----------
    .. [1] Schuirmann 1987, "A comparison of the two one-sided tests procedure
       and the power approach for assessing the equivalence of average
       bioavailability", J. Pharmacokinet. Biopharm. 15(6).
    .. [2] Murphy & Myors 1999, "Testing the hypothesis that treatments have
       negligible effects: minimum-effect tests in the general linear model",
       J. Appl. Psychol. 84(2).
    .. [3] Lakens, Scheel & Isager 2018, "Equivalence testing for
       psychological research: a tutorial", AMPPS 1(2).

    Examples
    --------
    >>> from prefopt.model_selection import verdict
    >>> verdict(0.1, 0.3), verdict(-0.3, -0.1), verdict(-0.1, 0.3)
    ('better', 'worse', 'inconclusive')
    >>> verdict(-0.02, 0.03, margin=0.05)
    'equivalent'
    >>> verdict(0.001, 0.019, margin=0.02), verdict(0.001, 0.021, margin=0.02)
    ('equivalent', 'inconclusive')
    """
    if np.isnan(ci_low) or np.isnan(ci_high):
        return "inconclusive"
    low, high = _region(ci_low, margin), _region(ci_high, margin)
    if low != high or (margin is None and low == 1):
        return "inconclusive"
    return VERDICTS[low]


def claim_status(ci_low: float, ci_high: float, margin: float | None, holds) -> str:
    """``"held"``, ``"refuted"`` or ``"undecided"``: a claim that is a union of verdicts.

    Parameters
    ----------
    ci_low, ci_high : float
        The confidence interval of the difference.
    margin : float or None
        As in :func:`verdict`.
    holds : str or sequence of str
        The verdicts under which the claim holds: ``("better",)`` for "A beats
        B by at least the margin", ``("better", "equivalent")`` for "A is not
        worse than B" (non-inferiority).

    Returns
    -------
    status : str
        ``"held"`` when every region of :func:`verdict` the interval reaches is
        one of ``holds``, ``"refuted"`` when none is, ``"undecided"``
        otherwise (and for a NaN interval). An interval inside
        ``(-margin, inf)`` holds "better or equivalent" even though its
        :func:`verdict` is "inconclusive" (it reaches both regions). Monotone as
        :func:`verdict` is: a narrower interval inside a wider one never
        changes "held" into "refuted" or back.

    Examples
    --------
    >>> from prefopt.model_selection import claim_status
    >>> claim_status(-0.01, 0.05, 0.02, ("better", "equivalent"))
    'held'
    >>> claim_status(-0.01, 0.05, 0.02, "better"), claim_status(-0.01, 0.01, 0.02, "better")
    ('undecided', 'refuted')
    """
    holds = (holds,) if isinstance(holds, str) else tuple(holds)
    unknown = [h for h in holds if h not in VERDICTS]
    if unknown or not holds:
        raise ValueError(f"holds must name verdicts among {list(VERDICTS)}; got {holds!r}.")
    if np.isnan(ci_low) or np.isnan(ci_high):
        return "undecided"
    if margin is None:  # two regions and the point 0 between them, which decides nothing
        said = verdict(ci_low, ci_high)
        return "undecided" if said == "inconclusive" else ("held" if said in holds else "refuted")
    reached = {VERDICTS[r] for r in range(_region(ci_low, margin), _region(ci_high, margin) + 1)}
    if reached <= set(holds):
        return "held"
    return "refuted" if not reached & set(holds) else "undecided"


def decision_p_value(mean: float, se: float, df: float, margin: float | None) -> tuple[str, float]:
    """The region :func:`verdict` leans to and the p-value of the test that would decide it.

    An interval of coverage ``c`` lies wholly in a region of :func:`verdict`
    exactly when that region's one-sided test(s) reject at ``(1 - c) / 2``:
    better, ``H0: mean <= margin`` (0 without a margin); worse,
    ``H0: mean >= -margin``; equivalent, both one-sided tests of Schuirmann
    (1987), ``H0: |mean| >= margin``, whose p-value is the larger of the two.
    Returns the region with the smallest such p-value, and that p-value, so a
    family of verdicts can be corrected (Holm 1979) on the p-values.
    """
    if not np.isfinite(mean) or not np.isfinite(se) or df < 1:
        return "inconclusive", 1.0
    cut = 0.0 if margin is None else float(margin)
    mean, se = np.float64(mean), np.float64(se)  # numpy division: 0 spread gives +-inf or NaN
    with np.errstate(divide="ignore", invalid="ignore"):
        p = {
            "better": stats.t.sf((mean - cut) / se, df),
            "worse": stats.t.cdf((mean + cut) / se, df),
        }
        if margin is not None:
            p["equivalent"] = max(
                stats.t.sf((mean + cut) / se, df), stats.t.cdf((mean - cut) / se, df)
            )
    p = {k: (1.0 if np.isnan(v) else float(v)) for k, v in p.items()}
    region = min(p, key=p.get)
    return region, p[region]


def holm(p_values) -> np.ndarray:
    """Holm's (1979) step-down adjusted p-values of one family of tests.

    scipy offers only false-discovery-rate adjustments
    (``scipy.stats.false_discovery_control``); Holm's controls the chance of
    any false verdict in the family, which is what a list of verdicts is read
    for.

    Parameters
    ----------
    p_values : array-like of shape (m,)
        The p-values of the family's tests.

    Returns
    -------
    adjusted : ndarray of shape (m,)
        The i-th smallest p-value multiplied by ``m - i + 1``, made
        non-decreasing in that order and capped at 1; reject where it is
        below the family's level.

    Examples
    --------
    >>> holm([0.01, 0.04, 0.03]).round(2).tolist()
    [0.03, 0.06, 0.06]
    """
    p = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    m = len(p)
    stepped = np.maximum.accumulate(p[order] * (m - np.arange(m)))
    out = np.empty(m)
    out[order] = np.minimum(stepped, 1.0)
    return out
