"""One step of the supervised loop: a guarded optimiser step on a minibatch, and its result.

:class:`SupervisedStep` is given everything it reads (the minibatch loss, the optimiser,
the module the training passes go through, the micro-batch size) and returns a plain
:class:`SupervisedResult`; the estimator's ``fit`` writes it into ``n_iter_`` and
``history_`` (through the loop's ``record``).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

from ...backend import distributed
from ...backend.memory import accumulated_step, micro_batches, training_passes

__all__ = ["SupervisedResult", "SupervisedStep", "schedule_scale"]


def schedule_scale(schedule: str, progress: float) -> float:
    """The learning-rate multiplier at ``progress`` (0 at the start, 1 at the end).

    Parameters
    ----------
    schedule : {"cosine", "linear", "constant"}
        Cosine decay to 0 (Huang et al. 2024's SFT), linear decay to 0 (the
        original reward-model and PPO code), or constant.
    progress : float
        Share of the run done.

    Returns
    -------
    scale : float

    Examples
    --------
    >>> schedule_scale("linear", 0.25), schedule_scale("cosine", 0.5), schedule_scale("constant", 1)
    (0.75, 0.5, 1.0)
    """
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "constant":
        return 1.0
    raise ValueError(f"Unknown learning-rate schedule {schedule!r}.")


@dataclass
class SupervisedResult:
    """One supervised step's outcome, which ``fit`` writes into its fitted attributes.

    Parameters
    ----------
    row : dict
        The ``history_`` row (``step``, the loss's statistics reduced over the ranks,
        ``charts/learning_rate``, ``time/step_s``).
    loss : float
        The minibatch's loss, as the progress bar shows it.
    """

    row: dict
    loss: float


class SupervisedStep:
    """One guarded optimiser step on a minibatch of row indices.

    The minibatch's share of this rank is cut into micro-batches of
    ``micro_batch_size`` rows; each part's loss, weighted by its share of
    ``weight`` (rows, or the tokens the loss averages over), goes backward, and
    one step is taken on the accumulated gradient, refused when the loss is not
    finite (:func:`~prefopt.backend.memory.accumulated_step`). A part's
    statistics are averaged with the same weights, except counts (``data/...``
    keys), which are summed; the row is then reduced over the ranks.

    Parameters
    ----------
    batch_loss : callable
        ``batch_loss(model, rows) -> (loss tensor, dict of floats)``.
    optimizer : torch.optim.Optimizer
    model : torch.nn.Module or None
        What the training passes go through: the estimator's model, or its
        DistributedDataParallel wrapper in a distributed fit.
    checkpointed : torch.nn.Module or None
        The estimator's model, put in training mode for the passes when it
        checkpoints its activations.
    micro_batch_size : int or None
    weight : callable or None
        ``weight(rows) -> float``; ``None`` means ``len(rows)``.
    name : str
        Named in errors.

    Examples
    --------
    >>> import torch
    >>> w = torch.nn.Parameter(torch.zeros(1))
    >>> opt = torch.optim.SGD([w], lr=0.5)
    >>> step = SupervisedStep(lambda model, rows: (((w - 1.0) ** 2).sum(), {"loss/toy": 1.0}),
    ...                       opt, None, None, None, None, "toy")
    >>> result = step([0, 1], lr=0.5, n_iter=1)
    >>> result.row["step"], result.loss, float(w)
    (1, 1.0, 1.0)
    """

    def __init__(self, batch_loss, optimizer, model, checkpointed, micro_batch_size, weight, name):
        self.loss = functools.partial(batch_loss, model)
        self.optimizer = optimizer
        self.checkpointed = checkpointed
        self.micro_batch_size = micro_batch_size
        self.weight = weight
        self.name = name

    def __call__(self, rows, *, lr: float, n_iter: int) -> SupervisedResult:
        """The step on ``rows`` (the global minibatch) at rate ``lr``; ``n_iter``: its number."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        began = time.perf_counter()
        # This rank's share; a loss goes through the DDP wrapper and means over the
        # ranks where batch_loss says so (across_ranks=True).
        parts = micro_batches(distributed.shard(rows), self.micro_batch_size)
        weights = [float(self.weight(p) if self.weight else len(p)) for p in parts]
        with training_passes(self.checkpointed):
            loss, stats = accumulated_step(
                self.optimizer, parts, self.loss, weights, who=self.name, step=n_iter
            )
        stats = distributed.reduce_row(_merged(stats))
        row = {
            "step": n_iter,
            **stats,
            "charts/learning_rate": lr,
            "time/step_s": time.perf_counter() - began,
        }
        return SupervisedResult(row=row, loss=loss.item())


def _merged(parts: list) -> dict:
    """One history row from the parts' ``(share, stats)``: weighted means, counts summed."""
    if len(parts) == 1:
        return parts[0][1]
    out: dict = {}
    for share, stats in parts:
        for key, value in stats.items():
            add = float(value) if key.startswith("data/") else share * float(value)
            out[key] = out.get(key, 0.0) + add
    for key, value in parts[0][1].items():
        if key.startswith("data/") and isinstance(value, int):
            out[key] = int(round(out[key]))
    return out
