"""Multi-turn episodes: the one-turn case is today's step bit for bit, the environment's tokens
never reach a loss, and each turn's reward lands on its last token (hand-computed)."""

import numpy as np
import pytest
import torch
from _tiny import tiny_lm

from prefopt import GRPOPolicy, PPOPolicy, ReinforcePlusPlusPolicy, ReinforcePolicy, RLOOPolicy
from prefopt.backend import pad_right, response_logprobs
from prefopt.backend.samplers import Samples
from prefopt.policies import Minibatch
from prefopt.policies.loop._update import Update

PROMPTS = ["the movie was", "the plot was"]
# The tiny word tokenizer's ids: [UNK] 0, [PAD] 1, </s> 2, the 3, movie 4, was 5, good 6,
# bad 7, great 8, awful 9, plot 10, . 11.
EOS, GOOD, BAD, GREAT, THE, PLOT = 2, 6, 7, 8, 3, 10


def words(prompts, completions):
    return np.array([c.count("good") - c.count("bad") for c in completions], dtype=float)


class OneTurn:
    """Ends every episode after the policy's first turn, paying nothing itself."""

    def reset(self, prompt):
        return None

    def step(self, completion):
        return None, 0.0, True


class TwoTurns:
    """Answers the first turn with "the plot" and 0.5; ends after the second with 1.0."""

    def reset(self, prompt):
        self.turn = 0

    def step(self, completion):
        self.turn += 1
        if self.turn == 1:
            return "the plot", 0.5, False
        return None, 1.0, True


class AsyncTwoTurns(TwoTurns):
    async def reset(self, prompt):
        self.turn = 0

    async def step(self, completion):
        return TwoTurns.step(self, completion)


class Scripted:
    """A sampler whose turns are given: each call answers its live rows with the next rows."""

    def __init__(self, turns):
        self.turns = list(turns)
        self.calls = []

    def sample(self, model, prompts, *, max_new_tokens, pad_token_id, **kwargs):
        rows = self.turns.pop(0)
        assert len(rows) == len(prompts)  # one row a live episode
        self.calls.append(len(prompts))
        ids, mask = pad_right(rows, pad_token_id, width=max_new_tokens)
        ended = torch.tensor([EOS in r[:max_new_tokens] for r in rows])
        return Samples(ids, mask.long(), ended, torch.zeros(ids.shape))


def fitted(cls=RLOOPolicy, **params):
    """A policy set up on PROMPTS (no step taken), its loop ready for rollouts."""
    reward = params.pop("reward", words)
    params = {"model": tiny_lm(0), "batch_size": 4, "max_new_tokens": 4, "random_state": 0,
              **params}  # fmt: skip
    if "k" not in cls().get_params():  # PPO: one sample a prompt, the batch of 4 prompts
        params.pop("k", None)
    return cls(n_steps=0, **params).fit(PROMPTS, reward)


def one_update(policy, batch):
    """One step's advantages and update on ``batch``: the loss stats and each gradient."""
    view, loop = policy._loop.view, policy._loop
    advantages = view.compute_advantages(batch)
    if isinstance(advantages, tuple):
        batch.advantages, batch.returns = advantages
    else:
        batch.advantages = advantages
    grads = []
    hook = loop.run.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.append([p.grad.clone() for p in policy.model_.parameters()])
    )
    stats = loop.updates(batch, step=1).stats
    hook.remove()
    return {k: v for k, v in stats.items() if not k.startswith("time/")}, grads


@pytest.mark.parametrize("cls", [GRPOPolicy, RLOOPolicy, PPOPolicy])
def test_a_one_turn_environment_is_the_single_turn_step_bit_for_bit(cls):
    plain, episodic = fitted(cls, k=2), fitted(cls, k=2, environment=OneTurn)
    rows = np.array([0, 1])
    a, b = plain._loop.rollout(rows), episodic._loop.rollout(rows)
    assert b.attention_mask is not None and torch.equal(b.attention_mask, a.response_mask)
    for name in ("response_ids", "response_mask", "ended", "old_logprobs", "ref_logprobs",
                 "scores", "kl", "rewards"):  # fmt: skip
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    if cls is PPOPolicy:
        assert torch.equal(a.values, b.values)
    stats_a, grads_a = one_update(plain, a)
    stats_b, grads_b = one_update(episodic, b)
    assert stats_a == stats_b  # the losses, exactly
    assert len(grads_a) == len(grads_b) > 0
    for ga, gb in zip(grads_a, grads_b):
        assert all(torch.equal(x, y) for x, y in zip(ga, gb))
    assert all(
        torch.equal(x, y) for x, y in zip(plain.model_.parameters(), episodic.model_.parameters())
    )


