"""What a result was computed with: versions, hardware, threads and commit.

Re-exported by :mod:`prefopt.model_selection`. A number from an RL run depends on
more than its code: the same seed gives other numbers under another torch or
transformers release, another CPU's floating-point kernels, or another thread count.
:func:`compare` stores this record on its result and the reproduction scripts write
it into every result file, so a reader can tell a changed result from a changed
machine.
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("prefopt", "torch", "transformers", "tokenizers", "numpy", "scipy", "scikit-learn")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git_commit(where: Path) -> str | None:
    """The commit checked out at ``where`` (``+dirty`` with tracked changes), or None."""
    try:
        run = dict(cwd=where, capture_output=True, text=True, timeout=10)
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], **run)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], **run)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what :mod:`platform` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment(commit: str | None = None) -> dict:
    """The environment a result was computed in, as a JSON-ready dict.

    Parameters
    ----------
    commit : str, default=None
        The code's commit; ``None`` asks git in the folder prefopt is imported
        from (``None`` in the record when prefopt is not a git checkout, e.g.
        installed from a wheel: its version is then the record).

    Returns
    -------
    record : dict
        ``python`` (version), ``platform``, ``machine`` (as :mod:`platform`
        reports them), ``processor`` (the CPU model), ``cpu_count``, ``versions`` (prefopt,
        torch, transformers, tokenizers, numpy, scipy, scikit-learn; ``None``
        for one not installed), ``torch_threads``
        (``torch.get_num_threads()``), ``thread_variables`` (the
        ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS``
        that are set), ``cuda`` (torch's CUDA version or ``None``), ``gpus``
        (the names of the visible CUDA devices) and ``commit``.

    Examples
    --------
    >>> from prefopt.model_selection import environment
    >>> record = environment(commit="abc1234")
    >>> sorted(record["versions"])
    ['numpy', 'prefopt', 'scikit-learn', 'scipy', 'tokenizers', 'torch', 'transformers']
    >>> record["commit"], record["torch_threads"] >= 1
    ('abc1234', True)
    """
    import torch

    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpu_count": os.cpu_count(),
        # torch's own string: the installed metadata of a CUDA wheel says "2.6.0" where
        # torch.__version__ says "2.6.0+cu124", and the build changes the numbers
        "versions": {name: _version(name) for name in PACKAGES} | {"torch": torch.__version__},
        "torch_threads": torch.get_num_threads(),
        "thread_variables": {k: os.environ[k] for k in THREAD_VARIABLES if k in os.environ},
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else [],
        "commit": commit if commit is not None else _git_commit(Path(__file__).resolve().parent),
    }
