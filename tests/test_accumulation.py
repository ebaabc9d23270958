"""Gradient accumulation in the RL policies' update (``micro_batch_size``) and the old
log-probs' forward pass under a sampling engine (issue 39, point 9)."""

import numpy as np
import pytest
import torch
from _tiny import tiny_lm

import prefopt
from prefopt import (
    GRPOPolicy,
    PPOPolicy,
    RAFTPolicy,
    ReinforcePlusPlusPolicy,
    ReinforcePolicy,
    RLOOPolicy,
)
from prefopt.backend import distributed, samplers
from prefopt.policies import BasePolicy, make_init
from prefopt.policies.loop import _update, _view

PROMPTS = ["the movie was", "the plot was", "the movie", "the plot"]


@pytest.fixture(autouse=True)
def _quiet():
    with prefopt.config_context(show_progress_bar=False):
        yield


def reward(prompts, completions):
    return np.array([c.count("good") - c.count("bad") + 0.1 * len(c) for c in completions])


def grads(module):
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def assert_same_grads(a, b):
    """Equal to 1e-6 of each gradient's largest entry (at least 1e-6 absolute)."""
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        tol = 1e-6 * max(1.0, float(a[name].abs().max()))
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=tol, msg=name)


def largest_grad_difference(a, b):
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def fit(cls, micro, **params):
    settings = dict(
        model=tiny_lm(),
        batch_size=8,
        max_new_tokens=5,
        n_steps=1,
        random_state=0,
        on_unhealthy="ignore",
        missing_eos_reward=None,  # rewards that vary: few of these responses end
    )
    return cls(**{**settings, **params, "micro_batch_size": micro}).fit(PROMPTS, reward)


class CachedPPO(PPOPolicy):
    """PPO declaring nothing of its loss: accumulated through the cached gradients."""

    loss_reduction = "minibatch"


# Every built-in, each reduction, the terms the loop adds (entropy bonus, pretraining loss)
# and, through CachedPPO, a value model on the cached path.
CASES = {
    "PPO": (PPOPolicy, {"n_epochs": 2, "n_minibatches": 2}),
    "PPO-entropy": (PPOPolicy, {"n_epochs": 1, "n_minibatches": 1, "entropy_coef": 0.1}),
    "RLOO": (RLOOPolicy, {"k": 2}),  # n_minibatches=2: minibatches of 4
    "RLOO-ptx": (RLOOPolicy, {"k": 2, "ptx_coef": 0.5, "entropy_coef": 0.1}),
    "REINFORCE": (ReinforcePolicy, {}),
    "REINFORCE++": (ReinforcePlusPlusPolicy, {"n_epochs": 2}),
    "GRPO-dapo": (GRPOPolicy, {"k": 2, "loss_type": "dapo"}),
    "GRPO-dapo-truncated": (GRPOPolicy, {"k": 2, "mask_truncated": True, "n_minibatches": 2}),
    "GRPO-grpo": (GRPOPolicy, {"k": 2, "loss_type": "grpo", "n_epochs": 2}),
    "GRPO-dr_grpo": (GRPOPolicy, {"k": 2, "loss_type": "dr_grpo"}),
    "RAFT": (RAFTPolicy, {"k": 2, "n_epochs": 1}),
    "RAFT-ptx": (RAFTPolicy, {"k": 2, "n_epochs": 1, "ptx_coef": 0.5, "entropy_coef": 0.1}),
    "CachedPPO": (CachedPPO, {"n_epochs": 1, "n_minibatches": 2, "entropy_coef": 0.1}),
}
PTX = ["the movie was good .", "bad . the plot", "good"]
pytestmark = pytest.mark.filterwarnings("ignore:.*responses ended with EOS")


