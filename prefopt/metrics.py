"""Scorers for policies: callables ``(estimator, X, y=None) -> float``, larger is better.

Each ``make_*`` function returns a scorer that can be given as ``scoring=`` to
:class:`~prefopt.model_selection.SeedSearchCV`, :func:`~prefopt.model_selection.compare`,
``GridSearchCV`` or ``cross_validate`` (alone or in a dict of named scorers).
A scorer draws ``n_samples`` completions per prompt with the policy's
``sample(X, n=..., random_state=...)`` at a fixed ``random_state`` (an
estimator without ``sample`` is asked for ``predict(X)``), so the same policy
always gets the same score, scorers with the same ``random_state`` in one dict
see the same completions, and two candidates of a search are scored on common
random numbers.

The KL scorer is *negated* (``-KL``), as scikit-learn scorers are
"larger is better"; the other scorers return the quantity itself.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral, Real

import numpy as np
import pandas as pd

from .data import check_demonstrations, check_prompts
from .rewards import check_rewards

__all__ = [
    "DEFAULT_LENGTH_BINS",
    "gold_reward_scorer",
    "length_binned_win_rate",
    "make_kl_scorer",
    "make_length_binned_win_rate",
    "make_objective_scorer",
    "make_reward_scorer",
    "make_win_rate_scorer",
]

# Completion length / reference length, binned symmetrically in log space around 1:
# much shorter, shorter, about the same, longer, much longer.
DEFAULT_LENGTH_BINS = (0.0, 0.5, 0.8, 1.25, 2.0, np.inf)


def _check_n_samples(n_samples) -> int:
    if not isinstance(n_samples, Integral) or isinstance(n_samples, bool) or n_samples < 1:
        raise ValueError(f"n_samples must be an integer >= 1; got {n_samples!r}.")
    return int(n_samples)


def _sample_groups(estimator, prompts: list[str], n_samples: int, random_state) -> list:
    """``n_samples`` completions for each prompt, one list per prompt."""
    if hasattr(estimator, "sample"):
        groups = estimator.sample(prompts, n=n_samples, random_state=random_state)
    elif hasattr(estimator, "predict"):
        # A Pipeline has no sample(): one completion per prompt from predict, which a
        # prefopt policy draws with its own random_state.
        groups = [[c] for c in estimator.predict(prompts)]
    else:
        raise TypeError(f"{type(estimator).__name__} has neither sample() nor predict(); a "
                        "sampled scorer needs a fitted policy.")
    if len(groups) != len(prompts):
        raise ValueError(f"{type(estimator).__name__}.sample returned {len(groups)} groups "
                         f"for {len(prompts)} prompts.")
    return groups


def _draw(estimator, prompts: list[str], n_samples: int, random_state):
    """``n_samples`` completions per prompt: (repeated prompts, completions), flat."""
    groups = _sample_groups(estimator, prompts, n_samples, random_state)
    rep = [p for p, group in zip(prompts, groups) for _ in group]
    completions = [c for group in groups for c in group]
    return rep, completions


def _reward_of(estimator, reward):
    if reward is not None:
        return reward
    fitted = getattr(estimator, "reward_model_", None)
    if fitted is None:
        raise ValueError(f"{type(estimator).__name__} has no reward_model_: give the scorer "
                         "a reward, or score a policy fitted with one.")
    return fitted


def _log_ratio(estimator, prompts, completions) -> np.ndarray:
    """log pi(y|x) - log pi_ref(y|x) for each sampled completion (the k1 estimator)."""
    if not hasattr(estimator, "log_prob"):
        raise TypeError(f"{type(estimator).__name__} has no log_prob(); the KL scorers need "
                        "a fitted prefopt policy.")
    # log-probs are deterministic: score each distinct (prompt, completion) pair once
    # (many samples repeat in small worlds and with peaked policies).
    pairs = list(dict.fromkeys(zip(prompts, completions)))
    index = {pair: i for i, pair in enumerate(pairs)}
    rows = np.array([index[pair] for pair in zip(prompts, completions)])
    unique_prompts, unique_completions = [p for p, _ in pairs], [c for _, c in pairs]
    logp = np.asarray(estimator.log_prob(unique_prompts, unique_completions), dtype=np.float64)
    ref = np.asarray(estimator.log_prob(unique_prompts, unique_completions, reference=True),
                     dtype=np.float64)
    return (logp - ref)[rows]


class _SampledScorer:
    """Base of the scorers: draws the completions, subclasses say what to average."""

    _name = "score"

    def __init__(self, n_samples: int, random_state):
        self.n_samples = _check_n_samples(n_samples)
        self.random_state = random_state

    def __call__(self, estimator, X, y=None) -> float:
        prompts, completions = _draw(estimator, check_prompts(X), self.n_samples,
                                     self.random_state)
        return float(self._value(estimator, prompts, completions))

    def _value(self, estimator, prompts, completions):  # pragma: no cover - abstract
        raise NotImplementedError

    def _args(self) -> str:
        return f"n_samples={self.n_samples}, random_state={self.random_state!r}"

    def __repr__(self) -> str:
        return f"{self._name}({self._args()})"


class _RewardScorer(_SampledScorer):
    def __init__(self, reward, n_samples, random_state, name="make_reward_scorer"):
        super().__init__(n_samples, random_state)
        if reward is not None and not callable(reward):
            raise TypeError(f"reward must be callable as reward(prompts, completions); got "
                            f"{type(reward).__name__}.")
        self.reward = reward
        self._name = name

    def _value(self, estimator, prompts, completions):
        reward = _reward_of(estimator, self.reward)
        return check_rewards(reward(prompts, completions), len(prompts)).mean()


class _KLScorer(_SampledScorer):
    _name = "make_kl_scorer"

    def _value(self, estimator, prompts, completions):
        return -_log_ratio(estimator, prompts, completions).mean()


class _ObjectiveScorer(_SampledScorer):
    _name = "make_objective_scorer"

    def __init__(self, reward, beta, n_samples, random_state):
        super().__init__(n_samples, random_state)
        if beta is not None and (not isinstance(beta, Real) or beta < 0):
            raise ValueError(f"beta must be a number >= 0 or None; got {beta!r}.")
        self.reward = reward
        self.beta = beta

    def _value(self, estimator, prompts, completions):
        reward = _reward_of(estimator, self.reward)
        beta = self.beta if self.beta is not None else getattr(estimator, "beta", None)
        if beta is None:
            raise ValueError(f"{type(estimator).__name__} has no beta; give the scorer one.")
        r = check_rewards(reward(prompts, completions), len(prompts))
        return (r - beta * _log_ratio(estimator, prompts, completions)).mean()


# ----- win rates against references -------------------------------------------------

def _word_count(text: str) -> int:
    return len(text.split())


def _check_bins(bins) -> np.ndarray:
    edges = np.asarray(bins, dtype=np.float64)
    if edges.ndim != 1 or len(edges) < 2 or np.any(np.diff(edges) <= 0) or edges[0] < 0:
        raise ValueError("bins must be at least two increasing, non-negative edges of the "
                         f"length ratio; got {bins!r}.")
    return edges


def _check_judge(judge) -> Callable:
    if not callable(judge):
        raise TypeError("judge must be callable as judge(prompt, completion, reference); got "
                        f"{type(judge).__name__}.")
    return judge


def _judged(estimator, X, judge, references, n_samples, random_state):
    """Judge samples against the reference of their row.

    ``references`` are the checked (prompts, completions) columns. Returns the
    reference row of each judged sample, the samples, the verdicts and the
    reference completions.
    """
    ref_prompts, ref_completions = references
    wanted = set(check_prompts(X))
    rows = [i for i, p in enumerate(ref_prompts) if p in wanted]
    if not rows:
        raise ValueError("None of the prompts to score has a reference; references must be "
                         "(prompt, completion) rows for some of the prompts in X.")
    prompts = [ref_prompts[i] for i in rows]
    groups = _sample_groups(estimator, prompts, n_samples, random_state)
    out_rows, completions, verdicts = [], [], []
    for i, group in zip(rows, groups):
        for completion in group:
            v = float(judge(ref_prompts[i], completion, ref_completions[i]))
            if not np.isfinite(v):
                raise ValueError(f"judge returned {v} for reference row {i}; it must return a "
                                 "finite number (> 0: the completion wins, 0: a tie).")
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
        _, _, verdicts, _ = _judged(estimator, X, self.judge, self.references, self.n_samples,
                                    self.random_state)
        return float(_win_value(verdicts).mean())

    def _args(self) -> str:
        return f"judge={getattr(self.judge, '__name__', self.judge)!r}, {super()._args()}"


class _BinnedWinRateScorer(_WinRateScorer):
    _name = "make_length_binned_win_rate"

    def __init__(self, judge, references, bins, bin, length, n_samples, random_state):
        super().__init__(judge, references, n_samples, random_state)
        self.bins = _check_bins(bins)
        if bin is not None and not (isinstance(bin, Integral) and 0 <= bin < len(self.bins) - 1):
            raise ValueError(f"bin must be None or an index in [0, {len(self.bins) - 1}); "
                             f"got {bin!r}.")
        self.bin = bin
        self.length = length

    def __call__(self, estimator, X, y=None) -> float:
        table = _binned_table(estimator, X, self.judge, self.references, self.bins,
                              self.length, self.n_samples, self.random_state)
        if self.bin is None:
            n = table["n"].to_numpy()
            if n.sum() == 0:
                return float("nan")
            return float((table["win_rate"].fillna(0) * n).sum() / n.sum())
        return float(table["win_rate"].iloc[self.bin])

    def _args(self) -> str:
        return f"bin={self.bin!r}, {super()._args()}"


# ----- public constructors ------------------------------------------------------------

def make_reward_scorer(reward: Callable | None = None, *, n_samples: int = 4,
                       random_state=0) -> Callable:
    """Mean reward of sampled completions.

    Parameters
    ----------
    reward : callable, default=None
        ``reward(prompts, completions) -> array (n,)``; ``None`` uses the
        reward the estimator was fitted on (``estimator.reward_model_``).
    n_samples : int, default=4
        Completions drawn per prompt.
    random_state : int, default=0
        Seed of the sampling, so the score is deterministic.

    Returns
    -------
    scorer : callable
        ``scorer(estimator, X, y=None) -> float``: the mean over prompts in
        ``X`` and their samples.

    See Also
    --------
    gold_reward_scorer, make_objective_scorer

    Examples
    --------
    >>> from prefopt.metrics import make_reward_scorer
    >>> class Policy:  # anything with sample(X, n, random_state) works
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["good"] * n for _ in X]
    >>> length = lambda prompts, completions: [len(c) for c in completions]
    >>> make_reward_scorer(length)(Policy(), ["q1", "q2"])
    4.0
    """
    return _RewardScorer(reward, n_samples, random_state)


def gold_reward_scorer(gold: Callable, *, n_samples: int = 4, random_state=0) -> Callable:
    """Mean gold ("true") reward of sampled completions.

    The same as :func:`make_reward_scorer` with a required reward; the name
    says that the reward is the one the proxy reward model stands in for
    (``world.true_quality`` in the exact worlds), to measure over-optimisation.

    Parameters
    ----------
    gold : callable
        ``gold(prompts, completions) -> array (n,)``.
    n_samples : int, default=4
        Completions drawn per prompt.
    random_state : int, default=0
        Seed of the sampling.

    Returns
    -------
    scorer : callable

    Examples
    --------
    >>> from prefopt.metrics import gold_reward_scorer
    >>> class Policy:
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["yes", "no"][:n] for _ in X]
    >>> gold = lambda prompts, completions: [c == "yes" for c in completions]
    >>> gold_reward_scorer(gold, n_samples=2)(Policy(), ["q"])
    0.5
    """
    if not callable(gold):
        raise TypeError(f"gold must be callable as gold(prompts, completions); got "
                        f"{type(gold).__name__}.")
    return _RewardScorer(gold, n_samples, random_state, name="gold_reward_scorer")


def make_kl_scorer(*, n_samples: int = 4, random_state=0) -> Callable:
    """Negated KL(pi || pi_ref), estimated from sampled completions.

    KL is estimated by the mean of ``log pi(y|x) - log pi_ref(y|x)`` over
    completions sampled from the policy (the unbiased k1 estimator), with
    the policy's ``log_prob(prompts, completions)`` and
    ``log_prob(..., reference=True)``.

    Parameters
    ----------
    n_samples : int, default=4
        Completions drawn per prompt.
    random_state : int, default=0
        Seed of the sampling.

    Returns
    -------
    scorer : callable
        Returns **-KL** in nats (larger is better: closer to the reference).

    Examples
    --------
    >>> from prefopt.metrics import make_kl_scorer
    >>> class Policy:
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["a"] * n for _ in X]
    ...     def log_prob(self, prompts, completions, *, reference=False):
    ...         return [-1.0 if reference else -0.25 for _ in completions]
    >>> make_kl_scorer()(Policy(), ["q"])
    -0.75
    """
    return _KLScorer(n_samples, random_state)


def make_objective_scorer(reward: Callable | None = None, beta: float | None = None, *,
                          n_samples: int = 4, random_state=0) -> Callable:
    """The KL-regularised objective E[r] - beta KL(pi || pi_ref), from samples.

    Parameters
    ----------
    reward : callable, default=None
        ``None`` uses the estimator's ``reward_model_``.
    beta : float, default=None
        ``None`` uses the estimator's ``beta`` parameter.
    n_samples : int, default=4
        Completions drawn per prompt.
    random_state : int, default=0
        Seed of the sampling.

    Returns
    -------
    scorer : callable
        The mean over samples of ``r(x, y) - beta * (log pi(y|x) - log pi_ref(y|x))``.

    Examples
    --------
    >>> from prefopt.metrics import make_objective_scorer
    >>> class Policy:
    ...     beta = 0.5
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["a"] * n for _ in X]
    ...     def log_prob(self, prompts, completions, *, reference=False):
    ...         return [-1.0 if reference else 0.0 for _ in completions]
    >>> one = lambda prompts, completions: [1.0] * len(completions)
    >>> make_objective_scorer(one)(Policy(), ["q"])  # 1 - 0.5 * 1
    0.5
    """
    return _ObjectiveScorer(reward, beta, n_samples, random_state)


def make_win_rate_scorer(judge: Callable, references, *, n_samples: int = 1,
                         random_state=0) -> Callable:
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
        of wins, ties counting half.

    See Also
    --------
    make_length_binned_win_rate, length_binned_win_rate

    Examples
    --------
    >>> from prefopt.metrics import make_win_rate_scorer
    >>> class Policy:
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["a fine answer"] * n for _ in X]
    >>> judge = lambda prompt, completion, reference: len(completion) - len(reference)
    >>> refs = [("q1", "short"), ("q2", "a much longer answer"), ("q3", "a fine answer")]
    >>> make_win_rate_scorer(judge, refs)(Policy(), ["q1", "q2", "q3"])  # win, loss, tie
    0.5
    """
    return _WinRateScorer(judge, references, n_samples, random_state)


