"""The one loop every policy-optimisation algorithm shares.

    sample k responses per prompt -> score them -> shape the reward
    (minus beta * KL to the reference) -> advantages (the algorithm's choice)
    -> update the policy -> update beta

An algorithm is a subclass that supplies ``_advantages(batch)`` and
``_loss(batch, rows, logprobs, values)``; sampling, scoring, shaping,
minibatches, epochs, the KL controller, ``history_`` and progress live here.
"""

from __future__ import annotations

import copy
import logging
import os
import time
import warnings
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import clone
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted
from tqdm.auto import tqdm

from .._config import get_config
from ..backend import (
    EncodedPrompts,
    adamw,
    default_learning_rate,
    disable_dropout,
    frozen_copy,
    gradient_step,
    make_generator,
    maybe_compile,
    pad_left,
    response_logprobs,
    sample,
    sequence_values,
    truncate_after_eos,
)
from ..backend.serialization import dump_state, restore_state
from ..data import PreferenceData, check_prompts
from ..kl import FixedKLController, _KLController, kl_estimate
from ..rewards import check_rewards
from ._batch import RolloutBatch, masked_mean, masked_whiten  # noqa: F401 (re-exported)
from ._checkpoint import _fingerprint, load_checkpoint, save_checkpoint
from ._lm import GenerativeEstimator

logger = logging.getLogger("prefopt")


_COMMON_CONSTRAINTS = {
    "model": "no_validation",
    "tokenizer": "no_validation",
    "beta": [Interval(Real, 0, None, closed="left")],
    "kl": [_KLController, None],
    "kl_estimator": [StrOptions({"k1", "k2", "k3"})],
    "learning_rate": [Interval(Real, 0, None, closed="neither"), None],
    "optimizer": [StrOptions({"adam", "sgd"})],
    "lr_schedule": [StrOptions({"constant", "linear"})],
    "max_grad_norm": [Interval(Real, 0, None, closed="neither"), None],
    "n_steps": [Interval(Integral, 1, None, closed="left")],
    "batch_size": [Interval(Integral, 1, None, closed="left")],
    "n_epochs": [Interval(Integral, 1, None, closed="left")],
    "n_minibatches": [Interval(Integral, 1, None, closed="left")],
    "temperature": [Interval(Real, 0, None, closed="neither"), None],
    "max_new_tokens": [Interval(Integral, 1, None, closed="left"), None],
    "missing_eos_reward": [Real, None],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
    "warm_start": ["boolean"],
    "checkpoint_dir": [str, os.PathLike, None],
    "checkpoint_every": [Interval(Integral, 1, None, closed="left")],
    "truncate_prompts": ["boolean"],
    "max_kl": [Interval(Real, 0, None, closed="neither"), None],
    "max_kl_action": [StrOptions({"warn", "raise"})],
    "min_eos_share": [Interval(Real, 0, 1, closed="both"), None],
    "lora": "no_validation",
}


def _low_precision(device) -> bool:
    return device.type == "cuda" and get_config()["dtype"] in ("auto", "bfloat16")


def store_params(estimator, params: dict) -> None:
    """Store ``__init__``'s arguments verbatim, as scikit-learn requires (no validation)."""
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)


def _with_lora(model, lora):
    """Wrap a transformers model with a LoRA adapter (peft); only the adapter trains."""
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


