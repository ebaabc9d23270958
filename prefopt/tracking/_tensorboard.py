"""TensorBoard event files through ``torch.utils.tensorboard``."""

from __future__ import annotations

import os

from .._config import get_config
from ._base import Logger, check_writable, require

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger(Logger):
    """Log a fit to TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``).

    Every number of a ``history_`` row is a scalar at the row's ``step``; the
    parameters are a text table under ``parameters``. Runs of one group (a search's
    candidates and seeds) go to subfolders of the group's folder, so TensorBoard shows
    them side by side.

    Parameters
    ----------
    log_dir : str or path, default=None
        The run's folder. ``None``: ``<logging_dir>/[<group>/]<run name>``, with
        ``logging_dir`` from :func:`prefopt.set_config` (default ``./runs``).
    samples_every : int, default=10
        Steps between logged text samples of completions.

    Attributes
    ----------
    log_dir_ : str
        The folder the current (or last) run writes to.
    run_name_ : str

    Examples
    --------
    >>> import tempfile
    >>> from prefopt import AdaptiveKLController
    >>> from prefopt.tracking import TensorBoardLogger
    >>> logger = TensorBoardLogger(log_dir=tempfile.mkdtemp())
    >>> logger(AdaptiveKLController(), {"step": 1, "loss/sft": 0.5})
    >>> logger.close()
    """

    name = "TensorBoard"

    def __init__(self, log_dir=None, *, samples_every: int = 10):
        super().__init__(samples_every=samples_every)
        self.log_dir = log_dir

    def _open_run(self, estimator, run_name, group) -> None:
        require("tensorboard")
        if self.log_dir is not None:
            folder = os.fspath(self.log_dir)
        else:
            parts = [get_config()["logging_dir"]]
            parts += [group.name] if group is not None else []
            folder = os.path.join(*parts, run_name)
        self.log_dir_ = check_writable(folder)
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=self.log_dir_)

    def _check_folder(self) -> None:
        # The writer keeps its open file: a removed folder would swallow every later event.
        if not os.path.isdir(self.log_dir_):
            raise FileNotFoundError(f"the folder {self.log_dir_!r} was removed")

    def _log_params(self, params: dict) -> None:
        table = ["| parameter | value |", "| --- | --- |"]
        table += [f"| {k} | {v!s} |" for k, v in params.items()]
        self._writer.add_text("parameters", "\n".join(table), 0)
        self._writer.flush()

    def _log_metrics(self, metrics: dict, step: int) -> None:
        self._check_folder()
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()  # the rows of a crashed fit are on disk too

    def _log_text(self, tag: str, text: str, step: int) -> None:
        self._check_folder()
        self._writer.add_text(tag, text, step)
        self._writer.flush()

    def _close(self) -> None:
        self._writer.close()
