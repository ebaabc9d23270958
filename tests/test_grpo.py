"""GRPO: its pure functions against hand arithmetic, its declarations, and its exact fixed point.

Formulas: Shao et al. 2024 (DeepSeekMath) for the group advantage, the per-token clip and
the k3 term; Liu et al. 2025 (Dr. GRPO) and Yu et al. 2025 (DAPO) for the aggregations;
TRL's ``GRPOTrainer`` for the std (Bessel-corrected, plus 1e-4) and the ``"batch"`` scale.
"""

import math

import numpy as np
import pytest
import torch

import prefopt
from prefopt import GRPOPolicy
from prefopt.backend.generation import EncodedPrompts
from prefopt.policies import Minibatch, RolloutBatch
from prefopt.policies.grpo import STD_EPS, aggregate_token_loss, group_advantages
from prefopt.worlds import PreferenceWorld

D = torch.float64


def t(values):
    return torch.tensor(values, dtype=D)


def close(actual, expected, atol=1e-10):
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


@pytest.fixture(scope="module")
def world():
    prefopt.set_config(show_progress_bar=False)
    return PreferenceWorld(random_state=0)


# ---------------------------------------------------------------------------
# Advantages: (r - group mean) / (std + 1e-4), the sample in its own group
# ---------------------------------------------------------------------------


def test_advantages_for_each_scale_hand_numbers():
    r = t([1.0, 3.0, 0.0, 4.0])  # two groups of k = 2, both of mean 2
    # "none": r - group mean. The mean includes the sample: RLOO's would be [-2, 2, -4, 4].
    close(group_advantages(r, 2, "none"), [-1.0, 1.0, -2.0, 2.0])
    # "group": Bessel std of [1, 3] is sqrt(2), of [0, 4] is sqrt(8).
    s1, s2 = math.sqrt(2) + STD_EPS, math.sqrt(8) + STD_EPS
    close(group_advantages(r, 2, "group"), [-1 / s1, 1 / s1, -2 / s2, 2 / s2])
    # "batch": the group means still centre; the std is the batch's, Bessel:
    # sqrt((1 + 1 + 4 + 4) / 3) = 1.8257 -> [-0.5477, 0.5477, -1.0954, 1.0954].
    sb = math.sqrt(10 / 3) + STD_EPS
    close(group_advantages(r, 2, "batch"), [-1 / sb, 1 / sb, -2 / sb, 2 / sb])
    close(group_advantages(r, 2, "batch"), [-0.5477, 0.5477, -1.0954, 1.0954], atol=1e-4)


def test_group_std_is_bessel_corrected_and_a_tied_group_gets_zero():
    # k = 3: [0, 0, 3] has mean 1 and Bessel std sqrt(6/2) = sqrt(3) (population: sqrt(2)).
    s = math.sqrt(3) + STD_EPS
    close(group_advantages(t([0.0, 0.0, 3.0, 5.0, 5.0, 5.0]), 3), [-1 / s, -1 / s, 2 / s, 0, 0, 0])
    # Advantages sum to 0 in each group whatever the scale.
    r = torch.randn(12, dtype=D, generator=torch.Generator().manual_seed(0))
    for scale in ("group", "batch", "none"):
        close(group_advantages(r, 4, scale).reshape(3, 4).sum(1), [0.0, 0.0, 0.0])


def test_group_advantages_refuse_k1_and_ragged_groups():
    with pytest.raises(ValueError, match="no std"):
        group_advantages(t([1.0, 2.0]), 1)
    with pytest.raises(ValueError, match="groups of k=2"):
        group_advantages(t([1.0, 2.0, 3.0]), 2)


# ---------------------------------------------------------------------------
# The loss: -min(rho A, clip(rho) A) + beta k3 per token, aggregated three ways
# ---------------------------------------------------------------------------

MASK = [[1, 1, 1], [1, 0, 0]]  # a 3-token and a 1-token response


def test_aggregations_hand_numbers():
    x = t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])  # masked-out values must not count
    m = t(MASK)
    close(aggregate_token_loss(x, m, "grpo"), (2.0 + 4.0) / 2)  # mean of sequence means
    close(aggregate_token_loss(x, m, "dr_grpo"), 10.0 / (2 * 3))  # sum / (n * max_new_tokens)
    close(aggregate_token_loss(x, m, "dr_grpo", max_new_tokens=5), 10.0 / (2 * 5))
    close(aggregate_token_loss(x, m, "dapo"), 10.0 / 4)  # sum / tokens
    close(aggregate_token_loss(x, m, "dapo", n_tokens=8), 10.0 / 8)  # the batch's tokens
    with pytest.raises(ValueError, match="loss_type"):
        aggregate_token_loss(x, m, "bnpo")


