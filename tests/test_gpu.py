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
