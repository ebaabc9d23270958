"""KL controllers and per-token KL estimators against hand-computed numbers.

Formulas: the adaptive controller of Ziegler et al. 2019 and the estimators k1, k2, k3 of
Schulman 2020 ("Approximating KL Divergence").
"""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from prefopt import AdaptiveKLController, FixedKLController, kl_estimate

# ---------------------------------------------------------------------------
# AdaptiveKLController: beta_{t+1} = beta_t * (1 + K * clip((KL - target)/target, -0.2, 0.2))
# ---------------------------------------------------------------------------


def test_adaptive_error_outside_clip_moves_beta_two_percent():
    # (12 - 6) / 6 = 1.0, clipped to 0.2; K = 0.1: beta * (1 + 0.02) = 0.1 * 1.02 = 0.102
    kl = AdaptiveKLController(beta=0.1, target=6.0).start()
    assert kl.update(12.0) == pytest.approx(0.102, abs=1e-12)
    # (0 - 6) / 6 = -1.0, clipped to -0.2: 0.102 * 0.98 = 0.09996
    assert kl.update(0.0) == pytest.approx(0.09996, abs=1e-12)
    assert kl.beta_ == pytest.approx(0.09996, abs=1e-12)
    assert kl.n_updates_ == 2


def test_adaptive_error_inside_clip():
    # (6.3 - 6) / 6 = 0.05: 0.1 * (1 + 0.1 * 0.05) = 0.1 * 1.005 = 0.1005
    kl = AdaptiveKLController(beta=0.1, target=6.0).start()
    assert kl.update(6.3) == pytest.approx(0.1005, abs=1e-12)
    # (5.4 - 6) / 6 = -0.1: 0.1005 * 0.99 = 0.099495
    assert kl.update(5.4) == pytest.approx(0.099495, abs=1e-12)
    # KL exactly on target: error 0, beta unchanged
    assert kl.update(6.0) == pytest.approx(0.099495, abs=1e-12)


def test_adaptive_negative_kl_is_clipped():
    # k1 sums can be negative: (-3 - 6)/6 = -1.5 -> -0.2: 0.5 * 0.98 = 0.49
    kl = AdaptiveKLController(beta=0.5, target=6.0).start()
    assert kl.update(-3.0) == pytest.approx(0.49, abs=1e-12)


def test_adaptive_several_steps_in_a_row():
    # errors +0.2 (clipped), +0.1, -0.1, -0.2 (clipped):
    # 0.1 * 1.02 * 1.01 * 0.99 * 0.98 = 0.102 * 1.01 = 0.10302; * 0.99 = 0.1019898;
    # * 0.98 = 0.099950004
    kl = AdaptiveKLController(beta=0.1, target=6.0).start()
    for value in [100.0, 6.6, 5.4, 0.0]:
        kl.update(value)
    assert kl.beta_ == pytest.approx(0.099950004, abs=1e-12)
    assert kl.n_updates_ == 4


