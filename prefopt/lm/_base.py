"""What every estimator that holds a causal language model shares.

Loading the model and tokenizer (a pad token distinct from EOS, dropout off),
tokenisation (``_encoding.py``: BOS, chat templates, stop tokens), the sampling
settings, sampling completions, the frozen reference or LoRA adapter, and
persistence. The policies, SFT, the language-model reward model and DPO build
on :class:`LanguageModelEstimator`; those that generate text also on
:class:`GenerativeEstimator`.
"""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager

from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from .._config import get_config
from ..backend import (
    EncodedPrompts,
    disable_dropout,
    distributed,
    ensure_pad_token,
    frozen_copy,
    load_causal_lm,
    model_vocab_size,
    resolve_device,
    sample,
    truncate_after_eos,
)
from ..backend.models import clone_keeping_models
from ..backend.progress import quiet_transformers
from ..backend.serialization import dump_state, restore_state
from ..backend.vllm_engine import sampling_engine
from ..data import PreferenceData
from . import _persist
from ._checkpoint import check_folder
from ._encoding import TokenEncoding, context_length
from ._export import export_tokenizer, exported_model

__all__ = ["LanguageModelEstimator", "context_length", "with_lora"]

# Sampling defaults of Ziegler et al. (2019) and Huang et al. (2024): temperature 0.7,
# a fixed 53 new tokens truncated after the first EOS.
DEFAULT_TEMPERATURE = 0.7
DEFAULT_MAX_NEW_TOKENS = 53


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


