"""Every reproduction script runs in its --quick mode and writes the CSV columns it declares."""

import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

HERE = Path(__file__).resolve().parents[1] / "benchmarks" / "reproduce"
SCRIPTS = sorted(p.stem for p in HERE.glob("claim*.py"))


def load(name):
    """The script as a module (in this process: one import of torch for all of them)."""
    sys.path.insert(0, str(HERE))
    try:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(HERE))
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_quick_run_writes_its_csv_figure_and_summary(name, tmp_path):
    script = load(name)
    script.main(["--quick", "--out", str(tmp_path)])
    frame = pd.read_csv(tmp_path / f"{name}.csv")
    assert list(frame.columns) == script.COLUMNS
    assert len(frame) > 0
    assert (tmp_path / f"{name}.png").stat().st_size > 0
    summary = json.loads((tmp_path / f"{name}.json").read_text())
    assert summary["quick"] is True
    verdicts = ("reproduced", "partly reproduced", "not reproduced", "inconclusive")
    assert summary["verdict"] in verdicts
    for key in ("claim", "source", "setting", "result", "reason", "commit", "command"):
        assert summary[key], key


def test_the_table_lists_every_script(tmp_path):
    sys.path.insert(0, str(HERE.parents[1]))
    try:
        from benchmarks.reproduce.__main__ import scripts, table
    finally:
        sys.path.remove(str(HERE.parents[1]))
    assert scripts() == SCRIPTS
    text = table(tmp_path)  # no results there: one "not run yet" row a script
    assert text.count("not run yet") == len(SCRIPTS)


def test_a_quick_run_without_out_never_writes_into_the_committed_results():
    common = load("_common")
    quick = common.parse_args("doc", ["--quick"])
    assert quick.out != common.RESULTS and quick.out.is_dir()
    assert not quick.out.resolve().is_relative_to(common.RESULTS.resolve())
    quick.out.rmdir()
    assert common.parse_args("doc", []).out == common.RESULTS


def test_the_rlvr_gate_needs_every_tuning_run_to_gain_healthily_and_every_condition():
    rlvr = load("_rlvr")
    rows = [
        {"arm": "GRPO", "seed": 100, "pass1": 0.25, "healthy": True, "fired": ""},
        {"arm": "GRPO", "seed": 101, "pass1": 0.23, "healthy": True, "fired": ""},
    ]
    # Gains 0.13 and 0.11 over a start of 0.12: both at least 0.10, both healthy.
    passed, text = rlvr.gate(rows, 0.12)
    assert passed and text.startswith("gate passed on tuning seeds [100, 101]")
    assert "gains GRPO 100: 0.130, GRPO 101: 0.110; none unhealthy" in text
    # One gain of 0.09 fails it; so does a health flag, or a failed extra condition.
    assert not rlvr.gate(rows, 0.14)[0]
    sick = [rows[0], {**rows[1], "healthy": False, "fired": "kl_blowup"}]
    passed, text = rlvr.gate(sick, 0.12)
    assert not passed and "unhealthy: GRPO 101 (kl_blowup)" in text
    passed, text = rlvr.gate(rows, 0.12, {"start pass@128 in [0.6, 0.85]": (False, "0.973")})
    assert not passed and "start pass@128 in [0.6, 0.85]: no (0.973)" in text
    assert not rlvr.gate([], 0.12)[0]


def test_the_rlvr_grpo_names_every_setting_and_the_shared_rate():
    from prefopt import AdaptiveLR, GRPOPolicy, SFTPolicy

    rlvr = load("_rlvr")
    # The start's SFT too: all but the model, its tokenizer and n_epochs (the run's setting).
    assert set(SFTPolicy().get_params(deep=False)) - set(rlvr.SFT) == {
        "model",
        "tokenizer",
        "n_epochs",
    }
    # Every GRPO parameter but the model, the rate, the budget and the seed is stated.
    free = set(GRPOPolicy().get_params(deep=False)) - set(rlvr.GRPO_SETTINGS)
    assert free == {"model", "tokenizer", "learning_rate", "n_steps", "batch_size", "random_state"}
    policy = rlvr.grpo("sft", n_steps=3, batch_size=16, tokenizer=None)
    assert isinstance(policy.learning_rate, AdaptiveLR)
    assert policy.learning_rate.get_params() == {
        "anneal": False,
        "factor": 1.5,
        "learning_rate": 3e-5,
        "max_lr": 3e-4,
        "min_lr": 1e-6,
        "target": 0.002,
    }
