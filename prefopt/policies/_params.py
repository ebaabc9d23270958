"""The common parameters of the policy estimators: one table, and ``__init__`` made from it.

Every reinforcement-learning policy (PPO, RLOO, GRPO, REINFORCE, REINFORCE++,
RAFT and a user's algorithm on :class:`~prefopt.policies.BasePolicy`) takes the
same 42 parameters besides its own. :data:`COMMON_PARAMETERS` holds, for each,
its default, its constraints (:mod:`prefopt.validation`) and its documentation;
everything else is read from it:

- a built-in's ``__init__`` is :func:`~prefopt.policies.make_init`
  (``_signatures.py``) called with only what the
  algorithm changes: the defaults where it differs from the table (RLOO's
  ``n_minibatches=2``) and its own parameters (``k=4``). It is a plain
  keyword-only function with literal defaults that stores its arguments
  verbatim, generated as :mod:`dataclasses` generates one, so ``get_params``,
  ``clone``, ``set_params`` and the estimator checks read an explicit signature;
- ``BasePolicy._parameter_constraints`` (validation in ``fit``) and the
  class-level values a user algorithm's shorter ``__init__`` falls back on;
- the Parameters section of every docstring (``_docs.fill``), with each
  default read from the signature.

A new common parameter is one entry here, plus the code that reads it;
``tests/test_params.py`` fails when a built-in's ``__init__`` and the table
disagree.

The design notes (why the signatures are generated, why checkpointing and the
health actions stay flat parameters rather than a nested object or
``set_config``, why scikit-learn's callback API is not adopted yet) are in
``docs/guide/parameters.rst``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from numbers import Integral, Real

from ..kl import KLController
from ..learning_rate import AdaptiveLR
from ..validation import Interval, StrOptions
from ._episode_params import EPISODE_PARAMETERS


@dataclass(frozen=True)
class Parameter:
    """One common parameter: its default, its constraints and its documentation.

    Parameters
    ----------
    default : None, bool, int, float or str
        The value a built-in takes unless it declares another.
    constraints : list or "no_validation"
        What ``fit`` accepts (:mod:`prefopt.validation`).
    type : str
        The numpydoc type of the Parameters entry (``float or None``).
    doc : str
        The entry's description, continuation lines indented by eight spaces.

    Examples
    --------
    >>> COMMON_PARAMETERS["n_epochs"].default
    1
    """

    default: object
    constraints: object
    type: str
    doc: str


COMMON_PARAMETERS: dict[str, Parameter] = {
    "model": Parameter(
        None,
        "no_validation",
        "str, transformers config, torch module or fitted policy",
        """The starting policy, copied before training (``fit`` never mutates it):
        a local path, a config (a fresh model, seeded by ``random_state``), a
        module called like a causal LM, or a fitted :class:`SFTPolicy`.""",
    ),
    "tokenizer": Parameter(
        None,
        "no_validation",
        "str or tokenizer",
        """``None`` takes the fitted policy's, the module's ``tokenizer`` attribute
        or the path's. A pad token distinct from EOS is added when missing.""",
    ),
    "beta": Parameter(
        0.05,
        [Interval(Real, 0, None, closed="left")],
        "float",
        """KL coefficient: the reward is shaped with -beta * log(pi/pi_ref).""",
    ),
    "kl": Parameter(
        None,
        [KLController, None],
        "FixedKLController or AdaptiveKLController",
        """How beta changes; ``None`` keeps it fixed. A controller with
        ``beta=None`` starts from this estimator's ``beta``.""",
    ),
    "kl_estimator": Parameter(
        "k1",
        [StrOptions({"k1", "k2", "k3"})],
        '{"k1", "k2", "k3"}',
        """Per-token KL estimator (Schulman 2020); k1 in the reward, as Ziegler et al. 2019.""",
    ),
    "learning_rate": Parameter(
        None,
        # math.inf as the open right bound: an infinite rate is refused like a negative one
        [Interval(Real, 0, math.inf, closed="neither"), AdaptiveLR, None],
        "float, AdaptiveLR or None",
        """``None`` (the default) on a language model adapts the rate: after each
        update one pass without gradients measures the policy's change on the
        step's tokens (``optim/policy_kl``, the mean KL per token between the
        policy before and after), and the rate is cut by 1.5 above {lr_high},
        raised by 1.5 below {lr_low} (an :class:`~prefopt.AdaptiveLR` of target
        {lr_target}: rl_games' and rsl_rl's rule; Schulman et al. 2017 adapt PPO's
        KL penalty so{lr_anneal}), within [1e-6, 10 times its start]: {tiny_learning_rate}
        under 10M parameters (``tiny_model_learning_rate``), else 3e-6 (Huang
        et al.); log-linear policies (exact worlds): a fixed 0.1. A number is a
        fixed rate (``lr_schedule`` applies); an ``AdaptiveLR`` its own rule.""",
    ),
    "optimizer": Parameter(
        "adam",
        [StrOptions({"adam", "sgd"})],
        '{"adam", "sgd"}',
        """Adam uses eps=1e-5 and no weight decay, as the original code.""",
    ),
    "lr_schedule": Parameter(
        "linear",
        [StrOptions({"constant", "linear"})],
        '{"linear", "constant"}',
        """"linear" anneals a fixed learning rate to 0 over the run, as the original
        code.""",
    ),
    "max_grad_norm": Parameter(
        None,
        [Interval(Real, 0, None, closed="neither"), None],
        "float",
        """Clip the gradient norm; ``None`` does not clip (the original code).""",
    ),
    "n_steps": Parameter(
        100,
        [Interval(Integral, 0, None, closed="left")],  # 0: the starting policy
        "int",
        """Optimisation steps; each samples ``batch_size`` episodes. ``0`` sets the
        starting policy up untrained (the starting row of a comparison).""",
    ),
    "batch_size": Parameter(
        64,
        [Interval(Integral, 1, None, closed="left")],
        "int",
        """Episodes (prompt, response pairs) per step.""",
    ),
    "n_epochs": Parameter(
        1,
        [Interval(Integral, 1, None, closed="left")],
        "int",
        """Passes over each batch.""",
    ),
    "n_minibatches": Parameter(
        1,
        [Interval(Integral, 1, None, closed="left")],
        "int",
        """Gradient steps per pass.""",
    ),
    "micro_batch_size": Parameter(
        None,
        [Interval(Integral, 1, None, closed="left"), None],
        "int",
        """Run each minibatch's training passes on this many episodes at a time and
        step once on the accumulated gradient (gradient accumulation, TRL's
        ``per_device_train_batch_size``): the same gradient as the whole
        minibatch, for less activation memory. It must divide the minibatch,
        ``batch_size // n_minibatches``; the passes without gradients (the
        reference, the update's measured policy change) go in parts of the same
        size. ``None`` runs each minibatch at once. How a loss is summed over the
        parts is the algorithm's ``loss_reduction``. Not in a distributed fit.""",
    ),
    "temperature": Parameter(
        None,
        [Interval(Real, 0, None, closed="neither"), None],
        "float",
        """Sampling temperature, also applied to every log-prob. ``None`` reads the
        model's generation config, else 0.7 (Ziegler et al. 2019).""",
    ),
    "max_new_tokens": Parameter(
        None,
        [Interval(Integral, 1, None, closed="left"), None],
        "int",
        """Tokens sampled per response (fixed length, truncated after the first
        EOS). ``None`` reads the model's generation config, else 53 (Huang et al. 2024).""",
    ),
    "missing_eos_reward": Parameter(
        -1.0,
        [Real, None],
        "float or None",
        """A response with no EOS gets this reward, *replacing* its score (the
        EOS trick of Huang et al. 2024; TRL instead subtracts a penalty). ``None`` keeps
        the score.""",
    ),
    "stop_token_ids": Parameter(
        None,
        ["array-like", Interval(Integral, 0, None, closed="left"), None],
        "int or list of int",
        """The ids that end a response: sampling stops there, the response is cut
        after the first, and a response without one gets ``missing_eos_reward``.
        ``None`` takes the model's ``generation_config.eos_token_id`` (chat models
        often list several, e.g. an end of turn) and the tokenizer's EOS.""",
    ),
    "random_state": Parameter(
        None,
        ["random_state"],
        "int, RandomState instance or None",
        """Same seed, same CPU run. No global seed is set.""",
    ),
    "verbose": Parameter(
        0,
        ["verbose"],
        "int",
        """``1`` prints a line (step, reward, KL, losses) every 10 steps and at the
        last, ``2`` every step; no ``logging`` setup needed. Both first print
        the response length (``max_new_tokens_``) and where it came from.""",
    ),
    "warm_start": Parameter(
        False,
        ["boolean"],
        "bool",
        """Continue from the fitted state (model, reference, optimiser, beta,
        history) for ``n_steps`` more steps instead of starting over; a linear
        schedule anneals again over those steps.""",
    ),
    "checkpoint_dir": Parameter(
        None,
        [str, os.PathLike, None],
        "str or path",
        """Save the run every ``checkpoint_every`` steps (and at the end) to this
        folder, atomically (write, then rename), as JSON and safetensors (no
        pickle). ``fit`` with the same folder, parameters and prompts resumes
        from the checkpoint and ends as the uninterrupted run would, weights
        and ``history_`` included; other parameters (except ``n_steps`` and
        those that only watch the run) or other prompts are refused by name.
        A clone (every candidate and seed of a search) writes to its own
        sub-folder, named from its parameters and prompts.""",
    ),
    "checkpoint_every": Parameter(
        10,
        [Interval(Integral, 1, None, closed="left")],
        "int",
        """Steps between checkpoints.""",
    ),
    "truncate_prompts": Parameter(
        False,
        ["boolean"],
        "bool",
        """A prompt longer than the context minus ``max_new_tokens`` raises an
        error; with True it is cut at the last paragraph (else sentence)
        boundary that fits, keeping its beginning, as Huang et al. 2024 do.
        Put any instruction that must survive at the start.""",
    ),
    "max_kl": Parameter(
        None,
        [Interval(Real, 0, None, closed="neither"), None],
        "float",
        """A step whose mean KL to the reference exceeds this warns or stops the
        run (``max_kl_action``); the last checkpoint stays intact.""",
    ),
    "max_kl_action": Parameter(
        "warn",
        [StrOptions({"warn", "raise"})],
        '{"warn", "raise"}',
        "",
    ),
    "min_eos_share": Parameter(
        0.5,
        [Interval(Real, 0, 1, closed="both"), None],
        "float or None",
        """Warn when fewer responses than this end with EOS: the fixed
        ``missing_eos_reward`` then dominates the reward.""",
    ),
    "on_unhealthy": Parameter(
        "warn",
        [StrOptions({"warn", "raise", "stop", "ignore"})],
        '{"warn", "raise", "stop", "ignore"}',
        """What a run-health detector that fires does: warn (one
        :class:`~prefopt.exceptions.RunHealthWarning` per detector per fit),
        raise :class:`~prefopt.exceptions.RunHealthError`, warn and stop the
        run after that step, or only record it in ``health_``. The detectors
        and their default thresholds: ``reward_collapse`` (the smoothed reward
        stays below the first 5 steps' mean by more than 0.28 of their
        per-episode spread for 8 consecutive steps), ``empty_responses`` (the
        smoothed share of empty responses above 0.8), ``repetitive_responses``
        (over half a response's trigrams repeated, on average), ``kl_blowup``
        (the smoothed KL per response token above 1.2 nats while the reward is
        below its start, above 2.1 nats while it is above), ``dead_groups`` (k >
        1: over 90% of groups with equal scores while the reward has not risen),
        ``non_finite`` (a nan or inf in the step's row) and ``no_learning`` (at
        the end: the log-probs never moved 1e-4 nats a token from the
        reference's).""",
    ),
    "entropy_coef": Parameter(
        0.0,
        [Interval(Real, 0, None, closed="left")],
        "float",
        """Weight of an entropy bonus in the policy loss: minus this times the
        policy's mean per-token entropy on the minibatch's responses (at the
        training temperature, with gradients) is added to any algorithm's loss.
        Without a KL penalty it is reported not to prevent degeneration.""",
    ),
    "ptx_coef": Parameter(
        0.0,
        [Interval(Real, 0, None, closed="left")],
        "float",
        """Weight of a next-token loss on pretraining text (``fit(...,
        ptx_data=texts)``) added to the policy loss, as InstructGPT's PPO-ptx
        (Ouyang et al. 2022), against the alignment tax: each update minibatch
        adds this times the mean cross-entropy of as many texts, drawn at
        random, tokenised once per fit and cut to the model's context.""",
    ),
    "refit_every": Parameter(
        None,
        [Interval(Integral, 1, None, closed="left"), None],
        "int",
        """Online reward learning (Ziegler et al. 2019): every this many steps,
        the step's samples of each prompt are paired ((0, 1), (2, 3), ... of
        its k; at k = 1 a second sample is drawn), labelled by ``fit(...,
        labeler=...)`` (pairs of equal text dropped), and a copy of the
        current reward is trained further on them (its ``partial_fit``: a
        warm start, then normalised again on the starting policy's samples,
        so beta keeps its meaning). The reward passed to ``fit`` is never
        changed; ``reward_model_`` is the last refit, and ``history_`` logs
        ``reward/refits``, ``reward/new_labels`` and the accuracy of the
        reward before each refit on its new labels. ``None`` keeps the
        reward fixed (offline, the default).""",
    ),
    "lora": Parameter(
        None,
        "no_validation",
        "dict or peft.LoraConfig",
        """Train a LoRA adapter (peft) instead of all weights, e.g.
        ``{"r": 8, "lora_alpha": 16, "target_modules": ["c_attn"]}``. The
        reference is then the frozen base with the adapter disabled, so its
        weights are not copied.""",
    ),
    "gradient_checkpointing": Parameter(
        False,
        ["boolean"],
        "bool",
        """Recompute each transformer layer's activations in the backward pass
        instead of keeping them (transformers' gradient checkpointing,
        non-reentrant), in the policy and in a transformers value model: less
        memory for about one more forward pass per minibatch, the same
        gradients. Sampling (with its KV cache) and the passes without
        gradients are unchanged. A model that comes with it on keeps it on.""",
    ),
    "reward_weights": Parameter(
        None,
        ["array-like", None],
        "list of float or None",
        """With a list of rewards (``fit(prompts, [r1, r2])``): one finite
        weight >= 0 per reward; the score is the weighted sum, and
        ``history_`` logs each reward's ``rewards/<name>/mean`` and
        ``rewards/<name>/std``. ``None`` weighs each reward 1 (TRL's
        ``reward_weights``).""",
    ),
    "vllm_importance_sampling_cap": Parameter(
        None,
        [Interval(Real, 0, None, closed="neither"), None],
        "float or None",
        """With ``set_config(generation="vllm")``: truncated importance sampling
        (Yao et al. 2025; TRL's ``vllm_importance_sampling_cap``, whose
        default is 2.0) against the gap between the engine that samples and
        the policy that learns (another kernel or precision). Each response
        token's gradient through the current log-probs is multiplied by
        ``min(exp(old_logprob - engine_logprob), cap)``, detached, the old
        log-prob being the policy's at sampling time; the loss values logged
        are unchanged, and ``history_`` gains ``engine/is_weight_mean`` and
        ``engine/is_truncated_share``. The weights reach every term of the
        algorithm's loss that reads the log-probs (GRPO's KL term too), not
        the entropy bonus or the pretraining loss. The native sampler samples
        from the policy itself, where every weight is exactly 1: the
        parameter then changes nothing. ``None`` applies no correction; the
        gap (``engine/logprob_gap_mean``, ``engine/logprob_gap_max``,
        ``engine/kl``) is logged under the engine either way.""",
    ),
    "max_staleness": Parameter(
        None,
        [Interval(Integral, 0, None, closed="left"), None],
        "int or None",
        """Overlapped rollouts (docs/guide/overlap.rst): a process of its own samples
        the next batches while this one trains, so a batch is up to this many
        updates old; the loss corrects for it (``off_policy_cap``). 0: the
        synchronous fit exactly. CPU or CUDA, a process a rank under DDP; a
        script needs ``if __name__ == "__main__":``. ``None``: synchronous.""",
    ),
    "off_policy_cap": Parameter(
        2.0,
        [Interval(Real, 0, None, closed="neither"), None],
        "float or None",
        """With ``max_staleness`` >= 1, each token's gradient times ``min(pi_prox /
        mu, cap)`` (mu sampled, pi_prox before this update): truncated
        importance sampling without a ratio (Yao et al. 2025), AReaL's decoupled
        PPO objective with a clipped one (Fu et al. 2025). ``inf``: untruncated;
        ``None``: no correction.""",
    ),
}
COMMON_PARAMETERS.update({n: Parameter(*p) for n, p in EPISODE_PARAMETERS.items()})

COMMON_CONSTRAINTS = {name: p.constraints for name, p in COMMON_PARAMETERS.items()}
