"""benchmarks/defaults_5seeds.py (issue 35's acceptance at the defaults): its verdict and a
smoke run. Speed is never asserted."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "defaults_5seeds.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("defaults_5seeds", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(policy, arm, seed, end, *, warnings=0, fired="", error=""):
    return {
        "world": "arithmetic/gpt2",
        "policy": policy,
        "arm": arm,
        "seed": seed,
        "start": 0.4,
        "end": end,
        "health_warnings": warnings,
        "fired": fired,
        "error": error,
        "cpu_seconds": 10.0,
    }


def test_the_verdict_counts_every_seed_and_pairs_the_gain(bench):
    rows = pd.DataFrame(
        [
            row("GRPO", "default", 1000, 0.5),
            row("GRPO", "default", 1001, 0.6),
            row("GRPO", "old", 1000, 0.45),
            row("GRPO", "old", 1001, 0.5),
            row("RLOO", "default", 1000, 0.3),  # below the start
            row("RLOO", "default", 1001, 0.5, warnings=1, fired="reward_collapse"),
            row("RLOO", "old", 1000, 0.41),
        ]
    )
    table = bench.summary(rows, n_seeds=2).set_index("policy")
    grpo, rloo = table.loc["GRPO"], table.loc["RLOO"]
    assert grpo["holds"] and grpo["above start"] == 2 and grpo["warned runs"] == 0
    assert np.isclose(grpo["min gain"], 0.1) and np.isclose(grpo["default end"], 0.55)
    assert np.isclose(grpo["gain over old"], 0.075)  # (0.05 + 0.10) / 2, paired by seed
    assert not rloo["holds"] and rloo["above start"] == 1 and rloo["warned runs"] == 1
    assert np.isclose(rloo["gain over old"], 0.3 - 0.41) and rloo["paired seeds"] == 1
    # Five seeds asked, two ran: not held, whatever they show.
    assert not bench.summary(rows, n_seeds=5).set_index("policy").loc["GRPO", "holds"]
    text = bench.markdown(table.reset_index())
    line = next(x for x in text.splitlines() if x.startswith("arithmetic/gpt2: gain"))
    mean = float(line.split("mean over policies ")[1].split(";")[0])
    assert abs(mean - (0.075 - 0.11) / 2) < 1e-3 and line.endswith("1/2 policies hold")


def test_the_script_runs_quick_and_writes_a_row_per_fit(bench, capsys):
    table = bench.main(
        ["--quick", "--worlds", "review/gpt2", "--policies", "GRPO", "--seeds", "1", "--jobs", "1"]
    )
    assert table[["world", "policy", "seeds", "paired seeds"]].values.tolist() == [
        ["review/gpt2", "GRPO", 1, 1]
    ]
    assert np.isfinite(table[["start", "default end", "old end"]].to_numpy(float)).all()
    out = capsys.readouterr().out
    assert "GRPO default seed 1000:" in out and "GRPO old seed 1000:" in out
    assert "| world | policy | seeds |" in out


def test_unknown_choices_are_refused(bench):
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--policies", "DPO"])
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--seeds", "6"])


def test_the_old_arm_runs_the_old_defaults_issue_35_changed(bench, monkeypatch):
    seen = []

    class Stub:  # records what the arm passes, and fails the fit (a row with its error)
        def __init__(self, **params):
            seen.append(params)
            raise RuntimeError("stub")

    monkeypatch.setitem(bench.sweep.POLICIES, "RAFT", Stub)
    budget = {"n_steps": 1, "batch_size": 64}
    spec = {"start": 0.0, "sft": "the SFT start"}
    old = bench.fit_one(spec, "review/gpt2", "RAFT", "old", 0, budget)
    new = bench.fit_one(spec, "review/gpt2", "RAFT", "default", 0, budget)
    # the old arm: RAFT ranked by score at its old fixed rate and batch; the default arm
    # leaves the ranking, the rate and the batch to the policy
    assert seen[0]["rank_by"] == "score" and seen[0]["learning_rate"] == 3e-5
    assert seen[0]["batch_size"] == 64 and old["rank_by"] == "score"
    assert "rank_by" not in seen[1] and seen[1]["learning_rate"] is None
    assert "batch_size" not in seen[1]
    assert old["error"] == new["error"] == "RuntimeError: stub"
