"""Prompts, demonstrations and comparisons, with row-level validation.

Plain Python lists, pandas objects and Hugging Face ``datasets.Dataset`` with
TRL's column names (``prompt``, ``completion``, ``chosen``, ``rejected``) are
all accepted, in TRL's standard (text) or conversational format: a prompt may
be a list of messages (``[{"role": "user", "content": "..."}]``), which the
estimators render with the tokenizer's chat template, and a completion one
assistant message, whose text is its content. Bad input gets one clear error
that names the row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._formats import (
    _check_text,
    _columns,
    _is_hf_dataset,
    _not_one_text,
    check_labels,
    check_pairs,
    check_texts,
    is_conversation,
    split_implicit_prompt,
)

__all__ = [
    "Comparisons",
    "PreferenceData",
    "check_prompts",
    "check_prompt_table",
    "check_comparisons",
    "check_demonstrations",
    "check_pretraining_texts",
    "check_pairs",
    "check_texts",
    "is_conversation",
    "split_implicit_prompt",
]


# Argument names a reward receives besides the columns: no column may take them.
RESERVED_COLUMNS = ("prompts", "completions")


@dataclass(frozen=True)
class Comparisons:
    """Pairwise comparisons: for each prompt, a chosen and a rejected response.

    Parameters
    ----------
    prompt, chosen, rejected : list of str
        Equal-length columns; a prompt may also be a conversation (a list of
        messages).
    featurizer : callable, default=None
        ``featurizer(prompts, completions) -> ndarray (n, d)``; lets a
        :class:`~prefopt.RewardModel` with no language model fit a linear reward
        on features (the preference world supplies one).
    policy : fitted policy, torch module or callable, default=None
        The policy whose samples were compared (a callable returns a fresh copy
        of it, as ``PreferenceWorld.policy_model``). A reward model fitted on the
        comparisons remembers it, and a policy estimator given that reward model
        and no ``model=`` starts from it.

    Examples
    --------
    >>> c = Comparisons(["q"], ["good"], ["bad"])
    >>> len(c), c.to_pandas().columns.tolist()
    (1, ['prompt', 'chosen', 'rejected'])
    """

    prompt: Sequence[str]
    chosen: Sequence[str]
    rejected: Sequence[str]
    featurizer: Callable | None = None
    policy: object = None

    def __len__(self) -> int:
        return len(self.prompt)

    @property
    def shape(self) -> tuple[int]:
        """``(n_comparisons,)``: scikit-learn then splits comparisons by rows (cross-validation
        in ``SeedSearchCV``), keeping the featurizer and the policy on every part."""
        return (len(self),)

    def __getitem__(self, index) -> Comparisons:
        idx = np.arange(len(self))[index]
        idx = np.atleast_1d(idx)
        pick = lambda col: [col[i] for i in idx]  # noqa: E731
        return Comparisons(
            pick(self.prompt),
            pick(self.chosen),
            pick(self.rejected),
            self.featurizer,
            self.policy,
        )

    def to_pandas(self) -> pd.DataFrame:
        """The comparisons as a DataFrame with TRL's column names."""
        return pd.DataFrame(
            {
                "prompt": list(self.prompt),
                "chosen": list(self.chosen),
                "rejected": list(self.rejected),
            }
        )


def check_prompts(X) -> list:
    """Validate prompts and return them as a list of texts or conversations.

    Parameters
    ----------
    X : list, pandas Series, DataFrame or datasets.Dataset
        Prompts: strings, or conversations in TRL's format (lists of messages,
        ``[{"role": "user", "content": "..."}]``), or rows with a ``prompt``
        key. A DataFrame or Dataset must have a ``prompt`` column.

    Returns
    -------
    prompts : list of str or of list of dict
        Conversations are kept as the given messages, in a plain list.

    Examples
    --------
    >>> check_prompts(["the movie was", "I think"])
    ['the movie was', 'I think']
    >>> check_prompts([[{"role": "user", "content": "hi"}]])
    [[{'role': 'user', 'content': 'hi'}]]
    """
    _not_one_text(X, "Prompts")
    if isinstance(X, pd.DataFrame) or _is_hf_dataset(X) or isinstance(X, dict):
        values = _columns(X, ["prompt"], "Prompts")["prompt"]
    elif isinstance(X, pd.Series):
        values = X.tolist()
    elif isinstance(X, np.ndarray):
        if X.ndim != 1:
            raise ValueError(f"Prompts must be one-dimensional; got an array of shape {X.shape}.")
        values = X.tolist()
    else:
        try:
            values = list(X)
        except TypeError:
            raise TypeError(f"Prompts must be a list of strings; got {type(X).__name__}.") from None
    if values and all(isinstance(v, dict) for v in values):
        if all("prompt" in v for v in values):  # rows, as list(datasets.Dataset) gives them
            values = [v["prompt"] for v in values]
        elif all("role" in v for v in values):
            raise TypeError(
                "Prompts look like one conversation (a list of messages); pass a list of "
                "conversations, one per prompt: [messages]."
            )
    if len(values) == 0:
        raise ValueError("No prompts were given; pass at least one prompt.")
    return _check_text(values, "prompt", "Prompts", messages="keep")


