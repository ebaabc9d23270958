"""Estimators that generate text: ``sample``, ``predict`` and ``log_prob``."""

from __future__ import annotations

from contextlib import nullcontext
from numbers import Integral

import numpy as np
import torch
from sklearn.utils._param_validation import validate_parameter_constraints
from sklearn.utils.validation import check_is_fitted

from .._config import get_config
from ..backend import make_generator, response_logprobs
from ..data import PreferenceData, check_prompts, check_texts
from ._base import LanguageModelEstimator


class GenerativeEstimator(LanguageModelEstimator):
    """Base of estimators that generate text: ``sample``, ``predict`` and ``log_prob``."""

    def sample(self, X, n: int = 1, *, random_state=None) -> list[list[str]]:
        """Sample ``n`` completions for each prompt.

        Parameters
        ----------
        X : list of str or of conversations, or table with a ``prompt`` column
            Prompts; a conversation (TRL's list of messages) is rendered with
            the tokenizer's chat template and its generation prompt.
        n : int, default=1
            Completions per prompt.
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
        if isinstance(n, bool) or not isinstance(n, Integral):
            raise TypeError(
                f"n must be an int, the number of completions per prompt; got {n!r} "
                f"({type(n).__name__})."
            )
        if n < 1:
            raise ValueError(f"n must be >= 1; got {n!r}.")
        # The same check as the constructors' random_state, naming the parameter.
        validate_parameter_constraints(
            {"random_state": ["random_state"]},
            {"random_state": random_state},
            caller_name=f"{type(self).__name__}.sample",
        )
        tokens = self._tokenize_prompts(prompts)
        generator = make_generator(self.random_state if random_state is None else random_state)
        rows = np.repeat(np.arange(len(prompts)), n)
        out = []
        size = get_config()["eval_batch_size"]
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            ids, mask, _ = self._generate(self._encode([tokens[i] for i in chunk]), generator)
            out.extend(self._decode(ids, mask))
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    def predict(self, X) -> list[str]:
        """One sampled completion per prompt (what a ``Pipeline`` calls).

        Parameters
        ----------
        X : list of str or of conversations, or table with a ``prompt`` column
            Prompts.

        Returns
        -------
        completions : list of str
        """
        return [c[0] for c in self.sample(X, n=1)]

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
            Text (or one assistant message), or token ids.
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
        prompts = check_texts(prompts, "prompt", what, messages="keep")
        completions = check_texts(
            completions, "completion", what, token_ids=True, messages="content"
        )
        if len(prompts) != len(completions):
            raise ValueError(
                f"Got {len(prompts)} prompts and {len(completions)} completions; "
                "pass one prompt per completion."
            )
        ptoks = self._tokenize_prompts(prompts)
        rtoks = self._completion_tokens(completions, add_eos, prompts=prompts)
        out = []
        size = get_config()["eval_batch_size"]
        with self._reference() if reference else nullcontext(self.model_) as model:
            for start in range(0, len(prompts), size):
                sl = slice(start, start + size)
                lp = response_logprobs(
                    model,
                    self._encode(ptoks[sl]),
                    *self._pad_responses(rtoks[sl]),
                    temperature=self.temperature_ if temperature is None else temperature,
                    suppress_ids=self._suppress_ids,
                )
                out.append(lp.sum(1).cpu().double().numpy())
        return np.concatenate(out)


class GenerativeStep(GenerativeEstimator):
    """A generative estimator that can stand before the end of a ``Pipeline`` (SFT, DPO).

    Its ``transform`` hands the fitted policy to the next step through a
    :class:`~prefopt.data.PreferenceData`.

    Examples
    --------
    >>> from prefopt import DPOPolicy, SFTPolicy
    >>> issubclass(SFTPolicy, GenerativeStep) and issubclass(DPOPolicy, GenerativeStep)
    True
    """

    def transform(self, X):
        """Pass data along a ``Pipeline``: a PreferenceData gets this fitted policy.

        Parameters
        ----------
        X : PreferenceData or any data
            What the next step fits on; anything else passes unchanged.

        Returns
        -------
        X_out : PreferenceData or the input
        """
        check_is_fitted(self)
        return X.with_(policy=self) if isinstance(X, PreferenceData) else X
