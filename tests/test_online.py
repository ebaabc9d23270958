"""Online reward learning: refits of a copy of the reward on labelled samples of the policy."""

import numpy as np
import pytest
import torch
from _tiny import small_policy, tiny_lm

import prefopt
from prefopt import ReinforcePolicy, RewardModel, RLOOPolicy
from prefopt.worlds import PreferenceWorld, TinyLMWorld


@pytest.fixture(autouse=True)
def _quiet():
    with prefopt.config_context(show_progress_bar=False):
        yield


def _world_and_reward():
    world = PreferenceWorld(random_state=0)
    return world, RewardModel().fit(world.comparisons(300, random_state=0))


def _rloo(world, **params):
    settings = dict(beta=0.3, k=4, learning_rate=0.3, n_steps=6, batch_size=32, random_state=0)
    return small_policy(world, RLOOPolicy, **{**settings, **params})


def test_refits_a_copy_every_few_steps_and_records_them():
    world, rm = _world_and_reward()
    coef = rm.coef_.copy()
    policy = _rloo(world, refit_every=2).fit(world.prompts, rm, labeler=world.labeler)
    refits = [row["reward/refits"] for row in policy.history_]
    assert refits == [0, 1, 1, 2, 2, 3]
    np.testing.assert_array_equal(rm.coef_, coef)  # the reward passed in never changes
    assert rm.n_comparisons_ == 300
    assert policy.reward_model_ is not rm
    labels = sum(row.get("reward/new_labels", 0) for row in policy.history_)
    assert policy.reward_model_.n_comparisons_ == 300 + labels
    # 8 prompts a step, k = 4: two disjoint pairs each; pairs of equal responses are dropped.
    assert all(row.get("reward/new_labels", 0) <= 16 for row in policy.history_)
    assert labels > 0
    assert not np.allclose(policy.reward_model_.coef_, coef)
    for row in policy.history_[1::2]:
        assert 0.0 <= row["reward/online_accuracy"] <= 1.0


def test_online_and_offline_sample_the_same_prompts_until_the_first_refit():
    world, rm = _world_and_reward()
    offline = _rloo(world, n_steps=2).fit(world.prompts, rm)
    online = _rloo(world, n_steps=2, refit_every=2).fit(world.prompts, rm, labeler=world.labeler)
    for a, b in zip(offline.history_, online.history_):
        assert a["objective/reward"] == b["objective/reward"]
    for p, q in zip(offline.model_.parameters(), online.model_.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_k_equal_one_draws_a_second_sample_to_pair():
    world, rm = _world_and_reward()
    policy = small_policy(
        world,
        ReinforcePolicy,
        beta=0.3,
        learning_rate=0.3,
        n_steps=2,
        batch_size=16,
        refit_every=1,
        random_state=0,
    ).fit(world.prompts, rm, labeler=world.labeler)
    assert [row["reward/refits"] for row in policy.history_] == [1, 2]
    assert 0 < policy.history_[0]["reward/new_labels"] <= 16


def test_settings_that_cannot_work_are_refused_before_any_work():
    world, rm = _world_and_reward()
    with pytest.raises(ValueError, match="needs fit\\(..., labeler=f\\)"):
        _rloo(world, refit_every=2).fit(world.prompts, rm)
    with pytest.raises(ValueError, match="labeler but refit_every=None"):
        _rloo(world).fit(world.prompts, rm, labeler=world.labeler)
    with pytest.raises(TypeError, match="needs partial_fit"):
        _rloo(world, refit_every=2).fit(world.prompts, world.true_quality, labeler=world.labeler)


def test_a_labeler_returning_the_wrong_shape_gets_a_clear_error():
    world, rm = _world_and_reward()

    def bad(prompts, a, b, random_state=None):
        return np.zeros(len(prompts) + 1)

    with pytest.raises(ValueError, match="labeler returned"):
        _rloo(world, refit_every=1, n_steps=1).fit(world.prompts, rm, labeler=bad)


def test_a_fitted_reward_models_sample_is_a_labeler():
    world, rm = _world_and_reward()
    policy = _rloo(world, refit_every=3).fit(world.prompts, rm, labeler=rm.sample)
    assert policy.history_[-1]["reward/refits"] == 2


def test_a_resumed_online_run_ends_as_the_uninterrupted_one(tmp_path):
    world, rm = _world_and_reward()
    whole = _rloo(world, refit_every=2).fit(world.prompts, rm, labeler=world.labeler)
    folder = str(tmp_path / "run")
    cut = _rloo(world, refit_every=2, checkpoint_dir=folder, checkpoint_every=2)
    cut.fit(world.prompts, rm, labeler=world.labeler, callback=lambda p, row: row["step"] == 4)
    resumed = _rloo(world, refit_every=2, checkpoint_dir=folder, checkpoint_every=2)
    resumed.fit(world.prompts, rm, labeler=world.labeler)
    np.testing.assert_allclose(resumed.reward_model_.coef_, whole.reward_model_.coef_)
    for p, q in zip(whole.model_.parameters(), resumed.model_.parameters()):
        torch.testing.assert_close(p, q)

    def untimed(history):
        return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in history]

    assert untimed(resumed.history_) == untimed(whole.history_)


def test_every_world_labels_with_the_signature_of_reward_model_sample():
    world = TinyLMWorld()
    topic = world.prompts[0].split()[0]
    labels = world.labeler([world.prompts[0]] * 2000, [topic] * 2000, [""] * 2000, random_state=0)
    # P(a preferred) = sigmoid(reward(topic) - reward("")) = sigmoid(0.5) = 0.6225
    assert abs((labels == 0).mean() - 1 / (1 + np.exp(-0.5))) < 0.03
    with pytest.raises(ValueError, match="one prompt and two completions per row"):
        world.labeler(["a"], ["a"], ["a", "b"])


def test_partial_fit_of_a_language_model_reward_keeps_its_normalisation():
    world = TinyLMWorld()
    lm = tiny_lm(seed=0)
    prompts = ["the movie", "the plot"] * 8
    a = [" was good ."] * 16
    b = [" was bad ."] * 16
    data = {"prompt": prompts, "chosen": a, "rejected": b}
    rm = RewardModel(model=lm, normalize_samples=16, max_new_tokens=4, random_state=0).fit(data)
    head = [p.detach().clone() for p in rm.model_.parameters()]
    more = {"prompt": prompts, "chosen": b, "rejected": a}
    rm.partial_fit(more, random_state=1)
    assert rm.n_comparisons_ == 32 and len(rm.history_) == 4
    assert any(not torch.equal(p, q) for p, q in zip(head, rm.model_.parameters()))
    chosen, responses = rm.normalization_rows_
    from prefopt.rewards._lm import score_token_rows

    scores = score_token_rows(rm, chosen, responses).double()
    assert abs(float(scores.mean())) < 1e-5
    assert abs(float(scores.std(unbiased=False)) - 1.0) < 1e-4
    del world
