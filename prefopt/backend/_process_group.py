"""Who this process is in a data-parallel fit: the process group, ranks, the engine asked for.

The bottom of :mod:`prefopt.backend.distributed` (re-exported there): the engines
(:mod:`._engines`) and the reductions both build on it, and it imports neither.
"""

from __future__ import annotations

import atexit
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from .._config import get_config


def init_from_env() -> bool:
    """Start the default process group when a launcher's environment asks for one.

    ``torchrun`` (and Ray Train) set ``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR`` and
    ``MASTER_PORT``; with ``WORLD_SIZE`` above 1 and no group yet, this starts one
    (NCCL when the configured device is CUDA, else gloo). Ray Train starts its own.

    Outside torchrun's agent (variables left in a shell, say), the ranks must meet
    within ``PREFOPT_DIST_JOIN_TIMEOUT`` seconds (default 120): otherwise a
    ``RuntimeError`` names ``WORLD_SIZE`` and the fix, where torch alone would wait
    30 minutes without a word. Under torchrun the agent has gathered the ranks already.

    A group started here is also ended here: at the interpreter's exit,
    :func:`end_started_group` destroys it (gloo only), so a script that never calls
    ``torch.distributed.destroy_process_group`` does not abort in gloo's teardown.

    Returns
    -------
    started : bool
        Whether a process group of more than one rank is up.
    """
    if not dist.is_available():
        return False
    if dist.is_initialized():
        return dist.get_world_size() > 1
    if get_config()["distributed"] == "none" or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if "MASTER_ADDR" not in os.environ or "RANK" not in os.environ:
        return False
    cuda = torch.cuda.is_available() and get_config()["device"] in ("auto", "cuda")
    if cuda:
        torch.cuda.set_device(local_rank())
    backend = "nccl" if cuda else "gloo"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's agent
        dist.init_process_group(backend=backend)
    else:
        dist.init_process_group(backend=backend, store=_meet_peers(), **_rank_and_size())
    atexit.register(end_started_group)
    return dist.get_world_size() > 1


def end_started_group() -> bool:
    """Destroy the gloo process group :func:`init_from_env` started, at the process's exit.

    Registered with :mod:`atexit` when :func:`init_from_env` starts a group. Left to the
    interpreter's own teardown, a gloo group can abort the process ("terminate called
    without an active exception", exit status -6) after all its work is done: its C++
    threads still hold tensors while Python is being finalised. This runs while the
    interpreter is whole, after a clean end and after an uncaught exception alike (the
    test of this saw the abort on a rank that raised: a failing rank then exits with its
    own error, not SIGABRT); destroying a gloo group waits on no other rank. It does
    nothing for NCCL, whose destruction is collective and is the launcher's to order, and
    when the group is already gone.

    Returns
    -------
    destroyed : bool
        Whether a group was destroyed.

    Examples
    --------
    >>> end_started_group()  # no group here
    False
    """
    if not (dist.is_available() and dist.is_initialized()):
        return False
    if dist.get_backend() != "gloo":
        return False
    dist.destroy_process_group()
    return True


def _rank_and_size() -> dict:
    return {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}


def _meet_peers():
    """The rendezvous store of torch's ``env://`` init, with a bounded wait for the peers."""
    seconds = float(os.environ.get("PREFOPT_DIST_JOIN_TIMEOUT", "120"))
    where = f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '29500')}"
    size = _rank_and_size()
    try:
        return dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ.get("MASTER_PORT", "29500")),
            size["world_size"],
            is_master=size["rank"] == 0,
            timeout=timedelta(seconds=seconds),
        )
    except (RuntimeError, OSError, dist.DistError) as err:
        raise RuntimeError(
            f"WORLD_SIZE={size['world_size']} and RANK={size['rank']} ask for a process group "
            f"at {where}, but its ranks did not meet within {seconds:g} s ({err}). Were these "
            "variables left over from an earlier torchrun? Unset WORLD_SIZE and RANK for a "
            "single-process fit, start every rank with torchrun, or call "
            "prefopt.set_config(distributed='none'). PREFOPT_DIST_JOIN_TIMEOUT sets the wait."
        ) from err


def world_size() -> int:
    """Ranks taking part in a fit: 1 outside a process group or under ``distributed="none"``.

    Examples
    --------
    >>> world_size()
    1
    """
    if get_config()["distributed"] == "none":
        return 1
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size()


def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return dist.get_rank() if world_size() > 1 else 0


def is_main() -> bool:
    """Whether this process writes checkpoints and shows progress (rank 0, or alone)."""
    return rank() == 0


def local_rank() -> int:
    """This process's rank on its machine: ``LOCAL_RANK``, as torchrun and Ray Train set it."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    n = torch.cuda.device_count() if torch.cuda.is_available() else 1
    return (dist.get_rank() if dist.is_available() and dist.is_initialized() else 0) % max(n, 1)


def sharded() -> bool:
    """Whether the policy is sharded with FSDP's ``fully_shard`` (``distributed="fsdp"``)."""
    return world_size() > 1 and get_config()["distributed"] == "fsdp"
