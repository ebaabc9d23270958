"""save/load: JSON and safetensors only; a loaded estimator samples and scores as the saved one."""

import json
import os
import pickle

import numpy as np
import pytest
import torch
from _tiny import small_policy

import prefopt
from prefopt import PPOPolicy, RewardModel, RLOOPolicy, SFTPolicy
from prefopt.worlds import PreferenceWorld, TinyLMWorld


@pytest.fixture(autouse=True)
def quiet():
    prefopt.set_config(show_progress_bar=False)


def _no_pickle_in(folder):
    for root, _, files in os.walk(folder):
        for name in files:
            data = open(os.path.join(root, name), "rb").read()
            assert not data.startswith(b"\x80"), f"{name} looks like a pickle"


def test_world_policy_round_trip_takes_the_custom_module_again(tmp_path):
    world = PreferenceWorld(random_state=0)
    rm = RewardModel().fit(world.comparisons(300, random_state=0))
    policy = small_policy(
        world, RLOOPolicy, beta=0.3, learning_rate=0.3, n_steps=3, random_state=0
    ).fit(world.prompts, rm)
    folder = policy.save(tmp_path / "rloo")
    _no_pickle_in(folder)
    with pytest.raises(ValueError, match=r"load\(folder, model_=module\)"):
        prefopt.load(folder)
    loaded = prefopt.load(folder, model_=world.policy_model(), featurizer_=world.features)
    assert torch.equal(loaded.model_.theta, policy.model_.theta)
    assert loaded.history_ == policy.history_ and loaded.beta_ == policy.beta_
    assert loaded.sample(world.prompts[:2], n=3) == policy.sample(world.prompts[:2], n=3)
    assert loaded.score(world.prompts) == pytest.approx(policy.score(world.prompts))
    assert isinstance(loaded.reward_model_, RewardModel)
    np.testing.assert_allclose(loaded.reward_model_.coef_, rm.coef_)


def test_transformers_policy_round_trips_with_its_value_model(tmp_path):
    world = TinyLMWorld(random_state=0)
    sft = SFTPolicy(model=world.policy_model(), n_epochs=1, random_state=0)
    sft.fit([(world.prompts[0], "a b")] * 8)
    ppo = PPOPolicy(model=sft, batch_size=8, n_steps=2, random_state=0)
    ppo.fit(world.prompts, world.reward)
    with pytest.warns(UserWarning, match="not saved"):
        folder = ppo.save(tmp_path / "ppo")
    _no_pickle_in(folder)
    loaded = prefopt.load(folder, reward=world.reward)
    for name in ("model_", "ref_model_", "value_model_"):
        for (k, a), b in zip(
            getattr(ppo, name).state_dict().items(), getattr(loaded, name).state_dict().values()
        ):
            assert torch.equal(a, b), (name, k)
    prompts = world.prompts
    assert loaded.sample(prompts, n=2) == ppo.sample(prompts, n=2)
    completions = [c[0] for c in ppo.sample(prompts)]
    np.testing.assert_allclose(
        loaded.log_prob(prompts, completions), ppo.log_prob(prompts, completions)
    )
    assert loaded.score(prompts) == pytest.approx(ppo.score(prompts))


def test_a_shared_value_head_is_saved_alone_and_loaded_onto_the_policys_trunk(tmp_path):
    # PPO declares value_model_ a head on model_'s trunk (shared_trunk_modules): the folder
    # holds the head and rebuilds it on the loaded policy's own trunk, no second copy.
    world = TinyLMWorld(random_state=0)
    ppo = PPOPolicy(model=world.policy_model(), value_model="shared", batch_size=8, n_steps=2,
                    random_state=0).fit(world.prompts, world.reward)  # fmt: skip
    with pytest.warns(UserWarning, match="not saved"):
        folder = ppo.save(tmp_path / "ppo")
    spec = json.loads((tmp_path / "ppo" / "estimator.json").read_text())["modules"]
    assert spec["value_model_"] == {"kind": "shared_head", "trunk": "model_"}
    loaded = prefopt.load(folder, reward=world.reward)
    trunk = loaded.model_.base_model
    assert loaded.value_model_.backbone is trunk  # the same module, not a copy
    for name in ("model_", "value_model_"):
        for (k, a), b in zip(
            getattr(ppo, name).state_dict().items(), getattr(loaded, name).state_dict().values()
        ):
            assert torch.equal(a, b), (name, k)
    assert ppo.value_model_.head.weight.abs().sum() > 0  # the head trained: a real round trip


def test_load_never_runs_a_planted_pickle(tmp_path, monkeypatch):
    class Boom:
        def __reduce__(self):
            return (os.system, ("touch PWNED",))

    monkeypatch.chdir(tmp_path)
    for name in ("estimator.json", "tensors.safetensors"):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        if name != "estimator.json":
            (folder / "estimator.json").write_text(
                json.dumps(
                    {
                        "format": 1,
                        "class": "prefopt.rewards._reward_model.RewardModel",
                        "params": {},
                        "modules": {},
                        "fitted": {},
                    }
                )
            )
        (folder / name).write_bytes(pickle.dumps(Boom()))
        with pytest.raises(Exception):  # noqa: B017 - any refusal will do; nothing may run
            prefopt.load(folder)
    assert not (tmp_path / "PWNED").exists()