def scripted_batch(policy, turns, rows=(0, 1)):
    policy._loop.rollouts.sampler.sampler = script = Scripted(turns)
    return policy._loop.rollout(np.array(rows)), script


def test_each_turn_reward_lands_on_its_last_token_and_the_final_reward_on_the_last():
    seen = []

    def final(prompts, completions):
        seen.extend(completions)
        return np.full(len(completions), 0.25)

    policy = fitted(k=2, beta=0.0, environment=TwoTurns, reward=final)
    batch, script = scripted_batch(
        policy, [[[GOOD, EOS]] * 4, [[BAD, GREAT, EOS]] * 4]
    )  # every row: "good </s>", then "the plot" from the environment, then "bad great </s>"
    assert script.calls == [4, 4]  # one generation call a turn for every live episode
    assert batch.response_ids[0].tolist() == [GOOD, EOS, THE, PLOT, BAD, GREAT, EOS]
    assert batch.response_mask.tolist() == [[1, 1, 0, 0, 1, 1, 1]] * 4
    assert batch.attention_mask.tolist() == [[1] * 7] * 4
    # 0.5 at turn 1's </s> (position 1); 1.0 + 0.25 at the last </s> (position 6).
    assert batch.rewards.tolist() == [[0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 1.25]] * 4
    assert batch.scores.tolist() == [1.75] * 4 and batch.ended.all()
    assert seen == ["good the plot bad great"] * 4  # the transcript, special tokens out
    assert torch.equal(batch.last_index, torch.tensor([6] * 4))
    assert batch.stats["episode/turns"] == 2.0 and batch.stats["episode/truncated_share"] == 0
    # Nothing of the environment's tokens in the KL or the log-probs.
    env = batch.response_mask == 0
    assert (batch.kl[env] == 0).all() and (batch.old_logprobs[env] == 0).all()
    assert (batch.ref_logprobs[env] == 0).all() and (batch.ref_logprobs[~env] != 0).all()


def test_episodes_that_end_drop_out_and_the_turn_limit_truncates():
    policy = fitted(k=2, beta=0.0, environment=TwoTurns, max_turns=2)
    # Rows 0 and 2 stop without EOS (truncated, they drop out); 1 and 3 take a second turn.
    batch, script = scripted_batch(
        policy,
        [[[GOOD, GOOD, GOOD, GOOD], [GOOD, EOS], [BAD, BAD, BAD, BAD], [BAD, EOS]],
         [[GREAT, EOS], [GREAT, EOS]]],
    )  # fmt: skip
    assert script.calls == [4, 2]
    assert batch.ended.tolist() == [False, True, False, True]
    # A truncated episode totals missing_eos_reward (-1), as a response cut at max_new_tokens.
    assert batch.rewards[0].tolist() == [0.0, 0.0, 0.0, -1.0, 0.0, 0.0]
    # 0.5 at the first </s>; 1.0 and the words reward (good - bad: 1) at the last.
    assert batch.rewards[1].tolist() == [0.0, 0.5, 0.0, 0.0, 0.0, 2.0]
    assert batch.rewards[3].tolist() == [0.0, 0.5, 0.0, 0.0, 0.0, 0.0]  # 1.0 - 1 (one bad)

    policy = fitted(k=2, beta=0.0, environment=TwoTurns, max_turns=1)
    batch, _ = scripted_batch(policy, [[[GOOD, EOS]] * 4])
    # The turn limit: truncated; the turn's 0.5 stays and the last token takes the rest of -1.
    assert batch.ended.tolist() == [False] * 4
    assert batch.rewards[0].tolist() == [0.0, -1.0, 0.0, 0.0]
    assert batch.stats["episode/truncated_share"] == 1.0


