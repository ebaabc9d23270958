"""The README's demo command runs end to end (a seconds-long configuration)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_quick_runs(tmp_path):
    out = tmp_path / "demo.png"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "demo.py"),
            "--quick",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    for row in (
        "SFT",
        "RLOO (k=4, beta=0.05)",
        "PPO (beta=0.05)",
        "RLOO (k=4, beta=0)",
        "distinct",
    ):
        assert row in text
    assert "Over-optimisation" in text and "Completions" in text
    assert out.exists() and out.stat().st_size > 10_000
