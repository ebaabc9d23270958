"""The contract of a policy-optimisation algorithm: its declarations and its two methods.

:class:`Algorithm` is what :class:`~prefopt.policies.BasePolicy` mixes in: the
declarations the loop reads (each with a default), the methods an algorithm
supplies, the hooks by which it changes the loop (the reference pass, resampling
of tied groups, modules trained and saved beside the policy), and
``_step_view``, which gathers once per fit what the step needs
(:class:`~prefopt.policies.loop._view.StepView`).
"""

from __future__ import annotations

import re

import torch

from ...backend import disable_dropout, distributed
from ...learning_rate import POLICY_TARGET
from ._batch import Minibatch, RolloutBatch
from ._environment import check_environment
from ._tools import check_tools
from ._value import build_value_model
from ._view import StepView


class Algorithm:
    """What an algorithm declares and supplies; the loop does the rest.

    Subclass :class:`~prefopt.policies.BasePolicy` (which mixes this in) and
    supply ``compute_advantages`` and ``compute_loss``; override the
    declarations below as class attributes (or properties, when a parameter
    decides them).

    When a sampling engine drew the batch (``set_config(generation="vllm")``),
    ``batch.engine_logprobs`` (and ``minibatch.engine_logprobs``) hold its
    log-probs of the sampled tokens; the loss should not read them. With the
    estimator's ``vllm_importance_sampling_cap`` the loop hands
    ``compute_loss`` a ``minibatch.logprobs`` whose values are the policy's
    and whose gradient at each token is multiplied by the truncated
    importance weight (Yao et al. 2025), so every algorithm, its own loss
    unchanged, gets the correction.

    In a fit of several processes each rank holds a share of the batch: a loss's
    token mean over every rank's tokens says so at its call site,
    ``masked_mean(x, mask, across_ranks=True)`` (a no-op in one process), as the
    built-in losses and whitening do.

    The loop reads these declarations, and the hooks :meth:`extra_modules` and
    ``shared_trunk_modules``, never an algorithm's own names. A fitted algorithm
    of your own is saved as a built-in one is, and loaded by naming its class:
    ``prefopt.load(folder, algorithms=[MyPolicy])``.

    Attributes
    ----------
    samples_per_prompt : int or str, default=1
        Samples drawn per prompt, or the name of the parameter that sets it
        (``"k"``); the k samples of a prompt sit together in the batch.
    kl_penalty : {"reward", "loss"}, default="reward"
        ``"reward"``: the loop subtracts beta times the per-token KL from the
        reward (Ziegler et al. 2019). ``"loss"``: the reward is the score alone
        and the algorithm adds its KL term to the loss (Shao et al. 2024's
        GRPO), reading ``batch.beta`` and ``minibatch.ref_logprobs``.
        ``objective/rlhf_reward`` reports score - beta * KL either way.
    uses_ratio : bool, default=False
        Old name of ``recomputes_old_logprobs``, still read by it: the loss
        uses the ratio pi/pi_old.
    recomputes_old_logprobs : bool, default=uses_ratio
        The old log-probs come from a forward pass identical to the training
        pass, so a ratio pi/pi_old is exactly 1 at the first epoch (Huang et
        al. 2024); otherwise from the sampling pass (one pass fewer).
    loss_reduction : {"minibatch", "token_mean", "sequence_mean", "sum"}, default="minibatch"
        How ``compute_loss`` reduces a minibatch, which says how the loop sums
        the parts of a minibatch that ``micro_batch_size`` splits, so that the
        accumulated gradient is the whole minibatch's (read only then).
        ``"minibatch"`` assumes nothing of the loss (any normaliser, terms
        across rows): the loop runs the parts' forward passes without
        gradients, calls ``compute_loss`` once on the whole minibatch's
        outputs, and takes its gradient back through one part at a time
        (gradient caching, Gao et al. 2021); exact for any loss, at one more
        forward pass a part. The others call ``compute_loss`` on each part and
        take one pass a part: ``"token_mean"``, a mean over the tokens of
        ``minibatch.mask`` (each part weighted by its share of the tokens);
        ``"sequence_mean"``, a mean over the rows (each part weighted by its
        share of the rows); ``"sum"``, a sum over the rows whose normaliser
        does not depend on which rows the minibatch holds (the parts' losses
        add up). A loss declared so that is not what it says gets a gradient
        other than the whole minibatch's; ``tests/test_accumulation.py``
        checks each built-in's declaration. With several parts a step's
        ``history_`` statistics are the parts' means, weighted as their
        losses (by rows for ``"sum"``, whose ``loss/...`` figures add up).
    training_temperature : "sampling" or float, default="sampling"
        The temperature of ``minibatch.logprobs``: the sampling temperature (a
        policy gradient of the sampling distribution), or a number (1.0 for a
        cross-entropy on kept samples, as SFT).
    uses_value_model : bool, default=False
        Build and train a value model V(s_t) beside the policy, as an
        actor-critic algorithm does: ``batch.values`` holds its rollout-time
        predictions and ``minibatch.values`` its current ones, with gradients.
        It is built from the estimator's ``value_model`` parameter when the
        class has one (a module, or ``None``: a copy of a language-model reward
        model, else the policy's trunk with a zero head, else one value per
        token), and trained by the same optimiser; ``value_model_`` holds it.
        :meth:`extra_modules` builds it; an algorithm may override that hook
        to train other modules.
    needs_reference : bool, default=True
        Whether a rollout runs the reference pass. ``False`` (GRPO at beta = 0
        under a fixed coefficient) skips it: ``ref_logprobs`` is then a copy of
        ``old_logprobs``, the KL is 0, and the run-health check of learning
        watches the trained weights instead of the log-prob shift.
    dynamic_sampling : bool, default=False
        Replace the groups whose k rewards all tie (zero advantage, no
        gradient) with groups of freshly drawn prompts, for at most
        ``max_resamples`` extra rounds a step (Yu et al. 2025's DAPO; a batch
        still short is filled with tied groups). ``history_`` logs
        ``sampling/extra_generations``, ``sampling/dropped_groups`` and
        ``sampling/rounds``. GRPO takes both as parameters.
    max_resamples : int, default=0
        The cap on those extra rounds per step.
    kl_advice : str
        What the run-health warnings for a policy far from the reference
        (``kl_blowup``, and a KL beyond ``max_kl``) tell the user to do. The
        default names beta, an adaptive KL controller and the learning rate;
        an algorithm whose objective beta does not hold near the reference
        says its own (RAFT's: its loss has no KL term, and beta enters only
        its ranking).
    tiny_model_learning_rate : float, default=1e-3
        Where ``learning_rate=None`` (an adaptive rate) starts for a model
        under 10M parameters (a tiny transformer built from a config); see
        :func:`prefopt.backend.default_learning_rate`. The built-in policies
        declare the rate ``benchmarks/lr_sweep.py`` chose for them (rule 2 of
        ``benchmarks/LR_SWEEP.md``); 1e-3 is the rate for a new algorithm that
        declares none.
    adaptive_lr_target : float, default=0.002
        The target of the default adaptive rate (``learning_rate=None`` on a
        language model): the KL per token between the policy before and after
        an update that :class:`~prefopt.AdaptiveLR` keeps each update near
        (:func:`prefopt.learning_rate.policy_default`). PPO declares 0.01: its
        four epochs an update move the policy further than one pass does.
    adaptive_lr_anneal : bool, default=False
        Whether that default rate decays linearly to 0 over the fit
        (``AdaptiveLR(anneal=True)``), as PPO's original code decays its rate;
        PPO declares ``True``.
    """

    samples_per_prompt: int | str = 1
    kl_penalty: str = "reward"
    uses_ratio: bool = False
    loss_reduction: str = "minibatch"
    training_temperature: str | float = "sampling"
    uses_value_model: bool = False
    needs_reference: bool = True
    dynamic_sampling: bool = False
    max_resamples: int = 0
    kl_advice: str = (
        "The policy ran far from the reference: raise beta, use an adaptive KL controller or "
        "lower learning_rate."
    )
    tiny_model_learning_rate: float = 1e-3
    adaptive_lr_target: float = POLICY_TARGET
    adaptive_lr_anneal: bool = False

    @property
    def recomputes_old_logprobs(self) -> bool:
        """Whether the old log-probs come from a pass identical to the training pass."""
        return bool(self.uses_ratio)

    def compute_advantages(self, batch: RolloutBatch):  # pragma: no cover - abstract
        """Advantages of a step's samples; see :class:`~prefopt.policies.BasePolicy`.

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
        """Loss of one minibatch and its statistics; see :class:`~prefopt.policies.BasePolicy`.

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

    def extra_modules(self, reward) -> dict:
        """The modules trained beside the policy and saved with it, by fitted-attribute name.

        Called once per fresh fit, before the reference is made (so a copy of the
        policy's trunk is taken from the plain model, never from a LoRA
        wrapper). By default a value model when ``uses_value_model``, else none.
        Each module is trained by the fit's optimiser, moved to the device with
        dropout off, set as the fitted attribute of its name (a lower-case name
        ending in ``_``), saved by :func:`prefopt.save` and rebuilt by
        :func:`prefopt.load` (a module type prefopt does not know is passed to
        ``load`` again by that name).

        Parameters
        ----------
        reward : callable
            The reward given to ``fit``.

        Returns
        -------
        modules : dict of str to torch.nn.Module
        """
        if not self.uses_value_model:
            return {}
        # Only classes with a value_model parameter have one; the type varies.
        spec = self.get_params(deep=False).get("value_model")
        return {"value_model_": build_value_model(spec, self.model_, reward, self.tokenizer_)}

    # ----- what the loop reads from the declarations ---------------------------------
    def _samples_per_prompt(self) -> int:
        k = self.samples_per_prompt
        return int(getattr(self, k) if isinstance(k, str) else k)

    def _training_temperature(self) -> float:
        t = self.training_temperature
        return self.temperature_ if t == "sampling" else float(t)

    def _check_algorithm_params(self) -> None:
        """Cross-parameter checks of an algorithm; raise ValueError."""
        if self.kl_penalty not in ("reward", "loss"):
            raise ValueError(f"kl_penalty must be 'reward' or 'loss'; got {self.kl_penalty!r}.")
        if self.loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(
                f"{type(self).__name__}.loss_reduction must be one of "
                f"{', '.join(map(repr, LOSS_REDUCTIONS))}; got {self.loss_reduction!r}. "
                "'minibatch' (the default) is exact for any loss."
            )
        check_micro_batch_size(self)

    def _setup_modules(self, reward) -> None:
        """The modules beside ``model_``: those of :meth:`extra_modules`, then the reference.

        ``value_model_`` is ``None`` when no hook builds one (the loop reads it).
        """
        modules = _checked_modules(self.extra_modules(reward), type(self).__name__)
        self._setup_reference()  # a frozen copy, or LoRA on model_ with no copy
        self.value_model_ = None
        self.extra_modules_ = sorted(modules)
        for name, module in modules.items():
            setattr(self, name, disable_dropout(module).to(self.device_).eval())

    def _trained_modules(self) -> dict:
        """The modules the optimiser trains, by attribute name."""
        names = self.__dict__.get("extra_modules_", ["value_model_"])
        return {"model_": self.model_, **{name: getattr(self, name) for name in names}}

    def _step_view(self) -> StepView:
        """What the step needs of this fitted policy, gathered once per fit."""
        resample = self.dynamic_sampling and self.max_resamples > 0
        return StepView(
            name=type(self).__name__,
            model=self.model_,
            value_model=self.value_model_,
            trained=self._trained_modules(),
            reference=self._reference,
            device=self.device_,
            tokenizer=self.tokenizer_,
            tokenize_prompts=self._tokenize_prompts,
            pretraining_tokens=self._pretraining_tokens,
            encode=self._encode,
            decode=self._decode,
            pad_responses=self._pad_responses,
            pad_token_id=self.tokenizer_.pad_token_id,
            stop_ids=self._stop_ids(),
            suppress_ids=tuple(self._suppress_ids),
            k=self._samples_per_prompt(),
            temperature=self.temperature_,
            training_temperature=self._training_temperature(),
            max_new_tokens=self.max_new_tokens_,
            compute_advantages=self.compute_advantages,
            compute_loss=self.compute_loss,
            after_update=self.after_update,
            kl_penalty=self.kl_penalty,
            kl_advice=self.kl_advice,
            recomputes_old_logprobs=bool(self.recomputes_old_logprobs),
            loss_reduction=self.loss_reduction,
            needs_reference=bool(self.needs_reference),
            resample_tied_groups=int(self.max_resamples) if resample else None,
            batch_size=self.batch_size,
            n_epochs=self.n_epochs,
            n_minibatches=self.n_minibatches,
            micro_batch_size=self.micro_batch_size,
            n_steps=self.n_steps,
            learning_rate=self.learning_rate_,
            lr_schedule=self.lr_schedule,
            lr_controller=self.lr_controller_,
            max_grad_norm=self.max_grad_norm,
            entropy_coef=float(self.entropy_coef),
            ptx_coef=float(self.ptx_coef),
            kl_estimator=self.kl_estimator,
            missing_eos_reward=self.missing_eos_reward,
            importance_sampling_cap=self.vllm_importance_sampling_cap,
            max_kl=self.max_kl,
            max_kl_action=self.max_kl_action,
            min_eos_share=self.min_eos_share,
            checkpoint_every=self.checkpoint_every,
            refit_every=self.refit_every,
            max_staleness=self.max_staleness,
            off_policy_cap=self.off_policy_cap,
            episodes=self._episode_settings(),
        )

    def _episode_settings(self) -> dict | None:
        """The episodes' settings (an ``environment`` or ``tools``), checked; else ``None``."""
        if self.environment is None and self.tools is None:
            return None
        who = type(self).__name__
        budget = self.max_episode_tokens
        if budget is None:  # every turn may use its max_new_tokens
            budget = self.max_turns * self.max_new_tokens_
        return {
            "make_env": check_environment(self.environment, who),
            "tools": check_tools(self.tools, who),
            "max_turns": int(self.max_turns),
            "max_tokens": int(budget),
            "tool_timeout": float(self.tool_timeout),
        }


