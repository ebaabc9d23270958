"""Data-parallel fits on ``torch.distributed``: ranks, shares, global statistics, wrapping.

The same script runs on one device or under a launcher (``torchrun``, Ray Train's
``TorchTrainer``). When a process group of more than one rank is up (or the
launcher's environment asks for one), every estimator's ``fit``:

- splits each step's prompts (each minibatch's rows) across ranks with
  :func:`shard`, a prompt's k samples staying on one rank;
- draws its samples from a random stream derived from ``random_state`` *and* the
  rank (:func:`rank_seed`);
- takes the statistics that define the run over all ranks: :func:`masked_mean`
  (and so the whitening built on it), :func:`mean`, :func:`std`, :func:`gather`,
  :func:`global_count` where their call site says ``across_ranks=True`` (a loss, an
  advantage, a step's figure), and :func:`reduce_row`. Such a masked mean is the
  mean over every rank's tokens, and its gradient is scaled so that
  DistributedDataParallel's average of the ranks' gradients is the gradient of that
  global mean -- a token-mean loss is normalised by the global token count, not each
  rank's. No ambient state decides it: the same call means the same thing anywhere;
- averages gradients with DistributedDataParallel (:func:`prepare`), or shards the
  policy with FSDP's ``fully_shard`` under ``set_config(distributed="fsdp")``;
- writes checkpoints and shows progress on rank 0 alone (:func:`is_main`).

Outside a process group every helper is the plain single-process computation.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

# The engines, re-exported (distributed.prepare, distributed.is_sharded, ...).
from ._engines import (  # noqa: F401
    full_optimizer_state,
    full_state_dict,
    is_sharded,
    load_full_optimizer_state,
    prepare,
)
from ._process_group import init_from_env, is_main, local_rank, rank, sharded, world_size

__all__ = [
    "any_rank",
    "barrier",
    "gather",
    "gather_objects",
    "global_count",
    "init_from_env",
    "is_main",
    "local_rank",
    "masked_mean",
    "mean",
    "prepare",
    "rank",
    "rank_seed",
    "reduce_row",
    "shard",
    "sharded",
    "std",
    "world_size",
]


# history_ keys that add up over ranks (a count), not average.
SUMMED = frozenset({"data/tokens", "data/rows"})


# ----- who am I (the rest is _process_group's) ----------------------------------------------
def rank_seed(seed: int) -> int:
    """The seed of this rank's random stream: ``seed`` on rank 0, a derived one on the others.

    Parameters
    ----------
    seed : int

    Returns
    -------
    seed : int

    Examples
    --------
    >>> rank_seed(7)
    7
    """
    r = rank()
    if r == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), r]).generate_state(1)[0] & 0x7FFFFFFF)


# ----- splitting work --------------------------------------------------------------------
def check_batch(batch_size: int, k: int, who: str) -> None:
    """Refuse a global ``batch_size`` that does not split into world size x k samples."""
    init_from_env()  # under torchrun the group may not be up before the first model loads
    n = world_size()
    if n > 1 and batch_size % (n * k):
        raise ValueError(
            f"{who}: batch_size={batch_size} is the global batch and must split into "
            f"{n} ranks x k={k} samples per prompt (a multiple of {n * k}); set batch_size "
            f"to {max(n * k, batch_size - batch_size % (n * k))} or "
            f"{batch_size + n * k - batch_size % (n * k)}."
        )


def check_rows(n_rows: int, batch_size: int, who: str) -> None:
    """Refuse data whose last minibatch would leave a rank without a row."""
    init_from_env()
    n = world_size()
    if n > 1 and (batch_size < n or 0 < n_rows % batch_size < n):
        last = n_rows % batch_size or batch_size
        raise ValueError(
            f"{who}: a minibatch of {last} rows cannot give each of {n} ranks a row "
            f"(batch_size={batch_size}, {n_rows} rows); make batch_size at least {n} and "
            f"the rows' remainder modulo batch_size 0 or at least {n}."
        )


def shard(rows):
    """This rank's contiguous share of ``rows`` (all of them outside a process group).

    Parameters
    ----------
    rows : array-like or list
        The global batch's rows (prompts, or data rows); rank r takes the r-th of
        ``world_size`` nearly equal slices.

    Returns
    -------
    share : same type as ``rows``

    Examples
    --------
    >>> shard([3, 1, 2])
    [3, 1, 2]
    """
    n = world_size()
    if n == 1:
        return rows
    bounds = np.linspace(0, len(rows), n + 1).round().astype(int)
    r = rank()
    return rows[bounds[r] : bounds[r + 1]]


# ----- global statistics -------------------------------------------------------------------
def _reducing(across_ranks: bool) -> bool:
    """Whether a statistic asked ``across_ranks`` is reduced: only under a process group."""
    return bool(across_ranks) and world_size() > 1


def _all_reduce(t: torch.Tensor, op=None) -> torch.Tensor:
    t = t.detach().clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op)
    return t


def _global(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``sum over ranks of total / sum over ranks of count``, differentiable through ``total``.

    The value is the global mean on every rank; the gradient is ``world_size``
    times this rank's ``d total / global count``, so that DistributedDataParallel's
    average over ranks is the gradient of the global mean.
    """
    # Reduced in float64: a bf16 or float32 sum over many tokens keeps its precision.
    stats = _all_reduce(torch.stack([total.detach().double(), count.detach().double()]))
    g_count = stats[1].clamp(min=1.0)
    value = (stats[0] / g_count).to(total.dtype)
    if not total.requires_grad:
        return value
    local = total * world_size() / g_count.to(total.dtype)
    return local + (value - local.detach())  # the global value, this rank's gradient


