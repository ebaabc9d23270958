"""One fit of a policy: the loop object that owns the run's state and takes its steps.

    rollout (sample, score, KL) -> advantages (the algorithm) -> update -> beta

:class:`PolicyLoop` holds everything a run needs besides the estimator's
parameters and fitted attributes: the prompts and their tokens, the random
streams and the optimiser (a :class:`~prefopt.lm.RunState`), the checkpoint
folder, the online refits and the one-time warnings. The passes of a rollout are
in ``_rollout.py``, the gradient passes of an update in ``_update.py``.
"""

from __future__ import annotations

import math
import time

import torch

from ..._config import get_config
from ...backend import adamw, distributed, vllm_engine
from ...backend.progress import tqdm
from ...lm import RunState
from ...tracking import open_run
from ._batch import RolloutBatch
from ._health import check_health, health_statistics, policy_monitor
from ._rollout import sample_and_score
from ._update import update

# Completions shown per text sample: enough to read what the policy does, not the batch.
_SAMPLES = 8


def trainable_parameters(policy) -> list:
    """Parameters of the trained modules, each once (two modules may share a trunk)."""
    seen, params = set(), []
    for module in policy._trained_modules().values():
        for p in [] if module is None else module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def make_optimizer(policy) -> torch.optim.Optimizer:
    """The optimiser of a policy's trained parameters, at its ``learning_rate_``."""
    params = trainable_parameters(policy)
    if policy.optimizer == "adam":
        return adamw(params, policy.learning_rate_)  # eps=1e-5, as the original code
    return torch.optim.SGD(params, lr=policy.learning_rate_)


def checked_beta(controller, beta, when: str) -> float:
    """The coefficient a KL controller returned, refused unless finite and >= 0."""
    try:
        value = float(beta)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"The KL controller {controller!r} returned beta={beta!r} {when}; a KL "
            "coefficient must be a finite number >= 0. Fix the controller's start/update, "
            "or use FixedKLController or AdaptiveKLController."
        )
    return value


def engine_gap(batch: RolloutBatch) -> dict:
    """The step's gap between the sampling engine's log-probs and the policy's; {} natively.

    ``engine/logprob_gap_mean`` and ``engine/logprob_gap_max`` (absolute, per
    response token) and ``engine/kl`` (KL(engine || policy), estimated on the
    engine's samples), against the policy's rollout-time log-probs
    (``batch.old_logprobs``, computed anyway): no extra pass.
    """
    if batch.engine_logprobs is None:
        return {}
    return vllm_engine.logprob_gap(batch.old_logprobs, batch.engine_logprobs, batch.response_mask)


