"""The README's demo command runs end to end (a seconds-long configuration)."""

import re
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


# ----- the README's table is the demo's -----------------------------------------------------
README = ROOT / "README.md"
START = "<!-- demo table: written by python examples/demo.py --readme README.md -->"
END = "<!-- end of demo table -->"
# How far a fresh run's numbers may be from the README's: the larger of an absolute
# tolerance (0.05 for gold, proxy, distinct and EOS, printed to 2 decimals; 0.5 for KL and
# length, printed to 1) and 10% of the README's value. The runs are seeded and the versions
# locked, so on one machine they repeat exactly; the margin is for another CPU's float
# rounding compounding over 30 steps. A stale table (0.36 against 0.46) fails it.
# The health counts must be equal; episodes/s (wall time) is not compared.
ABSOLUTE = (0.05, 0.05, 0.05, 0.05, 0.5, 0.5, 0.5, 0.5, 0.05, 0.05, 0.05, 0.05)
RELATIVE = 0.10


def _table(text):
    """{row name: (numbers, health)} of the table between the README's markers."""
    block = text.split(START, 1)[1].split(END, 1)[0]
    rows = {}
    for line in block.splitlines():
        name = next((n for n in ("SFT", *POLICY_ROWS) if line.strip().startswith(n)), None)
        if name is None:
            continue
        rest = line.strip()[len(name) :]
        health = re.search(r"(\d+)/(\d+) ok", rest)
        numbers = [float(v) for v in re.findall(r"-?\d+\.\d+", rest)]
        rows[name] = (numbers, None if health is None else health.group(0))
    return rows


def test_readme_holds_the_demos_table_with_a_health_column():
    rows = _table(README.read_text())
    assert set(rows) == {"SFT", *POLICY_ROWS}
    assert len(rows["SFT"][0]) == 5  # gold, proxy, KL, length, distinct
    for name in POLICY_ROWS:
        numbers, health = rows[name]
        assert len(numbers) == 12, name  # mean and sd of six columns
        assert health is not None and health.endswith("/3 ok"), name  # three seeds each


@pytest.mark.slow  # the demo's full configuration: 1.5 to 5 minutes on one core
def test_readme_table_is_what_the_demo_prints_now(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(README.read_text())
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "demo.py"),
            "--no-progress",
            "--out",
            str(tmp_path / "demo.png"),
            "--readme",
            str(readme),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    fresh, stated = _table(readme.read_text()), _table(README.read_text())
    assert set(fresh) == set(stated)
    for name, (numbers, health) in stated.items():
        new_numbers, new_health = fresh[name]
        assert new_health == health, (name, new_health, health)
        tolerances = ABSOLUTE[: len(numbers)] if name != "SFT" else ABSOLUTE[::2][:5]
        for i, (old, new, tol) in enumerate(zip(numbers, new_numbers, tolerances)):
            assert abs(new - old) <= max(tol, RELATIVE * abs(old)), (
                f"README.md's demo table, row {name!r}, number {i + 1}: {old} there, {new} "
                "from the demo now; run python examples/demo.py --readme README.md"
            )
