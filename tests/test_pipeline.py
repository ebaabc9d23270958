"""SFT -> reward model -> policy as one scikit-learn Pipeline on one data bundle."""

import numpy as np
from _tiny import tiny_lm
from sklearn.pipeline import make_pipeline

from prefopt import RewardModel, RLOOPolicy, SFTPolicy
from prefopt.data import PreferenceData

PROMPTS = ["the movie was", "the plot was"]
DEMOS = [
    ("the movie was", "good ."),
    ("the movie was", "bad ."),
    ("the plot was", "great ."),
    ("the plot was", "awful ."),
] * 6
COMPARISONS = [("the movie was", "good .", "bad ."), ("the plot was", "great .", "awful .")] * 8


def test_pipeline_runs_sft_reward_and_policy_on_one_bundle():
    data = PreferenceData(
        prompts=PROMPTS,
        demonstrations=DEMOS,
        comparisons=COMPARISONS,
        references=[("the movie was", "good .")],
    )
    pipe = make_pipeline(
        SFTPolicy(model=tiny_lm(), learning_rate=1e-2, n_epochs=6, random_state=0),
        RewardModel(learning_rate=3e-3, normalize_samples=16, random_state=0),
        RLOOPolicy(k=2, batch_size=8, n_steps=2, learning_rate=1e-2, random_state=0),
    ).fit(data)
    sft, rm, policy = (step for _, step in pipe.steps)
    # Each step started from the previous one's fitted result.
    assert rm.model_.backbone.config.n_embd == sft.model_.config.n_embd
    assert policy.reward_model_ is rm
    for p_ref, p_sft in zip(policy.ref_model_.parameters(), sft.model_.parameters()):
        assert np.array_equal(p_ref.detach().numpy(), p_sft.detach().numpy())
    # The references were used: they score 0 on average.
    assert abs(rm.predict(["the movie was"], ["good ."])[0]) < 1e-5
    completions = pipe.predict(PROMPTS)
    assert len(completions) == 2 and all(isinstance(c, str) for c in completions)
    assert completions == policy.predict(PROMPTS)


def test_pipeline_step_without_its_data_says_what_is_missing():
    import pytest

    with pytest.raises(ValueError, match="PreferenceData.demonstrations"):
        make_pipeline(SFTPolicy(model=tiny_lm()), RLOOPolicy()).fit(PreferenceData(prompts=PROMPTS))