def length_binned_win_rate(estimator, X, judge: Callable, references, *,
                           bins=DEFAULT_LENGTH_BINS, length: Callable | None = None,
                           n_samples: int = 1, random_state=0) -> pd.DataFrame:
    """Win rate against references, binned by length relative to the reference.

    A policy that writes longer responses than the references may win because
    it is better or because the judge likes length. Binning each judged pair by
    ``length(completion) / length(reference)`` separates the two: a policy that
    wins within every bin is better at equal length (the seeds' length analysis).

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
    return _binned_table(estimator, X, _check_judge(judge), check_demonstrations(references),
                         _check_bins(bins), length, _check_n_samples(n_samples), random_state)


def _binned_table(estimator, X, judge, references, edges, length, n_samples, random_state):
    """:func:`length_binned_win_rate` on checked arguments (the scorer checks them once)."""
    length = _word_count if length is None else length
    rows, completions, verdicts, refs = _judged(estimator, X, judge, references, n_samples,
                                                random_state)
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
        out.append({
            "bin": f"[{edges[b]:g}, {edges[b + 1]:g})",
            "low": edges[b],
            "high": edges[b + 1],
            "n": n,
            "wins": int(wins[inside].sum()),
            "ties": int(ties[inside].sum()),
            "win_rate": float(_win_value(verdicts[inside]).mean()) if n else np.nan,
        })
    return pd.DataFrame(out)


def make_length_binned_win_rate(judge: Callable, references, bins=DEFAULT_LENGTH_BINS, *,
                                bin: int | None = None, length: Callable | None = None,
                                n_samples: int = 1, random_state=0) -> Callable:
    """A scorer for the win rate in one length bin, or over all bins.

    Parameters
    ----------
    judge, references, bins, length, n_samples, random_state
        As in :func:`length_binned_win_rate`.
    bin : int, default=None
        Index of the bin to score (NaN when no judged pair falls in it); ``None``
        scores all pairs that fall in some bin (with the default bins, every
        pair: the overall win rate of :func:`make_win_rate_scorer`).

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
