"""The pure functions of the algorithms, checked against hand-computed numbers.

Formulas: PPO as Huang et al. 2024 and Ziegler et al. 2019 describe it; REINFORCE and RLOO
as Ahmadian et al. 2024; RAFT as Dong et al. 2023; the padding rules of Huang et al. 2024.
"""

from types import SimpleNamespace

import pytest
import torch

from prefopt.backend.generation import (
    EncodedPrompts,
    pad_left,
    pad_right,
    position_ids_from_mask,
    truncate_after_eos,
)
from prefopt.policies import (
    PPOPolicy,
    RAFTPolicy,
    ReinforcePolicy,
    RLOOPolicy,
    RolloutBatch,
    masked_mean,
    masked_whiten,
)
from prefopt.policies.ppo import clipped_surrogate, clipped_value_loss, gae
from prefopt.policies.raft import best_of_k_mask
from prefopt.policies.reinforce import MovingAverageBaseline
from prefopt.policies.rloo import (
    leave_one_out_advantages,
    sequence_policy_gradient_loss,
)

D = torch.float64


def t(values):
    return torch.tensor(values, dtype=D)


def close(actual, expected, atol=1e-10):
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


# ---------------------------------------------------------------------------
# RLOO: A_i = R_i - mean_{j != i} R_j (Ahmadian et al. 2024)
# ---------------------------------------------------------------------------


def test_rloo_k2_hand_numbers():
    # group (1, 3): 1 - 3 = -2, 3 - 1 = 2; group (0, 4): -4, 4; group (5, 5): 0, 0
    close(
        leave_one_out_advantages(t([1.0, 3.0, 0.0, 4.0, 5.0, 5.0]), k=2),
        [-2.0, 2.0, -4.0, 4.0, 0.0, 0.0],
    )


def test_rloo_k3_hand_numbers():
    # group (1, 2, 6): baselines (2+6)/2 = 4, (1+6)/2 = 3.5, (1+2)/2 = 1.5
    #   -> advantages 1-4 = -3, 2-3.5 = -1.5, 6-1.5 = 4.5
    # group (0, 0, 3): baselines 1.5, 1.5, 0 -> -1.5, -1.5, 3
    close(
        leave_one_out_advantages(t([1.0, 2.0, 6.0, 0.0, 0.0, 3.0]), k=3),
        [-3.0, -1.5, 4.5, -1.5, -1.5, 3.0],
    )


@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_rloo_identity_and_zero_sum(k):
    g = torch.Generator().manual_seed(k)
    rewards = torch.randn(5 * k, generator=g, dtype=D)
    adv = leave_one_out_advantages(rewards, k)
    grouped = rewards.reshape(5, k)
    # R_i - b_i = k/(k-1) * (R_i - group mean)
    expected = k / (k - 1) * (grouped - grouped.mean(1, keepdim=True))
    close(adv, expected.reshape(-1), atol=1e-12)
    close(adv.reshape(5, k).sum(1), torch.zeros(5), atol=1e-12)


def test_rloo_baseline_stays_within_group():
    # A constant shift of one group must not change the other group's advantages.
    a = leave_one_out_advantages(t([1.0, 2.0, 10.0, 20.0]), k=2)
    b = leave_one_out_advantages(t([1.0, 2.0, 110.0, 120.0]), k=2)
    close(a, b)
    close(a, [-1.0, 1.0, -10.0, 10.0])


@pytest.mark.parametrize("k", [1, 0])
def test_rloo_needs_k_at_least_2(k):
    with pytest.raises(ValueError, match="k >= 2"):
        leave_one_out_advantages(t([1.0, 2.0]), k=k)


def test_rloo_size_not_divisible_by_k():
    with pytest.raises(ValueError, match="groups of k=2"):
        leave_one_out_advantages(t([1.0, 2.0, 3.0]), k=2)
    with pytest.raises(ValueError, match="groups of k=4"):
        leave_one_out_advantages(t([1.0] * 6), k=4)


