"""prefopt.load reads a folder as data: planted code never runs, bad files are refused clearly."""

import contextlib
import copy
import errno
import json
import os
import shutil
import signal
import sys

import numpy as np
import pytest
from _tiny import small_policy

import prefopt
from prefopt import AdaptiveKLController, ReinforcePolicy, RewardModel, RLOOPolicy, SFTPolicy
from prefopt.worlds import PreferenceWorld, TinyLMWorld

WORLD = PreferenceWorld(random_state=0)
TINY = TinyLMWorld(random_state=0)
PLANTED = "prefopt_planted_module"


@pytest.fixture(autouse=True)
def quiet():
    prefopt.set_config(show_progress_bar=False)


@contextlib.contextmanager
def no_hang(seconds=30):
    """Fail, instead of blocking the suite, if a read waits on a FIFO."""

    def fail(*_):
        raise AssertionError(f"load blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A LoRA policy with a KL controller and a nested language-model reward model, saved."""
    from peft import LoraConfig

    root = tmp_path_factory.mktemp("saved")
    sft = SFTPolicy(model=TINY.policy_model(), random_state=0).fit([(TINY.prompts[0], "a")] * 4)
    pairs = [(p, "a", "b c") for p in TINY.prompts] * 2
    rm = RewardModel(model=sft, normalize_samples=8, batch_size=4, random_state=0).fit(pairs)
    policy = RLOOPolicy(
        model=TINY.policy_model(),
        kl=AdaptiveKLController(),
        lora=LoraConfig(r=2, target_modules=["c_attn"]),
        n_steps=1,
        batch_size=4,
        random_state=0,
    ).fit(TINY.prompts, rm)
    return policy.save(root / "policy")


@pytest.fixture
def hostile(saved, tmp_path, monkeypatch):
    """A copy of the saved folder, a module that leaves a marker when imported, and the marker."""
    folder = str(tmp_path / "folder")
    shutil.copytree(saved, folder)
    marker = tmp_path / "MARKER"
    code = (
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "class Planted:\n    pass\n"
    )
    for where in (folder, str(tmp_path)):  # in the folder, and importable by name
        with open(os.path.join(where, f"{PLANTED}.py"), "w") as f:
            f.write(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield folder, marker
    sys.modules.pop(PLANTED, None)


def _code_runners(folder, marker):
    """Dotted names of functions that run code, with arguments that would run the planted file."""
    return {
        "transformers.dynamic_module_utils.get_class_from_dynamic_module": {
            "class_reference": f"{PLANTED}.Planted",
            "pretrained_model_name_or_path": folder,
        },
        "transformers.AutoModel.from_pretrained": {
            "pretrained_model_name_or_path": folder,
            "trust_remote_code": True,
        },
        "importlib.import_module": {"name": PLANTED},
        "builtins.eval": {"source": f"__import__({PLANTED!r})"},
        "builtins.exec": {"source": f"import {PLANTED}"},
        "os.system": {"command": f"touch {marker}"},
        "peft.PeftModel.from_pretrained": {"model": None, "model_id": folder},
        "peft.get_peft_model": {"model": None, "peft_config": None},
        "prefopt.backend.serialization._import": {"path": f"{PLANTED}.Planted"},
    }


def _edit(path, change):
    with open(path) as f:
        state = json.load(f)
    change(state)
    with open(path, "w") as f:
        json.dump(state, f)


def _plantings(folder, name, kwargs):
    """Every field the loader reads, each set to a code runner."""
    top, nested = (
        os.path.join(folder, "estimator.json"),
        os.path.join(folder, "reward_model", "estimator.json"),
    )

    def as_class(s):
        s["class"], s["params"] = name, kwargs

    def in_params(s):
        s["params"]["kl"] = {"__estimator__": name, "params": kwargs}

    def in_nested_params(s):
        s["params"]["kl"] = {
            "__estimator__": "prefopt.AdaptiveKLController",
            "params": {"target": {"__estimator__": name, "params": kwargs}},
        }

    def in_fitted(s):
        s["fitted"]["kl_"] = {"__estimator__": name, "params": kwargs, "fitted": {}}

    def as_state_object(s):
        s["fitted"]["baseline_"] = {"__state__": kwargs, "class": name}

    def as_model_class(s):
        s["modules"]["model_"]["base"]["class"] = name

    def as_config_class(s):
        s["modules"]["model_"]["base"]["config_class"] = name

    def as_backbone(s):
        s["modules"]["model_"]["backbone"]["class"] = name

    return [
        (top, as_class),
        (top, in_params),
        (top, in_nested_params),
        (top, in_fitted),
        (top, as_state_object),
        (top, as_model_class),
        (top, as_config_class),
        (nested, as_class),
        (nested, as_backbone),
    ]


def test_code_planted_in_any_field_never_runs(hostile):
    folder, marker = hostile
    pristine = {
        p: open(p).read()
        for p in (
            os.path.join(folder, "estimator.json"),
            os.path.join(folder, "reward_model", "estimator.json"),
        )
    }
    tried = 0
    for name, kwargs in _code_runners(folder, marker).items():
        for path, change in _plantings(folder, name, kwargs):
            _edit(path, change)
            with pytest.raises(ValueError, match=f"Refusing to load the .*{name}"):
                prefopt.load(folder)
            assert not marker.exists(), (name, change.__name__)
            with open(path, "w") as f:
                f.write(pristine[path])
            tried += 1
    assert tried == 9 * 9
    assert prefopt.load(folder).n_iter_ == 1  # the untouched folder still loads


def test_configs_that_would_load_code_are_refused(hostile):
    folder, marker = hostile
    path = os.path.join(folder, "estimator.json")
    pristine = open(path).read()
    plantings = {
        "config entry 'auto_map'": lambda s: s["modules"]["model_"]["base"]["config"].update(
            auto_map={"AutoModelForCausalLM": f"{PLANTED}.Planted"}
        ),
        "attention implementation": lambda s: s["modules"]["model_"]["base"]["config"].update(
            _attn_implementation=f"kernels-community/{PLANTED}"
        ),
        "kernel implementation": lambda s: s["modules"]["model_"]["base"]["config"].update(
            _experts_implementation=f"kernels-community/{PLANTED}"
        ),
        "LoRA setting megatron_config": lambda s: s["modules"]["model_"]["lora"].update(
            megatron_config={"tensor_model_parallel_size": 1}, megatron_core=PLANTED
        ),
        "peft type": lambda s: s["modules"]["model_"]["lora"].update(peft_type="PROMPT_TUNING"),
        "module kind": lambda s: s["modules"]["model_"].update(kind="pickle"),
        "attribute": lambda s: s["fitted"].update({"__class__": 1}),
    }
    for what, change in plantings.items():
        _edit(path, change)
        with pytest.raises(ValueError, match=f"Refusing to (load|set) the {what}"):
            prefopt.load(folder)
        with open(path, "w") as f:
            f.write(pristine)
    # A tokenizer asking for remote code: transformers refuses it without trust_remote_code.
    _edit(
        os.path.join(folder, "tokenizer", "tokenizer_config.json"),
        lambda s: s.update(auto_map={"AutoTokenizer": [f"{PLANTED}.Planted", None]}),
    )
    with contextlib.suppress(Exception):
        prefopt.load(folder)
    assert not marker.exists()


def test_files_that_are_not_regular_files_in_the_folder_are_refused(hostile, tmp_path):
    folder, _ = hostile
    outside = tmp_path / "outside.safetensors"
    shutil.copy(os.path.join(folder, "tensors.safetensors"), outside)
    for name, make, message in (
        ("tensors.safetensors", os.mkfifo, "is a FIFO, not a regular file"),
        ("estimator.json", os.mkfifo, "is a FIFO, not a regular file"),
        ("tensors.safetensors", lambda p: os.symlink(outside, p), "outside the folder"),
        ("tokenizer/tokenizer.json", lambda p: os.symlink("/etc/hostname", p), "outside"),
    ):
        path = os.path.join(folder, name)
        kept = path + ".kept"
        os.replace(path, kept)
        make(path)
        with no_hang(), pytest.raises(ValueError, match=message):
            prefopt.load(folder)
        os.remove(path)
        os.replace(kept, path)


def test_fifo_named_in_a_checkpoint_never_hangs_a_resume(tmp_path):
    folder = tmp_path / "run"

    def policy():
        return RLOOPolicy(
            model=WORLD.policy_model(), n_steps=1, batch_size=16, checkpoint_dir=str(folder)
        ).set_params(random_state=0, optimizer="sgd", learning_rate=1.0)

    policy().fit(WORLD.prompts, WORLD.true_quality)
    _edit(folder / "state.json", lambda s: s.update(tensors="pipe"))
    os.mkfifo(folder / "pipe")
    with no_hang(), pytest.raises(ValueError, match="pipe' is a FIFO"):
        policy().fit(WORLD.prompts, WORLD.true_quality)


def _linear_rm(seed):
    return RewardModel().fit(WORLD.comparisons(200, random_state=seed))


def test_tensors_from_another_save_are_refused(tmp_path):
    a = _linear_rm(0).save(tmp_path / "a")
    b = _linear_rm(1).save(tmp_path / "b")
    shutil.copy(os.path.join(b, "tensors.safetensors"), os.path.join(a, "tensors.safetensors"))
    with pytest.raises(ValueError, match="not the tensors file estimator.json was written with"):
        prefopt.load(a, featurizer_=WORLD.features)


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '{"format": 2}',
        '{"format": 2, "class": "prefopt.RewardModel", "params": [], "modules": {}, '
        '"objects": {}, "fitted": {}, "suppress_ids": []}',
        "FITTED",
        "PARAMS",
        "SUPPRESS",
    ],
)
def test_malformed_json_gives_a_clear_error(tmp_path, text):
    folder = _linear_rm(0).save(tmp_path / "rm")
    path = os.path.join(folder, "estimator.json")
    state = json.load(open(path))
    if text == "FITTED":  # a tensor reference with no tensor
        state["fitted"]["coef_"] = {"__tensor__": "nowhere"}
    elif text == "PARAMS":  # a parameter the constructor does not take
        state["params"]["alphaa"] = 1.0
    elif text == "SUPPRESS":
        state["suppress_ids"] = [{"a": 1}]
    text = json.dumps(state) if text.isupper() else text
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(ValueError, match=r"estimator\.json|saved|malformed|format"):
        prefopt.load(folder, featurizer_=WORLD.features)


