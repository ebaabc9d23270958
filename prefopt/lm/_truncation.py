"""``max_length`` and ``max_prompt_length`` of the supervised estimators (TRL's names).

A prompt is cut from the left to ``max_prompt_length`` tokens (its end, next to
the completion, is kept; the tokenizer's BOS stays in front), then each of its
completions from the right so that prompt + completion fit in ``max_length``
tokens (a completion's start is kept). A completion cut there loses its stop
token, so that row does not train (or score at) the end of the response, as in
TRL. Both ``None``: nothing is cut, and a row longer than the model's context is
an error naming ``max_length``.
"""

from __future__ import annotations

from ._encoding import context_length

__all__ = ["check_lengths", "too_long_error", "truncate_rows"]


def check_lengths(estimator) -> None:
    """Refuse a ``max_prompt_length`` that leaves no room for a completion in ``max_length``.

    Parameters
    ----------
    estimator : LanguageModelEstimator
        Reads its ``max_length`` and ``max_prompt_length`` (``None`` when it lacks them).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> check_lengths(SimpleNamespace(max_length=8, max_prompt_length=4))
    >>> check_lengths(SimpleNamespace(max_length=4, max_prompt_length=4))
    Traceback (most recent call last):
    ...
    ValueError: max_prompt_length=4 leaves no token of max_length=4 for the completion; ...
    """
    max_length = getattr(estimator, "max_length", None)
    max_prompt = getattr(estimator, "max_prompt_length", None)
    if max_length is not None and max_prompt is not None and max_prompt >= max_length:
        raise ValueError(
            f"max_prompt_length={max_prompt} leaves no token of max_length={max_length} for "
            "the completion; set max_prompt_length below max_length."
        )


def truncate_rows(estimator, prompts, completions, what: str = "Row"):
    """Cut prompt and completion token rows to the estimator's lengths (see the module).

    Parameters
    ----------
    estimator : LanguageModelEstimator
        Has ``max_length`` and ``max_prompt_length`` (``None`` when it lacks them).
    prompts : list of list of int
        One prompt's ids per row.
    completions : list of lists of list of int
        Columns of completion ids (chosen and rejected: two), one per prompt each.
    what : str, default="Row"
        Names a row in errors (``"Demonstration"``, ``"Comparison"``).

    Returns
    -------
    prompts, completions : the cut rows, in the same layout.
    """
    max_length = getattr(estimator, "max_length", None)
    max_prompt = getattr(estimator, "max_prompt_length", None)
    if max_length is None and max_prompt is None:
        return prompts, completions
    check_lengths(estimator)
    prefix = list(estimator._prompt_prefix())
    out_prompts = []
    for i, p in enumerate(prompts):
        p = list(p)
        if max_prompt is not None and len(p) > max_prompt:
            keep = prefix if prefix and p[: len(prefix)] == prefix else []
            if len(keep) >= max_prompt:
                raise ValueError(
                    f"max_prompt_length={max_prompt} leaves no token of the prompt at row {i} "
                    f"after its {len(keep)} BOS token(s); raise max_prompt_length."
                )
            body = p[len(keep) :]
            p = keep + body[len(body) - (max_prompt - len(keep)) :]
        if max_length is not None and len(p) >= max_length:
            raise ValueError(
                f"{what} at row {i}: its prompt has {len(p)} tokens, which leaves no token of "
                f"max_length={max_length} for the completion; set max_prompt_length below "
                "max_length (prompts are then cut from the left) or raise max_length."
            )
        out_prompts.append(p)
    if max_length is None:
        return out_prompts, completions
    cut = [
        [list(c)[: max_length - len(p)] for p, c in zip(out_prompts, column)]
        for column in completions
    ]
    return out_prompts, cut


def too_long_error(estimator, what: str, row: int, n_tokens: int):
    """The error of a row past the model's context; ``None`` when it fits.

    Parameters
    ----------
    estimator : LanguageModelEstimator
        A fitted (or fitting) estimator: its ``model_`` gives the context length,
        its ``max_length`` the fix the message names.
    what : str
        Names the row's kind in the message (``"Demonstration"``, ``"Comparison"``).
    row : int
        The row's index in the data.
    n_tokens : int
        The row's length, prompt and completion together.

    Returns
    -------
    error : ValueError or None

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_positions=8, n_embd=8, n_layer=1, n_head=1))
    >>> est = SimpleNamespace(model_=model, max_length=None)
    >>> too_long_error(est, "Comparison", 3, 6) is None
    True
    >>> print(too_long_error(est, "Comparison", 3, 9))  # doctest: +ELLIPSIS
    Comparison at row 3 has 9 tokens, more than the model's context of 8; shorten it, ...
    """
    context = context_length(estimator.model_)
    if context is None or n_tokens <= context:
        return None
    hint = (
        "shorten it, or pass max_length (at most the context; completions are then cut from "
        "the right) and max_prompt_length (prompts cut from the left)"
        if getattr(estimator, "max_length", None) is None
        else f"lower max_length={estimator.max_length} to at most {context}"
    )
    return ValueError(
        f"{what} at row {row} has {n_tokens} tokens, more than the model's context of "
        f"{context}; {hint}."
    )