def check_prompt_table(X) -> tuple[list, dict[str, list]]:
    """Validate prompts and return them with the table's other columns.

    The columns besides ``prompt`` of a DataFrame, a ``datasets.Dataset``, a
    dict of columns or a list of dict rows travel with the prompts, row for
    row: a policy passes them to its reward as keyword arguments (TRL's
    convention, ``reward(prompts, completions, answer, **kwargs)``).

    Parameters
    ----------
    X : list, pandas Series, DataFrame, datasets.Dataset or dict of columns
        Prompts as :func:`check_prompts` takes them.

    Returns
    -------
    prompts : list of str or of list of dict
        As :func:`check_prompts` returns them.
    columns : dict of str to list
        Every other column, one value per prompt, in row order; empty for a
        plain list of prompts.

    Examples
    --------
    >>> import pandas as pd
    >>> check_prompt_table(pd.DataFrame({"prompt": ["2+2=", "3+1="], "answer": ["4", "4"]}))
    (['2+2=', '3+1='], {'answer': ['4', '4']})
    >>> check_prompt_table([{"prompt": "1+1=", "answer": "2"}])
    (['1+1='], {'answer': ['2']})
    """
    prompts = check_prompts(X)
    if isinstance(X, pd.DataFrame):
        labels = check_labels(X.columns, "Prompts")
        columns = {t: X.iloc[:, i].tolist() for i, t in enumerate(labels) if t != "prompt"}
    elif _is_hf_dataset(X):
        columns = {c: list(X[c]) for c in X.column_names if c != "prompt"}
    elif isinstance(X, dict):
        labels = check_labels(X, "Prompts")
        columns = {t: list(v) for t, v in zip(labels, X.values()) if t != "prompt"}
    elif isinstance(X, (list, tuple)) and X and all(isinstance(v, dict) for v in X):
        names = [n for n in dict.fromkeys(n for row in X for n in row) if n != "prompt"]
        check_labels(names, "Prompts")
        for i, row in enumerate(X):
            missing = [n for n in names if n not in row]
            if missing:
                raise ValueError(
                    f"Prompts: row {i} has no {missing}, which other rows have; every row "
                    f"needs the same keys ({['prompt', *names]})."
                )
        columns = {str(n): [row[n] for row in X] for n in names}
    else:
        columns = {}
    reserved = sorted(set(columns) & set(RESERVED_COLUMNS))
    if reserved:
        raise ValueError(
            f"Prompts: the column {reserved[0]!r} has a name the reward's own arguments use "
            f"(a reward is called as reward(prompts=..., completions=..., **columns)); "
            "rename the column."
        )
    for name, values in columns.items():
        if len(values) != len(prompts):
            raise ValueError(
                f"Prompts: column {name!r} has {len(values)} values for {len(prompts)} "
                "prompts; every column needs one value per prompt."
            )
    return prompts, columns


def _has_no_prompt(X) -> bool:
    """Whether comparisons come in TRL's implicit-prompt format: chosen, rejected, no prompt."""
    if isinstance(X, pd.DataFrame) or _is_hf_dataset(X):
        names = set(X.columns if isinstance(X, pd.DataFrame) else X.column_names)
    elif isinstance(X, dict):
        names = set(X)
    elif isinstance(X, (list, tuple)) and X and all(isinstance(r, dict) for r in X):
        names = set.intersection(*(set(r) for r in X))
        if any("prompt" in r for r in X):
            return False
    else:
        return False
    return "prompt" not in names and {"chosen", "rejected"} <= names


