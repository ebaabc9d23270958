"""AdaptiveLR: the rl_games / rsl_rl adaptive step size, checked against hand-computed rates."""

import copy
import math

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import parametrize_with_checks

from prefopt import AdaptiveLR
from prefopt.lm._identity import run_folder


def test_a_hand_computed_sequence():
    # target 0.01: the band is [0.005, 0.02]; factor 1.5; bounds [1e-6, 1e-2]
    lr = AdaptiveLR(learning_rate=1e-3, target=0.01).fit()
    kls = [0.001, 0.004, 0.005, 0.02, 0.0201, 0.5, 0.01]
    expected = [
        1e-3 * 1.5,  # 0.001 < 0.005: raise
        1e-3 * 1.5**2,  # 0.004 < 0.005: raise
        1e-3 * 1.5**2,  # 0.005 is the band's edge: inside, unchanged
        1e-3 * 1.5**2,  # 0.02 the other edge: unchanged
        1e-3 * 1.5,  # 0.0201 > 0.02: cut
        1e-3,  # 0.5: cut
        1e-3,  # inside: unchanged
    ]
    np.testing.assert_allclose(lr.sample(kls), expected, rtol=1e-12)
    assert lr.learning_rate_ == 1e-3 and lr.n_updates_ == 0  # sample replays on a copy
    got = [lr.update(kl) for kl in kls]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert lr.learning_rate_ == got[-1] and lr.n_updates_ == 7


def test_the_bounds_clip_the_rate():
    # from 4e-3 up by 1.5: 6e-3, then 9e-3, then 1.35e-2 clipped to max_lr 1e-2 and held
    up = AdaptiveLR(learning_rate=4e-3, target=0.01).fit()
    np.testing.assert_allclose(up.sample([0.001] * 4), [6e-3, 9e-3, 1e-2, 1e-2], rtol=1e-12)
    # down from 3e-6 by 1.5: 2e-6, then 1.33e-6, then 8.9e-7 clipped to min_lr 1e-6
    down = AdaptiveLR(learning_rate=3e-6, target=0.01).fit()
    np.testing.assert_allclose(down.sample([1.0] * 4), [2e-6, 2e-6 / 1.5, 1e-6, 1e-6], rtol=1e-12)
    # equal bounds: a fixed rate that no KL moves
    fixed = AdaptiveLR(learning_rate=1e-4, min_lr=1e-4, max_lr=1e-4).fit()
    assert fixed.sample([0.0001, 1.0]).tolist() == [1e-4, 1e-4]


def test_no_measured_change_leaves_the_rate_alone():
    # rsl_rl raises the rate only for a KL above 0: a step with every advantage 0 moves
    # nothing, and an unbiased estimate can dip below 0; neither is a reason to raise
    lr = AdaptiveLR(learning_rate=1e-3, target=0.01).fit()
    assert lr.sample([0.0, -0.001, 0.0]).tolist() == [1e-3, 1e-3, 1e-3]


def test_other_target_and_factor():
    # target 0.1 (band [0.05, 0.2]), factor 2: 0.04 doubles, 0.3 halves, 0.1 holds
    lr = AdaptiveLR(learning_rate=1e-4, target=0.1, factor=2.0).fit()
    np.testing.assert_allclose(lr.sample([0.04, 0.04, 0.3, 0.1]), [2e-4, 4e-4, 2e-4, 2e-4])


def test_start_takes_the_policys_rate_when_its_own_is_none():
    lr = AdaptiveLR(target=0.02).start(3e-4)
    assert lr.learning_rate_ == 3e-4 and lr.n_updates_ == 0
    assert AdaptiveLR(learning_rate=1e-3).start(3e-4).learning_rate_ == 1e-3  # its own wins
    # a passed rate is clipped into the bounds (an exact world's log-linear policies use 0.1)
    assert AdaptiveLR().start(0.1).learning_rate_ == 1e-2
    assert AdaptiveLR(min_lr=1e-5).start(3e-6).learning_rate_ == 1e-5
    with pytest.raises(ValueError, match="finite number > 0"):
        AdaptiveLR().start(-1.0)
    with pytest.raises(ValueError, match="swap them"):  # checked before any clipping
        AdaptiveLR(min_lr=1e-2, max_lr=1e-6).start(1e-3)
    with pytest.raises(ValueError, match="needs a starting rate"):
        AdaptiveLR().fit()


