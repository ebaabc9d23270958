"""The gap between a sampling engine's log-probs and the policy's, and the truncated
importance-sampling correction (``vllm_importance_sampling_cap``), without vLLM: the
engine's log-probs are made up here and handed to the loop as the engine would."""

import math

import numpy as np
import pytest
import torch

import prefopt
from prefopt import (
    GRPOPolicy,
    PPOPolicy,
    RAFTPolicy,
    ReinforcePlusPlusPolicy,
    ReinforcePolicy,
    RLOOPolicy,
)
from prefopt.backend import response_logprobs
from prefopt.backend.samplers import NativeSampler, Samples
from prefopt.worlds import PreferenceWorld

BUILT_IN = [GRPOPolicy, PPOPolicy, RAFTPolicy, ReinforcePlusPlusPolicy, ReinforcePolicy, RLOOPolicy]


@pytest.fixture(scope="module")
def world():
    prefopt.set_config(show_progress_bar=False)
    return PreferenceWorld(random_state=0)


def set_up(world, cls, **params):
    """A policy set up for one plain SGD step (n_steps=0 builds the fitted state and loop)."""
    kw = dict(n_steps=0, batch_size=8, optimizer="sgd", learning_rate=0.5, n_minibatches=1,
              n_epochs=1, random_state=0)  # fmt: skip
    if "k" in cls().get_params():
        kw["k"] = 2
    policy = cls(model=world.policy_model(), **{**kw, **params}).fit(
        world.prompts, world.true_quality
    )
    return policy, policy._loop