def test_sequence_loss_sums_tokens_not_averages():
    # seq 0: log-probs -1, -2 (third masked) -> sum -3; seq 1: -0.5 -> -0.5
    # loss = -mean(A_i * S_i) = -(2 * -3 + (-1) * -0.5) / 2 = -(-6 + 0.5)/2 = 2.75
    logprobs = t([[-1.0, -2.0, -100.0], [-0.5, -7.0, -7.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    close(sequence_policy_gradient_loss(t([2.0, -1.0]), logprobs, mask), 2.75)


def test_rloo_k2_loss_is_the_contrastive_form():
    # Two prompts, k = 2. Prompt 0: R+ = 3 (seq 0), R- = 1 (seq 1);
    # prompt 1: R- = -2 (seq 2), R+ = 0.5 (seq 3).
    rewards = t([3.0, 1.0, -2.0, 0.5])
    logprobs = t([[-0.1, -0.2, -9.0], [-1.0, -9.0, -9.0], [-0.3, -0.3, -0.3], [-2.0, -0.5, -9.0]])
    mask = t([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    # sums S = [-0.3, -1.0, -0.9, -2.5]
    adv = leave_one_out_advantages(rewards, k=2)
    close(adv, [2.0, -2.0, -2.5, 2.5])
    loss = sequence_policy_gradient_loss(adv, logprobs, mask)
    # contrastive: per prompt 1/2 (R+ - R-)(log pi(y+) - log pi(y-)), averaged over prompts
    # and negated: prompt 0: 0.5 * 2 * (-0.3 + 1.0) = 0.7; prompt 1: 0.5 * 2.5 * (-2.5 + 0.9)
    # = -2.0; loss = -(0.7 - 2.0) / 2 = 0.65
    close(loss, 0.65)
    s = (logprobs * mask).sum(1)
    contrastive = 0.5 * (rewards[0] - rewards[1]) * (s[0] - s[1]) + 0.5 * (
        rewards[3] - rewards[2]
    ) * (s[3] - s[2])
    close(loss, -contrastive / 2)


def test_rloo_policy_advantages_use_shaped_sequence_reward():
    # RolloutBatch.sequence_rewards = score - beta * sum_t kl_t
    # scores [1, 2, 0, 0]; kl sums [0.3, 0.5, 0, 1]; beta 0.1 -> R = [0.97, 1.95, 0, -0.1]
    n = 4
    zeros = torch.zeros(n, 3, dtype=D)
    batch = RolloutBatch(
        prompts=EncodedPrompts(torch.ones(n, 1, dtype=torch.long), torch.ones(n, 1)),
        prompt_index=torch.tensor([0, 0, 1, 1]),
        response_ids=torch.zeros(n, 3, dtype=torch.long),
        response_mask=t([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]]),
        ended=torch.ones(n, dtype=torch.bool),
        old_logprobs=zeros,
        ref_logprobs=zeros,
        scores=t([1.0, 2.0, 0.0, 0.0]),
        kl=t([[0.1, 0.2, 0], [0.5, 0, 0], [0, 0, 0], [0.5, 0.5, 0]]),
        rewards=zeros,
        beta=0.1,
    )
    close(batch.sequence_rewards, [0.97, 1.95, 0.0, -0.1])
    close(batch.last_index.to(D), [1.0, 0.0, 2.0, 1.0])
    batch.advantages = RLOOPolicy(k=2).compute_advantages(batch)
    # LOO for k = 2: [0.97 - 1.95, 1.95 - 0.97, 0 + 0.1, -0.1 - 0] = [-0.98, 0.98, 0.1, -0.1]
    close(batch.advantages, [-0.98, 0.98, 0.1, -0.1], atol=1e-12)


# ---------------------------------------------------------------------------
# PPO clipped surrogate: mean max(-A rho, -A clip(rho, 0.8, 1.2)) (Schulman et al. 2017)
# ---------------------------------------------------------------------------

# Six tokens: A = +1/-1, rho inside and outside [0.8, 1.2].
ADV = t([[1.0, -1.0, 1.0, -1.0, 1.0, -1.0]])
RATIO = t([[1.1, 1.1, 1.5, 0.5, 0.5, 1.5]])
# per-token max(-A rho, -A clip(rho)):
#  A=+1 rho=1.1: max(-1.1, -1.1) = -1.1   not clipped
#  A=-1 rho=1.1: max( 1.1,  1.1) =  1.1   not clipped
#  A=+1 rho=1.5: max(-1.5, -1.2) = -1.2   clipped (the gain is capped)
#  A=-1 rho=0.5: max( 0.5,  0.8) =  0.8   clipped
#  A=+1 rho=0.5: max(-0.5, -0.8) = -0.5   not clipped (pessimistic: unclipped is larger)
#  A=-1 rho=1.5: max( 1.5,  1.2) =  1.5   not clipped
# mean = (-1.1 + 1.1 - 1.2 + 0.8 - 0.5 + 1.5) / 6 = 0.6 / 6 = 0.1; clipfrac 2/6


def test_clipped_surrogate_hand_numbers():
    old = t([[-1.0, -2.0, -0.5, -3.0, -1.0, -0.2]])
    logprobs = old + RATIO.log()
    loss, clipfrac = clipped_surrogate(ADV, logprobs, old, torch.ones_like(ADV))
    close(loss, 0.1, atol=1e-12)
    close(clipfrac, 2 / 6, atol=1e-12)


def test_clipped_surrogate_mask_excludes_tokens():
    # Append a masked token with a huge ratio and advantage: nothing changes.
    adv = torch.cat([ADV, t([[50.0]])], 1)
    logprobs = torch.cat([RATIO.log(), t([[5.0]])], 1)
    mask = torch.cat([torch.ones_like(ADV), t([[0.0]])], 1)
    loss, clipfrac = clipped_surrogate(adv, logprobs, torch.zeros_like(adv), mask)
    close(loss, 0.1, atol=1e-12)
    close(clipfrac, 2 / 6, atol=1e-12)


def test_clipped_surrogate_two_rows_masked_mean_over_tokens():
    # Row 0 holds tokens 0-3, row 1 tokens 4-5 (rest masked); mean over the 6 valid tokens.
    adv = t([[1.0, -1.0, 1.0, -1.0], [1.0, -1.0, 9.0, 9.0]])
    ratio = t([[1.1, 1.1, 1.5, 0.5], [0.5, 1.5, 3.0, 3.0]])
    mask = t([[1, 1, 1, 1], [1, 1, 0, 0]])
    loss, clipfrac = clipped_surrogate(adv, ratio.log(), torch.zeros_like(adv), mask)
    close(loss, 0.1, atol=1e-12)
    close(clipfrac, 2 / 6, atol=1e-12)


def test_clipped_surrogate_without_clip():
    # unclipped: -A rho = [-1.1, 1.1, -1.5, 0.5, -0.5, 1.5] -> mean 0 / 6 = 0
    loss, clipfrac = clipped_surrogate(
        ADV, RATIO.log(), torch.zeros_like(ADV), torch.ones_like(ADV), clip=False
    )
    close(loss, 0.0, atol=1e-12)
    close(clipfrac, 2 / 6, atol=1e-12)  # still reported, as a diagnostic


def test_clipped_surrogate_other_clip_coef():
    # eps = 0.6: all ratios lie in [0.4, 1.6], nothing is clipped -> same as clip=False
    loss, clipfrac = clipped_surrogate(
        ADV, RATIO.log(), torch.zeros_like(ADV), torch.ones_like(ADV), clip_coef=0.6
    )
    close(loss, 0.0, atol=1e-12)
    close(clipfrac, 0.0)


def test_clipped_surrogate_gradient_vanishes_where_clipped():
    logprobs = RATIO.log().clone().requires_grad_(True)
    loss, _ = clipped_surrogate(ADV, logprobs, torch.zeros_like(ADV), torch.ones_like(ADV))
    loss.backward()
    # d/dlogpi of -A rho / 6 = -A rho / 6 where unclipped, 0 where clipped
    expected = [-1.1 / 6, 1.1 / 6, 0.0, 0.0, -0.5 / 6, 1.5 / 6]
    close(logprobs.grad, [expected], atol=1e-12)


def test_clipped_surrogate_ratio_one_at_first_epoch():
    # logpi == logpi_old: loss = -mean(A) over valid tokens = -(2 - 1 + 5) / 3 = -2
    adv = t([[2.0, -1.0, 5.0, 100.0]])
    lp = t([[-1.0, -2.0, -3.0, -4.0]])
    loss, clipfrac = clipped_surrogate(adv, lp, lp, t([[1, 1, 1, 0]]))
    close(loss, -2.0)
    close(clipfrac, 0.0)


def test_surrogate_without_ratio_is_vanilla_policy_gradient():
    # -A logpi: A = [2, -1], logpi = [-0.5, -2.0] -> [1.0, -2.0], mean -0.5 (3rd token masked)
    adv = t([[2.0, -1.0, 7.0]])
    lp = t([[-0.5, -2.0, -1.0]])
    old = t([[-5.0, -5.0, -5.0]])  # ignored without the ratio
    loss, clipfrac = clipped_surrogate(adv, lp, old, t([[1, 1, 0]]), use_ratio=False)
    close(loss, -0.5)
    close(clipfrac, 0.0)


# ---------------------------------------------------------------------------
# Clipped value loss: 0.5 mean max((V - G)^2, (clip(V, V_old +- 0.2) - G)^2)
# ---------------------------------------------------------------------------


def test_clipped_value_loss_hand_numbers():
    values = t([[1.0, 1.0, 0.5, 0.1, 9.0]])
    old = t([[0.0, 0.0, 0.0, 0.0, 0.0]])
    returns = t([[1.0, 0.0, 0.5, 0.3, -9.0]])
    mask = t([[1, 1, 1, 1, 0]])
    # token 0: V=1, clip -> 0.2, G=1: max(0, 0.64) = 0.64 (pessimistic: clipped is larger)
    # token 1: V=1, clip -> 0.2, G=0: max(1, 0.04) = 1.0 (the unclipped error is kept)
    # token 2: V=0.5, clip -> 0.2, G=0.5: max(0, 0.09) = 0.09 (clip is around V_old=0, not
    #          around the return; around G it would be 0)
    # token 3: V=0.1 inside [-0.2, 0.2]: max(0.04, 0.04) = 0.04
    # 0.5 * (0.64 + 1 + 0.09 + 0.04) / 4 = 0.5 * 1.77 / 4 = 0.22125
    close(clipped_value_loss(values, old, returns, mask), 0.22125, atol=1e-12)
    # clip=False: 0.5 * (0 + 1 + 0 + 0.04) / 4 = 0.13
    close(clipped_value_loss(values, old, returns, mask, clip=False), 0.13, atol=1e-12)


def test_clipped_value_loss_clip_coef_and_nonzero_old():
    # V_old = 1, V = 2, G = 3, eps = 0.5: clip(V) = 1.5: max((2-3)^2, (1.5-3)^2) = 2.25
    # -> 0.5 * 2.25 = 1.125
    close(
        clipped_value_loss(t([[2.0]]), t([[1.0]]), t([[3.0]]), t([[1]]), clip_coef=0.5),
        1.125,
        atol=1e-12,
    )


# ---------------------------------------------------------------------------
# GAE: delta_t = r_t + gamma V_{t+1} - V_t, V = 0 after the last token
# ---------------------------------------------------------------------------

# Row 0: three valid tokens, then two pad positions holding garbage that must not leak.
REWARDS = t([[0.1, -0.2, 1.0, 5.0, 5.0], [2.0, 5.0, 5.0, 5.0, 5.0]])
VALUES = t([[0.5, 0.4, 0.3, 9.0, 9.0], [0.5, 9.0, 9.0, 9.0, 9.0]])
MASK = t([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])


def test_gae_hand_example_gamma1_lam095():
    adv, ret = gae(REWARDS, VALUES, MASK, gamma=1.0, lam=0.95)
    # row 0: delta_2 = 1.0 + 0 - 0.3 = 0.7      (V_3 = 0: no bootstrap from the pad)
    #        delta_1 = -0.2 + 0.3 - 0.4 = -0.3
    #        delta_0 = 0.1 + 0.4 - 0.5 = 0.0
    #        A_2 = 0.7; A_1 = -0.3 + 0.95 * 0.7 = 0.365; A_0 = 0 + 0.95 * 0.365 = 0.34675
    # row 1: one token: A_0 = 2.0 - 0.5 = 1.5
    close(adv, [[0.34675, 0.365, 0.7, 0, 0], [1.5, 0, 0, 0, 0]], atol=1e-12)
    # returns = A + V: [0.84675, 0.765, 1.0]; [2.0]
    close(ret, [[0.84675, 0.765, 1.0, 0, 0], [2.0, 0, 0, 0, 0]], atol=1e-12)


def test_gae_lambda1_is_return_to_go_minus_value():
    adv, ret = gae(REWARDS, VALUES, MASK, gamma=1.0, lam=1.0)
    # return-to-go row 0: [0.1 - 0.2 + 1, -0.2 + 1, 1] = [0.9, 0.8, 1.0]
    # minus V [0.5, 0.4, 0.3] = [0.4, 0.4, 0.7]
    close(adv, [[0.4, 0.4, 0.7, 0, 0], [1.5, 0, 0, 0, 0]], atol=1e-12)
    close(ret, [[0.9, 0.8, 1.0, 0, 0], [2.0, 0, 0, 0, 0]], atol=1e-12)


def test_gae_lambda1_discounted():
    adv, _ = gae(REWARDS, VALUES, MASK, gamma=0.5, lam=1.0)
    # discounted return-to-go: G_2 = 1, G_1 = -0.2 + 0.5 = 0.3, G_0 = 0.1 + 0.15 = 0.25
    # minus V: [-0.25, -0.1, 0.7]
    close(adv[0], [-0.25, -0.1, 0.7, 0, 0], atol=1e-12)


def test_gae_lambda0_is_one_step_td():
    adv, ret = gae(REWARDS, VALUES, MASK, gamma=1.0, lam=0.0)
    # A_t = r_t + V_{t+1} - V_t = [0.0, -0.3, 0.7]
    close(adv, [[0.0, -0.3, 0.7, 0, 0], [1.5, 0, 0, 0, 0]], atol=1e-12)
    # returns r_t + V_{t+1}: [0.5, 0.1, 1.0]
    close(ret[0], [0.5, 0.1, 1.0, 0, 0], atol=1e-12)


def test_gae_masked_positions_never_leak():
    # Changing rewards and values at masked positions changes nothing.
    other_r = REWARDS.clone()
    other_v = VALUES.clone()
    other_r[MASK == 0] = -123.0
    other_v[MASK == 0] = 456.0
    a1, r1 = gae(REWARDS, VALUES, MASK, 1.0, 0.95)
    a2, r2 = gae(other_r, other_v, MASK, 1.0, 0.95)
    close(a1, a2)
    close(r1, r2)


def test_ppo_returns_computed_before_whitening():
    batch = SimpleNamespace(response_mask=MASK, rewards=REWARDS, values=VALUES)
    batch.advantages, batch.returns = PPOPolicy().compute_advantages(batch)  # whitened
    # returns = A + V from the un-whitened GAE advantages (Huang et al. 2024)
    close(batch.returns, [[0.84675, 0.765, 1.0, 0, 0], [2.0, 0, 0, 0, 0]], atol=1e-12)
    # advantages are whitened over the 4 valid tokens [0.34675, 0.365, 0.7, 1.5]:
    # mean 2.91175 / 4 = 0.7279375; deviations -0.3811875, -0.3629375, -0.0279375, 0.7720625;
    # population var (0.14530391 + 0.13172363 + 0.00078050 + 0.59608050) / 4 = 0.21847214
    # -> whitened [-0.8155313, -0.7764863, -0.0597709, 1.6517885]; pads stay 0
    close(
        batch.advantages,
        [[-0.8155313, -0.7764863, -0.0597709, 0, 0], [1.6517885, 0, 0, 0, 0]],
        atol=1e-6,
    )
    valid = batch.advantages[MASK.bool()]
    close(valid.mean(), 0.0, atol=1e-7)
    close(valid.pow(2).mean(), 1.0, atol=1e-6)


# ---------------------------------------------------------------------------
# masked_mean / masked_whiten
# ---------------------------------------------------------------------------


def test_masked_mean_hand_numbers():
    close(
        masked_mean(t([[1.0, 2.0, 100.0], [3.0, 50.0, 50.0]]), t([[1, 1, 0], [1, 0, 0]])), 2.0
    )  # (1 + 2 + 3) / 3
    close(masked_mean(t([[5.0]]), t([[0]])), 0.0)  # empty mask: 0, not NaN


def test_masked_whiten_population_variance():
    # [1, 2, 3, 4]: mean 2.5, population var 1.25 (unbiased would be 5/3)
    # (x - 2.5) / sqrt(1.25) = [-1.3416408, -0.4472136, 0.4472136, 1.3416408]
    x = t([[1.0, 2.0, 3.0, 4.0]])
    out = masked_whiten(x, torch.ones_like(x))
    s = 1.25**0.5
    close(out, [[-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s]], atol=1e-7)
    close(out, [[-1.3416408, -0.4472136, 0.4472136, 1.3416408]], atol=1e-7)


def test_masked_whiten_respects_mask():
    # valid values 1 and 3 (over two rows): mean 2, var 1 -> -1, 1; pads become 0
    x = t([[1.0, 100.0], [3.0, -100.0]])
    mask = t([[1, 0], [1, 0]])
    close(masked_whiten(x, mask), [[-1.0, 0.0], [1.0, 0.0]], atol=1e-7)


def test_masked_whiten_keep_mean():
    # shift_mean=False: (x - 2.5)/sqrt(1.25) + 2.5 = [1.1583592, 2.0527864, 2.9472136, 3.8416408]
    x = t([[1.0, 2.0, 3.0, 4.0, 77.0]])
    mask = t([[1, 1, 1, 1, 0]])
    out = masked_whiten(x, mask, shift_mean=False)
    close(out, [[1.1583592, 2.0527864, 2.9472136, 3.8416408, 0.0]], atol=1e-7)
    close(masked_mean(out, mask), 2.5, atol=1e-12)  # the mean is kept


# ---------------------------------------------------------------------------
# REINFORCE moving-average baseline (Ahmadian et al. 2024, eq. 8)
# ---------------------------------------------------------------------------


def test_moving_average_baseline_running_mean_over_uneven_batches():
    b = MovingAverageBaseline()
    assert b.value == 0.0
    b.add([1.0, 3.0])
    assert b.value == 2.0
    # mean over all rewards (1 + 3 + 8) / 3 = 4, not the mean of batch means (2 + 8)/2 = 5
    b.add(torch.tensor([8.0]))
    assert b.value == pytest.approx(4.0)
    b.add([0.0, 0.0, 0.0, 0.0])  # (12 + 0) / 7
    assert b.value == pytest.approx(12 / 7)
    assert b.count == 7


def test_reinforce_baseline_excludes_current_batch():
    policy = ReinforcePolicy()
    policy.baseline_ = MovingAverageBaseline()
    policy.baseline_.add([1.0, 3.0])  # earlier batch: baseline 2
    batch = SimpleNamespace(sequence_rewards=t([5.0, 7.0]))
    # baseline from before this batch: [5 - 2, 7 - 2] = [3, 5]
    # (including it would give (1+3+5+7)/4 = 4 -> [1, 3])
    close(policy.compute_advantages(batch), [3.0, 5.0])
    policy.after_update(batch)
    assert policy.baseline_.value == pytest.approx(4.0)


def test_reinforce_first_batch_has_zero_baseline():
    policy = ReinforcePolicy()
    policy.baseline_ = MovingAverageBaseline()
    batch = SimpleNamespace(sequence_rewards=t([5.0, -1.0]))
    close(policy.compute_advantages(batch), [5.0, -1.0])


# ---------------------------------------------------------------------------
# RAFT best of k (per prompt, ties to the first)
# ---------------------------------------------------------------------------


def test_best_of_k_one_per_group():
    # groups (0.1, 0.9, 0.5) -> index 1; (-3, -1, -2) -> index 1... and (7, 0, 8) -> index 2
    mask = best_of_k_mask(t([0.1, 0.9, 0.5, -3.0, -1.0, -2.0, 7.0, 0.0, 8.0]), k=3)
    assert mask.tolist() == [False, True, False, False, True, False, False, False, True]
    assert mask.reshape(3, 3).sum(1).tolist() == [1, 1, 1]
    assert mask.dtype == torch.bool


def test_best_of_k_local_not_global():
    # Group 1's best (0.2) is below every sample of group 0; it is still kept.
    mask = best_of_k_mask(t([5.0, 6.0, 0.1, 0.2]), k=2)
    assert mask.tolist() == [False, True, False, True]


def test_best_of_k_ties_go_to_first():
    mask = best_of_k_mask(t([1.0, 1.0, 0.0, 2.0, 2.0, 2.0, 0.0, 3.0, 3.0]), k=3)
    assert mask.tolist() == [True, False, False, True, False, False, False, True, False]


def test_best_of_k_with_k1_keeps_everything():
    assert best_of_k_mask(t([3.0, -1.0]), k=1).tolist() == [True, True]


def test_best_of_k_skips_dead_groups_when_asked():
    # (0, 0, 0): all failed, nothing ranks them; (1, 1, 1): all equal too; (0, 1, 1): the first 1
    rewards = t([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    mask = best_of_k_mask(rewards, k=3, skip_dead_groups=True)
    assert mask.tolist() == [False, False, False, False, False, False, False, True, False]
    # groups of one are not dead: k=1 keeps everything either way
    assert best_of_k_mask(t([3.0, 3.0]), k=1, skip_dead_groups=True).tolist() == [True, True]


def test_raft_skips_dead_groups_by_default():
    # two prompts, k=2: the first group all failed, the second is ranked
    batch = SimpleNamespace(scores=t([0.0, 0.0, 0.0, 1.0]), rlhf_rewards=t([0.0, 0.0, 0.0, 1.0]))
    close(RAFTPolicy(k=2).compute_advantages(batch), [0.0, 0.0, 0.0, 1.0])
    close(RAFTPolicy(k=2, skip_dead_groups=False).compute_advantages(batch), [1.0, 0.0, 0.0, 1.0])
    # ranked by the shaped reward, a group is dead by its scores: the KL term tells two
    # wrong answers apart, and the one nearer the reference is no better an answer
    shaped = SimpleNamespace(scores=t([0.0, 0.0]), rlhf_rewards=t([-0.2, -0.1]))
    close(RAFTPolicy(k=2, rank_by="shaped").compute_advantages(shaped), [0.0, 0.0])
    close(RAFTPolicy(k=2, skip_dead_groups=False).compute_advantages(shaped), [0.0, 1.0])
    # ... and a group the scores rank keeps its best by the shaped reward
    ranked = SimpleNamespace(scores=t([1.0, 0.0]), rlhf_rewards=t([-0.5, -0.1]))
    close(RAFTPolicy(k=2, rank_by="shaped").compute_advantages(ranked), [0.0, 1.0])


def test_raft_rank_by_score_or_shaped():
    # scores (1.0, 0.9); KL sums (1.0, 0.0); beta 0.5: shaped (0.5, 0.9)
    batch = SimpleNamespace(scores=t([1.0, 0.9]), rlhf_rewards=t([0.5, 0.9]))
    close(RAFTPolicy(k=2, rank_by="score").compute_advantages(batch), [1.0, 0.0])
    close(RAFTPolicy(k=2, rank_by="shaped").compute_advantages(batch), [0.0, 1.0])
    # the default is the shaped ranking, as Ahmadian et al. (2024) run RAFT
    close(RAFTPolicy(k=2).compute_advantages(batch), [0.0, 1.0])


def test_best_of_k_judges_dead_groups_by_the_scores_it_is_given():
    shaped, scores = t([0.3, 0.1, 0.2, 0.4]), t([1.0, 1.0, 0.0, 1.0])
    assert best_of_k_mask(shaped, k=2, skip_dead_groups=True).tolist() == [True, False, False, True]
    kept = best_of_k_mask(shaped, k=2, skip_dead_groups=True, scores=scores)
    assert kept.tolist() == [False, False, False, True]
    with pytest.raises(ValueError, match="scores have shape \\(3,\\).*one score for each"):
        best_of_k_mask(shaped, k=2, skip_dead_groups=True, scores=t([1.0, 1.0, 0.0]))


# ---------------------------------------------------------------------------
# Padding, truncation and positions (Huang et al. 2024)
# ---------------------------------------------------------------------------


def test_truncate_after_eos_first_token():
    ids, mask, ended = truncate_after_eos(torch.tensor([[2, 5, 6]]), 2, 0)
    assert ids.tolist() == [[2, 0, 0]]
    assert mask.tolist() == [[1, 0, 0]]
    assert ended.tolist() == [True]


def test_truncate_after_eos_last_token_and_none():
    ids, mask, ended = truncate_after_eos(torch.tensor([[5, 6, 2], [5, 6, 7]]), 2, 0)
    assert ids.tolist() == [[5, 6, 2], [5, 6, 7]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert ended.tolist() == [True, False]


def test_truncate_after_first_of_several_eos():
    # Everything after the first EOS becomes pad, even later EOS tokens.
    ids, mask, ended = truncate_after_eos(torch.tensor([[5, 2, 2, 7], [2, 2, 2, 2]]), 2, 9)
    assert ids.tolist() == [[5, 2, 9, 9], [2, 9, 9, 9]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    assert ended.tolist() == [True, True]


def test_truncate_without_eos_token_id():
    raw = torch.tensor([[5, 2, 7], [1, 1, 1]])
    ids, mask, ended = truncate_after_eos(raw, None, 0)
    assert ids.tolist() == raw.tolist()
    assert mask.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert ended.tolist() == [True, True]


def test_pad_left():
    enc = pad_left([[1, 2, 3], [4], [5, 6]], pad_token_id=0)
    assert enc.input_ids.tolist() == [[1, 2, 3], [0, 0, 4], [0, 5, 6]]
    assert enc.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    enc = pad_left([[7], []], pad_token_id=9)
    assert enc.input_ids.tolist() == [[7], [9]]
    assert enc.attention_mask.tolist() == [[1], [0]]


def test_pad_right():
    ids, mask = pad_right([[1, 2, 3], [4]], pad_token_id=0)
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    ids, mask = pad_right([[1, 2, 3], [4]], pad_token_id=9, width=2)  # truncates
    assert ids.tolist() == [[1, 2], [4, 9]]
    assert mask.tolist() == [[1, 1], [1, 0]]
    ids, mask = pad_right([[1], []], pad_token_id=9, width=3)  # pads beyond the longest
    assert ids.tolist() == [[1, 9, 9], [9, 9, 9]]
    assert mask.tolist() == [[1, 0, 0], [0, 0, 0]]


def test_position_ids_from_mask():
    # left padding: real tokens count 0, 1, 2 whatever the padding
    assert position_ids_from_mask(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])).tolist() == [
        [0, 0, 0, 1, 2],
        [0, 1, 2, 3, 4],
    ]
    # prompt then response, as in the training forward
    enc = pad_left([[1, 2, 3], [4]], 0)
    full = torch.cat([enc.attention_mask, torch.ones(2, 2, dtype=torch.long)], 1)
    assert position_ids_from_mask(full).tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]
