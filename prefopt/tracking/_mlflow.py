"""MLflow runs through ``mlflow.MlflowClient``, against a local store by default."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from .._config import get_config
from ._base import Logger, check_writable, require

__all__ = ["MLflowLogger"]


def tracking_uri(uri=None) -> str:
    """The given URI, else ``MLFLOW_TRACKING_URI``, else a SQLite file in ``logging_dir``."""
    if uri is not None:
        return str(uri)
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    folder = check_writable(get_config()["logging_dir"])
    return f"sqlite:///{Path(folder).resolve() / 'mlflow.db'}"


def _local_path(uri: str) -> Path | None:
    """The file or folder of a local store (``sqlite:///...``, ``file:...`` or a path)."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :])
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    return Path(uri) if parsed.scheme == "" else None  # a server: nothing to check here


def experiment_id(client, name: str, uri: str) -> str:
    """The id of experiment ``name``, created (artifacts beside a local store) if new."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    local = _local_path(uri)
    artifacts = None
    if local is not None:  # else MLflow would put them under the working directory
        root = local.parent if local.suffix == ".db" else local
        artifacts = (root.resolve() / "mlartifacts").as_uri()
    return client.create_experiment(name, artifact_location=artifacts)


class MLflowLogger(Logger):
    """Log a fit as an MLflow run, through ``mlflow.MlflowClient`` (no server needed).

    Parameters go in once as MLflow parameters, every number of a ``history_`` row as a
    metric at the row's ``step``, text samples as Markdown artifacts. The runs of one
    group (a search's candidates and seeds) are nested under one parent run.

    Parameters
    ----------
    tracking_uri : str, default=None
        Where runs are stored. ``None``: ``MLFLOW_TRACKING_URI`` if set, else the SQLite
        file ``<logging_dir>/mlflow.db`` (``logging_dir`` from
        :func:`prefopt.set_config`, default ``./runs``).
    experiment_name : str, default="prefopt"
        The MLflow experiment the runs belong to (created if new).
    samples_every : int, default=10
        Steps between logged text samples of completions.

    Attributes
    ----------
    run_id_ : str
        The MLflow id of the current (or last) run.
    tracking_uri_ : str
    run_name_ : str
    """

    name = "MLflow"

    def __init__(self, tracking_uri=None, *, experiment_name="prefopt", samples_every=10):
        super().__init__(samples_every=samples_every)
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name

    def _open_run(self, estimator, run_name, group) -> None:
        require("mlflow")
        from mlflow import MlflowClient

        self.tracking_uri_ = tracking_uri(self.tracking_uri)
        local = _local_path(self.tracking_uri_)
        if local is not None:
            check_writable(local.parent if local.suffix == ".db" else local)
        self._store = local
        self._client = MlflowClient(tracking_uri=self.tracking_uri_)
        exp = experiment_id(self._client, self.experiment_name, self.tracking_uri_)
        tags = {"prefopt.estimator": type(estimator).__name__}
        if group is not None:  # MLflow shows a run with this tag nested under its parent
            tags["mlflow.parentRunId"] = group.mlflow_parent(
                self._client, exp, self.tracking_uri_, self.experiment_name
            )
        self.run_id_ = self._client.create_run(exp, run_name=run_name, tags=tags).info.run_id

    def _check_store(self) -> None:
        # SQLite keeps writing to an open file after it is deleted: say so instead.
        if self._store is not None and not self._store.exists():
            raise FileNotFoundError(f"the store {str(self._store)!r} was removed")

    def _log_params(self, params: dict) -> None:
        from mlflow.entities import Param

        # MLflow caps a parameter's value (6000 characters in MLflow 3).
        batch = [Param(k, str(v)[:500]) for k, v in params.items()]
        for start in range(0, len(batch), 100):  # at most 100 parameters a call
            self._client.log_batch(self.run_id_, params=batch[start : start + 100])

    def _log_metrics(self, metrics: dict, step: int) -> None:
        from mlflow.entities import Metric

        self._check_store()
        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in metrics.items()]
        self._client.log_batch(self.run_id_, metrics=batch)

    def _log_text(self, tag: str, text: str, step: int) -> None:
        self._check_store()
        self._client.log_text(self.run_id_, text, f"{tag}/step_{step:06d}.md")

    def _close(self) -> None:
        self._client.set_terminated(self.run_id_)
