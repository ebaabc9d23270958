"""The one supervised training loop: epochs x shuffled minibatches x schedule x guarded step.

SFT, the language-model reward model and DPO differ only in their minibatch loss;
everything else (order, learning-rate schedule, the guarded optimiser step,
``history_``, the progress bar, tracking and the callback) is this loop's.
"""

from __future__ import annotations

import functools
import math
import os
import time
import warnings
from numbers import Integral, Real

import torch

from ..backend import adamw, distributed
from ..backend.memory import (
    accumulated_step,
    enable_gradient_checkpointing,
    micro_batches,
    training_passes,
)
from ..backend.progress import progress_shown, tqdm
from ..tracking import open_run
from ..validation import Interval, StrOptions
from ._health import supervised_monitor

__all__ = ["SUPERVISED_CONSTRAINTS", "schedule_scale", "train_minibatches", "warn_y_ignored"]

# Why a comparison estimator's score needs no y.
COMPARISONS_SAY = "the comparisons say which response is chosen"

# The constraints of the parameters every supervised estimator (SFT, the reward model,
# DPO) shares: each declares only its own beside them.
SUPERVISED_CONSTRAINTS = {
    "model": "no_validation",
    "tokenizer": "no_validation",
    "learning_rate": [Interval(Real, 0, None, closed="neither"), None],
    "n_epochs": [Interval(Integral, 1, None, closed="left")],
    "batch_size": [Interval(Integral, 1, None, closed="left")],
    "temperature": [Interval(Real, 0, None, closed="neither"), None],
    "max_new_tokens": [Interval(Integral, 1, None, closed="left"), None],
    "stop_token_ids": ["array-like", Interval(Integral, 0, None, closed="left"), None],
    "max_length": [Interval(Integral, 2, None, closed="left"), None],
    "max_prompt_length": [Interval(Integral, 1, None, closed="left"), None],
    "random_state": ["random_state"],
    "verbose": ["verbose"],
    "checkpoint_dir": [str, os.PathLike, None],
    "checkpoint_every": [Interval(Integral, 1, None, closed="left")],
    "on_unhealthy": [StrOptions({"warn", "raise", "stop", "ignore"})],
    "lora": "no_validation",
    "gradient_checkpointing": ["boolean"],
    "micro_batch_size": [Interval(Integral, 1, None, closed="left"), None],
}


def warn_y_ignored(y, method: str, why: str = COMPARISONS_SAY) -> None:
    """Warn that ``method`` (a ``score`` or ``partial_fit``) ignores the ``y`` it was given.

    ``why`` says where the targets come from instead; the warning points at the caller.

    Examples
    --------
    >>> warn_y_ignored(None, "RewardModel.score")  # no y: nothing to say
    """
    if y is not None:
        warnings.warn(
            f"{method} ignores y (got {type(y).__name__}): {why}; call score(X) without y.",
            UserWarning,
            stacklevel=3,
        )


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


