"""TRL's RLOOTrainer and GRPOTrainer at prefopt's settings, timed by phase."""

from __future__ import annotations

import dataclasses
import tempfile
import time

from _throughput_measure import PeakMemory, StepClock, evaluate
from _throughput_task import RecordingReward


def _last_quarter(values: list[float]) -> float:
    tail = values[-max(1, len(values) // 4) :]
    return sum(tail) / len(tail)


def trl_config(spec: dict, output_dir: str):
    """TRL's RLOOConfig at prefopt RLOOPolicy's settings, or for a GRPO spec its
    GRPOConfig at TRL's GRPO defaults (README: what cannot match)."""
    from trl import GRPOConfig, RLOOConfig

    from prefopt import RLOOPolicy

    grpo = spec.get("algorithm", "rloo").startswith("grpo")
    RLOOConfig = GRPOConfig if grpo else RLOOConfig  # noqa: N806 - the same fields
    defaults = RLOOPolicy().get_params()
    n_epochs, n_minibatches = defaults["n_epochs"], defaults["n_minibatches"]
    cuda = spec["device"].startswith("cuda")
    extra = {}
    if grpo:  # TRL's GRPO defaults, said out loud: group-scaled rewards, DAPO aggregation
        extra = dict(loss_type="dapo", scale_rewards="group", epsilon=0.2)
    # prefopt neither checkpoints activations nor uses bf16 on the CPU; TRL's defaults do.
    # (transformers 5 renamed gradient_checkpointing to activation_checkpointing.)
    names = {f.name for f in dataclasses.fields(RLOOConfig)}
    checkpointing = (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )
    return RLOOConfig(
        **{checkpointing: False},
        output_dir=output_dir,
        seed=spec["seed"],
        use_cpu=not cuda,
        # batch_size episodes a step (batch_size/k prompts, k samples each), cut into
        # n_minibatches optimiser steps, n_epochs passes over it: prefopt's loop.
        per_device_train_batch_size=spec["batch_size"] // n_minibatches,
        steps_per_generation=n_minibatches,
        gradient_accumulation_steps=1,
        num_iterations=n_epochs,
        num_generations=spec["k"],
        max_steps=(spec["warmup"] + spec["steps"]) * n_minibatches * n_epochs,
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        generation_kwargs={"suppress_tokens": [spec["pad_token_id"]]},
        beta=spec["beta"],
        learning_rate=spec["learning_rate"],
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        adam_epsilon=1e-5,
        max_grad_norm=1.0,
        bf16=cuda and spec["dtype"] in ("auto", "bfloat16"),
        disable_dropout=True,
        report_to="none",
        save_strategy="no",
        logging_steps=10,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **extra,
    )


def rollout_clock(args, clock: StepClock):
    """A TRL callback ticking ``clock`` once a rollout batch (after its last optimiser step)."""
    from transformers import TrainerCallback

    per_rollout = args.steps_per_generation * args.num_iterations

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % per_rollout == 0:
                clock.tick()

    return Clock()


def run_trl(spec: dict, prompts: list[str], reward) -> dict:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer, RLOOTrainer

    recorder = RecordingReward(reward)
    clock = StepClock()
    with tempfile.TemporaryDirectory() as out:
        args = trl_config(spec, out)
        tokenizer = AutoTokenizer.from_pretrained(spec["path"], padding_side="left")
        memory = PeakMemory(spec["device"])
        memory.start()
        trainer_class = GRPOTrainer if spec["algorithm"].startswith("grpo") else RLOOTrainer
        trainer = trainer_class(
            model=spec["path"],
            reward_funcs=recorder,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
            callbacks=[rollout_clock(args, clock)],
        )
        phases = PhaseTimer(trainer)
        trainer.train()
        peak, delta = memory.stop()
    return {
        **clock.rates(spec["warmup"], spec["batch_size"], recorder.tokens),
        **phases.per_step(clock, spec["warmup"]),
        "peak_mb": peak,
        "delta_mb": delta,
        "updates": f"{args.num_iterations}x{args.steps_per_generation}",
        "train_reward": _last_quarter(recorder.means),
        "final_reward": evaluate(
            trainer.model,
            tokenizer,
            prompts,
            reward,
            n_episodes=spec["eval_episodes"],
            max_new_tokens=spec["max_new_tokens"],
            temperature=spec["temperature"],
        ),
    }


class PhaseTimer:
    """Wall time in TRL's phases, by wrapping the trainer's own methods (on the instance).

    generation: ``_generate``; log-probs: ``_get_per_token_logps_and_entropies`` called
    without gradients (old and reference); reward: ``_calculate_rewards``; the update is
    the rest of each step (the training forward, backward and optimiser).
    """

    WRAPPED = {
        "_generate": "time/generation",
        "_calculate_rewards": "time/reward",
        "_get_per_token_logps_and_entropies": "time/logprobs",
    }

    def __init__(self, trainer):
        import torch

        self.calls: list[tuple[str, float, float]] = []  # (phase, end, seconds)
        for name, phase in self.WRAPPED.items():
            method = getattr(trainer, name)

            def timed(*a, _method=method, _phase=phase, **kw):
                if _phase == "time/logprobs" and torch.is_grad_enabled():
                    return _method(*a, **kw)  # the training forward: part of the update
                start = time.perf_counter()
                result = _method(*a, **kw)
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()
                end = time.perf_counter()
                self.calls.append((_phase, end, end - start))
                return result

            setattr(trainer, name, timed)

    def per_step(self, clock: StepClock, warmup: int) -> dict:
        """Mean seconds a measured step in each phase; the update is what is left."""
        begin, n = clock.wall[warmup - 1], len(clock.wall) - warmup
        out = {phase: 0.0 for phase in self.WRAPPED.values()}
        for phase, end, seconds in self.calls:
            if end > begin:
                out[phase] += seconds / n
        step = (clock.wall[-1] - begin) / n
        out["time/update"] = step - sum(out.values())
        return out
