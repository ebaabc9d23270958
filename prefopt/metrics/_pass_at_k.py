"""Pass@k: the chance that at least one of k samples is correct (Chen et al. 2021).

:func:`pass_at_k` is the unbiased estimator from n >= k samples of which c are
correct; :func:`make_pass_at_k_scorer` draws the samples from a policy and
checks them with a verifiable reward.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from numbers import Integral, Real

import numpy as np

from ..data import check_prompt_table
from ..rewards import call_with_columns, check_reward_columns, check_rewards
from ._scorer import _check_n_samples, _draw, _reward_of, _SampledScorer

__all__ = ["make_pass_at_k_scorer", "pass_at_k"]


def pass_at_k(n, c, k: int) -> np.ndarray:
    """Unbiased pass@k from ``n`` samples with ``c`` correct: 1 - C(n - c, k) / C(n, k).

    The chance that k samples drawn without replacement from the n include a
    correct one, whose mean over problems estimates the chance that k fresh
    samples do (Chen et al. 2021, eq. 1). Computed as Chen et al.'s stable
    product 1 - prod_{i = n - c + 1}^{n} (1 - k / i), which never forms a
    binomial coefficient.

    Parameters
    ----------
    n : int or array-like of int
        Samples drawn per problem.
    c : int or array-like of int
        Correct samples per problem, 0 <= c <= n.
    k : int
        1 <= k <= n.

    Returns
    -------
    pass_at_k : ndarray of float
        One value per problem (shape of ``np.broadcast(n, c)``), each in [0, 1].

    References
    ----------
    M. Chen et al., "Evaluating large language models trained on code",
    arXiv:2107.03374, 2021.

    Examples
    --------
    >>> from prefopt.metrics import pass_at_k
    >>> pass_at_k(5, 2, 2)  # 1 - C(3, 2) / C(5, 2) = 1 - 3 / 10
    array(0.7)
    >>> pass_at_k([4, 4, 4], [0, 1, 4], 1)  # c / n at k = 1
    array([0.  , 0.25, 1.  ])
    """
    if isinstance(k, bool) or not isinstance(k, Integral) or k < 1:
        raise ValueError(f"k must be an integer >= 1; got {k!r}.")
    n_arr, c_arr = np.broadcast_arrays(np.asarray(n), np.asarray(c))
    for name, arr in (("n", n_arr), ("c", c_arr)):
        if arr.dtype.kind not in "iu" and not (
            arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))
        ):
            raise ValueError(f"{name} must hold whole numbers; got {arr.tolist()!r}.")
    n_arr, c_arr = n_arr.astype(np.int64), c_arr.astype(np.int64)
    if np.any(c_arr < 0) or np.any(c_arr > n_arr):
        raise ValueError(f"c must lie in [0, n]; got n={n_arr.tolist()!r}, c={c_arr.tolist()!r}.")
    if np.any(n_arr < k):
        raise ValueError(
            f"pass@{k} needs at least k={k} samples per problem; got n={n_arr.tolist()!r}. "
            "Draw more samples or lower k."
        )
    out = np.empty(n_arr.shape, dtype=np.float64)
    for index in np.ndindex(n_arr.shape):
        ni, ci = int(n_arr[index]), int(c_arr[index])
        if ni - ci < k:  # every k-subset holds a correct sample
            out[index] = 1.0
        else:
            out[index] = 1.0 - np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1))
    return out


def _accepts(reward, name: str) -> bool:
    """Whether ``reward`` takes the keyword ``name`` (by name or through ``**kwargs``)."""
    try:
        params = inspect.signature(reward).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == name and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in params
    )


class _PassAtKScorer(_SampledScorer):
    _name = "make_pass_at_k_scorer"

    def __init__(self, reward, k, n_samples, threshold, random_state):
        super().__init__(n_samples, random_state)
        if reward is not None and not callable(reward):
            raise TypeError(
                f"reward must be callable as reward(prompts, completions); got "
                f"{type(reward).__name__}."
            )
        if isinstance(k, bool) or not isinstance(k, Integral) or k < 1:
            raise ValueError(f"k must be an integer >= 1; got {k!r}.")
        if k > self.n_samples:
            raise ValueError(
                f"pass@{k} needs at least k samples per prompt; got n_samples={self.n_samples}. "
                f"Raise n_samples to {k} or more."
            )
        if isinstance(threshold, bool) or not isinstance(threshold, Real):
            raise ValueError(f"threshold must be a number; got {threshold!r}.")
        self.reward = reward
        self.k = int(k)
        self.threshold = float(threshold)

    def __call__(self, estimator, X, y=None) -> float:
        prompts, columns = check_prompt_table(X)
        if y is not None and len(y) != len(prompts):
            raise ValueError(
                f"y holds {len(y)} answers for {len(prompts)} prompts; give one answer per prompt."
            )
        reward = _reward_of(estimator, self.reward)
        if y is not None:
            if "answer" in columns:
                raise ValueError(
                    "The prompts have an 'answer' column and y gives answers too; pass one "
                    "of them (the column reaches the reward as answer= on its own)."
                )
            if not _accepts(reward, "answer"):
                raise TypeError(
                    f"The answers y reach the reward as answer=, but "
                    f"{getattr(reward, '__name__', type(reward).__name__)} takes no such "
                    "keyword; give it an answer=None keyword or call the scorer without y."
                )
            columns = {**columns, "answer": list(y)}
        check_reward_columns(reward, list(columns), "make_pass_at_k_scorer")
        rep, completions, columns = _draw(
            estimator, prompts, self.n_samples, self.random_state, columns
        )
        if len(completions) != len(prompts) * self.n_samples:
            raise ValueError(
                f"{type(estimator).__name__} returned {len(completions)} completions for "
                f"{len(prompts)} prompts; pass@k needs n_samples={self.n_samples} for each "
                "(a policy with sample(X, n=...))."
            )
        scores = check_rewards(call_with_columns(reward, rep, completions, columns), len(rep))
        correct = (scores >= self.threshold).reshape(len(prompts), self.n_samples).sum(1)
        return float(pass_at_k(self.n_samples, correct, self.k).mean())

    def _args(self) -> str:
        return (
            f"reward={getattr(self.reward, '__name__', self.reward)}, k={self.k}, "
            f"n_samples={self.n_samples}, threshold={self.threshold}, "
            f"random_state={self.random_state!r}"
        )


def make_pass_at_k_scorer(
    reward: Callable | None = None,
    *,
    k: int = 1,
    n_samples: int = 8,
    threshold: float = 1.0,
    random_state=0,
) -> Callable:
    """Mean unbiased pass@k over prompts, from ``n_samples`` completions of each.

    Each prompt's completions are checked by ``reward``; one passes when its
    reward is at least ``threshold`` (1 for a 0/1 correctness reward). The
    score is the mean of :func:`pass_at_k` over the prompts.

    Parameters
    ----------
    reward : callable, default=None
        ``reward(prompts, completions, **kwargs) -> array (n,)``, such as
        :meth:`prefopt.worlds.ArithmeticWorld.correctness_reward`; ``None``
        uses the reward the estimator was fitted on (``reward_model_``).
    k : int, default=1
        Samples a user would draw.
    n_samples : int, default=8
        Completions drawn per prompt, at least ``k``; more than ``k`` lowers the
        estimate's variance.
    threshold : float, default=1.0
        Smallest reward of a correct completion.
    random_state : int, default=0
        Seed of the sampling, so the score is deterministic.

    Returns
    -------
    scorer : callable
        ``scorer(estimator, X, y=None) -> float``. The other columns of a
        prompt table ``X`` (an ``answer`` column, say) reach the reward as
        keyword arguments, as in ``fit``, each prompt's value repeated for its
        samples. ``y``, when given, holds one answer per prompt, passed to the
        reward as ``answer=`` in the same way; without either the reward must
        know the answers itself.

    See Also
    --------
    pass_at_k, prefopt.worlds.ArithmeticWorld

    References
    ----------
    M. Chen et al., "Evaluating large language models trained on code",
    arXiv:2107.03374, 2021.

    Examples
    --------
    >>> from prefopt.metrics import make_pass_at_k_scorer
    >>> class Policy:  # right once in four samples on the first problem, never on the second
    ...     def sample(self, X, n=1, *, random_state=None):
    ...         return [["2", "1", "1", "1"], ["0", "0", "0", "0"]]
    >>> def correct(prompts, completions, answer=None):
    ...     return [float(c == a) for c, a in zip(completions, answer)]
    >>> scorer = make_pass_at_k_scorer(correct, k=2, n_samples=4)
    >>> scorer(Policy(), ["1+1=", "2+2="], ["2", "4"])  # (1 - C(3, 2) / C(4, 2) + 0) / 2
    0.25
    """
    _check_n_samples(n_samples)
    return _PassAtKScorer(reward, k, n_samples, threshold, random_state)