class BasePolicy(GenerativeEstimator):
    """Base class of policy estimators; see the module docstring for the loop."""

    _parameter_constraints: dict = dict(_COMMON_CONSTRAINTS)
    # Whether the loss uses the ratio pi/pi_old, which needs old log-probs from exactly
    # the training forward pass; otherwise the sampling pass's log-probs are used.
    _uses_ratio = False

    # ----- hooks for algorithms ---------------------------------------------------
    def _advantages(self, batch: RolloutBatch) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _loss(
        self,
        batch: RolloutBatch,
        rows: torch.Tensor,
        logprobs: torch.Tensor,
        values: torch.Tensor | None,
    ):  # pragma: no cover - abstract
        raise NotImplementedError

    def _make_value_model(self, model, reward):
        return None

    def _after_update(self, batch: RolloutBatch) -> None:
        """Called once per step after the optimisation epochs."""

    @property
    def _k(self) -> int:
        return getattr(self, "k", 1)

    # ----- fit ----------------------------------------------------------------------
    def fit(self, X, y=None, *, reward_model=None, callback=None):
        """Optimise the policy against a reward on the prompts ``X``.

        Parameters
        ----------
        X : list of str, pandas Series or DataFrame, datasets.Dataset, or PreferenceData
            Prompts (a ``prompt`` column for tables). In a ``Pipeline``, a
            :class:`~prefopt.data.PreferenceData` whose fitted SFT policy starts
            the run when ``model=None`` and whose reward model is the reward.
        y : callable, default=None
            The reward: a fitted :class:`~prefopt.RewardModel` or any callable
            ``reward(prompts, completions) -> array (n,)``.
        reward_model : callable, default=None
            The same, as a fit parameter (what ``GridSearchCV`` passes).
        callback : callable, default=None
            ``callback(policy, row)`` after every step, with that step's
            ``history_`` row; returning ``True`` stops the run early. Use it to
            track exact metrics along a run or to stop on a condition.

        Returns
        -------
        self : object
            The fitted policy.
        """
        self._validate_params()
        self._check_algorithm_params()
        start_model = self.model
        if isinstance(X, PreferenceData):  # the last step of a Pipeline
            reward_model = reward_model if reward_model is not None else X.reward_model
            start_model = self.model if self.model is not None else X.policy
            X = X.require("prompts", type(self).__name__)
        prompts = check_prompts(X)
        reward = reward_model if reward_model is not None else y
        if reward is None:
            raise ValueError(
                f"{type(self).__name__}.fit needs a reward: fit(prompts, "
                "reward_model) or fit(prompts, reward_model=...)."
            )
        if not callable(reward):
            raise TypeError(
                "The reward must be callable as reward(prompts, completions); "
                f"got {type(reward).__name__}."
            )
        if self.batch_size % self._k:
            raise ValueError(
                f"batch_size={self.batch_size} must be a multiple of k={self._k} "
                "(k samples are drawn for each prompt)."
            )
        prompts_key = _fingerprint(prompts)
        if not load_checkpoint(self, prompts_key):
            if not (self.warm_start and hasattr(self, "model_")):
                self._setup(reward, start_model)
            self._run_start = self.n_iter_
            self._stream = np.zeros(0, dtype=int)
            self._prompts_key = prompts_key
        self.reward_model_ = reward
        self._scores_tokens = (
            hasattr(reward, "score_tokens")
            and getattr(reward, "tokenizer_", None) is not None
            and reward.tokenizer_.get_vocab() == self.tokenizer_.get_vocab()
        )
        self._eos_warned = False
        self._prompts = prompts
        self._prompt_tokens = self._tokenize_prompts(prompts)
        for name in ("model_", "ref_model_", "value_model_"):  # also after a resume
            maybe_compile(getattr(self, name, None))  # set_config(compile=...); off by default
        self._run(self._run_start + self.n_steps - self.n_iter_, callback)
        return self

    def _check_algorithm_params(self) -> None:
        """Cross-parameter checks of an algorithm; raise ValueError."""

    def _setup(self, reward, start_model) -> None:
        rng = check_random_state(self.random_state)
        seeds = rng.randint(np.iinfo(np.int32).max, size=3)
        self._init_model(start_model, self.tokenizer, seed=int(seeds[0]))
        model = self.model_
        value_model = self._make_value_model(model, reward)
        if self.lora is not None:
            # The reference is the frozen base with the adapter disabled: no second copy.
            self.model_ = model = _with_lora(model, self.lora)
            self.ref_model_ = None
        else:
            self.ref_model_ = frozen_copy(model)
        self.value_model_ = (
            None if value_model is None else disable_dropout(value_model).to(self.device_).eval()
        )
        self.kl_ = clone(self.kl) if self.kl is not None else FixedKLController()
        self.beta_ = self.kl_.start(self.beta).beta_
        self.learning_rate_ = (
            float(self.learning_rate)
            if self.learning_rate is not None
            else default_learning_rate(model, large=3e-6)
        )
        self.optimizer_ = self._make_optimizer()
        self._generator = make_generator(int(seeds[1]))
        self._rng = np.random.RandomState(int(seeds[2]))
        self.history_ = []
        self.n_iter_ = 0
        self.n_episodes_ = 0

    def _make_optimizer(self) -> torch.optim.Optimizer:
        params = self._trainable_parameters()
        if self.optimizer == "adam":
            # eps=1e-5 as in the original code (implementation details 1A, 12).
            return adamw(params, self.learning_rate_)  # eps=1e-5 (details 1A, 12)
        return torch.optim.SGD(params, lr=self.learning_rate_)

    def __getstate__(self):
        return dump_state(self)

    def __setstate__(self, state):
        restore_state(self, state, make_optimizer=type(self)._make_optimizer)

    def _trainable_parameters(self) -> list:
        """Parameters of the policy and the value model, each once (a trunk may be shared)."""
        seen, params = set(), []
        for module in (self.model_, self.value_model_):
            for p in [] if module is None else module.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        return params

    def _next_prompts(self, n: int) -> np.ndarray:
        # An endless, reshuffled stream over the prompts (implementation detail 1B).
        while len(self._stream) < n:
            self._stream = np.r_[self._stream, self._rng.permutation(len(self._prompts))]
        out, self._stream = self._stream[:n], self._stream[n:]
        return out

    def _encode(self, rows: np.ndarray) -> EncodedPrompts:
        enc = pad_left([self._prompt_tokens[i] for i in rows], self.tokenizer_.pad_token_id)
        return EncodedPrompts(enc.input_ids.to(self.device_), enc.attention_mask.to(self.device_))

    # ----- one step -----------------------------------------------------------------
    def _run(self, n_steps: int, callback=None) -> None:
        total = self.n_iter_ + n_steps
        show = get_config()["show_progress_bar"]
        bar = tqdm(range(n_steps), desc=type(self).__name__, disable=not show, leave=False)
        for _ in bar:
            self._set_learning_rate()
            start = time.perf_counter()
            batch = self._rollout(self._next_prompts(self.batch_size // self._k))
            self._advantages(batch)
            stats = self._update(batch)
            self._after_update(batch)
            mean_kl = float(batch.kl.sum(1).mean())
            self.beta_ = self.kl_.update(mean_kl, n_episodes=len(batch))
            self.n_iter_ += 1
            self.n_episodes_ += len(batch)
            elapsed = time.perf_counter() - start
            row = {
                "step": self.n_iter_,
                "episodes": self.n_episodes_,
                "objective/reward": float(batch.scores.mean()),
                "objective/kl": mean_kl,
                "objective/rlhf_reward": float(batch.sequence_rewards.mean()),
                "objective/beta": batch.beta,
                **stats,
                "response/length": float(batch.response_mask.sum(1).float().mean()),
                "response/eos_share": float(batch.ended.float().mean()),
                "charts/learning_rate": self.optimizer_.param_groups[0]["lr"],
                "time/episodes_per_s": len(batch) / elapsed,
            }
            self.history_.append(row)
            self._check_health(row)
            bar.set_postfix(reward=f"{row['objective/reward']:.3f}", kl=f"{mean_kl:.3f}")
            if self.verbose and (self.n_iter_ % 10 == 0 or self.n_iter_ == total):
                logger.info(
                    "%s step %d: reward %.4f kl %.4f beta %.4g",
                    type(self).__name__,
                    self.n_iter_,
                    row["objective/reward"],
                    mean_kl,
                    batch.beta,
                )
            if self.checkpoint_dir is not None and (
                self.n_iter_ % self.checkpoint_every == 0 or self.n_iter_ == total
            ):
                save_checkpoint(self)
            if callback is not None and callback(self, row) is True:
                break
        bar.close()

    def _check_health(self, row: dict) -> None:
        step, kl, eos = row["step"], row["objective/kl"], row["response/eos_share"]
        if self.max_kl is not None and kl > self.max_kl:
            message = (
                f"{type(self).__name__}: the KL to the reference reached {kl:.3g} nats at "
                f"step {step}, beyond max_kl={self.max_kl}; raise beta, use an adaptive "
                "KL controller or lower learning_rate."
            )
            if self.max_kl_action == "raise":
                raise RuntimeError(message + " The last checkpoint (if any) is intact.")
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        if (
            self.min_eos_share is not None
            and self.tokenizer_.eos_token_id is not None
            and self.missing_eos_reward is not None
            and eos < self.min_eos_share
            and not self._eos_warned
        ):
            self._eos_warned = True
            warnings.warn(
                f"{type(self).__name__}: only {eos:.0%} of responses ended with EOS at "
                f"step {step}; the fixed missing_eos_reward={self.missing_eos_reward} "
                "then dominates the reward. Raise max_new_tokens or fine-tune the "
                "model to stop (SFTPolicy).",
                RuntimeWarning,
                stacklevel=3,
            )

    def _set_learning_rate(self) -> None:
        if self.lr_schedule == "linear":  # annealed linearly to 0 (implementation detail 28)
            frac = 1.0 - (self.n_iter_ - self._run_start) / self.n_steps
        else:
            frac = 1.0
        for group in self.optimizer_.param_groups:
            group["lr"] = frac * self.learning_rate_

    def _rollout(self, prompt_rows: np.ndarray) -> RolloutBatch:
        # Sampling, the reference, the value model and the reward run once per batch under
        # inference_mode; the batch is then cloned into ordinary tensors for the update.
        with torch.inference_mode():
            batch = self._sample_and_score(prompt_rows)
        return batch.clone()

    def _sample_and_score(self, prompt_rows: np.ndarray) -> RolloutBatch:
        rows = np.repeat(prompt_rows, self._k)
        prompts = self._encode(rows)
        tok = self.tokenizer_
        raw, sampled = sample(
            self.model_,
            prompts,
            max_new_tokens=self.max_new_tokens_,
            temperature=self.temperature_,
            generator=self._generator,
            suppress_ids=self._suppress_ids,
            return_logprobs=True,
            eos_token_id=tok.eos_token_id,
        )
        response_ids, response_mask, ended = truncate_after_eos(
            raw, tok.eos_token_id, tok.pad_token_id
        )
        if self._uses_ratio or _low_precision(self.device_):
            # Old log-probs from a full forward pass identical to the training pass, so the
            # ratio is exactly 1 at the first epoch (implementation details 2, 3, 21); in
            # bf16 the cached sampling pass differs from a full pass too much (detail 21).
            old = response_logprobs(
                self.model_,
                prompts,
                response_ids,
                response_mask,
                temperature=self.temperature_,
                suppress_ids=self._suppress_ids,
            )
        else:
            # No ratio in the loss: the sampling pass's own log-probs (fp32, tempered, equal
            # to a fresh forward pass up to float rounding) serve the KL; no extra pass.
            old = sampled.masked_fill(response_mask == 0, 0.0)
        # The reference pass goes in chunks of the update's minibatch size: its peak memory
        # (logits over the whole vocabulary) is then no more than a training pass's, and on
        # a CPU the smaller chunks stay in cache (2 x 32 rows: 12% faster than 64).
        chunk = max(1, len(rows) // self.n_minibatches)
        with self._reference() as reference:
            ref = torch.cat(
                [
                    response_logprobs(
                        reference,
                        prompts[i : i + chunk],
                        response_ids[i : i + chunk],
                        response_mask[i : i + chunk],
                        temperature=self.temperature_,
                        suppress_ids=self._suppress_ids,
                    )
                    for i in range(0, len(rows), chunk)
                ]
            )
        values = None
        if self.value_model_ is not None:
            values = sequence_values(self.value_model_, prompts, response_ids, response_mask)
            values = values * response_mask
        scores = self._score(
            [self._prompts[i] for i in rows], prompts, response_ids, response_mask, ended
        )
        # The reward KL uses the rollout-time log-probs, fixed for all epochs (detail 15).
        kl = kl_estimate(old, ref, self.kl_estimator) * response_mask
        beta = self.kl_.beta_  # the coefficient from before this step's update (detail 14)
        rewards = -beta * kl
        last = (response_mask.sum(1) - 1).clamp(min=0)  # the EOS, or the last token
        rewards[torch.arange(len(rows)), last] += scores
        return RolloutBatch(
            prompts=prompts,
            prompt_index=torch.as_tensor(rows),
            response_ids=response_ids,
            response_mask=response_mask,
            ended=ended,
            old_logprobs=old,
            ref_logprobs=ref,
            scores=scores,
            kl=kl,
            rewards=rewards,
            beta=beta,
            values=values,
        )

    def _score(self, prompts, encoded, response_ids, response_mask, ended) -> torch.Tensor:
        reward = self.reward_model_
        if self._scores_tokens:
            # Same vocabulary: score the ids directly, no decoding and re-encoding.
            raw = reward.score_tokens(encoded, response_ids, response_mask)
        else:
            raw = reward(prompts, self._decode(response_ids, response_mask))
        source = f"the reward model (step {self.n_iter_ + 1})"
        scores = torch.as_tensor(
            check_rewards(raw, len(prompts), source),
            dtype=torch.float32,
            device=response_ids.device,
        )
        if self.missing_eos_reward is not None and self.tokenizer_.eos_token_id is not None:
            # The EOS trick: the score of a response with no EOS is *replaced* by a fixed
            # reward (-1 by default), not offset (seed text; implementation detail 7).
            scores = torch.where(ended, scores, torch.full_like(scores, self.missing_eos_reward))
        return scores

    def _update(self, batch: RolloutBatch) -> dict:
        n = len(batch)
        size = max(1, n // self.n_minibatches)
        totals: dict[str, float] = {}
        count = 0
        entropies = []
        for _ in range(self.n_epochs):
            perm = torch.randperm(n, generator=self._generator).to(self.device_)
            for start in range(0, n, size):
                rows = perm[start : start + size]
                logprobs, entropy = response_logprobs(
                    self.model_,
                    batch.prompts[rows],
                    batch.response_ids[rows],
                    batch.response_mask[rows],
                    temperature=self.temperature_,
                    suppress_ids=self._suppress_ids,
                    with_entropy=True,
                )
                values = None
                if self.value_model_ is not None:
                    values = sequence_values(
                        self.value_model_,
                        batch.prompts[rows],
                        batch.response_ids[rows],
                        batch.response_mask[rows],
                    )
                loss, stats = self._loss(batch, rows, logprobs, values)
                gradient_step(
                    self.optimizer_,
                    loss,
                    who=type(self).__name__,
                    step=self.n_iter_ + 1,
                    max_grad_norm=self.max_grad_norm,
                )
                entropies.append(float(masked_mean(entropy.detach(), batch.response_mask[rows])))
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + float(value)
                count += 1
        out = {key: value / count for key, value in totals.items()}
        out["policy/entropy"] = float(np.mean(entropies))
        return out

    def score(self, X, y=None) -> float:
        """Mean reward of one sampled completion per prompt (larger is better).

        Parameters
        ----------
        X : prompts
        y : callable, default=None
            A reward to score with; ``None`` uses the one given to ``fit``.

        Returns
        -------
        score : float
        """
        check_is_fitted(self)
        prompts = check_prompts(X)
        reward = y if callable(y) else self.reward_model_
        completions = self.predict(prompts)
        return float(np.mean(check_rewards(reward(prompts, completions), len(prompts))))