def _hand_batch(beta=0.5):
    # Scores [1, 0] in one group (k = 2): with scale "none", A = [0.5, -0.5].
    # log pi = 0 everywhere; log pi_ref = -1 at three tokens, 0 at the other, so
    # log r = log(pi_ref / pi) is -1 or 0 and k3 = e^{log r} - 1 - log r is e^{-1} or 0.
    n = 2
    zeros = torch.zeros(n, 3, dtype=D)
    return RolloutBatch(
        prompts=EncodedPrompts(torch.ones(n, 1, dtype=torch.long), torch.ones(n, 1)),
        prompt_index=torch.tensor([0, 0]),
        response_ids=torch.zeros(n, 3, dtype=torch.long),
        response_mask=t(MASK),
        ended=torch.ones(n, dtype=torch.bool),
        old_logprobs=zeros,
        ref_logprobs=t([[-1.0, 0.0, -1.0], [-1.0, -5.0, -5.0]]),
        scores=t([1.0, 0.0]),
        kl=zeros,
        rewards=zeros,
        beta=beta,
        kl_in_reward=False,
    )


@pytest.mark.parametrize(
    "loss_type, policy_loss, kl_mean",
    [
        # per-token surrogate -A: [-0.5, -0.5, -0.5] and [0.5]; k3: [e, 0, e] and [e], e = 1/e.
        ("grpo", (-0.5 + 0.5) / 2, (2 / 3 + 1) / 2),  # sequence means, then their mean
        ("dr_grpo", (-1.5 + 0.5) / 6, 3 / 6),  # sums / (2 sequences * 3 tokens)
        ("dapo", (-1.5 + 0.5) / 4, 3 / 4),  # sums / 4 tokens
    ],
)
def test_loss_hand_numbers_for_each_loss_type(loss_type, policy_loss, kl_mean):
    e = math.exp(-1.0)
    batch = _hand_batch(beta=0.5)
    policy = GRPOPolicy(k=2, scale_rewards="none", loss_type=loss_type)
    policy.max_new_tokens_ = 3  # what fit resolves; dr_grpo's constant
    batch.advantages = policy.compute_advantages(batch)
    close(batch.advantages, [0.5, -0.5])
    logprobs = torch.zeros(2, 3, dtype=D, requires_grad=True)
    minibatch = Minibatch(batch, torch.tensor([0, 1]), logprobs, torch.zeros(2, 3, dtype=D))
    loss, stats = policy.compute_loss(batch, minibatch)
    kl_loss = 0.5 * kl_mean * e
    close(loss, policy_loss + kl_loss)
    assert stats["loss/policy"] == pytest.approx(policy_loss, abs=1e-12)
    assert stats["loss/kl"] == pytest.approx(kl_loss, abs=1e-12)
    assert stats["policy/k3"] == pytest.approx(3 * e / 4, abs=1e-12)  # token mean
    # One pass: the ratio is exactly 1 and nothing is clipped.
    assert stats["policy/ratio_mean"] == 1.0 and stats["policy/clipfrac"] == 0.0
    # The gradient at a token is -A + beta (1 - pi_ref/pi), times the aggregation weight.
    loss.backward()
    weight = {"grpo": [[1 / 6] * 3, [1 / 2] * 3], "dr_grpo": [[1 / 6] * 3] * 2}
    weight = t(weight.get(loss_type, [[1 / 4] * 3] * 2)) * t(MASK)
    ref = batch.ref_logprobs
    close(logprobs.grad, weight * (-batch.advantages[:, None] + 0.5 * (1 - ref.exp())))


def test_dapo_divides_a_minibatch_by_the_whole_batchs_tokens():
    # Minibatch = row 0 only (3 tokens); the batch has 4. TRL divides by the generation
    # batch's tokens (num_items_in_batch) however the batch is split into steps.
    batch = _hand_batch(beta=0.0)
    policy = GRPOPolicy(k=2, scale_rewards="none", loss_type="dapo", n_minibatches=2)
    policy.max_new_tokens_ = 3
    batch.advantages = policy.compute_advantages(batch)
    logprobs = torch.zeros(1, 3, dtype=D, requires_grad=True)
    minibatch = Minibatch(batch, torch.tensor([0]), logprobs, torch.zeros(1, 3, dtype=D))
    loss, _ = policy.compute_loss(batch, minibatch)
    close(loss, -1.5 / 4)  # not -1.5 / 3


