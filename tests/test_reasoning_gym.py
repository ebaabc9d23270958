"""reasoning-gym's tasks as a world (an optional extra): the error without it, a fit with it."""

import sys

import numpy as np
import pytest
from _tiny import tiny_lm

from prefopt import GRPOPolicy
from prefopt.worlds import ReasoningGymWorld


def test_without_the_extra_the_error_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # an import of it now fails
    with pytest.raises(ImportError, match=r'pip install "prefopt\[reasoning-gym\]"'):
        ReasoningGymWorld(size=4)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="retries must be an integer >= 0"):
        ReasoningGymWorld(retries=-1)


def test_its_environment_runs_episodes_in_a_fit():
    pytest.importorskip("reasoning_gym")
    world = ReasoningGymWorld("basic_arithmetic", size=8, retries=1, random_state=0)
    assert world.correctness_reward(world.prompts[:1], [f" {world.answers[0]} "]) == 1.0
    env = world.environment()
    env.reset(world.prompts[0])
    assert env.step("no") == ("Incorrect, try again.", 0.0, False)
    assert env.step("no") == (None, 0.0, True)  # one retry, then the episode ends
    policy = GRPOPolicy(model=tiny_lm(0), environment=world.environment, max_turns=2, k=2,
                        batch_size=4, n_steps=1, max_new_tokens=3, on_unhealthy="ignore",
                        random_state=0)  # fmt: skip
    policy.fit(world.prompts[:4])  # the environment pays; no reward needed
    row = policy.history_[-1]
    assert 1.0 <= row["episode/turns"] <= 2.0 and np.isfinite(row["objective/reward"])
