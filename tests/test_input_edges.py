"""Input edges: each gets an error naming the row or parameter and the fix, or a warning.

Tiny models only (tests/_tiny.py and the worlds); nothing here touches the network.
"""

import warnings

import numpy as np
import pytest
from _tiny import tiny_lm

from prefopt import RewardModel, RLOOPolicy, SFTPolicy
from prefopt.data import check_prompts, check_texts
from prefopt.rewards import check_rewards
from prefopt.worlds import PreferenceWorld, TinyLMWorld

DEMOS = [("the movie", "was good .")] * 4


@pytest.fixture(scope="module")
def sft():
    return SFTPolicy(model=tiny_lm(), learning_rate=1e-2, random_state=0).fit(DEMOS)


@pytest.fixture(scope="module")
def pref():
    world = PreferenceWorld(random_state=0)
    rm = RewardModel().fit(world.comparisons(200, random_state=0))
    policy = RLOOPolicy(model=world.policy_model(), n_steps=1, batch_size=4, k=2, random_state=0)
    return world, rm, policy.fit(world.prompts, world.true_quality)


@pytest.fixture(scope="module")
def word_sft():
    """A policy whose word-level tokenizer has no unknown token (the tiny-LM world's)."""
    world = TinyLMWorld(random_state=0)
    policy = SFTPolicy(model=world.policy_model(), learning_rate=1e-2, random_state=0)
    return world, policy.fit([(world.prompts[0], "a")] * 4)


# ----- 12: a bare string is refused, not split into characters --------------------------


def test_log_prob_refuses_a_bare_string(sft):
    with pytest.raises(TypeError, match=r"prompts must be a list of strings.*\['the'\]"):
        sft.log_prob("the", ["good"])
    with pytest.raises(TypeError, match=r"completions must be a list of strings.*\['good'\]"):
        sft.log_prob(["the"], "good")


def test_reward_model_refuses_a_bare_string(pref):
    world, rm, _ = pref
    prompt, response = world.prompts[0], world.responses[0]
    with pytest.raises(TypeError, match="RewardModel.predict: prompts must be a list"):
        rm.predict(prompt, [response])
    with pytest.raises(TypeError, match="completions must be a list of strings, not one"):
        rm([prompt], response)


def test_check_texts_refuses_bare_bytes_and_non_text_rows():
    with pytest.raises(TypeError, match="not bytes; decode and wrap it"):
        check_texts(b"abc", "completion", "predict")
    with pytest.raises(TypeError, match="completion at row 1 is int"):
        check_texts(["a", 3], "completion", "predict")
    assert check_texts(["a", [1, 2]], "completion", "log_prob", token_ids=True) == ["a", [1, 2]]


# ----- 13: each edge gets a message that says what to do --------------------------------


def test_words_a_word_level_tokenizer_cannot_encode_name_the_row(word_sft):
    world, policy = word_sft
    prompt = world.prompts[0]
    with pytest.raises(ValueError, match=r"prompt at row 1 \('a 😀'\) cannot be tokenized"):
        policy.sample([prompt, "a 😀"])
    with pytest.raises(ValueError, match=r"completion at row 1 \('b\\x07'\) cannot be"):
        policy.log_prob([prompt, prompt], [[4], "b\x07"])  # rows count token-id rows too
    with pytest.raises(ValueError, match="completion at row 1 .* remove or replace"):
        SFTPolicy(model=world.policy_model()).fit([(prompt, "a"), (prompt, "😀")])


def test_bytes_prompts_name_the_row_and_say_decode(sft):
    with pytest.raises(TypeError, match=r"prompt at row 1 is bytes .* decode it"):
        check_prompts(["the", b"movie"])
    with pytest.raises(TypeError, match=r"prompt at row 0 is bytes .* decode it"):
        sft.log_prob([b"the"], ["good"])
    with pytest.raises(TypeError, match="Prompts must be a list of strings, not bytes"):
        sft.sample(b"the movie")


@pytest.mark.parametrize("values", [["1.0", "2"], [b"1", 2], [1.0, "2"], np.array(["1", "2"])])
def test_check_rewards_refuses_text(values):
    with pytest.raises(TypeError, match="returned text .* for completion .*, not numbers"):
        check_rewards(values, 2)


def test_chosen_and_rejected_that_tokenize_identically_name_the_row():
    rows = [("the movie", "good .", "bad ."), ("the movie", "good .", "good  .")]
    with pytest.raises(ValueError, match="tokenize identically at row 1"):
        RewardModel(model=tiny_lm(), normalize=False, random_state=0).fit(rows)


@pytest.mark.parametrize("n", [2.5, "2", True])
def test_sample_refuses_a_non_integer_n(sft, n):
    with pytest.raises(TypeError, match="n must be an int"):
        sft.sample(["the"], n=n)


@pytest.mark.parametrize("seed", [1.5, "1", -1])
def test_sample_refuses_a_bad_seed_naming_random_state(sft, seed):
    with pytest.raises(ValueError, match="'random_state' parameter of SFTPolicy.sample"):
        sft.sample(["the"], random_state=seed)


def test_score_warns_that_y_is_ignored(sft, pref):
    world, rm, _ = pref
    with pytest.warns(UserWarning, match="SFTPolicy.score ignores y"):
        sft.score(DEMOS, y=[1.0] * 4)
    with pytest.warns(UserWarning, match="RewardModel.score ignores y"):
        rm.score(world.comparisons(8, random_state=1), y=np.ones(8))


