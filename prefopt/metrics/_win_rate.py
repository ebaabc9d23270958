"""Win rates of a policy's samples against reference completions, overall and by length.

The public names are re-exported by :mod:`prefopt.metrics`; see its docstring.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from numbers import Integral

import numpy as np
import pandas as pd

from ..data import check_demonstrations, check_prompts
from ._scorer import _check_n_samples, _sample_groups, _SampledScorer

# Completion length / reference length, binned symmetrically in log space around 1:
# much shorter, shorter, about the same, longer, much longer.
DEFAULT_LENGTH_BINS = (0.0, 0.5, 0.8, 1.25, 2.0, np.inf)


def _word_count(text: str) -> int:
    return len(text.split())


def _check_bins(bins) -> np.ndarray:
    edges = np.asarray(bins, dtype=np.float64)
    if edges.ndim != 1 or len(edges) < 2 or np.any(np.diff(edges) <= 0) or edges[0] < 0:
        raise ValueError(
            "bins must be at least two increasing, non-negative edges of the "
            f"length ratio; got {bins!r}."
        )
    return edges


def _check_judge(judge) -> Callable:
    if not callable(judge):
        raise TypeError(
            "judge must be callable as judge(prompt, completion, reference); got "
            f"{type(judge).__name__}."
        )
    return judge


def _judged(estimator, X, judge, references, n_samples, random_state):
    """Judge samples against the reference of their row.

    ``references`` are the checked (prompts, completions) columns. Returns the
    reference row of each judged sample, the samples, the verdicts and the
    reference completions.
    """
    ref_prompts, ref_completions = references
    # A conversation (a list of messages) is not hashable: compare it as JSON.
    key = lambda p: p if isinstance(p, str) else json.dumps(p, sort_keys=True)  # noqa: E731
    wanted = set(map(key, check_prompts(X)))
    rows = [i for i, p in enumerate(ref_prompts) if key(p) in wanted]
    if not rows:
        raise ValueError(
            "None of the prompts to score has a reference; references must be "
            "(prompt, completion) rows for some of the prompts in X."
        )
    prompts = [ref_prompts[i] for i in rows]
    groups = _sample_groups(estimator, prompts, n_samples, random_state)
    out_rows, completions, verdicts = [], [], []
    for i, group in zip(rows, groups):
        for completion in group:
            v = float(judge(ref_prompts[i], completion, ref_completions[i]))
            if not np.isfinite(v):
                raise ValueError(
                    f"judge returned {v} for reference row {i}; it must return a "
                    "finite number (> 0: the completion wins, 0: a tie)."
                )
            out_rows.append(i)
            completions.append(completion)
            verdicts.append(v)
    return np.array(out_rows), completions, np.array(verdicts), ref_completions


def _win_value(verdicts: np.ndarray) -> np.ndarray:
    # A tie counts half a win.
    return (verdicts > 0) + 0.5 * (verdicts == 0)


class _WinRateScorer(_SampledScorer):
    _name = "make_win_rate_scorer"

    def __init__(self, judge, references, n_samples, random_state):
        super().__init__(n_samples, random_state)
        self.judge = _check_judge(judge)
        self.references = check_demonstrations(references)

    def __call__(self, estimator, X, y=None) -> float:
        _, _, verdicts, _ = _judged(
            estimator, X, self.judge, self.references, self.n_samples, self.random_state
        )
        return float(_win_value(verdicts).mean())

    def floor(self, X, answer: str = "") -> float:
        """The win rate of a policy that always answers ``answer`` (the empty answer).

        A win rate means little beside 0.5 alone: a judge that ties an empty
        answer with a poor reference, or scores both 0, gives an empty
        answer about half the wins. Report this floor beside the policy's.

        Parameters
        ----------
        X : list of str
            The prompts, as given to the scorer.
        answer : str, default=""
            The constant answer.

        Returns
        -------
        win_rate : float
            This scorer's value for the constant policy, ties counting half.
        """
        return self(_ConstantAnswer(answer), X)

    def _args(self) -> str:
        return f"judge={getattr(self.judge, '__name__', self.judge)!r}, {super()._args()}"


class _ConstantAnswer:
    """A policy that answers every prompt with the same text (the floor of a win rate)."""

    def __init__(self, answer: str):
        self.answer = answer

    def sample(self, X, n=1, *, random_state=None):
        return [[self.answer] * n for _ in X]


class _BinnedWinRateScorer(_WinRateScorer):
    _name = "make_length_binned_win_rate"

    def __init__(self, judge, references, bins, bin, length, n_samples, random_state):
        super().__init__(judge, references, n_samples, random_state)
        self.bins = _check_bins(bins)
        if bin is not None and not (isinstance(bin, Integral) and 0 <= bin < len(self.bins) - 1):
            raise ValueError(
                f"bin must be None or an index in [0, {len(self.bins) - 1}); got {bin!r}."
            )
        self.bin = bin
        self.length = length

    def __call__(self, estimator, X, y=None) -> float:
        table = _binned_table(
            estimator,
            X,
            self.judge,
            self.references,
            self.bins,
            self.length,
            self.n_samples,
            self.random_state,
        )
        if self.bin is None:
            n = table["n"].to_numpy()
            if n.sum() == 0:
                return float("nan")
            return float((table["win_rate"].fillna(0) * n).sum() / n.sum())
        return float(table["win_rate"].iloc[self.bin])

    def _args(self) -> str:
        return f"bin={self.bin!r}, {super()._args()}"


def make_win_rate_scorer(
    judge: Callable, references, *, n_samples: int = 1, random_state=0
) -> Callable:
    """Share of sampled completions a judge prefers to the reference completion.

    Parameters
    ----------
    judge : callable
        ``judge(prompt, completion, reference) -> float``: positive when the
        completion is better than the reference, 0 for a tie, negative when
        worse (a difference of gold rewards, or an LLM judge's verdict).
    references : list of (prompt, completion), DataFrame or Dataset
        Reference completions (human demonstrations, or another policy's
        samples), with ``prompt`` and ``completion`` columns for tables. A
        prompt may have several rows; each row counts.
    n_samples : int, default=1
        Completions drawn per reference row.
    random_state : int, default=0
        Seed of the sampling.

    Returns
    -------
    scorer : callable
        ``scorer(estimator, X)`` judges the reference rows whose prompt is in
        ``X`` (prompts without a reference are skipped) and returns the share
        of wins, ties counting half. Its ``floor(X)`` is the win rate of the
        empty answer on the same rows: report it beside the policy's, since a
        judge that ties or rewards nothing puts that floor near 0.5.

    See Also
    --------
    make_length_binned_win_rate, length_binned_win_rate

    References
    ----------
    .. [1] Stiennon et al. 2020, "Learning to summarize from human feedback",
       NeurIPS 2020 (win rates against human reference summaries).
    .. [2] Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
       Optimization for Learning from Human Feedback in LLMs", ACL 2024
       (win rates from an LLM judge).

    Examples
    --------
    >>> from prefopt.metrics import make_win_rate_scorer
    >>> class Policy:
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["a fine answer"] * n for _ in X]
    >>> judge = lambda prompt, completion, reference: len(completion) - len(reference)
    >>> refs = [("q1", "short"), ("q2", "a much longer answer"), ("q3", "a fine answer")]
    >>> scorer = make_win_rate_scorer(judge, refs)
    >>> scorer(Policy(), ["q1", "q2", "q3"])  # win, loss, tie
    0.5
    >>> scorer.floor(["q1", "q2", "q3"])  # the empty answer loses every time
    0.0
    """
    return _WinRateScorer(judge, references, n_samples, random_state)


def length_binned_win_rate(
    estimator,
    X,
    judge: Callable,
    references,
    *,
    bins=DEFAULT_LENGTH_BINS,
    length: Callable | None = None,
    n_samples: int = 1,
    random_state=0,
) -> pd.DataFrame:
    """Win rate against references, binned by length relative to the reference.

    A policy that writes longer responses than the references may win because
    it is better or because the judge likes length. Binning each judged pair by
    ``length(completion) / length(reference)`` separates the two: a policy that
    wins within every bin is better at equal length. Huang et al. (2024) bin
    PPO's win rates against the reference summaries this way: PPO wins in every
    bin, and its win rate rises with length.

    Parameters
    ----------
    estimator : fitted policy
        With ``sample(X, n=..., random_state=...)``.
    X : list of str
        Prompts; reference rows of other prompts are skipped.
    judge : callable
        ``judge(prompt, completion, reference) -> float``, as in
        :func:`make_win_rate_scorer`.
    references : list of (prompt, completion), DataFrame or Dataset
        Reference completions.
    bins : sequence of float, default=DEFAULT_LENGTH_BINS
        Increasing edges of the length ratio; bin ``i`` holds ratios in
        ``[bins[i], bins[i + 1])`` (an infinite last edge includes infinity).
        The default ``(0, 0.5, 0.8, 1.25, 2, inf)`` is symmetric in log space
        around equal length. Pairs outside every bin are left out.
    length : callable, default=None
        ``length(text) -> number``; ``None`` counts whitespace-separated words.
    n_samples : int, default=1
        Completions drawn per reference row.
    random_state : int, default=0
        Seed of the sampling.

    Returns
    -------
    table : pandas.DataFrame
        One row per bin: ``bin`` (a label such as ``"[0.8, 1.25)"``), ``low``,
        ``high``, ``n`` (judged pairs), ``wins``, ``ties`` and ``win_rate``
        (ties counting half; NaN in an empty bin).

    References
    ----------
    .. [1] Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO:
       A Case Study on TL;DR Summarization", arXiv:2403.17031.

    Examples
    --------
    >>> from prefopt.metrics import length_binned_win_rate
    >>> class Policy:
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["one two three four"] * n for _ in X]
    >>> judge = lambda prompt, completion, reference: 1.0 if "four" in completion else -1.0
    >>> refs = [("q1", "one two"), ("q2", "one two three four five six seven eight nine")]
    >>> table = length_binned_win_rate(Policy(), ["q1", "q2"], judge, refs, bins=[0, 1, 10])
    >>> table[["bin", "n", "win_rate"]].to_dict("records")
    [{'bin': '[0, 1)', 'n': 1, 'win_rate': 1.0}, {'bin': '[1, 10)', 'n': 1, 'win_rate': 1.0}]
    """
    return _binned_table(
        estimator,
        X,
        _check_judge(judge),
        check_demonstrations(references),
        _check_bins(bins),
        length,
        _check_n_samples(n_samples),
        random_state,
    )


def _binned_table(estimator, X, judge, references, edges, length, n_samples, random_state):
    """:func:`length_binned_win_rate` on checked arguments (the scorer checks them once)."""
    length = _word_count if length is None else length
    rows, completions, verdicts, refs = _judged(
        estimator, X, judge, references, n_samples, random_state
    )
    num = np.array([length(c) for c in completions], dtype=np.float64)
    den = np.array([length(refs[i]) for i in rows], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.inf)
    index = np.searchsorted(edges, ratio, side="right") - 1
    if np.isinf(edges[-1]):
        index[np.isinf(ratio)] = len(edges) - 2
    wins = verdicts > 0
    ties = verdicts == 0
    out = []
    for b in range(len(edges) - 1):
        inside = index == b
        n = int(inside.sum())
        out.append(
            {
                "bin": f"[{edges[b]:g}, {edges[b + 1]:g})",
                "low": edges[b],
                "high": edges[b + 1],
                "n": n,
                "wins": int(wins[inside].sum()),
                "ties": int(ties[inside].sum()),
                "win_rate": float(_win_value(verdicts[inside]).mean()) if n else np.nan,
            }
        )
    return pd.DataFrame(out)


def make_length_binned_win_rate(
    judge: Callable,
    references,
    bins=DEFAULT_LENGTH_BINS,
    *,
    bin: int | None = None,
    length: Callable | None = None,
    n_samples: int = 1,
    random_state=0,
) -> Callable:
    """A scorer for the win rate in one length bin, or over all bins.

    Parameters
    ----------
    judge : callable
        ``judge(prompt, completion, reference) -> float``, as in
        :func:`make_win_rate_scorer`.
    references : list of (prompt, completion), DataFrame or Dataset
        Reference completions.
    bins : sequence of float, default=DEFAULT_LENGTH_BINS
        Increasing edges of the length ratio, as in :func:`length_binned_win_rate`.
    bin : int, default=None
        Index of the bin to score (NaN when no judged pair falls in it); ``None``
        scores all pairs that fall in some bin (with the default bins, every
        pair: the overall win rate of :func:`make_win_rate_scorer`).
    length : callable, default=None
        ``length(text) -> number``; ``None`` counts whitespace-separated words.
    n_samples : int, default=1
        Completions drawn per reference row.
    random_state : int, default=0
        Seed of the sampling.

    Returns
    -------
    scorer : callable

    See Also
    --------
    length_binned_win_rate : the whole table.

    Examples
    --------
    >>> from prefopt.metrics import make_length_binned_win_rate
    >>> class Policy:
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["a b"] * n for _ in X]
    >>> judge = lambda prompt, completion, reference: len(completion) - len(reference)
    >>> refs = [("q1", "a"), ("q2", "a b c d")]   # ratios 2 and 0.5
    >>> make_length_binned_win_rate(judge, refs, bin=4)(Policy(), ["q1", "q2"])  # [2, inf)
    1.0
    >>> make_length_binned_win_rate(judge, refs)(Policy(), ["q1", "q2"])
    0.5
    """
    return _BinnedWinRateScorer(judge, references, bins, bin, length, n_samples, random_state)
