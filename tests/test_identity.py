"""One run identity: what defines a run decides a resume and names a search candidate's folder."""

import copy
import os

import numpy as np
import pytest
from _tiny import small_policy
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV

import prefopt
from prefopt import AdaptiveKLController, DPOPolicy, RewardModel, RLOOPolicy, SFTPolicy
from prefopt.lm._identity import describe
from prefopt.model_selection import SeedSearchCV, compare
from prefopt.policies import store_params
from prefopt.worlds import PreferenceWorld, TinyLMWorld

WORLD = PreferenceWorld(rater_bias=1.0, random_state=0)
TINY = TinyLMWorld(random_state=0)


@pytest.fixture(autouse=True)
def quiet():
    prefopt.set_config(show_progress_bar=False)


def small_rloo(**params):
    est = small_policy(WORLD, beta=0.3, learning_rate=2.0, n_steps=2, batch_size=16, random_state=0)
    return est.set_params(**params)


def reward_a(prompts, completions):
    return WORLD.true_quality(prompts, completions)


def reward_b(prompts, completions):
    return 2.0 * np.asarray(WORLD.true_quality(prompts, completions))


def scaled(scale):
    def reward(prompts, completions):
        return scale * np.asarray(WORLD.true_quality(prompts, completions))

    return reward


# ----- what the identity sees -------------------------------------------------------------


def test_objects_are_described_by_their_full_content():
    from peft import LoraConfig
    from transformers import GPT2Config, LlamaConfig

    def differs(a, b):
        return describe(a) != describe(b) and describe(a) == describe(copy.deepcopy(a))

    assert differs(GPT2Config(activation_function="gelu"), GPT2Config(activation_function="relu"))
    assert differs(GPT2Config(layer_norm_epsilon=1e-5), GPT2Config(layer_norm_epsilon=1e-3))
    assert differs(LlamaConfig(rope_theta=1e4), LlamaConfig(rope_theta=5e5))
    assert differs(LoraConfig(r=2, lora_alpha=4), LoraConfig(r=2, lora_alpha=8))
    assert differs(AdaptiveKLController(target=6.0), AdaptiveKLController(target=3.0))
    assert differs(np.random.RandomState(0), np.random.RandomState(1))
    # A tokenizer by its vocabulary and special tokens: another EOS is another run.
    tok = TINY.tokenizer
    other = copy.deepcopy(tok)
    other.eos_token = other.pad_token
    assert differs(tok, other)
    # A module by its weights and config, also a config field that leaves the weights alone.
    model = TINY.policy_model()
    eps = copy.deepcopy(model)
    eps.config.layer_norm_epsilon = 1e-3
    assert differs(model, eps)


def test_a_function_is_described_by_name_source_and_closure():
    assert describe(reward_a) != describe(reward_b)
    assert describe(scaled(1.0)) == describe(scaled(1.0)) != describe(scaled(2.0))
    # A declared identity replaces every other rule, e.g. for a reward reading a global.
    a, b = scaled(1.0), scaled(2.0)
    a.__prefopt_identity__ = b.__prefopt_identity__ = "gold reward v3"
    assert describe(a) == describe(b) == {"declared": "gold reward v3"}


def test_a_reward_model_is_described_by_its_weights():
    a = RewardModel().fit(WORLD.comparisons(200, random_state=0))
    b = RewardModel().fit(WORLD.comparisons(200, random_state=1))
    assert describe(a) == describe(copy.deepcopy(a)) != describe(b)


# ----- a resume that would change the run is refused, naming what differs --------------------


def test_second_fit_with_another_reward_is_refused(tmp_path):
    folder = str(tmp_path / "run")
    first = small_rloo(checkpoint_dir=folder).fit(WORLD.prompts, reward_a)
    with pytest.raises(ValueError, match=r"reward\.function=.*reward_a.*reward_b"):
        small_rloo(checkpoint_dir=folder).fit(WORLD.prompts, reward_b)
    with pytest.raises(ValueError, match=r"reward\.closure\[0\]=1\.0.*2\.0"):
        other = str(tmp_path / "closure")
        small_rloo(checkpoint_dir=other).fit(WORLD.prompts, scaled(1.0))
        small_rloo(checkpoint_dir=other).fit(WORLD.prompts, scaled(2.0))
    # The same reward resumes the finished run: the same weights.
    again = small_rloo(checkpoint_dir=folder).fit(WORLD.prompts, reward_a)
    assert np.array_equal(again.model_.theta.detach(), first.model_.theta.detach())


