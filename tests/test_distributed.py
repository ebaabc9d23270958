"""Data-parallel fits on torch.distributed: 2 gloo processes on CPU give the single-process result.

Each launch starts 2 processes (``torch.multiprocessing``, spawn, the gloo backend) that run
several scenarios and write what they saw; the tests below read it. One launch costs about
10 s of imports on this 2-core machine, so the scenarios share launches.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

import prefopt
from prefopt import (
    DPOPolicy,
    GRPOPolicy,
    PPOPolicy,
    ReinforcePolicy,
    RewardModel,
    RLOOPolicy,
    SFTPolicy,
)
from prefopt.backend import EncodedPrompts, distributed
from prefopt.kl import AdaptiveKLController
from prefopt.policies.loop import RolloutBatch

N_PROMPTS = 6
WORLD_KW = dict(n_prompts=N_PROMPTS, random_state=0)
RL_KW = dict(batch_size=8, k=2, n_steps=3, random_state=0)


# ----- launching ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(name: str, out: Path, nprocs: int = 2) -> None:
    import torch.multiprocessing as mp

    os.environ["OMP_NUM_THREADS"] = "1"  # 2 processes on 2 busy cores
    mp.start_processes(
        _entry, args=(name, str(out), _free_port(), nprocs), nprocs=nprocs, start_method="spawn"
    )


def _entry(rank: int, name: str, out: str, port: int, world: int) -> None:
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    # A short timeout: a rank left waiting in a collective fails the test instead of hanging.
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=90))
    prefopt.set_config(show_progress_bar=False)
    try:
        globals()[name](rank, Path(out))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _save(out: Path, name: str, rank: int, value) -> None:
    torch.save(value, out / f"{name}-{rank}.pt")


def _load(out: Path, name: str) -> list:
    return [torch.load(out / f"{name}-{r}.pt", weights_only=False) for r in range(2)]


def _weights(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# ----- what the ranks run ------------------------------------------------------------------
def _world():
    from prefopt.worlds import TinyLMWorld

    return TinyLMWorld(**WORLD_KW)


class _RecordingRLOO(RLOOPolicy):
    """RLOO that records the prompt rows and the mean score of each step's rollouts."""

    def compute_advantages(self, batch):
        prompt_rows = batch.prompt_index[:: self.k]  # the k samples of a prompt sit together
        self.__dict__.setdefault("_seen", []).append(
            ([int(i) for i in prompt_rows], float(batch.scores.mean()))
        )
        return super().compute_advantages(batch)


class _RecordingDPO(DPOPolicy):
    """DPO that records the comparisons (row indices) of each minibatch it trains on."""

    def _logps(self, model, prompt_rows, response_rows, pairs):
        if torch.is_grad_enabled():  # a training pass, not the reference's
            self.__dict__.setdefault("_seen", []).append([int(i) for i in pairs])
        return super()._logps(model, prompt_rows, response_rows, pairs)


class _RecordingSFT(SFTPolicy):
    """SFT that records the demonstrations (as token tuples) of each minibatch it trains on."""

    def _batch_loss(self, model, ptoks, ctoks):
        rows = [tuple(p) + (-1,) + tuple(c) for p, c in zip(ptoks, ctoks)]
        self.__dict__.setdefault("_seen", []).append(rows)
        return super()._batch_loss(model, ptoks, ctoks)


def _take(batch: RolloutBatch, rows: slice) -> RolloutBatch:
    """The rows ``rows`` of a rollout batch."""
    out = {}
    for name, value in vars(batch).items():
        if isinstance(value, EncodedPrompts):
            value = EncodedPrompts(value.input_ids[rows], value.attention_mask[rows])
        elif isinstance(value, torch.Tensor):
            value = value[rows]
        out[name] = value
    return RolloutBatch(**out)


def _update_deltas(policy, batch) -> dict:
    """Weight changes of one SGD step (learning rate 1: minus the gradient) on ``batch``."""
    modules = {"policy": policy.model_, "value": policy.value_model_}
    before = {k: _weights(m) for k, m in modules.items() if m is not None}
    batch = batch.clone()
    advantages = policy.compute_advantages(batch)
    if isinstance(advantages, tuple):
        batch.advantages, batch.returns = advantages
    else:
        batch.advantages = advantages
    policy._loop.update(batch)
    deltas = {}
    for key, start in before.items():
        after = modules[key].state_dict()
        deltas[key] = {k: after[k].detach() - v for k, v in start.items()}
        modules[key].load_state_dict(start)  # back to the start for the next update
    return deltas


