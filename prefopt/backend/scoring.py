"""Scoring (prompt, response) token sequences with a scalar-head model.

Sequences are right-padded for scoring (the reward model is trained on
right-padded input) and the score is read at the last real token, which is the
EOS of a finished response (Huang et al. 2024).
"""

from __future__ import annotations

import torch

from ._shared_prompts import fast_sequence_values, takes_fast_values
from ._torch import autocast
from .generation import (
    EncodedPrompts,
    _forward_logits,
    _valid_ids,
    pad_right,
    position_ids_from_mask,
)


def join_right_padded(prompt_rows, response_rows, pad_token_id: int):
    """Concatenate prompt and response token lists and pad them on the right.

    Parameters
    ----------
    prompt_rows, response_rows : list of list of int
        Token ids of each prompt and of its response, without padding.
    pad_token_id : int

    Returns
    -------
    input_ids, attention_mask : torch.Tensor of shape (n, width)
    last_index : torch.Tensor of shape (n,)
        Index of each row's last real token.

    Examples
    --------
    >>> ids, mask, last = join_right_padded([[5, 6], [7]], [[8, 2], [9]], pad_token_id=0)
    >>> ids.tolist(), last.tolist()
    ([[5, 6, 8, 2], [7, 9, 0, 0]], [3, 1])
    """
    rows = [list(p) + list(r) for p, r in zip(prompt_rows, response_rows)]
    ids, mask = pad_right(rows, pad_token_id)
    return ids, mask, mask.sum(1) - 1


def unpad(prompts: EncodedPrompts, response_ids, response_mask):
    """Token lists of left-padded prompts and masked responses (for re-padding).

    Parameters
    ----------
    prompts : EncodedPrompts
    response_ids, response_mask : torch.Tensor of shape (n, length)

    Returns
    -------
    prompt_rows, response_rows : list of list of int
        The real tokens of each row, padding removed.
    """
    p = [
        r[m.bool()].tolist() for r, m in zip(prompts.input_ids.cpu(), prompts.attention_mask.cpu())
    ]
    q = [r[m.bool()].tolist() for r, m in zip(response_ids.cpu(), response_mask.cpu())]
    return p, q


def score_sequences(model, input_ids, attention_mask, last_index) -> torch.Tensor:
    """Run a scalar-head model and read its output at ``last_index`` of each row.

    Parameters
    ----------
    model : torch.nn.Module
        A model returning one value per position (:class:`ScalarHeadModel`).
    input_ids, attention_mask : torch.Tensor of shape (n, width)
        Right-padded sequences (:func:`join_right_padded`).
    last_index : torch.Tensor of shape (n,)
        Index of each row's last real token.

    Returns
    -------
    scores : torch.Tensor of shape (n,), float32
    """
    ids = _valid_ids(input_ids, attention_mask)  # pad may be the vocabulary size
    with autocast(ids.device):
        values = model(
            input_ids=ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
        )
    return values.float()[torch.arange(ids.shape[0], device=ids.device), last_index]


def sequence_values(
    value_model, prompts: EncodedPrompts, response_ids, response_mask, *, prompt_index=None
):
    """Value estimates V(s_t) for each response token t (the state before it).

    Parameters
    ----------
    value_model : torch.nn.Module
        A model returning one value per position (:class:`ScalarHeadModel`,
        :class:`TokenValueTable`).
    prompts : EncodedPrompts
    response_ids, response_mask : torch.Tensor of shape (n, length)
    prompt_index : torch.Tensor of shape (n,), default=None
        Rows with equal values hold the same prompt, which a scalar head on a
        transformers trunk then runs once for all of them
        (``prefopt.backend._shared_prompts``).

    Returns
    -------
    values : torch.Tensor of shape (n, length), float32
        The value model's output at the positions that predict each response
        token. A scalar head on a transformers trunk skips the padding no row
        needs: its values after every row's last real token are 0.
    """
    if takes_fast_values(value_model):
        return fast_sequence_values(value_model, prompts, response_ids, response_mask, prompt_index)
    n_prompt = prompts.input_ids.shape[1]
    input_ids = torch.cat([prompts.input_ids, response_ids], dim=1)
    mask = torch.cat([prompts.attention_mask, response_mask.long()], dim=1)
    values = _forward_logits(value_model, input_ids, mask, position_ids_from_mask(mask))
    return values[:, n_prompt - 1 : -1].float()