def reward_function(prompts, completions):
    return WORLD.true_quality(prompts, completions)


def test_a_function_reward_is_asked_for_by_one_name(tmp_path):
    policy = ReinforcePolicy(
        model=WORLD.policy_model(), n_steps=2, batch_size=16, random_state=0
    ).fit(WORLD.prompts, reward_function)
    with pytest.warns(UserWarning, match=r"load\(folder, reward=\.\.\.\)"):
        folder = policy.save(tmp_path / "pg")
    model = WORLD.policy_model()
    with pytest.raises(
        ValueError, match=r"reward .*reward_function.*load\(folder, reward=\.\.\.\)"
    ):
        prefopt.load(folder, model_=model)
    with pytest.raises(TypeError, match=r"'reward_model' \(did you mean 'reward'\?\)"):
        prefopt.load(folder, model_=model, reward_model=reward_function)
    with pytest.raises(TypeError, match=r"'modle_' \(did you mean 'model_'\?\)"):
        prefopt.load(folder, modle_=model, reward=reward_function)
    loaded = prefopt.load(folder, model_=model, reward=reward_function)
    assert loaded.score(WORLD.prompts) == policy.score(WORLD.prompts)
    assert loaded.baseline_.count == policy.baseline_.count  # a state object, rebuilt
    assert prefopt.load(folder, model_=model, reward=None).reward_model_ is None