def _gradients(rank, out):
    """One step's averaged gradient over 2 ranks and the single-process one, same batch."""
    world = _world()
    result = {}
    # GRPO with batch-scaled advantages and DAPO's token-sum / global-token-count loss.
    grpo = {"k": 2, "n_epochs": 1, "scale_rewards": "batch", "loss_type": "dapo"}
    for cls, extra in ((RLOOPolicy, {}), (PPOPolicy, {"n_epochs": 1}), (GRPOPolicy, grpo)):
        kw = dict(model=world.policy_model(), optimizer="sgd", learning_rate=1.0)
        kw.update(batch_size=8, n_steps=1, n_minibatches=1, random_state=0, **extra)
        with prefopt.config_context(distributed="none"):
            policy = cls(**kw).fit(world.prompts, world.reward)
            # The same whole batch on both ranks: the same generator state, no collective.
            batch = policy._loop.rollout(np.arange(6) if cls is PPOPolicy else np.arange(4))
            single = _update_deltas(policy, batch)
        policy._loop.prepare_distributed()  # DistributedDataParallel beside the modules
        half = len(batch) // 2
        share = _take(batch, slice(rank * half, (rank + 1) * half))
        averaged = _update_deltas(policy, share)  # the losses' means say across_ranks=True
        result[cls.__name__] = {"single": single, "distributed": averaged}
    _save(out, "gradients", rank, result)


def _fits(rank, out):
    world = _world()
    # RLOO: rows seen, local mean scores, history, weights; an adaptive KL controller, whose
    # beta must follow the global KL on every rank.
    rloo = _RecordingRLOO(
        model=world.policy_model(), kl=AdaptiveKLController(target=0.01, horizon=100), **RL_KW
    ).fit(world.prompts, world.reward)
    reinforce = ReinforcePolicy(model=world.policy_model(), batch_size=8, n_steps=2, random_state=0)
    reinforce.fit(world.prompts, world.reward)
    ppo = PPOPolicy(model=world.policy_model(), batch_size=8, n_steps=2, random_state=0)
    ppo.fit(world.prompts, world.reward)
    _save(
        out,
        "fits",
        rank,
        {
            "rloo_seen": rloo._seen,
            "rloo_history": rloo.history_,
            "rloo_weights": _weights(rloo.model_),
            "rloo_episodes": rloo.n_episodes_,
            "ppo_history": ppo.history_,
            "ppo_weights": _weights(ppo.model_),
            "ppo_value_weights": _weights(ppo.value_model_),
            "baseline": reinforce.baseline_.state_dict(),
            "reinforce_weights": _weights(reinforce.model_),
        },
    )