@pytest.mark.parametrize("name", sorted(CASES))
def test_micro_batches_give_the_whole_minibatchs_gradient(name):
    cls, extra = CASES[name]
    ptx = {"ptx_data": PTX} if extra.get("ptx_coef") else {}
    fits = {}
    for micro in (None, 2):
        policy = cls(
            model=tiny_lm(), batch_size=8, max_new_tokens=5, n_steps=1, random_state=0,
            on_unhealthy="ignore", missing_eos_reward=None, micro_batch_size=micro, **extra,
        )  # fmt: skip
        fits[micro] = policy.fit(PROMPTS, reward, **ptx)
    whole, parts = fits[None], fits[2]
    # After a one-step fit the parameters hold the last minibatch's gradient.
    assert_same_grads(grads(whole.model_), grads(parts.model_))
    if whole.value_model_ is not None:
        assert_same_grads(grads(whole.value_model_), grads(parts.value_model_))
    for p, q in zip(whole.model_.parameters(), parts.model_.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    a, b = whole.history_[0], parts.history_[0]
    for key in ("loss/policy", "loss/value", "loss/entropy_bonus", "loss/ptx", "policy/entropy"):
        if key in a:  # the loop's terms and the losses are the whole minibatch's
            assert b[key] == pytest.approx(a[key], abs=1e-6), key


def test_the_cases_have_responses_of_unequal_lengths(monkeypatch):
    # A token mean and a sequence mean only differ (and a part's weight only matters)
    # when the parts hold unequal numbers of tokens; these settings draw responses of
    # 1 and 5 tokens, and the parts of 2 rows (RLOO's groups) hold 2, 6 or 10.
    lengths = []
    passes = _update.Update._passes

    def recording(self, batch, *args):
        lengths.extend(batch.response_mask.sum(1).tolist())
        return passes(self, batch, *args)

    monkeypatch.setattr(_update.Update, "_passes", recording)
    fit(RLOOPolicy, None, k=2)
    parts = [sum(lengths[i : i + 2]) for i in range(0, len(lengths), 2)]
    assert len(set(parts)) >= 2, lengths


class CrossRowPolicy(BasePolicy):
    """A loss whose normaliser is the whole minibatch's largest response log-prob sum."""

    __init__ = make_init(learning_rate=1e-3, n_steps=1)

    def compute_advantages(self, batch):
        return batch.sequence_rewards - batch.sequence_rewards.mean()

    def compute_loss(self, batch, minibatch):
        total = (minibatch.logprobs * minibatch.mask).sum(1)
        loss = -(minibatch.advantages * total).sum() / total.detach().abs().max()
        return loss, {"loss/policy": loss.item()}


class CrossRowDeclaredAsMean(CrossRowPolicy):
    loss_reduction = "sequence_mean"  # wrong: the normaliser is not the rows'


def test_a_user_loss_declaring_nothing_is_exact_and_a_wrong_declaration_is_not():
    whole = fit(CrossRowPolicy, None)
    assert_same_grads(grads(whole.model_), grads(fit(CrossRowPolicy, 2).model_))
    wrong = fit(CrossRowDeclaredAsMean, 2)
    # The declared reduction is what the loop sums by: taken at its word, the parts' own
    # maxima weigh in, and the step differs (by 1.3e-2 at the largest entry, measured).
    assert largest_grad_difference(grads(whole.model_), grads(wrong.model_)) > 1e-3


@pytest.mark.parametrize(
    "micro, message",
    [
        (0, "micro_batch_size"),
        (2.5, "micro_batch_size"),
        (3, r"micro_batch_size=3 does not divide the minibatch of batch_size // "
            r"n_minibatches = 8 // 2 = 4 episodes; give one of \[1, 2, 4\]"),
        (8, "micro_batch_size=8 does not divide"),
    ],
)  # fmt: skip
def test_a_bad_micro_batch_size_is_refused_before_training(micro, message):
    policy = RLOOPolicy(model=tiny_lm(), k=2, batch_size=8, micro_batch_size=micro)
    with pytest.raises(ValueError, match=message):
        policy.fit(PROMPTS, reward)
    assert not hasattr(policy, "model_")  # nothing was built


def test_a_bad_loss_reduction_and_a_distributed_fit_are_refused(monkeypatch):
    class Odd(CrossRowPolicy):
        loss_reduction = "mean"

    with pytest.raises(ValueError, match="Odd.loss_reduction must be one of 'minibatch', "):
        Odd(model=tiny_lm()).fit(PROMPTS, reward)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    with pytest.raises(ValueError, match="not supported in a distributed fit yet"):
        RLOOPolicy(model=tiny_lm(), k=2, batch_size=8, micro_batch_size=2).fit(PROMPTS, reward)


def test_micro_batches_keep_less_for_the_backward_pass():
    # The bytes autograd saves for a backward pass (each storage once, the weights left
    # out), at their largest over the fit's backward passes.
    saved = {}
    for micro in (None, 2):
        policy = RLOOPolicy(
            model=tiny_lm(), k=2, batch_size=8, n_minibatches=1, max_new_tokens=5, n_steps=1,
            random_state=0, micro_batch_size=micro,
        )  # fmt: skip
        held, peak = {}, [0]

        def pack(t, held=held, peak=peak, policy=policy):
            weights = {p.untyped_storage().data_ptr() for p in policy.model_.parameters()}
            key = t.untyped_storage().data_ptr()
            if key not in weights:
                held[key] = t.untyped_storage().nbytes()
                peak[0] = max(peak[0], sum(held.values()))
            return t

        def backward(*args, held=held, original=torch.autograd.backward, **kwargs):
            held.clear()  # the graph taken backward is freed
            return original(*args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.autograd, "backward", backward)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                policy.fit(PROMPTS, reward)
        saved[micro] = peak[0]
    assert saved[2] < 0.3 * saved[None]  # measured 0.250: parts of 2 rows of 8


# ----- the old log-probs' forward pass under a sampling engine ------------------------------
class FakeEngine:
    """A vLLM engine without vLLM: the native sampler draws, the engine's log-probs are its
    cached ones less 0.01 (another engine's kernels), stop ids repeated after the stop."""

    def __init__(self):
        self.watched = []

    def watch(self, optimizer):
        handle = optimizer.register_step_post_hook(lambda *args: None)
        self.watched.append((optimizer, handle))
        return handle

    def generate(self, model, prompts, *, max_new_tokens, temperature, generator,
                 suppress_ids=(), eos_token_id=None, prompt_index=None):  # fmt: skip
        from prefopt.backend.generation import sample

        tokens, logprobs = sample(
            model, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
            generator=generator, suppress_ids=suppress_ids, return_logprobs=True,
            eos_token_id=eos_token_id, prompt_index=prompt_index,
        )  # fmt: skip
        return tokens, logprobs - 0.01


@pytest.mark.parametrize("cls, extra", [(PPOPolicy, {}), (RLOOPolicy, {"k": 2})])
def test_an_engine_rollout_runs_one_forward_pass_of_the_policy(monkeypatch, cls, extra):
    # PPO recomputes its old log-probs (a ratio policy), RLOO reads the sampling pass's:
    # under an engine the sampler's own pass of the policy serves both, one pass a rollout.
    calls = []
    for module in (_view, samplers):
        counted = module.response_logprobs

        def counting(model, *args, counted=counted, **kwargs):
            calls.append(model)
            return counted(model, *args, **kwargs)

        monkeypatch.setattr(module, "response_logprobs", counting)
    engine = FakeEngine()  # the engine object a fit is given (set_config(generation=engine))
    # A fixed rate: the adaptive default's measuring pass after the update (one more pass
    # of the policy, counted by test_forward_counts) is not the rollout's.
    policy = cls(model=tiny_lm(), batch_size=8, max_new_tokens=5, n_steps=1, random_state=0,
                 learning_rate=1e-3, vllm_importance_sampling_cap=2.0, **extra)  # fmt: skip
    with prefopt.config_context(generation=engine):
        policy.fit(PROMPTS, reward)
    assert sum(model is policy.model_ for model in calls) == 1
    row = policy.history_[0]
    # The old log-probs are the policy's (the engine's are 0.01 lower a token).
    assert row["engine/logprob_gap_mean"] == pytest.approx(0.01, abs=1e-5)
    assert row["engine/is_weight_mean"] == pytest.approx(np.exp(0.01), abs=1e-5)


@pytest.mark.parametrize(
    "cls, extra, whole, parts",
    [
        # 2 minibatches of 4, parts of 2: one pass a part.
        (RLOOPolicy, {"k": 2}, 2, 4),
        # 1 minibatch of 8, parts of 2, the cached path: a pass without gradients and a
        # pass with them a part.
        (RAFTPolicy, {"k": 2, "n_epochs": 1}, 1, 8),
    ],
)
def test_the_update_runs_one_pass_a_part_and_two_on_the_cached_path(
    monkeypatch, cls, extra, whole, parts
):
    calls = []
    counted, passes = _update.response_logprobs, _update.Update._passes
    inside = [False]

    def counting(*args, **kwargs):
        calls.append(inside[0])
        return counted(*args, **kwargs)

    def updating(self, *args):
        inside[0] = True
        try:
            return passes(self, *args)
        finally:
            inside[0] = False

    monkeypatch.setattr(_update, "response_logprobs", counting)
    monkeypatch.setattr(_update.Update, "_passes", updating)
    for micro, expected in ((None, whole), (2, parts)):
        calls.clear()
        fit(cls, micro, **extra)
        assert sum(calls) == expected, micro
