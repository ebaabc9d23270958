"""Bad input gets a clear error; runs survive interruption; numerical faults stop cleanly."""

import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import joblib
import numpy as np
import pytest
import torch
from _tiny import tiny_lm, word_tokenizer

from prefopt import (
    AdaptiveKLController,
    PPOPolicy,
    ReinforcePolicy,
    RewardModel,
    RLOOPolicy,
    SFTPolicy,
)
from prefopt.validation import InvalidParameterError
from prefopt.worlds import PreferenceWorld

ROOT = Path(__file__).resolve().parents[1]
WORLD = PreferenceWorld(random_state=0)
PROMPTS = ["the movie was", "the plot was"]


@pytest.fixture(scope="module")
def rm():
    return RewardModel().fit(WORLD.comparisons(500, random_state=0))


def world_policy(cls=RLOOPolicy, **kw):
    params = dict(
        model=WORLD.policy_model(),
        beta=0.3,
        learning_rate=1.0,
        optimizer="sgd",
        n_steps=6,
        random_state=0,
    )
    params.update(kw)
    return cls(**params)


def strip(history):
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in history]


# ----- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompts, error, match",
    [
        ([], ValueError, "No prompts"),
        (["ok", ""], ValueError, "row 1 is empty"),
        (["ok", 3], TypeError, "row 1 is int"),
        ("one string", TypeError, "not one string"),
    ],
)
def test_bad_prompts(rm, prompts, error, match):
    with pytest.raises(error, match=match):
        world_policy().fit(prompts, rm)


@pytest.mark.parametrize(
    "reward, match",
    [
        (lambda p, c: np.zeros(len(c) + 1), r"shape \(\d+,\) for \d+ completions"),
        (lambda p, c: np.full(len(c), np.nan), r"step 1\) returned a non-finite value \(nan\)"),
        (lambda p, c: np.full(len(c), np.inf), r"non-finite value \(inf\)"),
        (lambda p, c: "good", r"must return numbers|shape"),
    ],
)
def test_bad_rewards(reward, match):
    with pytest.raises((ValueError, TypeError), match=match):
        world_policy().fit(WORLD.prompts, reward)


@pytest.mark.parametrize(
    "params, match",
    [
        ({"k": 1}, "'k' parameter of RLOOPolicy"),
        ({"beta": -0.1}, "'beta' parameter"),
        ({"kl": AdaptiveKLController(target=0.0)}, "'target' parameter"),
        ({"learning_rate": "fast"}, "'learning_rate' parameter"),
        ({"batch_size": 30}, "multiple of k=4"),
    ],
)
def test_bad_parameters(rm, params, match):
    with pytest.raises((InvalidParameterError, ValueError), match=match):
        world_policy(**params).fit(WORLD.prompts, rm)


def test_missing_reward_and_uncallable_reward():
    with pytest.raises(ValueError, match="needs a reward"):
        world_policy().fit(WORLD.prompts)
    with pytest.raises(TypeError, match="must be callable"):
        world_policy().fit(WORLD.prompts, 3.0)


def test_tokenizer_without_eos_is_refused():
    model = tiny_lm()
    model.tokenizer = word_tokenizer(eos=None)
    with pytest.raises(ValueError, match="no EOS token"):
        RLOOPolicy(model=model, n_steps=1).fit(PROMPTS, lambda p, c: np.zeros(len(c)))


def test_too_long_prompt_error_and_truncation():
    reward = lambda p, c: np.zeros(len(c))  # noqa: E731
    long_prompt = "the movie was good .\n\n" + "the plot was bad . " * 8
    with pytest.raises(ValueError, match="row 1 has .* tokens, more than the 24"):
        RLOOPolicy(model=tiny_lm(), max_new_tokens=8, n_steps=1, batch_size=4, k=2).fit(
            ["the movie was", long_prompt], reward
        )
    policy = RLOOPolicy(
        model=tiny_lm(),
        max_new_tokens=8,
        n_steps=1,
        batch_size=4,
        k=2,
        truncate_prompts=True,
        random_state=0,
    ).fit(["the movie was", long_prompt], reward)
    # Cut at the paragraph boundary: only the first paragraph is left.
    assert (
        policy._loop.prompt_tokens[1]
        == policy.tokenizer_("the movie was good .", add_special_tokens=False)["input_ids"]
    )