def masked_mean(x: torch.Tensor, mask: torch.Tensor, *, across_ranks: bool = False) -> torch.Tensor:
    """Mean of ``x`` where ``mask`` is 1; over every rank's positions with ``across_ranks``.

    Parameters
    ----------
    x : torch.Tensor
        Values.
    mask : torch.Tensor
        1 where a value counts.
    across_ranks : bool, default=False
        In a distributed fit, the mean over every rank's positions, its gradient
        scaled so that DDP's average is the gradient of that global mean (a
        collective: every rank calls it). Nothing changes in one process.

    Returns
    -------
    mean : torch.Tensor
        A scalar; 0 when the mask is empty.

    Examples
    --------
    >>> import torch
    >>> masked_mean(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1, 1, 0]))
    tensor(2.)
    """
    mask = mask.to(x.dtype)
    total, count = (x * mask).sum(), mask.sum()
    if _reducing(across_ranks):
        return _global(total, count)
    return total / count.clamp(min=1.0)


def mean(x: torch.Tensor, *, across_ranks: bool = False) -> torch.Tensor:
    """Mean of ``x`` over its elements; over every rank's with ``across_ranks``.

    The row-mean loss of the reward model and of DPO: with this, ranks holding
    unequal shares of a minibatch still weight every row alike.

    Parameters
    ----------
    x : torch.Tensor
        Values (a loss may flow through them, as in :func:`masked_mean`).
    across_ranks : bool, default=False
        In a distributed fit, the mean over every rank's elements (a collective).

    Returns
    -------
    mean : torch.Tensor

    Examples
    --------
    >>> import torch
    >>> mean(torch.tensor([1.0, 2.0]))
    tensor(1.5000)
    """
    if _reducing(across_ranks):
        return _global(x.sum(), torch.tensor(float(x.numel()), device=x.device))
    return x.mean()


def std(x: torch.Tensor, *, across_ranks: bool = False) -> torch.Tensor:
    """The sample standard deviation of ``x`` (as ``x.std()``); over every rank's elements.

    GRPO's batch-scaled advantages divide by it (no gradient flows through it).

    Parameters
    ----------
    x : torch.Tensor
        Values.
    across_ranks : bool, default=False
        In a distributed fit, over every rank's elements (a collective).

    Returns
    -------
    std : torch.Tensor

    Examples
    --------
    >>> import torch
    >>> std(torch.tensor([1.0, 3.0]))
    tensor(1.4142)
    """
    if not _reducing(across_ranks):
        return x.std()
    x = x.detach()
    n = float(_all_reduce(torch.tensor(float(x.numel()), dtype=torch.float64)))
    centre = mean(x, across_ranks=True)
    squares = _all_reduce(((x - centre) ** 2).sum().double())
    return (squares / max(n - 1.0, 1.0)).sqrt().to(x.dtype)


