"""Memory knobs of the training passes: gradient checkpointing and micro-batches.

* **Gradient checkpointing** is transformers' own (``activation_checkpointing_enable``,
  ``gradient_checkpointing_enable`` before transformers 5.x renamed it), non-reentrant.
  A transformers layer recomputes its activations in the backward pass only in
  training mode with gradients on; prefopt keeps its models in eval mode (dropout is
  off either way), so :func:`training_passes` puts a checkpointing model in training
  mode for the passes that take gradients and back afterwards. Passes without
  gradients (sampling with its KV cache, the reference, scoring) run as before.
* **Micro-batches** split a minibatch's forward and backward passes; the losses are
  weighted so that the accumulated gradient is the whole minibatch's
  (:func:`micro_batches`, :func:`accumulated_step`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from ._torch import gradient_step

__all__ = [
    "accumulated_step",
    "checkpointable",
    "checkpoints_activations",
    "enable_gradient_checkpointing",
    "micro_batches",
    "training_passes",
]


def _transformers_models(module: nn.Module) -> list:
    """The outermost transformers models inside ``module`` (itself, a trunk, a peft base)."""
    from transformers import PreTrainedModel

    found, covered = [], set()
    for sub in module.modules():  # pre-order: an outer model comes before its parts
        if id(sub) in covered or not isinstance(sub, PreTrainedModel):
            continue
        found.append(sub)
        covered.update(id(m) for m in sub.modules())
    return found


def enable_gradient_checkpointing(module: nn.Module, who: str = "the model") -> nn.Module:
    """Turn on transformers' gradient checkpointing in every transformers model in ``module``.

    Non-reentrant (``use_reentrant=False``); transformers also makes the input
    embeddings' output require gradients, so a LoRA adapter over frozen weights
    still gets its gradients. A model that already checkpoints is left as it is.

    Parameters
    ----------
    module : torch.nn.Module
        A transformers model, a peft model around one, or a module holding one
        (a :class:`~prefopt.backend.ScalarHeadModel`'s trunk).
    who : str, default="the model"
        Named in the error.

    Returns
    -------
    module : torch.nn.Module
        The same object, changed in place.

    Raises
    ------
    ValueError
        When ``module`` holds no transformers model that supports checkpointing
        (a table, a hand-written module): there is nothing to recompute.

    Examples
    --------
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=11))
    >>> checkpoints_activations(enable_gradient_checkpointing(model))
    True
    """
    models = [m for m in _transformers_models(module) if m.supports_gradient_checkpointing]
    if not models:
        raise ValueError(
            f"gradient_checkpointing=True needs a transformers model that supports it; "
            f"{who} is a {type(module).__name__}. Set gradient_checkpointing=False."
        )
    for model in models:
        if _flag(model):
            continue  # on already (the model came so): kept, with its own settings
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:  # transformers >= 5.20's name
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
    return module


def checkpointable(module: nn.Module | None) -> bool:
    """Whether ``module`` holds a transformers model that supports gradient checkpointing.

    Parameters
    ----------
    module : torch.nn.Module or None

    Returns
    -------
    supported : bool

    Examples
    --------
    >>> from torch import nn
    >>> checkpointable(nn.Linear(2, 2)), checkpointable(None)
    (False, False)
    """
    if module is None:
        return False
    return any(m.supports_gradient_checkpointing for m in _transformers_models(module))


def _flag(model) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def checkpoints_activations(module: nn.Module | None) -> bool:
    """Whether any transformers model inside ``module`` has gradient checkpointing on.

    Parameters
    ----------
    module : torch.nn.Module or None

    Returns
    -------
    on : bool

    Examples
    --------
    >>> from torch import nn
    >>> checkpoints_activations(nn.Linear(2, 2))
    False
    """
    if module is None:
        return False
    return any(_flag(m) for m in _transformers_models(module))


@contextmanager
def training_passes(*modules):
    """Training mode for the checkpointing ones of ``modules`` inside the block.

    transformers recomputes a layer in the backward pass only in training mode,
    so the forward and backward passes that take gradients run inside this block;
    every module's mode is restored afterwards. Modules that do not checkpoint
    are left alone (prefopt keeps them in eval mode, its dropout off).

    Parameters
    ----------
    *modules : torch.nn.Module or None
        The trained modules (the policy, a value model, a reward model).

    Examples
    --------
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=11))
    >>> _ = enable_gradient_checkpointing(model).eval()
    >>> with training_passes(model):
    ...     inside = model.training
    >>> inside, model.training
    (True, False)
    """
    chosen = []
    for module in modules:
        if module is not None and checkpoints_activations(module) and module not in chosen:
            chosen.append(module)
    # Every mode is saved before any is changed: modules that share a trunk (PPO's shared
    # value model) would otherwise record the trunk as training and leave it so.
    saved = {id(m): (m, m.training) for module in chosen for m in module.modules()}
    for module in chosen:
        module.train()
    try:
        yield
    finally:
        for m, mode in saved.values():
            m.training = mode


def micro_batches(rows, size: int | None) -> list:
    """``rows`` cut into consecutive slices of at most ``size`` (one slice for ``None``).

    Parameters
    ----------
    rows : list, ndarray or tensor
        A minibatch's rows.
    size : int or None
        Rows per micro-batch; ``None`` (or at least ``len(rows)``) keeps one.

    Returns
    -------
    parts : list
        Slices of ``rows``, in order.

    Examples
    --------
    >>> micro_batches([1, 2, 3, 4, 5], 2)
    [[1, 2], [3, 4], [5]]
    >>> micro_batches([1, 2, 3], None)
    [[1, 2, 3]]
    """
    if size is None or size >= len(rows):
        return [rows]
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def accumulated_step(
    optimizer, parts, part_loss, weights, *, who: str, step: int, max_grad_norm=None
):
    """One optimiser step on a minibatch whose passes run in micro-batches.

    The minibatch's loss is ``sum_j w_j * loss_j / sum_j w_j``, where ``loss_j`` is
    the loss of micro-batch ``j`` (a mean over its own rows or tokens) and ``w_j`` its
    number of rows or tokens: the mean over the whole minibatch. Each part's
    weighted loss is taken backward as soon as it is computed (its activations are
    freed before the next part's forward), and the step is taken once, on the
    accumulated gradient, which equals the whole minibatch's up to float rounding.
    A single part is :func:`~prefopt.backend.gradient_step` itself.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
    parts : list
        The micro-batches (:func:`micro_batches`).
    part_loss : callable
        ``part_loss(part) -> (loss, stats)``: the part's mean loss and a dict of floats.
    weights : list of float
        Rows or tokens each part's mean is over (the normaliser is their sum).
    who : str
        Named in the errors.
    step : int
        Named in the errors.
    max_grad_norm : float, default=None
        Clip the accumulated gradient's global norm to this.

    Returns
    -------
    loss : torch.Tensor
        The minibatch's loss (detached when there are several parts).
    stats : list of (float, dict)
        Each part's weight share and stats.

    Raises
    ------
    FloatingPointError
        As :func:`~prefopt.backend.gradient_step`, before the step.

    Examples
    --------
    >>> import torch
    >>> w = torch.nn.Parameter(torch.zeros(1))
    >>> opt = torch.optim.SGD([w], lr=1.0)
    >>> x = torch.tensor([1.0, 2.0, 3.0])
    >>> parts = micro_batches([0, 1, 2], 2)
    >>> part_loss = lambda p: (((w - x[p]) ** 2).mean(), {})
    >>> loss, _ = accumulated_step(opt, parts, part_loss, [2, 1], who="toy", step=1)
    >>> round(loss.item(), 4), w.item()  # the mean over all three rows, and its gradient's step
    (4.6667, 4.0)
    """
    if len(parts) == 1:
        loss, stats = part_loss(parts[0])
        gradient_step(optimizer, loss, who=who, step=step, max_grad_norm=max_grad_norm)
        return loss, [(1.0, stats)]
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"{who}: a minibatch with nothing to average over (weights {weights}).")
    optimizer.zero_grad(set_to_none=True)
    losses, out = [], []
    for part, weight in zip(parts, weights):
        loss, stats = part_loss(part)
        if not torch.isfinite(loss.detach()).all():
            optimizer.zero_grad(set_to_none=True)  # nothing of this minibatch is applied
            raise FloatingPointError(
                f"{who}: the loss became {loss.item()} at step {step}; lower "
                "learning_rate or check the data and the reward."
            )
        share = float(weight) / total
        (loss * share).backward()
        losses.append(loss.detach() * share)
        out.append((share, stats))
    gradient_step(optimizer, None, who=who, step=step, max_grad_norm=max_grad_norm)
    return torch.stack(losses).sum(), out
