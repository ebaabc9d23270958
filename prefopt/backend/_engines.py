"""The data-parallel engines: DistributedDataParallel beside a module, or FSDP's fully_shard.

Part of :mod:`prefopt.backend.distributed` (re-exported there). This module keeps no
state: :func:`prepare` returns the module a training pass goes through (the DDP wrapper),
which the fit that asked for it holds, and a module sharded in place says so by its class
(``fully_shard`` makes it an ``FSDPModule``). Who this process is comes from
:mod:`._process_group`, and the shares and reductions are ``distributed``'s.
"""

from __future__ import annotations

import torch

from ._process_group import is_main, sharded, world_size


def prepare(
    module: torch.nn.Module | None, device: torch.device, *, shard: bool = True
) -> torch.nn.Module | None:
    """Put ``module`` under the data-parallel engine the configuration selects.

    ``distributed="ddp"`` (default): a ``DistributedDataParallel`` wrapper is made
    beside the module (the module itself, its ``state_dict`` and its
    ``save_pretrained`` stay as they are) and returned: the caller's training
    passes go through it, so that their backward averages the gradients; its
    constructor broadcasts rank 0's weights. ``"fsdp"``: ``fully_shard`` shards
    the module in place (every transformer block, then the whole model), once.
    Outside a process group nothing changes.

    Parameters
    ----------
    module : torch.nn.Module or None
    device : torch.device
    shard : bool, default=True
        ``False`` keeps DDP under ``distributed="fsdp"`` (the supervised
        estimators, whose fitted models other estimators copy).

    Returns
    -------
    trained : torch.nn.Module or None
        What a training pass of ``module`` goes through: its DDP wrapper, or the
        module itself (sharded in place, or outside a process group).

    Examples
    --------
    >>> import torch
    >>> layer = torch.nn.Linear(2, 1)
    >>> prepare(layer, torch.device("cpu")) is layer  # no process group: itself
    True
    """
    if module is None or world_size() == 1:
        return module
    if sharded() and shard:
        if not is_sharded(module):
            _fully_shard(module)
        return module
    from torch.nn.parallel import DistributedDataParallel

    cuda = device is not None and device.type == "cuda"
    ids = [device.index if device.index is not None else 0] if cuda else None
    return DistributedDataParallel(module, device_ids=ids)


def _fully_shard(module: torch.nn.Module) -> None:
    from torch.distributed.fsdp import fully_shard

    # Each transformer block its own unit, then the rest (embeddings, head): a block's
    # full weights exist only while it runs (Zhao et al. 2023, PyTorch FSDP).
    blocks = getattr(getattr(module, "transformer", None), "h", None)
    if blocks is None:
        blocks = getattr(getattr(module, "model", None), "layers", None)
    for block in blocks or ():
        fully_shard(block)
    fully_shard(module)


def is_sharded(module) -> bool:
    """Whether ``module`` was sharded in place by :func:`prepare` (``fully_shard``).

    ``fully_shard`` gives the module a subclass of ``FSDPModule``: its class says it.
    """
    if module is None or not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def full_state_dict(module: torch.nn.Module) -> dict | None:
    """The full (gathered) weights of a sharded module on rank 0, ``None`` on the others.

    A collective: every rank calls it.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(module, options=options)
    return state if is_main() else None


# ----- checkpoints of sharded modules: torch.distributed.checkpoint's full state dicts -----
def _container(modules: dict) -> torch.nn.Module:
    """The trained modules under one root, so optimiser state is keyed by ``name.param``."""
    return torch.nn.ModuleDict({k: m for k, m in modules.items() if m is not None})


def _param_names(root: torch.nn.Module, optimizer) -> list:
    """The name of each optimiser parameter, in ``optimizer.state_dict()``'s index order."""
    names = {id(p): n for n, p in root.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def full_optimizer_state(modules: dict, optimizer) -> dict | None:
    """The optimiser's full (gathered) state on rank 0, in ``optimizer.state_dict()``'s layout.

    A collective: every rank calls it. Gathered by ``get_optimizer_state_dict``
    (``full_state_dict=True``), then keyed by parameter index again, so a
    checkpoint of a sharded run has the format of an unsharded one.

    Parameters
    ----------
    modules : dict of str to torch.nn.Module
        The modules whose parameters the optimiser trains, by name.
    optimizer : torch.optim.Optimizer

    Returns
    -------
    state : dict or None
        ``None`` on every rank but 0.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    root = _container(modules)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_optimizer_state_dict(root, optimizer, options=options)
    if not is_main():
        return None
    index = {name: i for i, name in enumerate(_param_names(root, optimizer))}
    return {
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**g, "params": [index[name] for name in g["params"]]} for g in state["param_groups"]
        ],
    }


def load_full_optimizer_state(modules: dict, optimizer, state: dict) -> None:
    """Load a full optimiser state (every rank holds it) into an optimiser of sharded modules.

    A collective: every rank calls it. ``state`` is in ``optimizer.state_dict()``'s
    layout (parameter indices), as :func:`full_optimizer_state` returns and as an
    unsharded optimiser holds it; ``set_optimizer_state_dict`` keeps each rank's shard.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    root = _container(modules)
    names = _param_names(root, optimizer)
    keyed = {
        "state": {names[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [
            {**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]
        ],
    }
    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(root, optimizer, keyed, options=options)
