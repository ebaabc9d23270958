import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import prefopt
from prefopt import RewardModel
from prefopt.worlds import PreferenceWorld

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_row(output, name):
    match = re.search(rf"^  {re.escape(name)} +(.*)$", output, flags=re.MULTILINE)
    assert match, f"no row {name!r} in:\n{output}"
    return [float(v) for v in match.group(1).split()]


@pytest.mark.slow
def test_preference_world_example_runs(tmp_path):
    out = tmp_path / "preference_world.png"
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "preference_world.py"),
            "--steps",
            "3",
            "--seed",
            "1",
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.exists() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = proc.stdout
    for name in (
        "reward",
        "true quality",
        "KL (nats)",
        "objective",
        "PPO",
        "RLOO (k=4)",
        "REINFORCE",
        "RAFT (k=4)",
        "optimum",
    ):
        table_row(text, name)
    assert "RAFT converges towards" in text

    # start is the reference and optimum the closed form: recompute both here.
    world = PreferenceWorld(rater_bias=1.0, random_state=1)
    rm = RewardModel().fit(world.comparisons(1000, random_state=1))
    start = world.evaluate(world.reference_probs(), rm, 0.3)
    optimum = world.optimum(rm, 0.3)
    for name, key in [("reward", "reward"), ("true quality", "true_quality"), ("KL (nats)", "kl")]:
        row = table_row(text, name)
        assert row[0] == pytest.approx(start[key], abs=1e-3)
        assert row[2] == pytest.approx(optimum[key], abs=1e-3)
        assert row[3] == pytest.approx(row[1] - row[2], abs=2e-3)


def test_path_callback_does_not_change_the_fit():
    example = load_example("preference_world")
    world = PreferenceWorld(rater_bias=1.0, random_state=0)
    rm = RewardModel().fit(world.comparisons(1000, random_state=0))
    with prefopt.config_context(show_progress_bar=False):
        stepped, path = example.fit_path(
            example.make_policies(world, beta=0.3, n_steps=3, seed=0)["PPO"],
            world,
            rm,
            0.3,
            progress=False,
        )
        whole = example.make_policies(world, beta=0.3, n_steps=3, seed=0)["PPO"].fit(
            world.prompts, rm
        )
    assert [row["step"] for row in path] == [0, 1, 2, 3]
    assert path[0]["kl"] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_array_equal(world.policy_probs(stepped), world.policy_probs(whole))
    assert path[-1] == world.evaluate(whole, rm, 0.3) | {"step": 3}
    assert stepped.n_iter_ == 3


@pytest.mark.parametrize("name", ["demo", "preference_world", "search_and_compare"])
def test_an_example_without_matplotlib_names_the_pip_command(tmp_path, name):
    # A matplotlib that cannot be imported, first on the path: what a plain install sees.
    (tmp_path / "matplotlib.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n"
    )
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)},
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert 'pip install "prefopt[plot]"' in proc.stderr
    assert "Traceback" not in proc.stderr
