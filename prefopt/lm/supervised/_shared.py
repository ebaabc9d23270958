"""What the supervised estimators (SFT, the reward model, DPO) share besides their loop."""

from __future__ import annotations

import os
import warnings
from numbers import Integral, Real

from ...validation import Interval, StrOptions

__all__ = ["SUPERVISED_CONSTRAINTS", "warn_y_ignored"]

# The constraints of the parameters every supervised estimator shares: each declares
# only its own beside them.
SUPERVISED_CONSTRAINTS = {
    "model": "no_validation",
    "tokenizer": "no_validation",
    "learning_rate": [Interval(Real, 0, None, closed="neither"), None],
    "n_epochs": [Interval(Integral, 1, None, closed="left")],
    "batch_size": [Interval(Integral, 1, None, closed="left")],
    "temperature": [Interval(Real, 0, None, closed="neither"), None],
    "max_new_tokens": [Interval(Integral, 1, None, closed="left"), None],
    "stop_token_ids": ["array-like", Interval(Integral, 0, None, closed="left"), None],
    "max_length": [Interval(Integral, 2, None, closed="left"), None],
    "max_prompt_length": [Interval(Integral, 1, None, closed="left"), None],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
    "checkpoint_dir": [str, os.PathLike, None],
    "checkpoint_every": [Interval(Integral, 1, None, closed="left")],
    "on_unhealthy": [StrOptions({"warn", "raise", "stop", "ignore"})],
    "lora": "no_validation",
    "gradient_checkpointing": ["boolean"],
    "micro_batch_size": [Interval(Integral, 1, None, closed="left"), None],
}

# Why a comparison estimator's score needs no y.
COMPARISONS_SAY = "the comparisons say which response is chosen"


def warn_y_ignored(y, method: str, why: str = COMPARISONS_SAY) -> None:
    """Warn that ``method`` (a ``score`` or ``partial_fit``) ignores the ``y`` it was given.

    Parameters
    ----------
    y : object
        What the caller passed; ``None`` warns nothing.
    method : str
        The method, named in the warning (``"RewardModel.score"``).
    why : str, default="the comparisons say which response is chosen"
        Where the targets come from instead.

    Examples
    --------
    >>> warn_y_ignored(None, "RewardModel.score")  # no y: nothing to say
    """
    if y is not None:
        warnings.warn(
            f"{method} ignores y (got {type(y).__name__}): {why}; call score(X) without y.",
            UserWarning,
            stacklevel=3,
        )
