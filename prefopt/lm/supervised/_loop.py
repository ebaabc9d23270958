"""One fit of a supervised estimator: the loop object that owns the run and takes its steps.

    epochs x shuffled minibatches -> learning-rate schedule -> guarded step -> record

SFT, the language-model reward model and DPO differ only in their minibatch loss;
everything else (the order, the schedule, the guarded optimiser step, ``history_``,
the progress bar, tracking, run health, checkpoints and the callback) is this
loop's. It has the policy loop's shape (:mod:`prefopt.policies.loop`): what it
needs of the estimator is gathered once (:class:`SupervisedView`), a step object
is given its inputs and returns a plain result
(:class:`~prefopt.lm.supervised.SupervisedStep`,
:class:`~prefopt.lm.supervised.SupervisedResult`), and the estimator's own
``record`` writes each result into its fitted attributes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...backend import adamw, distributed
from ...backend.memory import enable_gradient_checkpointing
from ...backend.progress import progress_shown, tqdm
from ...tracking import open_run
from .._health import supervised_monitor
from ._step import SupervisedStep, schedule_scale

__all__ = ["SupervisedLoop", "SupervisedView"]


@dataclass
class SupervisedView:
    """What the supervised loop needs of the estimator, gathered once per fit.

    Parameters
    ----------
    name : str
        Shown on the progress bar and in errors.
    n_epochs, batch_size : int
    learning_rate : float
        The peak rate (the estimator's ``learning_rate_``).
    schedule : {"cosine", "linear", "constant"}
        Learning-rate schedule over the whole fit.
    checkpoint_every : int
        Steps between checkpoints (with a checkpoint folder).
    micro_batch_size : int or None
    gradient_checkpointing : bool
    model : torch.nn.Module or None
        The trained model (``model_``).
    device : torch.device or None
    """

    name: str
    n_epochs: int
    batch_size: int
    learning_rate: float
    schedule: str
    checkpoint_every: int = 100
    micro_batch_size: int | None = None
    gradient_checkpointing: bool = False
    model: torch.nn.Module | None = None
    device: torch.device | None = None

    @classmethod
    def of(cls, estimator, *, name: str, schedule: str) -> SupervisedView:
        """The view of a fitted-so-far estimator (``learning_rate_`` and ``model_`` set).

        The memory knobs, the checkpoint interval and the model are read where the
        estimator has them (a toy estimator of the examples has none).

        Parameters
        ----------
        estimator : estimator
            Has ``n_epochs``, ``batch_size`` and ``learning_rate_``.
        name : str
            Shown on the progress bar and in errors.
        schedule : {"cosine", "linear", "constant"}

        Returns
        -------
        view : SupervisedView
        """
        return cls(
            name=name,
            n_epochs=estimator.n_epochs,
            batch_size=estimator.batch_size,
            learning_rate=estimator.learning_rate_,
            schedule=schedule,
            checkpoint_every=getattr(estimator, "checkpoint_every", 100),
            micro_batch_size=getattr(estimator, "micro_batch_size", None),
            gradient_checkpointing=getattr(estimator, "gradient_checkpointing", False),
            model=getattr(estimator, "model_", None),
            device=getattr(estimator, "device_", None),
        )


class SupervisedLoop:
    """The state and the steps of one supervised fit over ``n_rows`` rows.

    Each step draws ``batch_size`` rows (a new order each epoch from
    ``generator``), sets the learning rate from the view's peak and schedule,
    and takes one :class:`~prefopt.lm.supervised.SupervisedStep`. The run-health
    detectors (non-finite values, loss blow-up, no learning) add their
    ``health/`` columns and write ``health_``, acting on the estimator's
    ``on_unhealthy``. With a checkpoint folder, a saved run continues from its last
    checkpoint (its fitted state restored here) and a checkpoint is written every
    ``checkpoint_every`` steps and at the end.

    Two memory knobs are read from the view. ``gradient_checkpointing`` turns on
    transformers' gradient checkpointing in the model
    (:func:`~prefopt.backend.memory.enable_gradient_checkpointing`), whose passes
    with gradients then run in training mode (dropout is off);
    ``micro_batch_size`` splits each minibatch's passes into parts (not in a
    distributed fit). In a distributed fit each minibatch's rows are split across
    ranks (every rank draws the same order), losses are global means, gradients
    are averaged by DDP (a wrapper this loop holds: the model itself stays what
    checkpoints read) and rank 0 writes.

    Parameters
    ----------
    estimator : estimator
        What checkpoints, callbacks, trackers and the health monitor receive; its
        ``n_iter_`` and ``history_`` are where the run continues from.
    view : SupervisedView
    n_rows : int
        Rows of training data.
    batch_loss : callable
        ``batch_loss(model, rows) -> (loss tensor, dict of floats)``: ``model`` is
        what the training passes go through; the dict joins the history row.
    parameters : iterable of torch.nn.Parameter
        What the optimiser trains (those that require gradients).
    generator : torch.Generator
        Shuffles the rows.
    resume : Resume, default=None
        The fit's checkpoint, or ``None``.
    model_key : str, default=None
        Fingerprint of the starting model, compared with the checkpoint's.
    weight : callable, default=None
        ``weight(rows) -> float``: what ``batch_loss(model, rows)``'s loss is a mean
        over (its tokens, for a token-mean loss); ``None`` means ``len(rows)``.

    Examples
    --------
    >>> import torch
    >>> from types import SimpleNamespace
    >>> w = torch.nn.Parameter(torch.zeros(1))
    >>> est = SimpleNamespace(n_epochs=2, batch_size=2, learning_rate_=0.1, n_iter_=0,
    ...                       history_=[], on_unhealthy="ignore")
    >>> loss = lambda model, rows: (((w - 1.0) ** 2).sum(), {"loss/toy": 0.0})
    >>> view = SupervisedView.of(est, name="toy", schedule="constant")
    >>> loop = SupervisedLoop(est, view, 4, loss, parameters=[w], generator=torch.Generator())
    >>> def record(result):
    ...     est.n_iter_ += 1
    ...     est.history_.append(result.row)
    >>> _ = loop.train(record=record)
    >>> est.n_iter_, len(est.history_)
    (4, 4)
    """

    def __init__(
        self,
        estimator,
        view: SupervisedView,
        n_rows: int,
        batch_loss,
        *,
        parameters,
        generator: torch.Generator,
        resume=None,
        model_key: str | None = None,
        weight=None,
    ):
        name = view.name
        distributed.check_rows(n_rows, view.batch_size, name)
        if view.micro_batch_size is not None and distributed.world_size() > 1:
            raise ValueError(
                f"{name}: micro_batch_size is not supported in a distributed fit yet (the "
                "ranks' losses are normalised over the whole minibatch, part by part); set "
                "micro_batch_size=None and lower batch_size, or add ranks."
            )
        if view.gradient_checkpointing:
            enable_gradient_checkpointing(view.model, f"{name}'s model")
        # DDP (also under distributed="fsdp": FSDP shards the RL policy only): the training
        # passes go through the wrapper, which batch_loss is given.
        trained = distributed.prepare(view.model, view.device, shard=False)
        self.parameters = [p for p in parameters if p.requires_grad]  # a LoRA adapter's own
        self.optimizer = adamw(self.parameters, view.learning_rate)
        self.estimator, self.view, self.n_rows = estimator, view, n_rows
        self.generator, self.resume = generator, resume
        self.per_epoch = math.ceil(n_rows / view.batch_size)
        self.total = self.per_epoch * view.n_epochs
        self.start_iter = estimator.n_iter_
        self.epoch_generator = generator.get_state()
        saved = None if resume is None else resume.restore(estimator, model_key)
        if saved is not None:  # continue the saved run where its last checkpoint left it
            self.optimizer.load_state_dict(saved["optimizer"])
            self.start_iter = int(saved["start_iter"])
            generator.set_state(torch.as_tensor(saved["epoch_generator"], dtype=torch.uint8))
            if int(saved["epoch"]) < (estimator.n_iter_ - self.start_iter) // self.per_epoch:
                torch.randperm(n_rows, generator=generator)  # that epoch's order, drawn again
        self.n_iter = estimator.n_iter_  # restored by a resume
        self.steps = SupervisedStep(batch_loss, self.optimizer, trained, view.model,
                                    view.micro_batch_size, weight, name)  # fmt: skip

    def train(self, callback=None, *, record) -> torch.optim.Optimizer:
        """The steps of the fit's epochs, each recorded, logged, checked and checkpointed.

        ``record(result)`` (the estimator's) writes each
        :class:`~prefopt.lm.supervised.SupervisedResult` into ``n_iter_`` and
        ``history_`` before the health monitor, the checkpoint and the callbacks read
        them. ``callback(estimator, row)`` runs after every step (returning ``True``
        stops the fit there); the trackers of ``set_config(report_to=...)`` and the
        loggers among ``callback`` open (and log the parameters) before the first
        step. With ``verbose`` the rows are printed every 10 steps (every step from
        ``verbose=2``).

        Parameters
        ----------
        callback : callable, Logger or list of them, default=None
        record : callable
            ``record(result)``: writes a step's result into the fitted attributes.

        Returns
        -------
        optimizer : torch.optim.Optimizer
        """
        estimator, view, generator = self.estimator, self.view, self.generator
        batch_size, per_epoch = view.batch_size, self.per_epoch
        step = self.n_iter - self.start_iter
        first_row = len(estimator.history_) - step
        health = supervised_monitor(estimator, self.parameters, first_row=first_row)
        stop = False
        show = progress_shown() and distributed.is_main()  # "auto": a terminal or notebook
        # Trackers open (and log the parameters) before the first step: a missing package or
        # an unwritable folder fails here, not after minutes of training.
        total = self.start_iter + self.total
        with open_run(estimator, callback, name=view.name, total=total) as run:
            bar = tqdm(total=self.total, initial=step, desc=view.name, disable=not show,
                       leave=False)  # fmt: skip
            for epoch in range(step // per_epoch, view.n_epochs):
                self.epoch_generator = generator.get_state()
                order = torch.randperm(self.n_rows, generator=generator).tolist()
                skip = step % per_epoch if epoch == step // per_epoch else 0
                for start in range(skip * batch_size, self.n_rows, batch_size):
                    lr = view.learning_rate * schedule_scale(view.schedule, step / self.total)
                    rows = order[start : start + batch_size]
                    result = self.steps(rows, lr=lr, n_iter=self.n_iter + 1)
                    step += 1
                    self.n_iter += 1
                    record(result)
                    unhealthy = health.observe()  # on_unhealthy="stop" ends the run here
                    bar.update(1)
                    bar.set_postfix(loss=f"{result.loss:.3f}")
                    if self.resume is not None and (
                        step % view.checkpoint_every == 0 or step == self.total
                    ):
                        self.save_checkpoint(epoch)
                    # Every rank stops together (health reads rows reduced over the ranks).
                    stop = distributed.any_rank(run(estimator, result.row)) or unhealthy
                    if stop:
                        break
                if stop:
                    break
            bar.close()
            health.finish()
        return self.optimizer

    def save_checkpoint(self, epoch: int) -> None:
        """Write the estimator's fitted state and this run's state to the checkpoint folder.

        Parameters
        ----------
        epoch : int
            The epoch the run is in (a resume draws its order again).
        """
        run_state = {
            "optimizer": self.optimizer.state_dict(),
            "start_iter": self.start_iter,
            "epoch": epoch,
            "epoch_generator": self.epoch_generator,
        }
        self.resume.save(self.estimator, run_state)
