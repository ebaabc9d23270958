"""The README's demo command runs end to end (a seconds-long configuration)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
POLICY_ROWS = (
    "RLOO (k=4, beta=0.05)",
    "PPO (beta=0.05)",
    "RLOO (k=4, KL target 6)",
    "RLOO (k=4, beta=0)",
)


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
    table, _, rest = text.partition("Gold reward against KL")
    assert rest, text
    header = next(line for line in table.splitlines() if "distinct" in line and "gold" in line)
    for column in ("gold", "proxy", "KL", "length", "distinct", "EOS", "ep/s"):
        assert column in header
    lines = table.splitlines()
    assert any(line.strip().startswith("SFT") for line in lines)
    for name in POLICY_ROWS:
        row = next(line for line in lines if line.strip().startswith(name))
        # mean ± sd over the seeds for gold, proxy, KL, length, distinct and EOS
        assert row.count("±") == 6, row
        # each seed's (KL, gold) in the listing of every run
        listing = next(line for line in rest.splitlines() if line.strip().startswith(name))
        assert listing.count(":") == 2, listing  # --quick runs two seeds
    assert "Completions" in rest
    assert out.exists() and out.stat().st_size > 10_000
