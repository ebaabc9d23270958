"""Device, dtype and random-number helpers shared by every estimator."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import numpy as np
import torch
from sklearn.utils import check_random_state

from .._config import get_config


def resolve_device() -> torch.device:
    """Return the torch device chosen by :func:`prefopt.set_config`.

    Examples
    --------
    >>> from prefopt.backend import resolve_device
    >>> resolve_device().type in ("cpu", "cuda", "mps")
    True
    """
    from . import distributed

    name = get_config()["device"]
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    # Under a launcher each rank takes its own GPU (cuda:LOCAL_RANK), never all cuda:0.
    if distributed.init_from_env() and name == "cuda":
        name = f"cuda:{distributed.local_rank()}"
    return torch.device(name)


def uses_bf16(device: torch.device) -> bool:
    """Whether forward passes on ``device`` run under bfloat16 autocast.

    On CUDA with dtype ``"auto"`` or ``"bfloat16"``; on the CPU with
    ``"bfloat16"`` only (``"auto"`` stays float32 there).

    Parameters
    ----------
    device : torch.device
        Device of the forward pass.

    Returns
    -------
    bf16 : bool

    Raises
    ------
    ValueError
        With ``dtype="bfloat16"`` on another device (``mps``...), where prefopt
        has no bfloat16 path: an error, rather than float32 passes that look like bf16.

    Examples
    --------
    >>> import torch, prefopt
    >>> uses_bf16(torch.device("cpu"))
    False
    >>> with prefopt.config_context(dtype="bfloat16"):
    ...     uses_bf16(torch.device("cpu"))
    True
    """
    dtype = get_config()["dtype"]
    if device.type == "cuda":
        return dtype in ("auto", "bfloat16")
    if device.type == "cpu":
        return dtype == "bfloat16"
    if dtype == "bfloat16":
        raise ValueError(
            f"set_config(dtype='bfloat16') runs bfloat16 autocast on CUDA and on the CPU; "
            f"the device is {device}. Set dtype='float32' (or 'auto') for this device."
        )
    return False


def autocast(device: torch.device):
    """bfloat16 autocast when the configured dtype asks for it on ``device``, else a no-op.

    CUDA autocasts with dtype ``"auto"`` or ``"bfloat16"``, the CPU with
    ``"bfloat16"`` (:func:`uses_bf16`). Log-softmax is always taken in float32
    by the callers, so log-probabilities of the sampling and training passes
    agree (Huang et al. 2024), and the losses are float32.

    Parameters
    ----------
    device : torch.device
        Device of the forward pass.

    Returns
    -------
    context : context manager

    Examples
    --------
    >>> import torch, prefopt
    >>> with prefopt.config_context(dtype="bfloat16"), autocast(torch.device("cpu")):
    ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.bfloat16
    """
    if uses_bf16(device):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def make_generator(random_state, device: torch.device | str = "cpu") -> torch.Generator:
    """Return a local ``torch.Generator`` seeded from ``random_state``.

    prefopt never seeds torch globally: every random draw of an estimator goes
    through its own generator, so the same ``random_state`` repeats exactly.

    Parameters
    ----------
    random_state : int, RandomState instance or None
        Passed through :func:`sklearn.utils.check_random_state`.
    device : torch.device or str, default="cpu"
        Device of the generator.

    Returns
    -------
    generator : torch.Generator

    Examples
    --------
    >>> import torch
    >>> from prefopt.backend import make_generator
    >>> a = torch.rand(2, generator=make_generator(0))
    >>> b = torch.rand(2, generator=make_generator(0))
    >>> bool((a == b).all())
    True
    """
    seed = int(check_random_state(random_state).randint(np.iinfo(np.int32).max))
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


@contextmanager
def local_seed(seed: int):
    """Seed torch inside a block and restore the global state afterwards.

    Used to build models from a config reproducibly without touching the
    caller's global random state.

    Parameters
    ----------
    seed : int
        Seed of torch's global generator inside the block.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def adamw(params, lr: float) -> torch.optim.Optimizer:
    """AdamW as the original code sets it up (eps=1e-5, no weight decay), fused when possible.

    The fused kernel is faster per step and needs no extra memory (measured in
    benchmarks/README.md, "What to change, measured"); the plain implementation where
    it is unsupported.

    Parameters
    ----------
    params : iterable of torch.nn.Parameter
        Parameters to optimise.
    lr : float
        Learning rate.

    Returns
    -------
    optimizer : torch.optim.AdamW
    """
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, eps=1e-5, weight_decay=0.0, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, eps=1e-5, weight_decay=0.0)


def gradient_step(optimizer, loss, *, who: str, step: int, max_grad_norm=None) -> None:
    """One optimiser step, refusing a non-finite loss with an error that names the step.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
    loss : torch.Tensor or None
        Scalar loss to minimise; ``None`` steps on the gradients already
        accumulated in the parameters (micro-batches, checked by the caller).
    who : str
        Named in the error (the estimator).
    step : int
        Named in the error.
    max_grad_norm : float, default=None
        Clip the gradients' global norm to this; ``None`` does not clip.

    Raises
    ------
    FloatingPointError
        When ``loss`` is NaN or infinite (no parameter is changed), or when the
        update left a weight NaN or infinite (a learning rate far too large).
    """
    from . import distributed

    if loss is not None and not distributed.all_finite(loss):  # on every rank together
        raise FloatingPointError(
            f"{who}: the loss became {loss.item()} at step {step}; lower "
            "learning_rate or check the data and the reward."
        )
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if loss is not None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    # One fused norm over the weights (about one read of them; small next to a step) catches
    # an update that overflowed, here at its step rather than later as a NaN sample.
    with torch.no_grad():
        norm = torch.nn.utils.get_total_norm(params)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP: a DTensor
        if not torch.isfinite(norm):
            raise FloatingPointError(
                f"{who}: the update at step {step} left NaN or infinite weights; lower "
                "learning_rate (or set max_grad_norm). The last checkpoint (if any) is intact."
            )


def maybe_compile(module):
    """Compile ``module`` in place when ``set_config(compile=...)`` asks for it.

    Uses ``nn.Module.compile(dynamic=True)``: the module keeps its type, its
    parameters and its ``state_dict``, so saving and copying are unchanged.

    Parameters
    ----------
    module : torch.nn.Module or None

    Returns
    -------
    module : torch.nn.Module or None
        The same object.

    Examples
    --------
    >>> from torch import nn
    >>> import prefopt
    >>> with prefopt.config_context(compile=False):
    ...     maybe_compile(nn.Linear(2, 2)) is not None
    True
    """
    setting = get_config()["compile"]
    if not setting or module is None or getattr(module, "_compiled_call_impl", None) is not None:
        return module  # off, nothing to compile, or compiled already (a second fit)
    module.compile(backend="inductor" if setting is True else setting, dynamic=True)
    return module
