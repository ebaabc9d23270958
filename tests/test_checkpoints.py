"""Checkpoints: never restore a parameter, never mix runs, never unpickle, fail early."""

import json
import os
import pickle

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV

import prefopt
from prefopt import RewardModel, RLOOPolicy
from prefopt.worlds import PreferenceWorld

WORLD = PreferenceWorld(random_state=0)


@pytest.fixture(scope="module")
def rm():
    prefopt.set_config(show_progress_bar=False)
    return RewardModel().fit(WORLD.comparisons(500, random_state=0))


def policy(**kw):
    params = dict(
        model=WORLD.policy_model(),
        beta=0.3,
        learning_rate=1.0,
        optimizer="sgd",
        n_steps=4,
        random_state=0,
    )
    params.update(kw)
    return RLOOPolicy(**params)


def test_resume_with_another_parameter_is_refused_by_name(rm, tmp_path):
    folder = str(tmp_path / "run")
    policy(checkpoint_dir=folder).fit(WORLD.prompts, rm)
    with pytest.raises(ValueError, match=r"beta=0\.3.*beta=0\.1.*another checkpoint_dir"):
        policy(beta=0.1, checkpoint_dir=folder).fit(WORLD.prompts, rm)
    with pytest.raises(ValueError, match="random_state=0.*random_state=1"):
        policy(random_state=1, checkpoint_dir=folder).fit(WORLD.prompts, rm)
    other_model = WORLD.policy_model()
    with torch.no_grad():
        other_model.theta += 1.0  # same type, other weights
    with pytest.raises(ValueError, match="another starting model"):
        policy(model=other_model, checkpoint_dir=folder).fit(WORLD.prompts, rm)


def test_raising_n_steps_continues_a_finished_run(rm, tmp_path):
    folder = str(tmp_path / "run")
    first = policy(n_steps=3, checkpoint_dir=folder, lr_schedule="constant")
    first.fit(WORLD.prompts, rm)
    longer = policy(n_steps=6, checkpoint_dir=folder, lr_schedule="constant")
    longer.fit(WORLD.prompts, rm)
    whole = policy(n_steps=6, lr_schedule="constant").fit(WORLD.prompts, rm)
    assert longer.n_iter_ == 6
    assert torch.equal(longer.model_.theta, whole.model_.theta)
    # A watched-only parameter (max_kl) may differ on resume.
    again = policy(n_steps=6, checkpoint_dir=folder, lr_schedule="constant", max_kl=100.0)
    assert again.fit(WORLD.prompts, rm).n_iter_ == 6


def test_clones_in_a_search_never_share_a_run(rm, tmp_path):
    folder = str(tmp_path / "search")
    base = policy(n_steps=2, checkpoint_dir=folder)
    search = GridSearchCV(
        base,
        {"beta": [0.03, 3.0]},
        cv=[(np.arange(4), np.arange(4))],
        scoring=WORLD.scorer("objective", beta=0.3),
        refit=False,
    )
    search.fit(WORLD.prompts, reward_model=rm)
    runs = sorted(d for d in os.listdir(folder) if d.startswith("RLOOPolicy-"))
    assert len(runs) == 2
    betas = set()
    for run in runs:
        with open(os.path.join(folder, run, "state.json")) as f:
            betas.add(json.load(f)["defining"]["beta"])
    assert betas == {0.03, 3.0}
    # Each candidate trained its own policy: the scores differ.
    assert search.cv_results_["mean_test_score"][0] != search.cv_results_["mean_test_score"][1]
    # Folds of one candidate differ by their data fingerprint.
    a, b = clone(base), clone(base)
    a.fit(WORLD.prompts[:2], rm)
    b.fit(WORLD.prompts[2:], rm)
    assert len([d for d in os.listdir(folder) if d.startswith("RLOOPolicy-")]) == 4


