"""Weights & Biases runs through ``wandb.init`` (offline with ``WANDB_MODE=offline``)."""

from __future__ import annotations

import os

from .._config import get_config
from ._base import Logger, check_writable, require

__all__ = ["WandbLogger"]


class WandbLogger(Logger):
    """Log a fit as a Weights & Biases run.

    The parameters are the run's config, every number of a ``history_`` row is logged
    at the row's ``step``, text samples are ``wandb.Html`` tables. The runs of one group
    (a search's candidates and seeds) share a W&B group. ``WANDB_MODE=offline`` keeps
    everything on disk (``wandb sync`` uploads it later); W&B's own environment variables
    (``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_MODE``) apply as usual.

    Parameters
    ----------
    project : str, default=None
        The W&B project; ``None`` reads ``WANDB_PROJECT``, else ``"prefopt"``.
    dir : str or path, default=None
        Where W&B keeps its run files; ``None`` means ``logging_dir`` from
        :func:`prefopt.set_config` (default ``./runs``).
    samples_every : int, default=10
        Steps between logged text samples of completions.

    Attributes
    ----------
    run_ : wandb.Run
        The current (or last) run.
    run_name_ : str
    """

    name = "W&B"

    def __init__(self, project=None, *, dir=None, samples_every: int = 10):
        super().__init__(samples_every=samples_every)
        self.project = project
        self.dir = dir

    def _open_run(self, estimator, run_name, group) -> None:
        require("wandb")
        import wandb

        folder = check_writable(self.dir if self.dir is not None else get_config()["logging_dir"])
        project = self.project or os.environ.get("WANDB_PROJECT") or "prefopt"
        self.run_ = wandb.init(
            project=project,
            dir=folder,
            name=run_name,
            group=None if group is None else group.name,
            reinit="create_new",  # several fits (a search's) in one process
            # The fit's own progress bar and prints stay on the terminal as they are.
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        self._folder = os.path.dirname(self.run_.dir)  # the run's files/ sits in it

    def _check_folder(self) -> None:
        if not os.path.isdir(self._folder):
            raise FileNotFoundError(f"the folder {self._folder!r} was removed")

    def _log_params(self, params: dict) -> None:
        self.run_.config.update(params, allow_val_change=True)

    def _log_metrics(self, metrics: dict, step: int) -> None:
        self._check_folder()
        self.run_.log(metrics, step=step)

    def _log_text(self, tag: str, text: str, step: int) -> None:
        import wandb

        self._check_folder()
        self.run_.log({tag: wandb.Html(f"<pre>{_escape(text)}</pre>")}, step=step)

    def _close(self) -> None:
        self.run_.finish()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