def gather(x: torch.Tensor, *, across_ranks: bool = False) -> torch.Tensor:
    """Every rank's ``x`` concatenated in rank order (the global batch's order); ``x`` alone.

    With ``across_ranks`` in a distributed fit (a collective); ranks may hold
    different lengths.

    Parameters
    ----------
    x : torch.Tensor
        This rank's rows (no gradient flows through the result).
    across_ranks : bool, default=False
        Gather over the ranks; ``False`` returns ``x``.

    Returns
    -------
    gathered : torch.Tensor
    """
    if not _reducing(across_ranks):
        return x
    n = world_size()
    sizes = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(n)]
    dist.all_gather(sizes, torch.tensor([x.shape[0]], device=x.device))
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros((longest, *x.shape[1:]), dtype=x.dtype, device=x.device)
    padded[: x.shape[0]] = x.detach()
    parts = [torch.empty_like(padded) for _ in range(n)]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(s.item())] for p, s in zip(parts, sizes)])


def per_rank(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` (same shape on all) stacked in rank order: shape ``(world, *x.shape)``.

    Always a collective under a process group: checkpoints use it to keep
    every rank's random state.
    """
    if world_size() == 1:
        return x.unsqueeze(0)
    parts = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.stack(parts)


def global_count(n: int, *, across_ranks: bool = False) -> int:
    """``n``, summed over ranks with ``across_ranks`` in a distributed fit (a collective).

    Parameters
    ----------
    n : int
        This rank's count.
    across_ranks : bool, default=False

    Returns
    -------
    count : int

    Examples
    --------
    >>> global_count(3, across_ranks=True)  # one process: the count itself
    3
    """
    if not _reducing(across_ranks):
        return int(n)
    return int(_all_reduce(torch.tensor(float(n), dtype=torch.float64)).item())


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank: decisions that end a loop are taken together.

    A stop that one rank takes alone would leave the others waiting in a collective.

    Parameters
    ----------
    flag : bool
        This rank's decision.

    Returns
    -------
    any : bool
    """
    if world_size() == 1:
        return bool(flag)
    return bool(_all_reduce(torch.tensor(float(bool(flag)))).item() > 0)


def reduce_row(row: dict, elapsed: float | None = None, n_local: int | None = None) -> dict:
    """A ``history_`` row of global figures: numbers averaged over ranks, counts summed.

    Every rank holds an equal share of a step's samples, so the average of the
    ranks' means is the global mean. ``time/episodes_per_s`` becomes the global
    batch over the slowest rank's time.

    Parameters
    ----------
    row : dict
        This rank's row; ``step`` is left alone, keys in ``SUMMED`` are added up.
    elapsed : float, default=None
        This rank's time for the step.
    n_local : int, default=None
        This rank's episodes in the step.

    Returns
    -------
    row : dict
    """
    if world_size() == 1:
        return row
    keys = [k for k, v in row.items() if isinstance(v, (int, float, np.number)) and k != "step"]
    values = torch.tensor([float(row[k]) for k in keys], dtype=torch.float64)
    summed = _all_reduce(values)
    n = world_size()
    out = dict(row)
    for key, total in zip(keys, summed.tolist()):
        out[key] = total if key in SUMMED else total / n
    if elapsed is not None and n_local is not None:
        slowest = float(_all_reduce(torch.tensor(elapsed, dtype=torch.float64), dist.ReduceOp.MAX))
        out["time/episodes_per_s"] = n_local * n / slowest
    return out


def gather_objects(obj) -> list:
    """Every rank's ``obj`` (picklable) in rank order: ``[obj]`` outside a process group.

    A collective (``all_gather_object``): every rank calls it.

    Parameters
    ----------
    obj : object
        This rank's value.

    Returns
    -------
    objects : list

    Examples
    --------
    >>> gather_objects({"a": 1})
    [{'a': 1}]
    """
    if world_size() == 1:
        return [obj]
    objects = [None] * world_size()
    dist.all_gather_object(objects, obj)
    return objects


def barrier() -> None:
    """Wait for every rank (nothing outside a process group)."""
    if world_size() > 1:
        dist.barrier()


def all_finite(loss: torch.Tensor) -> bool:
    """Whether the loss is finite on every rank (a NaN on one rank stops them all)."""
    finite = bool(torch.isfinite(loss.detach()).all())
    return not any_rank(not finite) if world_size() > 1 else finite
