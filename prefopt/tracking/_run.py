"""One fit's tracking: the configured loggers and the callback's, opened and closed together."""

from __future__ import annotations

from contextlib import contextmanager

from .._config import get_config
from ..backend import distributed
from ..backend.progress import verbose_log
from ._base import Logger, _local, check_writable, current_member, default_run_name
from ._mlflow import MLflowLogger
from ._tensorboard import TensorBoardLogger
from ._wandb import WandbLogger

__all__ = ["RunGroup", "TrackedRun", "check_callback", "open_run", "run_group"]

_LOGGERS = {"tensorboard": TensorBoardLogger, "mlflow": MLflowLogger, "wandb": WandbLogger}


def check_callback(callback) -> list:
    """``callback`` as a list of callables (``None``: empty), or a clear TypeError.

    Parameters
    ----------
    callback : None, callable or list of callables

    Returns
    -------
    callbacks : list
    """
    callbacks = [] if callback is None else callback
    if callable(callbacks):
        callbacks = [callbacks]
    if not isinstance(callbacks, (list, tuple)) or not all(callable(c) for c in callbacks):
        raise TypeError(
            "callback must be a callable callback(estimator, row), a prefopt.tracking "
            f"logger, or a list of them; got {callback!r}."
        )
    return list(callbacks)


class RunGroup:
    """Runs that belong together: a search's candidates and seeds, a comparison's algorithms.

    Opened by :func:`run_group`. Every fit inside :meth:`member` (or anywhere inside the
    ``with run_group(...)`` block, in its thread) is one run of the group: TensorBoard
    writes it to ``<logging_dir>/<group>/<run>``, MLflow nests it under the group's
    parent run, W&B puts it in the group ``<group>``. A group pickles, so a search hands
    it to its worker processes, which fit inside ``group.member(name)``.

    Parameters
    ----------
    name : str
        The group's name (a folder name for TensorBoard).

    Attributes
    ----------
    parents_ : dict
        MLflow parent run ids, by tracking URI and experiment.
    """

    def __init__(self, name: str):
        self.name = name
        self.parents_ = {}

    def mlflow_parent(self, client, experiment_id, uri, experiment_name) -> str:
        """The id of the group's MLflow parent run in this store, created the first time.

        Parameters
        ----------
        client : mlflow.MlflowClient
        experiment_id : str
        uri : str
            The store's tracking URI.
        experiment_name : str

        Returns
        -------
        run_id : str
        """
        key = f"{uri}|{experiment_name}"
        if key not in self.parents_:
            run = client.create_run(experiment_id, run_name=self.name, tags={"prefopt.group": "1"})
            self.parents_[key] = run.info.run_id
        return self.parents_[key]

    def close(self) -> None:
        """Mark the MLflow parent runs finished."""
        if self.parents_:
            from mlflow import MlflowClient

            for key, run_id in self.parents_.items():
                MlflowClient(tracking_uri=key.split("|")[0]).set_terminated(run_id)

    @contextmanager
    def member(self, run_name: str | None = None):
        """Fits inside this block, in this thread, are runs of the group.

        Parameters
        ----------
        run_name : str, default=None
            The run's name; ``None``: the estimator's name and the time.

        Yields
        ------
        group : RunGroup
        """
        old = getattr(_local, "member", None)
        _local.member = (self, run_name)
        try:
            yield self
        finally:
            _local.member = old


@contextmanager
def run_group(name: str):
    """Group the runs of the fits inside the block (see :class:`RunGroup`).

    Parameters
    ----------
    name : str
        The group's name.

    Yields
    ------
    group : RunGroup
        Hand it to workers; each fits inside ``group.member(run_name)``.

    Examples
    --------
    >>> import tempfile, prefopt
    >>> from prefopt import SFTPolicy
    >>> from prefopt.tracking import run_group
    >>> with prefopt.config_context(report_to="tensorboard", logging_dir=tempfile.mkdtemp()):
    ...     with run_group("search") as group:
    ...         for seed in (0, 1):
    ...             with group.member(f"seed={seed}"):
    ...                 pass  # SFTPolicy(random_state=seed).fit(...) logs to search/seed=0, ...
    >>> group.name
    'search'
    """
    group = RunGroup(name)
    if "mlflow" in get_config()["report_to"] and distributed.is_main():
        # The parent run is made here, so that worker processes given the group nest
        # their runs under this one parent rather than each making its own.
        from mlflow import MlflowClient

        from ._mlflow import experiment_id, tracking_uri

        uri = tracking_uri()
        client = MlflowClient(tracking_uri=uri)
        group.mlflow_parent(client, experiment_id(client, "prefopt", uri), uri, "prefopt")
    with group.member(None):
        try:
            yield group
        finally:
            group.close()


