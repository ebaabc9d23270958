"""GRPO: group-normalised advantages, PPO's clip per token, the KL as a k3 loss term.

Shao et al. 2024 (DeepSeekMath). The k samples of a prompt form a group; a
sample's advantage is its score minus the group's mean (the sample included),
divided by the group's std, and every token of the response carries it. The
loss of a token is PPO's clipped surrogate plus beta times the k3 estimate of
the KL to the reference at that token; the token losses are then aggregated
in one of three ways (``loss_type``).
"""

from __future__ import annotations

from numbers import Integral, Real

import torch

from ..backend import distributed
from ..kl import FixedKLController, kl_estimate
from ..validation import Interval, StrOptions
from ._base import BasePolicy, make_init
from ._docs import fill
from ._group import (  # noqa: F401 (re-exported: prefopt.policies.grpo's public functions)
    STD_EPS,
    aggregate_token_loss,
    clipped_surrogate,
    group_advantages,
    overlong_penalty,
    sequence_log_ratio,
)
from .loop import Minibatch, RolloutBatch, masked_mean

__all__ = ["GRPOPolicy", "aggregate_token_loss", "group_advantages"]


class _GroupSize(Interval):
    """k >= 2, with the reason in the error message."""

    def __str__(self) -> str:
        return (
            "an int >= 2 (a group of one sample has no std, and its advantage "
            "r - group mean is always 0)"
        )