def check_comparisons(X) -> Comparisons:
    """Validate comparisons (prompt, chosen, rejected) and return :class:`Comparisons`.

    Parameters
    ----------
    X : Comparisons, DataFrame, datasets.Dataset, dict of columns or rows
        Rows may be ``(prompt, chosen, rejected)`` tuples or dicts, in TRL's
        standard or conversational format. Without a ``prompt`` column (TRL's
        implicit prompt), ``chosen`` and ``rejected`` are whole texts or
        conversations and the start they share is the prompt
        (:func:`split_implicit_prompt`).

    Returns
    -------
    comparisons : Comparisons
        A chosen or rejected response given as one assistant message becomes
        its text, one of several messages stays a list of them; conversational
        prompts stay messages.

    Examples
    --------
    >>> len(check_comparisons([("q", "yes.", "no.")]))
    1
    >>> check_comparisons([{"chosen": "2+2= 4", "rejected": "2+2= 5"}]).prompt
    ['2+2=']
    >>> check_comparisons([("q", "same", "same")])
    Traceback (most recent call last):
    ...
    ValueError: Comparisons: chosen and rejected are identical at row 0 ('same'); ...
    """
    featurizer = policy = None
    if isinstance(X, Comparisons):
        featurizer, policy = X.featurizer, X.policy
        cols = {"prompt": list(X.prompt), "chosen": list(X.chosen), "rejected": list(X.rejected)}
    elif _has_no_prompt(X):
        cols = _implicit_prompt_columns(X)
    else:
        cols = _columns(X, ["prompt", "chosen", "rejected"], "Comparisons")
    lengths = {k: len(v) for k, v in cols.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(
            f"Comparisons have columns of different lengths {lengths}; "
            "every row needs a prompt, a chosen and a rejected response."
        )
    if lengths["prompt"] == 0:
        raise ValueError("No comparisons were given; pass at least one (prompt, chosen, rejected).")
    prompt = _check_text(cols["prompt"], "prompt", "Comparisons", messages="keep")
    chosen = _check_text(cols["chosen"], "chosen", "Comparisons", True, "content")
    rejected = _check_text(cols["rejected"], "rejected", "Comparisons", True, "content")
    for i, (c, r) in enumerate(zip(chosen, rejected)):
        if c == r:
            raise ValueError(
                f"Comparisons: chosen and rejected are identical at row {i} "
                f"({c!r}); such a pair carries no preference, drop it."
            )
    return Comparisons(prompt, chosen, rejected, featurizer, policy)


def _implicit_prompt_columns(X) -> dict:
    """prompt, chosen and rejected columns split from whole chosen and rejected rows."""
    cols = _columns(X, ["chosen", "rejected"], "Comparisons")
    if len(cols["chosen"]) != len(cols["rejected"]):
        raise ValueError(
            f"Comparisons have {len(cols['chosen'])} chosen and {len(cols['rejected'])} "
            "rejected responses; every row needs both."
        )
    out = {"prompt": [], "chosen": [], "rejected": []}
    for i, (c, r) in enumerate(zip(cols["chosen"], cols["rejected"])):
        if is_conversation(c) and is_conversation(r):
            c = _check_text([c], "chosen", "Comparisons", messages="keep")[0]
            r = _check_text([r], "rejected", "Comparisons", messages="keep")[0]
        if isinstance(c, (str, list)) and type(c) is type(r) and c == r:
            raise ValueError(
                f"Comparisons: chosen and rejected are identical at row {i} ({c!r}); such a "
                "pair carries no preference, drop it."
            )
        for name, value in zip(out, split_implicit_prompt(c, r, i)):
            out[name].append(value)
    return out


def check_demonstrations(X) -> tuple[list, list[str]]:
    """Validate demonstrations (prompt, completion) and return the two columns.

    Parameters
    ----------
    X : DataFrame, datasets.Dataset, dict of columns or rows
        Rows may be ``(prompt, completion)`` tuples or dicts, in TRL's standard
        or conversational format.

    Returns
    -------
    prompts, completions : list
        Prompts are texts or conversations (as :func:`check_prompts`); a
        completion given as one assistant message becomes its text.

    Examples
    --------
    >>> check_demonstrations([("the movie was", " great.")])
    (['the movie was'], [' great.'])
    """
    cols = _columns(X, ["prompt", "completion"], "Demonstrations")
    lengths = {k: len(v) for k, v in cols.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(
            f"Demonstrations have columns of different lengths {lengths}; "
            "every row needs a prompt and a completion."
        )
    if len(cols["prompt"]) == 0:
        raise ValueError("No demonstrations were given; pass (prompt, completion) rows.")
    return (
        _check_text(cols["prompt"], "prompt", "Demonstrations", messages="keep"),
        _check_text(cols["completion"], "completion", "Demonstrations", messages="content"),
    )


def check_pretraining_texts(X) -> list[str]:
    """Validate pretraining texts (the ``ptx_data`` of PPO-ptx) and return them as a list.

    Parameters
    ----------
    X : list of str, pandas Series, DataFrame, datasets.Dataset or rows
        Plain texts, one document per row; a DataFrame or Dataset must have a
        ``text`` column (the Hugging Face name for raw text), rows may be dicts
        with a ``text`` key.

    Returns
    -------
    texts : list of str

    Examples
    --------
    >>> check_pretraining_texts(["the movie was great .", "i liked it ."])
    ['the movie was great .', 'i liked it .']
    >>> check_pretraining_texts([{"text": "a review ."}])
    ['a review .']
    >>> check_pretraining_texts(["fine", "  "])
    Traceback (most recent call last):
    ...
    ValueError: ptx_data: text at row 1 is empty; remove the row or give it text.
    """
    _not_one_text(X, "ptx_data")
    if isinstance(X, pd.DataFrame) or _is_hf_dataset(X) or isinstance(X, dict):
        values = _columns(X, ["text"], "ptx_data")["text"]
    elif isinstance(X, (pd.Series, np.ndarray)):
        if X.ndim != 1:
            raise ValueError(f"ptx_data must be one-dimensional; got shape {X.shape}.")
        values = X.tolist()
    else:
        try:
            values = list(X)
        except TypeError:
            raise TypeError(
                f"ptx_data must be a list of texts (or a table with a 'text' column); got "
                f"{type(X).__name__}."
            ) from None
        if values and all(isinstance(v, dict) for v in values):
            values = _columns(values, ["text"], "ptx_data")["text"]
    if len(values) == 0:
        raise ValueError("ptx_data is empty; pass at least one pretraining text.")
    return _check_text(values, "text", "ptx_data")


@dataclass
class PreferenceData:
    """One data bundle for a whole RLHF pipeline: SFT, reward model, policy.

    ``make_pipeline(SFTPolicy(...), RewardModel(...), RLOOPolicy(...)).fit(data)``
    passes it along: each step reads its part (demonstrations, comparisons,
    prompts), and each fitted step is handed to the next (the SFT model starts
    the reward model and the policy, the reward model scores the policy).

    Parameters
    ----------
    prompts : list of str or of conversations, default=None
        Prompts for policy optimisation.
    demonstrations : rows or table, default=None
        (prompt, completion) rows for SFT.
    comparisons : rows, table or Comparisons, default=None
        (prompt, chosen, rejected) rows for the reward model.
    references : rows or table, default=None
        (prompt, completion) reference responses; the reward model is shifted so
        they score 0 on average.
    policy : fitted estimator, default=None
        Set by a fitted SFT step for the steps after it.
    reward_model : fitted estimator, default=None
        Set by a fitted reward-model step for the steps after it.

    Examples
    --------
    >>> data = PreferenceData(prompts=["the movie was"],
    ...                       demonstrations=[("the movie was", " great .")])
    >>> data.with_(policy="fitted").policy
    'fitted'
    """

    prompts: Sequence[str] | None = None
    demonstrations: object = None
    comparisons: object = None
    references: object = None
    policy: object = None
    reward_model: object = None

    def with_(self, **changes) -> PreferenceData:
        """A copy with some fields replaced.

        Parameters
        ----------
        **changes
            Field names and their new values.

        Returns
        -------
        data : PreferenceData
        """
        from dataclasses import replace

        return replace(self, **changes)

    def require(self, field_name: str, step: str):
        value = getattr(self, field_name)
        if value is None:
            raise ValueError(
                f"{step} needs PreferenceData.{field_name}, which is empty; fill it "
                "or fit this step on its own data."
            )
        return value
