"""Rewards that read the prompt table's columns, and several rewards weighted into one.

TRL's convention (``GRPOTrainer``'s ``reward_funcs``): a reward is called as
``reward(prompts, completions, **columns)``, where every column of the prompt
table besides ``prompt`` holds the values of the batch's rows, and several
rewards are summed with ``reward_weights``. Here a reward receives only the
columns its signature names (all of them when it takes ``**kwargs``), so a
plain ``reward(prompts, completions)`` is called as before.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

import numpy as np

from ._wrappers import check_rewards

__all__ = ["WeightedRewards", "call_with_columns", "reward_columns"]


def reward_columns(reward) -> tuple[set[str], set[str], bool]:
    """The columns a reward takes: (required names, optional names, takes ``**kwargs``).

    The first two positional parameters are the prompts and the completions;
    every other named parameter is a column.

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
    try:
        signature = inspect.signature(reward)
    except (TypeError, ValueError):  # a builtin without a signature: called plainly
        return set(), set(), False
    required, optional, var_keyword, positional = set(), set(), False, 0
    for p in signature.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            var_keyword = True
        elif p.kind is p.VAR_POSITIONAL:
            positional = 2
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and positional < 2:
            positional += 1  # prompts, then completions
        elif p.kind is not p.POSITIONAL_ONLY:
            (required if p.default is p.empty else optional).add(p.name)
    return required, optional, var_keyword


def check_reward_columns(reward, columns: Sequence[str], who: str = "fit") -> None:
    """Refuse, before any training, a reward that needs a column the data does not have.

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
    rewards = reward.rewards if isinstance(reward, WeightedRewards) else [reward]
    names = reward.names if isinstance(reward, WeightedRewards) else [_name(reward)]
    for name, one in zip(names, rewards):
        missing = sorted(reward_columns(one)[0] - set(columns))
        if missing:
            raise ValueError(
                f"{who}: the reward {name} takes the argument {missing[0]!r}, which is not a "
                f"column of the prompts (columns besides 'prompt': {sorted(columns)}); pass a "
                "table (DataFrame, datasets.Dataset or dict rows) with that column, or give "
                "the argument a default."
            )


def call_with_columns(reward, prompts, completions, columns: dict | None = None):
    """``reward(prompts, completions, **columns)``, passing only the columns it names.

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
    """
    columns = columns or {}
    if not columns:
        return reward(prompts, completions)
    required, optional, var_keyword = reward_columns(reward)
    names = columns if var_keyword else [n for n in columns if n in required | optional]
    return reward(prompts, completions, **{n: columns[n] for n in names})


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
        Each reward's ``__name__`` (its class name for an object), made unique
        with a suffix ``_2``, ``_3``...

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
        names, seen = [], {}
        for r in rewards:
            base = _name(r)
            seen[base] = seen.get(base, 0) + 1
            names.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
        self.names = names

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
    if isinstance(reward, (list, tuple)):
        return WeightedRewards(reward, weights)
    if weights is None:
        return reward
    if not callable(reward):
        return reward  # the caller's own error names it
    return WeightedRewards([reward], weights)


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
    return WeightedRewards(rewards, weights)
