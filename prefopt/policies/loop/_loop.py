"""One fit of a policy: the loop object that owns the run's state and takes its steps.

    rollout (sample, score, KL) -> advantages (the algorithm) -> update -> beta

:class:`PolicyLoop` holds everything a run needs besides the estimator's
parameters and fitted attributes: what the step needs of the policy (a
:class:`~prefopt.policies.loop._view.StepView`, gathered once), the prompts and
their tokens, the random streams and the optimiser (a :class:`~prefopt.lm.RunState`),
its :class:`~prefopt.policies.loop._rollout.Rollout` (``rollouts``, given the
sampling engine) and :class:`~prefopt.policies.loop._update.Update` (``updates``),
the checkpoint folder, the online refits and the one-time warnings. A step returns
a :class:`StepResult`; the estimator's ``fit`` writes it into its fitted attributes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..._config import get_config
from ...backend import adamw, distributed, vllm_engine
from ...backend.progress import progress_shown, tqdm
from ...backend.samplers import sampler_for
from ...lm import RunState
from ...tracking import open_run
from ._batch import RolloutBatch
from ._episodes import episode_sampler
from ._health import check_health, health_statistics, policy_monitor
from ._overlap import overlap_statistics, overlapped
from ._rollout import Rollout
from ._update import Update, policy_change

# Completions shown per text sample: enough to read what the policy does, not the batch.
_SAMPLES = 8


def trainable_parameters(modules: dict) -> list:
    """Parameters of the trained modules, each once (two modules may share a trunk)."""
    seen, params = set(), []
    for module in modules.values():
        for p in [] if module is None else module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def make_optimizer(modules: dict, optimizer: str, learning_rate: float) -> torch.optim.Optimizer:
    """The optimiser (``"adam"`` or ``"sgd"``) of the trained modules' parameters."""
    params = trainable_parameters(modules)
    if optimizer == "adam":
        return adamw(params, learning_rate)  # eps=1e-5, as the original code
    return torch.optim.SGD(params, lr=learning_rate)


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


@dataclass
class StepResult:
    """One step's outcome, which ``fit`` writes into the estimator's fitted attributes.

    Parameters
    ----------
    row : dict
        The ``history_`` row.
    beta : float
        The KL coefficient for the next step (``beta_``).
    n_episodes : int
        Episodes sampled in the step, over all ranks.
    budget : dict
        The run's cumulative budget after the step (``budget_``).
    reward : callable
        The reward after the step (an online refit replaces it: ``reward_model_``).
    batch : RolloutBatch
        The step's rollouts, with advantages.
    """

    row: dict
    beta: float
    n_episodes: int
    budget: dict
    reward: object
    batch: RolloutBatch


