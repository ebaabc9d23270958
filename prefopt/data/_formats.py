"""Reading columns and checking texts and conversations, with errors that name the row."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def check_labels(labels, what: str) -> list[str]:
    """Column labels as texts, refusing two that would be read as one column.

    A DataFrame may hold two columns labelled ``prompt`` (``df["prompt"]`` is
    then a frame, whose iteration gives its labels, not its values), or the
    labels ``1`` and ``"1"``; reading either would guess.

    Parameters
    ----------
    labels : iterable
        A table's column labels, or the keys of its rows.
    what : str
        Named in the error.

    Returns
    -------
    labels : list of str

    Examples
    --------
    >>> check_labels(["prompt", "answer"], "Prompts")
    ['prompt', 'answer']
    >>> check_labels(["prompt", "answer", "prompt"], "Prompts")
    Traceback (most recent call last):
    ...
    ValueError: Prompts: the column label 'prompt' appears 2 times (columns ['prompt', ...
    """
    labels = list(labels)
    texts = [str(label) for label in labels]
    for text in dict.fromkeys(texts):
        same = [label for label, t in zip(labels, texts) if t == text]
        if len(same) > 1:
            kinds = "" if len(set(map(repr, same))) == 1 else f" (as {same})"
            raise ValueError(
                f"{what}: the column label {text!r} appears {len(same)} times{kinds} (columns "
                f"{texts}); which one is meant would be a guess. Drop or rename the duplicate "
                "(for a DataFrame: df.loc[:, ~df.columns.duplicated()] keeps the first)."
            )
    return texts


def _columns(data, names: Sequence[str], what: str) -> dict:
    """Read named columns from a DataFrame, a datasets.Dataset, a dict or rows."""
    if isinstance(data, pd.DataFrame) or _is_hf_dataset(data) or isinstance(data, dict):
        columns = check_labels(
            data.columns
            if isinstance(data, pd.DataFrame)
            else (data.column_names if _is_hf_dataset(data) else data),
            what,
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
    """A conversation checked message by message, as a plain list of the given dicts.

    A message needs a string ``role`` and a string ``content``; an assistant
    message that calls tools (a ``tool_calls`` entry) may have no content.
    """
    for j, message in enumerate(row):
        content = message.get("content")
        if content is None and message.get("tool_calls"):
            content = ""
        if not (isinstance(message.get("role"), str) and isinstance(content, str)):
            raise TypeError(
                f"{what}: {column} at row {i} is a conversation whose message {j} ({message!r}) "
                "lacks a string 'role' or 'content'; each message needs both, as in "
                "[{'role': 'user', 'content': '...'}]."
            )
    return list(row)


def _completion_messages(row, i: int, column: str, what: str):
    """A completion given as messages: one assistant message's text, or several messages.

    One assistant message becomes its content (the chat template's end of turn
    follows it, as after any text completion of a conversation). Several
    messages (an assistant's tool call, the tool's answer, the assistant's
    reply) stay a conversation, rendered by the chat template after the prompt;
    the last of them must be the assistant's.
    """
    messages = _conversation(row, i, column, what)
    roles = [m["role"] for m in messages]
    if len(messages) > 1 and roles[-1] == "assistant":
        return messages
    if roles != ["assistant"]:
        raise ValueError(
            f"{what}: {column} at row {i} is a conversation with roles {roles}; a completion "
            "must be one assistant message, [{'role': 'assistant', 'content': '...'}], or "
            "several messages that end with the assistant's."
        )
    return messages[0]["content"]


def _checked_messages(row, i: int, column: str, what: str, messages: str):
    """A conversation kept as messages (``"keep"``), or a completion's (``"content"``).

    See :func:`_completion_messages` for completions.
    """
    if messages == "keep":
        return _conversation(row, i, column, what)
    return _completion_messages(row, i, column, what)


def split_implicit_prompt(chosen, rejected, i: int, what: str = "Comparisons"):
    """TRL's implicit prompt: the start that ``chosen`` and ``rejected`` share.

    Conversations share their leading messages: those are the prompt, the
    messages after them the two completions (neither may be empty). Texts
    follow TRL's ``extract_prompt`` character by character: the prompt ends
    where the two first differ, less a space just before (the space starts
    both completions); when one text is the other's start, the prompt ends one
    character before the shorter one does.

    Parameters
    ----------
    chosen, rejected : str or list of dict
        The full texts, or the full conversations (TRL's format without a
        ``prompt`` column).
    i : int
        The row, named in errors.
    what : str, default="Comparisons"
        Named in errors.

    Returns
    -------
    prompt, chosen, rejected : str or list of dict

    Examples
    --------
    >>> split_implicit_prompt("The sky is blue.", "The sky is green.", 0)
    ('The sky is', ' blue.', ' green.')
    >>> q = {"role": "user", "content": "sky?"}
    >>> a, b = {"role": "assistant", "content": "blue"}, {"role": "assistant", "content": "red"}
    >>> prompt, chosen, rejected = split_implicit_prompt([q, a], [q, b], 0)
    >>> prompt == [q], chosen == [a], rejected == [b]
    (True, True, True)
    """
    chat = (is_conversation(chosen), is_conversation(rejected))
    if chat == (True, True):
        chosen, rejected = list(chosen), list(rejected)
        n = 0
        while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
            n += 1
        if n == 0 or n == len(chosen) or n == len(rejected):
            problem = (
                "share no leading message"
                if n == 0
                else "leave no messages after the ones they share"
            )
            raise ValueError(
                f"{what}: with no prompt column, the prompt is what chosen and rejected share "
                f"(TRL's implicit prompt), but at row {i} they {problem}; give a 'prompt' "
                "column, or conversations that start with the same prompt messages and end "
                "with different completions."
            )
        return chosen[:n], chosen[n:], rejected[n:]
    if chat != (False, False) or not (isinstance(chosen, str) and isinstance(rejected, str)):
        raise TypeError(
            f"{what}: with no prompt column, chosen and rejected at row {i} must both be "
            "texts or both conversations (lists of messages); got "
            f"{type(chosen).__name__} and {type(rejected).__name__}."
        )
    shortest = min(len(chosen), len(rejected))
    cut = shortest - 1  # TRL: one text is the other's start
    for j in range(shortest):
        if chosen[j] != rejected[j]:
            cut = j - 1 if j > 0 and chosen[j - 1] == " " else j
            break
    if cut <= 0:
        raise ValueError(
            f"{what}: with no prompt column, the prompt is the start that chosen and rejected "
            f"share (TRL's implicit prompt), but at row {i} they share none ({chosen!r} and "
            f"{rejected!r}); give a 'prompt' column."
        )
    return chosen[:cut], chosen[cut:], rejected[cut:]


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


def check_pairs(prompts, completions, what: str, *, token_ids: bool = False) -> tuple:
    """Prompts and completions checked as :func:`check_texts` does, one prompt a completion.

    A prompt may be a conversation (kept), a completion one assistant message (its
    text) or, with ``token_ids``, a list of token ids.

    Parameters
    ----------
    prompts, completions : list
    what : str
        What is being checked, named in errors (``"RewardModel.predict"``).
    token_ids : bool, default=False
        Also accept completions that are lists of token ids.

    Returns
    -------
    prompts, completions : list

    Examples
    --------
    >>> check_pairs(["a"], ["b", "c"], "predict")
    Traceback (most recent call last):
    ...
    ValueError: Got 1 prompts and 2 completions; pass one prompt per completion.
    """
    prompts = check_texts(prompts, "prompt", what, messages="keep")
    completions = check_texts(
        completions, "completion", what, token_ids=token_ids, messages="content"
    )
    if len(prompts) != len(completions):
        raise ValueError(
            f"Got {len(prompts)} prompts and {len(completions)} completions; "
            "pass one prompt per completion."
        )
    return prompts, completions


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