def rollout(policy, loop, engine_offset=None):
    """A step's batch with advantages; the engine's log-probs are old + offset (None: native)."""
    k = policy._samples_per_prompt()
    batch = loop.rollout(np.arange(policy.batch_size // k) % len(loop.prompts))
    if engine_offset is not None:
        batch.engine_logprobs = (batch.old_logprobs + engine_offset) * batch.response_mask
    advantages = policy.compute_advantages(batch)
    if isinstance(advantages, tuple):
        batch.advantages, batch.returns = advantages
    else:
        batch.advantages = advantages
    return batch


def policy_step(policy, loop, batch):
    """The change of the policy's own weights (not a value model's) in one update."""
    skip = set()
    if policy.value_model_ is not None:
        skip = {id(p) for p in policy.value_model_.parameters()}
    params = [p for p in policy.model_.parameters() if p.requires_grad and id(p) not in skip]
    before = [p.detach().clone() for p in params]
    stats = loop.update(batch)
    return [p.detach() - b for p, b in zip(params, before)], stats


def test_rloo_update_is_the_hand_computed_weighted_policy_gradient(world):
    # RLOO's loss -(mean_i A_i sum_t logp_it); truncated IS makes its gradient that of
    # -(mean_i A_i sum_t w_it logp_it), w = min(exp(old - engine), C), detached.
    cap = 1.5
    policy, loop = set_up(world, RLOOPolicy, vllm_importance_sampling_cap=cap)
    batch = rollout(policy, loop)
    g = torch.Generator().manual_seed(1)
    offset = torch.empty(batch.old_logprobs.shape).uniform_(-1.0, 1.0, generator=g)
    batch.engine_logprobs = (batch.old_logprobs + offset) * batch.response_mask
    mask = batch.response_mask
    weights = torch.exp(-offset).clamp(max=cap) * mask
    assert (weights[mask.bool()] == cap).any() and (weights[mask.bool()] < 1).any()
    # The hand computation, on the weights as they are before the step.
    params = [p for p in policy.model_.parameters() if p.requires_grad]
    logp = response_logprobs(policy.model_, batch.prompts, batch.response_ids, mask,
                             temperature=policy.temperature_,
                             suppress_ids=policy._suppress_ids)  # fmt: skip
    loss = -(batch.advantages * (weights * logp * mask).sum(1)).mean()
    expected = [
        -policy.learning_rate_ * g for g in torch.autograd.grad(loss, params, retain_graph=True)
    ]
    plain = torch.autograd.grad(-(batch.advantages * (logp * mask).sum(1)).mean(), params)
    moved, stats = policy_step(policy, loop, batch)
    for got, want, unweighted in zip(moved, expected, plain):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        assert not torch.allclose(got, -policy.learning_rate_ * unweighted, atol=1e-6)
    valid = mask.bool()
    assert stats["engine/is_weight_mean"] == pytest.approx(float(weights[valid].mean()), rel=1e-6)
    assert stats["engine/is_truncated_share"] == pytest.approx(
        float((weights[valid] == cap).float().mean())
    )
    # The loss logged is the unweighted one: the weights act on the gradient alone.
    assert stats["loss/policy"] == pytest.approx(
        float(-(batch.advantages * (logp * mask).sum(1)).mean().detach()), rel=1e-5
    )


@pytest.mark.parametrize("cls", BUILT_IN, ids=lambda c: c.__name__)
def test_every_built_in_policy_gradient_takes_the_weights(world, cls):
    # An engine whose log-probs sit log(1/c) above the policy's everywhere: every weight is
    # c (under the cap), and each algorithm's step on its policy is c times the native one
    # (plain SGD, one minibatch, no entropy bonus: the step is linear in the weights).
    c = 0.6
    steps = {}
    runs = [("native", None, 2.0), ("same", 0.0, 2.0), ("scaled", -math.log(c), 2.0),
            ("off", -math.log(c), None)]  # fmt: skip
    for name, offset, cap in runs:
        policy, loop = set_up(world, cls, vllm_importance_sampling_cap=cap)
        batch = rollout(policy, loop, offset)
        steps[name], stats = policy_step(policy, loop, batch)
        assert ("engine/is_weight_mean" in stats) == (offset is not None and cap is not None)
    total = sum(float(d.abs().sum()) for d in steps["native"])
    assert total > 1e-4  # the step moves the policy
    for native, same, scaled, off in zip(*(steps[n] for n in ("native", "same", "scaled", "off"))):
        torch.testing.assert_close(same, native, rtol=0, atol=0)  # weights of exactly 1
        torch.testing.assert_close(scaled, c * native, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(off, native, rtol=0, atol=0)  # None: no correction


class OffsetEngine(NativeSampler):
    """A sampling engine whose log-probs are the policy's plus ``offset`` on every token."""

    def __init__(self, offset):
        self.offset = offset

    def sample(self, model, prompts, **options):
        out = super().sample(model, prompts, **options)
        engine = (out.logprobs + self.offset) * out.response_mask
        return Samples(out.response_ids, out.response_mask, out.ended, out.logprobs, engine)


def test_the_gap_is_logged_each_step_when_an_engine_sampled(world, monkeypatch):
    # The engine's log-probs (what the sampler object returns with its samples) 0.25
    # nats above the policy's on every token.
    from prefopt.policies.loop import _loop

    monkeypatch.setattr(_loop, "sampler_for", lambda model, optimizer: OffsetEngine(0.25))
    policy = RLOOPolicy(model=world.policy_model(), k=2, n_steps=3, batch_size=8,
                        vllm_importance_sampling_cap=2.0, random_state=0)  # fmt: skip
    policy.fit(world.prompts, world.true_quality)
    assert len(policy.history_) == 3
    for row in policy.history_:
        assert row["engine/logprob_gap_mean"] == pytest.approx(0.25, abs=1e-6)
        assert row["engine/logprob_gap_max"] == pytest.approx(0.25, abs=1e-6)
        assert row["engine/kl"] == pytest.approx(0.25, abs=1e-6)
        assert row["engine/is_weight_mean"] == pytest.approx(math.exp(-0.25), rel=1e-5)
        assert row["engine/is_truncated_share"] == 0.0
    # The native sampler: no engine columns.
    native = RLOOPolicy(model=world.policy_model(), k=2, n_steps=1, batch_size=8,
                        random_state=0)  # fmt: skip
    monkeypatch.undo()
    native.fit(world.prompts, world.true_quality)
    assert not [key for key in native.history_[0] if key.startswith("engine/")]


def test_the_engine_logprobs_reach_the_batch_only_from_its_own_sampler(world):
    # The engine's log-probs travel in the sampler's answer, masked to the response; a
    # rollout given the native sampler has none, whatever another sampler returned before.
    policy, loop = set_up(world, RLOOPolicy)
    rollout = loop.rollouts
    assert isinstance(rollout.sampler, NativeSampler)
    rows = np.arange(4) % len(loop.prompts)
    rollout.sampler = OffsetEngine(-0.5)
    with torch.inference_mode():
        engine = rollout(rows, beta=0.1, step=1)
    torch.testing.assert_close(engine.engine_logprobs,
                               (engine.old_logprobs - 0.5) * engine.response_mask)  # fmt: skip
    assert (engine.engine_logprobs[engine.response_mask == 0] == 0).all()
    rollout.sampler = NativeSampler()
    with torch.inference_mode():
        assert rollout(rows, beta=0.1, step=1).engine_logprobs is None
    from prefopt.backend import vllm_engine

    assert not hasattr(vllm_engine, "last_logprobs") and not hasattr(vllm_engine, "_LAST")


def test_the_cap_is_validated(world):
    with pytest.raises(ValueError, match="vllm_importance_sampling_cap"):
        RLOOPolicy(model=world.policy_model(), vllm_importance_sampling_cap=0.0).fit(
            world.prompts, world.true_quality
        )
