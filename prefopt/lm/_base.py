"""What every estimator that holds a causal language model shares.

Loading the model and tokenizer (a pad token distinct from EOS, dropout off),
tokenisation (batched, with the model's context length checked), the sampling
settings, sampling completions, the frozen reference or LoRA adapter, and
persistence. The policies, SFT, the language-model reward model and DPO build
on :class:`LanguageModelEstimator`; those that generate text also on
:class:`GenerativeEstimator`.
"""

from __future__ import annotations

import copy
import os
import re
from contextlib import contextmanager

from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from .._config import get_config
from ..backend import (
    EncodedPrompts,
    disable_dropout,
    ensure_pad_token,
    frozen_copy,
    load_causal_lm,
    model_vocab_size,
    pad_left,
    pad_right,
    resolve_device,
    sample,
    truncate_after_eos,
)
from ..backend.models import clone_keeping_models
from ..backend.serialization import dump_state, restore_state

# Sampling defaults of Ziegler et al. (2019) and Huang et al. (2024): temperature 0.7,
# a fixed 53 new tokens truncated after the first EOS.
DEFAULT_TEMPERATURE = 0.7
DEFAULT_MAX_NEW_TOKENS = 53


def context_length(model) -> int | None:
    """Longest sequence the model takes, when its config says.

    Parameters
    ----------
    model : torch.nn.Module
        A model with a transformers-style ``config``, or any module.

    Returns
    -------
    length : int or None
        ``max_position_embeddings`` or ``n_positions``; ``None`` when unknown.

    Examples
    --------
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> context_length(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=32)))
    32
    """
    config = getattr(model, "config", None)
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def with_lora(model, lora):
    """Wrap a transformers model with a LoRA adapter (peft); only the adapter trains.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The model to adapt.
    lora : dict or peft.LoraConfig
        The adapter's settings, e.g. ``{"r": 8, "target_modules": ["c_attn"]}``.

    Returns
    -------
    model : peft.PeftModel
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("lora= needs the peft package: pip install 'prefopt[lora]'.") from None
    config = LoraConfig(**lora) if isinstance(lora, dict) else lora
    if not getattr(config, "target_modules", None):
        raise ValueError(
            "lora= needs target_modules, e.g. {'r': 8, 'target_modules': ['c_attn']} for GPT-2."
        )
    return get_peft_model(model, copy.deepcopy(config))


def _default_prefix(tokenizer) -> list[int]:
    """The ids a tokenizer puts before a text by default (its BOS), without any after it.

    A probe text, one ordinary token of the vocabulary, is encoded with and without
    special tokens; what comes before the probe's own ids is the prefix. Whatever
    the tokenizer appends (an EOS after the text) is left out: a prompt goes on.
    """
    specials = set(tokenizer.all_special_ids)
    probe = next(
        (
            text
            for i in range(len(tokenizer))
            if i not in specials and (text := tokenizer.decode([i])).strip()
        ),
        None,
    )
    if probe is None:
        return []
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return list(full[:start])
    # The probe itself came out differently: keep the leading special tokens.
    start = next((i for i, t in enumerate(full) if t not in specials), len(full))
    return list(full[:start])


class LanguageModelEstimator(BaseEstimator):
    """Base of every estimator whose fitted state holds a causal language model.

    It resolves ``model``/``tokenizer`` parameters into a fitted ``model_`` and
    ``tokenizer_`` on the configured device, tokenises text in batches against
    the model's context length, samples completions, keeps the frozen reference
    (a copy, or the LoRA base with the adapter disabled), and persists without
    pickling tensors. Subclasses hold the training.

    Subclasses read these parameters when they have them: ``temperature``,
    ``max_new_tokens``, ``truncate_prompts`` and ``lora``.
    """

    def __sklearn_clone__(self):
        # Starting models (a fitted SFTPolicy, a torch module) are kept, not copied.
        clone_ = clone_keeping_models(self)
        # A clone (a search's candidate or seed) checkpoints into its own sub-folder.
        clone_._checkpoint_subfolder = True
        return clone_

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
            The folder to write.
        """
        from transformers import PreTrainedModel

        check_is_fitted(self)
        model = getattr(self.model_, "merge_and_unload", None)
        model = self.model_ if model is None else copy.deepcopy(self.model_).merge_and_unload()
        if not isinstance(model, PreTrainedModel):
            raise TypeError(
                f"save_pretrained needs a transformers model; this estimator's model is "
                f"a {type(model).__name__}. Use save(folder) for it instead."
            )
        from ._checkpoint import check_folder

        directory = check_folder(directory, "save_pretrained's folder")
        model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer_.save_pretrained(directory)
        written = set(os.listdir(directory))
        if "config.json" not in written or not any(f.endswith(".safetensors") for f in written):
            raise OSError(
                f"save_pretrained wrote no model into {directory!r} (found {sorted(written)}); "
                "check the disk and the folder's permissions."
            )

    def save(self, folder) -> str:
        """Save the fitted estimator to ``folder`` as JSON and safetensors (no pickle).

        :func:`prefopt.load` reads it back without running any code from the
        folder; what JSON cannot hold (a reward function, a custom torch
        module) is passed to ``load`` again by name.

        Parameters
        ----------
        folder : str or path
            The folder to write.

        Returns
        -------
        folder : str

        Examples
        --------
        >>> import tempfile, prefopt
        >>> from prefopt import RewardModel
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> rm = RewardModel().fit(world.comparisons(200, random_state=0))
        >>> folder = rm.save(tempfile.mkdtemp())  # doctest: +SKIP
        >>> again = prefopt.load(folder, featurizer_=world.features)  # doctest: +SKIP
        """
        from ._persist import save

        check_is_fitted(self)
        return save(self, folder)

    # ----- loading ------------------------------------------------------------------
    def _load_lm(self, model, tokenizer, *, seed: int):
        """A copy of the given model on the device, dropout off, and its tokenizer."""
        self.device_ = resolve_device()
        module, tok = load_causal_lm(model, tokenizer, seed=seed)
        self.tokenizer_ = ensure_pad_token(tok)
        module = disable_dropout(module).to(self.device_)
        module.eval()  # dropout is off; eval() also fixes any other train-time behaviour
        return module

    def _init_model(self, model, tokenizer, *, seed: int) -> None:
        self.model_ = self._load_lm(model, tokenizer, seed=seed)
        self._resolve_sampling(self.model_)

    def _check_max_new_tokens(self, module) -> None:
        """Refuse a ``max_new_tokens_`` that leaves no room for a prompt in the context."""
        context = context_length(module)
        n = self.max_new_tokens_
        if context is not None and n >= context:
            given = getattr(self, "max_new_tokens", None)
            name = f"max_new_tokens={n}" if given else f"max_new_tokens=None (resolved to {n})"
            raise ValueError(
                f"{name} does not fit the model's context of {context} tokens with a prompt "
                f"of at least one token; set max_new_tokens to at most {context - 1}."
            )

    def _resolve_sampling(self, module) -> None:
        """``temperature_``, ``max_new_tokens_`` and the ids never sampled, for ``module``."""
        generation_config = getattr(module, "generation_config", None)
        self.temperature_ = float(
            getattr(self, "temperature", None)
            or getattr(generation_config, "temperature", None)
            or DEFAULT_TEMPERATURE
        )
        self.max_new_tokens_ = int(
            getattr(self, "max_new_tokens", None)
            or getattr(generation_config, "max_new_tokens", None)
            or DEFAULT_MAX_NEW_TOKENS
        )
        vocab = model_vocab_size(module)
        pad = self.tokenizer_.pad_token_id
        # Never sample the pad token (the original code slices logits to n_vocab).
        self._suppress_ids = (pad,) if vocab is not None and pad < vocab else ()

    def _setup_reference(self) -> None:
        """The frozen reference: a copy of ``model_``, or LoRA's base with no second copy."""
        lora = getattr(self, "lora", None)
        if lora is not None:
            self.model_ = with_lora(self.model_, lora)
            self.ref_model_ = None
        else:
            self.ref_model_ = frozen_copy(self.model_)

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

    # ----- tokenisation -------------------------------------------------------------
    def _prompt_prefix(self) -> list[int]:
        """Ids put once at the start of every prompt: what the tokenizer adds in front.

        A prompt is encoded as the model was trained: a tokenizer that adds BOS by
        default (Llama, Mistral, Gemma) gets it once at the start of the prompt, never
        inside a completion; one that adds nothing (GPT-2) gets nothing. Computed once
        per tokenizer. A chat-template path, whose template writes BOS itself, would
        skip it.
        """
        tok = self.tokenizer_
        cached = self.__dict__.get("_prefix_cache")
        if cached is None or cached[0] is not tok:
            cached = self._prefix_cache = (tok, _default_prefix(tok))
        return cached[1]

    def _with_prefix(self, ids) -> list[int]:
        """``ids`` behind the prompt prefix, unless they already begin with it."""
        prefix = self._prompt_prefix()
        ids = list(ids)
        return ids if ids[: len(prefix)] == prefix else prefix + ids

    def _prompt_tokens(self, prompts) -> list[list[int]]:
        """Ids of prompts as the reward model reads them: text gets the prefix, ids stay."""
        prompts = list(prompts)
        rows = self._completion_tokens(prompts, add_eos=False, column="prompt")
        return [self._with_prefix(r) if isinstance(p, str) else r for p, r in zip(prompts, rows)]

    def _encode(self, token_rows) -> EncodedPrompts:
        """Left-pad prompt token lists and move them to the device."""
        enc = pad_left(list(token_rows), self.tokenizer_.pad_token_id)
        return EncodedPrompts(enc.input_ids.to(self.device_), enc.attention_mask.to(self.device_))

    def _token_ids(
        self, texts, column: str, rows=None, add_special_tokens: bool = False
    ) -> list[list[int]]:
        """Token ids of each text, in one batched call; a text the tokenizer refuses is named.

        A word-level tokenizer without an unknown token raises a bare ``Exception``
        on a word outside its vocabulary (an emoji, a control character). ``rows``
        are the texts' row numbers in the caller's input, when not 0, 1, 2...
        """
        texts = list(texts)
        if not texts:
            return []
        try:
            return self.tokenizer_(texts, add_special_tokens=add_special_tokens)["input_ids"]
        except Exception as batch_error:  # noqa: BLE001 - the tokenizers library raises Exception
            for i, text in enumerate(texts):
                try:
                    self.tokenizer_(text, add_special_tokens=add_special_tokens)
                except Exception as error:  # noqa: BLE001
                    row = i if rows is None else rows[i]
                    raise ValueError(
                        f"The {column} at row {row} ({text!r}) cannot be tokenized ({error}): "
                        "a word-level tokenizer with no unknown token cannot encode a word "
                        "outside its vocabulary (an emoji, a control character); remove or "
                        "replace such words."
                    ) from None
            raise batch_error

    def _tokenize_prompts(self, prompts, check_length: bool = True) -> list[list[int]]:
        context = context_length(self.model_)
        if check_length:
            self._check_max_new_tokens(self.model_)
        limit = None if context is None or not check_length else context - self.max_new_tokens_
        rows = []
        # One call for the whole list: the fast tokenizer batches it.
        encoded = self._token_ids(prompts, "prompt")
        for i, (p, ids) in enumerate(zip(prompts, encoded)):
            if not ids:
                raise ValueError(f"Prompt at row {i} ({p!r}) has no tokens.")
            ids = self._with_prefix(ids)
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

        The beginning is kept, as Huang et al. 2024 do (the post is cut at the
        last newline that fits the 512-token budget).
        """
        encode = lambda text: self.tokenizer_(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        for pattern in (r"\n\s*\n", r"\n", r"(?<=[.!?])\s+"):
            cuts = [m.start() for m in re.finditer(pattern, prompt)]
            for cut in reversed(cuts):
                ids = encode(prompt[:cut].rstrip())
                ids = self._with_prefix(ids) if ids else ids
                if ids and len(ids) <= limit:
                    return ids
        raise ValueError(
            f"Prompt at row {row} has no paragraph or sentence boundary within the "
            f"first {limit} tokens, so it cannot be truncated; shorten it."
        )

    def _pad_responses(self, token_rows):
        """Right-pad response token lists; ``(ids, mask)`` on the device."""
        ids, mask = pad_right(list(token_rows), self.tokenizer_.pad_token_id)
        return ids.to(self.device_), mask.to(self.device_)

    def _decode(self, response_ids, response_mask) -> list[str]:
        ids = [r[m.bool()].tolist() for r, m in zip(response_ids.cpu(), response_mask.cpu())]
        return self.tokenizer_.batch_decode(ids, skip_special_tokens=True)

    def _completion_tokens(
        self, completions, add_eos: bool = True, column: str = "completion"
    ) -> list[list[int]]:
        tok = self.tokenizer_
        completions = list(completions)
        rows = [i for i, c in enumerate(completions) if isinstance(c, str)]
        encoded = iter(self._token_ids([completions[i] for i in rows], column, rows))
        eos = [tok.eos_token_id] if add_eos and tok.eos_token_id is not None else []
        return [
            list(next(encoded)) + eos if isinstance(c, str) else [int(i) for i in c]
            for c in completions
        ]

    # ----- sampling -----------------------------------------------------------------
    def _generate(self, encoded: EncodedPrompts, generator, *, model=None, return_logprobs=False):
        """Sample ``max_new_tokens_`` tokens per row, truncated after the first EOS.

        Returns ``(response_ids, response_mask, ended)``, and the sampling pass's
        per-token log-probs when ``return_logprobs``.
        """
        tok = self.tokenizer_
        out = sample(
            self.model_ if model is None else model,
            encoded,
            max_new_tokens=self.max_new_tokens_,
            temperature=self.temperature_,
            generator=generator,
            suppress_ids=self._suppress_ids,
            eos_token_id=tok.eos_token_id,
            return_logprobs=return_logprobs,
        )
        raw, logprobs = out if return_logprobs else (out, None)
        ids, mask, ended = truncate_after_eos(raw, tok.eos_token_id, tok.pad_token_id)
        return (ids, mask, ended, logprobs) if return_logprobs else (ids, mask, ended)

    def _sample_token_rows(self, token_rows, generator, *, model=None):
        """Responses (token lists, up to and including EOS) for prompt token lists."""
        out = []
        size = get_config()["eval_batch_size"]
        for start in range(0, len(token_rows), size):
            ids, mask, _ = self._generate(
                self._encode(token_rows[start : start + size]), generator, model=model
            )
            out.extend(r[m.bool()].tolist() for r, m in zip(ids.cpu(), mask.cpu()))
        return out

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "model_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = False
        tags.input_tags.two_d_array = False
        tags.input_tags.string = True
        tags.non_deterministic = False
        return tags