def train_minibatches(
    estimator,
    n_rows: int,
    batch_loss,
    *,
    parameters,
    generator,
    schedule: str,
    name: str,
    resume=None,
    model_key: str | None = None,
    callback=None,
    weight=None,
) -> torch.optim.Optimizer:
    """Train ``estimator`` for its ``n_epochs`` over ``n_rows`` rows in shuffled minibatches.

    Each step draws ``batch_size`` rows (a new order each epoch from
    ``generator``), sets the learning rate from ``estimator.learning_rate_`` and
    the schedule, calls ``batch_loss(rows) -> (loss, stats)``, takes one AdamW
    step that refuses a non-finite loss, and appends a ``history_`` row, which goes to
    the trackers of ``set_config(report_to=...)`` and to ``callback``; with
    ``estimator.verbose`` it is printed every 10 steps (every step from ``verbose=2``).
    The run-health detectors (non-finite values, loss blow-up, no learning) add its
    ``health/`` columns and write ``estimator.health_``, acting on the estimator's
    ``on_unhealthy`` (default ``"warn"``).

    Two memory knobs of the estimator are read here. ``gradient_checkpointing``
    (default False) turns on transformers' gradient checkpointing in
    ``estimator.model_`` (:func:`~prefopt.backend.memory.enable_gradient_checkpointing`),
    which then recomputes its activations in the backward pass; the passes with
    gradients run in training mode (dropout is off). ``micro_batch_size`` (default
    None) splits each minibatch's forward and backward passes into parts of that
    many rows, each part's loss weighted by its share of ``weight`` (rows, or the
    tokens the loss averages over), so the step is the whole minibatch's; a part's
    stats are averaged with the same weights, except counts (``data/...`` keys),
    which are summed.

    Parameters
    ----------
    estimator : estimator
        Has ``n_epochs``, ``batch_size``, ``learning_rate_``, ``n_iter_`` and
        ``history_``; ``n_iter_`` and ``history_`` are updated.
    n_rows : int
        Rows of training data.
    batch_loss : callable
        ``batch_loss(model, rows) -> (loss tensor, dict of floats)``: ``model`` is
        what the training passes go through (``estimator.model_``, or its
        DistributedDataParallel wrapper in a distributed fit); the dict joins the
        history row.
    parameters : iterable of torch.nn.Parameter
        What the optimiser trains.
    generator : torch.Generator
        Shuffles the rows.
    schedule : {"cosine", "linear", "constant"}
        Learning-rate schedule over the whole fit.
    name : str
        Shown on the progress bar and in errors.
    resume : Resume, default=None
        The fit's checkpoint (``None`` for none): a saved run continues from its
        last checkpoint, and a checkpoint is written every ``checkpoint_every``
        steps and at the end.
    model_key : str, default=None
        Fingerprint of the starting model, compared with the checkpoint's.
    callback : callable, Logger or list of them, default=None
        ``callback(estimator, row)`` after every step; returning ``True`` stops
        the fit after that step. A :mod:`prefopt.tracking` logger logs the fit.
    weight : callable, default=None
        ``weight(rows) -> float``: what ``batch_loss(rows)``'s loss is a mean over
        (its tokens, for a token-mean loss); ``None`` means ``len(rows)``. Read only
        with ``micro_batch_size``.

    Returns
    -------
    optimizer : torch.optim.Optimizer

    Examples
    --------
    >>> import torch
    >>> from types import SimpleNamespace
    >>> w = torch.nn.Parameter(torch.zeros(1))
    >>> est = SimpleNamespace(n_epochs=2, batch_size=2, learning_rate_=0.1, n_iter_=0, history_=[])
    >>> loss = lambda model, rows: (((w - 1.0) ** 2).sum(), {"loss/toy": 0.0})
    >>> _ = train_minibatches(est, 4, loss, parameters=[w], generator=torch.Generator(),
    ...                       schedule="constant", name="toy")
    >>> est.n_iter_, len(est.history_)
    (4, 4)
    """
    # Distributed fits: each minibatch's rows are split across ranks (every rank draws the
    # same order), losses are global means, gradients averaged by DDP, rank 0 writes.
    distributed.check_rows(n_rows, estimator.batch_size, name)
    micro = getattr(estimator, "micro_batch_size", None)
    if micro is not None and distributed.world_size() > 1:
        raise ValueError(
            f"{name}: micro_batch_size is not supported in a distributed fit yet (the ranks' "
            "losses are normalised over the whole minibatch, part by part); set "
            "micro_batch_size=None and lower batch_size, or add ranks."
        )
    if getattr(estimator, "gradient_checkpointing", False):
        enable_gradient_checkpointing(estimator.model_, f"{name}'s model")
    # DDP (also under distributed="fsdp": FSDP shards the RL policy only): the training
    # passes go through the wrapper, which batch_loss is given.
    trained = distributed.prepare(
        getattr(estimator, "model_", None), getattr(estimator, "device_", None), shard=False
    )
    parameters = [p for p in parameters if p.requires_grad]  # a LoRA adapter: its own only
    optimizer = adamw(parameters, estimator.learning_rate_)
    per_epoch = math.ceil(n_rows / estimator.batch_size)
    total = per_epoch * estimator.n_epochs
    start_iter = estimator.n_iter_
    epoch_generator = generator.get_state()
    saved = None if resume is None else resume.restore(estimator, model_key)
    if saved is not None:  # continue the saved run where its last checkpoint left it
        optimizer.load_state_dict(saved["optimizer"])
        start_iter = int(saved["start_iter"])
        generator.set_state(torch.as_tensor(saved["epoch_generator"], dtype=torch.uint8))
        if int(saved["epoch"]) < (estimator.n_iter_ - start_iter) // per_epoch:
            torch.randperm(n_rows, generator=generator)  # that epoch's order, drawn again
    step = estimator.n_iter_ - start_iter
    health = supervised_monitor(estimator, parameters, first_row=len(estimator.history_) - step)
    stop = False
    show = progress_shown() and distributed.is_main()  # "auto": a terminal or notebook
    # Trackers open (and log the parameters) before the first step: a missing package or
    # an unwritable folder fails here, not after minutes of training.
    with open_run(estimator, callback, name=name, total=start_iter + total) as run:
        bar = tqdm(total=total, initial=step, desc=name, disable=not show, leave=False)
        for epoch in range(step // per_epoch, estimator.n_epochs):
            epoch_generator = generator.get_state()
            order = torch.randperm(n_rows, generator=generator).tolist()
            skip = step % per_epoch if epoch == step // per_epoch else 0
            for start in range(skip * estimator.batch_size, n_rows, estimator.batch_size):
                rows = order[start : start + estimator.batch_size]
                lr = estimator.learning_rate_ * schedule_scale(schedule, step / total)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                began = time.perf_counter()
                # This rank's share; a loss goes through the DDP wrapper and means over the
                # ranks where batch_loss says so (across_ranks=True).
                parts = micro_batches(distributed.shard(rows), micro)
                weights = [float(weight(p) if weight else len(p)) for p in parts]
                with training_passes(getattr(estimator, "model_", None)):
                    loss, stats = accumulated_step(
                        optimizer,
                        parts,
                        functools.partial(batch_loss, trained),
                        weights,
                        who=name,
                        step=estimator.n_iter_ + 1,
                    )
                stats = distributed.reduce_row(_merged(stats))
                step += 1
                estimator.n_iter_ += 1
                row = {
                    "step": estimator.n_iter_,
                    **stats,
                    "charts/learning_rate": lr,
                    "time/step_s": time.perf_counter() - began,
                }
                estimator.history_.append(row)
                unhealthy = health.observe()  # on_unhealthy="stop" ends the run here
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
                if resume is not None and (step % estimator.checkpoint_every == 0 or step == total):
                    run_state = {
                        "optimizer": optimizer.state_dict(),
                        "start_iter": start_iter,
                        "epoch": epoch,
                        "epoch_generator": epoch_generator,
                    }
                    resume.save(estimator, run_state)
                # Every rank stops together (health reads rows reduced over the ranks).
                stop = distributed.any_rank(run(estimator, row)) or unhealthy
                if stop:
                    break
            if stop:
                break
        bar.close()
        health.finish()
    return optimizer


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
