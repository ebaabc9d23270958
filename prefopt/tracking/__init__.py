"""Experiment tracking: TensorBoard, MLflow and Weights & Biases.

``prefopt.set_config(report_to=["tensorboard"], logging_dir="./runs")`` makes every fit
log its parameters once and its ``history_`` rows as they happen; the same loggers are
objects to pass as ``callback=`` (``TensorBoardLogger(log_dir)``, ``MLflowLogger()``,
``WandbLogger()``). :func:`run_group` groups the runs of a search or a comparison.
:func:`open_run` is what a training loop opens around its steps.

Each tracker is an extra: ``pip install 'prefopt[tensorboard]'`` (or ``[mlflow]``,
``[wandb]``).
"""

from ._base import Logger, samples_table
from ._mlflow import MLflowLogger
from ._run import RunGroup, TrackedRun, check_callback, open_run, progress_line, run_group
from ._tensorboard import TensorBoardLogger
from ._wandb import WandbLogger

__all__ = [
    "Logger",
    "MLflowLogger",
    "RunGroup",
    "TensorBoardLogger",
    "TrackedRun",
    "WandbLogger",
    "check_callback",
    "open_run",
    "progress_line",
    "run_group",
    "samples_table",
]
