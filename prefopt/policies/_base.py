"""The one loop every policy-optimisation algorithm shares, and the contract of an algorithm.

    sample k responses per prompt -> score them -> shape the reward
    (minus beta * KL to the reference) -> advantages (the algorithm's choice)
    -> update the policy -> update beta

An algorithm is a subclass of :class:`BasePolicy` that declares what the loop
needs and supplies two methods; sampling, scoring, shaping, minibatches,
epochs, the KL controller, ``history_``, checkpoints and progress live here.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from sklearn.base import clone
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from .._config import get_config
from ..backend import (
    adamw,
    default_learning_rate,
    disable_dropout,
    distributed,
    make_generator,
    maybe_compile,
)
from ..data import PreferenceData, check_prompts
from ..kl import FixedKLController
from ..lm import GenerativeEstimator, RunState
from ..lm import _checkpoint as ckpt
from ..lm._run import one_fit_at_a_time
from ..rewards import check_rewards
from . import _online as online
from ._batch import Minibatch, RolloutBatch
from ._health import check_temperature
from ._inputs import check_ptx, starting_policy
from ._params import COMMON_CONSTRAINTS, store_params  # noqa: F401 (store_params re-exported)
from ._rollout import sample_and_score, update
from ._steps import train_steps
from ._value import build_value_model

logger = logging.getLogger("prefopt")


class BasePolicy(GenerativeEstimator):
    """Base of policy-optimisation estimators: the shared loop and the algorithm contract.

    **Writing an algorithm.** Subclass ``BasePolicy``, write an ``__init__``
    that stores its keyword arguments (:func:`store_params`), declare what the
    loop needs in class attributes, and supply two methods:

    ``compute_advantages(batch) -> torch.Tensor``
        From a :class:`RolloutBatch` (scores, per-token KL and rewards,
        log-probs, values), return the advantages: one per sample (shape
        ``(n,)``, a bandit view of the response) or one per token (``(n,
        length)``). An algorithm with a value model returns ``(advantages,
        returns)``. The loop stores them on the batch.
    ``compute_loss(batch, minibatch) -> (loss, stats)``
        From the batch and a :class:`Minibatch` (its ``rows``, the current
        ``logprobs`` with gradients, ``entropy``, ``values``, and the rows'
        ``mask``, ``advantages``, ``old_logprobs``, ``ref_logprobs``...),
        return a scalar loss to minimise and a dict of floats for ``history_``.

    Optionally ``after_update(batch)`` runs once per step after the update (a
    moving baseline, say), and ``_parameter_constraints`` validates new
    parameters. To the loss ``compute_loss`` returns, the loop adds the entropy
    bonus (``-entropy_coef`` times the minibatch's mean entropy) and the
    pretraining term (``ptx_coef`` times a next-token loss on ``ptx_data``) for
    every algorithm; an algorithm does not see them. The declarations:

    ``samples_per_prompt`` : int or str, default=1
        Samples drawn per prompt, or the name of the parameter that sets it
        (``"k"``); the k samples of a prompt sit together in the batch.
    ``kl_penalty`` : {"reward", "loss"}, default="reward"
        ``"reward"``: the loop subtracts beta times the per-token KL from the
        reward (Ziegler et al. 2019). ``"loss"``: the reward is the score alone
        and the algorithm adds its KL term to the loss (Shao et al. 2024's
        GRPO), reading ``batch.beta`` and ``minibatch.ref_logprobs``.
        ``objective/rlhf_reward`` reports score - beta * KL either way.
    ``uses_ratio`` : bool, default=False
        The loss uses pi/pi_old: old log-probs then come from a pass identical
        to the training pass, so the ratio is exactly 1 at the first epoch
        (Huang et al. 2024); otherwise from the sampling pass.
    ``training_temperature`` : "sampling" or float, default="sampling"
        The temperature of ``minibatch.logprobs``: the sampling temperature (a
        policy gradient of the sampling distribution), or a number (1.0 for a
        cross-entropy on kept samples, as SFT).
    ``uses_value_model`` : bool, default=False
        Build and train a value model (see ``PPOPolicy``'s ``value_model``).

    **Rewards paid per token.** A plain reward ``reward(prompts, completions)``
    returns one number per completion, which the loop puts at the response's
    last token. A reward that pays along the response has a method
    ``score_per_token(prompts, completions, response_ids, response_mask)``: it
    receives the text and the response token ids (the policy's tokenizer) and
    mask, torch tensors of shape ``(n, length)`` on the policy's device, and
    returns one value per response token, shape ``(n, length)``, finite inside
    the mask (values outside it are ignored;
    see :func:`~prefopt.rewards.check_token_rewards`). The loop then puts each
    value at its token in ``batch.rewards``, and ``batch.scores`` is their sum,
    so PPO's GAE uses them as they come and the bandit algorithms (which read
    ``scores`` or ``sequence_rewards``) optimise the total. A response with no
    EOS totals ``missing_eos_reward``: the values paid along it stay and its last
    token gets the difference. Such a reward should also be callable as a plain
    one returning the totals, which ``score``, the scorers and the exact worlds
    read (``TinyLMWorld.token_reward`` is one).

    Examples
    --------
    A REINFORCE whose baseline is the batch's mean reward:

    >>> import torch, prefopt
    >>> from prefopt.policies import BasePolicy, store_params
    >>> from prefopt.worlds import PreferenceWorld
    >>> class MeanBaseline(BasePolicy):
    ...     def __init__(self, *, model=None, beta=0.1, learning_rate=0.3, optimizer="sgd",
    ...                  n_steps=3, random_state=None):
    ...         store_params(self, locals())
    ...     def compute_advantages(self, batch):
    ...         rewards = batch.sequence_rewards
    ...         return rewards - rewards.mean()
    ...     def compute_loss(self, batch, minibatch):
    ...         logp = (minibatch.logprobs * minibatch.mask).sum(1)
    ...         loss = -(minibatch.advantages * logp).mean()
    ...         return loss, {"loss/policy": loss.item()}
    >>> prefopt.set_config(show_progress_bar=False)
    >>> world = PreferenceWorld(random_state=0)
    >>> policy = MeanBaseline(model=world.policy_model(), random_state=0)
    >>> policy.fit(world.prompts, world.true_quality).n_iter_
    3
    """

    _parameter_constraints: dict = dict(COMMON_CONSTRAINTS)

    samples_per_prompt: int | str = 1
    kl_penalty: str = "reward"
    uses_ratio: bool = False
    training_temperature: str | float = "sampling"
    uses_value_model: bool = False

    # Defaults of the common parameters, for algorithms whose __init__ omits some.
    model = None
    tokenizer = None
    beta = 0.05
    kl = None
    kl_estimator = "k1"
    learning_rate = None
    optimizer = "adam"
    lr_schedule = "linear"
    max_grad_norm = None
    n_steps = 100
    batch_size = 64
    n_epochs = 1
    n_minibatches = 1
    temperature = None
    max_new_tokens = None
    missing_eos_reward = -1.0
    stop_token_ids = None
    random_state = None
    verbose = 0
    warm_start = False
    checkpoint_dir = None
    checkpoint_every = 10
    truncate_prompts = False
    max_kl = None
    max_kl_action = "warn"
    min_eos_share = 0.5
    entropy_coef = 0.0
    ptx_coef = 0.0
    refit_every = None
    lora = None

    # ----- the contract ---------------------------------------------------------------
    def compute_advantages(self, batch: RolloutBatch):  # pragma: no cover - abstract
        """Advantages of a step's samples; see the class docstring.

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts.

        Returns
        -------
        advantages : torch.Tensor or (torch.Tensor, torch.Tensor)
        """
        raise NotImplementedError(f"{type(self).__name__} must define compute_advantages.")

    def compute_loss(self, batch: RolloutBatch, minibatch: Minibatch):  # pragma: no cover
        """Loss of one minibatch and its statistics; see the class docstring.

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts, with advantages.
        minibatch : Minibatch
            The rows and the current policy's outputs on them.

        Returns
        -------
        loss : torch.Tensor
        stats : dict of str to float
        """
        raise NotImplementedError(f"{type(self).__name__} must define compute_loss.")

    def after_update(self, batch: RolloutBatch) -> None:
        """Called once per step after the update; nothing by default.

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts.
        """

    def _samples_per_prompt(self) -> int:
        k = self.samples_per_prompt
        return int(getattr(self, k) if isinstance(k, str) else k)

    def _check_algorithm_params(self) -> None:
        """Cross-parameter checks of an algorithm; raise ValueError."""
        if self.kl_penalty not in ("reward", "loss"):
            raise ValueError(f"kl_penalty must be 'reward' or 'loss'; got {self.kl_penalty!r}.")

    # ----- fit ------------------------------------------------------------------------
    def fit(self, X, y=None, *, reward_model=None, labeler=None, ptx_data=None, callback=None):
        """Optimise the policy against a reward on the prompts ``X``.

        Parameters
        ----------
        X : list of str, pandas Series or DataFrame, datasets.Dataset, or PreferenceData
            Prompts (a ``prompt`` column for tables). In a ``Pipeline``, a
            :class:`~prefopt.data.PreferenceData` whose fitted SFT policy starts
            the run when ``model=None`` and whose reward model is the reward.
        y : callable, default=None
            The reward: a fitted :class:`~prefopt.RewardModel` or any callable
            ``reward(prompts, completions) -> array (n,)``; one with a
            ``score_per_token`` method is paid per token (see above).
        reward_model : callable, default=None
            The same, as a fit parameter (what ``GridSearchCV`` passes).
        labeler : callable, default=None
            With ``refit_every``: ``labeler(prompts, completions_a,
            completions_b, random_state) -> labels`` (1 where ``a`` is
            preferred), the signature of a fitted ``RewardModel.sample``; every
            world provides its raters as one (``world.labeler``).
        ptx_data : list of str, pandas Series or datasets.Dataset, default=None
            With ``ptx_coef``: pretraining texts (a ``text`` column for tables)
            for the next-token loss mixed into the policy loss
            (:func:`~prefopt.data.check_pretraining_texts`). They define the run:
            a checkpoint written with other texts is not resumed. Given with
            ``ptx_coef=0`` they are ignored, with a warning.
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
        if start_model is None and reward is not None:
            start_model = starting_policy(reward, type(self).__name__)
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
        k = self._samples_per_prompt()
        if self.batch_size % k:
            raise ValueError(
                f"batch_size={self.batch_size} must be a multiple of k={k} "
                "(k samples are drawn for each prompt)."
            )
        distributed.check_batch(self.batch_size, k, type(self).__name__)  # distributed fits
        online_state = online.start(self, reward, labeler)  # refused before any work
        ptx_texts = check_ptx(self, ptx_data)
        # The pretraining texts define the run too: a resume with other ones is refused.
        data_key = ckpt.fingerprint(
            prompts if ptx_texts is None else {"prompts": prompts, "ptx_data": ptx_texts}
        )
        resumable = ckpt.resumable(self, data_key, reward=reward, labeler=labeler)
        with one_fit_at_a_time(self), resumable as resume:
            if (resume is not None and resume.saved is not None) or not (
                self.warm_start and hasattr(self, "_run")
            ):
                self._setup(reward, start_model)
                online_log = None
            else:  # warm start: n_steps more steps, a fresh pass over the prompts
                online_log = getattr(getattr(self, "_online", None), "log", None)
                self._run.start_step = self.n_iter_
                self._run.stream = np.zeros(0, dtype=np.int64)
            self._checkpoint = resume
            self._online = online_state
            if resume is not None:
                saved_run = resume.restore(self, self._start_key)
                if saved_run is not None:
                    online_log = saved_run.pop("online", None)
                    self._run.load_state_dict(saved_run)
            self.reward_model_ = reward
            if self._online is not None:
                self._online.replay(self, online_log)  # the refits so far, redone exactly
            self._scores_tokens = (
                hasattr(reward, "score_tokens")
                and getattr(reward, "tokenizer_", None) is not None
                and reward.tokenizer_.get_vocab() == self.tokenizer_.get_vocab()
            )
            self._prompts = prompts
            self._prompt_tokens = self._tokenize_prompts(prompts)
            self._ptx_tokens = None if ptx_texts is None else self._pretraining_tokens(ptx_texts)
            check_temperature(self)
            for name in ("model_", "ref_model_", "value_model_"):  # also after a resume
                maybe_compile(getattr(self, name, None))  # set_config(compile=...); off by default
            self._prepare_distributed()  # DDP or fully_shard under a launcher; else nothing
            with distributed.global_statistics():  # under a launcher: statistics over all ranks
                self._train_steps(self._run.start_step + self.n_steps - self.n_iter_, callback)
            self._checkpoint = None  # the folder's lock ends with this block
        return self

    def _setup(self, reward, start_model) -> None:
        rng = check_random_state(self.random_state)
        seeds = rng.randint(np.iinfo(np.int32).max, size=3)
        self._init_model(start_model, self.tokenizer, seed=int(seeds[0]))
        self._start_key = (
            ckpt.module_fingerprint(self.model_) if self.checkpoint_dir is not None else None
        )
        value_model = None
        if self.uses_value_model:
            spec = getattr(self, "value_model", None)
            value_model = build_value_model(spec, self.model_, reward, self.tokenizer_)
        self._setup_reference()  # a frozen copy, or LoRA on model_ with no copy
        self.value_model_ = (
            None if value_model is None else disable_dropout(value_model).to(self.device_).eval()
        )
        self.kl_ = clone(self.kl) if self.kl is not None else FixedKLController()
        self.beta_ = self.kl_.start(self.beta).beta_
        self.learning_rate_ = (
            float(self.learning_rate)
            if self.learning_rate is not None
            else default_learning_rate(self.model_, large=3e-6)
        )
        self._run = RunState(
            # Distributed fits: each rank its own sampling stream (rank 0 keeps this seed's).
            generator=make_generator(distributed.rank_seed(int(seeds[1]))),
            rng=np.random.RandomState(int(seeds[2])),
            optimizer=self._make_optimizer(),
        )
        self.history_ = []
        self.n_iter_ = 0
        self.n_episodes_ = 0

    def _prepare_distributed(self) -> None:
        """Under a process group: DDP beside the trained modules, or FSDP's fully_shard."""
        if distributed.world_size() == 1:
            return
        if isinstance(getattr(self, "value_model", None), str):  # "shared"
            raise ValueError(
                f"{type(self).__name__}: value_model='shared' is not supported in a distributed "
                "fit (the policy's trunk would be trained through two engines); leave "
                "value_model=None (a copy of the reward model) or give a module."
            )
        before = [id(p) for p in self._trainable_parameters()]
        for name in ("model_", "value_model_"):
            distributed.prepare(getattr(self, name, None), self.device_)
        if distributed.sharded() and get_config()["fsdp_frozen"] == "shard":
            distributed.prepare(getattr(self, "ref_model_", None), self.device_)
        if [id(p) for p in self._trainable_parameters()] != before:  # fully_shard's new ones
            old, self._run.optimizer = self._run.optimizer, self._make_optimizer()
            if old.state:  # a resumed run's moments, loaded whole into every rank: shard them
                distributed.load_full_optimizer_state(
                    self._trained_modules(), self._run.optimizer, old.state_dict()
                )

    def _trained_modules(self) -> dict:
        """The modules the optimiser trains, by attribute name."""
        return {"model_": self.model_, "value_model_": self.value_model_}

    def _make_optimizer(self) -> torch.optim.Optimizer:
        params = self._trainable_parameters()
        if self.optimizer == "adam":
            return adamw(params, self.learning_rate_)  # eps=1e-5, as the original code
        return torch.optim.SGD(params, lr=self.learning_rate_)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_run", None)  # a saved policy is for using; warm_start then starts a new run
        state.pop("_checkpoint", None)
        state.pop("_ptx_tokens", None)  # a corpus, tokenised again by the next fit
        state.pop("_online", None)
        value = getattr(self, "value_model_", None)
        if getattr(self, "value_model", None) == "shared" and value is not None:
            # The shared trunk is the policy's: store only the value head.
            state["value_model_"] = None
            state["_shared_value_head"] = {
                k: v.detach().cpu().clone() for k, v in value.head.state_dict().items()
            }
        return state

    def __setstate__(self, state):
        head = state.pop("_shared_value_head", None)
        super().__setstate__(state)
        if head is not None:
            from ..backend.heads import shared_value_model

            self.value_model_ = shared_value_model(self.model_).to(self.device_)
            self.value_model_.head.load_state_dict(head)

    def _trainable_parameters(self) -> list:
        """Parameters of the policy and the value model, each once (a trunk may be shared)."""
        seen, params = set(), []
        for module in (self.model_, self.value_model_):
            for p in [] if module is None else module.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        return params

    # ----- one step -------------------------------------------------------------------
    def _train_steps(self, n_steps: int, callback=None) -> None:
        train_steps(self, n_steps, callback)  # the step loop lives in _steps.py

    def _set_learning_rate(self) -> None:
        if self.lr_schedule == "linear":  # annealed linearly to 0, as the original code
            frac = 1.0 - (self.n_iter_ - self._run.start_step) / self.n_steps
        else:
            frac = 1.0
        for group in self._run.optimizer.param_groups:
            group["lr"] = frac * self.learning_rate_

    def _training_temperature(self) -> float:
        t = self.training_temperature
        return self.temperature_ if t == "sampling" else float(t)

    def _rollout(self, prompt_rows: np.ndarray) -> RolloutBatch:
        # Sampling, the reference, the value model and the reward run once per batch under
        # inference_mode; the batch is then cloned into ordinary tensors for the update.
        # FSDP reuses its gathered-weight buffers in training, which inference tensors forbid.
        sharded = distributed.is_sharded(self.model_)
        with torch.no_grad() if sharded else torch.inference_mode():
            batch = sample_and_score(self, prompt_rows)
        return batch.clone()

    def _update(self, batch: RolloutBatch) -> dict:
        with distributed.training_view(self):  # distributed fits: through the DDP wrappers
            return update(self, batch)

    def score(self, X, y=None) -> float:
        """Mean reward of one sampled completion per prompt (larger is better).

        Parameters
        ----------
        X : list of str or table with a ``prompt`` column
            Prompts.
        y : callable, default=None
            A reward to score with; ``None`` uses the one given to ``fit``.

        Returns
        -------
        score : float
        """
        check_is_fitted(self)
        if y is not None and not callable(y):
            raise TypeError(
                f"{type(self).__name__}.score(X, y): y is the reward to score with and must "
                f"be callable as y(prompts, completions); got {type(y).__name__}. Pass "
                "y=None to score with the reward given to fit."
            )
        prompts = check_prompts(X)
        reward = self.reward_model_ if y is None else y
        if reward is None:  # a loaded policy whose reward could not be pickled
            raise ValueError(
                f"{type(self).__name__} has no reward to score with (it was not saved); "
                "pass one: score(X, y=reward)."
            )
        completions = self.predict(prompts)
        return float(np.mean(check_rewards(reward(prompts, completions), len(prompts))))
