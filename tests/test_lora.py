"""LoRA: the reference is the frozen base with the adapter disabled, not a second copy."""

import numpy as np
import pytest
from _tiny import tiny_lm

from prefopt import PPOPolicy, RLOOPolicy

pytest.importorskip("peft")

PROMPTS = ["the movie was", "the plot was"]
LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"]}


def reward(prompts, completions):
    return np.array([c.count("good") for c in completions], dtype=float)


def _storage_bytes(*modules):
    seen, total = set(), 0
    for module in modules:
        if module is None:
            continue
        for t in list(module.parameters()) + list(module.buffers()):
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


def test_lora_reference_is_the_base_with_the_adapter_off():
    plain = RLOOPolicy(
        model=tiny_lm(),
        k=2,
        batch_size=8,
        max_new_tokens=4,
        n_steps=1,
        learning_rate=1e-12,
        random_state=0,
    ).fit(PROMPTS, reward)
    lora = RLOOPolicy(
        model=tiny_lm(),
        k=2,
        batch_size=8,
        max_new_tokens=4,
        n_steps=3,
        learning_rate=1e-2,
        lora=LORA,
        random_state=0,
    ).fit(PROMPTS, reward)
    assert lora.ref_model_ is None
    completions = ["good .", "bad . the"]
    np.testing.assert_allclose(
        lora.log_prob(PROMPTS, completions, reference=True),
        plain.log_prob(PROMPTS, completions, reference=True),
        atol=1e-6,
    )
    # The adapter trained: the policy moved away from its reference.
    assert not np.allclose(
        lora.log_prob(PROMPTS, completions), lora.log_prob(PROMPTS, completions, reference=True)
    )
    trainable = [n for n, p in lora.model_.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_lora_holds_fewer_weights_than_separate_models():
    kwargs = dict(model=tiny_lm(), batch_size=4, max_new_tokens=3, n_steps=1, random_state=0)
    separate = PPOPolicy(**kwargs).fit(PROMPTS, reward)
    shared = PPOPolicy(lora=LORA, **kwargs).fit(PROMPTS, reward)
    full = _storage_bytes(separate.model_, separate.ref_model_, separate.value_model_)
    lean = _storage_bytes(shared.model_, shared.ref_model_, shared.value_model_)
    # Policy + reference + value: three trunks become two (the adapter is tiny).
    assert lean < 0.75 * full


def test_lora_needs_target_modules():
    with pytest.raises(ValueError, match="target_modules"):
        RLOOPolicy(model=tiny_lm(), k=2, batch_size=4, n_steps=1, lora={"r": 4}).fit(
            PROMPTS, reward
        )


def test_shared_value_trunk_is_the_policy_trunk_and_round_trips(tmp_path):
    import joblib
    import torch

    kwargs = dict(
        model=tiny_lm(),
        batch_size=8,
        max_new_tokens=4,
        n_steps=2,
        learning_rate=1e-2,
        random_state=0,
    )
    shared = PPOPolicy(value_model="shared", **kwargs).fit(PROMPTS, reward)
    assert shared.value_model_.backbone is shared.model_.transformer
    separate = PPOPolicy(**kwargs).fit(PROMPTS, reward)
    assert _storage_bytes(
        shared.model_, shared.ref_model_, shared.value_model_
    ) < 0.75 * _storage_bytes(separate.model_, separate.ref_model_, separate.value_model_)
    shared.reward_model_ = None  # the test's reward is a plain function
    joblib.dump(shared, tmp_path / "ppo.joblib")
    loaded = joblib.load(tmp_path / "ppo.joblib")
    assert loaded.value_model_.backbone is loaded.model_.transformer
    assert torch.equal(loaded.value_model_.head.weight, shared.value_model_.head.weight)
    assert loaded.sample(PROMPTS, n=2) == shared.sample(PROMPTS, n=2)
