"""Rewards that read the prompt table's columns, and several rewards weighted into one.

TRL's convention (``GRPOTrainer``'s ``reward_funcs``): a reward is called as
``reward(prompts, completions, **columns)``, where every column of the prompt
table besides ``prompt`` holds the values of the batch's rows, and several
rewards are summed with ``reward_weights``. Here a reward receives only the
columns its signature names (all of them when it takes ``**kwargs``), so a
plain ``reward(prompts, completions)`` is called as before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import numpy as np

from ._calling import call_plan
from ._wrappers import NoisyReward, check_rewards, check_token_rewards

__all__ = ["WeightedRewards", "call_with_columns", "reward_columns", "unique_names"]


def reward_columns(reward) -> tuple[set[str], set[str], bool]:
    """The columns a reward takes: (required names, optional names, takes ``**kwargs``).

    Besides the prompts and the completions (see :func:`call_with_columns` for
    how they are passed), every named parameter is a column.

    Parameters
    ----------
    reward : callable

    Returns
    -------
    required, optional : set of str
    var_keyword : bool

    Examples
    --------
    >>> def correct(prompts, completions, answer, tolerance=0, **kwargs):
    ...     return [0.0] * len(completions)
    >>> reward_columns(correct)
    ({'answer'}, {'tolerance'}, True)
    >>> reward_columns(lambda prompts, completions: [])
    (set(), set(), False)
    """
    plan = call_plan(reward)
    return plan.required, plan.optional, plan.columns is None


def _parts(reward) -> list:
    """``(name, reward)`` for each reward called on its own: the parts of a combination."""
    if isinstance(reward, WeightedRewards):
        return [p for name, r in zip(reward.names, reward.rewards) for p in _parts_named(name, r)]
    return _parts_named(_name(reward), reward)


def _parts_named(name, reward) -> list:
    inner = getattr(reward, "reward", None) if isinstance(reward, NoisyReward) else None
    return [(name, reward)] + ([] if inner is None else _parts(inner))


def check_reward_columns(reward, columns: Sequence[str], who: str = "fit") -> None:
    """Refuse, before any training, a reward that cannot be called on this data.

    Each reward (each part of a :class:`WeightedRewards`, the reward inside a
    :class:`NoisyReward`) must be callable as :func:`call_with_columns` calls
    it: every argument it names is the prompts, the completions, a column of
    the data, or has a default.

    Parameters
    ----------
    reward : callable
        A reward, or :class:`WeightedRewards`.
    columns : list of str
        The prompt table's columns besides ``prompt``.
    who : str, default="fit"
        Named in the error.

    Examples
    --------
    >>> def correct(prompts, completions, answer):
    ...     return [0.0] * len(completions)
    >>> check_reward_columns(correct, ["answer"])
    >>> check_reward_columns(correct, ["solution"])
    Traceback (most recent call last):
    ...
    ValueError: fit: the reward correct takes the argument 'answer', which is not a column ...
    """
    for name, one in _parts(reward):
        plan = call_plan(one, list(columns), who)
        if isinstance(reward, PerTokenWeightedRewards) and plan.required:
            raise ValueError(
                f"{who}: the reward {name} takes the column {sorted(plan.required)[0]!r}, but it "
                "is listed with a reward paid per token (score_per_token), which is called "
                "without the columns; give the argument a default, or combine the rewards in "
                "one object with its own score_per_token."
            )


def call_with_columns(reward, prompts, completions, columns: dict | None = None):
    """Call a reward on prompts and completions, with the columns it names, by keyword.

    As TRL calls rewards: a reward naming ``prompts`` or ``completions`` gets
    them by keyword wherever it declares them (``def r(completions, answer)``
    gets the completions, not the prompts); a plain ``reward(p, c)`` gets them
    by position; every other argument is a column (all of them with
    ``**kwargs``). See ``rewards/_calling.py`` for the rules.

    Parameters
    ----------
    reward : callable
    prompts, completions : list
    columns : dict of str to list, default=None
        One value per completion for each column.

    Returns
    -------
    What the reward returned.

    Examples
    --------
    >>> def echo(prompts, completions, answer):
    ...     return [float(a) for a in answer]
    >>> call_with_columns(echo, ["q", "q"], ["x", "y"], {"answer": [1, 2], "other": [0, 0]})
    [1.0, 2.0]
    >>> def trl_style(completions, answer):
    ...     return [float(c == a) for c, a in zip(completions, answer)]
    >>> call_with_columns(trl_style, ["1+1=", "2+2="], ["2", "5"], {"answer": ["2", "4"]})
    [1.0, 0.0]
    """
    columns = columns or {}
    return call_plan(reward, list(columns)).call(reward, prompts, completions, columns)


def _name(reward) -> str:
    name = getattr(reward, "__name__", None)
    return name if isinstance(name, str) else type(reward).__name__


class WeightedRewards:
    """Several rewards summed with weights: sum_j w_j r_j(prompts, completions, columns).

    What a policy makes of a list of rewards (TRL's ``reward_funcs`` and
    ``reward_weights``). Each reward receives the prompt table's columns it
    names; :meth:`score_each` returns every reward's values, which the policy
    logs as ``rewards/<name>/mean`` and ``rewards/<name>/std``.

    Parameters
    ----------
    rewards : list of callable
        Each ``reward(prompts, completions, **columns) -> array (n,)``.
    weights : list of float, default=None
        One finite weight >= 0 per reward; ``None`` weighs each 1.

    Attributes
    ----------
    names : list of str
        Each reward's ``__name__`` (its class name for an object), with every
        character but letters, digits, ``_``, ``-`` and ``.`` replaced by ``_``
        (a name is a metric key: ``rewards/<name>/mean``), made unique with a
        suffix ``_2``, ``_3``... that no other name has (:func:`unique_names`).

    Examples
    --------
    >>> def length(prompts, completions):
    ...     return [len(c) for c in completions]
    >>> def exact(prompts, completions, answer):
    ...     return [float(c == a) for c, a in zip(completions, answer)]
    >>> both = WeightedRewards([exact, length], weights=[1.0, 0.1])
    >>> both(["q", "q"], ["4", "five"], answer=["4", "4"]).tolist()
    [1.1, 0.4]
    >>> both.names
    ['exact', 'length']
    """

    def __init__(self, rewards: Sequence[Callable], weights=None):
        rewards = list(rewards)
        if not rewards:
            raise ValueError("The list of rewards is empty; pass at least one reward.")
        for i, r in enumerate(rewards):
            if not callable(r):
                raise TypeError(
                    f"Reward {i} of the list is {type(r).__name__} ({r!r}), not callable; every "
                    "reward must be callable as reward(prompts, completions, **columns)."
                )
        self.rewards = rewards
        self.weights = check_reward_weights(weights, len(rewards))
        self.names = unique_names([_name(r) for r in rewards])

    @property
    def starting_policy_(self):
        """The first starting policy one of the rewards knows (a fitted RewardModel's)."""
        for r in self.rewards:
            start = getattr(r, "starting_policy_", None)
            if start is not None:
                return start
        return None

    def score_each(self, prompts, completions, **columns) -> dict[str, np.ndarray]:
        """Every reward's checked values, by name.

        Parameters
        ----------
        prompts, completions : list
        **columns : list
            The prompt table's columns, one value per completion.

        Returns
        -------
        values : dict of str to ndarray of shape (n,)
        """
        return {
            name: check_rewards(
                call_with_columns(r, prompts, completions, columns),
                len(completions),
                f"the reward {name}",
            )
            for name, r in zip(self.names, self.rewards)
        }

    def combine(self, values: dict[str, np.ndarray]) -> np.ndarray:
        """The weighted sum of :meth:`score_each`'s values.

        Parameters
        ----------
        values : dict of str to ndarray of shape (n,)
            What :meth:`score_each` returned.

        Returns
        -------
        total : ndarray of shape (n,)
        """
        return sum(w * values[n] for n, w in zip(self.names, self.weights))

    def __call__(self, prompts, completions, **columns) -> np.ndarray:
        return self.combine(self.score_each(prompts, completions, **columns))

    def __repr__(self) -> str:
        return f"WeightedRewards({self.names}, weights={self.weights})"


def unique_names(names: Sequence[str]) -> list[str]:
    """Names safe as metric keys and unique by construction, in their order.

    Characters other than letters, digits, ``_``, ``-`` and ``.`` become ``_``
    (``<lambda>`` is ``_lambda_``; a ``/`` would nest a metric key); a name given
    more than once keeps its first use and takes, for the others, the first
    suffix ``_2``, ``_3``... that is neither another given name nor taken.

    Parameters
    ----------
    names : list of str

    Returns
    -------
    names : list of str

    Examples
    --------
    >>> unique_names(["length", "length", "length_2"])
    ['length', 'length_3', 'length_2']
    >>> unique_names(["<lambda>", "<lambda>", "a/b"])
    ['_lambda_', '_lambda__2', 'a_b']
    """
    clean = [re.sub(r"[^\w.\-]", "_", str(n), flags=re.ASCII) or "_" for n in names]
    given, taken, out = set(clean), set(), []
    for name in clean:
        candidate, k = name, 1
        while candidate in taken or (candidate != name and candidate in given):
            k += 1
            candidate = f"{name}_{k}"
        taken.add(candidate)
        out.append(candidate)
    return out


def check_reward_weights(weights, n: int) -> list[float]:
    """``n`` finite weights >= 0 (``None``: 1 each), or a clear error.

    Examples
    --------
    >>> check_reward_weights(None, 2)
    [1.0, 1.0]
    >>> check_reward_weights([1.0], 2)
    Traceback (most recent call last):
    ...
    ValueError: reward_weights has 1 weight for 2 rewards; give one weight per reward.
    """
    if weights is None:
        return [1.0] * n
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise TypeError(
            f"reward_weights must be a list of numbers, one per reward; got {weights!r}."
        )
    try:
        values = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise TypeError(
            f"reward_weights must be a list of numbers, one per reward; got {weights!r}."
        ) from None
    if len(values) != n:
        raise ValueError(
            f"reward_weights has {len(values)} weight{'s' * (len(values) != 1)} for {n} "
            f"reward{'s' * (n != 1)}; give one weight per reward."
        )
    for i, w in enumerate(values):
        if not math.isfinite(w) or w < 0:
            raise ValueError(
                f"reward_weights[{i}] is {w!r}; every weight must be a finite number >= 0 "
                "(to penalise, make the reward itself negative)."
            )
    return values


def combine_rewards(reward, weights):
    """The reward a policy fits on: a list becomes :class:`WeightedRewards`.

    One reward with ``weights=None`` is returned as given (its own methods,
    ``score_tokens`` and ``score_per_token``, stay usable); one reward with one
    weight is weighted too.
    """
    rewards = list(reward) if isinstance(reward, (list, tuple)) else [reward]
    if not isinstance(reward, (list, tuple)) and (weights is None or not callable(reward)):
        return reward  # one reward as given; a non-callable: the caller's own error names it
    if any(callable(getattr(r, "score_per_token", None)) for r in rewards):
        return PerTokenWeightedRewards(rewards, weights)  # keeps its per-token path
    return WeightedRewards(rewards, weights)


class PerTokenWeightedRewards(WeightedRewards):
    """Weighted rewards of which one or more pay per token: the sum, paid per token.

    What a policy makes of a list of rewards holding a reward with
    ``score_per_token``: a part with that method pays along the response, a
    plain part pays its value at the response's last token, each times its
    weight; the total of a response is the weighted sum of the parts' totals,
    as :class:`WeightedRewards` computes it. The loop passes no columns to a
    per-token reward, so no part may need one.

    Parameters
    ----------
    rewards : list of callable
    weights : list of float, default=None

    Examples
    --------
    >>> import numpy as np
    >>> class Steps:
    ...     def __call__(self, prompts, completions):
    ...         return [2.0] * len(completions)
    ...     def score_per_token(self, prompts, completions, ids, mask):
    ...         return np.asarray(mask, dtype=float)
    >>> def bonus(prompts, completions):
    ...     return [10.0] * len(completions)
    >>> both = combine_rewards([Steps(), bonus], [1.0, 0.5])
    >>> both.score_per_token(["q"], ["a b"], np.zeros((1, 3)), np.array([[1, 1, 0]])).tolist()
    [[1.0, 6.0, 0.0]]
    """

    def score_per_token(self, prompts, completions, response_ids, response_mask) -> np.ndarray:
        """The weighted sum of the parts, per response token (zero outside the mask).

        Parameters
        ----------
        prompts, completions : list
        response_ids, response_mask : tensor or array of shape (n, length)

        Returns
        -------
        rewards : ndarray of shape (n, length)
        """
        mask = response_mask.detach().cpu() if hasattr(response_mask, "detach") else response_mask
        mask = np.asarray(mask).astype(bool)
        last = np.maximum(mask.sum(1) - 1, 0)
        total = np.zeros(mask.shape)
        for name, r, w in zip(self.names, self.rewards, self.weights):
            source = f"the reward {name}"
            if callable(getattr(r, "score_per_token", None)):
                raw = r.score_per_token(prompts, completions, response_ids, response_mask)
                total += w * check_token_rewards(raw, mask, source)
            else:
                raw = call_with_columns(r, prompts, completions)
                total[np.arange(len(mask)), last] += w * check_rewards(raw, len(mask), source)
        return total


def describe_reward(reward) -> dict | None:
    """What ``save`` records of a weighted list of rewards (JSON): names and weights.

    The functions themselves cannot be saved (loading is data, never code);
    ``load(folder, reward=[...])`` takes them again, and :func:`rebuild_reward`
    weighs them as they were. ``None`` for any other reward.
    """
    if not isinstance(reward, WeightedRewards):
        return None
    return {"weighted": list(reward.names), "weights": [float(w) for w in reward.weights]}


def rebuild_reward(given, saved, owner: str):
    """The reward ``load`` restores from ``given`` and what ``save`` recorded.

    A list (or one function, for a list of one) becomes the
    :class:`WeightedRewards` that was saved: the same weights, its rewards
    checked by name and order; a :class:`WeightedRewards` is taken as given.

    Examples
    --------
    >>> def correct(prompts, completions):
    ...     return [1.0] * len(completions)
    >>> def fmt(prompts, completions):
    ...     return [0.5] * len(completions)
    >>> saved = describe_reward(WeightedRewards([correct, fmt], weights=[1.0, 0.2]))
    >>> rebuild_reward([correct, fmt], saved, "GRPOPolicy")
    WeightedRewards(['correct', 'fmt'], weights=[1.0, 0.2])
    >>> rebuild_reward([fmt, correct], saved, "GRPOPolicy")
    Traceback (most recent call last):
    ...
    ValueError: GRPOPolicy was fitted on the rewards ['correct', 'fmt'] ...
    """
    if not (isinstance(saved, dict) and "weighted" in saved) or isinstance(given, WeightedRewards):
        return given
    names, weights = list(saved["weighted"]), saved["weights"]
    rewards = list(given) if isinstance(given, (list, tuple)) else [given]
    got = WeightedRewards(rewards).names  # checks each is callable
    if got != names:
        raise ValueError(
            f"{owner} was fitted on the rewards {names} with weights {weights}; load got "
            f"{got}. Pass the same functions in the same order: load(folder, reward=[...])."
        )
    return combine_rewards(rewards, weights)  # a per-token part keeps its path