def test_adaptive_beta_after_n_updates_above_target():
    # Ten clipped steps up: 0.1 * 1.02**10 = 0.1 * 1.2189944199947573 = 0.12189944...
    kl = AdaptiveKLController(beta=0.1, target=6.0).start()
    for _ in range(10):
        kl.update(1e6)
    assert kl.beta_ == pytest.approx(0.12189944199947573, rel=1e-12)
    # ... and ten clipped steps down: 0.1 * (1.02 * 0.98)**10 = 0.1 * 0.9996**10
    # = 0.1 * 0.99600719 = 0.0996007192 (not back to 0.1: the controller is multiplicative)
    for _ in range(10):
        kl.update(0.0)
    assert kl.beta_ == pytest.approx(0.1 * 1.02**10 * 0.98**10, rel=1e-12)
    assert kl.beta_ == pytest.approx(0.0996007192, rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(st.floats(min_value=-1e9, max_value=1e12, allow_nan=False, allow_infinity=False))
def test_adaptive_default_moves_at_most_two_percent(value):
    kl = AdaptiveKLController(beta=0.3, target=6.0).start()
    new = kl.update(value)
    assert 0.3 * 0.98 - 1e-15 <= new <= 0.3 * 1.02 + 1e-15


def test_adaptive_horizon_gain_is_episodes_over_horizon():
    # K = 512 / 10000 = 0.0512; error (3 - 6)/6 = -0.5 -> -0.2:
    # 0.1 * (1 - 0.0512 * 0.2) = 0.1 * 0.98976 = 0.098976
    kl = AdaptiveKLController(beta=0.1, target=6.0, horizon=10000).start()
    assert kl.update(3.0, n_episodes=512) == pytest.approx(0.098976, abs=1e-12)
    # error inside the clip: (6.6 - 6)/6 = 0.1 -> 0.098976 * (1 + 0.00512) = 0.09948275712
    assert kl.update(6.6, n_episodes=512) == pytest.approx(0.09948275712, abs=1e-12)


def test_adaptive_horizon_paper_batch():
    # The paper's batch of 1024: K = 0.1024; clipped +0.2: 0.15 * (1 + 0.02048) = 0.153072
    kl = AdaptiveKLController(beta=0.15, target=6.0, horizon=10000).start()
    assert kl.update(50.0, n_episodes=1024) == pytest.approx(0.153072, abs=1e-12)


def test_adaptive_custom_gain_and_clip():
    # gain 0.5, clip 0.5: (9 - 6)/6 = 0.5 -> 0.2 * (1 + 0.25) = 0.25
    kl = AdaptiveKLController(beta=0.2, target=6.0, gain=0.5, clip=0.5).start()
    assert kl.update(9.0) == pytest.approx(0.25, abs=1e-12)
    # (30 - 6)/6 = 4 -> clipped to 0.5: 0.25 * 1.25 = 0.3125
    assert kl.update(30.0) == pytest.approx(0.3125, abs=1e-12)


def test_adaptive_n_episodes_ignored_without_horizon():
    # Without horizon K stays 0.1 whatever n_episodes is: 0.1 * 1.02 = 0.102
    kl = AdaptiveKLController(beta=0.1, target=6.0).start()
    assert kl.update(100.0, n_episodes=512) == pytest.approx(0.102, abs=1e-12)


def test_controller_takes_policy_beta_through_start():
    kl = AdaptiveKLController(target=6.0).start(0.05)
    assert kl.beta_ == 0.05
    assert kl.beta is None  # the parameter is not touched
    assert kl.update(100.0) == pytest.approx(0.051, abs=1e-12)  # 0.05 * 1.02
    # The controller's own beta wins over the policy's.
    assert AdaptiveKLController(beta=0.2).start(0.05).beta_ == 0.2
    assert FixedKLController().start(0.07).beta_ == 0.07
    assert FixedKLController(beta=0.3).start(0.07).beta_ == 0.3


def test_start_resets_the_controller():
    kl = AdaptiveKLController(beta=0.1).start()
    kl.update(100.0)
    kl.update(100.0)
    kl.start()
    assert kl.beta_ == 0.1
    assert kl.n_updates_ == 0


def test_controller_without_any_beta_raises():
    with pytest.raises(ValueError, match="needs a starting beta"):
        AdaptiveKLController().start()
    with pytest.raises(ValueError, match="needs a starting beta"):
        FixedKLController().start(None)


@pytest.mark.parametrize("target", [0.0, -1.0])
def test_adaptive_target_must_be_positive(target):
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(beta=0.1, target=target).start()


def test_negative_beta_raises():
    with pytest.raises(ValueError, match="beta"):
        AdaptiveKLController(beta=-0.1).start()
    with pytest.raises(ValueError, match="beta"):
        FixedKLController(beta=-0.1).start()
    with pytest.raises(ValueError, match="beta must be >= 0"):
        AdaptiveKLController().start(-0.5)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        FixedKLController().start(-0.5)


def test_horizon_without_n_episodes_raises_and_leaves_beta():
    kl = AdaptiveKLController(beta=0.1, horizon=10000).start()
    with pytest.raises(ValueError, match="n_episodes"):
        kl.update(100.0)
    assert kl.beta_ == 0.1
    assert kl.n_updates_ == 0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_kl_raises_and_leaves_beta(value):
    kl = AdaptiveKLController(beta=0.1).start()
    with pytest.raises(ValueError, match="finite"):
        kl.update(value)
    assert kl.beta_ == 0.1
    assert kl.n_updates_ == 0


def test_update_before_start_raises():
    with pytest.raises(NotFittedError):
        AdaptiveKLController(beta=0.1).update(1.0)
    with pytest.raises(NotFittedError):
        FixedKLController(beta=0.1).update(1.0)


def test_fixed_controller_never_moves():
    kl = FixedKLController(beta=0.05).start()
    for value in [0.0, 6.0, 100.0, -5.0, 1e9]:
        assert kl.update(value, n_episodes=64) == 0.05
    assert kl.beta_ == 0.05
    assert kl.n_updates_ == 5


def test_fit_is_start():
    kl = AdaptiveKLController(beta=0.1).fit()
    assert kl.beta_ == 0.1 and kl.n_updates_ == 0
    assert FixedKLController(beta=0.2).fit(None).beta_ == 0.2


def test_controllers_are_sklearn_estimators():
    kl = AdaptiveKLController(beta=0.1, target=3.0, horizon=10000).start()
    kl.update(100.0, n_episodes=512)
    assert kl.get_params() == {
        "beta": 0.1,
        "target": 3.0,
        "gain": 0.1,
        "horizon": 10000,
        "clip": 0.2,
    }
    copy = clone(kl)
    assert copy.get_params() == kl.get_params()
    assert not hasattr(copy, "beta_") and not hasattr(copy, "n_updates_")
    assert repr(kl) == "AdaptiveKLController(beta=0.1, horizon=10000, target=3.0)"
    assert repr(AdaptiveKLController()) == "AdaptiveKLController()"

    fixed = FixedKLController(beta=0.05).start()
    assert fixed.get_params() == {"beta": 0.05}
    assert clone(fixed).get_params() == {"beta": 0.05}
    assert not hasattr(clone(fixed), "beta_")
    assert repr(fixed) == "FixedKLController(beta=0.05)"

    kl.set_params(target=8.0)
    assert kl.target == 8.0


# ---------------------------------------------------------------------------
# Per-token estimators, log r = log pi_ref - log pi
# ---------------------------------------------------------------------------


def test_kl_estimators_hand_values():
    logprobs = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-2.0, -1.0, -0.5], dtype=torch.float64)
    # log r = [-1, 1, 0]
    # k1 = -log r = [1, -1, 0]
    # k2 = (log r)^2 / 2 = [0.5, 0.5, 0]
    # k3 = (r - 1) - log r = [e^-1 - 1 + 1, e - 1 - 1, 0] = [0.36787944, 0.71828183, 0]
    torch.testing.assert_close(
        kl_estimate(logprobs, ref, "k1"), torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    )
    torch.testing.assert_close(
        kl_estimate(logprobs, ref, "k2"), torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    )
    torch.testing.assert_close(
        kl_estimate(logprobs, ref, "k3"),
        torch.tensor([0.36787944117144233, 0.7182818284590451, 0.0], dtype=torch.float64),
    )
    # default is k1
    torch.testing.assert_close(kl_estimate(logprobs, ref), kl_estimate(logprobs, ref, "k1"))


