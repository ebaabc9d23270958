"""Estimators that generate text: ``sample``, ``predict`` and ``log_prob``."""

from __future__ import annotations

import functools
import logging
import math
import warnings
from contextlib import nullcontext
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from .._config import get_config
from ..backend import local_seed, make_generator, response_logprobs
from ..backend.progress import verbose_log
from ..backend.vllm_engine import sampling_engine
from ..data import check_pairs, check_prompts
from ..validation import validate_parameter_constraints
from ._base import LanguageModelEstimator
from ._encoding import context_length
from ._run import one_fit_at_a_time
from ._truncation import truncate_rows


class GenerativeEstimator(LanguageModelEstimator):
    """Base of estimators that generate text: ``sample``, ``predict`` and ``log_prob``."""

    def _setup_reference(self) -> None:
        """The frozen reference; a LoRA adapter's initial weights drawn from ``random_state``.

        peft draws a new adapter's weights (LoRA's A matrices, Hu et al. 2021) from
        torch's global generator. Drawn instead under a seed of their own from the
        fit's ``random_state`` (for an int, the fourth number of its stream, after
        the three the fits draw for the model, the sampling and the data order),
        they are the same for the same seed in every estimator, and the caller's
        global torch state is untouched.
        """
        if getattr(self, "lora", None) is None:
            super()._setup_reference()
            return
        seeds = check_random_state(self.random_state).randint(np.iinfo(np.int32).max, size=4)
        with local_seed(int(seeds[3])):
            super()._setup_reference()

    def _tell_sampling(self, start_model=None) -> None:
        """Say at the start of a fit how many tokens a response may have, and from where.

        Logged on the ``prefopt`` logger (and printed with ``verbose``); a warning when
        the length is the starting SFT model's longest demonstration, which it wrote
        into the generation config: a run whose responses should grow longer than the
        demonstrations (verifiable rewards) would be cut there without a word.
        """
        name, n = type(self).__name__, self.max_new_tokens_
        source = getattr(self, "_max_new_tokens_from", "max_new_tokens")
        if type(start_model).__name__ == "FrozenEstimator":
            start_model = start_model.estimator
        from_demonstrations = (
            source == "generation_config"
            and getattr(start_model, "_max_new_tokens_from", None) == "demonstrations"
        )
        where = {
            "max_new_tokens": "max_new_tokens",
            "generation_config": "the starting model's generation_config.max_new_tokens",
            "default": "the default, as neither max_new_tokens nor the generation config sets it",
        }[source]
        if from_demonstrations:
            where = f"the starting {type(start_model).__name__}'s longest demonstration"
        line = (
            f"{name}: sampling up to {n} new tokens per response ({where}), "
            f"at temperature {self.temperature_:g}"
        )
        logging.getLogger("prefopt").info(line)
        if getattr(self, "verbose", 0):
            verbose_log.info(line)
        if from_demonstrations:
            warnings.warn(
                f"{name}: max_new_tokens=None takes {n} tokens from the starting "
                f"{type(start_model).__name__}, whose longest demonstration (with its stop "
                f"token) has {n}: responses are cut after {n} tokens. Pass max_new_tokens= "
                "to choose the length (longer where answers should grow past the "
                "demonstrations, as with verifiable rewards).",
                UserWarning,
                stacklevel=3,  # the caller of fit
            )

    def sample(
        self, X, n: int = 1, *, temperature=None, max_new_tokens=None, random_state=None
    ) -> list[list[str]]:
        """Sample ``n`` completions for each prompt (random; :meth:`predict` is greedy).

        Parameters
        ----------
        X : list of str or of conversations, or table with a ``prompt`` column
            Prompts; a conversation (TRL's list of messages) is rendered with
            the tokenizer's chat template and its generation prompt.
        n : int, default=1
            Completions per prompt.
        temperature : float, default=None
            Divide the logits by this; ``None`` is the sampling temperature of
            the fit (``temperature_``), ``0.0`` greedy decoding.
        max_new_tokens : int, default=None
            The most tokens per completion; ``None`` is ``max_new_tokens_``.
        random_state : int, RandomState instance or None, default=None
            ``None`` uses the estimator's ``random_state``: the same call gives
            the same completions.

        Returns
        -------
        completions : list of list of str
            ``n`` completions per prompt as text, truncated after the first stop
            token (which the text leaves out).
        """
        check_is_fitted(self)
        prompts = check_prompts(X)
        what = f"{type(self).__name__}.sample"
        if isinstance(n, bool) or not isinstance(n, Integral):
            raise TypeError(
                f"n must be an int, the number of completions per prompt; got {n!r} "
                f"({type(n).__name__})."
            )
        if n < 1:
            raise ValueError(f"n must be >= 1; got {n!r}.")
        if temperature is not None and (
            isinstance(temperature, bool)
            or not isinstance(temperature, Real)
            or not (math.isfinite(temperature) and temperature >= 0)
        ):
            raise ValueError(
                f"{what}: temperature must be a finite number >= 0 (the logits are divided by "
                f"it; 0.0 is greedy decoding, None the fit's temperature_={self.temperature_:g});"
                f" got {temperature!r}."
            )
        _check_max_new_tokens_arg(max_new_tokens, what)
        # The same check as the constructors' random_state, naming the parameter.
        validate_parameter_constraints(
            {"random_state": ["random_state"]},
            {"random_state": random_state},
            caller_name=what,
        )
        return self._completions(
            prompts,
            n,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            random_state=self.random_state if random_state is None else random_state,
        )

    def predict(self, X, *, max_new_tokens=None) -> list[str]:
        """The greedy completion of each prompt: deterministic (:meth:`sample` draws).

        The most likely token at each step, as ``model_.generate(do_sample=False)``;
        this is what a ``Pipeline`` returns. The fit's sampling temperature does not
        apply; to draw a completion, use :meth:`sample`.

        Parameters
        ----------
        X : list of str or of conversations, or table with a ``prompt`` column
            Prompts.
        max_new_tokens : int, default=None
            The most tokens per completion; ``None`` is ``max_new_tokens_``.

        Returns
        -------
        completions : list of str
        """
        check_is_fitted(self)
        prompts = check_prompts(X)
        _check_max_new_tokens_arg(max_new_tokens, f"{type(self).__name__}.predict")
        groups = self._completions(
            prompts, 1, temperature=0.0, max_new_tokens=max_new_tokens, random_state=0
        )
        return [group[0] for group in groups]

    def _completions(self, prompts, n, *, temperature, max_new_tokens, random_state):
        """``n`` completions per prompt, drawn in ``eval_batch_size`` chunks."""
        tokens = self._tokenize_prompts(prompts, max_new_tokens=max_new_tokens)
        _check_finite_weights(self.model_, type(self).__name__)
        generator = make_generator(random_state)
        rows = np.repeat(np.arange(len(prompts)), n)
        out = []
        size = get_config()["eval_batch_size"]
        with sampling_engine():  # under generation="vllm", one engine for every chunk
            for start in range(0, len(rows), size):
                chunk = rows[start : start + size]
                ids, mask, _ = self._generate(
                    self._encode([tokens[i] for i in chunk]),
                    generator,
                    temperature=temperature,
                    max_new_tokens=max_new_tokens,
                )
                out.extend(self._decode(ids, mask))
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    @torch.no_grad()
    def log_prob(
        self,
        prompts,
        completions,
        *,
        reference: bool = False,
        add_eos: bool = True,
        temperature: float | None = None,
    ) -> np.ndarray:
        """Log-probability of each completion under the policy's sampling distribution.

        Parameters
        ----------
        prompts : list of str or of conversations
            One prompt per completion.
        completions : list of str or list of list of int
            Text (or one assistant message, or several after a conversation),
            or token ids. With ``max_length`` or ``max_prompt_length`` (SFT,
            DPO), prompt and completion are cut as in ``fit``.
        reference : bool, default=False
            Score under the frozen reference model instead.
        add_eos : bool, default=True
            Append the stop token to text completions (the EOS, or the chat
            template's end of turn after a conversation), so the log-probability
            is that of the complete response.
        temperature : float, default=None
            Divide the logits by this; ``None`` is the sampling temperature
            (``temperature_``), 1.0 the model's own distribution.

        Returns
        -------
        logprobs : ndarray of shape (n,)
            Sums of per-token log-probs at that temperature.
        """
        check_is_fitted(self)
        what = f"{type(self).__name__}.log_prob"
        prompts, completions = check_pairs(prompts, completions, what, token_ids=True)
        temperature = self.temperature_ if temperature is None else temperature
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, Real)
            or not (math.isfinite(temperature) and temperature > 0)
        ):
            raise ValueError(
                f"temperature must be a finite number > 0 (the logits are divided by it; 1.0 "
                f"is the model's own distribution); got {temperature!r}."
            )
        # An estimator with max_length / max_prompt_length (SFT, DPO) cuts the rows as in fit.
        cuts = getattr(self, "max_length", None) or getattr(self, "max_prompt_length", None)
        ptoks = self._tokenize_prompts(prompts, check_length=cuts is None)
        rtoks = self._completion_tokens(completions, add_eos, prompts=prompts)
        ptoks, (rtoks,) = truncate_rows(self, ptoks, [rtoks])
        context = context_length(self.model_)
        for i, (p, r) in enumerate(zip(ptoks, rtoks)):
            if context is not None and len(p) + len(r) > context:
                raise ValueError(
                    f"The prompt and completion at row {i} have {len(p)} + {len(r)} tokens, "
                    f"more than the model's context of {context}; shorten the completion to "
                    f"at most {context - len(p)} tokens."
                )
        out = []
        size = get_config()["eval_batch_size"]
        with self._reference() if reference else nullcontext(self.model_) as model:
            for start in range(0, len(prompts), size):
                sl = slice(start, start + size)
                lp = response_logprobs(
                    model,
                    self._encode(ptoks[sl]),
                    *self._pad_responses(rtoks[sl]),
                    temperature=float(temperature),
                    suppress_ids=self._suppress_ids,
                )
                out.append(lp.sum(1).cpu().double().numpy())
        return np.concatenate(out)


