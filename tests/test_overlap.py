"""Overlapped rollouts (max_staleness): prefopt/policies/loop/_overlap.py and its process.

Every fit here starts a sampler process; the first in a test session starts the forkserver
(seconds), later ones fork from it (a tenth of a second).
"""

import math
import os
import signal

import numpy as np
import pytest
import torch

import prefopt
from prefopt import GRPOPolicy, PPOPolicy, RLOOPolicy
from prefopt.backend import EncodedPrompts
from prefopt.backend._sampler_process import SamplerProcess, SamplerProcessError
from prefopt.exceptions import RunHealthError
from prefopt.lm._identity import defining_params
from prefopt.policies.loop._batch import Minibatch, RolloutBatch
from prefopt.policies.loop._overlap import importance_ratio, off_policy_weights
from prefopt.policies.loop._update import scale_gradient
from prefopt.worlds import PreferenceWorld


@pytest.fixture(scope="module")
def world():
    prefopt.set_config(show_progress_bar=False)
    return PreferenceWorld(random_state=0)


def _history(policy):
    """history_ without the wall-clock columns."""
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in policy.history_]


def _weights(policy):
    return {k: v.clone() for k, v in policy.model_.state_dict().items()}


def _same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_staleness_0_equals_the_synchronous_fit_bit_for_bit(world):
    # PPO: a value model, old log-probs recomputed, 2 epochs of minibatches (the stream the
    # sampler process borrows is the one the minibatch order draws on next).
    params = dict(beta=0.1, n_steps=4, n_epochs=2, random_state=3)
    sync = PPOPolicy(model=world.policy_model(), **params).fit(world.prompts, world.true_quality)
    over = PPOPolicy(model=world.policy_model(), max_staleness=0, **params)
    over.fit(world.prompts, world.true_quality)
    rows = _history(over)
    assert [r["overlap/staleness"] for r in rows] == [0.0] * 4
    for row in rows:
        for key in ("overlap/staleness", "overlap/is_weight_mean", "overlap/is_truncated_share",
                    "overlap/kl"):  # fmt: skip
            row.pop(key)
    assert rows == _history(sync)
    assert _same_weights(_weights(over), _weights(sync))
    assert _same_weights(over.value_model_.state_dict(), sync.value_model_.state_dict())


def test_staleness_0_equals_the_synchronous_fit_bit_for_bit_on_a_language_model():
    # RLOO on a transformers model: the KL reads the sampling pass's own log-probs, which
    # the sampler process computes. A frozen copy of the weights there (requires_grad
    # False) took another CPU kernel and gave log-probs one ulp (1.2e-7) apart.
    from prefopt.worlds import TinyLMWorld

    world = TinyLMWorld(n_prompts=6, random_state=0)
    params = dict(batch_size=8, k=2, n_steps=3, random_state=0)
    sync = RLOOPolicy(model=world.policy_model(), **params).fit(world.prompts, world.reward)
    over = RLOOPolicy(model=world.policy_model(), max_staleness=0, **params)
    over.fit(world.prompts, world.reward)
    rows = [{k: v for k, v in r.items() if not k.startswith("overlap/")} for r in _history(over)]
    assert rows == _history(sync)
    assert _same_weights(_weights(over), _weights(sync))


class _Recording(RLOOPolicy):
    """RLOO that keeps each step's batch (the hand computation reads them)."""

    def _record(self, result):
        super()._record(result)
        self.batches_ = [*getattr(self, "batches_", []), result.batch]