def test_kl_estimators_on_a_2d_batch_keep_shape_and_dtype():
    logprobs = torch.log(torch.tensor([[0.5, 0.25], [0.1, 1.0]]))
    ref = torch.log(torch.tensor([[0.25, 0.25], [0.2, 0.5]]))
    # k1 = log(pi / ref) = [[ln 2, 0], [ln 0.5, ln 2]]
    out = kl_estimate(logprobs, ref, "k1")
    assert out.shape == (2, 2) and out.dtype == torch.float32
    torch.testing.assert_close(
        out, torch.tensor([[math.log(2), 0.0], [math.log(0.5), math.log(2)]])
    )
    # k3 with r = ref/pi = [[0.5, 1], [2, 0.5]]: (r - 1) - ln r
    # = [[-0.5 + ln 2, 0], [1 - ln 2, -0.5 + ln 2]] = [[0.19314718, 0], [0.30685282, 0.19314718]]
    torch.testing.assert_close(
        kl_estimate(logprobs, ref, "k3"),
        torch.tensor([[0.19314718, 0.0], [0.30685282, 0.19314718]]),
    )


def test_kl_estimators_numpy_in_numpy_out():
    out = kl_estimate(np.array([-1.0, -2.0]), np.array([-2.0, -1.0]), "k2")
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, [0.5, 0.5])
    out = kl_estimate([-1.0], [-2.0], "k1")  # plain lists too
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, [1.0])
    out = kl_estimate(np.array([-1.0]), np.array([-2.0]), "k3")
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, [math.exp(-1)])