def test_clip_hand_numbers_with_old_logprobs():
    # With two minibatches the old log-probs come from the batch: rho = pi / pi_old.
    batch = _hand_batch(beta=0.0)
    batch.old_logprobs = torch.log(t([[1 / 1.5, 1 / 1.1, 1.0], [1 / 0.5, 1.0, 1.0]]))
    policy = GRPOPolicy(k=2, scale_rewards="none", loss_type="dapo", n_minibatches=2)
    policy.max_new_tokens_ = 3
    assert policy.uses_ratio
    batch.advantages = policy.compute_advantages(batch)  # [0.5, -0.5]
    logprobs = torch.zeros(2, 3, dtype=D, requires_grad=True)
    minibatch = Minibatch(batch, torch.tensor([0, 1]), logprobs, torch.zeros(2, 3, dtype=D))
    loss, stats = policy.compute_loss(batch, minibatch)
    # rho = [1.5, 1.1, 1] with A = 0.5: -min(rho A, clip(rho) A) = [-0.6, -0.55, -0.5] (the
    # first clipped); rho = 0.5 with A = -0.5: -min(-0.25, -0.4) = 0.4 (clipped).
    close(loss, (-0.6 - 0.55 - 0.5 + 0.4) / 4)
    assert stats["policy/clipfrac"] == pytest.approx(2 / 4)
    loss.backward()
    close(logprobs.grad, t([[0.0, -0.55 / 4, -0.5 / 4], [0.0, 0.0, 0.0]]))  # clipped: no gradient


# ---------------------------------------------------------------------------
# The estimator on the shared loop
# ---------------------------------------------------------------------------


def test_declarations_and_defaults():
    policy = GRPOPolicy()
    assert GRPOPolicy.kl_penalty == "loss" and GRPOPolicy.samples_per_prompt == "k"
    assert (policy.beta, policy.k, policy.n_epochs, policy.n_minibatches) == (0.04, 8, 1, 1)
    assert (policy.scale_rewards, policy.loss_type, policy.clip_coef) == ("group", "dapo", 0.2)
    assert policy.batch_size % policy.k == 0
    # One gradient step per batch: the training pass's own log-probs are pi_old.
    assert not policy.uses_ratio
    assert GRPOPolicy(n_epochs=2).uses_ratio and GRPOPolicy(n_minibatches=2).uses_ratio
    assert "weight of the k3 term" in GRPOPolicy.__doc__


def test_fit_logs_grpo_statistics_and_the_ratio_is_one(world):
    policy = GRPOPolicy(
        model=world.policy_model(),
        beta=0.3,
        k=4,
        learning_rate=0.3,
        optimizer="sgd",
        n_steps=3,
        batch_size=16,
        random_state=0,
    ).fit(world.prompts, world.true_quality)
    row = policy.history_[-1]
    for key in (
        "loss/policy",
        "loss/kl",
        "policy/k3",
        "policy/clipfrac",
        "policy/approxkl",
        "policy/zero_std_share",
        "objective/kl",
    ):
        assert np.isfinite(row[key]), key
    assert row["loss/kl"] > 0  # the policy moved away from the reference
    assert all(
        r["policy/ratio_mean"] == 1.0 and r["policy/clipfrac"] == 0.0 for r in policy.history_
    )


class _Recorder(GRPOPolicy):
    """Records the statistics of every minibatch loss."""

    def compute_loss(self, batch, minibatch):
        loss, stats = super().compute_loss(batch, minibatch)
        self.calls_ = [*getattr(self, "calls_", []), stats]
        return loss, stats


def test_ratio_is_one_at_the_first_epoch_and_the_clip_binds_after(world):
    policy = _Recorder(
        model=world.policy_model(),
        beta=0.1,
        k=4,
        learning_rate=1.0,
        optimizer="sgd",
        lr_schedule="constant",
        n_epochs=4,
        n_steps=2,
        batch_size=16,
        random_state=0,
    ).fit(world.prompts, world.true_quality)
    calls = policy.calls_
    assert len(calls) == 2 * 4
    for step in range(2):
        first = calls[4 * step]
        # Old log-probs from a pass identical to training: exactly 1 at the first epoch.
        assert first["policy/ratio_mean"] == 1.0 and first["policy/approxkl"] == 0.0
        assert first["policy/clipfrac"] == 0.0
    # After the first epoch's step the ratio leaves [0.8, 1.2] for some tokens.
    assert max(c["policy/clipfrac"] for c in calls) > 0
    assert policy.history_[0]["policy/clipfrac"] > 0


def test_refuses_k1_and_batch_not_a_multiple_of_k(world):
    with pytest.raises(ValueError, match="group of one sample has no std"):
        GRPOPolicy(model=world.policy_model(), k=1).fit(world.prompts, world.true_quality)
    with pytest.raises(ValueError, match="multiple of k=3"):
        GRPOPolicy(model=world.policy_model(), k=3, batch_size=16).fit(
            world.prompts, world.true_quality
        )
    with pytest.raises(ValueError, match="scale_rewards"):
        GRPOPolicy(model=world.policy_model(), scale_rewards="std").fit(
            world.prompts, world.true_quality
        )
