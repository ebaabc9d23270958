"""Sampling through vLLM in a fit of two ranks under ``torchrun``: one engine a rank.

The test launches this file under ``torchrun`` (2 gloo ranks on CPU); each rank fits
RLOO with ``generation="vllm"``, records what its engine was asked and returned, and
writes it for the test to compare. It needs vLLM (``./dev vllm-test`` makes an
environment with its CPU build) and is skipped without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORDS = ["the", "movie", "was", "good", "bad", "great", "awful", "plot"]
# Twelve distinct prompts, so that the two ranks' shares of a step differ.
PROMPTS = [f"{a} {b}" for a in WORDS[:4] for b in WORDS[4:7]]
FIT = dict(k=2, batch_size=8, n_steps=3, learning_rate=0.05, max_new_tokens=6, random_state=0)


def _reward(prompts, completions):
    return [completion.split().count("good") - 0.5 * len(completion.split())
            for completion in completions]  # fmt: skip


def _rank_main(out: Path) -> None:
    """One rank's fit, and what its engine saw; run by torchrun (see the test)."""
    import atexit

    import torch.distributed as dist
    import vllm
    from _tiny import tiny_lm

    import prefopt
    from prefopt import RLOOPolicy
    from prefopt.backend import VLLMEngine

    calls, pushes, executors, built = [], [], [], []
    generate, sync, engine_generate = vllm.LLM.generate, VLLMEngine.sync, VLLMEngine.generate

    def recording_generate(llm, requests, params, **kwargs):
        outputs = generate(llm, requests, params, **kwargs)
        calls.append({
            "requests": [[r["prompt_token_ids"], p.n] for r, p in zip(requests, params)],
            "outputs": [[list(c.token_ids) for c in o.outputs] for o in outputs]})  # fmt: skip
        executors.append(llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend)
        return outputs

    def recording_sync(engine, model, *, force=False):
        pushed = sync(engine, model, force=force)
        pushes.append(pushed)
        if engine not in built:
            built.append(engine)
        return pushed

    def recording_engine_generate(engine, model, prompts, **options):
        ids, mask = prompts.input_ids, prompts.attention_mask.bool()
        rows = [ids[i][mask[i]].tolist() for i in range(len(ids))]
        result = engine_generate(engine, model, prompts, **options)  # (tokens, engine's)
        calls[-1].update(rows=rows, tokens=result[0].tolist())
        return result

    vllm.LLM.generate, VLLMEngine.sync = recording_generate, recording_sync
    VLLMEngine.generate = recording_engine_generate  # what the sampler and sample() call
    rank = int(os.environ["RANK"])
    held = VLLMEngine()  # an engine this script holds, left open at its end

    def at_exit():  # registered first, so it runs last: after prefopt's own exit handlers
        seen = {"engine_open": held.llm is not None, "group_up": dist.is_initialized()}
        (out / f"exit-{rank}.json").write_text(json.dumps(seen))

    atexit.register(at_exit)
    prefopt.set_config(show_progress_bar=False)
    start = tiny_lm(n_head=1)  # vLLM's CPU attention takes heads of width 32 and up
    policy = RLOOPolicy(model=start, **FIT)
    with prefopt.config_context(generation="vllm"):
        policy.fit(PROMPTS, _reward)  # the process group starts here (torchrun's variables)
    fit_calls, fit_pushes = list(calls), list(pushes)
    fit_engine_closed = len(built) == 1 and built[0].llm is None  # the fit's own, closed

    def all_reduce() -> float:
        x = torch.tensor([rank + 1.0])
        dist.all_reduce(x)
        return x.item()

    after_fit = all_reduce()  # the group the fit trained with is intact, its engine closed
    # An engine held here, after the last update, against the policy, greedy, on prompts
    # of this rank's own (each rank its own half).
    mine = PROMPTS[rank::2]
    policy.temperature_ = 1e-6  # greedy from here on (sample reads the fitted temperature)
    native = policy.sample(mine, random_state=0)
    with prefopt.config_context(generation=held):
        engine = policy.sample(mine, random_state=0)
    unfitted = RLOOPolicy(model=start, **{**FIT, "n_steps": 0, "temperature": 1e-6})
    before = unfitted.fit(PROMPTS, _reward).sample(mine, random_state=0)  # the start's
    held.close()
    after_close = all_reduce()
    with prefopt.config_context(generation=held):  # built again on both ranks, left open
        again = policy.sample(mine, random_state=0)
    torch.save({name: p.detach() for name, p in policy.model_.state_dict().items()},
               out / f"model-{rank}.pt")  # fmt: skip
    (out / f"rank-{rank}.json").write_text(json.dumps({
        "world_size": dist.get_world_size(), "executors": executors[: len(fit_calls)],
        "calls": fit_calls, "pushes": fit_pushes, "fit_engine_closed": fit_engine_closed,
        "n_iter": policy.n_iter_, "after_fit": after_fit, "after_close": after_close,
        "native": native, "engine": engine, "before": before, "again": again,
        "rewards": [row["objective/reward"] for row in policy.history_],
    }))  # fmt: skip
    # The script ends with the held engine open and the group up, as a user's would.