class GRPOPolicy(BasePolicy):
    """Group Relative Policy Optimisation (Shao et al., 2024), with Dr. GRPO and DAPO losses.

    Per step: sample k responses per prompt, score them, give each the
    advantage (r - group mean) / group std, then minimise per token
    -min(rho A, clip(rho, 1 - eps, 1 + eps) A) + beta * k3, with
    rho = pi/pi_old and k3 = pi_ref/pi - log(pi_ref/pi) - 1 at the sampled
    token, aggregated over tokens as ``loss_type`` says.

    Parameters
    ----------
    {common_parameters}
    beta : float
        KL coefficient: weight of the k3 term per token of the loss (DeepSeekMath's 0.04);
        the reward is not shaped.
    k : int, default=8
        Samples per prompt, a group (``batch_size / k`` prompts per step);
        TRL's ``num_generations``. At least 2.
    scale_rewards : {"group", "batch", "none"}, default="group"
        Divide the centred rewards by the group's std (Shao et al. 2024), by
        the batch's std (the mean stays the group's), or not at all (Liu et
        al. 2025: dividing by the group std up-weights groups whose samples
        nearly tie). The std is Bessel-corrected, plus 1e-4, as TRL.
    loss_type : {"dapo", "grpo", "dr_grpo"}, default="dapo"
        How token losses become one loss: ``"grpo"`` the mean over each
        sequence's tokens then over sequences (Shao et al. 2024);
        ``"dr_grpo"`` the sum over tokens divided by the number of sequences
        times ``max_new_tokens`` (Liu et al. 2025); ``"dapo"`` the sum over
        tokens divided by the number of response tokens in the step's batch
        (Yu et al. 2025; TRL's default).
    clip_coef : float, default=0.2
        Epsilon of the clipped ratio (DeepSeekMath does not state it; 0.2 is
        PPO's and TRL's), in (0, 1): the ratio is clipped to [1 - clip_coef,
        1 + epsilon_high].
    epsilon_high : float, default=None
        The upper clip bound, DAPO's clip-higher (Yu et al. 2025, who use 0.28
        with ``clip_coef=0.2``); ``None`` is ``clip_coef``, a symmetric clip.
    importance_sampling_level : {"token", "sequence"}, default="token"
        ``"sequence"`` is GSPO (Zheng et al. 2025): one ratio per response,
        s_i = exp(mean_t log(pi/pi_old)), clipped per sequence and broadcast
        to its tokens (TRL's option of the same name); with
        ``loss_type="grpo"`` the loss is the paper's
        -mean_i min(s_i A_i, clip(s_i) A_i).
    mask_truncated : bool, default=False
        Leave responses with no stop token (cut at ``max_new_tokens``) out of
        the loss (DAPO's overlong filtering, Yu et al. 2025; TRL's
        ``mask_truncated_completions``); they still count in their group's
        advantages.
    overlong_cache : int, default=None
        DAPO's soft overlong punishment (Yu et al. 2025): with L_max =
        ``max_new_tokens`` and L_cache this many tokens, a response of length
        ``|y| > L_max - L_cache`` gets ``((L_max - L_cache) - |y|) / L_cache`` added to
        its reward (-1 at L_max) before the advantages (logged as
        ``policy/overlong_penalty``). Pair it with
        ``missing_eos_reward=None``, or a cut response is punished twice.
    dynamic_sampling : bool, default=False
        DAPO's dynamic sampling (Yu et al. 2025): groups whose rewards are all
        equal (zero advantage, no gradient) are dropped and the batch is
        topped up with groups of freshly drawn prompts, up to
        ``max_resamples`` extra rounds; a batch still short is filled with
        dropped groups. ``history_`` logs ``sampling/extra_generations`` (the
        completions sampled beyond the batch, over all ranks),
        ``sampling/dropped_groups`` and ``sampling/rounds``.
    max_resamples : int, default=4
        The cap on dynamic sampling's extra rounds per step.
    log_kl : bool, default=False
        At ``beta=0`` with a fixed KL coefficient the KL plays no part in the
        loss, so the reference pass is skipped and ``objective/kl`` reads 0
        (unless ``max_kl`` watches it); ``True`` runs it to measure the KL
        anyway.

    Attributes
    ----------
    {common_attributes}

    See Also
    --------
    RLOOPolicy, PPOPolicy, ReinforcePolicy

    Notes
    -----
    How GRPO differs from :class:`RLOOPolicy`:

    1. The baseline is the group's mean *with* the sample, not the mean of
       the other k - 1. Alone (``scale_rewards="none"``) that only scales the
       expected gradient of the reward by (k - 1)/k, so the fixed point is the
       one of beta * k/(k - 1); with the std division the advantage of a
       sample depends on itself through the std, so the estimator is biased.
    2. The centred rewards are divided by a std (``scale_rewards``), which
       makes them unitless and amplifies near-tied groups; RLOO leaves them
       near 0.
    3. The KL is a loss term, beta times the k3 estimator per token, not
       -beta times k1 in the reward. In expectation the gradient of k3 at a
       token is that of KL(pi_ref || pi) at that token's prefix, the
       *forward* KL, node by node: GRPO's fixed point is not the closed-form
       optimum pi_ref exp(r/beta)/Z that RLOO reaches: on
       :class:`~prefopt.worlds.TinyLMWorld` at beta = 0.3 and k = 4 they are
       0.21 apart in total variation (``tests/test_grpo.py``).
    4. The ratio and its clip are per token, as PPO's; RLOO has no ratio.
    5. Token losses are averaged, not summed over the response as RLOO's
       sequence log-prob. The original per-sequence mean (``"grpo"``) gives
       each token of a short response more weight than one of a long
       response, so a positive advantage favours short responses and a
       negative one long responses: a length bias (Liu et al. 2025).
       ``"dr_grpo"`` divides by a constant instead, and ``"dapo"`` by the
       tokens of the whole batch.

    Defaults. ``beta=0.04`` is DeepSeekMath's. TRL now defaults to 0, as Dr.
    GRPO and DAPO argue for rule-checked rewards; against a learned reward
    model the KL is what keeps the policy where the reward is valid (Ziegler
    et al. 2019; Gao et al. 2022), and with beta = 0 there is no optimum to
    measure a run against. ``k=8`` is TRL's ``num_generations``.
    ``batch_size=256``: 32 prompts a step. With 8 prompts a step (a batch of
    64, this policy's default until issue 35) the default adaptive rate
    spends each update's small, fixed policy change mostly on sampling
    noise, and GRPO does not learn ArithmeticWorld: after 300 steps
    held-out pass@1 ended below the start of 0.331 on all five seeds
    (mean 0.315), where 256 ends at 0.408-0.434 (mean 0.417; Llama's
    shape 0.149 -> 0.190; ``benchmarks/defaults_5seeds.py``). The 4 times
    as many episodes are not the reason: 75 steps of 256 (the episodes of
    300 of 64) ended at 0.309 (seed 1000). The field's GRPO runs take more
    prompts still (DeepSeekMath: 1,024 samples a step).

    ``n_epochs=1`` and ``n_minibatches=1``: one gradient step per batch, as
    DeepSeekMath ("a single update following each exploration stage") and
    TRL's ``num_iterations=1``; the ratio is then exactly 1, the clip never
    binds, and the old log-probs are the training pass's own, detached (no
    extra forward pass). With ``n_epochs`` > 1 or ``n_minibatches`` > 1 the
    old log-probs come from a pass identical to training and the clip binds
    (``policy/clipfrac`` > 0).

    ``"dapo"`` divides by the response tokens of the step's whole batch even
    when the batch is split into ``n_minibatches`` gradient steps, as TRL
    divides by the tokens of the whole generation batch
    (``num_items_in_batch``): each minibatch's loss is its share of one
    batch-level token mean. ``"dr_grpo"`` and ``"grpo"`` normalise within the
    minibatch, as TRL does within a micro-batch.

    Here ``beta`` weighs the k3 term of the loss; the reward is not shaped.
    ``kl_estimator`` only selects the estimator of the logged
    ``objective/kl`` (and of the KL an adaptive ``kl`` controller steers);
    the loss always uses k3. ``history_`` adds ``loss/policy`` (the clipped
    surrogate), ``loss/kl`` (beta times the aggregated k3, so the two sum to
    the loss), ``policy/k3`` (mean k3 per token), ``policy/clipfrac``,
    ``policy/approxkl``, ``policy/ratio_mean`` and ``policy/zero_std_share``
    (groups whose samples all scored the same, whose advantages are 0).

    References
    ----------
    Z. Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning
    in Open Language Models", arXiv:2402.03300, 2024.
    Z. Liu et al., "Understanding R1-Zero-Like Training: A Critical
    Perspective", arXiv:2503.20783, 2025.
    Q. Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at
    Scale", arXiv:2503.14476, 2025.
    J. Schulman, "Approximating KL Divergence", 2020.

    Examples
    --------
    >>> import prefopt
    >>> from prefopt import GRPOPolicy
    >>> from prefopt.worlds import PreferenceWorld
    >>> prefopt.set_config(show_progress_bar=False)
    >>> world = PreferenceWorld(random_state=0)
    >>> grpo = GRPOPolicy(model=world.policy_model(), beta=0.3, k=4, learning_rate=0.3,
    ...                   optimizer="sgd", n_steps=5, random_state=0)
    >>> grpo = grpo.fit(world.prompts, world.true_quality)
    >>> grpo.history_[-1]["step"], grpo.history_[-1]["policy/clipfrac"]
    (5, 0.0)
    """

    _parameter_constraints = {
        **BasePolicy._parameter_constraints,
        "k": [_GroupSize(Integral, 2, None, closed="left")],
        "scale_rewards": [StrOptions({"group", "batch", "none"})],
        "loss_type": [StrOptions({"grpo", "dr_grpo", "dapo"})],
        # 1 - clip_coef is the ratio's lower bound: at 1 or more, clipping below never acts.
        "clip_coef": [Interval(Real, 0, 1, closed="neither")],
        "epsilon_high": [Interval(Real, 0, None, closed="neither"), None],
        "importance_sampling_level": [StrOptions({"token", "sequence"})],
        "mask_truncated": ["boolean"],
        "overlong_cache": [Interval(Integral, 1, None, closed="left"), None],
        "dynamic_sampling": ["boolean"],
        "max_resamples": [Interval(Integral, 0, None, closed="left")],
        "log_kl": ["boolean"],
    }

    samples_per_prompt = "k"
    tiny_model_learning_rate = 1e-4  # learning_rate=None on a tiny model: LR_SWEEP.md, rule 2
    kl_penalty = "loss"

    @property
    def uses_ratio(self) -> bool:
        """Whether the loss needs old log-probs from a separate pass.

        With one gradient step per batch the policy has not moved when the loss
        is taken, so the training pass's own detached log-probs are pi_old.
        """
        return self.n_epochs > 1 or self.n_minibatches > 1

    @property
    def loss_reduction(self) -> str:
        """How the loss reduces a minibatch (``micro_batch_size`` sums its parts by it).

        ``"grpo"`` and ``"dr_grpo"`` are means over the rows (of each row's token
        mean, or of its token sum over ``max_new_tokens``); ``"dapo"`` divides the
        token sum by the whole batch's token count, whatever the minibatch holds.
        """
        return "sum" if self.loss_type == "dapo" else "sequence_mean"

    @property
    def needs_reference(self) -> bool:
        """Whether a rollout runs the reference pass.

        At beta = 0 under a fixed coefficient (TRL's default) the k3 term weighs
        nothing, so the pass is skipped unless ``log_kl`` asks for the KL.
        """
        fixed = self.kl is None or isinstance(self.kl, FixedKLController)
        # max_kl watches the KL, so it needs the KL measured too.
        return self.log_kl or self.max_kl is not None or not (fixed and self.beta_ == 0)

    # Only what this algorithm changes of the common parameters (policies/_params.py)
    # and its own parameters; make_init writes the explicit keyword-only signature.
    __init__ = make_init(
        batch_size=256,
        beta=0.04,
        k=8,
        scale_rewards="group",
        loss_type="dapo",
        clip_coef=0.2,
        epsilon_high=None,
        importance_sampling_level="token",
        mask_truncated=False,
        overlong_cache=None,
        dynamic_sampling=False,
        max_resamples=4,
        log_kl=False,
    )

    def compute_advantages(self, batch: RolloutBatch):
        """Group-normalised advantages of the scores (the KL is not in the reward).

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts, k samples per prompt together.

        Returns
        -------
        advantages : torch.Tensor of shape (n,)
        """
        rewards = batch.sequence_rewards
        if self.overlong_cache is not None:
            rewards = rewards + self._overlong(batch)
        return group_advantages(rewards, self.k, self.scale_rewards, across_ranks=True)

    def _loss_mask(self, batch: RolloutBatch) -> torch.Tensor:
        """The tokens the loss counts: the responses', less cut ones with ``mask_truncated``."""
        if not self.mask_truncated:
            return batch.response_mask
        return batch.response_mask * batch.ended[:, None].to(batch.response_mask.dtype)

    def _setup(self, reward, start_model, *, seed: int):
        start_key = super()._setup(reward, start_model, seed=seed)
        cache = self.overlong_cache
        if cache is not None and cache > self.max_new_tokens_:  # refused before any step
            raise ValueError(
                f"overlong_cache={cache} is larger than max_new_tokens={self.max_new_tokens_} "
                f"(from {self._max_new_tokens_from}); the soft interval L_max - L_cache .. "
                f"L_max would start below 0. Give overlong_cache <= {self.max_new_tokens_}, "
                "or raise max_new_tokens."
            )
        return start_key

    def _overlong(self, batch: RolloutBatch) -> torch.Tensor:
        """DAPO's soft overlong penalty of each response of ``batch``."""
        cache = self.overlong_cache
        return overlong_penalty(batch.response_mask.sum(1), self.max_new_tokens_, cache).to(
            batch.scores.dtype
        )

    def compute_loss(self, batch: RolloutBatch, minibatch: Minibatch):
        """Clipped surrogate plus beta * k3 per token, aggregated by ``loss_type``.

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts, with advantages.
        minibatch : Minibatch
            The rows and the current policy's log-probs.

        Returns
        -------
        loss : torch.Tensor
        stats : dict
        """
        mask, logprobs = minibatch.mask, minibatch.logprobs
        old = minibatch.old_logprobs if self.uses_ratio else logprobs.detach()
        advantages = minibatch.advantages[:, None]
        log_ratio = logprobs - old
        if self.importance_sampling_level == "sequence":  # GSPO (Zheng et al. 2025)
            log_ratio = sequence_log_ratio(log_ratio, mask)
        if self.mask_truncated:  # DAPO's overlong filtering: cut responses out of the loss
            mask = mask * batch.ended[minibatch.rows][:, None].to(mask.dtype)
        high = self.clip_coef if self.epsilon_high is None else self.epsilon_high
        surrogate, unclipped, clipped = clipped_surrogate(
            log_ratio, advantages, self.clip_coef, high
        )
        # k3 = pi_ref/pi - log(pi_ref/pi) - 1 at the sampled token (Shao et al. 2024, eq. 4;
        # Schulman 2020): its expected gradient is that of KL(pi_ref || pi) at the prefix.
        k3 = kl_estimate(logprobs, minibatch.ref_logprobs, "k3")
        aggregate = {
            "loss_type": self.loss_type,
            "max_new_tokens": self.max_new_tokens_,
            # Distributed fits: the global token count over world size, so that DDP's average
            # of the ranks' losses divides the global token sum by the global count.
            "n_tokens": distributed.global_count(
                int(self._loss_mask(batch).sum()), across_ranks=True
            )
            / distributed.world_size()
            if self.loss_type == "dapo"
            else None,
        }
        policy_loss = aggregate_token_loss(surrogate, mask, **aggregate)
        kl_loss = batch.beta * aggregate_token_loss(k3, mask, **aggregate)
        log_ratio = (logprobs - old).detach()
        scores = batch.scores.reshape(-1, self.k)
        ranks = {"across_ranks": True}  # the figures over every rank's tokens
        stats = {
            "loss/policy": policy_loss.item(),
            "loss/kl": kl_loss.item(),
            "policy/k3": masked_mean(k3.detach(), mask, **ranks).item(),
            "policy/clipfrac": masked_mean((clipped < unclipped).float(), mask, **ranks).item(),
            "policy/approxkl": 0.5 * masked_mean(log_ratio**2, mask, **ranks).item(),
            "policy/ratio_mean": masked_mean(log_ratio.exp(), mask, **ranks).item(),
            "policy/zero_std_share": (scores == scores[:, :1]).all(1).float().mean().item(),
        }
        if self.overlong_cache is not None:
            stats["policy/overlong_penalty"] = self._overlong(batch).mean().item()
        return policy_loss + kl_loss, stats


GRPOPolicy.__doc__ = fill(GRPOPolicy)