def test_kl_estimate_unknown_kind():
    with pytest.raises(ValueError, match="k1"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")


def test_k2_and_k3_never_negative():
    g = torch.Generator().manual_seed(0)
    logprobs = torch.randn(2000, generator=g, dtype=torch.float64) * 5
    ref = torch.randn(2000, generator=g, dtype=torch.float64) * 5
    # include exact ties and tiny differences, where rounding could go below 0
    logprobs = torch.cat([logprobs, torch.tensor([-1.0, -1.0, -3.0, -30.0], dtype=torch.float64)])
    ref = torch.cat(
        [ref, torch.tensor([-1.0, -1.0 + 1e-12, -3.0 - 1e-9, -1e-3], dtype=torch.float64)]
    )
    assert (kl_estimate(logprobs, ref, "k2") >= 0).all()
    assert (kl_estimate(logprobs, ref, "k3") >= 0).all()
    assert (kl_estimate(logprobs.float(), ref.float(), "k3") >= 0).all()
    # k1 is negative where ref > pi (about half the tokens here)
    assert (kl_estimate(logprobs, ref, "k1") < 0).any()


@settings(max_examples=50, deadline=None)
@given(st.floats(-50, 50), st.floats(-50, 50))
def test_k2_k3_nonnegative_fuzz(a, b):
    lp, ref = torch.tensor([a], dtype=torch.float64), torch.tensor([b], dtype=torch.float64)
    assert kl_estimate(lp, ref, "k2").item() >= 0
    assert kl_estimate(lp, ref, "k3").item() >= 0


def test_k1_k3_unbiased_k2_biased_exact_expectation():
    # q = [0.5, 0.3, 0.2] (sampler, the policy), p = [0.2, 0.5, 0.3] (reference).
    # KL(q||p) = 0.5 ln 2.5 + 0.3 ln 0.6 + 0.2 ln(2/3)
    #          = 0.458145 - 0.153248 - 0.081093 = 0.2238047
    # E_q[k2] = 0.5 * (0.5 * 0.916291^2 + 0.3 * 0.510826^2 + 0.2 * 0.405465^2) = 0.2654788
    q = np.array([0.5, 0.3, 0.2])
    p = np.array([0.2, 0.5, 0.3])
    true_kl = 0.2238046571856474
    assert float(np.sum(q * np.log(q / p))) == pytest.approx(true_kl, abs=1e-12)
    logq, logp = np.log(q), np.log(p)
    for kind in ("k1", "k3"):
        expectation = float(np.sum(q * kl_estimate(logq, logp, kind)))
        assert expectation == pytest.approx(true_kl, abs=1e-12), kind
    e_k2 = float(np.sum(q * kl_estimate(logq, logp, "k2")))
    assert e_k2 == pytest.approx(0.2654787944033222, abs=1e-12)
    assert abs(e_k2 - true_kl) > 0.04


def test_k3_unbiased_on_a_second_pair():
    # q = [0.9, 0.1], p = [0.5, 0.5]: KL = 0.9 ln 1.8 + 0.1 ln 0.2 = 0.529009 - 0.160944 = 0.368064
    q = torch.tensor([0.9, 0.1], dtype=torch.float64)
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    true_kl = 0.9 * math.log(1.8) + 0.1 * math.log(0.2)
    assert true_kl == pytest.approx(0.3680642071684971, abs=1e-12)
    for kind in ("k1", "k3"):
        assert float((q * kl_estimate(q.log(), p.log(), kind)).sum()) == pytest.approx(
            true_kl, abs=1e-12
        )
    # k2: 0.5 * (0.9 * ln(1.8)^2 + 0.1 * ln(0.2)^2) = 0.5 * (0.311046 + 0.259029) = 0.285037
    assert float((q * kl_estimate(q.log(), p.log(), "k2")).sum()) == pytest.approx(
        0.5 * (0.9 * math.log(1.8) ** 2 + 0.1 * math.log(0.2) ** 2), abs=1e-12
    )
    assert float((q * kl_estimate(q.log(), p.log(), "k2")).sum()) != pytest.approx(
        true_kl, abs=1e-3
    )


# ---------------------------------------------------------------------------
# Extreme gains: beta never reaches exactly 0, and a wrong-signed batch size is refused
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{"gain": 1e4}, {"horizon": 1e-3}])
def test_extreme_gain_keeps_beta_positive_and_able_to_recover(params):
    kl = AdaptiveKLController(beta=0.5, target=2.0, **params).start()
    with pytest.warns(RuntimeWarning, match="zero or negative"):
        low = kl.update(0.0, n_episodes=8)  # exp(-2000) or exp(-1600) underflows to 0
    assert low == np.finfo(np.float64).tiny
    low_again = kl.update(0.0, n_episodes=8)  # no further down than the floor
    assert low_again == low
    # Over target the linear step multiplies by 1 + K * 0.2 > 1: beta grows again.
    up = kl.update(4.0, n_episodes=8)
    k = 1e4 if "gain" in params else 8 / 1e-3
    assert up == pytest.approx(low * (1 + k * 0.2), rel=1e-12) and up > low


