"""A fitted language-model reward as a transformers sequence-classification model."""

from __future__ import annotations

import copy
import os
import warnings

import torch

from ..backend.progress import quiet_transformers

__all__ = ["SCORING_HELPER", "save_sequence_classifier", "to_sequence_classifier"]

# The file save_pretrained writes beside the weights: scoring with transformers alone.
SCORING_HELPER = "score_reward.py"
_HELPER_SOURCE = '''"""Score (prompt, completion) pairs as prefopt's RewardModel.predict does.

Needs only torch and transformers. Each prompt and completion are tokenized APART, then
joined with the stop token: prompt ids (with the tokenizer's BOS) + completion ids + {end}.
Tokenizing prompt + completion as one string can merge tokens across the boundary (BPE)
and then scores other tokens than the reward model was fitted on. Rows are right-padded,
and the classifier reads the last token that is not padding (the stop token).

    import sys; sys.path.insert(0, folder)
    from score_reward import score
    score(folder, ["2+2="], ["4"])  # -> array of rewards
"""

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

END_ID = {end}  # the stop token prefopt appends to a completion


def token_rows(tokenizer, prompts, completions):
    """prompt ids + completion ids + END_ID, each tokenized apart."""
    prompt_ids = tokenizer(list(prompts))["input_ids"]
    completion_ids = tokenizer(list(completions), add_special_tokens=False)["input_ids"]
    return [p + c + [END_ID] for p, c in zip(prompt_ids, completion_ids)]


@torch.no_grad()
def score(folder, prompts, completions, batch_size=16):
    """One reward per (prompt, completion) pair, as an array."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    rows = token_rows(tokenizer, prompts, completions)
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        width = max(len(r) for r in chunk)
        ids = [r + [tokenizer.pad_token_id] * (width - len(r)) for r in chunk]
        mask = [[1] * len(r) + [0] * (width - len(r)) for r in chunk]
        logits = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
        out.append(logits[:, 0].double().numpy())
    return np.concatenate(out) if out else np.zeros(0)
'''

# Where causal LMs keep the norm applied to their last hidden state (GPT-2, BLOOM and
# Falcon; Llama, Mistral, Qwen and Gemma; OPT's decoder).
_FINAL_NORMS = ("ln_f", "norm", "final_layernorm", "final_layer_norm", "decoder.final_layer_norm")


def _final_norm(trunk):
    for name in _FINAL_NORMS:
        module = trunk
        for part in name.split("."):
            module = getattr(module, part, None)
        if isinstance(getattr(module, "bias", None), torch.nn.Parameter):
            return module
    return None


def _projection_after_norm(trunk):
    """The linear map after the final norm (OPT's ``project_out``, no bias), or ``None``."""
    project = getattr(getattr(trunk, "decoder", None), "project_out", None)
    if isinstance(project, torch.nn.Linear):
        if project.bias is not None:
            raise TypeError(
                f"{type(trunk).__name__}'s projection after its final norm has a bias; the "
                "reward's offset cannot be folded in. Export with normalize=False, or score "
                "with prefopt."
            )
        return project
    return None


def _score_layer(model) -> torch.nn.Linear:
    """The sequence classifier's head: its one linear module outside the base model."""
    prefix = model.base_model_prefix
    heads = [
        m
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and not name.startswith(prefix)
    ]
    if len(heads) != 1 or heads[0].out_features != 1:
        raise TypeError(
            f"{type(model).__name__} has no single linear head to hold the reward; "
            "exporting a reward model as a sequence classifier supports causal LMs "
            "whose classifier is one linear layer (GPT-2, Llama, Mistral, Qwen, OPT)."
        )
    return heads[0]


