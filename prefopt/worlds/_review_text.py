"""The review world's text helpers: VADER's gold score, text checks, conversational rows."""

from __future__ import annotations

import functools

import pandas as pd


@functools.lru_cache(maxsize=1)
def _analyzer():
    # vaderSentiment is an optional dependency: only the gold reward needs it.
    try:
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer
    except ImportError as e:
        raise ImportError(
            "ReviewWorld's gold reward is VADER's sentiment score, which needs the "
            "vaderSentiment package: pip install 'prefopt[worlds]'."
        ) from e
    return SentimentIntensityAnalyzer()


@functools.lru_cache(maxsize=1 << 16)
def _compound(text: str) -> float:
    # RL scores the same completions again and again; VADER is pure Python.
    return float(_analyzer().polarity_scores(text)["compound"])


def _check_texts(prompts, completions) -> tuple[list, list]:
    for name, values in (("prompts", prompts), ("completions", completions)):
        if isinstance(values, str):
            raise TypeError(
                f"{name} must be a list of strings, not one string; wrap it: [{values!r}]."
            )
    prompts, completions = list(prompts), list(completions)
    if len(prompts) != len(completions):
        raise ValueError(
            f"Got {len(prompts)} prompts and {len(completions)} completions; "
            "pass one prompt per completion."
        )
    for i, c in enumerate(completions):
        if not isinstance(c, str):
            raise TypeError(
                f"completion at row {i} is {type(c).__name__} ({c!r}); every "
                "completion must be a string."
            )
    return prompts, completions


def _conversational(frame: pd.DataFrame) -> pd.DataFrame:
    """(prompt, completion) text rows in TRL's conversational format."""
    return pd.DataFrame(
        {
            "prompt": [[{"role": "user", "content": p}] for p in frame["prompt"]],
            "completion": [[{"role": "assistant", "content": c}] for c in frame["completion"]],
        }
    )