def test_the_token_budget_cuts_a_turn_and_truncates_the_episode():
    policy = fitted(k=2, beta=0.0, environment=TwoTurns, max_episode_tokens=5)
    batch, script = scripted_batch(policy, [[[GOOD, EOS]] * 4, [[BAD, GREAT, EOS]] * 4])
    # 2 + 2 tokens before turn 2, which may add 1: "bad", cut, no EOS.
    assert batch.response_mask[0].tolist() == [1, 1, 0, 0, 1]
    assert batch.ended.tolist() == [False] * 4


def test_async_environments_run_as_sync_ones():
    a = scripted_batch(fitted(k=2, beta=0.0, environment=TwoTurns),
                       [[[GOOD, EOS]] * 4, [[BAD, EOS]] * 4])[0]  # fmt: skip
    b = scripted_batch(fitted(k=2, beta=0.0, environment=AsyncTwoTurns),
                       [[[GOOD, EOS]] * 4, [[BAD, EOS]] * 4])[0]  # fmt: skip
    assert torch.equal(a.rewards, b.rewards) and torch.equal(a.response_ids, b.response_ids)


# Second turns whose rewards differ within each prompt's pair (words: 0 and 1, 2 and 1).
VARIED = [[[GOOD, EOS]] * 4, [[BAD, EOS], [GREAT, EOS], [GOOD, EOS], [GREAT, GREAT, EOS]]]
ALGORITHMS = [GRPOPolicy, RLOOPolicy, PPOPolicy, ReinforcePolicy, ReinforcePlusPlusPolicy]


@pytest.mark.parametrize("cls", ALGORITHMS)
def test_the_environment_tokens_get_exactly_zero_gradient_in_every_algorithm(cls):
    """Through the batch's mask alone: the algorithms' losses are unchanged."""
    policy = fitted(cls, k=2, beta=0.1, entropy_coef=0.01, environment=TwoTurns)
    rows = (0, 1) if "k" in cls().get_params() else (0, 0, 1, 1)  # PPO: one sample a prompt
    batch, _ = scripted_batch(policy, VARIED, rows)
    view = policy._loop.view
    advantages = view.compute_advantages(batch)
    if isinstance(advantages, tuple):
        batch.advantages, batch.returns = advantages
    else:
        batch.advantages = advantages
    # The per-token log-probs of the policy, as the update computes them, made leaves.
    rows = torch.arange(len(batch))
    logprobs, entropy = response_logprobs(
        policy.model_, batch.prompts, batch.response_ids, batch.attention_mask,
        temperature=view.training_temperature, with_entropy=True, entropy_grad=True,
    )  # fmt: skip
    leaf = logprobs.detach().requires_grad_()
    leaf_entropy = entropy.detach().requires_grad_()
    outside = batch.response_mask == 0
    values = None
    if policy.value_model_ is not None:
        values = torch.randn(batch.response_ids.shape).requires_grad_()
    minibatch = Minibatch(
        batch, rows, leaf.masked_fill(outside, 0.0), leaf_entropy.masked_fill(outside, 0.0),
        None if values is None else values,
    )  # fmt: skip
    loss, _ = view.compute_loss(batch, minibatch)
    loss = loss - view.entropy_coef * (minibatch.entropy * batch.response_mask).sum()
    loss.backward()
    assert (leaf.grad[outside] == 0).all() and (leaf.grad[~outside] != 0).any()
    assert (leaf_entropy.grad[outside] == 0).all()
    if values is not None:  # the value targets: the policy's tokens alone
        assert (values.grad[outside] == 0).all() and (values.grad[~outside] != 0).any()
        assert (batch.returns[outside] == 0).all()


