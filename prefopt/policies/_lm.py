"""What every estimator holding a causal language model shares.

Loading the model and tokenizer (pad distinct from EOS, dropout off), resolving
the sampling settings, sampling completions and scoring their log-probs.
``BasePolicy`` (the RL loop) and ``SFTPolicy`` build on it.
"""

from __future__ import annotations

import re
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from .._config import get_config
from ..backend import (
    EncodedPrompts,
    disable_dropout,
    ensure_pad_token,
    load_causal_lm,
    make_generator,
    model_vocab_size,
    pad_left,
    pad_right,
    resolve_device,
    response_logprobs,
    sample,
    truncate_after_eos,
)
from ..backend.models import clone_keeping_models
from ..backend.serialization import dump_state, restore_state
from ..data import check_prompts

DEFAULT_TEMPERATURE = 0.7  # seeds: sampling temperature 0.7
DEFAULT_MAX_NEW_TOKENS = 53  # seeds: a fixed 53 tokens, truncated at the first EOS


def context_length(model) -> int | None:
    """Longest sequence the model takes, when its config says."""
    config = getattr(model, "config", None)
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


class GenerativeEstimator(BaseEstimator):
    """Base of estimators whose fitted state is a causal LM ``model_`` and ``tokenizer_``."""

    def __sklearn_clone__(self):
        # Starting models (a fitted SFTPolicy, a torch module) are kept, not copied.
        return clone_keeping_models(self)

    def __getstate__(self):
        return dump_state(self)

    def __setstate__(self, state):
        restore_state(self, state)

    def save_pretrained(self, directory) -> None:
        """Write the fitted model and tokenizer so plain ``transformers`` loads them.

        Weights are written as safetensors; ``AutoModelForCausalLM.from_pretrained``
        and ``AutoTokenizer.from_pretrained`` read the folder back.

        Parameters
        ----------
        directory : str or path
        """
        from transformers import PreTrainedModel

        check_is_fitted(self)
        if not isinstance(self.model_, PreTrainedModel):
            raise TypeError(
                f"save_pretrained needs a transformers model; this policy's model is "
                f"a {type(self.model_).__name__}. Use joblib.dump for it instead."
            )
        self.model_.save_pretrained(directory, safe_serialization=True)
        self.tokenizer_.save_pretrained(directory)

    def _init_model(self, model, tokenizer, *, seed: int) -> None:
        self.device_ = resolve_device()
        module, tok = load_causal_lm(model, tokenizer, seed=seed)
        self.tokenizer_ = ensure_pad_token(tok)
        module = disable_dropout(module).to(self.device_)
        module.eval()  # dropout is off; eval() also fixes any other train-time behaviour
        self.model_ = module
        generation_config = getattr(module, "generation_config", None)
        self.temperature_ = float(
            self.temperature
            or getattr(generation_config, "temperature", None)
            or DEFAULT_TEMPERATURE
        )
        self.max_new_tokens_ = int(
            self.max_new_tokens
            or getattr(generation_config, "max_new_tokens", None)
            or DEFAULT_MAX_NEW_TOKENS
        )
        vocab = model_vocab_size(module)
        pad = self.tokenizer_.pad_token_id
        # Never sample the pad token (the original code slices logits to n_vocab).
        self._suppress_ids = (pad,) if vocab is not None and pad < vocab else ()

    def _tokenize_prompts(self, prompts, check_length: bool = True) -> list[list[int]]:
        context = context_length(self.model_)
        limit = None if context is None or not check_length else context - self.max_new_tokens_
        rows = []
        # One call for the whole list: the fast tokenizer batches it.
        encoded = (
            self.tokenizer_(list(prompts), add_special_tokens=False)["input_ids"]
            if len(prompts)
            else []
        )
        for i, (p, ids) in enumerate(zip(prompts, encoded)):
            if not ids:
                raise ValueError(f"Prompt at row {i} ({p!r}) has no tokens.")
            if limit is not None and len(ids) > limit:
                if getattr(self, "truncate_prompts", False):
                    ids = self._truncated(p, limit, i)
                else:
                    raise ValueError(
                        f"Prompt at row {i} has {len(ids)} tokens, more than the {limit} that "
                        f"fit in the model's context ({context}) with max_new_tokens="
                        f"{self.max_new_tokens_}; shorten it, lower max_new_tokens, or pass "
                        "truncate_prompts=True."
                    )
            rows.append(ids)
        return rows

    def _truncated(self, prompt: str, limit: int, row: int) -> list[int]:
        """Cut a prompt at the last paragraph, else sentence, boundary that fits.

        The beginning is kept, as in the seeds' reproduction (the post is cut at the
        last newline that fits the 512-token budget).
        """
        encode = lambda text: self.tokenizer_(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        for pattern in (r"\n\s*\n", r"\n", r"(?<=[.!?])\s+"):
            cuts = [m.start() for m in re.finditer(pattern, prompt)]
            for cut in reversed(cuts):
                ids = encode(prompt[:cut].rstrip())
                if ids and len(ids) <= limit:
                    return ids
        raise ValueError(
            f"Prompt at row {row} has no paragraph or sentence boundary within the "
            f"first {limit} tokens, so it cannot be truncated; shorten it."
        )

    def _decode(self, response_ids, response_mask) -> list[str]:
        ids = [r[m.bool()].tolist() for r, m in zip(response_ids.cpu(), response_mask.cpu())]
        return self.tokenizer_.batch_decode(ids, skip_special_tokens=True)

    def _completion_tokens(self, completions, add_eos: bool = True) -> list[list[int]]:
        tok = self.tokenizer_
        completions = list(completions)
        texts = [c for c in completions if isinstance(c, str)]
        encoded = iter(tok(texts, add_special_tokens=False)["input_ids"] if texts else [])
        eos = [tok.eos_token_id] if add_eos and tok.eos_token_id is not None else []
        return [
            list(next(encoded)) + eos if isinstance(c, str) else [int(i) for i in c]
            for c in completions
        ]

    # ----- using a fitted policy ----------------------------------------------------
    def sample(self, X, n: int = 1, *, random_state=None) -> list[list[str]]:
        """Sample ``n`` completions for each prompt.

        Parameters
        ----------
        X : list of str or table with a ``prompt`` column
            Prompts.
        n : int, default=1
            Completions per prompt.
        random_state : int, RandomState instance or None, default=None
            ``None`` uses the estimator's ``random_state``: the same call gives
            the same completions.

        Returns
        -------
        completions : list of list of str
            ``n`` completions per prompt, truncated after the first EOS.
        """
        check_is_fitted(self)
        prompts = check_prompts(X)
        if n < 1:
            raise ValueError(f"n must be >= 1; got {n!r}.")
        tokens = self._tokenize_prompts(prompts)
        generator = make_generator(self.random_state if random_state is None else random_state)
        rows = np.repeat(np.arange(len(prompts)), n)
        out = []
        size = get_config()["eval_batch_size"]
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            enc = pad_left([tokens[i] for i in chunk], self.tokenizer_.pad_token_id)
            enc = EncodedPrompts(
                enc.input_ids.to(self.device_), enc.attention_mask.to(self.device_)
            )
            raw = sample(
                self.model_,
                enc,
                max_new_tokens=self.max_new_tokens_,
                temperature=self.temperature_,
                generator=generator,
                suppress_ids=self._suppress_ids,
                eos_token_id=self.tokenizer_.eos_token_id,
            )
            ids, mask, _ = truncate_after_eos(
                raw, self.tokenizer_.eos_token_id, self.tokenizer_.pad_token_id
            )
            out.extend(self._decode(ids, mask))
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    def predict(self, X) -> list[str]:
        """One sampled completion per prompt (what a ``Pipeline`` calls)."""
        return [c[0] for c in self.sample(X, n=1)]

    @torch.no_grad()
    def log_prob(
        self, prompts, completions, *, reference: bool = False, add_eos: bool = True
    ) -> np.ndarray:
        """Log-probability of each completion under the policy's sampling distribution.

        Parameters
        ----------
        prompts : list of str
        completions : list of str or list of list of int
            Text, or token ids.
        reference : bool, default=False
            Score under the frozen reference model instead.
        add_eos : bool, default=True
            Append the EOS token to text completions (when the tokenizer has one),
            so the log-probability is that of the complete response.

        Returns
        -------
        logprobs : ndarray of shape (n,)
            Sums of per-token log-probs at the sampling temperature.
        """
        check_is_fitted(self)
        prompts = list(prompts)
        completions = list(completions)
        if len(prompts) != len(completions):
            raise ValueError(f"Got {len(prompts)} prompts and {len(completions)} completions.")
        tok = self.tokenizer_
        ptoks = self._tokenize_prompts(prompts)
        rtoks = self._completion_tokens(completions, add_eos)
        out = []
        size = get_config()["eval_batch_size"]
        with self._reference() if reference else nullcontext(self.model_) as model:
            for start in range(0, len(prompts), size):
                sl = slice(start, start + size)
                enc = pad_left(ptoks[sl], tok.pad_token_id)
                ids, mask = pad_right(rtoks[sl], tok.pad_token_id)
                enc = EncodedPrompts(
                    enc.input_ids.to(self.device_), enc.attention_mask.to(self.device_)
                )
                lp = response_logprobs(
                    model,
                    enc,
                    ids.to(self.device_),
                    mask.to(self.device_),
                    temperature=self.temperature_,
                    suppress_ids=self._suppress_ids,
                )
                out.append(lp.sum(1).cpu().double().numpy())
        return np.concatenate(out)

    @contextmanager
    def _reference(self):
        """The frozen reference: its own copy, or the LoRA policy with the adapter off."""
        ref = getattr(self, "ref_model_", None)
        if ref is not None:
            yield ref
        elif hasattr(self.model_, "disable_adapter"):
            with self.model_.disable_adapter():
                yield self.model_
        else:
            raise ValueError(f"{type(self).__name__} has no reference model.")

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "model_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = False
        tags.input_tags.two_d_array = False
        tags.input_tags.string = True
        tags.non_deterministic = False
        return tags