def test_a_smaller_n_steps_never_returns_the_longer_run(tmp_path):
    folder = str(tmp_path / "run")
    small_rloo(n_steps=3, checkpoint_dir=folder).fit(WORLD.prompts, reward_a)
    with pytest.raises(ValueError, match=r"has run 3 steps, more than this fit's n_steps=2"):
        small_rloo(n_steps=2, checkpoint_dir=folder).fit(WORLD.prompts, reward_a)


def test_another_random_state_object_is_refused(tmp_path):
    folder = str(tmp_path / "run")
    small_rloo(random_state=np.random.RandomState(0), checkpoint_dir=folder).fit(
        WORLD.prompts, reward_a
    )
    with pytest.raises(ValueError, match=r"random_state\.RandomState="):
        small_rloo(random_state=np.random.RandomState(1), checkpoint_dir=folder).fit(
            WORLD.prompts, reward_a
        )


class NoBetaRLOO(RLOOPolicy):
    """A user subclass whose ``__init__`` leaves ``beta`` out: the class-level value is used."""

    # The common parameters whose effective value defines a run (declared on BasePolicy).
    _common_parameters = getattr(RLOOPolicy, "_common_parameters", ("beta",))

    def __init__(
        self,
        *,
        model=None,
        k=4,
        learning_rate=2.0,
        optimizer="sgd",
        n_steps=2,
        batch_size=16,
        random_state=0,
        checkpoint_dir=None,
    ):
        store_params(self, locals())


def test_subclass_omitting_beta_is_refused_with_another_class_level_beta(tmp_path, monkeypatch):
    assert "beta" not in NoBetaRLOO().get_params()
    folder = str(tmp_path / "run")
    monkeypatch.setattr(NoBetaRLOO, "beta", 0.3)
    NoBetaRLOO(model=WORLD.policy_model(), checkpoint_dir=folder).fit(WORLD.prompts, reward_a)
    monkeypatch.setattr(NoBetaRLOO, "beta", 0.1)
    with pytest.raises(ValueError, match=r"beta=0\.3, but this fit has beta=0\.1"):
        NoBetaRLOO(model=WORLD.policy_model(), checkpoint_dir=folder).fit(WORLD.prompts, reward_a)


def _sft(model, tokenizer=None, **params):
    return SFTPolicy(model=model, tokenizer=tokenizer, n_epochs=1, batch_size=4, random_state=0)


def _model_with(**config):
    """The tiny world's policy with the same weights, built from a config with other fields."""
    model = TINY.policy_model()
    changed = copy.deepcopy(model.config)
    for key, value in config.items():
        setattr(changed, key, value)
    other = type(model)(changed)
    other.load_state_dict(model.state_dict())
    other.tokenizer, other.generation_config = model.tokenizer, model.generation_config
    return other


@pytest.mark.parametrize("kind", ["sft", "dpo", "reward_model"])
def test_model_config_fields_that_keep_the_shapes_are_refused(tmp_path, kind):
    folder = str(tmp_path / kind)
    prompt = TINY.prompts[0]
    pairs = [(prompt, "a", "b c")] * 4

    def fit(model):
        if kind == "sft":
            return _sft(model).set_params(checkpoint_dir=folder).fit([(prompt, "a b")] * 4)
        if kind == "dpo":
            return DPOPolicy(model=model, batch_size=4, random_state=0, checkpoint_dir=folder).fit(
                pairs
            )
        return RewardModel(
            model=model, batch_size=4, normalize=False, random_state=0, checkpoint_dir=folder
        ).fit(pairs)

    fit(_model_with())
    with pytest.raises(ValueError, match=r"another starting model \(model\.fingerprint"):
        fit(_model_with(activation_function="relu"))


def test_another_tokenizer_eos_is_refused(tmp_path):
    folder = str(tmp_path / "run")
    prompt = TINY.prompts[0]
    _sft(TINY.policy_model(), TINY.tokenizer).set_params(checkpoint_dir=folder).fit(
        [(prompt, "a b")] * 4
    )
    other = copy.deepcopy(TINY.tokenizer)
    other.eos_token = other.pad_token
    with pytest.raises(ValueError, match=r"written with tokenizer\."):
        _sft(TINY.policy_model(), other).set_params(checkpoint_dir=folder).fit(
            [(prompt, "a b")] * 4
        )