def test_the_update_passes_no_gradient_through_the_environment_tokens_logits():
    """End to end: the gradient of the update's loss at the logits predicting them is 0."""
    policy = fitted(k=2, beta=0.1, environment=TwoTurns, n_minibatches=1)
    batch, _ = scripted_batch(policy, VARIED)
    view = policy._loop.view
    batch.advantages = view.compute_advantages(batch)
    grads = []

    class Probe(torch.nn.Module):  # the policy, its logits' gradient kept
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids)  # fmt: skip
            out.logits.register_hook(grads.append)
            return out

    update = Update(view, policy._loop.run.optimizer, torch.Generator().manual_seed(0),
                    models=(Probe(policy.model_), None))  # fmt: skip
    update(batch, step=1)
    width = batch.response_ids.shape[1]
    assert len(grads) == 1  # one minibatch of the 4 episodes (in a shuffled order)
    grad = grads[0][:, -(width + 1) : -1]  # the logits that predict each response token
    # Every episode: its first turn at 0-1, "the plot" from the environment at 2-3.
    assert batch.response_mask[:, :4].tolist() == [[1, 1, 0, 0]] * 4
    assert grad[:, 2:4].abs().max() == 0 and grad[:, :2].abs().max() > 0


def test_gae_steps_over_the_environment_tokens():
    """GAE on [a b | env env | c] equals GAE on [a b c] (hand-computed, gamma 1, lambda 0.5)."""
    from prefopt.policies.ppo import gae

    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.4, 9.0, 9.0, 0.3]])  # the environment's values are ignored
    advantages, returns = gae(rewards, values, torch.tensor([[1, 1, 0, 0, 1]]), 1.0, 0.5)
    # c: 2 - 0.3 = 1.7; b: 1 + 0.3 - 0.4 + 0.5 * 1.7 = 1.75; a: 0.4 - 0.5 + 0.5 * 1.75 = 0.775
    assert torch.allclose(advantages, torch.tensor([[0.775, 1.75, 0.0, 0.0, 1.7]]))
    assert torch.allclose(returns, torch.tensor([[1.275, 2.15, 0.0, 0.0, 2.0]]))


def test_resampled_groups_keep_their_transcripts_mask():
    """DAPO's resampling (dynamic_sampling) joins rounds of episodes, masks and all."""
    policy = fitted(GRPOPolicy, k=2, beta=0.0, environment=TwoTurns, dynamic_sampling=True,
                    max_resamples=1, reward=lambda p, c: np.zeros(len(c)))  # fmt: skip
    # Round 1: every group ties (all rewards alike); round 2 draws new groups.
    turns = [[[GOOD, EOS]] * 4, [[BAD, EOS]] * 4, [[GOOD, EOS]] * 4, [[BAD, GREAT, EOS]] * 4]
    batch, script = scripted_batch(policy, turns)
    assert script.calls == [4, 4, 4, 4] and batch.stats["sampling/rounds"] >= 1
    assert batch.attention_mask is not None
    assert batch.attention_mask.shape == batch.response_mask.shape
    assert (batch.attention_mask >= batch.response_mask).all()
    assert batch.response_mask[:, 2:4].sum() == 0  # the environment's "the plot", every row


def test_a_resumed_run_with_an_environment_ends_as_the_uninterrupted_one(tmp_path):
    def fit(n_steps, folder):
        policy = RLOOPolicy(model=tiny_lm(0), environment=TwoTurns, k=2, batch_size=4,
                            max_new_tokens=8, n_steps=n_steps, checkpoint_dir=folder,
                            checkpoint_every=1, on_unhealthy="ignore", learning_rate=1e-3,
                            lr_schedule="constant", random_state=0)  # fmt: skip
        return policy.fit(PROMPTS, words)

    whole = fit(3, tmp_path / "whole")
    fit(2, tmp_path / "split")
    resumed = fit(3, tmp_path / "split")  # the same folder: steps 1-2 from the checkpoint
    assert max(r["episode/turns"] for r in whole.history_) > 1  # some episodes took 2 turns
    assert [r["objective/reward"] for r in resumed.history_] == [
        r["objective/reward"] for r in whole.history_
    ]
    assert all(torch.equal(a, b) for a, b in zip(whole.model_.parameters(),
                                                 resumed.model_.parameters()))  # fmt: skip
