"""Run health: named detectors read from a fit's ``history_``, a summary, and the action.

A detector is a number computed from the rows of the fit so far and a threshold;
it *fires* the first step the number crosses the threshold (a detector judged at
the end, such as "no learning", only when the fit ends). Every row gets a
``health/<name>`` column with the number, the estimator a ``health_`` summary::

    {"healthy": bool, "detectors": {name: {"fired": bool, "first_step": int | None,
                                           "value": float, "threshold": float}}}

with, where the rows log an adaptive rate (``optim/learning_rate``), a
``"learning_rate"`` entry: its ``first``, ``last``, ``min`` and ``max`` over the fit.

and the estimator's ``on_unhealthy`` says what a firing does: ``"warn"`` (one
:class:`~prefopt.exceptions.RunHealthWarning` per detector per fit), ``"raise"``
(:class:`~prefopt.exceptions.RunHealthError`), ``"stop"`` (warn and end the fit
after that step) or ``"ignore"`` (only recorded). Reading the rows rather than
keeping state makes the numbers the same for a resumed fit as for an
uninterrupted one. The supervised detectors (SFT, the reward model, DPO) are
here; the policies' are in ``prefopt/policies/loop/_health.py``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..exceptions import RunHealthError, RunHealthWarning

__all__ = ["ACTIONS", "Detector", "HealthMonitor", "smoothed", "supervised_monitor"]

ACTIONS = ("warn", "raise", "stop", "ignore")
RATE = "optim/learning_rate"  # the rate an adaptive learning rate set for each step
# The exponential moving average's weight on the newest row: about the last 5 rows count,
# so one noisy minibatch neither fires a detector nor hides a trend.
SMOOTHING = 0.3


@dataclass(frozen=True)
class Detector:
    """One run-health detector: a number from the fit's rows and its threshold.

    Parameters
    ----------
    name : str
        The detector's name (``health/<name>`` in ``history_``).
    threshold : float
        Where it fires.
    measure : callable
        ``measure(rows) -> float`` from the fit's ``history_`` rows so far.
    advice : str
        What the warning tells the user to do.
    below : bool, default=False
        Fire when the number is below the threshold (else above it).
    at_end : bool, default=False
        Judged once, on the last row, when the fit ends.
    min_rows : int, default=1
        Rows needed before the detector is judged at all.
    """

    name: str
    threshold: float
    measure: Callable
    advice: str
    below: bool = False
    at_end: bool = False
    min_rows: int = 1

    def fires(self, value: float) -> bool:
        """Whether ``value`` is beyond the threshold (``nan`` never fires)."""
        if math.isnan(value):
            return False
        return value < self.threshold if self.below else value > self.threshold


def smoothed(values) -> float:
    """The exponential moving average of ``values`` (weight ``SMOOTHING`` on the newest).

    Examples
    --------
    >>> smoothed([1.0, 1.0, 0.0])
    0.7
    """
    out = float(values[0])
    for v in values[1:]:
        out = (1 - SMOOTHING) * out + SMOOTHING * float(v)
    return round(out, 12)


def count_non_finite(rows) -> float:
    """Non-finite numbers (nan, inf) in the last row, its ``health/`` columns aside."""
    row = rows[-1]
    return float(
        sum(
            isinstance(v, float) and not math.isfinite(v)
            for k, v in row.items()
            if not k.startswith("health/")
        )
    )


class HealthMonitor:
    """The detectors of one fit: a column per detector in each row, the summary, the action.

    Parameters
    ----------
    estimator : estimator
        Has ``history_`` (the rows) and ``on_unhealthy``; ``health_`` is written.
    detectors : list of Detector
    first_row : int
        Index in ``history_`` of this fit's first row (a warm start appends).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> est = SimpleNamespace(history_=[], on_unhealthy="ignore")
    >>> big = Detector("big", 1.0, lambda rows: rows[-1]["x"], advice="Make x smaller.")
    >>> monitor = HealthMonitor(est, [big], first_row=0)
    >>> for step, x in enumerate([0.5, 2.0, 0.1], start=1):
    ...     est.history_.append({"step": step, "x": x})
    ...     _ = monitor.observe()
    >>> monitor.finish()["detectors"]["big"]
    {'fired': True, 'first_step': 2, 'value': 0.1, 'threshold': 1.0}
    >>> est.history_[1]["health/big"], est.health_["healthy"]
    (2.0, False)
    """

    def __init__(self, estimator, detectors, *, first_row: int):
        self.estimator = estimator
        self.detectors = list(detectors)
        self.first_row = first_row
        self.first_step = dict.fromkeys((d.name for d in self.detectors), None)
        self.values = dict.fromkeys((d.name for d in self.detectors), math.nan)
        action = getattr(estimator, "on_unhealthy", "warn")
        if action not in ACTIONS:
            raise ValueError(
                f"on_unhealthy={action!r} is not one of {', '.join(map(repr, ACTIONS))}."
            )
        self.action = action

    def rows(self) -> list:
        return self.estimator.history_[self.first_row :]

    def observe(self) -> bool:
        """Measure the last row (adding its ``health/`` columns); True to stop the fit."""
        rows = self.rows()
        row = rows[-1]
        stop = False
        for detector in self.detectors:
            value = float(detector.measure(rows))
            row[f"health/{detector.name}"] = value
            self.values[detector.name] = value
            if not detector.at_end:
                stop |= self._judge(detector, value, row["step"])
        self._write()
        return stop

    def finish(self) -> dict:
        """Judge the end-of-fit detectors on the last row; returns ``health_``."""
        rows = self.rows()
        if rows:
            for detector in self.detectors:
                if detector.at_end:
                    self._judge(detector, self.values[detector.name], rows[-1]["step"])
        return self._write()

    def _judge(self, detector: Detector, value: float, step: int) -> bool:
        if len(self.rows()) < detector.min_rows:
            return False
        if self.first_step[detector.name] is not None or not detector.fires(value):
            return False
        self.first_step[detector.name] = int(step)
        self._write()
        side = "below" if detector.below else "above"
        message = (
            f"{type(self.estimator).__name__}: run health detector {detector.name!r} fired "
            f"at step {step}: {value:.4g} is {side} its threshold {detector.threshold:g}. "
            f"{detector.advice} (on_unhealthy='ignore' silences this; health_ has every "
            "detector.)"
        )
        if self.action == "raise":
            raise RunHealthError(message)
        if self.action in ("warn", "stop"):
            warnings.warn(message, RunHealthWarning, stacklevel=5)  # about the caller of fit
        return self.action == "stop"

    def _write(self) -> dict:
        detectors = {
            d.name: {
                "fired": self.first_step[d.name] is not None,
                "first_step": self.first_step[d.name],
                "value": self.values[d.name],
                "threshold": float(d.threshold),
            }
            for d in self.detectors
        }
        healthy = not any(d["fired"] for d in detectors.values())
        health = {"healthy": healthy, "detectors": detectors}
        rates = [row[RATE] for row in self.rows() if RATE in row]
        if rates:  # an adaptive learning rate: where it went is part of how the run went
            health["learning_rate"] = {
                "first": rates[0],
                "last": rates[-1],
                "min": min(rates),
                "max": max(rates),
            }
        self.estimator.health_ = health
        return health


# ----- the supervised loop's detectors ------------------------------------------------
LOSS_BLOWUP = 2.0
NO_LEARNING_SUPERVISED = 1e-6
PROBE_SIZE = 4096  # entries of each parameter tensor watched by "no learning"


def loss_key(row: dict) -> str | None:
    """The row's loss: its first ``loss/`` column."""
    return next((k for k in row if k.startswith("loss/")), None)


