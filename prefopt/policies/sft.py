"""Supervised fine-tuning: next-token loss on the demonstrations' responses only.

The first stage of the InstructGPT recipe. The response ends with EOS, and the
pad token differs from EOS, so EOS is a trained target and the model learns to
stop (seed text; implementation detail 1).
"""

from __future__ import annotations

import math
import time
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted
from tqdm.auto import tqdm

from .._config import get_config
from ..backend import (
    EncodedPrompts,
    adamw,
    default_learning_rate,
    gradient_step,
    make_generator,
    pad_left,
    pad_right,
    response_logprobs,
)
from ..data import PreferenceData, check_demonstrations
from ._batch import masked_mean
from ._lm import GenerativeEstimator, context_length

__all__ = ["SFTPolicy"]


class SFTPolicy(GenerativeEstimator):
    """Supervised fine-tuning of a causal LM on (prompt, completion) demonstrations.

    The loss is the mean next-token cross-entropy over the completion tokens
    and the EOS appended to each; prompt tokens are context only. Inputs use the
    same layout as the RL loop (left-padded prompt, then the response), so the
    fitted model samples exactly what it was trained on.

    Parameters
    ----------
    model : str, transformers config, torch module or fitted SFTPolicy, default=None
        The starting model (copied; ``fit`` never mutates it). A config builds a
        fresh model seeded by ``random_state``; its tokenizer is loaded from
        ``config.name_or_path`` when that is a local folder.
    tokenizer : str or tokenizer, default=None
        ``None`` takes it from the model. A pad token distinct from EOS is added
        when missing.
    learning_rate : float, default=None
        ``None`` means 1e-3 for models under 10M parameters (tiny models built
        from a config) and 2e-5 otherwise (the RLOO paper's SFT value).
    n_epochs : int, default=1
        Passes over the demonstrations.
    batch_size : int, default=16
    lr_schedule : {"cosine", "linear", "constant"}, default="cosine"
        Decay to 0 over the run (cosine as in Huang et al.).
    temperature : float, default=None
        Sampling temperature of :meth:`sample`; ``None`` reads the model's
        generation config, else 0.7.
    max_new_tokens : int, default=None
        Tokens sampled per response. ``None`` uses the longest demonstrated
        completion plus its EOS; it is written to the fitted model's generation
        config, so policies started from this model sample the same length.
    random_state : int, RandomState instance or None, default=None
    verbose : int, default=0
    warm_start : bool, default=False
        Continue training the fitted model.

    Attributes
    ----------
    model_ : torch.nn.Module
    tokenizer_ : tokenizer
    learning_rate_ : float
    temperature_, max_new_tokens_ : float, int
    n_iter_ : int
        Gradient steps done.
    history_ : list of dict
        ``loss/sft`` and ``time/tokens_per_s`` per step.

    See Also
    --------
    RewardModel, PPOPolicy, RLOOPolicy

    References
    ----------
    L. Ouyang et al., "Training language models to follow instructions with
    human feedback", NeurIPS 2022.

    Examples
    --------
    >>> import prefopt
    >>> from prefopt import SFTPolicy
    >>> from transformers import GPT2Config
    >>> from prefopt.worlds import TinyLMWorld
    >>> prefopt.set_config(show_progress_bar=False)
    >>> world = TinyLMWorld(random_state=0)
    >>> sft = SFTPolicy(model=world.policy_model(), learning_rate=1e-2, n_epochs=2,
    ...                 random_state=0).fit([(world.prompts[0], "a")] * 32)
    >>> sft.history_[-1]["loss/sft"] < sft.history_[0]["loss/sft"]
    True
    """

    _parameter_constraints = {
        "model": "no_validation",
        "tokenizer": "no_validation",
        "learning_rate": [Interval(Real, 0, None, closed="neither"), None],
        "n_epochs": [Interval(Integral, 1, None, closed="left")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "lr_schedule": [StrOptions({"cosine", "linear", "constant"})],
        "temperature": [Interval(Real, 0, None, closed="neither"), None],
        "max_new_tokens": [Interval(Integral, 1, None, closed="left"), None],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
    }

    def __init__(
        self,
        *,
        model=None,
        tokenizer=None,
        learning_rate=None,
        n_epochs=1,
        batch_size=16,
        lr_schedule="cosine",
        temperature=None,
        max_new_tokens=None,
        random_state=None,
        verbose=0,
        warm_start=False,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.learning_rate = learning_rate
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.lr_schedule = lr_schedule
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start

    def fit(self, X, y=None):
        """Fit on demonstrations.

        Parameters
        ----------
        X : rows of (prompt, completion), DataFrame or datasets.Dataset
            With TRL's column names ``prompt`` and ``completion``.
        y : None
            Ignored.

        Returns
        -------
        self : SFTPolicy
        """
        self._validate_params()
        if isinstance(X, PreferenceData):  # a step of a Pipeline
            X = X.require("demonstrations", "SFTPolicy")
        prompts, completions = check_demonstrations(X)
        rng = check_random_state(self.random_state)
        seeds = rng.randint(np.iinfo(np.int32).max, size=2)
        if not (self.warm_start and hasattr(self, "model_")):
            self._init_model(self.model, self.tokenizer, seed=int(seeds[0]))
            self.history_ = []
            self.n_iter_ = 0
        self.learning_rate_ = (
            float(self.learning_rate)
            if self.learning_rate is not None
            else default_learning_rate(self.model_, large=2e-5)
        )
        ptoks = self._tokenize_prompts(prompts, check_length=False)
        ctoks = self._completion_tokens(completions, add_eos=True)
        context = context_length(self.model_)
        for i, (p, c) in enumerate(zip(ptoks, ctoks)):
            if context is not None and len(p) + len(c) > context:
                raise ValueError(
                    f"Demonstration at row {i} has {len(p) + len(c)} tokens, more "
                    f"than the model's context of {context}; shorten it."
                )
        if self.max_new_tokens is None:
            self.max_new_tokens_ = max(len(c) for c in ctoks)
        generation_config = getattr(self.model_, "generation_config", None)
        if generation_config is not None:
            generation_config.max_new_tokens = self.max_new_tokens_
        self._train(ptoks, ctoks, make_generator(int(seeds[1])))
        return self

    def _train(self, ptoks, ctoks, generator) -> None:
        model = self.model_
        optimizer = adamw(model.parameters(), self.learning_rate_)
        n = len(ptoks)
        per_epoch = math.ceil(n / self.batch_size)
        total = per_epoch * self.n_epochs
        show = get_config()["show_progress_bar"]
        bar = tqdm(total=total, desc="SFTPolicy", disable=not show, leave=False)
        step = 0
        for _ in range(self.n_epochs):
            order = torch.randperm(n, generator=generator).tolist()
            for start in range(0, n, self.batch_size):
                rows = order[start : start + self.batch_size]
                frac = step / total
                scale = {
                    "cosine": 0.5 * (1 + math.cos(math.pi * frac)),
                    "linear": 1 - frac,
                    "constant": 1.0,
                }[self.lr_schedule]
                for group in optimizer.param_groups:
                    group["lr"] = self.learning_rate_ * scale
                began = time.perf_counter()
                loss, n_tokens = self._batch_loss(
                    model, [ptoks[i] for i in rows], [ctoks[i] for i in rows]
                )
                gradient_step(optimizer, loss, who="SFTPolicy", step=self.n_iter_ + 1)
                step += 1
                self.n_iter_ += 1
                self.history_.append(
                    {
                        "step": self.n_iter_,
                        "loss/sft": loss.item(),
                        "charts/learning_rate": optimizer.param_groups[0]["lr"],
                        "time/tokens_per_s": n_tokens / (time.perf_counter() - began),
                    }
                )
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
        bar.close()

    def _batch_loss(self, model, ptoks, ctoks):
        pad = self.tokenizer_.pad_token_id
        enc = pad_left(ptoks, pad)
        ids, mask = pad_right(ctoks, pad)
        enc = EncodedPrompts(enc.input_ids.to(self.device_), enc.attention_mask.to(self.device_))
        # Temperature 1: the training targets are the data's tokens themselves.
        logprobs = response_logprobs(
            model,
            enc,
            ids.to(self.device_),
            mask.to(self.device_),
            temperature=1.0,
            suppress_ids=self._suppress_ids,
        )
        mask = mask.to(self.device_)
        return -masked_mean(logprobs, mask), int(mask.sum())

    def transform(self, X):
        """Pass data along a ``Pipeline``: a PreferenceData gets this fitted policy."""
        check_is_fitted(self)
        return X.with_(policy=self) if isinstance(X, PreferenceData) else X

    @torch.no_grad()
    def score(self, X, y=None) -> float:
        """Mean log-likelihood per token of the demonstrations' completions (larger is better).

        Parameters
        ----------
        X : demonstrations
        y : None
            Ignored.

        Returns
        -------
        score : float
        """
        check_is_fitted(self)
        prompts, completions = check_demonstrations(X)
        ptoks = self._tokenize_prompts(prompts, check_length=False)
        ctoks = self._completion_tokens(completions, add_eos=True)
        total, count = 0.0, 0
        size = get_config()["eval_batch_size"]
        for start in range(0, len(ptoks), size):
            loss, n = self._batch_loss(
                self.model_, ptoks[start : start + size], ctoks[start : start + size]
            )
            total += -loss.item() * n
            count += n
        return total / count