def test_importance_weights_equal_a_hand_computation_on_a_two_step_toy(world):
    # Step 1 trains on a batch of pi_0; the batch of step 2 was sampled from pi_0 too (queued
    # while step 1 trained), and trains pi_1: its weights are min(pi_1(y) / pi_0(y), cap),
    # with pi_0 and pi_1 read exactly from the world.
    probs = [world.reference_probs()]  # the starting model is the reference

    def after_step(policy, row):
        probs.append(world.model_probs(policy.model_))

    cap = 1.1  # binds on some tokens: the ratios run from 0.77 to 1.17 (measured)
    policy = _Recording(
        model=world.policy_model(), beta=0.1, n_steps=2, learning_rate=0.05, max_staleness=1,
        off_policy_cap=cap, random_state=0,
    )  # fmt: skip
    policy.fit(world.prompts, world.true_quality, callback=after_step)
    first, second = policy.batches_
    assert (first.staleness, second.staleness) == (0, 1)
    responses = [tuple(r) for r in world.response_ids]
    ratios = []
    for i in range(len(second)):
        p = int(second.prompt_index[i])
        n = int(second.response_mask[i].sum())
        j = responses.index(tuple(second.response_ids[i, :n].tolist()))
        ratios.append(probs[1][p, j] / probs[0][p, j])
    ratios = np.array(ratios)
    assert ratios.min() < 1 < cap < ratios.max()  # the toy moves both ways and the cap binds
    # the batch carries pi_0's log-probs as the behaviour and pi_1's as the proximal ones
    behaviour = second.behaviour_logprobs.sum(1).double().numpy()
    proximal = second.old_logprobs.sum(1).double().numpy()
    n_tokens = second.response_mask.sum(1).numpy()
    assert np.allclose(np.exp(proximal - behaviour), ratios, rtol=1e-5)
    assert (n_tokens == 1).all()  # one token a response: the token's weight is the ratio
    row = policy.history_[1]
    assert row["overlap/staleness"] == 1.0
    assert row["overlap/is_weight_mean"] == pytest.approx(np.minimum(ratios, cap).mean(), rel=1e-5)
    assert row["overlap/is_truncated_share"] == pytest.approx((ratios > cap).mean())
    kl = np.mean(ratios - 1 - np.log(ratios))  # k3 of KL(pi_0 || pi_1) on pi_0's samples
    assert row["overlap/kl"] == pytest.approx(kl, rel=1e-3)
    # the first batch: sampled and trained by pi_0, every weight 1
    assert policy.history_[0]["overlap/is_weight_mean"] == pytest.approx(1.0, abs=1e-6)


def test_the_correction_scales_each_tokens_gradient_by_its_truncated_weight():
    # pi_prox / mu = 0.8 / 0.5 = 1.6 (truncated to 1.5), 0.3 / 0.6 = 0.5, and a padded token.
    current = torch.log(torch.tensor([[0.8, 0.3, 0.9]]))
    behaviour = torch.log(torch.tensor([[0.5, 0.6, 0.1]]))
    mask = torch.tensor([[1, 1, 0]])
    batch = RolloutBatch(
        prompts=None, prompt_index=torch.tensor([0]), response_ids=torch.zeros(1, 3).long(),
        response_mask=mask, ended=torch.tensor([True]), old_logprobs=current,
        ref_logprobs=current, scores=torch.zeros(1), kl=torch.zeros(1, 3),
        rewards=torch.zeros(1, 3), beta=0.0, behaviour_logprobs=behaviour * mask, staleness=1,
    )  # fmt: skip
    logprobs = current.clone().requires_grad_(True)
    minibatch = Minibatch(batch, torch.tensor([0]), logprobs, torch.zeros(1, 3))
    weights = off_policy_weights(minibatch, 1.5)
    assert torch.allclose(weights, torch.tensor([[1.5, 0.5, 1.0]]))
    assert torch.allclose(weights, importance_ratio(current, behaviour, mask, 1.5))
    untruncated = off_policy_weights(minibatch, math.inf)
    assert torch.allclose(untruncated[0, :2], torch.tensor([1.6, 0.5]))
    assert off_policy_weights(minibatch, None) is None  # no correction: the ablation
    # the REINFORCE term -A * sum_t log pi: each token's gradient -A * w_t
    (-(2.0 * (scale_gradient(logprobs, weights) * mask).sum())).backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[-3.0, -1.0, 0.0]]))


def test_a_killed_sampler_process_fails_the_fit_with_a_clear_error(world):
    def kill(policy, row):
        if row["step"] == 1:
            process = policy._loop.overlap.process.process
            os.kill(process.pid, signal.SIGKILL)
            process.join(timeout=30)

    policy = RLOOPolicy(model=world.policy_model(), n_steps=3, max_staleness=1, random_state=0)
    with pytest.raises(SamplerProcessError, match="sampler process .* ended with exit code -9"):
        policy.fit(world.prompts, world.true_quality, callback=kill)
    assert len(policy.history_) == 1
    assert policy._loop.overlap.process.process is None  # closed, nothing left running


