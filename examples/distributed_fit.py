"""One RLOO fit across processes: the same script alone, under torchrun, or on Ray Train workers.

Every rank samples its share of each step's prompts; DistributedDataParallel (or FSDP's
``fully_shard`` with ``--fsdp``) averages the gradients; rank 0 prints and writes. The
model is the tiny-LM world's, so this runs anywhere in seconds; put your own model and
prompts in ``train``.

Run::

    python examples/distributed_fit.py                                # one process
    torchrun --nproc_per_node 2 examples/distributed_fit.py           # 2 processes, one machine
    torchrun --nproc_per_node 2 examples/distributed_fit.py --checkpoint-dir ckpt  # resumable
    python examples/distributed_fit.py --ray 2                        # 2 Ray Train workers
    python examples/distributed_fit.py --ray 8 --gpu --address auto   # 8 GPUs of a Ray cluster
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np


def train(config: dict) -> None:
    """What every rank runs: under torchrun, under Ray Train, or alone."""
    import torch

    import prefopt
    from prefopt import RLOOPolicy
    from prefopt.backend import distributed
    from prefopt.worlds import TinyLMWorld

    torch.set_num_threads(1)
    prefopt.set_config(show_progress_bar=False, distributed="fsdp" if config["fsdp"] else "ddp")
    world = TinyLMWorld(n_prompts=6, random_state=0)
    policy = RLOOPolicy(
        model=world.policy_model(),
        k=2,
        batch_size=config["batch_size"],  # the global batch, split across the ranks
        n_steps=config["steps"],
        random_state=0,
        # A killed run started again with the same command resumes from here (same ranks).
        checkpoint_dir=config.get("checkpoint_dir"),
        checkpoint_every=1,
    )
    policy.fit(world.prompts, world.reward)
    if config["fsdp"]:
        # A sharded policy gathers its weights: every rank calls, rank 0 writes.
        policy.save_pretrained(Path(config["out"]) / "model")
    if not distributed.is_main():
        return
    if not config["fsdp"]:
        policy.save_pretrained(Path(config["out"]) / "model")
    rates = [row["time/episodes_per_s"] for row in policy.history_[1:]] or [np.nan]
    summary = {
        "ranks": distributed.world_size(),
        "steps": policy.n_iter_,
        "episodes": policy.n_episodes_,
        "reward": [row["objective/reward"] for row in policy.history_],
        "episodes_per_s": float(np.median(rates)),
    }
    Path(config["out"]).mkdir(parents=True, exist_ok=True)
    (Path(config["out"]) / "summary.json").write_text(json.dumps(summary, indent=1))
    print(
        f"{summary['ranks']} rank(s), {summary['steps']} steps, {summary['episodes']} episodes: "
        f"final reward {summary['reward'][-1]:.3f}, {summary['episodes_per_s']:.0f} episodes/s"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--fsdp", action="store_true", help="shard the policy (fully_shard)")
    parser.add_argument("--ray", type=int, default=0, help="run on this many Ray Train workers")
    parser.add_argument("--gpu", action="store_true", help="Ray workers take one GPU each")
    parser.add_argument("--address", default=None, help="Ray cluster address (auto: the one up)")
    parser.add_argument("--out", default="distributed-fit")
    parser.add_argument("--checkpoint-dir", default=None, help="checkpoint every step; resume")
    args = parser.parse_args(argv)
    config = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "fsdp": args.fsdp,
        "out": os.path.abspath(args.out),
        "checkpoint_dir": args.checkpoint_dir and os.path.abspath(args.checkpoint_dir),
    }
    if not args.ray:
        train(config)  # alone, or one of torchrun's processes (it starts the process group)
        return
    try:
        import ray
    except ModuleNotFoundError:  # the ray extra
        raise SystemExit('--ray runs on Ray Train: pip install "prefopt[ray]".') from None
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # Local: a Ray of just enough CPUs; --address auto joins a running cluster instead.
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.ray, include_dashboard=False, log_to_driver=True)
    trainer = TorchTrainer(
        train,
        train_loop_config=config,
        # Ray starts the process group (gloo on CPUs, NCCL on GPUs) and places the workers.
        torch_config=TorchConfig(backend="nccl" if args.gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=args.ray, use_gpu=args.gpu),
        run_config=RunConfig(storage_path=os.path.join(config["out"], "ray"), name="fit"),
    )
    trainer.fit()
    ray.shutdown()


if __name__ == "__main__":
    main()