class GenerativeStep(GenerativeEstimator):
    """A generative estimator that can stand before the end of a ``Pipeline`` (SFT, DPO).

    Its ``transform`` hands the fitted policy to the next step through a
    :class:`~prefopt.data.PreferenceData`. Every subclass's ``fit`` runs under
    :class:`~prefopt.lm._run.one_fit_at_a_time`: a second thread fitting the same
    object gets a clear error instead of mixing its state with the first's.

    Examples
    --------
    >>> from prefopt import DPOPolicy, SFTPolicy
    >>> issubclass(SFTPolicy, GenerativeStep) and issubclass(DPOPolicy, GenerativeStep)
    True
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        fit = cls.__dict__.get("fit")
        if fit is not None and not getattr(fit, "_one_fit_at_a_time", False):
            cls.fit = _one_fit_at_a_time(fit)


def _one_fit_at_a_time(fit):
    """``fit`` wrapped in the guard against a second thread fitting the same object."""

    @functools.wraps(fit)
    def guarded_fit(self, *args, **kwargs):
        with one_fit_at_a_time(self):
            return fit(self, *args, **kwargs)

    guarded_fit._one_fit_at_a_time = True
    return guarded_fit


def _check_max_new_tokens_arg(max_new_tokens, what: str) -> None:
    if max_new_tokens is not None and (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, Integral)
        or max_new_tokens < 1
    ):
        raise ValueError(
            f"{what}: max_new_tokens must be an int >= 1 (the most tokens per completion) or "
            f"None (the fitted max_new_tokens_); got {max_new_tokens!r}."
        )


def _check_finite_weights(model, name: str) -> None:
    """Refuse to sample from a model with NaN or infinite weights (torch fails obscurely)."""
    params = [(k, p) for k, p in model.named_parameters() if p.device.type != "meta"]
    if not params:
        return
    device = params[0][1].device  # one device sync, not one per tensor (nor per device)
    finite = [torch.isfinite(p).all().to(device) for _, p in params]
    if bool(torch.stack(finite).all()):
        return
    for (key, _), ok in zip(params, finite):
        if not bool(ok):
            raise ValueError(
                f"{name} cannot sample: its model's weights are not finite (NaN or inf, first "
                f"in {key!r}), so every next-token distribution is NaN. The weights were "
                "changed outside fit, or a fit diverged; fit again, with a lower learning_rate."
            )