def test_load_refuses_classes_outside_prefopt_and_transformers(tmp_path):
    (tmp_path / "estimator.json").write_text(
        json.dumps(
            {
                "format": 2,
                "class": "os.system",
                "params": {},
                "modules": {},
                "objects": {},
                "fitted": {},
                "suppress_ids": [],
            }
        )
    )
    with pytest.raises(ValueError, match="Refusing to load the class 'os.system'"):
        prefopt.load(tmp_path)


def test_language_model_reward_round_trip(tmp_path):
    world = TinyLMWorld(random_state=0)
    sft = SFTPolicy(model=world.policy_model(), random_state=0)
    sft.fit([(world.prompts[0], "a b")] * 8)
    pairs = [(p, "a", "b c") for p in world.prompts] * 4
    rm = RewardModel(model=sft, normalize_samples=8, random_state=0).fit(pairs)
    loaded = prefopt.load(rm.save(tmp_path / "rm"))
    prompts, completions = list(world.prompts), ["a", "b c"]
    np.testing.assert_allclose(
        loaded.predict(prompts, completions), rm.predict(prompts, completions)
    )
    assert (loaded.gain_, loaded.bias_) == (rm.gain_, rm.bias_)


def test_planted_pickles_in_a_saved_folder_never_run(tmp_path, monkeypatch):
    class Boom:
        def __reduce__(self):
            return (os.system, ("touch PWNED",))

    monkeypatch.chdir(tmp_path)
    world = TinyLMWorld(random_state=0)
    sft = SFTPolicy(model=world.policy_model(), random_state=0).fit([(world.prompts[0], "a")] * 4)
    folder = sft.save(tmp_path / "sft")
    for root, _, files in os.walk(folder):  # every file the save format uses, tokenizer's too
        for name in files:
            path = os.path.join(root, name)
            original = open(path, "rb").read()
            with open(path, "wb") as f:
                f.write(pickle.dumps(Boom()))
            with pytest.raises(Exception):  # noqa: B017 - any refusal will do; nothing may run
                prefopt.load(folder)
            with open(path, "wb") as f:
                f.write(original)
    assert not (tmp_path / "PWNED").exists()
    assert prefopt.load(folder).sample(world.prompts) == sft.sample(world.prompts)


def test_load_leaves_the_callers_torch_random_state_alone(tmp_path):
    world = TinyLMWorld(random_state=0)
    sft = SFTPolicy(model=world.policy_model(), n_epochs=1, random_state=0)
    folder = sft.fit([(world.prompts[0], "a b")] * 8).save(tmp_path / "sft")
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    loaded = prefopt.load(folder)  # builds the model from its config: random weights, replaced
    assert torch.equal(torch.rand(3), expected)
    for a, b in zip(sft.model_.state_dict().values(), loaded.model_.state_dict().values()):
        assert torch.equal(a, b)


def _correct(prompts, completions):
    return np.array([float(c.startswith("a")) for c in completions])


def _fmt(prompts, completions):
    return np.array([-abs(len(c) - 3) / 3 for c in completions])


def test_load_weighs_a_list_of_rewards_as_it_was_saved(tmp_path):
    from prefopt.rewards import WeightedRewards

    world = TinyLMWorld(random_state=0)
    policy = RLOOPolicy(
        model=world.policy_model(),
        reward_weights=[1.0, 0.2],
        batch_size=8,
        n_steps=1,
        random_state=0,
    ).fit(world.prompts, [_correct, _fmt])
    with pytest.warns(UserWarning, match=r"load\(folder, reward=\[_correct, _fmt\]\)"):
        folder = policy.save(tmp_path / "weighted")
    saved = json.load(open(os.path.join(folder, "estimator.json")))["objects"]["reward_model_"]
    assert saved == {"weighted": ["_correct", "_fmt"], "weights": [1.0, 0.2]}
    loaded = prefopt.load(folder, reward=[_correct, _fmt])
    assert isinstance(loaded.reward_model_, WeightedRewards)
    assert loaded.reward_model_.weights == [1.0, 0.2]
    # It scores as the saved policy: sum of 1.0 * correct + 0.2 * fmt on the same samples.
    completions = [g[0] for g in policy.sample(world.prompts)]
    expected = np.mean(
        _correct(world.prompts, completions) + 0.2 * _fmt(world.prompts, completions)
    )
    assert loaded.score(world.prompts) == pytest.approx(expected)
    assert policy.score(world.prompts) == pytest.approx(expected)
    # Another order, or another list, is refused by name before any scoring.
    with pytest.raises(
        ValueError,
        match=r"fitted on the rewards \['_correct', '_fmt'\] with "
        r"weights \[1.0, 0.2\]; load got \['_fmt', '_correct'\]",
    ):
        prefopt.load(folder, reward=[_fmt, _correct])
    with pytest.raises(ValueError, match=r"load got \['_correct'\]"):
        prefopt.load(folder, reward=_correct)
