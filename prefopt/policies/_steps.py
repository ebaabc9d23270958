"""The step loop of every policy: rollout, advantages, update, beta, history, checkpoints.

``BasePolicy.fit`` sets the run up and calls :func:`train_steps`; the passes of one
step are in ``_rollout.py``.
"""

from __future__ import annotations

import logging
import time

from .._config import get_config
from .._progress import tqdm
from ..backend import distributed
from ._health import check_health

logger = logging.getLogger("prefopt")


def train_steps(policy, n_steps: int, callback=None) -> None:
    """``n_steps`` steps of the loop: rollout, advantages, update, beta, ``history_``, checkpoint.

    ``policy`` is the policy being fitted; ``BasePolicy._train_steps`` calls this.
    """
    run = policy._run
    total = policy.n_iter_ + max(n_steps, 0)
    k = policy._samples_per_prompt()
    show = get_config()["show_progress_bar"] and distributed.is_main()  # rank 0 alone
    bar = tqdm(range(max(n_steps, 0)), desc=type(policy).__name__, disable=not show, leave=False)
    for _ in bar:
        policy._set_learning_rate()
        start = time.perf_counter()
        # Distributed fits: every rank draws the same global rows and takes its share.
        rows = distributed.shard(run.next_rows(policy.batch_size // k, len(policy._prompts)))
        batch = policy._rollout(rows)
        advantages = policy.compute_advantages(batch)
        if isinstance(advantages, tuple):
            batch.advantages, batch.returns = advantages
        else:
            batch.advantages = advantages
        stats = policy._update(batch)
        policy.after_update(batch)
        if policy._online is not None:
            stats.update(policy._online.after_step(policy, batch))
        mean_kl = float(distributed.mean(batch.kl.sum(1)))  # over all ranks
        n_episodes = len(batch) * distributed.world_size()  # the global batch
        policy.beta_ = policy.kl_.update(mean_kl, n_episodes=n_episodes)
        policy.n_iter_ += 1
        policy.n_episodes_ += n_episodes
        elapsed = time.perf_counter() - start
        row = {
            "step": policy.n_iter_,
            "episodes": policy.n_episodes_,
            "objective/reward": float(batch.scores.mean()),
            "objective/kl": mean_kl,
            "objective/rlhf_reward": float(batch.rlhf_rewards.mean()),
            "objective/beta": batch.beta,
            **stats,
            "response/length": float(batch.response_mask.sum(1).float().mean()),
            "response/eos_share": float(batch.ended.float().mean()),
            "charts/learning_rate": run.optimizer.param_groups[0]["lr"],
            "time/episodes_per_s": len(batch) / elapsed,
        }
        row = distributed.reduce_row(row, elapsed, len(batch))  # global figures
        policy.history_.append(row)
        check_health(policy, row)
        bar.set_postfix(reward=f"{row['objective/reward']:.3f}", kl=f"{mean_kl:.3f}")
        if (
            policy.verbose
            and distributed.is_main()
            and (policy.n_iter_ % 10 == 0 or policy.n_iter_ == total)
        ):
            logger.info(
                "%s step %d: reward %.4f kl %.4f beta %.4g",
                type(policy).__name__,
                policy.n_iter_,
                row["objective/reward"],
                mean_kl,
                batch.beta,
            )
        if getattr(policy, "_checkpoint", None) is not None and (
            policy.n_iter_ % policy.checkpoint_every == 0 or policy.n_iter_ == total
        ):
            state = run.state_dict()
            if distributed.is_sharded(policy.model_):  # FSDP: gather the moments (collective)
                state["optimizer"] = distributed.full_optimizer_state(
                    policy._trained_modules(), run.optimizer
                )
            if policy._online is not None:
                state["online"] = policy._online.state_dict()
            policy._checkpoint.save(policy, state)
        stop = callback is not None and callback(policy, row) is True
        if distributed.any_rank(stop):  # every rank stops at the same step
            break
    bar.close()