def test_comparisons_errors():
    with pytest.raises(ValueError, match="missing"):
        RewardModel().fit({"prompt": ["a"], "chosen": ["b"]})
    with pytest.raises(ValueError, match="different lengths"):
        RewardModel().fit({"prompt": ["a", "b"], "chosen": ["c"], "rejected": ["d"]})
    with pytest.raises(ValueError, match="identical at row 0"):
        RewardModel().fit([("a", "same", "same")])


# ----- interrupted runs ----------------------------------------------------------------

KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import prefopt
    from prefopt import RLOOPolicy, RewardModel
    from prefopt.worlds import PreferenceWorld
    prefopt.set_config(show_progress_bar=False)
    world = PreferenceWorld(random_state=0)
    rm = RewardModel().fit(world.comparisons(500, random_state=0))

    def die(policy, row):
        if row["step"] == 7:  # checkpoints were written at steps 3 and 6
            os.kill(os.getpid(), signal.SIGKILL)

    RLOOPolicy(model=world.policy_model(), beta=0.3, learning_rate=1.0, optimizer="sgd",
               n_steps=10, checkpoint_dir={directory!r}, checkpoint_every=3,
               random_state=0).fit(world.prompts, rm, callback=die)
""")


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_result(rm, tmp_path):
    directory = str(tmp_path / "run")
    script = KILLED_RUN.format(tests=str(ROOT / "tests"), directory=directory)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == -9, result.stderr[-2000:]  # killed mid-run
    # No half-written file: the state and the one weights file it names (step 6), the lock.
    assert sorted(os.listdir(directory)) == [".lock", "state.json", "tensors-0000006.safetensors"]
    resumed = world_policy(n_steps=10, checkpoint_dir=directory, checkpoint_every=3)
    resumed.fit(WORLD.prompts, rm)
    whole = world_policy(n_steps=10).fit(WORLD.prompts, rm)
    assert resumed.n_iter_ == 10
    assert torch.equal(resumed.model_.theta, whole.model_.theta)
    assert strip(resumed.history_) == strip(whole.history_)


def test_checkpoint_for_other_prompts_or_version_is_refused(rm, tmp_path):
    directory = str(tmp_path / "run")
    world_policy(n_steps=2, checkpoint_dir=directory).fit(WORLD.prompts, rm)
    with pytest.raises(ValueError, match="other data"):
        world_policy(n_steps=2, checkpoint_dir=directory).fit(WORLD.prompts[:2], rm)
    path = os.path.join(directory, "state.json")
    with open(path) as f:
        state = json.load(f)
    state["format"] = 999
    with open(path, "w") as f:
        json.dump(state, f)
    with pytest.raises(ValueError, match="format 999"):
        world_policy(n_steps=2, checkpoint_dir=directory).fit(WORLD.prompts, rm)


# ----- numerical guards ----------------------------------------------------------------


def test_nan_reward_mid_run_names_the_step_and_keeps_the_checkpoint(tmp_path):
    calls = {"n": 0}

    def flaky(prompts, completions):
        calls["n"] += 1
        return np.full(len(completions), np.nan if calls["n"] == 5 else 1.0)

    directory = str(tmp_path / "run")
    with pytest.raises(ValueError, match="step 5"):
        world_policy(n_steps=8, checkpoint_dir=directory, checkpoint_every=2).fit(
            WORLD.prompts, flaky
        )
    with open(os.path.join(directory, "state.json")) as f:
        state = json.load(f)
    assert state["fitted"]["n_iter_"] == 4 and len(state["fitted"]["history_"]) == 4


def test_max_kl_warns_or_raises(rm):
    with pytest.warns(RuntimeWarning, match="beyond max_kl"):
        world_policy(n_steps=3, max_kl=1e-6).fit(WORLD.prompts, rm)
    with pytest.raises(RuntimeError, match="step 2, beyond max_kl"):
        world_policy(n_steps=3, max_kl=1e-6, max_kl_action="raise").fit(WORLD.prompts, rm)


def test_low_eos_share_warns_once():
    reward = lambda p, c: np.zeros(len(c))  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RLOOPolicy(
            model=tiny_lm(), k=2, batch_size=4, max_new_tokens=1, n_steps=3, random_state=0
        ).fit(PROMPTS, reward)
    eos = [w for w in caught if "ended with EOS" in str(w.message)]
    assert len(eos) == 1


# ----- determinism and safe persistence -------------------------------------------------


def test_same_seed_same_run_on_cpu():
    reward = lambda p, c: np.array([x.count("good") for x in c], dtype=float)  # noqa: E731
    runs = [
        PPOPolicy(
            model=tiny_lm(),
            max_new_tokens=4,
            batch_size=8,
            n_steps=3,
            learning_rate=1e-2,
            random_state=3,
        ).fit(PROMPTS, reward)
        for _ in range(2)
    ]
    assert strip(runs[0].history_) == strip(runs[1].history_)
    for p, q in zip(runs[0].model_.parameters(), runs[1].model_.parameters()):
        assert torch.equal(p, q)


class _NoTensorPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and obj.device.type != "meta":
            raise AssertionError("a tensor with data was pickled")
        return NotImplemented


@pytest.mark.parametrize("cls", [PPOPolicy, RLOOPolicy, ReinforcePolicy])
def test_joblib_round_trip_same_samples_and_no_pickled_tensors(rm, tmp_path, cls):
    policy = world_policy(cls, n_steps=2).fit(WORLD.prompts, rm)
    _NoTensorPickler(open(os.devnull, "wb")).dump(policy)
    path = tmp_path / "policy.joblib"
    joblib.dump(policy, path)
    loaded = joblib.load(path)
    assert loaded.sample(WORLD.prompts, n=4) == policy.sample(WORLD.prompts, n=4)
    np.testing.assert_array_equal(
        loaded.log_prob(WORLD.prompts, WORLD.responses[:4]),
        policy.log_prob(WORLD.prompts, WORLD.responses[:4]),
    )


def test_language_model_estimators_round_trip(tmp_path):
    demos = [("the movie was", "good ."), ("the plot was", "bad .")] * 4
    sft = SFTPolicy(model=tiny_lm(), learning_rate=1e-2, n_epochs=2, random_state=0).fit(demos)
    rm = RewardModel(model=sft, normalize_samples=8, random_state=0).fit(
        [("the movie was", "good .", "bad .")] * 8
    )
    for est in (sft, rm):
        _NoTensorPickler(open(os.devnull, "wb")).dump(est)
        joblib.dump(est, tmp_path / "est.joblib")
        loaded = joblib.load(tmp_path / "est.joblib")
        if est is sft:
            assert loaded.sample(PROMPTS, n=3) == sft.sample(PROMPTS, n=3)
        else:
            np.testing.assert_allclose(
                loaded.predict(PROMPTS, ["good .", "bad ."]),
                rm.predict(PROMPTS, ["good .", "bad ."]),
                atol=1e-6,
            )


def test_save_pretrained_loads_with_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reward = lambda p, c: np.array([x.count("good") for x in c], dtype=float)  # noqa: E731
    policy = RLOOPolicy(
        model=tiny_lm(),
        k=2,
        batch_size=4,
        max_new_tokens=4,
        n_steps=2,
        learning_rate=1e-2,
        random_state=0,
    ).fit(PROMPTS, reward)
    policy.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    assert tok.get_vocab() == policy.tokenizer_.get_vocab()
    completions = ["good .", "bad . the"]
    ours = policy.log_prob(PROMPTS, completions)
    ids = [
        tok(p + " " + c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        for p, c in zip(PROMPTS, completions)
    ]
    for row, (prompt, seq) in enumerate(zip(PROMPTS, ids)):
        n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
        logits = model(torch.tensor([seq])).logits[0, n_prompt - 1 : -1] / policy.temperature_
        logits[:, tok.pad_token_id] = float("-inf")  # the pad token is never sampled
        lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(seq[n_prompt:])[:, None])
        assert lp.sum().item() == pytest.approx(ours[row], abs=1e-4)
    with pytest.raises(TypeError, match="transformers model"):
        world_policy(n_steps=1).fit(WORLD.prompts, lambda p, c: np.zeros(len(c))).save_pretrained(
            tmp_path / "world"
        )