class PolicyLoop:
    """The state and the steps of one fit of a policy.

    ``BasePolicy.fit`` makes one per call and keeps the last (``warm_start``
    continues its random streams and optimiser); pickling a policy drops it.
    The steps read the fit's :class:`StepView` (``view``) and nothing else of the
    estimator; the estimator itself (``policy``) is what checkpoints, callbacks,
    trackers and the run-health monitor receive.

    Parameters
    ----------
    policy : BasePolicy
        The estimator being fitted.
    view : StepView
        What the step needs of it (built by ``fit`` from the policy).
    run : RunState
        The random streams, the optimiser and the prompt stream.
    prompts : list of str
        The prompts of the fit.
    columns : dict of str to list, default=None
        The prompt table's other columns, one value per prompt, for the reward.
    reward : callable
        The reward given to ``fit`` (after the online refits so far).
    ptx_texts : list of str, default=None
        Pretraining texts (``ptx_coef``), tokenised once here.
    checkpoint : Resume, default=None
        The checkpoint folder of the fit, or ``None``.
    online : OnlineRewards, default=None
        The online refits, or ``None`` for an offline fit.
    start_key : str, default=None
        The starting model's fingerprint, which the checkpoint records.
    overlap : dict, default=None
        The overlapped rollouts' saved state (batches in flight), for a resumed run.
    """

    def __init__(
        self,
        policy,
        *,
        view,
        run: RunState,
        prompts,
        reward,
        columns=None,
        ptx_texts=None,
        checkpoint=None,
        online=None,
        start_key=None,
        overlap=None,
    ):
        self.policy = policy
        self.view = view
        self.run = run
        self.prompts = prompts
        self.columns = columns or {}
        self.prompt_tokens = view.tokenize_prompts(prompts)
        self.ptx_tokens = None if ptx_texts is None else view.pretraining_tokens(ptx_texts)
        tokenizer = getattr(reward, "tokenizer_", None)  # rewards of any type
        # Same vocabulary: the reward scores the ids directly, no decoding and re-encoding.
        self.scores_tokens = (
            callable(getattr(reward, "score_tokens", None))
            and tokenizer is not None
            and tokenizer.get_vocab() == view.tokenizer.get_vocab()
        )
        self.checkpoint = checkpoint
        self.online = online
        self.start_key = start_key
        # The step count and cumulative budget the fit continues from (a warm start or a
        # resumed run keeps counting).
        self.n_iter = policy.n_iter_
        self.n_episodes = policy.n_episodes_
        self.totals = _budget_totals(policy.history_[-1] if policy.history_ else {})
        self.kl = policy.kl_  # the fit's KL controller
        # The sampling engine: the fit's (set_config(generation=...)), told of the fit's
        # optimiser, whose steps change the weights an engine must hold.
        self.sampler = episodes = None
        if view.episodes is not None:  # multi-turn: the environment's turns between the policy's
            self.sampler = sampler_for(view.model, run.optimizer)
            episodes = episode_sampler(self.sampler, view, prompts, self.prompt_tokens)
            self.prompt_tokens = episodes.prompt_tokens  # with the tools' schemas
        # max_staleness: the sampler process and its queue of batches (_overlap.py), or None
        self.overlap = overlapped(view, run, prompt_tokens=self.prompt_tokens, state=overlap)
        if self.sampler is None and self.overlap is None:
            self.sampler = sampler_for(view.model, run.optimizer)
        self.rollouts = Rollout(
            view,
            episodes or self.overlap or self.sampler,
            run=run,
            prompts=prompts,
            prompt_tokens=self.prompt_tokens,
            reward=reward,
            columns=self.columns,
            scores_tokens=self.scores_tokens,
        )
        self.updates = Update(view, run.optimizer, run.generator, ptx_tokens=self.ptx_tokens)

    # ----- one step ---------------------------------------------------------------------
    def rollout(self, prompt_rows) -> RolloutBatch:
        """One step's rollouts of the prompts ``prompt_rows``, ``k`` each.

        Sampling, the reference, the value model and the reward run once per batch
        under ``inference_mode``; the batch is then cloned into ordinary tensors for
        the update (FSDP reuses its gathered-weight buffers in training, which
        inference tensors forbid, so a sharded model runs under ``no_grad``).
        """
        sharded = distributed.is_sharded(self.view.model)
        with torch.no_grad() if sharded else torch.inference_mode():
            batch = self.rollouts(prompt_rows, beta=self.kl.beta_, step=self.n_iter + 1)
        return batch.clone()

    def update(self, batch: RolloutBatch) -> dict:
        """The gradient passes of one step on ``batch`` (with advantages); their statistics."""
        return self.updates(batch, step=self.n_iter + 1).stats

    def set_learning_rate(self) -> None:
        """The learning rate of the next step: the adaptive rate's, or the schedule's."""
        view = self.view
        done = (self.n_iter - self.run.start_step) / max(view.n_steps, 1)  # share of steps done
        if view.lr_controller is not None:  # adapted after every update (annealed if asked)
            rate = view.lr_controller.rate_at(min(max(done, 0.0), 1.0))
        elif view.lr_schedule == "linear":  # annealed linearly to 0, as the original code
            rate = (1.0 - done) * view.learning_rate
        else:
            rate = view.learning_rate
        for group in self.run.optimizer.param_groups:
            group["lr"] = rate

    def adapt_learning_rate(self, batch: RolloutBatch) -> dict:
        """After an update: measure the policy's change and adapt the rate ({} when fixed).

        ``optim/learning_rate`` is the rate this step's update used and
        ``optim/policy_kl`` the change it made (:func:`policy_change`, one forward
        pass without gradients); the controller's new rate is the next step's.
        """
        controller = self.view.lr_controller
        if controller is None:
            return {}
        change = policy_change(self.view, batch)
        used = self.run.optimizer.param_groups[0]["lr"]
        controller.update(change)
        return {"optim/learning_rate": used, "optim/policy_kl": change}

    def step(self, tracked=None) -> StepResult:
        """One step: rollout, advantages, update, beta; returns its :class:`StepResult`.

        ``tracked`` (the fit's :class:`~prefopt.tracking.TrackedRun`) gets a text
        sample of the completions every so often.
        """
        view, run = self.view, self.run
        self.set_learning_rate()
        start = time.perf_counter()
        k = view.k

        # Distributed fits: every rank draws the same global rows and takes its share.
        def draw():
            return distributed.shard(run.next_rows(view.batch_size // k, len(self.prompts)))

        rows = draw() if self.overlap is None else self.overlap.next_rows(draw, self.n_iter)
        batch = self.rollout(rows)
        advantages = view.compute_advantages(batch)
        if isinstance(advantages, tuple):
            batch.advantages, batch.returns = advantages
        else:
            batch.advantages = advantages
        update = self.updates(batch, step=self.n_iter + 1)
        stats = dict(update.stats)
        stats.update(self.adapt_learning_rate(batch))
        view.after_update(batch)
        if self.online is not None:
            online_stats, self.rollouts.reward = self.online.after_step(
                self, batch, self.n_iter + 1, self.rollouts.reward
            )
            stats.update(online_stats)
        mean_kl = float(distributed.mean(batch.kl.sum(1), across_ranks=True))
        n_episodes = len(batch) * distributed.world_size()  # the global batch
        beta = checked_beta(
            self.kl, self.kl.update(mean_kl, n_episodes=n_episodes), f"after step {self.n_iter + 1}"
        )
        self.n_iter += 1
        self.n_episodes += n_episodes
        elapsed = time.perf_counter() - start
        row = {
            "step": self.n_iter,
            "episodes": self.n_episodes,
            "objective/reward": float(batch.scores.mean()),
            "objective/kl": mean_kl,
            "objective/rlhf_reward": float(batch.rlhf_rewards.mean()),
            "objective/beta": batch.beta,
            **stats,
            **batch.stats,
            **engine_gap(batch),
            **overlap_statistics(view, batch, self.overlap),
            "response/length": float(batch.response_mask.sum(1).float().mean()),
            "response/eos_share": float(batch.ended.float().mean()),
            "charts/learning_rate": run.optimizer.param_groups[0]["lr"],
            "time/episodes_per_s": len(batch) / elapsed,
            **health_statistics(view, batch),  # what the run-health detectors read
        }
        row = distributed.reduce_row(row, elapsed, len(batch))  # global figures
        budget = self.budget(batch, n_episodes, elapsed, update.gradient_steps)
        row.update(budget)
        if tracked is not None:
            self.log_samples(tracked, batch)
        return StepResult(
            row=row,
            beta=beta,
            n_episodes=n_episodes,
            budget={
                "episodes": budget["budget/episodes"],
                "tokens": budget["budget/tokens"],
                "gradient_steps": budget["budget/gradient_steps"],
                "seconds": budget["time/elapsed"],
            },
            reward=self.rollouts.reward,
            batch=batch,
        )

    def budget(self, batch: RolloutBatch, n_episodes: int, elapsed: float, steps: int) -> dict:
        """The run's cumulative budget after this step, as ``history_`` columns.

        Comparisons of algorithms are fair only at a matched budget (Engstrom et
        al. 2020 trace PPO's gains to such unmatched details): ``budget/episodes``
        sampled, ``budget/tokens`` (response tokens generated),
        ``budget/gradient_steps`` (optimiser steps) and ``time/elapsed`` (wall-clock
        seconds of the steps; a ``time/`` column, as it is not reproducible). They
        continue from the last ``history_`` row, so a warm start or a resumed run
        keeps counting.
        """
        tokens = float(distributed.mean(batch.response_mask.sum().float(), across_ranks=True))
        this_step = {
            "budget/episodes": n_episodes,
            "budget/tokens": int(round(tokens * distributed.world_size())),
            "budget/gradient_steps": steps,
            "time/elapsed": elapsed,
        }
        self.totals = {key: self.totals[key] + value for key, value in this_step.items()}
        return dict(self.totals)

    def train(self, n_steps: int, callback=None, *, record) -> None:
        """``n_steps`` steps, each recorded, logged, checked and checkpointed.

        ``record(result)`` (the estimator's) writes each :class:`StepResult` into
        the fitted attributes before the health checks, the checkpoint and the
        callbacks read them. The trackers of ``set_config(report_to=...)`` and the
        loggers among ``callback`` open (and log the parameters) before the first
        step and close with the fit; each row goes to them, to ``verbose`` and to
        the callbacks.
        """
        policy, view = self.policy, self.view
        total = self.n_iter + max(n_steps, 0)
        show = progress_shown() and distributed.is_main()  # rank 0 alone; "auto": a TTY
        # The detectors read the run's whole history_: a warm start continues the run, and
        # its rows then equal those of one uninterrupted fit.
        health = policy_monitor(policy, view, first_row=0)
        with open_run(policy, callback, name=view.name, total=total) as tracked:
            # The length of a response, shown from the start (logged too: _tell_sampling).
            desc = f"{view.name} (up to {policy.max_new_tokens_} tokens)"
            bar = tqdm(range(max(n_steps, 0)), desc=desc, disable=not show, leave=False)
            for _ in bar:
                result = self.step(tracked)
                record(result)
                row = result.row
                check_health(self, row)
                unhealthy = health.observe()  # the health/ columns; True: on_unhealthy="stop"
                bar.set_postfix(
                    reward=f"{row['objective/reward']:.3f}", kl=f"{row['objective/kl']:.3f}"
                )
                last = self.n_iter == total
                due = self.n_iter % view.checkpoint_every == 0 or last
                if self.checkpoint is not None and due:
                    self.save_checkpoint()
                stop = tracked(policy, row) or unhealthy
                if distributed.any_rank(stop):  # every rank stops at the same step
                    if self.checkpoint is not None and not due:  # an early stop is kept too
                        self.save_checkpoint()
                    break
            bar.close()
            health.finish()

    def log_samples(self, tracked, batch: RolloutBatch) -> None:
        """A few of the step's prompts and completions as text, when a tracker wants them."""
        if not tracked.samples_due(self.n_iter):
            return
        n = min(len(batch), _SAMPLES)
        prompts = [self.prompts[int(i)] for i in batch.prompt_index[:n]]
        completions = self.view.decode(batch.response_ids[:n], batch.seen_mask[:n])
        tracked.log_samples(prompts, completions, self.n_iter, batch.scores[:n].tolist())

    def save_checkpoint(self) -> None:
        """Write the policy's fitted state and this run's state to the checkpoint folder."""
        state = self.run.state_dict()
        if distributed.is_sharded(self.view.model):  # FSDP: gather the moments (collective)
            state["optimizer"] = distributed.full_optimizer_state(
                self.view.trained, self.run.optimizer
            )
        if self.online is not None:
            state["online"] = self.online.state_dict()
        if self.overlap is not None:  # the batches in flight, waited for
            state["overlap"] = self.overlap.state_dict()
        self.checkpoint.save(self.policy, state)

    def close(self) -> None:
        """End the fit's sampler process, if any (overlapped rollouts), and its sampler."""
        if self.overlap is not None:
            self.overlap.close()
        if self.sampler is not None:  # an engine stops counting the optimiser's steps
            self.sampler.close()

    # ----- distributed fits ---------------------------------------------------------------
    def prepare_distributed(self) -> None:
        """Under a process group: DDP beside the trained modules, or FSDP's fully_shard.

        The update's training passes then go through the DDP wrappers (their backward
        averages the gradients); the modules themselves stay what checkpoints read.
        """
        if distributed.world_size() == 1:
            return
        view = self.view
        trained = view.trained
        before = [id(p) for p in trainable_parameters(trained)]
        # What each trained module's training passes go through: its DDP wrapper, or itself.
        passes = {id(m): distributed.prepare(m, view.device) for m in trained.values()}
        if distributed.sharded() and get_config()["fsdp_frozen"] == "shard":
            with view.reference() as reference:
                if reference is not view.model:
                    distributed.prepare(reference, view.device)
        self.updates.model = passes.get(id(view.model), view.model)
        self.updates.value_model = passes.get(id(view.value_model), view.value_model)
        if [id(p) for p in trainable_parameters(trained)] != before:  # fully_shard's new ones
            old = self.run.optimizer
            self.run.optimizer = make_optimizer(trained, _kind(old), view.learning_rate)
            self.updates.optimizer = self.run.optimizer
            if old.state:  # a resumed run's moments, loaded whole into every rank: shard them
                distributed.load_full_optimizer_state(trained, self.run.optimizer, old.state_dict())


def _kind(optimizer) -> str:
    """``"sgd"`` for an SGD optimiser, else ``"adam"`` (make_optimizer's two kinds)."""
    return "sgd" if isinstance(optimizer, torch.optim.SGD) else "adam"


def _budget_totals(row: dict) -> dict:
    """The cumulative budget columns of a ``history_`` row (0 before the first step)."""
    keys = ("budget/episodes", "budget/tokens", "budget/gradient_steps", "time/elapsed")
    return {key: row.get(key, 0) for key in keys}
