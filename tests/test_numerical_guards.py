"""Numerical faults are caught where they happen, with an error naming the step."""

import numpy as np
import pytest
from _tiny import small_policy

import prefopt
from prefopt import AdaptiveKLController, RAFTPolicy, RLOOPolicy, SFTPolicy
from prefopt.worlds import PreferenceWorld, TinyLMWorld

WORLD = PreferenceWorld(random_state=0)


@pytest.fixture(autouse=True)
def quiet():
    prefopt.set_config(show_progress_bar=False)


def test_an_update_that_leaves_non_finite_weights_stops_at_that_step():
    world = TinyLMWorld(random_state=0)
    policy = small_policy(
        world, RLOOPolicy, k=2, batch_size=8, learning_rate=1e38, n_steps=5, random_state=0
    )
    with pytest.raises(FloatingPointError, match="update at step 1 left NaN or infinite"):
        policy.fit(world.prompts, lambda p, c: np.arange(len(c), dtype=float))


def test_sft_with_a_huge_learning_rate_stops_at_the_first_bad_step():
    world = TinyLMWorld(random_state=0)
    sft = SFTPolicy(
        model=world.policy_model(),
        learning_rate=1e38,
        lr_schedule="constant",
        batch_size=4,
        random_state=0,
    )
    with pytest.raises(FloatingPointError, match="SFTPolicy: the update at step 1"):
        sft.fit([(world.prompts[0], "a b")] * 8)


def test_a_reward_finite_in_float64_but_not_in_float32_is_refused():
    # 1e39 passes a float64 check and becomes inf in float32; RAFT used to record inf.
    policy = small_policy(WORLD, RAFTPolicy, k=2, learning_rate=0.3, n_steps=2, random_state=0)
    with pytest.raises(
        ValueError, match=r"1e\+39 for completion 0, which is not finite in float32"
    ):
        policy.fit(WORLD.prompts, lambda p, c: np.full(len(c), 1e39))


@pytest.mark.parametrize("gain, horizon, n_episodes", [(10.0, None, None), (0.1, 10, 64)])
def test_adaptive_controller_never_makes_beta_zero_or_negative(gain, horizon, n_episodes):
    kl = AdaptiveKLController(beta=0.1, target=6.0, gain=gain, horizon=horizon).start()
    with pytest.warns(RuntimeWarning, match="would make beta zero or negative"):
        betas = [kl.update(0.0, n_episodes=n_episodes) for _ in range(50)]
    assert all(b > 0 for b in betas)
    assert np.all(np.diff(betas) < 0)  # below target: beta keeps falling, never flipping sign
    # Above target it rises again, still positive.
    up = [kl.update(100.0, n_episodes=n_episodes) for _ in range(5)]
    assert all(b > betas[-1] for b in up)


def test_adaptive_controller_keeps_the_linear_update_where_it_is_stable():
    kl = AdaptiveKLController(beta=0.1, target=6.0).start()
    assert kl.update(0.0) == pytest.approx(0.1 * (1 - 0.1 * 0.2))
