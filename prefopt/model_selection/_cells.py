"""The cells of a seed search: one fit and score each, and the layout of their results.

Private to :mod:`prefopt.model_selection`; :class:`~prefopt.model_selection.SeedSearchCV`
spreads the cells over joblib's workers.
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager, nullcontext

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.metrics import check_scoring
from sklearn.model_selection import cross_validate

from .._config import config_context, get_config
from ..data import check_prompts
from ..tracking import run_group
from ..tracking._base import default_run_name
from ._stats import t_interval


class _AllPrompts:
    """A splitter with one split: train on all prompts, score on the same prompts.

    An RL policy is usually judged on the prompts it was trained on, and seeds,
    not folds, are the replicates; ``SeedSearchCV(cv=None)`` uses this.
    """

    def split(self, X, y=None, groups=None):
        idx = np.arange(len(X))
        yield idx, idx

    def get_n_splits(self, X=None, y=None, groups=None):
        return 1

    def __repr__(self) -> str:
        return "AllPrompts()"


def _scorers(estimator, scoring):
    """One scorer, or ``{name: scorer}`` for a list, tuple or dict ``scoring``."""
    if isinstance(scoring, (list, tuple, set)):
        if not all(isinstance(name, str) for name in scoring) or len(set(scoring)) != len(scoring):
            raise ValueError(
                f"scoring={scoring!r}: a list of metrics must hold distinct scorer names "
                "(strings); give callables as a dict {name: scorer}."
            )
        return {name: check_scoring(estimator, name) for name in scoring}
    if isinstance(scoring, dict):
        return {name: check_scoring(estimator, s) for name, s in scoring.items()}
    return check_scoring(estimator, scoring)


@contextmanager
def tracked_group(owner):
    """A :func:`~prefopt.tracking.run_group` named after ``owner`` (an estimator or a
    name) when ``report_to`` logs somewhere, else ``None``; hand it to the cells, each a
    member run of it."""
    if all(name == "none" for name in get_config()["report_to"]):
        yield None
        return
    with run_group(default_run_name(owner)) as group:
        yield group


def member(group, run_name: str):
    """``group.member(run_name)``, or nothing without a group (``report_to="none"``)."""
    return nullcontext() if group is None else group.member(run_name)


# What a failed cell's warning tells the user to do, unless the caller says otherwise.
STOP_AT_ERROR = "Set error_score='raise' to stop at the error."


def _cell(
    estimator, X, y, split, scorers, params, train_score, error_score, config, where,
    run=(None, ""), hint=STOP_AT_ERROR,
):  # fmt: skip
    """Fit and score one (candidate, seed, split) under the caller's prefopt configuration.

    Runs in a joblib worker (a thread, a loky process, a Ray actor), which starts
    from prefopt's defaults: ``config`` carries the caller's ``set_config``
    settings there, as ``compare`` hands them to its tasks, and ``run`` the
    ``(group, run name)`` its fit is tracked as (see :func:`tracked_group`). Returns the times and
    ``test_<metric>`` (``train_<metric>``) scores of ``cross_validate`` and ``healthy``
    (:func:`run_healthy` of the fitted estimator, 1, 0 or NaN); a failure, when
    ``error_score`` is not ``"raise"``, warns (with ``hint``: how to stop at the
    error, for the caller's user) and returns its fit time and ``failed``.
    """
    start = time.perf_counter()
    with config_context(**config), member(*run):
        try:
            out = cross_validate(
                estimator,
                X,
                y,
                cv=[split],
                scoring=scorers,
                params=params,
                return_train_score=train_score,
                return_estimator=True,  # for its health_, dropped here
                error_score="raise",  # this cell is one fit: its failure is handled here
            )
        except Exception as error:
            if error_score == "raise":
                raise
            warnings.warn(
                f"SeedSearchCV: the fit or score of {where} failed and scores "
                f"error_score={error_score!r}: {type(error).__name__}: {error}. {hint}",
                UserWarning,
                stacklevel=2,
            )
            return {"fit_time": time.perf_counter() - start, "score_time": 0.0, "failed": True}
    fitted = out.pop("estimator")[0]
    healthy = run_healthy(fitted)
    scores = {key: float(value[0]) for key, value in out.items()}
    return {**scores, "healthy": np.nan if healthy is None else float(healthy)}


def run_healthy(estimator) -> bool | None:
    """Whether a fitted estimator's run was healthy: ``health_["healthy"]``, or ``None``.

    ``None`` (unknown) for an estimator without a ``health_`` summary, which
    counts as healthy wherever a rule needs a yes or no.
    """
    health = getattr(estimator, "health_", None)
    if not isinstance(health, dict) or "healthy" not in health:
        return None
    return bool(health["healthy"])


def _param_arrays(candidate_params: list) -> dict:
    """``param_<name>`` masked arrays, masked where a candidate lacks the parameter.

    The layout of scikit-learn's ``cv_results_``: a 1-d array of the values' own
    dtype, or of objects for strings and sequences.
    """
    values: dict = {}
    for i, params in enumerate(candidate_params):
        for name, value in params.items():
            values.setdefault(f"param_{name}", {})[i] = value
    arrays = {}
    for key, by_index in values.items():
        try:
            probe = np.array(list(by_index.values()))
            dtype = probe.dtype if probe.dtype.kind != "U" and probe.ndim == 1 else object
        except ValueError:  # sequences of different lengths
            dtype = np.dtype(object)
        array = np.ma.MaskedArray(np.empty(len(candidate_params), dtype=dtype), mask=True)
        for i, value in by_index.items():
            array[i] = value
        arrays[key] = array
    return arrays


def _tied_with_best(per_seed: np.ndarray, rank: np.ndarray, confidence: float) -> np.ndarray:
    """Candidates whose paired interval (best minus them, over seeds) reaches 0."""
    best = int(np.argmin(rank))
    tied = np.zeros(len(per_seed), dtype=bool)
    for i, row in enumerate(per_seed):
        diff = per_seed[best] - row
        if len(diff) > 1 and np.all(diff == diff[0]):  # no spread: the difference is exact
            tied[i] = diff[0] == 0
            continue
        _, _, low, high = t_interval(diff, confidence)
        tied[i] = i == best or bool(np.isnan(low) or (low <= 0 <= high))
    return tied


def _with_eval_prompts(X, eval_prompts, cv, y):
    """The prompts with ``eval_prompts`` after them and the one split: fit on X, score after."""
    if cv is not None:
        raise ValueError(
            "SeedSearchCV: give held-out prompts either as eval_prompts= or as cv= folds, not both."
        )
    if y is not None and not callable(y):
        raise ValueError("SeedSearchCV: eval_prompts= needs y=None (the reward as reward_model=).")
    check_prompts(eval_prompts)
    if isinstance(X, pd.DataFrame) or isinstance(eval_prompts, pd.DataFrame):

        def frame(v):
            return v if isinstance(v, pd.DataFrame) else pd.DataFrame({"prompt": list(v)})

        joined = pd.concat([frame(X), frame(eval_prompts)], ignore_index=True)
    else:
        joined = list(X) + list(eval_prompts)
    n, m = len(X), len(eval_prompts)
    return joined, [(np.arange(n), np.arange(n, n + m))]


def _rank(means: np.ndarray, n_unhealthy: np.ndarray | None = None) -> np.ndarray:
    """1 for the best mean; a NaN mean (a failed fit) ties with the worst, as in scikit-learn.

    With ``n_unhealthy``, a candidate with any unhealthy run ranks after every
    candidate without one (a failed run is a failure, not a low score to
    average away); the mean orders each of the two groups.
    """
    if np.isnan(means).all():
        return np.ones(len(means), dtype=np.int32)
    filled = np.where(np.isnan(means), np.nanmin(means) - 1, means)
    if n_unhealthy is not None and np.any(n_unhealthy > 0):
        # Shift the unhealthy group below the worst healthy mean, keeping its own order.
        span = np.nanmax(filled) - np.nanmin(filled) + 1.0
        filled = np.where(n_unhealthy > 0, filled - 2 * span, filled)
    return stats.rankdata(-filled, method="min").astype(np.int32)
