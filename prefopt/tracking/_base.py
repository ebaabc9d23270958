"""What every tracker shares: the callback protocol, guarded calls, parameters as flat values."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import numbers
import os
import threading
import warnings
from datetime import datetime
from itertools import count

from ..backend import distributed

__all__ = [
    "Logger",
    "check_writable",
    "current_member",
    "flat_params",
    "numeric_row",
    "require",
]

_PIP = {
    "tensorboard": "pip install 'prefopt[tensorboard]' (or: pip install tensorboard)",
    "mlflow": "pip install 'prefopt[mlflow]' (or: pip install mlflow)",
    "wandb": "pip install 'prefopt[wandb]' (or: pip install wandb)",
}
_run_numbers = count(1)
_local = threading.local()  # the run group (and run name) of this thread's fits


def current_member() -> tuple:
    """``(group, run_name)`` of the innermost ``group.member`` block, else ``(None, None)``."""
    return getattr(_local, "member", None) or (None, None)


def require(package: str) -> None:
    """Raise ImportError naming the pip command when ``package`` is not installed."""
    if importlib.util.find_spec(package) is None:
        raise ImportError(
            f"Logging to {package} needs the {package} package, which is not installed: "
            f"{_PIP[package]}."
        )


def check_writable(folder) -> str:
    """Create ``folder`` and write a file in it, or raise a clear error before any training."""
    folder = os.fspath(folder)
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".prefopt-write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("")
        os.remove(probe)
    except OSError as error:
        raise PermissionError(
            f"The logging folder {folder!r} cannot be written ({error.strerror or error}); "
            "pass a folder you can write to, e.g. prefopt.set_config(logging_dir='./runs')."
        ) from error
    return folder


def default_run_name(estimator) -> str:
    """``<Estimator>_<date-time>_<n>``: unique within a process, sorted by start time.

    ``estimator`` may be a name itself (a group's: ``"compare"``).
    """
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    name = estimator if isinstance(estimator, str) else type(estimator).__name__
    return f"{name}_{stamp}_{os.getpid()}-{next(_run_numbers)}"


def _flat_value(value):
    if value is None or isinstance(value, (bool, str, numbers.Integral, numbers.Real)):
        return value
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    if isinstance(value, (list, tuple)) and len(value) <= 16:
        return str([_flat_value(v) for v in value])
    text = repr(value)
    # A model or tokenizer repr runs to pages; its class says what it is.
    return text if len(text) <= 200 and "\n" not in text else type(value).__name__


def flat_params(estimator) -> dict:
    """``estimator.get_params()`` (nested ones as ``kl__target``) as scalars and short strings.

    Examples
    --------
    >>> from prefopt import AdaptiveKLController
    >>> flat_params(AdaptiveKLController(target=6.0))["target"]
    6.0
    """
    params = estimator.get_params(deep=True) if hasattr(estimator, "get_params") else {}
    flat = {}
    for key, value in sorted(params.items()):
        if hasattr(value, "get_params"):  # its own parameters follow as key__name
            value = type(value).__name__
        flat[key] = _flat_value(value)
    return flat


def numeric_row(row: dict) -> dict:
    """The finite-or-not numbers of a ``history_`` row (strings and lists are left out)."""
    out = {}
    for key, value in row.items():
        if key == "step" or isinstance(value, bool):
            continue
        if isinstance(value, numbers.Real):
            out[key] = float(value)
        elif hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # a 0-d array
            out[key] = float(value.item())
    return out


class Logger:
    """A tracker that receives a fit's parameters once and its ``history_`` rows as they come.

    A logger is a callback: ``fit(..., callback=logger)`` starts its run at the first row
    (with the estimator's parameters) and logs every row. Inside prefopt's loops the run
    also ends with the fit. When the tracker fails mid-run (its folder removed, its store
    unreachable), the logger warns once and stops logging; the fit and its ``history_``
    go on, and :meth:`close` still ends the run (quietly), so that what was logged before
    the failure is flushed.

    Parameters
    ----------
    samples_every : int, default=10
        Steps between logged text samples of completions (where the loop has them).
    """

    name = "tracker"

    def __init__(self, *, samples_every: int = 10):
        self.samples_every = samples_every
        self._open = False
        self._failed = False

    # -- the callback protocol -------------------------------------------------------------
    def __call__(self, estimator, row) -> None:
        if not distributed.is_main():  # one run for a distributed fit: rank 0's
            return
        if not self._open:
            group, run_name = current_member()
            self.start(estimator, run_name=run_name, group=group)
        self.log_row(row)

    def start(self, estimator, *, run_name=None, group=None) -> Logger:
        """Open a run for ``estimator`` and log its parameters.

        Errors here (a missing package, an unwritable folder) come before any training.

        Parameters
        ----------
        estimator : estimator
            Its ``get_params()`` are logged, nested ones as ``kl__target``.
        run_name : str, default=None
            ``None``: ``<Estimator>_<date-time>_<n>``.
        group : RunGroup, default=None
            The group the run belongs to (see :func:`run_group`).

        Returns
        -------
        self : Logger
        """
        if self._open:
            self.close()
        self._failed = False
        self.run_name_ = run_name or default_run_name(estimator)
        self._open_run(estimator, self.run_name_, group)
        self._open = True
        self._guard(self._log_params, flat_params(estimator))
        return self

    def log_row(self, row: dict, step: int | None = None) -> None:
        """Log a ``history_`` row's numbers.

        Parameters
        ----------
        row : dict
            A ``history_`` row; its numbers are logged, anything else is left out.
        step : int, default=None
            ``None``: the row's ``step``.
        """
        if not self._open or self._failed:
            return
        step = int(row.get("step", 0) if step is None else step)
        self._guard(self._log_metrics, numeric_row(row), step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Log a piece of text (a table of sampled completions, say).

        Parameters
        ----------
        tag : str
        text : str
        step : int
        """
        if self._open and not self._failed:
            self._guard(self._log_text, tag, text, int(step))

    def log_samples(self, prompts, completions, step: int, rewards=None) -> None:
        """Log prompts and their sampled completions as a Markdown table.

        Parameters
        ----------
        prompts, completions : list of str
        step : int
        rewards : array-like, default=None
            One reward per completion, shown in a third column.
        """
        self.log_text("samples/completions", samples_table(prompts, completions, rewards), step)

    def close(self) -> None:
        """End the run (and flush what is buffered).

        After a failure the run is still ended, quietly (the failure was reported once),
        so that what reached the tracker before it is flushed and the run is not left open.
        """
        if self._open:
            self._open = False
            if not self._failed:
                self._guard(self._close)
            else:
                with contextlib.suppress(Exception):
                    self._close()

    # -- what each tracker writes ----------------------------------------------------------
    def _open_run(self, estimator, run_name, group) -> None:
        raise NotImplementedError

    def _log_params(self, params: dict) -> None:
        raise NotImplementedError

    def _log_metrics(self, metrics: dict, step: int) -> None:
        raise NotImplementedError

    def _log_text(self, tag: str, text: str, step: int) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _guard(self, method, *args) -> None:
        """Run a tracker call; on its first failure warn once and log nothing more."""
        try:
            method(*args)
        except Exception as error:  # a tracker never stops a fit
            self._failed = True
            warnings.warn(
                f"{self.name} logging failed ({type(error).__name__}: {error}); the fit goes "
                f"on without it and history_ keeps every row.",
                RuntimeWarning,
                stacklevel=3,
            )


def samples_table(prompts, completions, rewards=None) -> str:
    """A Markdown table of prompts, completions and (optionally) their rewards.

    Parameters
    ----------
    prompts, completions : list of str
    rewards : array-like, default=None

    Returns
    -------
    table : str

    Examples
    --------
    >>> print(samples_table(["2+2="], ["4"], [1.0]))
    | prompt | completion | reward |
    | --- | --- | --- |
    | 2+2= | 4 | 1 |
    """

    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    header = "| prompt | completion |" + (" reward |" if rewards is not None else "")
    lines = [header, "| --- | --- |" + (" --- |" if rewards is not None else "")]
    for i, (p, c) in enumerate(zip(prompts, completions)):
        line = f"| {cell(p)} | {cell(c)} |"
        if rewards is not None:
            r = float(rewards[i])
            line += f" {r:.4g} |" if math.isfinite(r) else " nan |"
        lines.append(line)
    return "\n".join(lines)