def test_policy_score_refuses_a_non_callable_y(pref):
    world, _, policy = pref
    with pytest.raises(TypeError, match=r"y is the reward to score with and must be callable"):
        policy.score(world.prompts, y=[1.0] * len(world.prompts))


def test_a_tiny_temperature_warns_at_fit(pref):
    world = pref[0]
    policy = RLOOPolicy(model=world.policy_model(), temperature=0.01, n_steps=1, batch_size=4, k=2)
    with pytest.warns(UserWarning, match="temperature=0.01 makes sampling greedy"):
        policy.fit(world.prompts, world.true_quality)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        # Nearly greedy: the 2 samples of a prompt coincide, which the dead_groups health
        # detector reports; this test is about the temperature warning alone.
        policy.set_params(temperature=0.05, on_unhealthy="ignore")
        policy.fit(world.prompts, world.true_quality)


def test_max_new_tokens_beyond_the_context_names_it():
    message = "max_new_tokens=40 does not fit the model's context of 32 tokens"
    with pytest.raises(ValueError, match=message):
        SFTPolicy(model=tiny_lm(), max_new_tokens=40).fit(DEMOS)


def test_max_new_tokens_beyond_the_context_at_sample(sft):
    sft = SFTPolicy(**sft.get_params()).fit(DEMOS)
    sft.max_new_tokens_ = 32  # as a model whose generation config asks for too many
    with pytest.raises(ValueError, match="at most 31"):
        sft.sample(["the"])


@pytest.mark.parametrize("parameter", ["model", "tokenizer"])
def test_a_missing_local_folder_fails_at_once(parameter, tmp_path):
    missing = str(tmp_path / "no" / "such" / "dir")
    params = {"model": tiny_lm(), parameter: missing}
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SFTPolicy(**params).fit(DEMOS)
    with pytest.raises(FileNotFoundError, match=r"model='./no/such/dir': the folder"):
        SFTPolicy(model="./no/such/dir").fit(DEMOS)


def test_a_hub_name_missing_from_the_cache_says_so():
    name = "prefopt-tests/no-such-model"  # looked up in the local cache only
    with pytest.raises(FileNotFoundError, match="not a local folder, and no copy of it"):
        SFTPolicy(model=tiny_lm(), tokenizer=name).fit(DEMOS)


def test_policy_score_without_a_reward_says_to_pass_one(pref):
    world, _, policy = pref
    loaded = RLOOPolicy(**policy.get_params())
    loaded.__dict__.update(policy.__dict__, reward_model_=None)  # as joblib.load of a lambda's
    with pytest.raises(ValueError, match=r"no reward to score with .* score\(X, y=reward\)"):
        loaded.score(world.prompts)
    assert np.isfinite(loaded.score(world.prompts, y=world.true_quality))


@pytest.mark.parametrize("kind", ["dpo", "sft"])
def test_supervised_fits_do_not_ask_for_max_new_tokens_they_never_use(kind):
    # A context of 16 tokens, under the default of 53 new tokens: DPO (and, ours, SFT) never
    # sample in fit, so they fit; sample() then names max_new_tokens, as it must.
    from prefopt import DPOPolicy

    model = tiny_lm(n_positions=16)
    if kind == "dpo":
        est = DPOPolicy(model=model, batch_size=4, n_epochs=1, random_state=0)
        est.fit([("the movie was", "good .", "bad .")] * 4)
    else:
        est = SFTPolicy(model=model, batch_size=4, n_epochs=1, random_state=0).fit(DEMOS)
    if kind == "dpo":
        with pytest.raises(ValueError, match=r"max_new_tokens=None \(resolved to 53\) does not"):
            est.sample(["the movie"])
    with pytest.raises(ValueError, match="max_new_tokens=40 does not fit the model's context"):
        est.set_params(max_new_tokens=40).fit(
            DEMOS if kind == "sft" else [("the movie was", "good .", "bad .")] * 4
        )


@pytest.mark.parametrize("name", ["PPOPolicy", "GRPOPolicy", "ReinforcePlusPlusPolicy"])
@pytest.mark.parametrize("clip_coef", [1.5, 1.0])  # ours: 1.0, the ratio's lower bound at 0
def test_clip_coef_at_or_above_one_is_refused(name, clip_coef):
    import prefopt

    world = PreferenceWorld(random_state=0)
    est = getattr(prefopt, name)(model=world.policy_model(), clip_coef=clip_coef, n_steps=1)
    with pytest.raises(ValueError, match=r"'clip_coef' parameter .* range \(0.0, 1.0\)"):
        est.fit(world.prompts, world.true_quality)


def test_overlong_cache_beyond_max_new_tokens_is_refused_before_training():
    from prefopt import GRPOPolicy

    world = TinyLMWorld(random_state=0)
    calls = []

    def reward(prompts, completions):
        calls.append(1)
        return world.reward(prompts, completions)

    est = GRPOPolicy(model=world.policy_model(), max_new_tokens=4, overlong_cache=5, n_steps=1)
    with pytest.raises(ValueError, match=r"overlong_cache=5 is larger than max_new_tokens=4"):
        est.fit(world.prompts, reward)
    assert not calls
    # Ours: max_new_tokens from the default, not given: the message says where it came from.
    est.set_params(max_new_tokens=None, overlong_cache=10_000)
    with pytest.raises(ValueError, match=r"max_new_tokens=\d+ \(from (default|generation_config)"):
        est.fit(world.prompts, reward)
    assert not calls
