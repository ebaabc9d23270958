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