@pytest.mark.parametrize("n_episodes", [-64, -0.5])
def test_negative_n_episodes_refused(n_episodes):
    kl = AdaptiveKLController(beta=0.2, target=6.0, horizon=100).start()
    with pytest.raises(ValueError, match=rf"n_episodes must be >= 0.*{n_episodes}"):
        kl.update(9.0, n_episodes=n_episodes)
    assert kl.beta_ == 0.2 and kl.n_updates_ == 0  # nothing moved
    with pytest.raises(TypeError, match="n_episodes must be a number.*'64'"):
        kl.update(9.0, n_episodes="64")
    # Zero episodes is a legitimate empty batch: K = 0, beta unchanged.
    assert kl.update(9.0, n_episodes=0) == 0.2
    # Refused with a fixed gain too, where it would not move beta: it is still wrong input.
    with pytest.raises(ValueError, match="n_episodes must be >= 0"):
        AdaptiveKLController(beta=0.2).start().update(9.0, n_episodes=-1)


@pytest.mark.parametrize("gain", [1e-300, 0.1, 1e5, 1e308, np.finfo(float).max])
@pytest.mark.parametrize("horizon", [None, 1e-300, 1e300])
def test_adaptive_controller_stays_finite_for_any_finite_setting(gain, horizon):
    # Ours beside the gain and horizon: a tiny or huge target, a huge clip, and KLs
    # of every size and sign, in sequence (a beta pushed to a bound must come back).
    for target, clip in ((6.0, 0.2), (1e-300, 0.2), (np.finfo(float).max, 1e308)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the told switch to log space
            kl = AdaptiveKLController(beta=0.1, target=target, gain=gain, horizon=horizon)
            kl.set_params(clip=clip).start()
            betas = [kl.update(v, n_episodes=64) for v in (1e300, 0.0, -1e300, 6.0, 12.0, 0.0)]
        assert all(np.isfinite(b) and 0 < b <= 1e30 for b in betas), (target, clip, betas)


@pytest.mark.parametrize(
    "params", [{"gain": np.inf}, {"horizon": np.inf}, {"clip": np.inf}, {"beta": np.inf}]
)
def test_a_controller_setting_that_is_not_finite_is_refused(params):
    with pytest.raises(ValueError, match="finite"):
        AdaptiveKLController(**{"beta": 0.1, **params}).start()
    with pytest.raises(ValueError, match="FixedKLController: beta=inf must be finite"):
        FixedKLController(beta=np.inf).start()
    with pytest.raises(ValueError, match="FixedKLController: beta=inf must be finite"):
        FixedKLController().start(beta=np.inf)  # the policy's beta
