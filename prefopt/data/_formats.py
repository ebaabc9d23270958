"""Reading columns and checking texts and conversations, with errors that name the row."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def _columns(data, names: Sequence[str], what: str) -> dict:
    """Read named columns from a DataFrame, a datasets.Dataset, a dict or rows."""
    if isinstance(data, pd.DataFrame) or _is_hf_dataset(data) or isinstance(data, dict):
        columns = (
            list(data.columns)
            if isinstance(data, pd.DataFrame)
            else (list(data.column_names) if _is_hf_dataset(data) else list(data))
        )
        missing = [n for n in names if n not in columns]
        if missing:
            raise ValueError(
                f"{what} need the columns {list(names)}; missing {missing} (found {columns})."
            )
        out = {}
        for n in names:
            col = data[n]
            if isinstance(col, (str, bytes)) or not hasattr(col, "__iter__"):
                raise TypeError(
                    f"{what}: column {n!r} must be a list of strings, not "
                    f"{type(col).__name__}; wrap one value in a list: [{col!r}]."
                )
            out[n] = list(col)
        return out
    if data is None or isinstance(data, (str, bytes)) or not hasattr(data, "__iter__"):
        raise TypeError(
            f"{what} must be a table or a list of rows ({', '.join(names)}); "
            f"got {type(data).__name__}."
        )
    rows = list(data)
    out = {n: [] for n in names}
    for i, row in enumerate(rows):
        if isinstance(row, dict):
            missing = [n for n in names if n not in row]
            if missing:
                raise ValueError(f"{what} row {i} has no {missing}; each row needs {list(names)}.")
            values = [row[n] for n in names]
        else:
            values = list(row) if isinstance(row, (tuple, list)) else None
            if values is None or len(values) != len(names):
                raise ValueError(
                    f"{what} row {i} should be a tuple of {len(names)} "
                    f"({', '.join(names)}); got {row!r}."
                )
        for n, v in zip(names, values):
            out[n].append(v)
    return out


def _is_hf_dataset(data) -> bool:
    return type(data).__module__.startswith("datasets") and hasattr(data, "column_names")


def is_conversation(row) -> bool:
    """Whether a row is a conversation: a non-empty list of messages (dicts).

    TRL's conversational format: ``[{"role": "user", "content": "..."}]``. A
    table column of them may hold numpy arrays of dicts (``Dataset.to_pandas``).

    Parameters
    ----------
    row : object
        One prompt or completion.

    Returns
    -------
    bool

    Examples
    --------
    >>> is_conversation([{"role": "user", "content": "the movie was"}]), is_conversation("hi")
    (True, False)
    """
    return (
        isinstance(row, (list, tuple, np.ndarray))
        and len(row) > 0
        and all(isinstance(m, dict) for m in row)
    )


def _conversation(row, i: int, column: str, what: str) -> list:
    """A conversation checked message by message, as a plain list of the given dicts."""
    for j, message in enumerate(row):
        if not (isinstance(message.get("role"), str) and isinstance(message.get("content"), str)):
            raise TypeError(
                f"{what}: {column} at row {i} is a conversation whose message {j} ({message!r}) "
                "lacks a string 'role' or 'content'; each message needs both, as in "
                "[{'role': 'user', 'content': '...'}]."
            )
    return list(row)


def _assistant_text(row, i: int, column: str, what: str) -> str:
    """The text of a completion given as one assistant message."""
    messages = _conversation(row, i, column, what)
    roles = [m["role"] for m in messages]
    if roles != ["assistant"]:
        raise ValueError(
            f"{what}: {column} at row {i} is a conversation with roles {roles}; a completion "
            "must be one assistant message, [{'role': 'assistant', 'content': '...'}]."
        )
    return messages[0]["content"]


def _checked_messages(row, i: int, column: str, what: str, messages: str):
    """A conversation kept as messages (``"keep"``), or an assistant turn's text (``"content"``)."""
    if messages == "keep":
        return _conversation(row, i, column, what)
    return _assistant_text(row, i, column, what)


def _not_one_text(values, what: str) -> None:
    """Refuse one string (or bytes) where a list of them is meant: it would be split."""
    if isinstance(values, str):
        raise TypeError(f"{what} must be a list of strings, not one string; wrap it: [{values!r}].")
    if isinstance(values, bytes):
        raise TypeError(
            f"{what} must be a list of strings, not bytes; decode and wrap it: "
            f"[{values.decode('utf-8', 'replace')!r}]."
        )


def _not_text_error(v, i: int, column: str, what: str) -> TypeError:
    if isinstance(v, bytes):
        return TypeError(
            f"{what}: {column} at row {i} is bytes ({v!r}); decode it to a string first, "
            "e.g. with .decode('utf-8')."
        )
    return TypeError(
        f"{what}: {column} at row {i} is {type(v).__name__} ({v!r}); every {column} must be "
        "a string."
    )


def check_texts(
    values, column: str, what: str, *, token_ids: bool = False, messages: str | None = None
) -> list:
    """A list of texts, one per row, as ``predict``, ``log_prob`` and rewards take them.

    Unlike :func:`check_prompts`, an empty list and empty strings pass: an empty
    completion is a response that stops at once.

    Parameters
    ----------
    values : list of str
        The texts; a bare string or bytes is refused rather than split into characters.
    column : str
        What one row is (``"prompt"``, ``"completion"``), named in errors.
    what : str
        What is being checked, named in errors (``"RewardModel.predict"``).
    token_ids : bool, default=False
        Also accept rows that are lists of token ids.
    messages : {"keep", "content"} or None, default=None
        Also accept conversations (lists of messages): ``"keep"`` returns them
        checked (prompts), ``"content"`` replaces one assistant message by its
        text (completions).

    Returns
    -------
    texts : list

    Examples
    --------
    >>> check_texts(["a", ""], "completion", "predict")
    ['a', '']
    >>> check_texts("abc", "completion", "predict")
    Traceback (most recent call last):
    ...
    TypeError: predict: completions must be a list of strings, not one string; wrap it: ['abc'].
    """
    _not_one_text(values, f"{what}: {column}s")
    rows = list(values)
    for i, v in enumerate(rows):
        if messages is not None and is_conversation(v):
            rows[i] = _checked_messages(v, i, column, what, messages)
            continue
        ids = token_ids and not isinstance(v, bytes) and isinstance(v, (list, tuple, np.ndarray))
        if not isinstance(v, str) and not ids:
            raise _not_text_error(v, i, column, what)
    return rows


def _check_text(
    values, column: str, what: str, allow_empty: bool = False, messages: str | None = None
) -> list:
    """Non-empty texts (or, with ``messages``, conversations: see :func:`check_texts`)."""
    out = []
    for i, v in enumerate(values):
        if messages is not None and is_conversation(v):
            out.append(_checked_messages(v, i, column, what, messages))
            continue
        if not isinstance(v, str):
            raise _not_text_error(v, i, column, what)
        if not allow_empty and not v.strip():
            raise ValueError(
                f"{what}: {column} at row {i} is empty; remove the row or give it text."
            )
        out.append(v)
    return out
