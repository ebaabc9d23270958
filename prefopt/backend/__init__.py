"""The shared torch layer: devices, seeding, models, tokenizers, sampling, log-probs."""

# First: where tqdm.auto is imported, before transformers can (see progress).
from . import progress  # noqa: F401  # isort: skip

from ._torch import (
    adamw,
    autocast,
    gradient_step,
    local_seed,
    make_generator,
    maybe_compile,
    resolve_device,
    uses_bf16,
)
from .generation import (
    EncodedPrompts,
    encode_prompts,
    pad_left,
    pad_right,
    position_ids_from_mask,
    response_logprobs,
    truncate_after_eos,
)
from .generation import sample as _native_sample
from .heads import ScalarHeadModel, TokenValueTable
from .models import (
    default_learning_rate,
    disable_dropout,
    ensure_pad_token,
    frozen_copy,
    fuse_activations,
    load_causal_lm,
    model_vocab_size,
)
from .scoring import join_right_padded, score_sequences, sequence_values, unpad
from .vllm_engine import VLLMEngine, dispatch

# The sampler every estimator calls: prefopt's own, or under set_config(generation="vllm")
# the same call answered by a vLLM engine (vllm_engine builds on generation, not the reverse).
sample = dispatch(_native_sample)

__all__ = [
    "EncodedPrompts",
    "ScalarHeadModel",
    "TokenValueTable",
    "VLLMEngine",
    "adamw",
    "autocast",
    "gradient_step",
    "default_learning_rate",
    "disable_dropout",
    "encode_prompts",
    "ensure_pad_token",
    "frozen_copy",
    "fuse_activations",
    "load_causal_lm",
    "local_seed",
    "make_generator",
    "maybe_compile",
    "model_vocab_size",
    "pad_left",
    "pad_right",
    "position_ids_from_mask",
    "response_logprobs",
    "resolve_device",
    "sample",
    "sequence_values",
    "truncate_after_eos",
    "join_right_padded",
    "score_sequences",
    "unpad",
    "uses_bf16",
]
