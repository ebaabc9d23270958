"""The layer every estimator that holds a causal language model builds on.

:class:`LanguageModelEstimator` loads the model and tokenizer, tokenises,
samples, keeps the frozen reference and persists; :class:`GenerativeEstimator`
adds ``sample``/``predict``/``log_prob``; :mod:`prefopt.lm.supervised` is the one
supervised loop (SFT, the reward model, DPO); :class:`RunState` is a run's
state apart from the fitted model. Both ``rewards`` and ``policies`` import it.
"""

from . import _checkpoint as checkpoint  # the checkpoint format, for policies and rewards
from ._base import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TEMPERATURE,
    LanguageModelEstimator,
    context_length,
    with_lora,
)
from ._generative import GenerativeEstimator, GenerativeStep
from ._persist import load, save
from ._run import RunState
from ._truncation import check_lengths, too_long_error, truncate_rows

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_TEMPERATURE",
    "GenerativeEstimator",
    "GenerativeStep",
    "LanguageModelEstimator",
    "RunState",
    "check_lengths",
    "checkpoint",
    "context_length",
    "load",
    "save",
    "too_long_error",
    "truncate_rows",
    "with_lora",
]
