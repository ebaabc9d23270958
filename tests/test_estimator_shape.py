"""The estimator shape: KL controllers and the reward model each have fit, score and sample.

Controllers: ``sample(kls)`` is the beta path of step-by-step ``update`` calls on a copy,
``score(kls)`` ranks a KL sequence that holds the aim above one that drifts, with hand
numbers for both scores. Reward model: ``sample`` draws Bradley-Terry labels, checked by
their frequencies against sigmoid(r_a - r_b).
"""

import copy

import numpy as np
import pytest
from scipy.special import expit
from sklearn.exceptions import NotFittedError

import prefopt
from prefopt import AdaptiveKLController, FixedKLController, KLController, PPOPolicy, RewardModel
from prefopt.validation import validate_params

KLS = [0.5, 7.0, 12.0, 6.0, 2.0, 6.5, 30.0, 0.0]  # on, above, below target 6; clipped both ways

CONTROLLERS = {
    "fixed": lambda: FixedKLController(beta=0.05),
    "adaptive": lambda: AdaptiveKLController(beta=0.1, target=6.0),
    "adaptive-gain": lambda: AdaptiveKLController(beta=0.2, target=6.0, gain=0.5, clip=0.5),
    "adaptive-horizon": lambda: AdaptiveKLController(beta=0.1, target=6.0, horizon=1000),
}


# ----- KLController, the public base --------------------------------------------------------


def test_kl_controller_is_public_base():
    assert prefopt.KLController is KLController is prefopt.kl.KLController
    assert "KLController" in prefopt.__all__ and "KLController" in prefopt.kl.__all__
    assert issubclass(FixedKLController, KLController)
    assert issubclass(AdaptiveKLController, KLController)
    assert prefopt.kl._KLController is KLController  # the old private name still resolves


class HalvingKL(KLController):
    """A user's controller: beta halves at every step whatever the KL."""

    def __init__(self, *, beta=None):
        self.beta = beta

    def update(self, kl, n_episodes=None):
        self.beta_ /= 2
        self.n_updates_ += 1
        return self.beta_


def test_user_subclass_gets_sample_and_score_and_is_a_valid_kl_parameter():
    kl = HalvingKL(beta=1.0).fit()
    np.testing.assert_allclose(kl.sample([3.0, 3.0, 3.0]), [0.5, 0.25, 0.125])
    assert kl.beta_ == 1.0
    # Base score: minus the standard deviation; [1, 3]: mean 2, deviations 1 -> std 1.
    assert kl.score([1.0, 3.0]) == pytest.approx(-1.0)
    validate_params(PPOPolicy(kl=HalvingKL(beta=0.1)))  # the policies' constraint accepts it


def test_base_update_says_what_is_missing():
    class NoUpdate(KLController):
        def __init__(self, *, beta=None):
            self.beta = beta

    with pytest.raises(NotImplementedError, match="NoUpdate must define update"):
        NoUpdate(beta=0.1).fit().update(1.0)


# ----- sample --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONTROLLERS)
def test_sample_equals_step_by_step_updates_on_a_fresh_copy(name):
    kl = CONTROLLERS[name]().fit()
    kl.update(9.0, n_episodes=64)  # sample starts from the current state, not from fit
    before = (kl.beta_, kl.n_updates_)
    fresh = copy.deepcopy(kl)
    expected = [fresh.update(value, n_episodes=64) for value in KLS]

    path = kl.sample(KLS, n_episodes=64)

    assert isinstance(path, np.ndarray) and path.shape == (len(KLS),)
    np.testing.assert_allclose(path, expected, rtol=0, atol=1e-15)
    assert (kl.beta_, kl.n_updates_) == before  # the fitted controller did not move
    np.testing.assert_allclose(kl.sample(KLS, n_episodes=64), path, rtol=0, atol=0)


def test_sample_hand_numbers():
    # beta * (1 + 0.1 * clip((KL - 6) / 6, -0.2, 0.2)):
    # 12 -> +0.2: 0.1 * 1.02 = 0.102; 6 -> 0: 0.102; 3 -> -0.2: 0.102 * 0.98 = 0.09996
    kl = AdaptiveKLController(beta=0.1, target=6.0).fit()
    np.testing.assert_allclose(kl.sample([12.0, 6.0, 3.0]), [0.102, 0.102, 0.09996], atol=1e-15)


def test_sample_takes_episodes_per_step():
    # K = n / 1000 per step; errors +0.2 (KL 12) each time:
    # 0.1 * (1 + 0.1 * 0.2) = 0.102, then 0.102 * (1 + 0.5 * 0.2) = 0.1122
    kl = AdaptiveKLController(beta=0.1, target=6.0, horizon=1000).fit()
    np.testing.assert_allclose(
        kl.sample([12.0, 12.0], n_episodes=[100, 500]), [0.102, 0.1122], atol=1e-15
    )
    with pytest.raises(ValueError, match="2 KLs and 3 n_episodes"):
        kl.sample([12.0, 12.0], n_episodes=[1, 2, 3])
    with pytest.raises(ValueError, match="needs n_episodes"):
        kl.sample([12.0])


# ----- score ---------------------------------------------------------------------------------


