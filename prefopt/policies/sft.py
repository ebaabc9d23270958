"""Supervised fine-tuning: next-token loss on the demonstrations' responses only.

The first stage of the InstructGPT recipe (Ouyang et al. 2022). The response
ends with EOS, and the pad token differs from EOS, so EOS is a trained target
and the model learns to stop (Huang et al. 2024).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from .._config import get_config
from ..backend import default_learning_rate, make_generator, response_logprobs
from ..data import PreferenceData, check_demonstrations
from ..lm import GenerativeStep, check_lengths, too_long_error, truncate_rows
from ..lm import checkpoint as ckpt
from ..lm.supervised import (
    SUPERVISED_CONSTRAINTS,
    SupervisedLoop,
    SupervisedView,
    warn_y_ignored,
)
from ..tracking import check_callback
from ..validation import StrOptions, validate_params
from .loop import masked_mean

__all__ = ["SFTPolicy"]


class SFTPolicy(GenerativeStep):
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
    stop_token_ids : int or list of int, default=None
        The ids that end a response (in sampling, and the one appended to each
        completion). ``None`` takes the model's ``generation_config.eos_token_id``
        (one id or several) and the tokenizer's EOS. Given ids are written to the
        fitted model's generation config, so policies started from it (and
        ``generate`` after ``save_pretrained``) stop there too.
    max_length : int, default=None
        Most tokens of a demonstration's prompt and completion together (TRL's
        ``max_length``): a longer completion is cut from the right, keeping its
        start, after the prompt is cut to ``max_prompt_length``. A completion
        cut there loses its stop token, so that row does not train the end of
        the response (as in TRL). ``None`` cuts nothing, and a demonstration
        longer than the model's context is an error.
    max_prompt_length : int, default=None
        Most tokens of a prompt (TRL's ``max_prompt_length``): a longer one is
        cut from the left, keeping its end (next to the completion) and the
        tokenizer's BOS in front. ``None`` keeps whole prompts.
    random_state : int, RandomState instance or None, default=None
    verbose : int, default=0
        ``1`` prints a line (step, loss) every 10 steps and at the last, ``2``
        every step; no ``logging`` setup needed.
    warm_start : bool, default=False
        Continue training the fitted model.
    checkpoint_dir : str or path, default=None
        Save the fit every ``checkpoint_every`` steps and at the end (JSON and
        safetensors, no pickle); ``fit`` with the same folder, parameters and
        demonstrations resumes from it, as the policies do.
    checkpoint_every : int, default=100
        Gradient steps between checkpoints.
    on_unhealthy : {"warn", "raise", "stop", "ignore"}, default="warn"
        What a run-health detector that fires does (``non_finite``: a nan or
        inf in a step's row; ``loss_blowup``: the smoothed loss above twice
        the first step's; ``no_learning``: the trained weights
        moved less than 1e-6 of their norm at every step): warn once per
        detector with :class:`~prefopt.exceptions.RunHealthWarning`, raise
        :class:`~prefopt.exceptions.RunHealthError`, warn and stop the fit, or
        only record it in ``health_`` and the ``health/`` columns of ``history_``.
    lora : dict or peft.LoraConfig, default=None
        Train a LoRA adapter (peft) instead of all weights, e.g.
        ``{"r": 8, "lora_alpha": 16, "target_modules": ["c_attn"]}``; the
        adapter's initial weights are drawn from ``random_state``. After ``fit``
        the adapter is merged into the weights, so ``model_`` is a plain
        transformers model that policies, reward models and ``save_pretrained``
        take as it is (a ``warm_start`` fit trains a new adapter on it).
    gradient_checkpointing : bool, default=False
        Recompute each transformer layer's activations in the backward pass
        instead of keeping them (transformers' gradient checkpointing,
        non-reentrant): less memory for about one more forward pass a step,
        the same gradients. A model that comes with it on keeps it on; passes
        without gradients (sampling, ``score``) are unchanged.
    micro_batch_size : int, default=None
        Run each minibatch's forward and backward passes on at most this many
        demonstrations at a time and step once on the accumulated gradient
        (gradient accumulation): the loss stays the mean over the whole
        minibatch's tokens, so the step is the same as without, for less
        memory. ``None`` runs the minibatch at once. Not in a distributed fit.
    pad_token : {"distinct", "eos"}, default="distinct"
        For experiments only; keep the default. ``"eos"`` reproduces the shortcut
        of padding with the EOS token itself: a collator that marks padding by
        its id then masks every EOS as padding, so the EOS is never a training
        target and the model does not learn to stop (Huang et al. 2024). Here
        the EOS positions are dropped from the loss; sampling is unchanged.

    Attributes
    ----------
    model_ : torch.nn.Module
    tokenizer_ : tokenizer
    learning_rate_ : float
    temperature_, max_new_tokens_ : float, int
    stop_token_ids_ : list of int
        The ids that end a response.
    n_iter_ : int
        Gradient steps done.
    history_ : list of dict
        ``loss/sft``, ``data/tokens``, ``charts/learning_rate`` and ``time/step_s`` per step.
    health_ : dict
        The run's health: ``healthy`` (bool) and ``detectors``, by name,
        each with ``fired`` (bool), ``first_step`` (int or None), ``value``
        (its last reading, float) and ``threshold`` (float); see ``on_unhealthy``.

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
        **SUPERVISED_CONSTRAINTS,
        "lr_schedule": [StrOptions({"cosine", "linear", "constant"})],
        "warm_start": ["boolean"],
        "pad_token": [StrOptions({"distinct", "eos"})],
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
        stop_token_ids=None,
        max_length=None,
        max_prompt_length=None,
        random_state=None,
        verbose=0,
        warm_start=False,
        checkpoint_dir=None,
        checkpoint_every=100,
        on_unhealthy="warn",
        lora=None,
        gradient_checkpointing=False,
        micro_batch_size=None,
        pad_token="distinct",
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.learning_rate = learning_rate
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.lr_schedule = lr_schedule
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = stop_token_ids
        self.max_length = max_length
        self.max_prompt_length = max_prompt_length
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.on_unhealthy = on_unhealthy
        self.lora = lora
        self.gradient_checkpointing = gradient_checkpointing
        self.micro_batch_size = micro_batch_size
        self.pad_token = pad_token

    def fit(self, X, y=None, *, callback=None):
        """Fit on demonstrations.

        Parameters
        ----------
        X : rows of (prompt, completion), DataFrame or datasets.Dataset
            With TRL's column names ``prompt`` and ``completion``, in its
            standard (text) or conversational format (a prompt is a list of
            messages, rendered with the tokenizer's chat template; a completion
            one assistant message, which ends with the template's end of turn,
            or several, such as a tool call, the tool's answer and the reply,
            which the template renders after the prompt and all of which is
            trained).
        y : None
            Ignored.
        callback : callable, Logger or list of them, default=None
            ``callback(policy, row)`` after every gradient step, with that
            step's ``history_`` row; returning ``True`` stops the fit. A
            :mod:`prefopt.tracking` logger logs the fit and is closed with it.

        Returns
        -------
        self : SFTPolicy
        """
        validate_params(self)
        check_callback(callback)
        if isinstance(X, PreferenceData):  # a step of a Pipeline
            X = X.require("demonstrations", "SFTPolicy")
        prompts, completions = check_demonstrations(X)
        check_lengths(self)
        rng = check_random_state(self.random_state)
        seeds = rng.randint(np.iinfo(np.int32).max, size=2)
        if not (self.warm_start and self.__sklearn_is_fitted__()):
            self._init_model(self.model, self.tokenizer, seed=int(seeds[0]))
            self.history_ = []
            self.n_iter_ = 0
        self.learning_rate_ = (
            float(self.learning_rate)
            if self.learning_rate is not None
            else default_learning_rate(self.model_, large=2e-5)
        )
        ptoks, ctoks = self._demonstration_tokens(prompts, completions)
        if self.max_new_tokens is None:
            self.max_new_tokens_ = max(len(c) for c in ctoks)
            self._max_new_tokens_from = "demonstrations"  # a policy started here says so
        self._check_max_new_tokens(self.model_, given_only=True)  # fit never samples
        generation_config = getattr(self.model_, "generation_config", None)
        if generation_config is not None:
            generation_config.max_new_tokens = self.max_new_tokens_
            if self.stop_token_ids is not None:
                generation_config.eos_token_id = list(self.stop_token_ids_)
        data_key = ckpt.fingerprint([prompts, completions])
        with ckpt.resumable(self, data_key) as resume:
            model_key = None if resume is None else ckpt.module_fingerprint(self.model_)
            if self.lora is not None:
                self._setup_reference()  # the adapter on model_ (SFT keeps no reference)
            self._train(ptoks, ctoks, make_generator(int(seeds[1])), resume, model_key, callback)
        if self.lora is not None:  # a plain model again, the adapter in its weights
            # peft froze the base weights: trainable again for whoever trains this model next.
            self.model_ = self.model_.merge_and_unload().requires_grad_(True)
            self.__dict__.pop("ref_model_", None)
        return self

    def _demonstration_tokens(self, prompts, completions):
        """Prompt and completion ids, cut to ``max_length``/``max_prompt_length``, checked."""
        ptoks = self._tokenize_prompts(prompts, check_length=False)
        ctoks = self._completion_tokens(completions, add_eos=True, prompts=prompts)
        ptoks, (ctoks,) = truncate_rows(self, ptoks, [ctoks], "Demonstration")
        for i, (p, c) in enumerate(zip(ptoks, ctoks)):
            error = too_long_error(self, "Demonstration", i, len(p) + len(c))
            if error is not None:
                raise error
        return ptoks, ctoks

    def _train(self, ptoks, ctoks, generator, resume=None, model_key=None, callback=None) -> None:
        def batch_loss(model, rows):  # model: what training passes go through (DDP's wrapper)
            loss, n_tokens = self._batch_loss(
                model,
                [ptoks[i] for i in rows],
                [ctoks[i] for i in rows],
            )
            return loss, {"loss/sft": loss.item(), "data/tokens": n_tokens}

        stops = set(self._stop_ids()) if self.pad_token == "eos" else set()

        def n_targets(rows):  # the tokens the loss is a mean over (EOS dropped with "eos")
            return sum(len(ctoks[i]) - sum(t in stops for t in ctoks[i]) for i in rows)

        view = SupervisedView.of(self, name="SFTPolicy", schedule=self.lr_schedule)
        loop = SupervisedLoop(self, view, len(ptoks), batch_loss,
                              parameters=self.model_.parameters(), generator=generator,
                              resume=resume, model_key=model_key, weight=n_targets)  # fmt: skip
        loop.train(callback, record=self._record_supervised)

    def _batch_loss(self, model, ptoks, ctoks):
        ids, mask = self._pad_responses(ctoks)
        if self.pad_token == "eos":  # experiments only: EOS masked as if it were padding
            stops = torch.as_tensor(self._stop_ids(), dtype=ids.dtype, device=ids.device)
            mask = mask * ~torch.isin(ids, stops)
        # Temperature 1: the training targets are the data's tokens themselves.
        logprobs = response_logprobs(
            model, self._encode(ptoks), ids, mask, temperature=1.0, suppress_ids=self._suppress_ids
        )
        return -masked_mean(logprobs, mask, across_ranks=True), int(mask.sum())

    @torch.no_grad()
    def score(self, X, y=None) -> float:
        """Mean log-likelihood per token of the demonstrations' completions (larger is better).

        Demonstrations are cut to ``max_length`` and ``max_prompt_length`` as in ``fit``.

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
        why = "the score is the log-likelihood of the demonstrations' completions"
        warn_y_ignored(y, "SFTPolicy.score", why)
        prompts, completions = check_demonstrations(X)
        ptoks, ctoks = self._demonstration_tokens(prompts, completions)
        total, count = 0.0, 0
        size = get_config()["eval_batch_size"]
        for start in range(0, len(ptoks), size):
            loss, n = self._batch_loss(
                self.model_, ptoks[start : start + size], ctoks[start : start + size]
            )
            total += -loss.item() * n
            count += n
        return total / count
