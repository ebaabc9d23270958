"""The CUDA / bfloat16 path; skipped without a GPU (run by benchmarks/gpu_check.sh)."""

import numpy as np
import pytest
import torch
from _tiny import tiny_lm

import prefopt
from prefopt import PPOPolicy, RLOOPolicy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PROMPTS = ["the movie was", "the plot was"]


def reward(prompts, completions):
    return np.array([c.count("good") for c in completions], dtype=float)


@pytest.mark.parametrize("cls", [PPOPolicy, RLOOPolicy])
def test_cuda_bf16_first_epoch_ratio_is_one(cls):
    with prefopt.config_context(device="cuda", dtype="bfloat16"):
        policy = cls(
            model=tiny_lm(),
            batch_size=8,
            max_new_tokens=4,
            n_steps=2,
            n_epochs=1,
            n_minibatches=1,
            learning_rate=1e-3,
            random_state=0,
        ).fit(PROMPTS, reward)
    assert policy.device_.type == "cuda"
    assert next(policy.model_.parameters()).is_cuda
    first = policy.history_[0]
    assert np.isfinite(first["objective/reward"]) and np.isfinite(first["objective/kl"])
    if cls is PPOPolicy:
        # Old log-probs come from the same bf16 forward pass as training, in fp32 softmax.
        assert first["policy/clipfrac"] == 0.0 and abs(first["policy/ratio_mean"] - 1) < 1e-6
    assert len(policy.sample(PROMPTS, n=2)[0]) == 2


def test_overlapped_rollouts_on_cuda():
    # The sampler process holds its copy of the policy on the same GPU; weights reach it
    # through the CPU's shared memory. Staleness 0 is the synchronous fit; 1 runs one off.
    def fit(**extra):
        with prefopt.config_context(device="cuda", dtype="bfloat16"):
            return RLOOPolicy(
                model=tiny_lm(), batch_size=8, max_new_tokens=4, n_steps=3,
                learning_rate=1e-3, random_state=0, **extra,
            ).fit(PROMPTS, reward)  # fmt: skip

    def history(policy):
        return [
            {k: v for k, v in row.items() if not k.startswith(("time/", "overlap/"))}
            for row in policy.history_
        ]

    sync, stale0, stale1 = fit(), fit(max_staleness=0), fit(max_staleness=1)
    assert history(stale0) == history(sync)
    for (name, a), b in zip(sync.model_.state_dict().items(), stale0.model_.state_dict().values()):
        assert torch.equal(a, b), name
    assert [row["overlap/staleness"] for row in stale1.history_] == [0.0, 1.0, 1.0]
    assert next(stale1.model_.parameters()).is_cuda
    assert all(np.isfinite(row["overlap/is_weight_mean"]) for row in stale1.history_)
