"""The estimator every policy-optimisation algorithm subclasses: parameters, fit, score.

    sample k responses per prompt -> score them -> shape the reward
    (minus beta * KL to the reference) -> advantages (the algorithm's choice)
    -> update the policy -> update beta

An algorithm is a subclass of :class:`BasePolicy` that declares what the loop
needs and supplies two methods (``_contract.py``). ``fit`` validates, builds the
fitted state and hands the steps to one :class:`~prefopt.policies.loop._loop.PolicyLoop`
per call (``_loop.py``), which owns the run's state.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
from sklearn.base import clone
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from ..backend import default_learning_rate, distributed, make_generator, maybe_compile
from ..backend.memory import checkpointable, enable_gradient_checkpointing
from ..backend.vllm_engine import sampling_engine
from ..data import PreferenceData, check_prompt_table
from ..kl import FixedKLController
from ..learning_rate import AdaptiveLR, policy_default
from ..lm import GenerativeEstimator, RunState
from ..lm import checkpoint as ckpt
from ..lm._run import one_fit_at_a_time
from ..rewards import call_with_columns, check_reward_columns, check_rewards
from ..rewards._combined import combine_rewards, describe_reward, rebuild_reward
from ..rewards._probe import reward_behaviour
from ..tracking import check_callback
from ..validation import validate_params
from ._inputs import check_ptx, starting_policy
from ._params import COMMON_CONSTRAINTS, COMMON_PARAMETERS
from ._signatures import make_init, store_params  # noqa: F401 (re-exported)
from .loop import Algorithm
from .loop import _online as online
from .loop._environment import check_episode_inputs, environment_rewards_only
from .loop._episodes import run_episodes
from .loop._health import check_temperature
from .loop._loop import PolicyLoop, checked_beta, make_optimizer

logger = logging.getLogger("prefopt")

# Classes already told which common parameters their __init__ leaves out.
_TOLD: set = set()


class BasePolicy(Algorithm, GenerativeEstimator):
    """Base of policy-optimisation estimators: the common loop and the algorithm contract.

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
    parameters (``{**BasePolicy._parameter_constraints, "cap":
    [Interval(Real, 0, None, closed="neither")]}``, with the constraints of
    :mod:`prefopt.validation`). To the loss ``compute_loss`` returns, the loop adds the entropy
    bonus (``-entropy_coef`` times the minibatch's mean entropy) and the
    pretraining term (``ptx_coef`` times a next-token loss on ``ptx_data``) for
    every algorithm; an algorithm does not see them. What the loop needs is
    declared in class attributes, documented in :class:`Algorithm`:
    ``samples_per_prompt``, ``kl_penalty`` (the KL in the reward or in the
    loss), ``recomputes_old_logprobs`` (formerly ``uses_ratio``),
    ``training_temperature``, and whether a value function is trained beside
    the policy.

    **Parameters.** The common parameters (those of ``_common_parameters``)
    have one table: default, constraints and documentation
    (``policies/_params.py``). The built-in algorithms take every one of them:
    their ``__init__`` is :func:`make_init` given only their own parameters
    and the defaults they change (``__init__ = make_init(k=4,
    n_minibatches=2)``), so ``get_params``, ``set_params``, ``clone`` and the
    searches see all of them. A user's algorithm may do the same, or write its
    ``__init__`` by hand with :func:`store_params` and leave some out:
    ``BasePolicy``'s class-level defaults (the table's) then stand in, and
    ``fit`` warns once per class which ones cannot be searched. The beta a
    KL controller (``kl``, a user's own included) returns must be finite and
    >= 0; ``fit`` stops with an error naming the controller otherwise.

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
    so per-token advantages use them as they come and the bandit algorithms (which read
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
    # The names of the parameters every policy has; a subclass may omit some from __init__.
    _common_parameters: tuple[str, ...] = tuple(COMMON_CONSTRAINTS)
    # The last fit's loop: warm_start continues its random streams and optimiser.
    _loop: PolicyLoop | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = vars(cls).get("__init__")
        if init is not None and hasattr(init, "differs"):  # made by make_init
            init.__qualname__ = f"{cls.__qualname__}.__init__"
            init.__module__ = cls.__module__
            unchecked = [n for n in init.own if n not in cls._parameter_constraints]
            if unchecked:
                raise TypeError(
                    f"{cls.__name__}'s parameters {unchecked} have no entry in "
                    "_parameter_constraints; declare their constraints (prefopt.validation) "
                    'or "no_validation".'
                )

    # ----- fit ------------------------------------------------------------------------
    def fit(self, X, y=None, *, reward_model=None, labeler=None, ptx_data=None, callback=None):
        """Optimise the policy against a reward on the prompts ``X``.

        Parameters
        ----------
        X : list of str, pandas Series or DataFrame, datasets.Dataset, or PreferenceData
            Prompts (a ``prompt`` column for tables; every other column of a
            table, or key of dict rows, reaches the reward as a keyword
            argument, see ``y``). In a ``Pipeline``, a
            :class:`~prefopt.data.PreferenceData` whose fitted SFT policy starts
            the run when ``model=None`` and whose reward model is the reward.
        y : callable or list of callables, default=None
            The reward: a fitted :class:`~prefopt.RewardModel` or any callable
            ``reward(prompts, completions) -> array (n,)``; one with a
            ``score_per_token`` method is paid per token (see above). A reward
            that names more arguments, ``reward(prompts, completions, answer)``
            or ``**kwargs``, receives those columns of ``X``, one value per
            completion (a prompt's value repeated for its k samples), as TRL
            passes dataset columns. A list of rewards is summed with
            ``reward_weights``.
        reward_model : callable or list of callables, default=None
            The same, as a fit parameter (what ``GridSearchCV`` passes).
        labeler : callable, default=None
            With ``refit_every``: ``labeler(prompts, completions_a,
            completions_b, random_state) -> labels`` (0 where ``a`` is
            preferred, 1 where ``b`` is), the signature of a fitted
            ``RewardModel.sample``; every world provides its raters as one
            (``world.labeler``).
        ptx_data : list of str, pandas Series or datasets.Dataset, default=None
            With ``ptx_coef``: pretraining texts (a ``text`` column for tables)
            for the next-token loss mixed into the policy loss
            (:func:`~prefopt.data.check_pretraining_texts`). They define the run:
            a checkpoint written with other texts is not resumed. Given with
            ``ptx_coef=0`` they are ignored, with a warning.
        callback : callable, Logger or list of them, default=None
            ``callback(policy, row)`` after every step, with that step's
            ``history_`` row; returning ``True`` stops the run early. Use it to
            track exact metrics along a run or to stop on a condition. A
            :mod:`prefopt.tracking` logger logs the fit and is closed with it.

        Returns
        -------
        self : object
            The fitted policy.
        """
        validate_params(self)
        check_callback(callback)
        self._check_algorithm_params()
        self._tell_hidden_parameters()
        start_model = self.model
        if isinstance(X, PreferenceData):  # the last step of a Pipeline
            reward_model = reward_model if reward_model is not None else X.reward_model
            start_model = self.model if self.model is not None else X.policy
            X = X.require("prompts", type(self).__name__)
        prompts, columns = check_prompt_table(X)
        reward = reward_model if reward_model is not None else y
        reward = combine_rewards(reward, self.reward_weights)  # a list: one weighted reward
        if reward is None and self.environment is not None:
            reward = environment_rewards_only  # the environment pays every reward
        check_episode_inputs(self, reward)  # an unusable environment or tool: before any work
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
        check_reward_columns(reward, list(columns), f"{type(self).__name__}.fit")
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
        key = prompts if ptx_texts is None else {"prompts": prompts, "ptx_data": ptx_texts}
        if columns:  # the reward's columns too (a plain list of prompts keeps its old key)
            key = {"prompts": prompts, "columns": columns, "ptx_data": ptx_texts}
        data_key = ckpt.fingerprint(key)
        # A reward not described exactly is also told apart by its outputs on a seeded probe.
        probes = {"reward": lambda: reward_behaviour(reward, prompts, columns)}
        resumable = ckpt.resumable(self, data_key, probes, reward=reward, labeler=labeler)
        # sampling_engine: under generation="vllm", the fit's own engine, closed at its end.
        with one_fit_at_a_time(self), resumable as resume, sampling_engine():
            previous = self._loop
            if (resume is not None and resume.saved is not None) or not (
                self.warm_start and previous is not None
            ):
                run, start_key = self._start_run(reward, start_model)
                online_log = None
            else:  # warm start: n_steps more steps, a fresh pass over the prompts
                run, start_key = previous.run, previous.start_key
                online_log = None if previous.online is None else previous.online.log
                run.start_step = self.n_iter_
                run.stream = np.zeros(0, dtype=np.int64)
            overlap_state = None
            if resume is not None:
                saved_run = resume.restore(self, start_key)
                if saved_run is not None:
                    online_log = saved_run.pop("online", None)
                    overlap_state = saved_run.pop("overlap", None)
                    run.load_state_dict(saved_run)
            if online_state is not None:  # the refits so far, redone exactly
                reward = online_state.replay(reward, online_log)
            self.reward_model_ = reward
            self._loop = loop = PolicyLoop(
                self,
                view=self._step_view(),  # what the step needs of this policy, gathered once
                run=run,
                prompts=prompts,
                columns=columns,
                reward=reward,
                ptx_texts=ptx_texts,
                checkpoint=resume,
                online=online_state,
                start_key=start_key,
                overlap=overlap_state,
            )
            check_temperature(self)
            self._tell_sampling(start_model)
            for module in self._trained_modules().values():  # also after a resume
                maybe_compile(module)  # set_config(compile=...); off by default
            maybe_compile(self.ref_model_)
            loop.prepare_distributed()  # DDP or fully_shard under a launcher; else nothing
            try:
                loop.train(
                    run.start_step + self.n_steps - self.n_iter_, callback, record=self._record
                )
            finally:
                loop.close()  # the sampler process of overlapped rollouts, if any
            loop.checkpoint = None  # the folder's lock ends with this block
        return self

    def _record(self, result) -> None:
        """Write one step's :class:`~prefopt.policies.loop._loop.StepResult` into the fit."""
        self.beta_ = result.beta
        self.n_iter_ += 1
        self.n_episodes_ += result.n_episodes
        self.budget_ = result.budget
        self.reward_model_ = result.reward
        self.history_.append(result.row)

    def _describe_reward(self, reward):
        """What ``save`` records of a reward it cannot hold (a weighted list's weights)."""
        return describe_reward(reward)

    def _rebuild_reward(self, reward, saved):
        """The reward ``load`` restores: a list weighed again as it was saved."""
        if not (isinstance(saved, dict) and "weighted" in saved):
            # Saved by an older prefopt (by type only): a list is weighed as fit weighs it.
            return combine_rewards(reward, self.reward_weights)
        return rebuild_reward(reward, saved, type(self).__name__)

    def _tell_hidden_parameters(self) -> None:
        """Warn once per class which common parameters its ``__init__`` leaves out."""
        cls = type(self)
        hidden = [n for n in cls._common_parameters if n not in self.get_params(deep=False)]
        if hidden and cls not in _TOLD:
            _TOLD.add(cls)
            warnings.warn(
                f"{cls.__name__}.__init__ does not take {', '.join(hidden)}: their class-level "
                "values are used, but get_params, set_params and the searches cannot see or "
                "change them. Add them to __init__ to tune them.",
                UserWarning,
                stacklevel=3,
            )

    def _start_run(self, reward, start_model) -> tuple[RunState, str | None]:
        """A fresh run: the fitted state, and the random streams and optimiser of the loop."""
        rng = check_random_state(self.random_state)
        seeds = rng.randint(np.iinfo(np.int32).max, size=3)
        start_key = self._setup(reward, start_model, seed=int(seeds[0]))
        run = RunState(
            # Distributed fits: each rank its own sampling stream (rank 0 keeps this seed's).
            generator=make_generator(distributed.rank_seed(int(seeds[1]))),
            rng=np.random.RandomState(int(seeds[2])),
            optimizer=make_optimizer(self._trained_modules(), self.optimizer, self.learning_rate_),
        )
        return run, start_key

    def _setup(self, reward, start_model, *, seed: int) -> str | None:
        """The fitted state of a fresh run; returns the starting model's fingerprint.

        Subclasses add their own fitted state after calling this.
        """
        self._init_model(start_model, self.tokenizer, seed=seed)
        # The checkpoint's same-model check reads the starting weights, before any LoRA.
        start_key = (
            ckpt.module_fingerprint(self.model_) if self.checkpoint_dir is not None else None
        )
        self._setup_modules(reward)  # the reference, and any module trained beside model_
        if self.gradient_checkpointing:  # after the reference is copied: its passes take no grad
            enable_gradient_checkpointing(self.model_, f"{type(self).__name__}'s policy")
            for name, module in self._trained_modules().items():  # any module trained beside
                if module is None or module is self.model_:
                    continue
                if checkpointable(module):
                    enable_gradient_checkpointing(module, f"{type(self).__name__}'s {name}")
                else:  # said, not silently skipped: nothing in it to recompute
                    warnings.warn(
                        f"gradient_checkpointing=True: {type(self).__name__}'s {name} is a "
                        f"{type(module).__name__} with no transformers layers to recompute; it "
                        "trains without checkpointing (the policy checkpoints).",
                        UserWarning,
                        stacklevel=3,
                    )
        self.kl_ = clone(self.kl) if self.kl is not None else FixedKLController()
        self.beta_ = checked_beta(self.kl_, self.kl_.start(self.beta).beta_, "at the start")
        self.learning_rate_, self.lr_controller_ = self._start_learning_rate()
        self.history_ = []
        self.n_iter_ = 0
        self.n_episodes_ = 0
        self.budget_ = {"episodes": 0, "tokens": 0, "gradient_steps": 0, "seconds": 0.0}
        return start_key

    def _start_learning_rate(self) -> tuple[float, AdaptiveLR | None]:
        """The starting rate, and the fit's own copy of an adaptive rate's controller."""
        rate = self.learning_rate
        start = default_learning_rate(self.model_, large=3e-6, tiny=self.tiny_model_learning_rate)
        if rate is None and not getattr(self.model_, "is_log_linear", False):
            # The default on a language model (issue 35): no fixed rate suits every task.
            rate = policy_default(
                start, target=self.adaptive_lr_target, anneal=self.adaptive_lr_anneal
            )
        if not isinstance(rate, AdaptiveLR):
            return (float(rate) if rate is not None else start), None
        # The fit's own copy; with no starting rate of its own it starts at the rate the
        # model's size calls for (clipped into its bounds).
        controller = clone(rate).start(start)
        return controller.learning_rate_, controller

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_loop", None)  # a saved policy is for using; warm_start then starts anew
        return state

    def score(self, X, y=None) -> float:
        """Mean reward of one sampled completion per prompt (larger is better).

        It samples (as the fit does, at ``temperature_``), so it estimates the
        objective the fit maximises; ``reward(X, predict(X))`` scores the greedy
        completions instead.

        Parameters
        ----------
        X : list of str or table with a ``prompt`` column
            Prompts; a table's other columns reach the reward as in ``fit``.
        y : callable or list of callable, default=None
            A reward to score with (a list is weighted with ``reward_weights``, as
            ``fit`` weighs it); ``None`` uses the one given to ``fit``.

        Returns
        -------
        score : float
        """
        check_is_fitted(self)
        if isinstance(y, (list, tuple)) and y and all(map(callable, y)):  # as fit takes it
            y = combine_rewards(y, self.reward_weights)
        if y is not None and not callable(y):
            raise TypeError(
                f"{type(self).__name__}.score(X, y): y is the reward to score with and must "
                f"be callable as y(prompts, completions), or a list of them; got "
                f"{type(y).__name__}. Pass y=None to score with the reward given to fit."
            )
        prompts, columns = check_prompt_table(X)
        reward = self.reward_model_ if y is None else y
        if reward is None:  # a loaded policy whose reward could not be pickled
            raise ValueError(
                f"{type(self).__name__} has no reward to score with (it was not saved); "
                "pass one: score(X, y=reward)."
            )
        check_reward_columns(reward, list(columns), f"{type(self).__name__}.score")
        if self.environment is not None or self.tools is not None:  # one episode a prompt
            episodes = self.sample_episodes(prompts)
            raw = call_with_columns(reward, prompts, episodes["transcript"], columns)
            total = check_rewards(raw, len(prompts)) + episodes["environment_reward"]
            return float(np.mean(total))
        completions = [group[0] for group in self.sample(prompts, n=1)]
        raw = call_with_columns(reward, prompts, completions, columns)
        return float(np.mean(check_rewards(raw, len(prompts))))

    def sample_episodes(self, X, *, random_state=None) -> dict:
        """One episode a prompt in the fit's ``environment`` and with its ``tools``.

        Parameters
        ----------
        X : list of str or of conversations, or table with a ``prompt`` column
        random_state : int, RandomState instance or None, default=None
            ``None`` uses the estimator's ``random_state``.

        Returns
        -------
        episodes : dict
            ``transcript`` (each transcript after its prompt as text, tool results
            included), ``environment_reward`` (ndarray), ``ended`` (ndarray of bool)
            and ``stats`` (the ``episode/...`` and ``tools/...`` figures).

        Examples
        --------
        >>> import prefopt
        >>> from prefopt.worlds import CalculatorWorld
        >>> prefopt.set_config(show_progress_bar=False)
        >>> world = CalculatorWorld(n_eval=4, n_demonstrations=8, random_state=0)
        >>> policy = prefopt.GRPOPolicy(model=world.model_config(), tools=world.tools,
        ...                             max_new_tokens=world.max_new_tokens, n_steps=0)
        >>> policy = policy.fit(world.prompts, world.correctness_reward)
        >>> len(policy.sample_episodes(world.eval_prompts)["transcript"])
        4
        """
        check_is_fitted(self)
        if self.environment is None and self.tools is None:
            raise ValueError(
                f"{type(self).__name__}.sample_episodes needs an environment or tools; set "
                "environment= or tools= (or use sample for single responses)."
            )
        prompts, _ = check_prompt_table(X)
        seed = self.random_state if random_state is None else random_state
        return run_episodes(self._step_view(), prompts, random_state=seed)


# The class-level values of the common parameters, from their table: what a user
# algorithm whose __init__ leaves some out falls back on (fit says which, once).
for _name, _parameter in COMMON_PARAMETERS.items():
    setattr(BasePolicy, _name, _parameter.default)
del _name, _parameter
