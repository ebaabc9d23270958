"""GRPO: its pure functions against hand arithmetic, its declarations, and its exact fixed point.

Formulas: Shao et al. 2024 (DeepSeekMath) for the group advantage, the per-token clip and
the k3 term; Liu et al. 2025 (Dr. GRPO) and Yu et al. 2025 (DAPO) for the aggregations;
TRL's ``GRPOTrainer`` for the std (Bessel-corrected, plus 1e-4) and the ``"batch"`` scale.
"""

import math

import numpy as np
import pytest
import torch
from _tiny import small_policy
from scipy.optimize import brentq

import prefopt
from prefopt import GRPOPolicy
from prefopt.backend.generation import EncodedPrompts
from prefopt.policies import Minibatch, RolloutBatch
from prefopt.policies.grpo import STD_EPS, aggregate_token_loss, group_advantages
from prefopt.worlds import PreferenceWorld

# The healthy exact-world runs trip no run-health detector (issue 25).
pytestmark = pytest.mark.filterwarnings("error::prefopt.exceptions.RunHealthWarning")

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
    settings = dict(beta=0.3, k=4, learning_rate=0.3, n_steps=3, batch_size=16, random_state=0)
    policy = small_policy(world, GRPOPolicy, **settings).fit(world.prompts, world.true_quality)
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


# ---------------------------------------------------------------------------
# Acceptance: GRPO's exact fixed point on TinyLMWorld, and how far it is from RLOO's optimum
# ---------------------------------------------------------------------------

BETA, K = 0.3, 4


class _Tree:
    """TinyLMWorld's responses as a tree: a node is a content prefix shorter than max_len.

    A policy is a table of next-token distributions, one per prompt and node, over EOS and
    the content tokens: the function class of the world's policy model (a transformer that
    reads the prompt and the prefix), in which the expected update is computed exactly.
    """

    def __init__(self, world):
        self.max_len = world.max_len
        self.actions = [world.tokenizer.eos_token_id, *range(2, 2 + len(world.vocab))]
        self.nodes = sorted({r[:i] for r in world.response_ids for i in range(len(r))}, key=len)
        node_of = {s: i for i, s in enumerate(self.nodes)}
        self.response_of = {r: j for j, r in enumerate(world.response_ids)}
        # Every token of every response: (response, node it is drawn at, action).
        steps = [
            (j, node_of[r[:i]], self.actions.index(token))
            for j, r in enumerate(world.response_ids)
            for i, token in enumerate(r)
        ]
        self.j, self.n, self.a = (np.array(v) for v in zip(*steps))
        self.incidence = np.zeros((len(steps), len(world.response_ids)))
        self.incidence[np.arange(len(steps)), self.j] = 1.0

    def sequence_probs(self, table):
        """pi(y|x) = prod_t pi(y_t | x, y_<t) for every response."""
        return np.exp(np.log(table[:, self.n, self.a]) @ self.incidence)

    def _scatter(self, values):  # (P, steps, ...) summed into (P, nodes, ...)
        out = np.zeros((values.shape[0], len(self.nodes), *values.shape[2:]))
        for x in range(values.shape[0]):
            np.add.at(out[x], self.n, values[x])
        return out

    def table(self, probs):
        """Next-token distributions of a sequence-level policy (prefix masses, exactly)."""
        through = np.zeros((probs.shape[0], len(self.nodes), len(self.actions)))
        for x in range(probs.shape[0]):
            np.add.at(through[x], (self.n, self.a), probs[x, self.j])
        return through / through.sum(2, keepdims=True)

    def expected_update(self, table, ref_table, rewards, beta, k):
        """E[gradient of GRPO's loss] per node logit, divided by the node's visit probability.

        scale_rewards="none", loss_type="dr_grpo", one pass (ratio 1). The advantage
        r_i - mean_j r_j has E[A_i grad log pi(y_i)] = (k-1)/k E[(r - E r) grad log pi(y)]
        (the other k-1 samples are independent of y_i); the k3 term's gradient at a sampled
        token is beta (1 - pi_ref/pi) grad log pi. dr_grpo's normaliser n * max_new_tokens is
        a constant. Dividing by the visit probability (> 0 at every node) keeps the zeros.
        """
        probs = self.sequence_probs(table)
        centred = rewards - (probs * rewards).sum(1, keepdims=True)
        pi, ref = table[:, self.n, self.a], ref_table[:, self.n, self.a]
        weight = probs[:, self.j] * (-(k - 1) / k * centred[:, self.j] + beta * (1 - ref / pi))
        grad_log = np.eye(len(self.actions))[self.a][None] - table[:, self.n]
        grad = self._scatter(weight[:, :, None] * grad_log)
        return grad / self._scatter(probs[:, self.j])[:, :, None]

    def iterate_to_fixed_point(self, ref_table, rewards, beta, k, step=1.0, tol=1e-11):
        logits = np.log(ref_table)
        for iteration in range(100_000):
            table = np.exp(logits - logits.max(2, keepdims=True))
            table /= table.sum(2, keepdims=True)
            update = self.expected_update(table, ref_table, rewards, beta, k)
            if np.abs(update).max() < tol:
                return table, iteration
            logits -= step * update
        raise AssertionError("the exact iteration did not converge")

    def backward_induction(self, ref_table, rewards, beta, k):
        """The same fixed point in closed form, node by node from the leaves.

        A zero update at node s reads c pi(a|s) (Q(s,a) - V(s)) = beta (pi(a|s) - pi_ref(a|s))
        with c = (k-1)/k, so pi(a|s) = beta pi_ref(a|s) / (beta + c (V(s) - Q(s,a))): one
        equation in V(s) (the sum is 1), whose root makes V(s) = sum_a pi(a|s) Q(s,a).
        """
        c = (k - 1) / k
        table = np.zeros_like(ref_table)
        for x in range(table.shape[0]):
            value = {}
            for i in reversed(range(len(self.nodes))):  # deepest first
                s = self.nodes[i]
                q = np.array(
                    [
                        rewards[x, self.response_of[s + (a,)]]
                        if a == self.actions[0] or len(s) + 1 == self.max_len
                        else value[s + (a,)]
                        for a in self.actions
                    ]
                )
                ref = ref_table[x, i]

                def excess(v, q=q, ref=ref):
                    return (beta * ref / (beta + c * (v - q))).sum() - 1.0

                v = brentq(excess, q.max() - beta / c * (1 - 1e-12), q.max() + 10.0, xtol=1e-14)
                table[x, i] = beta * ref / (beta + c * (v - q))
                value[s] = float(table[x, i] @ q)
        return table