def test_adaptive_score_ranks_on_target_above_drifting():
    kl = AdaptiveKLController(beta=0.1, target=6.0).fit()
    steady = [6.0, 6.2, 5.9, 6.1, 6.0]
    drifting = [6.0, 7.5, 9.0, 10.5, 12.0]
    assert kl.score(steady) > kl.score(drifting)
    assert kl.score([6.0] * 5) == 0.0  # the best
    # Hand numbers: |KL - 6| / 6 for [6, 7.5, 9, 10.5, 12] = [0, .25, .5, .75, 1]; mean 0.5.
    assert kl.score(drifting) == pytest.approx(-0.5)
    # Below target counts as much as above: [3, 9] are both 1/2 off.
    assert kl.score([3.0, 9.0]) == pytest.approx(-0.5)
    # Zero and slightly negative KLs (k1 near the reference) are scored, not refused.
    assert kl.score([0.0, -0.06]) == pytest.approx(-(1.0 + 1.01) / 2)


def test_fixed_score_ranks_steady_above_drifting():
    kl = FixedKLController(beta=0.05).fit()
    steady = [3.0, 3.1, 2.9, 3.0]
    drifting = [3.0, 6.0, 9.0, 12.0]
    assert kl.score(steady) > kl.score(drifting)
    # Hand numbers: [3, 6, 9, 12] has mean 7.5, squared deviations 20.25, 2.25, 2.25, 20.25,
    # variance 11.25 (ddof 0).
    assert kl.score(drifting) == pytest.approx(-np.sqrt(11.25))
    assert kl.score([40.0] * 4) == 0.0  # steady at any level is the best a fixed beta can do
    assert FixedKLController(beta=3.0).fit().score(drifting) == kl.score(drifting)


@pytest.mark.parametrize("name", ["fixed", "adaptive"])
def test_score_and_sample_check_their_input(name):
    kl = CONTROLLERS[name]()
    with pytest.raises(NotFittedError):
        kl.score([1.0])
    with pytest.raises(NotFittedError):
        kl.sample([1.0])
    kl.fit()
    for method in (kl.score, kl.sample):
        with pytest.raises(ValueError, match=r"KL at step 2 is nan"):
            method([1.0, 2.0, float("nan")])
        with pytest.raises(ValueError, match="1-D sequence of at least one KL"):
            method([])
        with pytest.raises(ValueError, match="1-D sequence"):
            method([[1.0, 2.0]])


# ----- RewardModel.sample --------------------------------------------------------------------

PAIRS = [(0, 1), (0, 2), (2, 4), (3, 5), (5, 0)]  # P(a preferred) from about 0.08 to 0.87


def _pairs(world, repeats):
    prompts, a, b = [], [], []
    for i, j in PAIRS:
        prompts += [world.prompts[0]] * repeats
        a += [world.responses[i]] * repeats
        b += [world.responses[j]] * repeats
    return prompts, a, b


def test_reward_model_sample_frequencies_follow_bradley_terry(world, rm):
    n = 4000
    prompts, a, b = _pairs(world, n)
    labels = rm.sample(prompts, a, b, random_state=0)
    assert labels.shape == (len(PAIRS) * n,) and labels.dtype.kind == "i"
    assert set(np.unique(labels)) <= {0, 1}

    p_a = expit(rm.predict(prompts, a) - rm.predict(prompts, b)).reshape(len(PAIRS), n)[:, 0]
    assert p_a.min() < 0.2 and p_a.max() > 0.8  # a swapped label would be far off
    freq_a = (labels.reshape(len(PAIRS), n) == 0).mean(axis=1)
    # freq_a ~ Binomial(n, p) / n, std sqrt(p (1 - p) / n) <= 0.008 at n = 4000. At 4.5
    # std a correct sampler fails with probability under 7e-6 per pair, 4e-5 for all five,
    # whatever the seed; a sampler off by 0.04 in any pair is caught.
    tolerance = 4.5 * np.sqrt(p_a * (1 - p_a) / n)
    np.testing.assert_array_less(np.abs(freq_a - p_a), tolerance)


def test_reward_model_sample_is_reproducible(world, rm):
    prompts, a, b = _pairs(world, 50)
    first = rm.sample(prompts, a, b, random_state=7)
    np.testing.assert_array_equal(rm.sample(prompts, a, b, random_state=7), first)
    assert not np.array_equal(rm.sample(prompts, a, b, random_state=8), first)
    # None takes the model's own random_state, as the worlds' raters take the world's.
    seeded = RewardModel(random_state=7).fit(world.comparisons(1000, random_state=0))
    np.testing.assert_array_equal(seeded.sample(prompts, a, b), first)


def test_reward_model_sample_checks_its_input(world, rm):
    p, r = world.prompts[0], world.responses[0]
    with pytest.raises(NotFittedError):
        RewardModel().sample([p], [r], [r])
    with pytest.raises(ValueError, match="2 prompts, 2 completions_a and 1 completions_b"):
        rm.sample([p, p], [r, r], [r])
    with pytest.raises(TypeError, match="not one string"):
        rm.sample([p], r, [r])
    assert rm.sample([], [], [], random_state=0).shape == (0,)