def test_second_writer_on_one_folder_is_refused(rm, tmp_path):
    import fcntl

    folder = tmp_path / "run"
    folder.mkdir()
    with open(folder / ".lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RuntimeError, match="Another fit is writing"):
            policy(checkpoint_dir=str(folder)).fit(WORLD.prompts, rm)
    policy(checkpoint_dir=str(folder)).fit(WORLD.prompts, rm)  # released: it runs


def test_bad_checkpoint_folders_fail_before_any_work(rm, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    calls = []

    def reward(p, c):
        calls.append(1)
        return np.zeros(len(c))

    for bad, message in (
        (a_file, "is a file"),
        (a_file / "sub", "cannot be written"),
        ("", "empty path"),
    ):
        with pytest.raises(ValueError, match=message):
            policy(checkpoint_dir=str(bad)).fit(WORLD.prompts, reward)
    assert not calls


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_planted_pickles_never_run(rm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    payload = pickle.dumps(_Boom())
    for name in ("state.json", "tensors-0000004.safetensors", "checkpoint.joblib"):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        (folder / name).write_bytes(payload)
        if name.startswith("tensors"):
            (folder / "state.json").write_text(
                json.dumps({"format": 2, "class": "RLOOPolicy", "tensors": name})
            )
        with pytest.raises(ValueError):
            policy(checkpoint_dir=str(folder)).fit(WORLD.prompts, rm)
    assert not (tmp_path / "PWNED").exists()


def test_old_pickle_checkpoint_is_refused_with_the_reason(rm, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "checkpoint.joblib").write_bytes(b"whatever")
    with pytest.raises(ValueError, match="old pickle format.*can run code"):
        policy(checkpoint_dir=str(folder)).fit(WORLD.prompts, rm)


class _Interrupt(Exception):
    pass


def _interrupt_at(monkeypatch, step):
    """Make the supervised loop die at ``step``, as a killed run would."""
    from prefopt.lm.supervised import _step as _supervised

    real = _supervised.accumulated_step

    def dying(optimizer, *args, who, step: int, **kw):
        if step == stop:
            raise _Interrupt
        return real(optimizer, *args, who=who, step=step, **kw)

    stop = step
    monkeypatch.setattr(_supervised, "accumulated_step", dying)


@pytest.mark.parametrize("every", [3, 5])  # mid-epoch, and at an epoch's end
def test_sft_and_reward_model_resume_to_the_uninterrupted_result(monkeypatch, tmp_path, every):
    from prefopt import SFTPolicy
    from prefopt.worlds import TinyLMWorld

    world = TinyLMWorld(random_state=0)
    demos = [(p, c) for p in world.prompts for c in ("a", "b c", "c a b")] * 3
    kw = dict(model=world.policy_model(), batch_size=4, n_epochs=2, random_state=0)
    whole = SFTPolicy(**kw).fit(demos)
    folder = str(tmp_path / "sft")
    _interrupt_at(monkeypatch, 7)  # 5 steps an epoch: dies in the second epoch
    with pytest.raises(_Interrupt):
        SFTPolicy(checkpoint_dir=folder, checkpoint_every=every, **kw).fit(demos)
    monkeypatch.undo()
    resumed = SFTPolicy(checkpoint_dir=folder, checkpoint_every=every, **kw).fit(demos)
    assert resumed.n_iter_ == whole.n_iter_ == 10
    for a, b in zip(whole.model_.parameters(), resumed.model_.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    strip = lambda h: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in h]  # noqa: E731
    assert strip(resumed.history_) == strip(whole.history_)
    with pytest.raises(ValueError, match="learning_rate=None.*learning_rate=0.5"):
        SFTPolicy(checkpoint_dir=folder, learning_rate=0.5, **kw).fit(demos)

    pairs = [(p, "a", "b c") for p in world.prompts] * 6
    rkw = dict(model=whole, batch_size=2, normalize_samples=8, random_state=0)
    rm_whole = RewardModel(**rkw).fit(pairs)
    folder = str(tmp_path / "rm")
    _interrupt_at(monkeypatch, 4)
    with pytest.raises(_Interrupt):
        RewardModel(checkpoint_dir=folder, checkpoint_every=2, **rkw).fit(pairs)
    monkeypatch.undo()
    rm = RewardModel(checkpoint_dir=folder, checkpoint_every=2, **rkw).fit(pairs)
    prompts, completions = list(world.prompts), ["a", "b c"]
    np.testing.assert_allclose(
        rm.predict(prompts, completions), rm_whole.predict(prompts, completions), rtol=1e-6
    )


def test_save_pretrained_checks_its_folder_first(tmp_path):
    from prefopt import SFTPolicy
    from prefopt.worlds import TinyLMWorld

    world = TinyLMWorld(random_state=0)
    sft = SFTPolicy(model=world.policy_model(), random_state=0).fit([(world.prompts[0], "a")] * 4)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for bad, message in (
        (a_file, "is a file"),
        (a_file / "sub", "cannot be written"),
        ("", "empty path"),
    ):
        with pytest.raises(ValueError, match=message):
            sft.save_pretrained(str(bad))
    sft.save_pretrained(tmp_path / "ok")
    assert (tmp_path / "ok" / "config.json").exists()


TWO_THREADS = """
import threading, prefopt
from prefopt import RLOOPolicy
from prefopt.worlds import PreferenceWorld
prefopt.set_config(show_progress_bar=False)
world = PreferenceWorld(random_state=0)
policy = RLOOPolicy(model=world.policy_model(), n_steps=200, learning_rate=0.1,
                    optimizer="sgd", random_state=0)
errors, started = [], threading.Event()
def fit():
    try:
        policy.fit(world.prompts, world.true_quality,
                   callback=lambda p, row: started.set())
    except RuntimeError as exc:
        errors.append(str(exc))
first = threading.Thread(target=fit)
first.start()
started.wait(60)
second = threading.Thread(target=fit)
second.start()
second.join()
first.join()
print("ERRORS", errors)
assert len(errors) == 1 and "already being fitted" in errors[0], errors
assert policy.n_iter_ == 200
"""


def test_one_estimator_fitted_in_two_threads_refuses_the_second():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", TWO_THREADS], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "already being fitted" in result.stdout


@pytest.mark.parametrize("every", [10, 3])
def test_an_early_stop_writes_a_final_checkpoint(rm, tmp_path, every):
    # A callback stops the fit at step 2; checkpoint_every is larger than the steps run (the
    # issue's case), or (ours) due only at step 3: the stop's step is written either way.
    folder = str(tmp_path / "run")

    def stop_at_2(estimator, row):
        return estimator.n_iter_ == 2

    stopped = policy(n_steps=5, checkpoint_dir=folder, checkpoint_every=every)
    stopped.fit(WORLD.prompts, rm, callback=stop_at_2)
    assert stopped.n_iter_ == 2
    with open(os.path.join(folder, "state.json")) as f:
        assert json.load(f)["fitted"]["n_iter_"] == 2
    # The resumed run continues from the stop, to the uninterrupted run's weights.
    again = policy(n_steps=5, checkpoint_dir=folder, checkpoint_every=every).fit(WORLD.prompts, rm)
    whole = policy(n_steps=5).fit(WORLD.prompts, rm)
    assert again.n_iter_ == 5 and len(again.history_) == 5
    assert torch.equal(again.model_.theta.detach(), whole.model_.theta.detach())