def _tv(p, q):
    return 0.5 * np.abs(p - q).sum(1)


@pytest.mark.slow
def test_grpo_reaches_its_exact_fixed_point_not_the_rlhf_optimum():
    import time

    from prefopt.worlds import TinyLMWorld

    start = time.perf_counter()
    torch.set_num_threads(1)
    world = TinyLMWorld(random_state=0)
    tree = _Tree(world)
    # The rewards the loop pays: a response with no EOS scores missing_eos_reward = -1.
    rewards = world.rewards(world.reward, missing_eos_reward=-1.0)
    ref_table = tree.table(world.reference_probs())
    table, iterations = tree.iterate_to_fixed_point(ref_table, rewards, BETA, K)
    closed = tree.backward_induction(ref_table, rewards, BETA, K)
    np.testing.assert_allclose(table, closed, atol=1e-8)
    fixed_point = tree.sequence_probs(table)

    # RLOO's fixed point is the closed-form optimum pi_ref exp(r/beta)/Z at the same beta
    # (k1 in the reward); there GRPO's expected update does not vanish.
    optimum = world.optimal_probs(world.reward, BETA)
    at_optimum = tree.expected_update(tree.table(optimum), ref_table, rewards, BETA, K)
    to_optimum = _tv(fixed_point, optimum)
    # Nor is the difference only GRPO's (k-1)/k (a beta of beta k/(k-1)): k3 in the loss
    # regularises KL(pi_ref || pi) node by node, not KL(pi || pi_ref) of the sequence.
    to_rescaled = _tv(fixed_point, world.optimal_probs(world.reward, BETA * K / (K - 1)))

    policy = GRPOPolicy(
        model=world.policy_model(),
        beta=BETA,
        k=K,
        scale_rewards="none",
        loss_type="dr_grpo",
        learning_rate=5e-3,
        n_steps=120,
        batch_size=256,
        random_state=0,
    ).fit(world.prompts, world.reward)
    assert policy.temperature_ == 1.0 and policy.max_new_tokens_ == world.max_len
    fitted = world.policy_probs(policy)
    to_fit = _tv(fitted, fixed_point)
    fit_to_optimum = _tv(fitted, optimum)
    print(
        f"\nexact fixed point in {iterations} iterations; TV(fixed point, pi*) "
        f"{to_optimum.round(4)}, TV(fixed point, pi* at beta k/(k-1)) {to_rescaled.round(4)}, "
        f"max update at pi* {np.abs(at_optimum).max():.3f}; fit: TV(fit, fixed point) "
        f"{to_fit.round(4)}, TV(fit, pi*) {fit_to_optimum.round(4)}; "
        f"{time.perf_counter() - start:.0f}s"
    )
    # Measured TV(fixed point, pi*) = [0.209, 0.228] per prompt, and [0.160, 0.137] to the
    # optimum at beta k/(k-1) = 0.4; the largest update at pi* is 0.23 (per unit visit).
    # (Before padding was cut from every pass, which reseeds TinyLMWorld's reference at
    # float level: [0.211, 0.221] and [0.162, 0.151].)
    assert to_optimum.min() > 0.15
    assert to_rescaled.min() > 0.1
    assert np.abs(at_optimum).max() > 0.05
    # The fit (30,720 episodes, Adam 5e-3 annealed to 0) against the fixed point, TV per
    # prompt: seed 0 [0.048, 0.025] on today's reference; before it, seeds 0-4: [0.047,
    # 0.052], [0.049, 0.037], [0.061, 0.055], [0.061, 0.075], [0.033, 0.023]; the worst
    # prompt's TV has mean 0.054 and sd 0.016 over the seeds, and falls to 0.02-0.04 with
    # 200 steps at 3e-3 (seeds 0-2): sampling noise, not a bias.
    # TV(fit, pi*) was 0.21-0.27. The tolerance 0.1 is about 3 sds above the seeds' mean
    # and under half the distance from the fixed point to pi*: a fit that went to pi*, or
    # stopped short of the fixed point, fails it.
    assert to_fit.max() <= 0.1
    assert fit_to_optimum.min() > 0.15
