"""Execute benchmarks/compare_algorithms.ipynb top to bottom and store it with its outputs.

Run from the repository root::

    python -m benchmarks.reproduce.notebook          # full configuration, in place
    python -m benchmarks.reproduce.notebook --small  # the tests' configuration, to a temp copy

The full configuration is what the committed notebook shows; ``--small`` sets
``PREFOPT_NOTEBOOK_SMALL=1`` (seconds-long runs) and never overwrites the notebook.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parents[1] / "compare_algorithms.ipynb"


def execute(path: Path, *, small: bool, out: Path) -> float:
    """Run the notebook at ``path`` in a fresh kernel and write it, executed, to ``out``.

    Returns
    -------
    seconds : float
    """
    import nbclient
    import nbformat

    if small:
        os.environ["PREFOPT_NOTEBOOK_SMALL"] = "1"
    else:
        os.environ.pop("PREFOPT_NOTEBOOK_SMALL", None)
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    nbclient.NotebookClient(
        nb,
        timeout=None,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    nbformat.write(nb, out)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the seconds-long configuration")
    parser.add_argument("--out", default=None, help="where to write (default: in place)")
    args = parser.parse_args(argv)
    if args.out:
        out = Path(args.out)
    elif args.small:
        out = Path(tempfile.mkdtemp(prefix="notebook-")) / NOTEBOOK.name
    else:
        out = NOTEBOOK
    seconds = execute(NOTEBOOK, small=args.small, out=out)
    print(f"executed in {seconds:.0f} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
