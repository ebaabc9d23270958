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


def verdict(ci_low: float, ci_high: float, margin: float | None = None) -> str:
    """``"better"``, ``"worse"``, ``"equivalent"`` or ``"inconclusive"`` from a difference's CI.

    Parameters
    ----------
    ci_low, ci_high : float
        The confidence interval of the mean difference (algorithm minus
        baseline, larger is better).
    margin : float, default=None
        The equivalence margin: differences within ``(-margin, margin)`` do not
        matter. ``None``: no equivalence verdict.

    Returns
    -------
    verdict : str
        ``"equivalent"`` when the whole interval lies within the margin (two
        one-sided tests at the interval's level, Schuirmann 1987); else
        ``"better"`` when it lies above 0, ``"worse"`` below 0, and
        ``"inconclusive"`` otherwise (or when the interval is NaN).

    Examples
    --------
    >>> from prefopt.model_selection import verdict
    >>> verdict(0.1, 0.3), verdict(-0.3, -0.1), verdict(-0.1, 0.3)
    ('better', 'worse', 'inconclusive')
    >>> verdict(-0.02, 0.03, margin=0.05)
    'equivalent'
    """
    if np.isnan(ci_low) or np.isnan(ci_high):
        return "inconclusive"
    if margin is not None and -margin < ci_low and ci_high < margin:
        return "equivalent"
    if ci_low > 0:
        return "better"
    if ci_high < 0:
        return "worse"
    return "inconclusive"