# ----- searches: every candidate its own run, scored as a fresh fit --------------------------


# Exact scores from the trained weights alone (a policy's own score samples with its seed).
EXACT = WORLD.scorer("true_quality")
TINY_EXACT = TINY.scorer("true_quality")


def _fresh_score(estimator, params, reward, seed):
    fresh = clone(estimator).set_params(**params, random_state=seed)
    return EXACT(fresh.fit(WORLD.prompts, reward), WORLD.prompts)


def test_searches_with_checkpoint_dir_score_every_candidate_as_a_fresh_fit(tmp_path, monkeypatch):
    import torch
    from peft import LoraConfig

    from prefopt.lm import _base

    real_with_lora = _base.with_lora

    def seeded_with_lora(model, lora):
        # LoRA's A matrices come from torch's global generator (not the fit's own): fix it
        # here so that a fresh fit and a search's candidate start from the same adapter.
        torch.manual_seed(0)
        return real_with_lora(model, lora)

    monkeypatch.setattr(_base, "with_lora", seeded_with_lora)

    root = str(tmp_path / "runs")
    rs = np.random.RandomState
    grids = {
        "n_steps": [1, 2],
        "kl": [AdaptiveKLController(target=1.0), AdaptiveKLController(target=0.1)],
    }
    for name, values in grids.items():  # SeedSearchCV over n_steps and KL controller objects
        est = small_rloo(checkpoint_dir=root)
        search = SeedSearchCV(est, {name: values}, seeds=[0], refit=False, scoring=EXACT)
        search.fit(WORLD.prompts, reward_model=reward_a)
        for i, params in enumerate(search.cv_results_["params"]):
            expected = _fresh_score(small_rloo(), params, reward_a, 0)
            assert search.cv_results_["seed0_test_score"][i] == expected, (name, params)
    # GridSearchCV over RandomState objects (one split: train on the prompts, score on them).
    everything = np.arange(len(WORLD.prompts))
    grid = GridSearchCV(
        small_rloo(checkpoint_dir=root),
        {"random_state": [rs(0), rs(1)]},
        cv=[(everything, everything)],
        refit=False,
        scoring=EXACT,
    ).fit(WORLD.prompts, reward_model=reward_a)
    for i, seed in enumerate((0, 1)):
        fresh = small_rloo(random_state=rs(seed)).fit(WORLD.prompts, reward_a)
        assert grid.cv_results_["split0_test_score"][i] == EXACT(fresh, WORLD.prompts)
    # compare over two rewards in one checkpoint_dir: each its own run.
    for reward in (reward_a, reward_b):
        result = compare(
            {"rloo": small_rloo(checkpoint_dir=root)},
            WORLD.prompts,
            reward_model=reward,
            seeds=1,
            scoring=EXACT,
        )
        value = result.results["value"].iloc[0]
        assert value == _fresh_score(small_rloo(), {}, reward, 0)
    # Seven runs: compare's reward_a run (seed 0, n_steps=2) is the n_steps search's second
    # candidate, the same run, resumed from its folder; every other run has its own.
    assert len([f for f in os.listdir(root) if f.startswith("RLOOPolicy-")]) == 7
    # Model config objects and LoraConfig objects on a transformers policy.
    models = [_model_with(), _model_with(layer_norm_epsilon=1e-2)]
    loras = [
        LoraConfig(r=2, lora_alpha=2, target_modules=["c_attn"]),
        LoraConfig(r=2, lora_alpha=16, target_modules=["c_attn"]),
    ]
    for name, values in (("model", models), ("lora", loras)):
        est = RLOOPolicy(
            model=TINY.policy_model(), n_steps=1, batch_size=4, learning_rate=1e-2
        ).set_params(checkpoint_dir=os.path.join(root, "lm"))
        search = SeedSearchCV(est, {name: values}, seeds=[0], refit=False, scoring=TINY_EXACT)
        search.fit(TINY.prompts, reward_model=TINY.reward)
        for i, params in enumerate(search.cv_results_["params"]):
            fresh = clone(est).set_params(**params, random_state=0, checkpoint_dir=None)
            expected = TINY_EXACT(fresh.fit(TINY.prompts, TINY.reward), TINY.prompts)
            assert search.cv_results_["seed0_test_score"][i] == expected, (name, i)
