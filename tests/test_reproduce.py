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