class TrackedRun:
    """The loggers of one fit; calling it logs a row, prints it under ``verbose`` and calls
    the user's callbacks (the loop's one call per step).

    Made by :func:`open_run`.

    Parameters
    ----------
    estimator : estimator
    loggers : list of Logger
    callbacks : list of callable
    name : str
        Shown in ``verbose`` lines.
    total : int or None
        The fit's last step.
    print_every : int
        Steps between ``verbose=1`` lines.

    Attributes
    ----------
    loggers : list of Logger
        The configured ones (``report_to``) and the loggers passed as ``callback``.
    callbacks : list of callable
        The other callbacks, called as ``callback(estimator, row)``.
    """

    def __init__(self, estimator, loggers, callbacks, *, name, total, print_every):
        self.estimator = estimator
        self.loggers = loggers
        self.callbacks = callbacks
        self.name = name
        self.total = total
        self.print_every = print_every

    def __call__(self, estimator, row) -> bool:
        """Log ``row``; ``True`` when a callback asks the fit to stop."""
        step = int(row.get("step", 0))
        for logger in self.loggers:
            logger.log_row(row, step)
        verbose = getattr(estimator, "verbose", 0)
        if verbose and distributed.is_main():
            if verbose > 1 or step % self.print_every == 0 or step == self.total:
                verbose_log.info(progress_line(self.name, row, self.total))
        stop = False
        for callback in self.callbacks:
            stop = (callback(estimator, row) is True) or stop
        return stop

    def samples_due(self, step: int) -> bool:
        """Whether some logger wants a text sample of completions at ``step``.

        Parameters
        ----------
        step : int

        Returns
        -------
        due : bool
        """
        return any(step % max(int(lg.samples_every), 1) == 0 for lg in self.loggers)

    def log_samples(self, prompts, completions, step: int, rewards=None) -> None:
        """Log sampled completions as text, to the loggers whose ``samples_every`` is due.

        Parameters
        ----------
        prompts, completions : list of str
        step : int
        rewards : array-like, default=None
        """
        for logger in self.loggers:
            if step % max(int(logger.samples_every), 1) == 0:
                logger.log_samples(prompts, completions, step, rewards)

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Log a piece of text to every logger.

        Parameters
        ----------
        tag : str
        text : str
        step : int
        """
        for logger in self.loggers:
            logger.log_text(tag, text, step)

    def close(self) -> None:
        """End every logger's run."""
        for logger in self.loggers:
            logger.close()


def progress_line(name: str, row: dict, total=None) -> str:
    """One line for ``verbose``: the step and the row's loss, reward and KL figures.

    Parameters
    ----------
    name : str
    row : dict
        A ``history_`` row.
    total : int, default=None
        The fit's last step.

    Returns
    -------
    line : str

    Examples
    --------
    >>> progress_line("SFTPolicy", {"step": 10, "loss/sft": 1.23456, "data/tokens": 40}, 20)
    'SFTPolicy step 10/20: loss/sft 1.235'
    """
    step = row.get("step", "?")
    head = f"{name} step {step}" + (f"/{total}" if total else "")
    keys = [k for k in row if k.startswith(("loss/", "objective/", "reward/", "rewards/"))]
    figures = " ".join(f"{k} {row[k]:.4g}" for k in keys if isinstance(row[k], (int, float)))
    return f"{head}: {figures}" if figures else head


def configured_loggers() -> list:
    """New loggers for ``report_to`` of :func:`prefopt.get_config` (none for ``"none"``)."""
    config = get_config()
    names = [n for n in config["report_to"] if n != "none"]
    if names:
        check_writable(config["logging_dir"])
    return [_LOGGERS[n]() for n in names]


@contextmanager
def open_run(estimator, callback=None, *, name=None, total=None, print_every=10):
    """Open the tracking of one fit: ``report_to``'s loggers and any passed as ``callback``.

    Every logger opens its run and logs the estimator's parameters here, so a tracker
    that is missing or cannot write fails before any training. Only the main process of
    a distributed fit logs.

    Parameters
    ----------
    estimator : estimator
        The estimator being fitted (its ``get_params`` are logged, its ``verbose`` read).
    callback : callable, Logger or list of them, default=None
        ``fit``'s ``callback=``: loggers among them are opened and closed with the fit.
    name : str, default=None
        Shown in ``verbose`` lines; ``None`` means the estimator's class name.
    total : int, default=None
        The fit's last step, shown in ``verbose`` lines (and always printed).
    print_every : int, default=10
        Steps between ``verbose=1`` lines (``verbose>=2``: every step).

    Yields
    ------
    run : TrackedRun
        Call ``run(estimator, row)`` after each step (it returns whether a callback
        asked to stop); ``run.samples_due(step)`` / ``run.log_samples(...)`` for text.

    Examples
    --------
    >>> from prefopt import AdaptiveKLController
    >>> from prefopt.tracking import open_run
    >>> with open_run(AdaptiveKLController(), callback=lambda est, row: None) as run:
    ...     run(None, {"step": 1, "loss/toy": 0.5})
    False
    """
    callbacks = check_callback(callback)
    own = [c for c in callbacks if isinstance(c, Logger)]
    others = [c for c in callbacks if not isinstance(c, Logger)]
    loggers = []
    if distributed.is_main():
        loggers = configured_loggers() + own
    group, run_name = current_member()
    if run_name is None and loggers:  # one name for the fit in every tracker
        run_name = default_run_name(estimator)
    opened = []
    try:
        for logger in loggers:
            logger.start(estimator, run_name=run_name, group=group)
            opened.append(logger)
        run = TrackedRun(
            estimator,
            loggers,
            others,
            name=name or type(estimator).__name__,
            total=total,
            print_every=print_every,
        )
        yield run
    finally:
        for logger in opened:
            logger.close()