def _supervised(rank, out):
    world = _world()
    demos = [(p, c) for p in world.prompts for c in ("a", "b c", "c a b")]  # 18 distinct rows
    kw = dict(model=world.policy_model(), batch_size=4, n_epochs=1, random_state=0)
    sft = _RecordingSFT(**kw).fit(demos)
    with prefopt.config_context(distributed="none"):
        sft_single = SFTPolicy(**kw).fit(demos)
    # The reward model: record the prompts of every training pass.
    from prefopt.rewards import _lm

    seen, real = [], _lm._raw

    def recording(rm, prompt_rows, response_rows, model=None):
        seen.append([tuple(p) + (-1,) + tuple(r) for p, r in zip(prompt_rows, response_rows)])
        return real(rm, prompt_rows, response_rows, model=model)

    _lm._raw = recording
    pairs = [(p, c, r) for p in world.prompts for c, r in (("a", "b c"), ("c", "a b"))]  # 12
    rkw = dict(model=sft_single, batch_size=4, normalize=False, random_state=0)
    rm = RewardModel(**rkw).fit(pairs)
    _lm._raw = real
    with prefopt.config_context(distributed="none"):
        rm_single = RewardModel(**rkw).fit(pairs)
    _save(
        out,
        "supervised",
        rank,
        {
            "sft_seen": sft._seen,
            "sft_weights": _weights(sft.model_),
            "sft_single": _weights(sft_single.model_),
            "sft_history": sft.history_,
            "rm_seen": [rows[: len(rows) // 2] for rows in seen],  # chosen half; rejected follows
            "rm_weights": _weights(rm.model_),
            "rm_single": _weights(rm_single.model_),
            "rm_history": rm.history_,
        },
    )
    dkw = dict(model=sft_single, batch_size=4, n_epochs=1, random_state=0)
    dpo = _RecordingDPO(**dkw).fit(pairs)
    with prefopt.config_context(distributed="none"):
        dpo_single = DPOPolicy(**dkw).fit(pairs)
    _save(
        out,
        "dpo",
        rank,
        {
            "dpo_seen": [[(i,) for i in rows] for rows in dpo._seen],
            "dpo_weights": _weights(dpo.model_),
            "dpo_single": _weights(dpo_single.model_),
        },
    )


class _Killed(Exception):
    pass


def _columns_and_dynamic(rank, out):
    # The prompt table's answer column follows each rank's rows; dynamic sampling's extra
    # rounds run on both ranks alike (their draws of prompts stay in step).
    import pandas as pd

    world = _world()
    table = pd.DataFrame(
        {"prompt": world.prompts, "answer": [f"row{i}" for i in range(len(world.prompts))]}
    )
    seen = []

    def reward(prompts, completions, answer):
        seen.append((list(prompts), list(answer)))
        return world.reward(prompts, completions)

    policy = GRPOPolicy(
        model=world.policy_model(), dynamic_sampling=True, max_resamples=2, **RL_KW
    ).fit(table, reward)
    _save(
        out,
        "columns",
        rank,
        {
            "seen": seen,
            "truth": dict(zip(table.prompt, table.answer)),
            "weights": _weights(policy.model_),
            "history": policy.history_,
        },
    )


def _all_scenarios(rank, out):
    _gradients(rank, out)
    _fits(rank, out)
    _supervised(rank, out)
    _columns_and_dynamic(rank, out)
    # A run stopped dead at step 2 of 4, right after its checkpoint, on both ranks (as the
    # launcher ends every rank when one dies), then resumed by a new fit.
    world = _world()
    kw = dict(RL_KW, n_steps=4, checkpoint_every=1)
    whole = RLOOPolicy(model=world.policy_model(), **kw).fit(world.prompts, world.reward)
    _save(out, "whole", rank, _weights(whole.model_))

    def die(policy, row):
        if row["step"] == 2:
            raise _Killed

    folder = str(out / "killed-run")
    try:
        RLOOPolicy(model=world.policy_model(), checkpoint_dir=folder, **kw).fit(
            world.prompts, world.reward, callback=die
        )
    except _Killed:
        pass
    resumed = RLOOPolicy(model=world.policy_model(), checkpoint_dir=folder, **kw)
    resumed.fit(world.prompts, world.reward)
    _save(out, "resumed", rank, {"weights": _weights(resumed.model_), "n_iter": resumed.n_iter_})
    _overlapped(rank, out, world, kw, die)
    # FSDP (fully_shard on CPU with gloo) against DDP, same seed.
    fkw = dict(RL_KW, n_steps=2)
    ddp = RLOOPolicy(model=world.policy_model(), **fkw).fit(world.prompts, world.reward)
    with prefopt.config_context(distributed="fsdp"):
        fsdp = RLOOPolicy(model=world.policy_model(), **fkw).fit(world.prompts, world.reward)
        fsdp.save_pretrained(out / "fsdp-model")  # every rank; rank 0 writes the full weights
        fsdp_history = fsdp.history_
        fsdp_weights = distributed.full_state_dict(fsdp.model_)
    _save(
        out,
        "fsdp",
        rank,
        {"ddp": _weights(ddp.model_), "ddp_history": ddp.history_, "fsdp_history": fsdp_history},
    )
    # One rank's responses all end at the first token, the other's never: under FSDP every
    # decode step is a collective, so both must run the same number of steps.
    from prefopt.backend import generation

    eos, word = world.tokenizer.eos_token_id, world.tokenizer.convert_tokens_to_ids("a")
    real = generation.draw_tokens

    def skewed(probs, generator):
        token = real(probs, generator)
        if rank == 0:
            return torch.full_like(token, eos)
        return torch.full_like(token, word)

    generation.draw_tokens = skewed
    with prefopt.config_context(distributed="fsdp"):
        early = RLOOPolicy(model=world.policy_model(), **dict(RL_KW, n_steps=1))
        early.fit(world.prompts, world.reward)
    generation.draw_tokens = real
    _save(out, "early", rank, {"history": early.history_})
    _fsdp_checkpoints_and_sharded_reference(rank, out, world, fsdp, fsdp_weights)
    _online_refits(rank, out)


def _overlapped(rank, out, world, kw, die):
    """Each rank overlaps its own sampling: staleness 0 is the synchronous run; 1 resumes."""
    stale0 = RLOOPolicy(model=world.policy_model(), max_staleness=0, **kw)
    stale0.fit(world.prompts, world.reward)
    stale1 = RLOOPolicy(model=world.policy_model(), max_staleness=1, **kw)
    stale1.fit(world.prompts, world.reward)
    folder = str(out / "killed-overlapped")
    try:
        RLOOPolicy(model=world.policy_model(), max_staleness=1, checkpoint_dir=folder, **kw).fit(
            world.prompts, world.reward, callback=die
        )
    except _Killed:
        pass
    resumed = RLOOPolicy(model=world.policy_model(), max_staleness=1, checkpoint_dir=folder, **kw)
    resumed.fit(world.prompts, world.reward)
    _save(
        out,
        "overlapped",
        rank,
        {
            "stale0": _weights(stale0.model_),
            "stale1": _weights(stale1.model_),
            "stale1_history": stale1.history_,
            "resumed": _weights(resumed.model_),
            "resumed_n_iter": resumed.n_iter_,
        },
    )


def _fsdp_stopped_and_resumed(cls, kw, world, folder):
    """Gathered weights of an uninterrupted FSDP run and of one stopped dead at step 2, resumed."""

    def die(policy, row):
        if row["step"] == 2:
            raise _Killed

    def gathered(policy):
        return {
            name: distributed.full_state_dict(module)
            for name, module in policy._trained_modules().items()
            if module is not None
        }

    kw = dict(kw, checkpoint_every=1)
    with prefopt.config_context(distributed="fsdp"):
        whole = cls(model=world.policy_model(), **kw).fit(world.prompts, world.reward)
        try:
            cls(model=world.policy_model(), checkpoint_dir=folder, **kw).fit(
                world.prompts, world.reward, callback=die
            )
        except _Killed:
            pass
        resumed = cls(model=world.policy_model(), checkpoint_dir=folder, **kw)
        resumed.fit(world.prompts, world.reward)
    return gathered(whole), gathered(resumed), resumed.n_iter_


def _fsdp_checkpoints_and_sharded_reference(rank, out, world, whole_ref, whole_ref_weights):
    # FSDP with checkpoints, 3 steps (Adam: the moments must come back); PPO's optimiser
    # also trains the sharded value model.
    whole, resumed, n_iter = _fsdp_stopped_and_resumed(RLOOPolicy, RL_KW, world, out / "rloo")
    ppo = dict(batch_size=8, n_steps=3, random_state=0)
    ppo_whole, ppo_resumed, _ = _fsdp_stopped_and_resumed(PPOPolicy, ppo, world, out / "ppo")
    # The frozen reference sharded too, against the FSDP run above, whose reference is
    # replicated (same seed, 2 steps).
    with prefopt.config_context(distributed="fsdp", fsdp_frozen="shard"):
        sharded_ref = RLOOPolicy(model=world.policy_model(), **dict(RL_KW, n_steps=2))
        sharded_ref.fit(world.prompts, world.reward)
        sharded_weights = distributed.full_state_dict(sharded_ref.model_)
    _save(
        out,
        "fsdp_resume",
        rank,
        {
            "whole": whole,
            "resumed": resumed,
            "ppo_whole": ppo_whole,
            "ppo_resumed": ppo_resumed,
            "n_iter": n_iter,
            "ref_sharded": distributed.is_sharded(sharded_ref.ref_model_),
            "ref_whole": distributed.is_sharded(whole_ref.ref_model_),
            "sharded_ref": sharded_weights,
            "replicated_ref": whole_ref_weights,
            "sharded_history": sharded_ref.history_,
            "replicated_history": whole_ref.history_,
        },
    )


def _online_refits(rank, out):
    from prefopt.worlds import PreferenceWorld

    world = PreferenceWorld(random_state=0)
    from prefopt.policies.loop import _online

    rm = RewardModel().fit(world.comparisons(200, random_state=0))
    local, real = [], _online._pairs

    def recording(loop, batch):  # this rank's own pairs of each step
        local.append(real(loop, batch))
        return local[-1]

    _online._pairs = recording
    policy = RLOOPolicy(model=world.policy_model(), refit_every=1, **dict(RL_KW, n_steps=2))
    policy.fit(world.prompts, rm, labeler=world.labeler)
    _online._pairs = real
    _save(
        out,
        "online",
        rank,
        {
            "weights": _weights(policy.model_),
            "coef": policy.reward_model_.coef_.copy(),
            "start_coef": rm.coef_.copy(),
            "log": policy._loop.online.log,
            "local_pairs": local,
            "history": policy.history_,
        },
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    _launch("_all_scenarios", out)
    return out


# ----- the acceptance tests ----------------------------------------------------------------
@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_one_step_averaged_gradient_equals_the_single_process_gradient(runs):
    # float32 throughout (log-softmax runs in float32 by design): the two computations sum
    # the same terms in another order, so they agree to float32 rounding, not bit for bit.
    for name, result in zip(("RLOO", "PPO", "GRPO"), _load(runs, "gradients")[0].values()):
        for module, single in result["single"].items():
            for key, expected in single.items():
                got = result["distributed"][module][key]
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6, msg=name + key)
        assert any(d.abs().max() > 1e-4 for d in result["single"]["policy"].values())


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_ranks_end_with_identical_weights_and_one_global_history_row_a_step(runs):
    r0, r1 = _load(runs, "fits")
    for key in ("rloo_weights", "ppo_weights", "ppo_value_weights", "reinforce_weights"):
        for name in r0[key]:
            torch.testing.assert_close(r0[key][name], r1[key][name], rtol=0, atol=0)
    assert len(r0["rloo_history"]) == 3 and len(r0["ppo_history"]) == 2
    strip = lambda h: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in h]  # noqa: E731
    assert strip(r0["rloo_history"]) == strip(r1["rloo_history"])
    assert strip(r0["ppo_history"]) == strip(r1["ppo_history"])
    # The global reward is the mean over both ranks' shares (equal halves of the batch).
    for step, row in enumerate(r0["rloo_history"]):
        local = [r0["rloo_seen"][step][1], r1["rloo_seen"][step][1]]
        assert row["objective/reward"] == pytest.approx(np.mean(local), abs=1e-6)
        assert row["episodes"] == 8 * (step + 1)
    assert r0["rloo_episodes"] == 24
    betas = [row["objective/beta"] for row in r0["rloo_history"]]
    assert len(set(betas)) == 3  # the controller moved beta, alike on both ranks
    # REINFORCE's moving baseline holds both ranks' rewards: 2 steps of the global batch 8.
    assert r0["baseline"] == r1["baseline"] and r0["baseline"]["count"] == 16


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_reward_columns_follow_each_ranks_rows_and_dynamic_sampling_stays_in_step(runs):
    r0, r1 = _load(runs, "columns")
    for r in (r0, r1):
        assert r["seen"]
        for prompts, answers in r["seen"]:
            assert len(prompts) == 4  # this rank's half of the batch of 8
            assert answers == [r["truth"][p] for p in prompts]
    assert len(r0["seen"]) == len(r1["seen"])  # as many rounds on both ranks
    for name in r0["weights"]:
        torch.testing.assert_close(r0["weights"][name], r1["weights"][name], rtol=0, atol=0)
    keys = ("sampling/rounds", "sampling/extra_generations")
    assert [[row[k] for k in keys] for row in r0["history"]] == [
        [row[k] for k in keys] for row in r1["history"]
    ]


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_each_rank_samples_its_own_share_of_the_prompts(runs):
    r0, r1 = _load(runs, "fits")
    for (rows0, _), (rows1, _) in zip(r0["rloo_seen"], r1["rloo_seen"]):
        # batch 8 = 4 prompts x k=2: 2 prompts each, and together one pass's 4 rows.
        assert len(rows0) == len(rows1) == 2
    stream0 = [i for rows, _ in r0["rloo_seen"] for i in rows]
    stream1 = [i for rows, _ in r1["rloo_seen"] for i in rows]
    assert stream0 != stream1
    # Every prompt once per pass over the data: the first 6 rows of the global stream.
    first_pass = r0["rloo_seen"][0][0] + r1["rloo_seen"][0][0] + r0["rloo_seen"][1][0][:1]
    assert len(set(first_pass)) == len(first_pass)


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_sft_and_reward_model_split_rows_and_match_the_single_process_fit(runs):
    r0, r1 = _load(runs, "supervised")
    for key in ("sft_seen", "rm_seen"):
        assert len(r0[key]) == len(r1[key]) > 0
        for a, b in zip(r0[key], r1[key]):
            assert len(a) == len(b) and not set(a) & set(b)  # half a minibatch each
        all_rows = [row for rows in r0[key] + r1[key] for row in rows]
        assert len(set(all_rows)) == len(all_rows)  # one epoch: every row once
    # batch_size 4: SFT's 18 rows in minibatches of 4, 4, 4, 4, 2; the reward model's 12 in 3.
    assert [len(a) + len(b) for a, b in zip(r0["sft_seen"], r1["sft_seen"])] == [4, 4, 4, 4, 2]
    assert [len(a) + len(b) for a, b in zip(r0["rm_seen"], r1["rm_seen"])] == [4, 4, 4]
    for dist_key, single_key in (("sft_weights", "sft_single"), ("rm_weights", "rm_single")):
        for name, value in r0[dist_key].items():
            torch.testing.assert_close(value, r1[dist_key][name], rtol=0, atol=0)
            # Global token-mean (SFT) and row-mean (reward) losses: the single-process fit, to
            # float32 rounding (the gradients sum in another order; AdamW's g / sqrt(v) turns a
            # rounding difference in a near-zero gradient into up to ~1e-6 of a weight a step).
            torch.testing.assert_close(value, r0[single_key][name], rtol=1e-4, atol=1e-5)
    assert r0["sft_history"][0]["data/tokens"] > 0


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_dpo_splits_rows_and_matches_the_single_process_fit(runs):
    r0, r1 = _load(runs, "dpo")
    assert [len(a) + len(b) for a, b in zip(r0["dpo_seen"], r1["dpo_seen"])] == [4, 4, 4]
    for a, b in zip(r0["dpo_seen"], r1["dpo_seen"]):
        assert len(a) == len(b) and not set(a) & set(b)
    assert sorted(i for rows in r0["dpo_seen"] + r1["dpo_seen"] for (i,) in rows) == list(range(12))
    for name, value in r0["dpo_weights"].items():
        torch.testing.assert_close(value, r1["dpo_weights"][name], rtol=0, atol=0)
        torch.testing.assert_close(value, r0["dpo_single"][name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_a_stopped_two_process_run_resumes_to_the_uninterrupted_result(runs):
    whole = _load(runs, "whole")
    resumed = _load(runs, "resumed")
    assert resumed[0]["n_iter"] == 4
    for rank in range(2):
        for name, value in whole[rank].items():
            torch.testing.assert_close(resumed[rank]["weights"][name], value, rtol=0, atol=0)


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_each_rank_overlaps_its_own_sampling_and_resumes_mid_pipeline(runs):
    whole = _load(runs, "whole")  # the synchronous run, 4 steps
    got = _load(runs, "overlapped")
    for rank in range(2):
        for name, value in whole[rank].items():  # staleness 0: the synchronous fit exactly
            torch.testing.assert_close(got[rank]["stale0"][name], value, rtol=0, atol=0)
        for name, value in got[rank]["stale1"].items():  # resumed mid-pipeline: the same run
            torch.testing.assert_close(got[rank]["resumed"][name], value, rtol=0, atol=0)
            # the ranks stay in step (DDP averages their gradients)
            torch.testing.assert_close(got[1 - rank]["stale1"][name], value, rtol=0, atol=0)
        assert got[rank]["resumed_n_iter"] == 4
    # One step off-policy from the second step on, and the weights moved off the
    # synchronous run's (the batches came from older weights).
    history = got[0]["stale1_history"]
    assert [row["overlap/staleness"] for row in history] == [0.0, 1.0, 1.0, 1.0]
    assert all(np.isfinite(row["overlap/is_weight_mean"]) for row in history)
    assert any(not torch.equal(got[0]["stale1"][name], value) for name, value in whole[0].items())


def test_overlap_with_fsdp_is_refused_before_training(monkeypatch):
    monkeypatch.setattr(distributed, "world_size", lambda: 2)  # as if under torchrun
    monkeypatch.setattr(distributed, "sharded", lambda: True)
    world = _world()
    policy = RLOOPolicy(model=world.policy_model(), max_staleness=1, **RL_KW)
    with pytest.raises(ValueError, match="distributed='ddp'.*max_staleness=None"):
        policy.fit(world.prompts, world.reward)


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_fsdp_gives_the_ddp_weights_and_save_pretrained_gathers_them(runs):
    from transformers import AutoModelForCausalLM

    r0, r1 = _load(runs, "fsdp")
    saved = AutoModelForCausalLM.from_pretrained(runs / "fsdp-model").state_dict()
    for name, value in r0["ddp"].items():
        if name in saved:
            torch.testing.assert_close(saved[name], value, rtol=1e-4, atol=1e-5)
    strip = lambda h: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in h]  # noqa: E731
    assert json.dumps(strip(r0["fsdp_history"])) == json.dumps(strip(r1["fsdp_history"]))


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_fsdp_sampling_where_one_rank_ends_early_does_not_hang(runs):
    r0, r1 = _load(runs, "early")
    assert len(r0["history"]) == len(r1["history"]) == 1
    # Half the global batch ended at once (rank 0), half never (rank 1).
    assert r0["history"][0]["response/eos_share"] == pytest.approx(0.5)


def test_a_batch_that_does_not_split_into_ranks_times_k_is_refused(monkeypatch):
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    with pytest.raises(ValueError, match="must split into 2 ranks x k=2.*multiple of 4"):
        distributed.check_batch(6, 2, "RLOOPolicy")
    distributed.check_batch(8, 2, "RLOOPolicy")
    with pytest.raises(ValueError, match="cannot give each of 2 ranks a row"):
        distributed.check_rows(9, 4, "SFTPolicy")


def test_outside_a_process_group_everything_is_local():
    assert distributed.world_size() == 1 and distributed.is_main()
    assert distributed.shard([1, 2, 3]) == [1, 2, 3] and distributed.rank_seed(5) == 5
    x = torch.tensor([1.0, 2.0, 4.0])
    assert distributed.masked_mean(x, torch.tensor([1, 1, 0]), across_ranks=True).item() == 1.5
    assert distributed.gather(x, across_ranks=True) is x
    assert distributed.std(x, across_ranks=True) == x.std()
    assert distributed.global_count(3, across_ranks=True) == 3


def test_each_rank_takes_its_own_gpu(monkeypatch):
    from prefopt.backend import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(distributed, "init_from_env", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device() == torch.device("cuda:3")
    with prefopt.config_context(device="cuda:0"):  # an explicit device is the user's choice
        assert resolve_device() == torch.device("cuda:0")


def test_online_refits_of_a_language_model_reward_are_refused_in_a_distributed_fit(monkeypatch):
    from torch import nn

    world = _world()
    rm = RewardModel()
    rm.model_ = nn.Linear(1, 1)  # as a fitted language-model reward holds its module
    rm.partial_fit = lambda *args, **kwargs: None
    monkeypatch.setattr(distributed, "world_size", lambda: 2)  # as if under torchrun
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    policy = RLOOPolicy(model=world.policy_model(), refit_every=1, batch_size=8, n_steps=1)
    with pytest.raises(ValueError, match="language-model reward are not supported in a distr"):
        policy.fit(world.prompts, rm, labeler=lambda *args, **kwargs: None)


def test_a_shared_value_model_is_refused_in_a_distributed_fit(monkeypatch):
    from prefopt.worlds import TinyLMWorld

    world = TinyLMWorld(**WORLD_KW)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)  # as if under torchrun
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    policy = PPOPolicy(model=world.policy_model(), value_model="shared", batch_size=8, n_steps=1)
    with pytest.raises(ValueError, match="value_model='shared' is not supported in a distrib"):
        policy.fit(world.prompts, world.reward)


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_a_stopped_fsdp_run_resumes_to_the_uninterrupted_result(runs):
    r0, r1 = _load(runs, "fsdp_resume")
    assert r0["n_iter"] == r1["n_iter"] == 3
    assert r1["whole"]["model_"] is None  # rank 0 alone holds the gathered weights
    assert set(r0["ppo_whole"]) == {"model_", "value_model_"}
    for whole, resumed in (("whole", "resumed"), ("ppo_whole", "ppo_resumed")):
        for module, weights in r0[whole].items():
            # Gathering and sharding again copy the weights and Adam's moments exactly.
            for name, value in weights.items():
                got = r0[resumed][module][name]
                torch.testing.assert_close(got, value, rtol=0, atol=0, msg=whole + name)


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_a_sharded_reference_gives_the_replicated_reference_run(runs):
    r0, _ = _load(runs, "fsdp_resume")
    assert r0["ref_sharded"] and not r0["ref_whole"]
    for name, value in r0["replicated_ref"].items():
        # The reference's forward gathers its blocks instead of holding them: the same
        # numbers, up to float32 rounding of the gathered matmuls.
        torch.testing.assert_close(r0["sharded_ref"][name], value, rtol=1e-4, atol=1e-5)
    for a, b in zip(r0["sharded_history"], r0["replicated_history"]):
        assert a["objective/kl"] == pytest.approx(b["objective/kl"], abs=1e-5)


@pytest.mark.slow  # one launch of 2 processes for all of these: about 60-90 s here
def test_online_refits_label_the_global_pairs_and_ranks_refit_the_same_reward(runs):
    r0, r1 = _load(runs, "online")
    for name, value in r0["weights"].items():
        torch.testing.assert_close(value, r1["weights"][name], rtol=0, atol=0)
    np.testing.assert_array_equal(r0["coef"], r1["coef"])
    assert not np.array_equal(r0["coef"], r0["start_coef"])  # the reward was refitted
    assert r0["log"] == r1["log"] and len(r0["log"]) == 2
    # batch 8 = 4 prompts x k=2: each rank pairs its 2 prompts' samples; the refit labels
    # rank 0's pairs then rank 1's (ties dropped), the global batch's order.
    for step, record in enumerate(r0["log"]):
        pairs = [
            (p, a, b)
            for share in (r0["local_pairs"][step], r1["local_pairs"][step])
            for p, a, b in zip(*share)
            if a != b
        ]
        assert len(r0["local_pairs"][step][0]) == len(r1["local_pairs"][step][0]) == 2
        assert pairs == list(zip(record["prompts"], record["a"], record["b"]))
        assert len(record["labels"]) == len(pairs)
    assert r0["history"][-1]["reward/refits"] == 2


@pytest.mark.parametrize("rank", ["0", "1"])  # rank 0 waits for workers, rank 1 for rank 0
def test_leftover_launcher_variables_fail_fast_naming_world_size(monkeypatch, rank):
    from prefopt.backend import _process_group

    with socket.socket() as s:  # a free port: nobody listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for name, value in {
        "WORLD_SIZE": "2",
        "RANK": rank,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PREFOPT_DIST_JOIN_TIMEOUT": "1",
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError, match="WORLD_SIZE=2.*did not meet within 1 s.*torchrun"):
        _process_group.init_from_env()
    assert not torch.distributed.is_initialized()


_RANK_SCRIPT = """
import sys
import torch
import torch.distributed as dist
from prefopt.backend import distributed

real = dist.destroy_process_group
def destroy(*args, **kwargs):
    print("destroyed at exit", flush=True)
    return real(*args, **kwargs)
dist.destroy_process_group = destroy
assert distributed.init_from_env()
total = torch.ones(1)
dist.all_reduce(total)
print("sum", int(total.item()), flush=True)
if sys.argv[1] == "fail":
    raise RuntimeError("a rank that failed")
"""


@pytest.mark.parametrize("ending", ["clean", "fail"])
def test_a_group_prefopt_started_is_destroyed_at_exit(ending):
    """Gloo's teardown at interpreter exit can abort a rank (status -6, seen on a rank that
    raised before this handler destroyed groups after exceptions too); prefopt ends its
    group first, so a rank exits with its own status."""
    import subprocess
    import sys

    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = dict(
            os.environ,
            WORLD_SIZE="2",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _RANK_SCRIPT, ending],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert "sum 2" in out, err[-2000:]
        assert out.count("destroyed at exit") == 1, (proc.returncode, err[-2000:])
        if ending == "clean":
            assert proc.returncode == 0, err[-2000:]
        else:  # the rank's own error, not an abort in gloo's teardown
            assert proc.returncode == 1 and "a rank that failed" in err, err[-2000:]
