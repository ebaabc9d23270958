"""The contract of a policy-optimisation algorithm: its declarations and its two methods.

:class:`Algorithm` is what :class:`~prefopt.policies.BasePolicy` mixes in: the
class-level declarations the loop reads, the methods an algorithm supplies, and
the one optional module an algorithm may train beside the policy (a value model).
"""

from __future__ import annotations

from ...backend import disable_dropout
from ._batch import Minibatch, RolloutBatch
from ._value import build_value_model


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
    tiny_model_learning_rate : float, default=1e-3
        The learning rate ``learning_rate=None`` means for a model under 10M
        parameters (a tiny transformer built from a config); see
        :func:`prefopt.backend.default_learning_rate`. The built-in policies
        declare the rate ``benchmarks/lr_sweep.py`` chose for them (rule 2 of
        ``benchmarks/LR_SWEEP.md``); 1e-3 is the rate for a new algorithm that
        declares none.
    """

    samples_per_prompt: int | str = 1
    kl_penalty: str = "reward"
    uses_ratio: bool = False
    training_temperature: str | float = "sampling"
    uses_value_model: bool = False
    tiny_model_learning_rate: float = 1e-3

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

    def _setup_modules(self, reward) -> None:
        """The modules beside ``model_``: ``value_model_`` (None unless declared), the reference.

        The value model is built before the reference is made, so that a copy of the
        policy's trunk is taken from the plain model, never from its LoRA wrapper.
        """
        module = None
        if self.uses_value_model:
            # Only classes with a value_model parameter have one; the type varies.
            spec = getattr(self, "value_model", None)
            module = build_value_model(spec, self.model_, reward, self.tokenizer_)
        self._setup_reference()  # a frozen copy, or LoRA on model_ with no copy
        self.value_model_ = (
            None if module is None else disable_dropout(module).to(self.device_).eval()
        )

    def _trained_modules(self) -> dict:
        """The modules the optimiser trains, by attribute name."""
        return {"model_": self.model_, "value_model_": self.value_model_}