def test_a_run_resumed_mid_pipeline_equals_the_uninterrupted_run(world, tmp_path):
    # staleness 2: at the checkpoint after step 2, batches 3 and 4 are in flight (sampled from
    # the weights after steps 0 and 1); the checkpoint holds them and the sampler's stream.
    params = dict(beta=0.1, n_steps=5, max_staleness=2, random_state=0, learning_rate=0.05)
    whole = RLOOPolicy(model=world.policy_model(), **params).fit(world.prompts, world.true_quality)

    def crash(policy, row):
        if row["step"] == 3:  # after the checkpoint of step 2
            raise KeyboardInterrupt

    folder = str(tmp_path / "run")
    crashed = RLOOPolicy(model=world.policy_model(), checkpoint_dir=folder, checkpoint_every=2,
                         **params)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        crashed.fit(world.prompts, world.true_quality, callback=crash)
    resumed = RLOOPolicy(model=world.policy_model(), checkpoint_dir=folder, checkpoint_every=2,
                         **params)  # fmt: skip
    resumed.fit(world.prompts, world.true_quality)
    assert [r["overlap/staleness"] for r in whole.history_] == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert _history(resumed) == _history(whole)  # so a second run at the seed is the same
    assert _same_weights(_weights(resumed), _weights(whole))


def test_the_mode_is_part_of_the_run_identity():
    overlapped = defining_params(RLOOPolicy(max_staleness=1))
    assert overlapped["max_staleness"] != defining_params(RLOOPolicy())["max_staleness"]
    assert "off_policy_cap" in overlapped


def test_a_bad_staleness_is_refused_before_training(world):
    with pytest.raises(ValueError, match="max_staleness"):
        RLOOPolicy(model=world.policy_model(), max_staleness=-1).fit(
            world.prompts, world.true_quality
        )


def test_runaway_importance_weights_are_detected_far_off_policy(world):
    # Four updates stale at learning rate 2: measured truncated shares 0, 0.234, 0.234,
    # 0.328, 0.328, smoothed 0.226 at step 5 against the threshold 0.2. The default runs of
    # benchmarks/overlap_exact.py (staleness 1) never truncated a token on this world.
    policy = RLOOPolicy(
        model=world.policy_model(), beta=0.1, n_steps=6, learning_rate=2.0, max_staleness=4,
        random_state=0, on_unhealthy="raise",
    )  # fmt: skip
    with pytest.raises(RunHealthError, match="runaway_importance_weights.* at step 5"):
        policy.fit(world.prompts, world.true_quality)


def test_a_model_of_many_tensors_reaches_the_sampler_process(world):
    # 300 tensors more than the policy's: one descriptor a tensor passed the forkserver's
    # limit (256); the weights travel in one flat buffer per dtype and slot.
    model = world.policy_model()
    model.extra = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(2)) for _ in range(300))
    prompts = EncodedPrompts(torch.zeros(4, 1, dtype=torch.long), torch.ones(4, 1))
    options = dict(max_new_tokens=1, temperature=1.0, pad_token_id=0)
    with SamplerProcess(model, n_buffers=2) as process:
        samples, _, _ = process.receive(process.submit(model, prompts, seed=0, **options))
        number = process.submit(model, prompts, seed=0, **options)  # the other slot
        again, _, _ = process.receive(number)
    assert samples.response_ids.shape == (4, 1)
    assert torch.equal(samples.response_ids, again.response_ids)  # same seed, same policy


def test_resampled_groups_are_drawn_from_the_current_weights(world):
    # DAPO's dynamic sampling replaces tied groups with new prompts: those rows are not the
    # queued batch's, so the sampler process draws them at once with the current weights.
    policy = GRPOPolicy(
        model=world.policy_model(), beta=0.1, k=4, batch_size=32, n_steps=3, max_staleness=1,
        dynamic_sampling=True, learning_rate=0.5, random_state=0,
    )  # fmt: skip
    policy.fit(world.prompts, world.true_quality)
    rows = policy.history_
    assert sum(r["sampling/extra_generations"] for r in rows) > 0
    assert [r["overlap/staleness"] for r in rows] == [0.0, 1.0, 1.0]  # the queued batch's
    assert rows[1]["overlap/kl"] > 0  # the merged batch kept the sampler's log-probs
    assert policy._loop.overlap.pending and policy._loop.overlap.process.process is None
