"""vLLM engines in a fit of several ranks: what is refused, and the launcher's group kept.

Each rank builds its own engine (vLLM's ``external_launcher``, see
:mod:`prefopt.backend.vllm_engine`); these two pieces only matter then.
"""

from __future__ import annotations

import contextlib

from .._config import get_config


@contextlib.contextmanager
def default_group_kept():
    """Inside the block, ``torch.distributed.destroy_process_group`` spares the default group.

    vLLM's engine shutdown ends with ``destroy_distributed_environment``, which calls
    ``destroy_process_group()``: with no argument torch destroys the default group and
    every other one. Its own groups, destroyed one by one, still go; after the default
    group is gone (the script destroyed it), they went with it and nothing is left to do.
    """
    import torch.distributed as dist

    destroy = dist.destroy_process_group

    def destroy_all_but_the_default(group=None):
        if group is not None and dist.is_initialized():
            destroy(group)

    dist.destroy_process_group = destroy_all_but_the_default
    try:
        yield
    finally:
        dist.destroy_process_group = destroy


def check_ranks(options=None) -> None:
    """Refuse what prefopt's engine cannot sample with, before vLLM starts (never silently).

    Each rank's engine holds the whole policy and samples that rank's prompts. A
    policy sharded by FSDP has no rank with its whole weights to push, and an
    engine split over ranks (tensor, pipeline or data parallel) would have them
    sample the same prompts in lockstep.
    """
    from . import distributed

    options = options or {}  # None: the fit's ranks alone (an engine checked its own)
    split = {
        name: options[name]
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
        if options.get(name, 1) != 1
    }
    if split:  # in one process too: vLLM would fail on an assertion of its own
        raise ValueError(
            f"VLLMEngine options {split} would split the vLLM engine over several processes; "
            "prefopt pushes the policy's weights into one engine holding the whole model "
            "(in a fit of several ranks, one such engine per rank: a split one would have them "
            "sample the same prompts together), so it is not supported. Remove them from "
            "the options."
        )
    if distributed.world_size() <= 1:
        return
    where = f"this process is rank {distributed.rank()} of {distributed.world_size()}"
    if get_config()["distributed"] == "fsdp":  # FSDP shards the policy: distributed.sharded()
        raise ValueError(
            f"generation='vllm' does not support distributed='fsdp' ({where}): each rank's "
            "engine holds the whole model, and a policy sharded by FSDP would need its full "
            "weights gathered on every rank for each push, which is not built. Use "
            "distributed='ddp' (the default) or generation='native'."
        )
