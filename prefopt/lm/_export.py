"""A fitted policy's model and tokenizer as a folder other tools load and pad with.

prefopt pads with a ``[PAD]`` token that may lie past the model's embedding rows
(it never embeds padding: pad ids are masked and replaced before every forward).
Other tools embed every id they are given — transformers' ``pipeline`` on a padded
batch, TRL's trainers, vLLM — so the exported model gets a row for it, and the
exported generation config says what prefopt's own sampling does: the stop ids, the
pad token never sampled, the number of new tokens and the temperature.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch

from ..backend import model_vocab_size

__all__ = ["exported_model", "export_tokenizer"]


@contextmanager
def exported_model(est, model, resize: bool = True):
    """``model`` ready for ``save_pretrained``: a pad row, and prefopt's sampling settings.

    The estimator is never altered: its config and generation config get the export's
    settings only inside the ``with`` block, and a model that needs a pad row is
    copied first (``resize=False``, for gathered FSDP weights, leaves it out). The new
    embedding rows (the pad token's, when its id is past the last row) are the mean of
    the others, as transformers' ``resize_token_embeddings`` draws them on average;
    padding is masked, so their value only matters to a tool that samples the pad
    token, which the generation config forbids (``suppress_tokens``), as prefopt's
    sampling does.
    """
    pad = est.tokenizer_.pad_token_id
    if resize and pad is not None and pad >= model.get_input_embeddings().num_embeddings:
        model = _with_pad_row(copy.deepcopy(model), pad)
    saved = getattr(model.config, "pad_token_id", None), copy.deepcopy(model.generation_config)
    try:
        model.config.pad_token_id = pad
        generation = model.generation_config
        stops = list(est.stop_token_ids_)
        generation.eos_token_id = stops[0] if len(stops) == 1 else stops
        generation.pad_token_id = pad
        generation.max_new_tokens = int(est.max_new_tokens_)
        generation.do_sample = True
        generation.temperature = float(est.temperature_)
        vocab = model_vocab_size(model)
        generation.suppress_tokens = [pad] if pad is not None and vocab and pad < vocab else None
        yield model
    finally:
        model.config.pad_token_id, model.generation_config = saved


@torch.no_grad()
def _with_pad_row(model, pad: int):
    rows = model.get_input_embeddings().num_embeddings
    model.resize_token_embeddings(pad + 1, mean_resizing=False)
    inputs = model.get_input_embeddings().weight
    inputs[rows:] = inputs[:rows].mean(0)
    outputs = model.get_output_embeddings()
    if outputs is not None and outputs.weight.data_ptr() != inputs.data_ptr():  # untied
        outputs.weight[rows:] = outputs.weight[:rows].mean(0)
        bias = getattr(outputs, "bias", None)
        if bias is not None and bias.shape[0] > rows:
            bias[rows:] = bias[:rows].mean()
    return model


def export_tokenizer(est):
    """A copy of ``tokenizer_`` that pads on the left, as generation needs.

    Its encoding of a text prompt is the estimator's (the same BOS prefix, added by
    the tokenizer itself), so a tool that calls it reads the prompts prefopt did.
    """
    tokenizer = copy.deepcopy(est.tokenizer_)
    tokenizer.padding_side = "left"
    tokenizer.init_kwargs["padding_side"] = "left"  # what tokenizer_config.json is written from
    return tokenizer
