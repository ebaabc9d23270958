"""The GRPO family's options against hand computations on a two-sample batch.

GSPO's sequence-level ratio (Zheng et al. 2025); DAPO's clip-higher, truncated-response
masking, soft overlong penalty and dynamic sampling (Yu et al. 2025); no reference pass
at beta = 0 (TRL's default) unless the KL is asked for.
"""

import math
from collections import Counter

import numpy as np
import pytest
import torch
from _tiny import small_policy, tiny_lm

import prefopt
from prefopt import GRPOPolicy
from prefopt.backend.generation import EncodedPrompts
from prefopt.policies import Minibatch, RolloutBatch
from prefopt.policies.grpo import overlong_penalty, sequence_log_ratio
from prefopt.policies.loop._dynamic import varied_groups
from prefopt.worlds import PreferenceWorld

D = torch.float64
MASK = [[1, 1, 1], [1, 0, 0]]  # a 3-token and a 1-token response


def t(values):
    return torch.tensor(values, dtype=D)


def close(actual, expected, atol=1e-10):
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


def hand_batch(ended=(True, True)):
    """Scores [1, 0] in one group (k = 2): with scale "none", A = [0.5, -0.5].

    pi_old = 1/1.5, 1/1.1, 1 on row 0's tokens and 2 on row 1's, so at log pi = 0 the
    token ratios are rho = [1.5, 1.1, 1] and [0.5].
    """
    n = 2
    zeros = torch.zeros(n, 3, dtype=D)
    return RolloutBatch(
        prompts=EncodedPrompts(torch.ones(n, 1, dtype=torch.long), torch.ones(n, 1)),
        prompt_index=torch.tensor([0, 0]),
        response_ids=torch.zeros(n, 3, dtype=torch.long),
        response_mask=t(MASK),
        ended=torch.tensor(ended),
        old_logprobs=torch.log(t([[1 / 1.5, 1 / 1.1, 1.0], [1 / 0.5, 1.0, 1.0]])),
        ref_logprobs=zeros,
        scores=t([1.0, 0.0]),
        kl=zeros,
        rewards=zeros,
        beta=0.0,
        kl_in_reward=False,
    )


def loss_of(policy, batch):
    policy.max_new_tokens_ = 3  # what fit resolves
    batch.advantages = policy.compute_advantages(batch)
    logprobs = torch.zeros(2, 3, dtype=D, requires_grad=True)
    minibatch = Minibatch(batch, torch.tensor([0, 1]), logprobs, torch.zeros(2, 3, dtype=D))
    loss, stats = policy.compute_loss(batch, minibatch)
    loss.backward()
    return loss, stats, logprobs.grad


def test_clip_higher_raises_only_the_upper_bound():
    # rho = [1.5, 1.1, 1] with A = 0.5: -min(rho A, clip(rho, 0.8, 1.28) A) = [-0.64, -0.55,
    # -0.5]; rho = 0.5 with A = -0.5: -min(-0.25, 0.8 * -0.5) = 0.4, the lower bound as before.
    policy = GRPOPolicy(k=2, scale_rewards="none", n_minibatches=2, epsilon_high=0.28)
    loss, stats, grad = loss_of(policy, hand_batch())
    close(loss, (-0.64 - 0.55 - 0.5 + 0.4) / 4)
    assert stats["policy/clipfrac"] == pytest.approx(2 / 4)
    close(grad, t([[0.0, -0.55 / 4, -0.5 / 4], [0.0, 0.0, 0.0]]))
    # Symmetric (epsilon_high=None): the first token is clipped at 1.2 instead.
    symmetric, _, _ = loss_of(GRPOPolicy(k=2, scale_rewards="none", n_minibatches=2), hand_batch())
    close(symmetric, (-0.6 - 0.55 - 0.5 + 0.4) / 4)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_gspo_clips_one_geometric_mean_ratio_per_sequence(loss_type):
    # s_0 = (1.5 * 1.1 * 1)^(1/3) = 1.1816 (inside [0.8, 1.2]): every token of row 0 has
    # loss -s_0 * 0.5. s_1 = 0.5 with A = -0.5: clipped to 0.8, loss 0.4.
    s0 = 1.65 ** (1 / 3)
    policy = GRPOPolicy(
        k=2,
        scale_rewards="none",
        n_minibatches=2,
        importance_sampling_level="sequence",
        loss_type=loss_type,
    )
    loss, stats, grad = loss_of(policy, hand_batch())
    if loss_type == "grpo":  # the paper's objective: the mean over sequences
        close(loss, (-0.5 * s0 + 0.4) / 2)
        weight = 1 / 2
    else:  # DAPO's token mean: 3 tokens of row 0, 1 of row 1
        close(loss, (3 * -0.5 * s0 + 0.4) / 4)
        weight = 1 / 4
    assert stats["policy/clipfrac"] == pytest.approx(1 / 4)  # row 1's one token
    # d s_0 / d log pi_t = s_0 / 3. "grpo": row 0's loss is the mean of three equal token
    # losses, -A s_0, so -0.5 s_0 / 3 per token, halved by the mean over sequences; "dapo":
    # three token losses -A s_0 each over 4 tokens, 3 * -0.5 * (s_0 / 3) / 4.
    per_token = {"grpo": -0.5 * s0 / 3, "dapo": 3 * -0.5 * s0 / 3}[loss_type]
    close(grad, t([[per_token * weight] * 3, [0.0] * 3]))