def loss_blowup(rows) -> float:
    """The smoothed loss over the first step's loss (at the starting weights); 0 at first."""
    key = loss_key(rows[0])
    if key is None:
        return 0.0
    losses = [r[key] for r in rows if math.isfinite(r.get(key, math.nan))]
    if len(losses) < 2 or losses[0] <= 0:
        return 0.0
    return smoothed(losses) / losses[0]


class WeightProbe:
    """The first ``PROBE_SIZE`` entries of each trained tensor, to tell whether they moved.

    Each step's change goes into its row (``model/weight_change``), so a resumed
    fit reads the same numbers as an uninterrupted one.
    """

    def __init__(self, parameters):
        self.parameters = [p for p in parameters if p.numel() and p.device.type != "meta"]
        self.last = [self._take(p) for p in self.parameters]

    @staticmethod
    def _take(p) -> torch.Tensor:
        return p.detach().reshape(-1)[:PROBE_SIZE].float().cpu().clone()

    def largest_change(self, rows) -> float:
        """The largest step's ``||w - w_before|| / ||w_before||`` of the fit so far."""
        now = [self._take(p) for p in self.parameters]
        moved = sum(float(((a - b) ** 2).sum()) for a, b in zip(now, self.last, strict=True))
        scale = math.sqrt(sum(float((b**2).sum()) for b in self.last)) or 1.0
        rows[-1]["model/weight_change"] = math.sqrt(moved) / scale
        self.last = now
        return max(r.get("model/weight_change", 0.0) for r in rows)


def supervised_monitor(estimator, parameters, *, first_row: int) -> HealthMonitor:
    """The detectors of a supervised fit (SFT, the reward model, DPO).

    - ``non_finite``: the number of non-finite values (nan, inf) in a row;
      fires above 0.
    - ``loss_blowup``: the smoothed loss (exponential moving average, weight
      0.3 on the newest row) over the first row's loss (computed at the
      starting weights); fires above 2.0 (the loss doubled: a learning rate
      too high).
    - ``no_learning``: the largest relative change of a step,
      ``||w - w_before|| / ||w_before||`` over the trained weights' first 4096
      entries each (``model/weight_change`` in each row), at the end of the
      fit; fires below 1e-6 (nothing moved: a learning rate of about 0).

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> w = torch.nn.Parameter(torch.ones(3))
    >>> est = SimpleNamespace(history_=[{"step": 1, "loss/toy": 1.0}], on_unhealthy="ignore")
    >>> monitor = supervised_monitor(est, [w], first_row=0)
    >>> _ = monitor.observe()
    >>> monitor.finish()["detectors"]["no_learning"]["fired"]
    True
    """
    probe = WeightProbe(parameters)
    return HealthMonitor(
        estimator,
        [
            Detector(
                "non_finite",
                0.0,
                count_non_finite,
                advice="Lower learning_rate or check the data for empty or huge rows.",
            ),
            Detector(
                "loss_blowup",
                LOSS_BLOWUP,
                loss_blowup,
                advice="The loss rose far above its start: lower learning_rate.",
            ),
            Detector(
                "no_learning",
                NO_LEARNING_SUPERVISED,
                probe.largest_change,
                advice="The weights did not move: raise learning_rate.",
                below=True,
                at_end=True,
            ),
        ],
        first_row=first_row,
    )
