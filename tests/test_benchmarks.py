"""benchmarks/throughput.py runs and prints its table. Speed is never asserted."""

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "throughput.py"


def load_throughput():
    spec = importlib.util.spec_from_file_location("throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The smallest run: tiny model, short responses, a small corpus, one thread.
SMALLEST = "--size tiny --batch-size 8 --max-new-tokens 8 --eval-episodes 8 --n-reviews 200 "
SMALLEST += "--threads 1"


def run_throughput(arguments: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments.split()],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
def test_throughput_prints_the_table():
    # 1 warm-up + 2 measured steps, no peer, one process.
    proc = run_throughput(f"{SMALLEST} --steps 2 --warmup 1 --in-process")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(
        r"^algorithm +impl +updates +episodes/s +tokens/s +s/step +peak RSS MB",
        out,
        flags=re.MULTILINE,
    ), out
    for name in ("PPO", "RLOO", "REINFORCE", "RAFT"):
        match = re.search(rf"^{name} +prefopt +\d+x\d+ +(.*)$", out, flags=re.MULTILINE)
        assert match, f"no row for {name} in:\n{out}"
        values = [float(v) for v in match.group(1).split()]
        # episodes/s, tokens/s, s/step, peak MB, +MB, final reward, training reward
        assert len(values) == 7 and all(math.isfinite(v) for v in values), match.group(0)
        assert values[0] > 0 and values[2] > 0 and values[3] > 0
        assert -1.0 <= values[5] <= 1.0 and -1.0 <= values[6] <= 1.0  # lexicon reward range
        # Each run is also reported as it finishes, so an interrupted long run keeps it.
        assert re.search(rf"^\[run 1/1\] {name} prefopt: [\d.]+ episodes/s", out, re.M), out


def test_lexicon_reward_and_padded_tokenizer():
    tp = load_throughput()
    rewards = tp.lexicon_reward(["p"] * 3, ["great fun .", "awful", ""])
    assert rewards[0] > 0 > rewards[1] and rewards[2] == 0.0
    world = tp._StandInWorld()
    tok = tp.padded_tokenizer(world.tokenizer, 100)
    assert len(tok) == 100
    assert tok.get_vocab()["great"] == world.tokenizer.get_vocab()["great"]
    assert (tok.pad_token_id, tok.eos_token_id) == (
        world.tokenizer.pad_token_id,
        world.tokenizer.eos_token_id,
    )
    assert (
        tok.decode(tok("the movie was great", add_special_tokens=False)["input_ids"])
        == "the movie was great"
    )


@pytest.mark.slow
def test_trl_settings_match_rloo_policy(tmp_path):
    pytest.importorskip("trl")
    from prefopt import RLOOPolicy

    tp = load_throughput()
    spec = dict(
        batch_size=64,
        k=4,
        max_new_tokens=27,
        temperature=0.7,
        beta=0.05,
        learning_rate=1e-3,
        steps=10,
        warmup=2,
        seed=0,
        device="cpu",
        dtype="auto",
        pad_token_id=0,
    )
    config = tp.trl_config(spec, str(tmp_path))
    ours = RLOOPolicy().get_params()
    assert config.generation_batch_size == spec["batch_size"]
    assert config.num_generations == spec["k"]
    assert config.steps_per_generation == ours["n_minibatches"]
    assert config.num_iterations == ours["n_epochs"]
    assert config.max_steps == 12 * ours["n_minibatches"] * ours["n_epochs"]
    assert (config.max_completion_length, config.temperature, config.beta) == (27, 0.7, 0.05)
    assert not config.gradient_checkpointing and not config.bf16


def test_concurrent_needs_one_thread_and_two_cores():
    # Refused before any model is built: a pair's runs need a core each.
    proc = run_throughput("--concurrent --threads 2", timeout=120)
    assert proc.returncode == 2 and "--concurrent" in proc.stderr and "--threads 1" in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="--concurrent pins each run of a pair to its own core",
)
def test_concurrent_runs_are_pinned_and_reported():
    proc = run_throughput(
        f"{SMALLEST} --steps 1 --warmup 1 --algorithms rloo --repeats 2 --concurrent"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "the two of a pair at the same time, on cores" in out, out
    assert len(re.findall(r"^\[run [12]/2\] RLOO prefopt: [\d.]+ episodes/s", out, re.M)) == 2, out
    assert re.search(r"^RLOO +prefopt +\d+x\d+ ", out, flags=re.MULTILINE), out
