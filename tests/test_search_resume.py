"""A checkpointed SeedSearchCV killed mid-run resumes in a new process: nothing is redone.

The search runs in a subprocess that is killed (SIGKILL: no clean-up, no final checkpoint)
during its third cell. The same script, run again in a new process, finds every finished
cell's folder and trains none of them again, continues the killed cell from its last
checkpoint, runs the cell not yet started, and reports the scores of an uninterrupted run.
The reward is noisy (its random state is part of each checkpoint) and shared by the cells.
"""

import json
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import json, os, signal, sys
sys.path.insert(0, {root!r})
import torch
torch.set_num_threads(1)
import prefopt
from prefopt import NoisyReward, RLOOPolicy
from prefopt.model_selection import SeedSearchCV
from prefopt.worlds import PreferenceWorld

prefopt.set_config(show_progress_bar=False)
folder, log, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
world = PreferenceWorld(rater_bias=1.0, random_state=0)


def count(estimator, row):  # every training step, written down; the kill at step kill_at
    with open(log, "a") as f:
        f.write(f"{{estimator.beta}} {{estimator.random_state}} {{estimator.n_iter_}}\\n")
    with open(log) as f:
        if kill_at and len(f.readlines()) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


policy = RLOOPolicy(
    model=world.policy_model(), learning_rate=2.0, optimizer="sgd", n_steps=3,
    batch_size=16, lr_schedule="constant", checkpoint_dir=folder, checkpoint_every=1,
)
search = SeedSearchCV(
    policy, {{"beta": [0.1, 0.3]}}, seeds=2, refit=False,
    scoring=world.scorer("true_quality"),
)
reward = NoisyReward(world.true_quality, std=0.5, random_state=0)
search.fit(world.prompts, reward_model=reward, callback=count)
print(json.dumps([search.cv_results_[f"seed{{s}}_test_score"].tolist() for s in (0, 1)]))
"""


def _run(script, folder, log, kill_at=0):
    return subprocess.run(
        [sys.executable, str(script), str(folder), str(log), str(kill_at)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _states(folder):
    return {
        name: open(os.path.join(folder, name, "state.json")).read()
        for name in sorted(os.listdir(folder))
        if name.startswith("RLOOPolicy-")
        and os.path.exists(os.path.join(folder, name, "state.json"))
    }


def test_a_killed_search_resumes_every_finished_cell_in_a_new_process(tmp_path):
    script = tmp_path / "search.py"
    script.write_text(SCRIPT.format(root=ROOT))
    folder, log = tmp_path / "runs", tmp_path / "steps.log"
    # 2 candidates x 2 seeds x 3 steps; the kill comes at step 8: two cells done, the
    # third at its step 2 (its checkpoint of step 2 written), the fourth not started.
    killed = _run(script, folder, log, kill_at=8)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    before = _states(folder)
    assert len(before) == 3
    done = {k for k, v in before.items() if json.loads(v)["fitted"]["n_iter_"] == 3}
    assert len(done) == 2
    assert sorted(json.loads(v)["fitted"]["n_iter_"] for v in before.values()) == [2, 3, 3]

    resumed = _run(script, folder, log)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = log.read_text().splitlines()
    # The new process trained 4 steps: the killed cell's third and the last cell's three.
    assert len(steps) == 12
    assert [s.split()[2] for s in steps[8:]] == ["3", "1", "2", "3"]
    after = _states(folder)
    assert len(after) == 4  # one folder per cell: none orphaned, none redone elsewhere
    assert all(after[k] == before[k] for k in done)  # finished cells: not even rewritten

    # The scores equal those of a search that was never interrupted.
    whole = _run(script, tmp_path / "whole", tmp_path / "whole.log")
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert json.loads(resumed.stdout.splitlines()[-1]) == json.loads(whole.stdout.splitlines()[-1])
    assert len((tmp_path / "whole.log").read_text().splitlines()) == 12
    # Each cell's weights too (the folders share names: the identity is the same).
    for name in after:
        state = json.loads(after[name])
        other = json.loads(open(tmp_path / "whole" / name / "state.json").read())
        assert state["fitted"]["n_iter_"] == other["fitted"]["n_iter_"] == 3
        assert state["tensors_sha256"] == other["tensors_sha256"]