def test_sequence_log_ratio_is_the_masked_mean():
    lr = t([[0.3, -0.6, 0.0], [2.0, 5.0, 5.0]])  # row 1's last two tokens are padding
    close(sequence_log_ratio(lr, t(MASK)), [[-0.1] * 3, [2.0] * 3])


def test_mask_truncated_leaves_cut_responses_out_of_the_loss():
    # Row 1 has no EOS: only row 0's 3 tokens count, and DAPO divides by them.
    policy = GRPOPolicy(k=2, scale_rewards="none", mask_truncated=True)
    loss, _, grad = loss_of(policy, hand_batch(ended=(True, False)))
    close(loss, -0.5 * 3 / 3)  # one pass: rho = 1, surrogate -A = -0.5 per token
    close(grad, t([[-0.5 / 3] * 3, [0.0] * 3]))
    unmasked, _, _ = loss_of(GRPOPolicy(k=2, scale_rewards="none"), hand_batch((True, False)))
    close(unmasked, (-1.5 + 0.5) / 4)


def test_soft_overlong_penalty_hand_numbers():
    # L_max = 8, L_cache = 4: 0 up to 4 tokens, then (4 - |y|) / 4, -1 at 8.
    close(
        overlong_penalty(torch.tensor([1, 4, 5, 6, 8]), 8, 4).to(D),
        [0.0, 0.0, -0.25, -0.5, -1.0],
        atol=1e-7,
    )
    # In the advantages: L_max = 3, L_cache = 3: lengths 3 and 1 get -1 and -1/3, so the
    # rewards [1, 0] become [0, -1/3] and A (scale "none") is [1/6, -1/6].
    policy = GRPOPolicy(k=2, scale_rewards="none", overlong_cache=3)
    policy.max_new_tokens_ = 3
    close(policy.compute_advantages(hand_batch()), [1 / 6, -1 / 6], atol=1e-7)
    _, stats, _ = loss_of(policy, hand_batch())
    assert stats["policy/overlong_penalty"] == pytest.approx(-2 / 3)
    with pytest.raises(ValueError, match=r"overlong_cache=5 must be between 1 and"):
        overlong_penalty(torch.tensor([1]), 3, 5)


def test_varied_groups():
    assert varied_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0]), 2).tolist() == [
        False,
        True,
        False,
    ]


# ----- on the loop ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world():
    prefopt.set_config(show_progress_bar=False)
    return PreferenceWorld(random_state=0)


class Recording(GRPOPolicy):
    """GRPO that keeps every step's scores (what the advantages were computed on)."""

    def compute_advantages(self, batch):
        self.seen_ = getattr(self, "seen_", []) + [batch.scores.clone()]
        return super().compute_advantages(batch)


def test_dynamic_sampling_drops_tied_groups_and_tops_up(world):
    first = world.prompts[0]

    def reward(prompts, completions):  # varies on the first prompt only
        return np.array(
            [float(len(c)) if p == first else 1.0 for p, c in zip(prompts, completions)]
        )

    policy = small_policy(
        world,
        Recording,
        k=2,
        batch_size=4,
        n_steps=3,
        learning_rate=0.1,
        dynamic_sampling=True,
        max_resamples=6,
        random_state=0,
    ).fit(world.prompts, reward)
    for row, scores in zip(policy.history_, policy.seen_):
        assert scores.shape == (4,)  # the batch keeps its size
        assert row["sampling/extra_generations"] == 4 * row["sampling/rounds"]
        if row["sampling/rounds"] < 6:  # it stopped because the batch was full
            assert varied_groups(scores, 2).all()
    assert any(row["sampling/rounds"] > 0 for row in policy.history_)

    def tie(prompts, completions):
        return np.ones(len(completions))

    tied = Recording(
        model=world.policy_model(),
        k=2,
        batch_size=4,
        n_steps=1,
        dynamic_sampling=True,
        max_resamples=2,
        random_state=0,
    ).fit(world.prompts, tie)
    row = tied.history_[0]
    # Every group ties: two extra rounds of 4 completions, then the batch is refilled.
    assert (row["sampling/rounds"], row["sampling/extra_generations"]) == (2.0, 8.0)
    assert row["sampling/dropped_groups"] == 6 - 2 and tied.seen_[0].shape == (4,)


