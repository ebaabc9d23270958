"""The benchmark's printed tables: runs, the time split by phase, prefopt against TRL."""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile

from _throughput_trl import trl_config

NAMES = {
    "ppo": "PPO",
    "rloo": "RLOO",
    "reinforce": "REINFORCE",
    "raft": "RAFT",
    "grpo": "GRPO b=0",
    "grpo-beta": "GRPO b>0",
}
PHASES = ("time/generation", "time/logprobs", "time/reward", "time/update")


def _median(results: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)


def _prefopt_version() -> str:
    """prefopt's commit, and whether prefopt/ has uncommitted changes (read-only git)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "prefopt"],
            cwd=root,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        import prefopt

        return f"prefopt {prefopt.__version__}"
    return f"prefopt {sha}{' + uncommitted changes' if dirty else ''}"


def _versions(peer: bool) -> str:
    import torch
    import transformers

    out = (
        f"{_prefopt_version()}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    if peer:
        import trl

        out += f", trl {trl.__version__}"
    return out


def _model_words(model: dict) -> str:
    return (
        f"GPT-2 config n_layer={model['n_layer']}, n_embd={model['n_embd']}, "
        f"n_head={model['n_head']}, vocab={model['vocab']} "
        f"({model['n_params'] / 1e6:.2f}M parameters, random weights); prompts of "
        "{}-{}-{} tokens (min-median-max)".format(*model["prompt_tokens"])
        + (
            f"; EOS bias: p(EOS) {model['eos_per_token']:.3f} a token at the start"
            if model.get("eos_per_token")
            else ""
        )
    )


def print_table(results: dict, memory_label: str) -> None:
    print(
        f"{'algorithm':<10} {'impl':<8} {'updates':>7} {'episodes/s':>10} {'tokens/s':>9} "
        f"{'s/step':>7} {memory_label:>11} {'+MB run':>8} {'reward end':>10} {'train end':>9}"
    )
    for (algorithm, impl), runs in results.items():
        print(
            f"{NAMES[algorithm]:<10} {impl:<8} {runs[0]['updates']:>7} "
            f"{_median(runs, 'episodes_per_s'):>10.2f} {_median(runs, 'tokens_per_s'):>9.0f} "
            f"{_median(runs, 'seconds_per_step'):>7.3f} {_median(runs, 'peak_mb'):>11.0f} "
            f"{_median(runs, 'delta_mb'):>8.0f} {_median(runs, 'final_reward'):>10.3f} "
            f"{_median(runs, 'train_reward'):>9.3f}"
        )


def print_peer(spec: dict, pf: list[dict], peer: list[dict], memory_label: str) -> None:
    config = trl_config({**spec, "device": "cpu"}, tempfile.gettempdir())
    label = NAMES[spec["algorithm"]]
    grpo = spec["algorithm"].startswith("grpo")
    print(f"\n{label} settings, side by side")
    rows = [
        ("model", "the saved weights (path)", "the same path; reference reloaded from it"),
        ("prompts", "the same list, reshuffled stream", "the same list, RepeatSampler"),
        ("reward", f"{spec['reward']} (text only)", "the same callable"),
        (
            "episodes a step",
            f"batch_size={spec['batch_size']}",
            f"per_device_train_batch_size={config.per_device_train_batch_size} x "
            f"steps_per_generation={config.steps_per_generation}",
        ),
        ("samples per prompt", f"k={spec['k']}", f"num_generations={config.num_generations}"),
        (
            "epochs x minibatches",
            pf[0]["updates"],
            f"num_iterations={config.num_iterations} x {config.steps_per_generation}",
        ),
        (
            "response length",
            f"max_new_tokens={spec['max_new_tokens']}, cut after the EOS",
            f"max_completion_length={config.max_completion_length}, stops once all ended",
        ),
        ("temperature", spec["temperature"], f"{config.temperature} (top_p=1, top_k=0)"),
        ("pad token", "never sampled", "suppress_tokens=[pad]"),
        (
            "beta (k3 KL, in the loss)" if grpo else "beta (k1 KL, in reward)",
            spec["beta"],
            config.beta,
        ),
        (
            "learning rate",
            f"{spec['learning_rate']:g}, linear to 0 by step",
            f"{config.learning_rate:g}, linear to 0 by optimiser step",
        ),
        (
            "optimiser",
            "AdamW eps=1e-5, wd=0",
            f"{getattr(config.optim, 'value', config.optim)} eps={config.adam_epsilon:g}, "
            f"wd={config.weight_decay:g}",
        ),
        ("max_grad_norm", 1.0, config.max_grad_norm),
        ("missing EOS", "missing_eos_reward=None", "(no such option)"),
        (
            ("loss", "dapo, group-scaled rewards, clip 0.2", "loss_type=dapo, scale_rewards=group")
            if grpo
            else ("loss", "-(R - b) sum_t log pi, no ratio", "PPO-clip on the sequence ratio")
        ),
        ("grad checkpointing, bf16", "none; bf16 autocast on CUDA", "off; bf16 on CUDA only"),
    ]
    for name, a, b in rows:
        print(f"  {name:<25} {str(a):<38} {b}")
    ratios = [a["episodes_per_s"] / b["episodes_per_s"] for a, b in zip(pf, peer)]
    cpu = [a["episodes_per_cpu_s"] / b["episodes_per_cpu_s"] for a, b in zip(pf, peer)]
    mem = [a["peak_mb"] / b["peak_mb"] for a, b in zip(pf, peer)]
    delta = [a["delta_mb"] / b["delta_mb"] for a, b in zip(pf, peer)]
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    print(f"\nprefopt/TRL, {label}: median of {len(ratios)} paired runs [each pair]")
    print(f"  episodes/s (wall)      {statistics.median(ratios):6.2f}   [{fmt(ratios)}]")
    print(f"  episodes per CPU-s     {statistics.median(cpu):6.2f}   [{fmt(cpu)}]")
    print(f"  {memory_label:<22} {statistics.median(mem):6.2f}   [{fmt(mem)}]")
    print(f"  +MB during the run     {statistics.median(delta):6.2f}   [{fmt(delta)}]")
    final = [a["final_reward"] - b["final_reward"] for a, b in zip(pf, peer)]
    print(f"  final reward, prefopt - TRL  {statistics.mean(final):+.3f}   [{fmt(final)}]")
    print(
        f"  final reward           prefopt {_mean_sd(pf, 'final_reward')}, TRL "
        f"{_mean_sd(peer, 'final_reward')} (start {spec['start_reward']:.3f}; mean reward of "
        f"{spec['eval_episodes']} samples of each final policy, one sampler and one seed for "
        f"all; training seeds {spec['seed']}..{spec['seed'] + len(pf) - 1}, one per pair)"
    )


def _mean_sd(results: list[dict], key: str) -> str:
    values = [r[key] for r in results]
    if len(values) < 2:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} (sd {statistics.stdev(values):.3f})"


def print_phases(results: dict) -> None:
    """Seconds a measured step in each phase (medians over the runs)."""
    print(
        f"\nwhere the time goes, s/step: {'generation':>10} {'log-probs':>9} {'reward':>7} "
        f"{'update':>7} {'other':>7}   (log-probs: old and reference; TRL: its methods)"
    )
    for (algorithm, impl), runs in results.items():
        cells = [_median(runs, key) for key in PHASES]
        other = _median(runs, "seconds_per_step") - sum(cells)
        print(
            f"{NAMES[algorithm]:<10} {impl:<8}{'':>10} "
            + " ".join(f"{c:>{w}.3f}" for c, w in zip(cells + [other], (10, 9, 7, 7, 7)))
        )