class PolicyLoop:
    """The state and the steps of one fit of a policy.

    ``BasePolicy.fit`` makes one per call and keeps the last (``warm_start``
    continues its random streams and optimiser); pickling a policy drops it.

    Parameters
    ----------
    policy : BasePolicy
        The estimator being fitted; the loop writes its fitted attributes.
    run : RunState
        The random streams, the optimiser and the prompt stream.
    prompts : list of str
        The prompts of the fit.
    columns : dict of str to list, default=None
        The prompt table's other columns, one value per prompt, for the reward.
    reward : callable
        The reward given to ``fit`` (before any online refit).
    ptx_texts : list of str, default=None
        Pretraining texts (``ptx_coef``), tokenised once here.
    checkpoint : Resume, default=None
        The checkpoint folder of the fit, or ``None``.
    online : OnlineRewards, default=None
        The online refits, or ``None`` for an offline fit.
    start_key : str, default=None
        The starting model's fingerprint, which the checkpoint records.
    """

    def __init__(
        self,
        policy,
        *,
        run: RunState,
        prompts,
        reward,
        columns=None,
        ptx_texts=None,
        checkpoint=None,
        online=None,
        start_key=None,
    ):
        self.policy = policy
        self.run = run
        self.prompts = prompts
        self.columns = columns or {}
        self.rollout_stats: dict = {}  # the last rollout's figures for history_ (per reward)
        self.prompt_tokens = policy._tokenize_prompts(prompts)
        self.ptx_tokens = None if ptx_texts is None else policy._pretraining_tokens(ptx_texts)
        tokenizer = getattr(reward, "tokenizer_", None)  # rewards of any type
        # Same vocabulary: the reward scores the ids directly, no decoding and re-encoding.
        self.scores_tokens = (
            callable(getattr(reward, "score_tokens", None))
            and tokenizer is not None
            and tokenizer.get_vocab() == policy.tokenizer_.get_vocab()
        )
        self.checkpoint = checkpoint
        self.online = online
        self.start_key = start_key

    # ----- one step ---------------------------------------------------------------------
    def rollout(self, prompt_rows) -> RolloutBatch:
        """One step's rollouts of the prompts ``prompt_rows``, ``samples_per_prompt`` each.

        Sampling, the reference, the value model and the reward run once per batch
        under ``inference_mode``; the batch is then cloned into ordinary tensors for
        the update (FSDP reuses its gathered-weight buffers in training, which
        inference tensors forbid, so a sharded model runs under ``no_grad``).
        """
        sharded = distributed.is_sharded(self.policy.model_)
        with torch.no_grad() if sharded else torch.inference_mode():
            batch = sample_and_score(self, prompt_rows)
        return batch.clone()

    def update(self, batch: RolloutBatch) -> dict:
        """The gradient passes of one step on ``batch`` (with advantages); their statistics."""
        with distributed.training_view(self.policy):  # distributed: through the DDP wrappers
            return update(self, batch)

    def set_learning_rate(self) -> None:
        """The schedule's learning rate for the next step."""
        policy = self.policy
        if policy.lr_schedule == "linear":  # annealed linearly to 0, as the original code
            frac = 1.0 - (policy.n_iter_ - self.run.start_step) / policy.n_steps
        else:
            frac = 1.0
        for group in self.run.optimizer.param_groups:
            group["lr"] = frac * policy.learning_rate_

    def step(self, tracked=None) -> dict:
        """One step: rollout, advantages, update, beta; returns the ``history_`` row.

        ``tracked`` (the fit's :class:`~prefopt.tracking.TrackedRun`) gets a text
        sample of the completions every so often.
        """
        policy, run = self.policy, self.run
        self.set_learning_rate()
        start = time.perf_counter()
        k = policy._samples_per_prompt()
        # Distributed fits: every rank draws the same global rows and takes its share.
        rows = distributed.shard(run.next_rows(policy.batch_size // k, len(self.prompts)))
        batch = self.rollout(rows)
        advantages = policy.compute_advantages(batch)
        if isinstance(advantages, tuple):
            batch.advantages, batch.returns = advantages
        else:
            batch.advantages = advantages
        stats = self.update(batch)
        policy.after_update(batch)
        if self.online is not None:
            stats.update(self.online.after_step(self, batch))
        mean_kl = float(distributed.mean(batch.kl.sum(1)))  # over all ranks
        n_episodes = len(batch) * distributed.world_size()  # the global batch
        policy.beta_ = checked_beta(
            policy.kl_,
            policy.kl_.update(mean_kl, n_episodes=n_episodes),
            f"after step {policy.n_iter_ + 1}",
        )
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
            **self.rollout_stats,
            **engine_gap(batch),
            "response/length": float(batch.response_mask.sum(1).float().mean()),
            "response/eos_share": float(batch.ended.float().mean()),
            "charts/learning_rate": run.optimizer.param_groups[0]["lr"],
            "time/episodes_per_s": len(batch) / elapsed,
            **health_statistics(policy, batch),  # what the run-health detectors read
        }
        row = distributed.reduce_row(row, elapsed, len(batch))  # global figures
        row.update(self.budget(batch, n_episodes, elapsed))
        if tracked is not None:
            self.log_samples(tracked, batch)
        return row

    def budget(self, batch: RolloutBatch, n_episodes: int, elapsed: float) -> dict:
        """The run's cumulative budget after this step, as ``history_`` columns; sets ``budget_``.

        Comparisons of algorithms are fair only at a matched budget (Engstrom et
        al. 2020 trace PPO's gains to such unmatched details): ``budget/episodes``
        sampled, ``budget/tokens`` (response tokens generated),
        ``budget/gradient_steps`` (optimiser steps) and ``time/elapsed`` (wall-clock
        seconds of the steps; a ``time/`` column, as it is not reproducible). They
        continue from the last ``history_`` row, so a warm start or a resumed run
        keeps counting.
        """
        policy = self.policy
        before = policy.history_[-1] if policy.history_ else {}
        tokens = float(distributed.mean(batch.response_mask.sum().float()))
        size = max(1, len(batch) // policy.n_minibatches)  # as the update's minibatches
        this_step = {
            "budget/episodes": n_episodes,
            "budget/tokens": int(round(tokens * distributed.world_size())),
            "budget/gradient_steps": policy.n_epochs * math.ceil(len(batch) / size),
            "time/elapsed": elapsed,
        }
        totals = {key: before.get(key, 0) + value for key, value in this_step.items()}
        policy.budget_ = {
            "episodes": totals["budget/episodes"],
            "tokens": totals["budget/tokens"],
            "gradient_steps": totals["budget/gradient_steps"],
            "seconds": totals["time/elapsed"],
        }
        return totals

    def train(self, n_steps: int, callback=None) -> None:
        """``n_steps`` steps, each logged to ``history_``, checked and checkpointed.

        The trackers of ``set_config(report_to=...)`` and the loggers among
        ``callback`` open (and log the parameters) before the first step and close
        with the fit; each row goes to them, to ``verbose`` and to the callbacks.
        """
        policy = self.policy
        total = policy.n_iter_ + max(n_steps, 0)
        show = get_config()["show_progress_bar"] and distributed.is_main()  # rank 0 alone
        name = type(policy).__name__
        # The detectors read the run's whole history_: a warm start continues the run, and
        # its rows then equal those of one uninterrupted fit.
        health = policy_monitor(policy, first_row=0)
        with open_run(policy, callback, name=name, total=total) as tracked:
            bar = tqdm(range(max(n_steps, 0)), desc=name, disable=not show, leave=False)
            for _ in bar:
                row = self.step(tracked)
                policy.history_.append(row)
                check_health(self, row)
                unhealthy = health.observe()  # the health/ columns; True: on_unhealthy="stop"
                bar.set_postfix(
                    reward=f"{row['objective/reward']:.3f}", kl=f"{row['objective/kl']:.3f}"
                )
                last = policy.n_iter_ == total
                if self.checkpoint is not None and (
                    policy.n_iter_ % policy.checkpoint_every == 0 or last
                ):
                    self.save_checkpoint()
                stop = tracked(policy, row) or unhealthy
                if distributed.any_rank(stop):  # every rank stops at the same step
                    break
            bar.close()
            health.finish()

    def log_samples(self, tracked, batch: RolloutBatch) -> None:
        """A few of the step's prompts and completions as text, when a tracker wants them."""
        step = self.policy.n_iter_
        if not tracked.samples_due(step):
            return
        n = min(len(batch), _SAMPLES)
        prompts = [self.prompts[int(i)] for i in batch.prompt_index[:n]]
        completions = self.policy._decode(batch.response_ids[:n], batch.response_mask[:n])
        tracked.log_samples(prompts, completions, step, batch.scores[:n].tolist())

    def save_checkpoint(self) -> None:
        """Write the policy's fitted state and this run's state to the checkpoint folder."""
        state = self.run.state_dict()
        if distributed.is_sharded(self.policy.model_):  # FSDP: gather the moments (collective)
            state["optimizer"] = distributed.full_optimizer_state(
                self.policy._trained_modules(), self.run.optimizer
            )
        if self.online is not None:
            state["online"] = self.online.state_dict()
        self.checkpoint.save(self.policy, state)

    # ----- distributed fits ---------------------------------------------------------------
    def prepare_distributed(self) -> None:
        """Under a process group: DDP beside the trained modules, or FSDP's fully_shard."""
        if distributed.world_size() == 1:
            return
        policy = self.policy
        before = [id(p) for p in trainable_parameters(policy)]
        for module in policy._trained_modules().values():
            distributed.prepare(module, policy.device_)
        if distributed.sharded() and get_config()["fsdp_frozen"] == "shard":
            distributed.prepare(policy.ref_model_, policy.device_)
        if [id(p) for p in trainable_parameters(policy)] != before:  # fully_shard's new ones
            old, self.run.optimizer = self.run.optimizer, make_optimizer(policy)
            if old.state:  # a resumed run's moments, loaded whole into every rank: shard them
                distributed.load_full_optimizer_state(
                    policy._trained_modules(), self.run.optimizer, old.state_dict()
                )