def _disk_full_after(monkeypatch, n_writes):
    from prefopt.backend import serialization

    real, calls = serialization._write, []

    def write(handle, data):
        calls.append(1)
        if len(calls) > n_writes:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(handle, data)

    monkeypatch.setattr(serialization, "_write", write)


def test_disk_full_during_a_checkpoint_keeps_the_last_one(tmp_path, monkeypatch):
    from prefopt.lm import _checkpoint

    folder = str(tmp_path / "run")

    def policy(n_steps):
        return small_policy(
            WORLD,
            RLOOPolicy,
            n_steps=n_steps,
            batch_size=16,
            learning_rate=1.0,
            random_state=0,
            checkpoint_dir=folder,
            checkpoint_every=1,
        )

    with monkeypatch.context() as m:
        _disk_full_after(m, 2)  # step 1's two files, then the disk is full
        with pytest.raises(OSError, match="disk is full.*last complete checkpoint.*is kept"):
            policy(3).fit(WORLD.prompts, WORLD.true_quality)
    kept = _checkpoint.read(folder, policy(3))
    assert kept["fitted"]["n_iter_"] == 1
    assert sorted(f for f in os.listdir(folder) if not f.startswith(".lock")) == [
        "state.json",
        "tensors-0000001.safetensors",
    ]
    resumed = policy(3).fit(WORLD.prompts, WORLD.true_quality)
    fresh = policy(3).set_params(checkpoint_dir=None).fit(WORLD.prompts, WORLD.true_quality)
    assert np.array_equal(resumed.model_.theta.detach(), fresh.model_.theta.detach())


