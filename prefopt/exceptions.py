"""The warnings and errors prefopt raises about a run, as scikit-learn's ``exceptions``."""

__all__ = ["RunHealthError", "RunHealthWarning"]


class RunHealthWarning(UserWarning):
    """A fit tripped a run-health detector: its result may come from a failed run.

    Issued once per detector per fit, like scikit-learn's ``ConvergenceWarning``;
    the fitted ``health_`` attribute says which detectors fired and when, and
    each ``history_`` row has a ``health/<detector>`` column. The estimator's
    ``on_unhealthy`` parameter chooses to warn, raise :class:`RunHealthError`,
    stop the run early (with this warning) or stay silent.

    Examples
    --------
    >>> import warnings
    >>> from prefopt.exceptions import RunHealthWarning
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", RunHealthWarning)  # a test's healthy run
    ...     issubclass(RunHealthWarning, UserWarning)
    True
    """


class RunHealthError(RuntimeError):
    """A fit with ``on_unhealthy="raise"`` tripped a run-health detector.

    Examples
    --------
    >>> from prefopt.exceptions import RunHealthError
    >>> issubclass(RunHealthError, RuntimeError)
    True
    """
