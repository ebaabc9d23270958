"""A stochastic reward's random state is part of the checkpoint: a resumed run is the whole run."""

import random

import numpy as np
import pytest
import torch

from prefopt import NoisyReward, RLOOPolicy
from prefopt.lm import checkpoint
from prefopt.lm._describe import fingerprint
from prefopt.lm._object_state import random_states, set_random_states
from prefopt.worlds import PreferenceWorld

WORLD = PreferenceWorld(rater_bias=1.0, random_state=0)


def small_rloo(n_steps, folder=None):
    return RLOOPolicy(
        model=WORLD.policy_model(),
        beta=0.3,
        learning_rate=2.0,
        optimizer="sgd",
        n_steps=n_steps,
        batch_size=16,
        random_state=0,
        checkpoint_dir=None if folder is None else str(folder),
        checkpoint_every=1,
        lr_schedule="constant",  # a 2-step run then 2 more is the 4-step run
    )


def noisy():
    return NoisyReward(WORLD.true_quality, std=1.0, random_state=0)


def generator_noise():
    """Ours: noise from a numpy Generator, a random.Random and a torch.Generator in a closure."""
    rng, py, gen = np.random.default_rng(0), random.Random(0), torch.Generator().manual_seed(0)

    def reward(prompts, completions):
        base = np.asarray(WORLD.true_quality(prompts, completions), dtype=float)
        extra = torch.rand(len(completions), generator=gen).numpy()
        return base + rng.normal(size=len(completions)) + py.random() + extra

    return reward


@pytest.mark.parametrize("make", [noisy, generator_noise])
def test_a_resumed_stochastic_reward_run_equals_the_uninterrupted_one(tmp_path, make, monkeypatch):
    whole = small_rloo(4).fit(WORLD.prompts, make()).model_.theta.detach()
    # A new process: the script builds its reward afresh, the checkpoint sets its noise on.
    small_rloo(2, tmp_path / "new").fit(WORLD.prompts, make())
    resumed = small_rloo(4, tmp_path / "new").fit(WORLD.prompts, make())
    assert resumed.n_iter_ == 4
    assert torch.equal(resumed.model_.theta.detach(), whole)
    # The same process, the same reward object, its noise already advanced: continues too.
    same = make()
    small_rloo(2, tmp_path / "same").fit(WORLD.prompts, same)
    again = small_rloo(4, tmp_path / "same").fit(WORLD.prompts, same)
    assert torch.equal(again.model_.theta.detach(), whole)
    # Without the saved noise state the resumed run differs (the bug this closes).
    monkeypatch.setattr(checkpoint, "set_random_states", lambda objects, states: None)
    small_rloo(2, tmp_path / "lost").fit(WORLD.prompts, make())
    lost = small_rloo(4, tmp_path / "lost").fit(WORLD.prompts, make())
    assert not torch.equal(lost.model_.theta.detach(), whole)


def test_another_seed_of_the_noise_is_another_run(tmp_path):
    small_rloo(2, tmp_path).fit(WORLD.prompts, noisy())
    other = NoisyReward(WORLD.true_quality, std=1.0, random_state=1)
    with pytest.raises(ValueError, match=r"reward\.state\._rng\.RandomState="):
        small_rloo(4, tmp_path).fit(WORLD.prompts, other)


def test_random_states_round_trip_every_kind_of_generator():
    objects = {"reward": generator_noise(), "noisy": noisy()}
    states = random_states(objects)
    assert len(states) == 4  # three in the closure, one in NoisyReward
    for generator in objects["reward"].__closure__:
        value = generator.cell_contents
        _ = value.random() if hasattr(value, "random") else torch.rand(1, generator=value)
    objects["noisy"]._rng.rand()
    assert fingerprint(random_states(objects)) != fingerprint(states)
    set_random_states(objects, states)
    assert fingerprint(random_states(objects)) == fingerprint(states)
