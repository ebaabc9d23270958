"""Who this process is in a data-parallel fit: the process group, ranks, the engine asked for.

The bottom of :mod:`prefopt.backend.distributed` (re-exported there): the engines
(:mod:`._engines`) and the reductions both build on it, and it imports neither.
"""

from __future__ import annotations

import atexit
import os
import time
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
    env = launcher_env()  # every variable checked before anything waits on the others
    if env is None:
        return False
    cuda = torch.cuda.is_available() and get_config()["device"] in ("auto", "cuda")
    if cuda:
        torch.cuda.set_device(local_rank())
    backend = "nccl" if cuda else "gloo"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's agent
        dist.init_process_group(backend=backend)
    else:
        store = _meet_peers(env)
        dist.init_process_group(
            backend=backend, store=store, rank=env["rank"], world_size=env["world_size"]
        )
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


def _integer(name: str, default, low: int, high: int | None = None):
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        bound = f"an integer >= {low}" + ("" if high is None else f" and <= {high}")
        raise ValueError(
            f"The environment variable {name}={text!r} must be {bound}. torchrun sets it for "
            "each rank it starts; a value left in the shell from an earlier launch is likely: "
            "unset it for a single-process fit, or start every rank with torchrun."
        )
    return value


def launcher_env() -> dict | None:
    """The launcher's variables, checked in one place before anything waits on them.

    ``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK`` and
    ``PREFOPT_DIST_JOIN_TIMEOUT`` (seconds the ranks have to meet, default 120).
    Returns ``None`` when no process group is asked for (``WORLD_SIZE`` unset or 1,
    or ``set_config(distributed="none")``); refuses at once a ``WORLD_SIZE`` above 1
    without ``RANK`` or ``MASTER_ADDR`` (it would otherwise fit alone, as one of
    ranks that never come), a ``RANK`` not below ``WORLD_SIZE``, and any value that
    is not a number in its range.

    Returns
    -------
    env : dict or None
        ``world_size``, ``rank``, ``master_addr``, ``master_port``, ``timeout``.

    Examples
    --------
    >>> launcher_env() is None  # no launcher here
    True
    """
    if get_config()["distributed"] == "none":
        return None
    world = _integer("WORLD_SIZE", 1, low=1)
    if world <= 1:
        return None
    missing = [name for name in ("RANK", "MASTER_ADDR") if not os.environ.get(name)]
    if missing:
        raise RuntimeError(
            f"WORLD_SIZE={world} asks for a process group of {world} ranks, but "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, so this "
            "process cannot join one. Start every rank with torchrun (which sets them all), "
            "or unset WORLD_SIZE (or call prefopt.set_config(distributed='none')) to fit in "
            "this process alone."
        )
    rank = _integer("RANK", None, low=0)
    if rank >= world:
        raise ValueError(
            f"RANK={rank} is not below WORLD_SIZE={world}: ranks count 0 to {world - 1}. Are "
            "these variables left over from another launch? Unset them, or start every rank "
            "with torchrun."
        )
    _integer("LOCAL_RANK", None, low=0)
    text = os.environ.get("PREFOPT_DIST_JOIN_TIMEOUT", "120")
    try:
        timeout = float(text)
    except ValueError:
        timeout = float("nan")
    if not 0 < timeout < float("inf"):
        raise ValueError(
            f"PREFOPT_DIST_JOIN_TIMEOUT={text!r} must be a number of seconds above 0 (the "
            "longest wait for the other ranks; default 120)."
        )
    return {
        "world_size": world,
        "rank": rank,
        "master_addr": os.environ["MASTER_ADDR"],
        "master_port": _integer("MASTER_PORT", 29500, low=1, high=65535),
        "timeout": timeout,
    }


def _meet_peers(env: dict):
    """A rendezvous store on which every rank has arrived, or an error within the timeout.

    The whole wait (connecting, then every rank arriving) is bounded by one deadline,
    so the error comes after the seconds it states.
    """
    seconds, world, rank = env["timeout"], env["world_size"], env["rank"]
    where = f"{env['master_addr']}:{env['master_port']}"
    deadline = time.monotonic() + seconds

    def refuse(err):
        return RuntimeError(
            f"WORLD_SIZE={world} and RANK={rank} ask for a process group at {where}, but its "
            f"ranks did not meet within {seconds:g} s ({err}). Were these variables left over "
            "from an earlier torchrun? Unset WORLD_SIZE and RANK for a single-process fit, "
            "start every rank with torchrun, or call prefopt.set_config(distributed='none'). "
            "PREFOPT_DIST_JOIN_TIMEOUT sets the wait."
        )

    try:
        store = dist.TCPStore(
            env["master_addr"],
            env["master_port"],
            world,
            is_master=rank == 0,
            timeout=timedelta(seconds=seconds),
            wait_for_workers=False,  # the arrivals below wait, under the same deadline
        )
        store.add("prefopt/arrived", 1)
        while store.add("prefopt/arrived", 0) < world:
            if time.monotonic() > deadline:
                arrived = store.add("prefopt/arrived", 0)
                raise TimeoutError(f"{arrived} of {world} ranks arrived")
            time.sleep(0.05)
    except (RuntimeError, OSError, dist.DistError) as err:
        raise refuse(err) from err
    return store


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
