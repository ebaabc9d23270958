"""Run every reproduction script and rebuild REPRODUCTION.md's table.

Run from the repository root::

    python -m benchmarks.reproduce --all            # every full run (hours on 2 cores)
    python -m benchmarks.reproduce --all --quick    # every smoke run, into a temporary folder
    python -m benchmarks.reproduce claim01_ppo_worked_example claim03_adaptive_kl
    python -m benchmarks.reproduce --table          # only rebuild the table from results/
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE_START = "<!-- table: python -m benchmarks.reproduce --table -->"
TABLE_END = "<!-- end of table -->"


def scripts() -> list[str]:
    """The claim scripts, in claim order."""
    return sorted(p.stem for p in HERE.glob("claim*.py"))


def table(results: Path) -> str:
    """The Markdown table of every full run's summary in ``results``."""
    lines = [
        "| # | claim (source) | our setting | result (95% CI) | verdict | reason "
        "| commit, command |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in scripts():
        path = results / f"{name}.json"
        if not path.exists():
            lines.append(pending(name))
            continue
        s = json.loads(path.read_text())
        cells = [
            str(s["number"]),
            f"{s['claim']} ({s['source']})",
            s["setting"],
            s["result"],
            f"**{s['verdict']}**",
            s["reason"],
            f"{s['commit']}, `{s['command']}` ({s['seconds']:.0f} s)",
        ]
        lines.append(
            "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
        )
    return "\n".join(lines)


def pending(name: str) -> str:
    """The row of a script with no full run yet: its claim and the commit of its rule.

    The rule is the script as last committed (a rule may change only before the full
    run, so its last commit is the one the run will be judged against).
    """
    path = HERE / f"{name}.py"
    claim = (ast.get_docstring(ast.parse(path.read_text())) or name).splitlines()[0]

    def git(*command: str) -> str:
        out = subprocess.run(
            ["git", *command, "--", path.name], cwd=HERE, capture_output=True, text=True
        )
        return out.stdout.strip()

    sha = git("log", "-1", "--format=%h") or "(not committed)"
    if git("status", "--porcelain"):
        sha += " (with uncommitted changes)"
    return (
        f"| {name[5:7].lstrip('0')} | {claim.replace('|', chr(92) + '|')} | | | **not run yet** "
        f"| rule committed at {sha}, full run pending | `python benchmarks/reproduce/{name}.py` |"
    )


def rebuild(results: Path, document: Path) -> None:
    """Replace the table between the markers of ``document``."""
    text = document.read_text()
    start, end = text.index(TABLE_START), text.index(TABLE_END)
    new = text[: start + len(TABLE_START)] + "\n\n" + table(results) + "\n\n" + text[end:]
    document.write_text(new)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="scripts to run (default with --all: every one)")
    parser.add_argument("--all", action="store_true", help="run every script")
    parser.add_argument("--quick", action="store_true", help="smoke runs into a temporary folder")
    parser.add_argument("--table", action="store_true", help="only rebuild REPRODUCTION.md")
    args = parser.parse_args(argv)
    names = scripts() if args.all else args.names
    unknown = sorted(set(names) - set(scripts()))
    if unknown:
        parser.error(f"unknown scripts {unknown}; known: {scripts()}")
    out = Path(tempfile.mkdtemp(prefix="reproduce-")) if args.quick else HERE / "results"
    failed = []
    for name in [] if args.table else names:
        # Full runs write to the scripts' default folder, so each summary records the same
        # command a reader would type; smoke runs go to the temporary folder.
        command = [sys.executable, str(HERE / f"{name}.py")]
        command += ["--out", str(out), "--quick"] if args.quick else []
        print("$", " ".join(command[1:]), flush=True)
        if subprocess.run(command).returncode:
            failed.append(name)
    if not args.quick:
        rebuild(HERE / "results", HERE.parent / "REPRODUCTION.md")
        print("REPRODUCTION.md rebuilt")
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
