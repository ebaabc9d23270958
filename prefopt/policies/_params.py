"""The parameters every policy estimator shares: their constraints, and how they are stored."""

from __future__ import annotations

import os
from numbers import Integral, Real

from ..kl import KLController
from ..validation import Interval, StrOptions

COMMON_CONSTRAINTS = {
    "model": "no_validation",
    "tokenizer": "no_validation",
    "beta": [Interval(Real, 0, None, closed="left")],
    "kl": [KLController, None],
    "kl_estimator": [StrOptions({"k1", "k2", "k3"})],
    "learning_rate": [Interval(Real, 0, None, closed="neither"), None],
    "optimizer": [StrOptions({"adam", "sgd"})],
    "lr_schedule": [StrOptions({"constant", "linear"})],
    "max_grad_norm": [Interval(Real, 0, None, closed="neither"), None],
    "n_steps": [Interval(Integral, 0, None, closed="left")],  # 0: the starting policy
    "batch_size": [Interval(Integral, 1, None, closed="left")],
    "n_epochs": [Interval(Integral, 1, None, closed="left")],
    "n_minibatches": [Interval(Integral, 1, None, closed="left")],
    "temperature": [Interval(Real, 0, None, closed="neither"), None],
    "max_new_tokens": [Interval(Integral, 1, None, closed="left"), None],
    "missing_eos_reward": [Real, None],
    "stop_token_ids": ["array-like", Interval(Integral, 0, None, closed="left"), None],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
    "warm_start": ["boolean"],
    "checkpoint_dir": [str, os.PathLike, None],
    "checkpoint_every": [Interval(Integral, 1, None, closed="left")],
    "truncate_prompts": ["boolean"],
    "max_kl": [Interval(Real, 0, None, closed="neither"), None],
    "max_kl_action": [StrOptions({"warn", "raise"})],
    "min_eos_share": [Interval(Real, 0, 1, closed="both"), None],
    "on_unhealthy": [StrOptions({"warn", "raise", "stop", "ignore"})],
    "entropy_coef": [Interval(Real, 0, None, closed="left")],
    "ptx_coef": [Interval(Real, 0, None, closed="left")],
    "refit_every": [Interval(Integral, 1, None, closed="left"), None],
    "lora": "no_validation",
    "gradient_checkpointing": ["boolean"],
    "reward_weights": ["array-like", None],
    "vllm_importance_sampling_cap": [Interval(Real, 0, None, closed="neither"), None],
}


def store_params(estimator, params: dict) -> None:
    """Store ``__init__``'s arguments verbatim, as scikit-learn requires (no validation).

    Parameters
    ----------
    estimator : estimator
        The estimator being constructed.
    params : dict
        ``locals()`` of its ``__init__``.

    Examples
    --------
    >>> class Toy:
    ...     def __init__(self, *, a=1):
    ...         store_params(self, locals())
    >>> Toy(a=2).a
    2
    """
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)
