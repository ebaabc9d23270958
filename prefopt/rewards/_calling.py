"""How a reward is called: by the names it declares, as TRL calls its reward functions.

TRL's ``GRPOTrainer`` calls every reward as ``reward(prompts=..., completions=...,
**columns)``: by keyword. A reward written that way, ``def r(completions, answer)``,
would receive the prompts as its completions if it were called positionally. Here:

- a reward whose first two positional parameters are ``prompts, completions`` (the
  plain ``reward(prompts, completions)``) is called with them in that order;
- a reward that names ``prompts`` or ``completions`` anywhere else gets them by
  keyword (and through ``**kwargs`` when it takes them there);
- a reward that names neither gets them by position, where that is unambiguous: its
  first two positional parameters are not named like a column, ``prompt`` or
  ``completion``;
- every other parameter is a column of the prompt table, given by keyword; with
  ``**kwargs`` every column is given.

Whatever cannot be supplied (a parameter that is no column and has no default, a
reward with fewer than two places for the prompts and completions) is an error
before any training, naming the parameter.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CallPlan", "call_plan"]

# Names a reward may give the two texts TRL passes; the singulars are refused (ambiguous).
_TEXTS = ("prompts", "completions")
_SINGULAR = {"prompt": "prompts", "completion": "completions"}


@dataclass
class CallPlan:
    """How to call one reward: the texts by position or keyword, and the columns to pass.

    Parameters
    ----------
    positional : bool
        Prompts and completions are its first two positional arguments.
    texts : tuple of str
        With ``positional=False``, the texts passed by keyword.
    columns : list of str or None
        The columns it takes by keyword; ``None``: every column (``**kwargs``).
    required, optional : set of str
        The columns it names without and with a default.
    """

    positional: bool
    texts: tuple = ()
    columns: list | None = field(default_factory=list)
    required: set = field(default_factory=set)
    optional: set = field(default_factory=set)

    def call(self, reward, prompts, completions, columns: dict):
        """Call ``reward`` on the texts and the columns it takes."""
        names = list(columns) if self.columns is None else self.columns
        kwargs = {n: columns[n] for n in names if n in columns}
        if self.positional:
            return reward(prompts, completions, **kwargs)
        texts = {"prompts": prompts, "completions": completions}
        return reward(**{n: texts[n] for n in self.texts}, **kwargs)


def _name(reward) -> str:
    name = getattr(reward, "__name__", None)
    return name if isinstance(name, str) else type(reward).__name__


def call_plan(reward, columns: Sequence[str] | None = None, who: str = "fit") -> CallPlan:
    """How ``reward`` is called with a table's columns, or a clear error naming what is wrong.

    Parameters
    ----------
    reward : callable
    columns : list of str, default=None
        The prompt table's columns besides ``prompt``; ``None``: not known yet
        (nothing is checked against them).
    who : str, default="fit"
        Named in the error.

    Returns
    -------
    plan : CallPlan

    Examples
    --------
    >>> call_plan(lambda prompts, completions: []).positional
    True
    >>> def trl_style(completions, answer, **kwargs):
    ...     return [float(c == a) for c, a in zip(completions, answer)]
    >>> plan = call_plan(trl_style, ["answer"])
    >>> plan.positional, plan.texts
    (False, ('prompts', 'completions'))
    >>> plan.call(trl_style, ["1+1="], ["2"], {"answer": ["2"]})
    [1.0]
    >>> call_plan(trl_style, ["solution"])
    Traceback (most recent call last):
    ...
    ValueError: fit: the reward trl_style takes the argument 'answer', which is not a column ...
    """
    try:
        signature = inspect.signature(reward)
    except (TypeError, ValueError):  # a builtin without a signature: called plainly
        return CallPlan(positional=True)
    params = list(signature.parameters.values())
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    var_positional = any(p.kind is p.VAR_POSITIONAL for p in params)
    slots = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    named = {p.name: p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    name = _name(reward)
    if [p.name for p in slots[:2]] == list(_TEXTS):  # reward(prompts, completions, ...)
        positional, rest = True, slots[2:] + [p for p in params if p.kind is p.KEYWORD_ONLY]
    elif set(_TEXTS) & set(named):  # TRL's way: the texts by the names it declares
        positional = False
        for text in _TEXTS:
            if text in named and named[text].kind is named[text].POSITIONAL_ONLY:
                raise TypeError(
                    f"{who}: the reward {name} takes {text!r} as a positional-only argument "
                    f"out of its place; put prompts and completions first, or make {text!r} "
                    "a keyword argument (TRL calls rewards by keyword)."
                )
        rest = [p for n, p in named.items() if n not in _TEXTS]
    else:
        positional = True
        first = [p.name for p in slots[:2]]
        for n in first:
            if n in _SINGULAR:
                raise TypeError(
                    f"{who}: the reward {name} names an argument {n!r} where the prompts or "
                    "the completions are passed, so which one it wants is a guess; name its "
                    f"first two arguments prompts and completions (did you mean "
                    f"{_SINGULAR[n]!r}?). Rewards are called as reward(prompts=..., "
                    "completions=..., **columns), TRL's convention."
                )
            if n in (columns or ()):
                raise TypeError(
                    f"{who}: the reward {name}'s argument {n!r} is a column of the prompts but "
                    "sits where the prompts or the completions are passed; name its first two "
                    "arguments prompts and completions, and the column comes by keyword."
                )
        if len(slots) < 2 and not var_positional:
            if not var_keyword:
                raise TypeError(
                    f"{who}: the reward {name} takes {len(slots)} positional argument"
                    f"{'s' * (len(slots) != 1)}; a reward is called as reward(prompts, "
                    "completions, **columns): give it both (TRL's names, prompts and "
                    "completions, are passed by keyword)."
                )
            positional = False
        rest = slots[2:] + [p for p in params if p.kind is p.KEYWORD_ONLY]
    texts = tuple(t for t in _TEXTS if t in named or var_keyword) if not positional else ()
    if not positional and "completions" not in texts:
        raise TypeError(
            f"{who}: the reward {name} takes 'prompts' but no 'completions'; a reward scores "
            "completions: add a completions argument (or **kwargs)."
        )
    required, optional = set(), set()
    for p in rest:
        if p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise TypeError(
                f"{who}: the reward {name} takes a positional-only argument {p.name!r} "
                "besides the prompts and completions; columns are passed by keyword."
            )
        (required if p.default is p.empty else optional).add(p.name)
    if columns is not None:
        missing = sorted(required - set(columns))
        if missing:
            raise ValueError(
                f"{who}: the reward {name} takes the argument {missing[0]!r}, which is not a "
                f"column of the prompts (columns besides 'prompt': {sorted(columns)}); pass a "
                "table (DataFrame, datasets.Dataset or dict rows) with that column, or give "
                "the argument a default."
            )
    take = None if var_keyword else sorted(required | optional)
    return CallPlan(positional, texts, take, required, optional)