@torch.no_grad()
def to_sequence_classifier(rm, stop_ids):
    """``AutoModelForSequenceClassification`` with ``num_labels=1`` scoring as ``rm`` does.

    prefopt's score is ``gain * (w . h_last + b) + bias`` at the last real token of a
    right-padded prompt + response. The classifier reads ``W . h`` at the last token that
    is not ``pad_token_id``, so ``W = gain * w``; the constant ``gain * b + bias`` goes
    into the bias of the final norm (shifted along ``W``, so ``W . delta`` is exactly the
    constant), or the head's own bias where it has one.
    """
    from transformers import AutoModelForSequenceClassification

    head = rm.model_
    trunk = head.backbone
    pad = rm.tokenizer_.pad_token_id
    if pad is None or pad in stop_ids:
        raise ValueError(
            f"The tokenizer's pad token ({pad!r}) is a stop token: a sequence classifier "
            "reads the last token that is not padding, so it would skip the EOS this reward "
            "reads. Give the tokenizer a distinct pad token before fitting "
            "(tokenizer.add_special_tokens({'pad_token': '[PAD]'}))."
        )
    config = copy.deepcopy(trunk.config)
    config.num_labels = 1
    config.id2label, config.label2id = {0: "reward"}, {"reward": 0}
    config.pad_token_id = pad
    config.architectures = None
    model = AutoModelForSequenceClassification.from_config(config)
    missing, unexpected = model.base_model.load_state_dict(trunk.state_dict(), strict=False)
    if missing or unexpected:
        raise TypeError(
            f"The reward's trunk does not fit {type(model).__name__}'s base model "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})."
        )
    score = _score_layer(model)
    gain, bias = float(rm.gain_), float(rm.bias_)
    weight = head.head.weight.detach().double() * gain
    constant = gain * float(head.head.bias) + bias
    score.weight.copy_(weight.to(score.weight.dtype))
    if score.bias is not None:
        score.bias.fill_(constant)
    elif constant != 0.0:
        norm = _final_norm(model.base_model)
        if norm is None:
            raise TypeError(
                f"{type(model).__name__}'s head has no bias and its final norm none either, "
                f"so the reward's offset ({constant:.4g}) cannot be folded in; export with "
                "normalize=False and a head without bias, or score with prefopt."
            )
        # The last hidden state is P(norm(x)), P a projection without bias (OPT's
        # project_out) or the identity: a shift d of the norm's bias moves W . h by
        # W . P d, which d = constant * P^T W / |P^T W|^2 makes exactly the constant.
        direction = weight[0]
        project = _projection_after_norm(model.base_model)
        if project is not None:
            direction = project.weight.detach().double().T @ direction
        shift = constant * direction / float(direction @ direction)
        norm.bias.copy_((norm.bias.double() + shift).to(norm.bias.dtype))
    if pad >= model.get_input_embeddings().num_embeddings:
        # prefopt adds a pad token without new embeddings (it never embeds padding); the
        # classifier embeds every id, so it gets a row for it (padding after the last
        # real token, which a causal model's scored position never attends to).
        model.resize_token_embeddings(pad + 1)
    return model.eval()


def save_sequence_classifier(model, tokenizer, directory, end_id: int, owner: str) -> None:
    """Write ``model`` (:func:`to_sequence_classifier`'s), ``tokenizer`` and the scoring helper.

    ``directory`` is a checked folder (``lm._checkpoint.check_folder``).
    Warns (naming ``owner``) when the tokenizer can merge tokens across the
    prompt/completion boundary, so that scoring ``prompt + completion`` as one string
    would score other tokens than the reward model does.
    """
    with quiet_transformers():  # no "Writing model shards" bar where prefopt shows none
        model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    with open(os.path.join(directory, SCORING_HELPER), "w") as f:
        f.write(_HELPER_SOURCE.format(end=int(end_id)))
    merged = _joint_merge(tokenizer)
    if merged is not None:
        warnings.warn(
            f"{owner}.save_pretrained: this tokenizer can merge tokens across "
            f"the prompt/completion boundary ({merged}), so tokenizing prompt + completion "
            "as one string scores other tokens than this reward model does (it tokenizes "
            f"them apart). Score the export with {SCORING_HELPER} (written in the folder), "
            "which tokenizes them apart.",
            UserWarning,
            stacklevel=3,
        )


def _joint_merge(tokenizer, n_words: int = 12) -> str | None:
    """An example where ``tok(a + b)`` differs from ``tok(a) + tok(b)``, or ``None``.

    Probed on pairs of the vocabulary's first ordinary tokens (texts a tokenizer
    splits only at their boundary, if it never merges across it).
    """
    specials = set(tokenizer.all_special_ids)
    words = []
    for i in range(len(tokenizer)):
        text = tokenizer.decode([i])
        if i not in specials and text.strip() and text not in words:
            words.append(text)
        if len(words) == n_words:
            break
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    for a in words:
        for b in words:
            apart = encode(a) + encode(b)
            try:
                joint = encode(a + b)
            except Exception:  # noqa: BLE001 - a word-level vocabulary without [UNK] refuses
                continue  # "ab" outright: it raises rather than merging across the boundary
            if joint != apart:
                return f"{a!r} + {b!r}: {joint} as one string, {apart} apart"
    return None