def _reference_calls(beta, **kw):
    model = tiny_lm()
    calls = Counter()
    handle = model.register_forward_hook(lambda m, a, o: calls.update([id(m)]))
    policy = GRPOPolicy(
        model=model,
        beta=beta,
        k=2,
        max_new_tokens=3,
        batch_size=4,
        n_steps=2,
        min_eos_share=None,
        random_state=0,
        **kw,
    ).fit(["the movie was", "the plot was"], lambda p, c: [float(len(x)) for x in c])
    handle.remove()
    return calls[id(policy.ref_model_)], calls[id(policy.model_)], policy


def test_no_reference_pass_at_beta_zero_unless_log_kl():
    ref, own, policy = _reference_calls(0.0)
    assert ref == 0 and own > 0
    assert all(row["objective/kl"] == 0.0 for row in policy.history_)
    measured, _, policy = _reference_calls(0.0, log_kl=True)
    assert math.isfinite(policy.history_[-1]["objective/kl"])
    shaped, _, _ = _reference_calls(0.04)
    # One pass a step, as at beta > 0: two calls on shared prompts (the distinct prompts,
    # then the responses on their cache), over two steps.
    assert measured == shaped == 4


# ----- REINFORCE++ ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "k, returns",
    [
        # Per-token rewards -beta*KL, the score at the last token: row 0 [-0.1, -0.2, 1 - 0.1],
        # row 1 [2 - 0.3]. Returns (sums to the end): [0.6, 0.7, 0.9] and [1.7].
        (1, [[0.6, 0.7, 0.9], [1.7, 0.0, 0.0]]),
        # k = 2: the group's mean score 1.5 leaves each last token first.
        (2, [[-0.9, -0.8, -0.6], [0.2, 0.0, 0.0]]),
    ],
)
def test_reinforce_pp_whitens_token_returns_over_the_batch(k, returns):
    from prefopt.policies.reinforce_pp import reinforce_pp_advantages

    rewards = t([[-0.1, -0.2, 0.9], [1.7, 0.0, 0.0]])
    tokens = np.array([returns[0][0], returns[0][1], returns[0][2], returns[1][0]])
    mean, std = tokens.mean(), np.sqrt(tokens.var() + 1e-8)  # population std, over 4 tokens
    expected = (np.array(returns) - mean) / std * np.array(MASK)
    got = reinforce_pp_advantages(rewards, t(MASK), t([1.0, 2.0]), k)
    close(got, expected, atol=1e-9)


def test_reinforce_pp_fits_with_groups(world):
    policy = small_policy(
        world,
        prefopt.ReinforcePlusPlusPolicy,
        k=2,
        batch_size=4,
        n_steps=2,
        n_minibatches=2,
        learning_rate=0.1,
        random_state=0,
    ).fit(world.prompts, world.true_quality)
    assert [row["step"] for row in policy.history_] == [1, 2]
    assert 0.0 <= policy.history_[-1]["policy/clipfrac"] <= 1.0


def test_max_kl_keeps_the_reference_pass_at_beta_zero():
    ref, _, policy = _reference_calls(0.0, max_kl=100.0)
    assert ref == 4 and policy.needs_reference


def test_new_policy_lists_every_common_parameter_and_clones():
    import inspect

    from sklearn.base import clone

    from prefopt.policies import BasePolicy

    signature = inspect.signature(prefopt.ReinforcePlusPlusPolicy).parameters
    assert set(BasePolicy._common_parameters) <= set(signature)
    assert clone(prefopt.ReinforcePlusPlusPolicy(k=2, reward_weights=[1.0])).get_params()[
        "reward_weights"
    ] == [1.0]
    grpo = GRPOPolicy(epsilon_high=0.28, importance_sampling_level="sequence")
    assert clone(grpo).get_params()["epsilon_high"] == 0.28
    with pytest.raises(ValueError, match="importance_sampling_level"):
        GRPOPolicy(importance_sampling_level="tokens").fit(["a"], lambda p, c: [0.0])