_skip = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (./dev vllm-test runs these in their own environment)",
)


@pytest.mark.vllm
@_skip
def test_two_ranks_each_sample_their_own_prompts_with_their_own_engine(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    command = [str(torchrun), "--standalone", "--nproc_per_node", "2", __file__, str(tmp_path)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, log  # both ranks finished and exited with 0
    assert "terminate called" not in proc.stderr and "Invalid process group" not in proc.stderr
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for r, seen in enumerate(ranks):
        assert seen["world_size"] == 2 and seen["n_iter"] == FIT["n_steps"]
        # vLLM's mode for torchrun's ranks; the fit's own engine closed with the fit.
        assert set(seen["executors"]) == {"external_launcher"} and seen["fit_engine_closed"]
        # The training group survived the engine, open and closed: an all-reduce of 1 + 2.
        assert seen["after_fit"] == seen["after_close"] == 3.0
        # One sampling call a step, each after a push of the weights the step's update made
        # (the first into the engine just built).
        assert len(seen["calls"]) == FIT["n_steps"] and seen["pushes"] == [True] * FIT["n_steps"]
        for call in seen["calls"]:
            # This rank's share of the step (batch_size / 2 rows, k a prompt), and its
            # engine was asked exactly these prompts, k samples each, and returned the
            # tokens the fit got.
            assert len(call["rows"]) == FIT["batch_size"] // 2
            asked = [ids for ids, n in call["requests"] for _ in range(n)]
            assert sorted(asked) == sorted(call["rows"])  # one request a prompt, n=k
            returned = {}
            for (ids, _), output in zip(call["requests"], call["outputs"]):
                returned.setdefault(tuple(ids), []).extend(output)
            for row, tokens in zip(call["rows"], call["tokens"]):
                completion = returned[tuple(row)].pop(0)
                assert tokens[: len(completion)] == completion
        # After the last push, the engine's greedy completions are the policy's, and the
        # fit changed them from the starting model's.
        assert seen["engine"] == seen["native"] and seen["again"] == seen["native"]
        assert seen["native"] != seen["before"]
        # At exit, the engine was closed before prefopt ended the group it started.
        assert json.loads((tmp_path / f"exit-{r}.json").read_text()) == {
            "engine_open": False, "group_up": False}  # fmt: skip
    # Each rank sampled its own prompts: at every step the two shares differ.
    for a, b in zip(ranks[0]["calls"], ranks[1]["calls"]):
        assert a["rows"] != b["rows"]
    assert ranks[0]["rewards"] == ranks[1]["rewards"]  # statistics over both ranks
    models = [torch.load(tmp_path / f"model-{r}.pt") for r in (0, 1)]
    assert models[0].keys() == models[1].keys()
    for name, value in models[0].items():
        torch.testing.assert_close(models[1][name], value, rtol=0, atol=0)


if __name__ == "__main__":  # one rank, under torchrun
    _rank_main(Path(sys.argv[1]))
