"""Building the value model of an algorithm that uses one (PPO).

In order: the user's module; a copy of the reward model when it is a
language-model :class:`~prefopt.RewardModel` (Ziegler et al. 2019 initialise the
value function from the reward model, so early estimates are sensible); the
policy's trunk copied with a new zero-initialised head; ``"shared"``, a head on
the policy's own trunk (the original code's shared network, no third copy);
or, for a policy that is not a transformer, one learned value per token.
"""

from __future__ import annotations

import copy

from ...backend import ScalarHeadModel, TokenValueTable, model_vocab_size
from ...backend.heads import shared_value_model


def build_value_model(spec, model, reward, tokenizer):
    """The value model for ``spec`` (a module, ``"shared"`` or ``None``).

    Parameters
    ----------
    spec : torch.nn.Module, "shared" or None
        The ``value_model`` parameter.
    model : torch.nn.Module
        The policy (before any LoRA wrap).
    reward : callable
        The reward given to ``fit``.
    tokenizer : tokenizer
        The policy's tokenizer.

    Returns
    -------
    value_model : torch.nn.Module
    """
    if isinstance(spec, str):
        if spec != "shared":
            raise ValueError(f"value_model must be a module, None or 'shared'; got {spec!r}.")
        return shared_value_model(model)
    if spec is not None:
        return copy.deepcopy(spec)
    reward_lm = getattr(reward, "model_", None)
    if isinstance(reward_lm, ScalarHeadModel):
        return copy.deepcopy(reward_lm)
    base = getattr(model, "base_model", None)
    if base is not None and base is not model and hasattr(base, "config"):
        return ScalarHeadModel(copy.deepcopy(base), head_std=0.0)  # zero head, as the OAI code
    return TokenValueTable(max(len(tokenizer), model_vocab_size(model) or 0))