class LanguageModelEstimator(TokenEncoding, BaseEstimator):
    """Base of every estimator whose fitted state holds a causal language model.

    It resolves ``model``/``tokenizer`` parameters into a fitted ``model_`` and
    ``tokenizer_`` on the configured device, tokenises text in batches against
    the model's context length, samples completions, keeps the frozen reference
    (a copy, or the LoRA base with the adapter disabled), and persists without
    pickling tensors. Subclasses hold the training.

    Subclasses read these parameters when they have them: ``temperature``,
    ``max_new_tokens``, ``stop_token_ids``, ``truncate_prompts`` and ``lora``.
    """

    # The field of a Pipeline's PreferenceData that ``transform`` fills with this estimator.
    _pipeline_field = "policy"

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
        and ``AutoTokenizer.from_pretrained`` read the folder back, and
        ``pipeline("text-generation", model=directory)`` on a padded batch with
        ``do_sample=False`` gives :meth:`predict`'s completions (its default samples
        as :meth:`sample` does). The tokenizer encodes a text prompt as prefopt does
        (the same BOS) and pads on the left; its pad token has an embedding row (a
        pad token prefopt added past the model's rows gets one, the mean of the
        others) and the generation config never samples it; the generation config
        holds the stop ids, ``max_new_tokens_`` and ``temperature_``. A policy
        sharded with ``set_config(distributed="fsdp")`` gathers its full weights:
        call this on every rank; rank 0 writes (there, a pad token past the
        embedding rows gets no row of its own).

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
        state = None
        if distributed.is_sharded(self.model_):
            # FSDP (a collective, on every rank): gather the full weights; rank 0 writes them.
            state = distributed.full_state_dict(self.model_)
            if not distributed.is_main():
                return
        directory = check_folder(directory, "save_pretrained's folder")
        with exported_model(self, model, resize=state is None) as model, quiet_transformers():
            model.save_pretrained(directory, safe_serialization=True, state_dict=state)
        export_tokenizer(self).save_pretrained(directory)
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
        check_is_fitted(self)
        return _persist.save(self, folder)

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

    def _check_max_new_tokens(self, module, n=None, given_only: bool = False) -> None:
        """Refuse a ``max_new_tokens_`` (or a call's ``n``) that leaves no room for a prompt.

        ``given_only``: check only a value the user gave (a fit that never samples).
        """
        context = context_length(module)
        given = n or getattr(self, "max_new_tokens", None)
        if given_only and not given:
            return
        n = self.max_new_tokens_ if n is None else n
        if context is not None and n >= context:
            name = f"max_new_tokens={n}" if given else f"max_new_tokens=None (resolved to {n})"
            raise ValueError(
                f"{name} does not fit the model's context of {context} tokens with a prompt "
                f"of at least one token; set max_new_tokens to at most {context - 1}."
            )

    def _resolve_sampling(self, module) -> None:
        """``temperature_``, ``max_new_tokens_``, the stop ids and the ids never sampled."""
        generation_config = getattr(module, "generation_config", None)
        self.temperature_ = float(
            getattr(self, "temperature", None)
            or getattr(generation_config, "temperature", None)
            or DEFAULT_TEMPERATURE
        )
        given = getattr(self, "max_new_tokens", None)
        configured = getattr(generation_config, "max_new_tokens", None)
        self.max_new_tokens_ = int(given or configured or DEFAULT_MAX_NEW_TOKENS)
        # Where the length came from, said at the start of a policy's fit.
        self._max_new_tokens_from = (
            "max_new_tokens" if given else "generation_config" if configured else "default"
        )
        vocab = model_vocab_size(module)
        pad = self.tokenizer_.pad_token_id
        # Never sample the pad token (the original code slices logits to n_vocab).
        self._suppress_ids = (pad,) if vocab is not None and pad < vocab else ()
        self._resolve_stop_ids(module)

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

    # ----- sampling -----------------------------------------------------------------
    def _generate(
        self,
        encoded: EncodedPrompts,
        generator,
        *,
        model=None,
        return_logprobs=False,
        prompt_index=None,
        temperature=None,
        max_new_tokens=None,
    ):
        """Sample ``max_new_tokens_`` tokens per row, truncated after the first stop token.

        Returns ``(response_ids, response_mask, ended)``, and the sampling pass's
        per-token log-probs when ``return_logprobs``. Rows with equal ``prompt_index``
        hold the same prompt, whose pass then runs once. ``temperature`` and
        ``max_new_tokens`` replace the fitted ones for this call (temperature 0: greedy).
        """
        stops = self._stop_ids() or None  # none: fixed-length responses, all ended
        out = sample(
            self.model_ if model is None else model,
            encoded,
            max_new_tokens=self.max_new_tokens_ if max_new_tokens is None else max_new_tokens,
            temperature=self.temperature_ if temperature is None else temperature,
            generator=generator,
            suppress_ids=self._suppress_ids,
            eos_token_id=stops,
            return_logprobs=return_logprobs,
            prompt_index=prompt_index,
        )
        raw, logprobs = out if return_logprobs else (out, None)
        ids, mask, ended = truncate_after_eos(raw, stops, self.tokenizer_.pad_token_id)
        return (ids, mask, ended, logprobs) if return_logprobs else (ids, mask, ended)

    def _sample_token_rows(self, token_rows, generator, *, model=None):
        """Responses (token lists, up to and including the stop token) for prompt token lists."""
        out = []
        size = get_config()["eval_batch_size"]
        with sampling_engine():  # under generation="vllm", one engine for every chunk
            for start in range(0, len(token_rows), size):
                ids, mask, _ = self._generate(
                    self._encode(token_rows[start : start + size]), generator, model=model
                )
                out.extend(r[m.bool()].tolist() for r, m in zip(ids.cpu(), mask.cpu()))
        return out

    def transform(self, X):
        """Pass data along a ``Pipeline``: a PreferenceData gets this fitted estimator.

        A policy is handed on as the data's ``policy``, a reward model as its
        ``reward_model`` (the class's ``_pipeline_field``).

        Parameters
        ----------
        X : PreferenceData or any data
            What the next step fits on; anything else passes unchanged.

        Returns
        -------
        X_out : PreferenceData or the input
        """
        check_is_fitted(self)
        if not isinstance(X, PreferenceData):
            return X
        return X.with_(**{self._pipeline_field: self})

    def _record_supervised(self, result) -> None:
        """Write one step of the supervised loop (a ``SupervisedResult``) into the fit."""
        self.n_iter_ += 1
        self.history_.append(result.row)

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "model_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = False
        tags.input_tags.two_d_array = False
        tags.input_tags.string = True
        tags.non_deterministic = False
        return tags