@pytest.mark.parametrize(
    "params, match",
    [
        ({"learning_rate": -1e-3}, "learning_rate must be a finite number > 0"),
        ({"learning_rate": 0.0}, "learning_rate must be a finite number > 0"),
        ({"learning_rate": math.inf}, "learning_rate must be a finite number > 0"),
        ({"learning_rate": math.nan}, "learning_rate must be a finite number > 0"),
        ({"learning_rate": "1e-3"}, "learning_rate must be a finite number > 0"),
        ({"learning_rate": 1e-3, "target": 0.0}, "target must be a finite number > 0"),
        ({"learning_rate": 1e-3, "target": math.inf}, "target must be a finite number > 0"),
        ({"learning_rate": 1e-3, "factor": 1.0}, "factor must be > 1"),
        ({"learning_rate": 1e-3, "min_lr": 1e-2, "max_lr": 1e-6}, "swap them"),
        ({"learning_rate": 1e-3, "min_lr": -1.0}, "min_lr must be a finite number > 0"),
        ({"learning_rate": 1.0}, r"outside \[min_lr, max_lr\]"),
    ],
)
def test_bad_parameters_are_refused_before_anything_runs(params, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveLR(**params).fit()


def test_a_non_finite_kl_is_refused():
    lr = AdaptiveLR(learning_rate=1e-3).fit()
    for bad in (math.nan, math.inf, None, "0.01"):
        with pytest.raises(ValueError, match="must be a finite number"):
            lr.update(bad)
    assert lr.n_updates_ == 0
    assert lr.update(np.float32(0.001)) == pytest.approx(1.5e-3)  # numpy numbers are fine


def test_state_dict_round_trip_continues_exactly():
    lr = AdaptiveLR(learning_rate=1e-3, target=0.01).fit()
    for kl in (0.001, 0.001, 0.5):
        lr.update(kl)
    state = lr.state_dict()
    assert state == {"learning_rate_": 1e-3 * 1.5**2 / 1.5, "n_updates_": 3}
    resumed = clone(lr)  # parameters only, as a fresh fit makes it
    resumed.load_state_dict(state)
    rest = [0.001, 0.03, 0.01]
    assert [resumed.update(kl) for kl in rest] == [lr.update(kl) for kl in rest]
    assert resumed.n_updates_ == lr.n_updates_ == 6


def test_load_state_dict_checks_what_it_reads():
    lr = AdaptiveLR(learning_rate=1e-3)
    with pytest.raises(ValueError, match="takes"):
        lr.load_state_dict({"learning_rate_": 1e-3})
    with pytest.raises(ValueError, match="finite number > 0"):
        lr.load_state_dict({"learning_rate_": math.nan, "n_updates_": 1})
    with pytest.raises(ValueError, match="saved with other bounds"):
        lr.load_state_dict({"learning_rate_": 0.5, "n_updates_": 1})
    with pytest.raises(ValueError, match="n_updates_"):
        lr.load_state_dict({"learning_rate_": 1e-3, "n_updates_": -1})
    assert not hasattr(lr, "learning_rate_")  # nothing was half-loaded


def test_it_is_a_nested_estimator_with_searchable_parameters():
    lr = AdaptiveLR(target=0.02)
    assert lr.get_params() == {
        "learning_rate": None,
        "target": 0.02,
        "factor": 1.5,
        "min_lr": 1e-6,
        "max_lr": 1e-2,
        "anneal": False,
    }
    other = clone(lr).set_params(target=0.05)
    assert other.target == 0.05 and lr.target == 0.02
    assert repr(lr) == "AdaptiveLR(target=0.02)"
    fitted = AdaptiveLR(learning_rate=1e-3).fit()
    assert not hasattr(clone(fitted), "learning_rate_")  # clone keeps parameters only
    assert copy.deepcopy(fitted).learning_rate_ == 1e-3


@parametrize_with_checks([AdaptiveLR(learning_rate=1e-3)], legacy=False)
def test_scikit_learns_estimator_checks(estimator, check):
    check(estimator)


# ----- in a policy's fit ------------------------------------------------------------------
PROMPTS = ["the movie was", "the plot was", "the movie", "the plot"]


def says_good(prompts, completions):
    return np.array([float("good" in c.split()) for c in completions])


def lm_policy(cls=None, **kw):
    from _tiny import tiny_lm

    from prefopt import RLOOPolicy

    params = dict(
        model=tiny_lm(),
        k=4,
        batch_size=16,
        n_steps=6,
        max_new_tokens=6,
        missing_eos_reward=None,
        learning_rate=AdaptiveLR(learning_rate=1e-3, target=0.01),
        random_state=0,
        on_unhealthy="ignore",
    )
    params.update(kw)
    return (cls or RLOOPolicy)(**params)


def column(policy, key):
    return [row[key] for row in policy.history_]


def test_the_fit_sets_each_steps_rate_from_the_last_updates_measured_change():
    policy = lm_policy().fit(PROMPTS, says_good)
    rates, kls = column(policy, "optim/learning_rate"), column(policy, "optim/policy_kl")
    # the rate each step used is the controller's answer to the change the step before made
    replay = AdaptiveLR(learning_rate=1e-3, target=0.01).fit().sample(kls)
    assert rates == [1e-3, *replay[:-1].tolist()]
    assert column(policy, "charts/learning_rate") == rates  # what the optimiser used
    assert len(set(rates)) > 1 and min(kls) > 0  # it measured changes and moved the rate
    assert policy.lr_controller_.state_dict() == {
        "learning_rate_": replay[-1],
        "n_updates_": 6,
    }
    assert policy.learning_rate_ == 1e-3  # the starting rate
    assert not hasattr(policy.learning_rate, "learning_rate_")  # the parameter is untouched


def test_anneal_decays_the_rate_used_linearly_to_zero():
    lr = AdaptiveLR(learning_rate=1e-3, anneal=True).fit()
    assert [lr.rate_at(done) for done in (0.0, 0.25, 1.0)] == [1e-3, 7.5e-4, 0.0]
    assert AdaptiveLR(learning_rate=1e-3).fit().rate_at(0.5) == 1e-3  # off by default
    assert lr.learning_rate_ == 1e-3  # the adapted rate itself is not decayed
    with pytest.raises(ValueError, match=r"done must be in \[0, 1\]"):
        lr.rate_at(1.5)
    with pytest.raises(TypeError, match="anneal must be True or False"):
        AdaptiveLR(learning_rate=1e-3, anneal="yes").fit()


def test_an_annealed_fit_uses_the_adapted_rate_times_the_share_of_steps_left():
    rate = AdaptiveLR(learning_rate=1e-3, target=0.01, anneal=True)
    policy = lm_policy(learning_rate=rate).fit(PROMPTS, says_good)
    used, kls = column(policy, "optim/learning_rate"), column(policy, "optim/policy_kl")
    replay = AdaptiveLR(learning_rate=1e-3, target=0.01).fit().sample(kls)
    adapted = [1e-3, *replay[:-1]]  # the rule adapts the rate before the decay
    np.testing.assert_allclose(used, [a * (1 - i / 6) for i, a in enumerate(adapted)], rtol=1e-12)
    assert column(policy, "charts/learning_rate") == used  # what the optimiser used
    assert policy.lr_controller_.learning_rate_ == replay[-1]


def test_no_measured_change_leaves_the_fits_rate_alone():
    # GRPO on an all-zero reward: every advantage is 0, nothing moves, and the sampling
    # pass and the full pass agree to float rounding: no change, so no raise
    from prefopt import GRPOPolicy

    zero = lm_policy(GRPOPolicy, n_steps=3).fit(PROMPTS, lambda p, c: np.zeros(len(c)))
    assert column(zero, "optim/policy_kl") == [0.0] * 3
    assert column(zero, "optim/learning_rate") == [1e-3] * 3


def test_a_number_is_a_fixed_rate():
    policy = lm_policy(learning_rate=1e-3, lr_schedule="constant", n_steps=3)
    policy.fit(PROMPTS, says_good)
    assert policy.lr_controller_ is None
    assert column(policy, "charts/learning_rate") == [1e-3] * 3
    assert not any(key.startswith("optim/") for row in policy.history_ for key in row)


def test_without_a_starting_rate_it_starts_at_the_policys_default():
    # the tests' tiny GPT-2 is a tiny model: RLOO's tiny-model rate, inside the bounds
    from prefopt import RLOOPolicy

    policy = lm_policy(learning_rate=AdaptiveLR(target=0.01), n_steps=1).fit(PROMPTS, says_good)
    assert policy.learning_rate_ == RLOOPolicy.tiny_model_learning_rate
    assert column(policy, "optim/learning_rate") == [RLOOPolicy.tiny_model_learning_rate]


def test_a_resumed_run_continues_the_adapted_rate_exactly(tmp_path):
    whole = lm_policy().fit(PROMPTS, says_good)
    lm_policy(n_steps=3, checkpoint_dir=tmp_path).fit(PROMPTS, says_good)
    resumed = lm_policy(checkpoint_dir=tmp_path).fit(PROMPTS, says_good)  # steps 4-6
    for key in ("optim/learning_rate", "optim/policy_kl", "objective/reward"):
        assert column(resumed, key) == column(whole, key)
    assert resumed.lr_controller_.state_dict() == whole.lr_controller_.state_dict()


def test_the_controller_is_a_searchable_parameter_and_defines_the_run(tmp_path):
    policy = lm_policy()
    assert policy.get_params()["learning_rate__target"] == 0.01
    other = clone(policy).set_params(learning_rate__target=0.02)
    assert other.learning_rate.target == 0.02 and policy.learning_rate.target == 0.01
    # a clone writes to a sub-folder named by everything that defines its run
    folders = {
        run_folder(p.set_params(checkpoint_dir=tmp_path), "data") for p in (clone(policy), other)
    }
    assert len(folders) == 2
    # a checkpoint of one target is not resumed with another
    lm_policy(n_steps=2, checkpoint_dir=tmp_path).fit(PROMPTS, says_good)
    again = lm_policy(learning_rate=AdaptiveLR(learning_rate=1e-3, target=0.02))
    with pytest.raises(ValueError, match="learning_rate"):
        again.set_params(checkpoint_dir=tmp_path).fit(PROMPTS, says_good)


@pytest.mark.parametrize(
    "rate, match",
    [
        (-1e-3, "learning_rate"),
        (math.inf, "learning_rate"),
        (math.nan, "learning_rate"),
        (AdaptiveLR(target=0.0), "target must be a finite number > 0"),
        (AdaptiveLR(learning_rate=-1e-3), "learning_rate must be a finite number > 0"),
        (AdaptiveLR(min_lr=1e-2, max_lr=1e-6), "swap them"),
        (AdaptiveLR(learning_rate=0.5), r"outside \[min_lr, max_lr\]"),
    ],
)
def test_bad_rates_are_refused_before_training(rate, match):
    policy = lm_policy(learning_rate=rate, n_steps=1)
    with pytest.raises(ValueError, match=match):
        policy.fit(PROMPTS, says_good)
    assert not hasattr(policy, "n_iter_")  # nothing ran


# ----- the default ----------------------------------------------------------------------
RL_POLICIES = [
    "PPOPolicy",
    "RLOOPolicy",
    "GRPOPolicy",
    "ReinforcePolicy",
    "ReinforcePlusPlusPolicy",
    "RAFTPolicy",
]


@pytest.mark.parametrize("name", RL_POLICIES)
def test_the_default_on_a_language_model_is_the_adaptive_rate(name):
    import prefopt

    cls = getattr(prefopt, name)
    assert cls().get_params()["learning_rate"] is None  # the literal default
    params = {**lm_policy().get_params(deep=False), "learning_rate": None, "n_steps": 2}
    if "k" not in cls().get_params():  # PPO, REINFORCE: one sample a prompt
        del params["k"]
    policy = cls(**params).fit(PROMPTS, says_good)
    controller = policy.lr_controller_
    assert isinstance(controller, AdaptiveLR)
    # AdaptiveLR's rule at a target of 0.002 nats, started at the class's tiny-model rate,
    # its ceiling 10 times that; PPO's at 0.01, decayed linearly to 0 over the fit
    target, anneal = (0.01, True) if name == "PPOPolicy" else (0.002, False)
    start = cls.tiny_model_learning_rate
    default = AdaptiveLR(target=target, max_lr=10 * start, anneal=anneal)
    assert controller.get_params() == default.get_params()
    assert policy.learning_rate_ == cls.tiny_model_learning_rate
    rates, kls = column(policy, "optim/learning_rate"), column(policy, "optim/policy_kl")
    assert rates[0] == cls.tiny_model_learning_rate
    # the second of 2 steps: the adapted rate, times the half of the fit left when annealed
    adapted = default.start(start).sample(kls[:1])[0]
    assert rates[1] == pytest.approx(adapted * (0.5 if anneal else 1.0), rel=1e-12)
    # the health summary says where the rate went
    assert policy.health_["learning_rate"] == {
        "first": rates[0],
        "last": rates[-1],
        "min": min(rates),
        "max": max(rates),
    }
    assert policy.learning_rate is None  # the parameter is untouched


def test_the_default_on_a_log_linear_policy_stays_a_fixed_rate():
    # The exact worlds' log-linear policies keep their fixed 0.1 (over 0.99 of the
    # achievable objective in 100 steps: backend.default_learning_rate's table).
    from prefopt import RLOOPolicy
    from prefopt.worlds import PreferenceWorld

    world = PreferenceWorld(random_state=0)
    policy = RLOOPolicy(model=world.policy_model(), n_steps=2, random_state=0)
    policy.fit(world.prompts, world.true_quality)
    assert policy.lr_controller_ is None and policy.learning_rate_ == 0.1
    assert "learning_rate" not in policy.health_
    assert not any(key.startswith("optim/") for row in policy.history_ for key in row)


def test_a_resumed_run_at_the_default_rate_continues_it_exactly(tmp_path):
    whole = lm_policy(learning_rate=None).fit(PROMPTS, says_good)
    lm_policy(learning_rate=None, n_steps=3, checkpoint_dir=tmp_path).fit(PROMPTS, says_good)
    resumed = lm_policy(learning_rate=None, checkpoint_dir=tmp_path).fit(PROMPTS, says_good)
    assert len(set(column(whole, "optim/learning_rate"))) > 1  # the rate moved
    for key in ("optim/learning_rate", "optim/policy_kl", "objective/reward"):
        assert column(resumed, key) == column(whole, key)
    assert resumed.lr_controller_.state_dict() == whole.lr_controller_.state_dict()
    assert resumed.health_["learning_rate"] == whole.health_["learning_rate"]


def test_a_search_over_the_default_and_adaptive_rates(tmp_path):
    # A search clones each candidate: None, a fixed number and controllers alike; every
    # candidate's controller is its own (the grid's objects are never fitted).
    from prefopt import SeedSearchCV

    grid = [None, 1e-3, AdaptiveLR(target=0.03)]
    search = SeedSearchCV(
        lm_policy(n_steps=2),
        {"learning_rate": grid},
        seeds=2,
        refit=False,
        scoring=lambda est, X, y=None: float(est.history_[-1]["objective/reward"]),
    ).fit(PROMPTS, reward_model=says_good)
    assert list(search.cv_results_["param_learning_rate"]) == grid
    assert not hasattr(grid[2], "learning_rate_")
    # ... and a checkpointed clone of each writes its own folder
    folders = {
        run_folder(clone(lm_policy(learning_rate=r)).set_params(checkpoint_dir=tmp_path), "d")
        for r in (None, AdaptiveLR(), AdaptiveLR(target=0.03), 1e-3)
    }
    assert len(folders) == 4


def test_a_resumed_ppo_run_continues_its_annealed_default_rate_exactly(tmp_path):
    # PPO's default decays the adapted rate over the fit's steps: a run stopped after step 3
    # and resumed continues both the adapted rate and the decay of the whole 6-step fit
    from prefopt import PPOPolicy

    def ppo(**kw):
        params = {**lm_policy().get_params(deep=False), "learning_rate": None, **kw}
        del params["k"]  # one sample a prompt
        return PPOPolicy(**params)

    whole = ppo().fit(PROMPTS, says_good)

    def stop_after_3(policy, row):
        if row["step"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ppo(checkpoint_dir=tmp_path).fit(PROMPTS, says_good, callback=stop_after_3)
    resumed = ppo(checkpoint_dir=tmp_path).fit(PROMPTS, says_good)  # steps 4-6
    assert whole.lr_controller_.anneal  # PPO's default
    assert [row["step"] for row in resumed.history_] == [1, 2, 3, 4, 5, 6]
    for key in ("optim/learning_rate", "optim/policy_kl", "objective/reward"):
        assert column(resumed, key) == column(whole, key)
    assert resumed.lr_controller_.state_dict() == whole.lr_controller_.state_dict()