def test_disk_full_during_save_keeps_the_previous_save(tmp_path, monkeypatch):
    first = _linear_rm(0)
    folder = first.save(tmp_path / "rm")
    before = {n: open(os.path.join(folder, n), "rb").read() for n in os.listdir(folder)}
    with monkeypatch.context() as m:
        _disk_full_after(m, 1)
        with pytest.raises(OSError, match="disk is full.*previous save.*is kept"):
            _linear_rm(1).save(folder)
    after = {n: open(os.path.join(folder, n), "rb").read() for n in os.listdir(folder)}
    assert after == before
    loaded = prefopt.load(folder, featurizer_=WORLD.features)
    np.testing.assert_array_equal(loaded.coef_, first.coef_)


def test_every_public_estimator_is_on_the_allow_list():
    from sklearn.base import BaseEstimator

    from prefopt.lm._loadable import ESTIMATORS

    public = {
        name
        for name in prefopt.__all__
        if isinstance(getattr(prefopt, name), type)
        and issubclass(getattr(prefopt, name), BaseEstimator)
        and not getattr(getattr(prefopt, name), "__abstractmethods__", None)
        and name != "KLController"  # the abstract base; its subclasses are listed
        and name != "SeedSearchCV"  # a search, not a fitted model: save its best_estimator_
    }
    assert public <= ESTIMATORS, public - ESTIMATORS
    assert copy.copy(ESTIMATORS) == ESTIMATORS


class HalvingKL(prefopt.KLController):
    """A user's controller: beta halves at every step."""

    def __init__(self, *, beta=None):
        self.beta = beta

    def update(self, kl, n_episodes=None):
        self.beta_ /= 2
        self.n_updates_ += 1
        return self.beta_


def test_a_users_own_controller_is_given_to_load_again(tmp_path):
    policy = RLOOPolicy(
        model=WORLD.policy_model(), kl=HalvingKL(), n_steps=2, batch_size=16, random_state=0
    ).fit(WORLD.prompts, WORLD.true_quality)
    with pytest.warns(UserWarning):
        folder = policy.save(tmp_path / "rloo")
    objects = {"model_": WORLD.policy_model(), "reward": WORLD.true_quality}
    with pytest.raises(ValueError, match=r"Refusing to load the class .*HalvingKL.*kl=\.\.\."):
        prefopt.load(folder, **objects)
    loaded = prefopt.load(folder, kl=HalvingKL(), **objects)
    assert isinstance(loaded.kl, HalvingKL) and isinstance(loaded.kl_, HalvingKL)
    assert loaded.kl_ is not loaded.kl
    assert (loaded.kl_.beta_, loaded.kl_.n_updates_) == (policy.kl_.beta_, policy.kl_.n_updates_)


def test_a_checkpoints_tensors_from_another_run_are_refused(tmp_path):
    def policy(folder, seed):
        return RLOOPolicy(
            model=WORLD.policy_model(),
            n_steps=1,
            batch_size=16,
            random_state=seed,
            checkpoint_dir=str(tmp_path / folder),
        )

    policy("a", 0).fit(WORLD.prompts, WORLD.true_quality)
    policy("b", 1).fit(WORLD.prompts, WORLD.true_quality)
    name = "tensors-0000001.safetensors"
    shutil.copy(tmp_path / "b" / name, tmp_path / "a" / name)
    with pytest.raises(ValueError, match="not the tensors file state.json was written with"):
        policy("a", 0).fit(WORLD.prompts, WORLD.true_quality)


@pytest.mark.parametrize("depth", [300, 100_000])
def test_a_deeply_nested_file_is_refused_clearly(tmp_path, depth):
    # 100,000 levels broke json itself (a RecursionError); ours: 300, which json reads but a
    # rebuild walking it would not. The same for a checkpoint's state.json (ours).
    folder = _linear_rm(0).save(tmp_path / "rm")
    path = os.path.join(folder, "estimator.json")
    state = json.load(open(path))
    nested = "[" * depth + "]" * depth
    text = json.dumps(state).replace('"params": {', '"params": {"deep": ' + nested + ", ", 1)
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(ValueError, match=r"estimator\.json' is nested more than 256 levels"):
        prefopt.load(folder, featurizer_=WORLD.features)
    run = str(tmp_path / "run")
    fit = dict(model=WORLD.policy_model(), n_steps=1, batch_size=8, checkpoint_dir=run)
    RLOOPolicy(**fit).fit(WORLD.prompts, WORLD.true_quality)
    state_path = os.path.join(run, "state.json")
    text = open(state_path).read().replace('"run": {', '"run": {"deep": ' + nested + ", ", 1)
    with open(state_path, "w") as f:
        f.write(text)
    with pytest.raises(ValueError, match=r"Cannot read the checkpoint .*nested more than 256"):
        RLOOPolicy(**fit).fit(WORLD.prompts, WORLD.true_quality)
