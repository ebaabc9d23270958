"""The example script under its launchers: Ray Train's TorchTrainer, and torchrun killed outright.

Each test starts ``examples/distributed_fit.py`` in fresh processes (2 gloo ranks on CPU), as a
user would, and reads what it wrote.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import prefopt

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "distributed_fit.py"


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")  # 2 processes on 2 busy cores
    root = str(Path(prefopt.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    return env


@pytest.mark.slow  # starts a local Ray and 2 Ray Train workers: about 1-2 min on 2 busy cores
def test_ray_train_recipe_runs_on_two_local_workers(tmp_path):
    pytest.importorskip("ray.train.torch")
    command = [sys.executable, str(EXAMPLE), "--ray", "2", "--steps", "2", "--batch-size", "8"]
    proc = subprocess.run(
        [*command, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["steps"] == 2 and summary["episodes"] == 16
    assert (tmp_path / "model" / "config.json").exists()


def _kill_hard(pid: int) -> None:
    """SIGKILL torchrun's process group and each worker's (torchrun starts each in its own)."""

    def children(p):
        found = []
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        return found + [d for c in found for d in children(c)]

    for p in [pid, *children(pid)]:  # the whole tree first, then the kills: none restarts
        try:
            os.killpg(os.getpgid(p), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.mark.slow  # 3 torchrun launches of 2 processes: about 1-2 min on 2 busy cores
def test_a_killed_torchrun_run_resumes_to_the_uninterrupted_result(tmp_path):
    from safetensors.torch import load_file

    env = _env()
    torchrun = Path(sys.executable).with_name("torchrun")
    steps = 12

    def command(out, *extra):
        return [str(torchrun), "--standalone", "--nproc_per_node", "2", str(EXAMPLE)] + [
            *("--steps", str(steps), "--batch-size", "8", "--out", str(out), *extra),
        ]

    def run(cmd):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]

    run(command(tmp_path / "whole"))
    folder = tmp_path / "checkpoints"
    resumable = command(tmp_path / "killed", "--checkpoint-dir", str(folder))
    log = tmp_path / "killed.log"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            resumable, env=env, start_new_session=True, stdout=stderr, stderr=stderr
        )
        state = folder / "state.json"
        deadline = time.monotonic() + 300
        while not state.exists():  # the first checkpoint (after step 1)
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 5 minutes"
            time.sleep(0.05)
        _kill_hard(proc.pid)
        proc.wait(timeout=60)
    killed_at = json.loads(state.read_text())["fitted"]["n_iter_"]
    assert 1 <= killed_at < steps  # killed mid-run
    assert not (tmp_path / "killed" / "summary.json").exists()
    run(resumable)  # the same command again: it resumes
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["steps"] == steps and summary["ranks"] == 2
    whole = load_file(tmp_path / "whole" / "model" / "model.safetensors")
    resumed = load_file(tmp_path / "killed" / "model" / "model.safetensors")
    assert whole.keys() == resumed.keys()
    for name, value in whole.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=0)


_GOOD = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"WORLD_SIZE": "abc"}, r"WORLD_SIZE='abc' must be an integer >= 1"),
        ({"RANK": "2"}, r"RANK=2 is not below WORLD_SIZE=2: ranks count 0 to 1"),
        ({"MASTER_ADDR": None}, r"WORLD_SIZE=2 asks for a process group .* MASTER_ADDR is not"),
        ({"RANK": None, "MASTER_ADDR": None}, r"RANK and MASTER_ADDR are not set"),
        # Ours: a negative rank, a port out of range, a LOCAL_RANK that is no number, a
        # world of 0, and a join timeout that is no positive number.
        ({"RANK": "-1"}, r"RANK='-1' must be an integer >= 0"),
        ({"MASTER_PORT": "99999"}, r"MASTER_PORT='99999' must be an integer >= 1 and <= 65535"),
        ({"LOCAL_RANK": "x"}, r"LOCAL_RANK='x' must be an integer >= 0"),
        ({"WORLD_SIZE": "0"}, r"WORLD_SIZE='0' must be an integer >= 1"),
        ({"PREFOPT_DIST_JOIN_TIMEOUT": "-5"}, r"PREFOPT_DIST_JOIN_TIMEOUT='-5' must be"),
        ({"PREFOPT_DIST_JOIN_TIMEOUT": "inf"}, r"PREFOPT_DIST_JOIN_TIMEOUT='inf' must be"),
    ],
)
def test_launcher_variables_are_checked_in_one_place_before_any_wait(monkeypatch, changes, message):
    from prefopt import RLOOPolicy
    from prefopt.worlds import PreferenceWorld

    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for name, value in {**_GOOD, **changes}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    world = PreferenceWorld(random_state=0)
    calls = []

    def reward(prompts, completions):
        calls.append(1)
        return world.true_quality(prompts, completions)

    # Nobody listens on the port: a check that came after the rendezvous would wait there.
    with pytest.raises((ValueError, RuntimeError), match=message):
        RLOOPolicy(model=world.policy_model(), n_steps=1, batch_size=8).fit(world.prompts, reward)
    assert not calls and not torch.distributed.is_initialized()
    # Under distributed="none" the variables are not read at all.
    with prefopt.config_context(distributed="none"):
        RLOOPolicy(model=world.policy_model(), n_steps=1, batch_size=8).fit(world.prompts, reward)
    assert calls