# How a loss may reduce a minibatch (Algorithm.loss_reduction); the first is the default.
LOSS_REDUCTIONS = ("minibatch", "token_mean", "sequence_mean", "sum")


def check_micro_batch_size(policy) -> None:
    """Refuse a ``micro_batch_size`` that does not split the minibatch evenly, before any work."""
    micro = policy.micro_batch_size
    if micro is None:
        return
    who = type(policy).__name__
    if distributed.world_size() > 1:
        raise ValueError(
            f"{who}: micro_batch_size is not supported in a distributed fit yet (a part's "
            "loss would need the token counts of every rank's parts); set "
            "micro_batch_size=None and lower batch_size, or add ranks."
        )
    size = policy.batch_size // policy.n_minibatches
    if size % micro:
        fits = [d for d in range(1, size + 1) if size % d == 0]
        raise ValueError(
            f"{who}: micro_batch_size={micro} does not divide the minibatch of "
            f"batch_size // n_minibatches = {policy.batch_size} // {policy.n_minibatches} = "
            f"{size} episodes; give one of {fits}, or None for no accumulation."
        )


# Fitted attributes the estimator itself sets; an extra module may not take their names.
_TAKEN = frozenset({"model_", "ref_model_", "reward_model_", "tokenizer_", "kl_", "history_"})


def _checked_modules(modules, who: str) -> dict:
    """``extra_modules``' answer, refused before training unless it is ``{name_: Module}``."""
    if not isinstance(modules, dict):
        raise TypeError(
            f"{who}.extra_modules must return a dict of fitted-attribute names to torch "
            f"modules; got {type(modules).__name__}."
        )
    for name, module in modules.items():
        if not isinstance(module, torch.nn.Module):
            raise TypeError(
                f"{who}.extra_modules returned {type(module).__name__} for {name!r}; each "
                "value must be a torch.nn.Module."
            )
        if not (isinstance(name, str) and re.fullmatch(r"[a-z][a-z0-9_]*_", name)):
            raise ValueError(
                f"{who}.extra_modules returned the name {name!r}; a module trained beside the "
                "policy is a fitted attribute: a lower-case name ending in '_', such as "
                "'critic_'."
            )
        if name in _TAKEN:
            raise ValueError(
                f"{who}.extra_modules returned {name!r}, a fitted attribute the estimator sets "
                "itself; choose another name."
            )
    return modules
