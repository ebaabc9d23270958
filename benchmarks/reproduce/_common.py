"""What every reproduction script shares: arguments, seeds, intervals, verdicts, outputs.

A script defines its settings (``FULL`` and ``QUICK`` dicts) and its verdict rule in
code before its first full run, computes one row per run, and ends with
:func:`finish`, which writes ``<name>.csv``, ``<name>.png`` and ``<name>.json`` (the
claim, setting, result, interval, verdict, reason, commit and command) into the output
folder; ``python -m benchmarks.reproduce --table`` rebuilds REPRODUCTION.md from the
JSON files. Only prefopt's public API is used, here and in the scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[2]


def parse_args(doc: str, argv=None, **extra) -> argparse.Namespace:
    """``--quick`` (seconds, for the tests), ``--seeds``, ``--out``; one torch thread.

    Parameters
    ----------
    doc : str
        The script's docstring (its first line is the description).
    argv : list of str, default=None
        Arguments; ``None`` reads the command line.
    **extra
        More options: ``name=(type, default, help)``.

    Returns
    -------
    args : argparse.Namespace
    """
    import torch

    import prefopt

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run")
    parser.add_argument("--seeds", type=int, default=None, help="override the number of seeds")
    parser.add_argument("--out", default=None, help="output folder (default: results/)")
    for name, (kind, default, text) in extra.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default, help=text)
    args = parser.parse_args(argv)
    args.out = Path(args.out) if args.out else RESULTS
    args.out.mkdir(parents=True, exist_ok=True)
    args.began = time.perf_counter()
    args.argv = list(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)  # tiny models: a second thread only adds synchronisation
    prefopt.set_config(show_progress_bar=False)
    return args


def settings(args, full: dict, quick: dict) -> dict:
    """The run's settings: ``quick`` under ``--quick``, else ``full``; ``--seeds`` overrides."""
    chosen = dict(quick if args.quick else full)
    if args.seeds is not None:
        chosen["seeds"] = args.seeds
    return chosen


def mean_ci(values, level: float = 0.95) -> tuple[float, float, float]:
    """Mean and its two-sided t-interval ``(mean, low, high)``; NaN bounds for one value.

    Examples
    --------
    >>> mean, low, high = mean_ci([1.0, 2.0, 3.0])
    >>> mean, round(low, 3), round(high, 3)
    (2.0, -0.484, 4.484)
    """
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    mean = float(values.mean()) if len(values) else float("nan")
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return mean, mean - float(half), mean + float(half)


def paired_ci(a, b, level: float = 0.95) -> tuple[float, float, float]:
    """t-interval of the mean paired difference ``a - b`` (same seeds).

    Examples
    --------
    >>> paired_ci([2.0, 3.0, 4.0], [1.0, 2.0, 3.5])[0]
    0.8333333333333334
    """
    return mean_ci(np.asarray(a, dtype=float) - np.asarray(b, dtype=float), level)


def direction_verdict(low: float, high: float, claimed: str) -> str:
    """ "reproduced" when the interval excludes 0 in the claimed direction, else "not reproduced".

    Parameters
    ----------
    low, high : float
        The interval of a difference.
    claimed : {"positive", "negative"}
        The sign the claim predicts.

    Returns
    -------
    verdict : str

    Examples
    --------
    >>> direction_verdict(0.1, 0.3, "positive"), direction_verdict(-0.1, 0.3, "positive")
    ('reproduced', 'not reproduced')
    """
    if claimed == "positive":
        return "reproduced" if low > 0 else "not reproduced"
    if claimed == "negative":
        return "reproduced" if high < 0 else "not reproduced"
    raise ValueError(f"claimed must be 'positive' or 'negative'; got {claimed!r}.")


def fmt(mean: float, low: float, high: float, digits: int = 3) -> str:
    """``mean [low, high]``.

    Examples
    --------
    >>> fmt(1.0, 0.5, 1.5)
    '1.000 [0.500, 1.500]'
    """
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def new_figure(n_panels: int = 1, width: float = 4.5, height: float = 3.4):
    """A figure with ``n_panels`` axes side by side."""
    fig, axes = plt.subplots(1, n_panels, figsize=(width * n_panels, height), squeeze=False)
    return fig, list(axes[0])


def commit() -> str:
    """The checked-out commit (``+dirty`` when the tree has changes), or "unknown"."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) or "unknown"
    except OSError:
        return "unknown"


def finish(args, name: str, rows, fig, *, number, claim, source, setting, result, verdict, reason):
    """Write ``name``'s CSV, figure and summary JSON; print the summary.

    Parameters
    ----------
    args : argparse.Namespace
        From :func:`parse_args`.
    name : str
        The script's name (the files' stem).
    rows : list of dict or DataFrame
        One row per run.
    fig : matplotlib Figure
        The claim's figure.
    number : int or str
        The claim's number in issue 16.
    claim, source, setting, result, verdict, reason : str
        The row of REPRODUCTION.md.

    Returns
    -------
    summary : dict
    """
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    frame.to_csv(args.out / f"{name}.csv", index=False)
    fig.tight_layout()
    fig.savefig(args.out / f"{name}.png", dpi=110)
    plt.close(fig)
    summary = {
        "number": number,
        "name": name,
        "claim": claim,
        "source": source,
        "setting": setting,
        "result": result,
        "verdict": verdict,
        "reason": reason,
        "quick": bool(args.quick),
        "commit": commit(),
        "command": " ".join(["python", f"benchmarks/reproduce/{name}.py", *args.argv]),
        "seconds": round(time.perf_counter() - args.began, 1),
    }
    with open(args.out / f"{name}.json", "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: summary[k] for k in ("number", "result", "verdict")}, indent=1))
    return summary


def environ_threads() -> None:
    """One thread for every numeric library a worker process starts."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
