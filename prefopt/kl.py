"""KL controllers and per-token KL estimators.

The KL term keeps the policy where the reward model is valid; without it the
policy writes gibberish (Ziegler et al. 2019). Its coefficient beta is either fixed or
steered towards a target KL by the log-space proportional controller of
Ziegler et al. (2019).
"""

from __future__ import annotations

import copy
import warnings
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from .validation import Interval, validate_params

__all__ = ["KLController", "FixedKLController", "AdaptiveKLController", "kl_estimate"]


def kl_estimate(logprobs, ref_logprobs, kind: str = "k1"):
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi.

    With ``log r = log pi_ref(y_t) - log pi(y_t)`` (Schulman, 2020):

    * ``"k1"`` = -log r: unbiased, high variance, negative for about half the
      tokens; the estimator placed in the reward by PPO and RLOO;
    * ``"k2"`` = (log r)^2 / 2: biased, low variance, never negative;
    * ``"k3"`` = (r - 1) - log r: unbiased, low variance, never negative; the
      estimator GRPO places in the loss.

    Parameters
    ----------
    logprobs, ref_logprobs : torch.Tensor or array-like
        Log-probabilities of the sampled tokens under the policy and reference.
    kind : {"k1", "k2", "k3"}, default="k1"

    Returns
    -------
    kl : same type as the inputs

    References
    ----------
    J. Schulman, "Approximating KL Divergence", 2020.

    Examples
    --------
    >>> import torch
    >>> kl_estimate(torch.tensor([-1.0]), torch.tensor([-2.0]), "k1")
    tensor([1.])
    >>> kl_estimate(torch.tensor([-1.0]), torch.tensor([-2.0]), "k2")
    tensor([0.5000])
    """
    is_tensor = isinstance(logprobs, torch.Tensor)
    lp = logprobs if is_tensor else torch.as_tensor(np.asarray(logprobs, dtype=float))
    ref = (
        ref_logprobs
        if isinstance(ref_logprobs, torch.Tensor)
        else torch.as_tensor(np.asarray(ref_logprobs, dtype=float))
    )
    log_r = ref - lp
    if kind == "k1":
        out = -log_r
    elif kind == "k2":
        out = 0.5 * log_r**2
    elif kind == "k3":
        out = torch.expm1(log_r) - log_r
    else:
        raise ValueError(f"kind must be 'k1', 'k2' or 'k3'; got {kind!r}.")
    return out if is_tensor else out.numpy()


class KLController(BaseEstimator):
    """Base class of the KL controllers: what a policy's ``kl=`` parameter accepts.

    A controller holds the KL coefficient ``beta_`` of the reward
    ``r - beta * KL(pi || pi_ref)``. ``fit`` (or ``start``, which the policies call with
    their own ``beta``) sets it; after each policy update the loop calls
    ``update(kl, n_episodes)`` with the mean summed KL of the rollouts just collected and
    uses the beta it returns. ``sample`` replays a sequence of KLs on a copy and returns the
    beta path; ``score`` says how well a sequence of KLs kept to the controller's aim.

    A subclass takes a ``beta`` parameter (the starting coefficient, ``None`` for the
    policy's) and supplies ``update``; it may override ``score``.

    Attributes
    ----------
    beta_ : float
        The coefficient in use.
    n_updates_ : int
        Updates made since ``start``.

    See Also
    --------
    FixedKLController, AdaptiveKLController

    Examples
    --------
    >>> from prefopt import AdaptiveKLController, KLController
    >>> kl = AdaptiveKLController(beta=0.1, target=6.0).fit()
    >>> isinstance(kl, KLController)
    True
    >>> kl.sample([12.0, 12.0]).round(6)   # beta after each update; kl is unchanged
    array([0.102  , 0.10404])
    >>> kl.beta_
    0.1
    """

    _parameter_constraints = {"beta": [Interval(Real, 0, None, closed="left"), None]}

    def start(self, beta: float | None = None):
        """Set the starting coefficient ``beta_`` and return ``self``.

        Parameters
        ----------
        beta : float, default=None
            Used when the controller's own ``beta`` is None (the policy passes
            its ``beta`` here).
        """
        validate_params(self)
        start = self.beta if self.beta is not None else beta
        if start is None:
            raise ValueError(
                f"{type(self).__name__} needs a starting beta: set beta=... "
                "on the controller or on the policy."
            )
        if start < 0:
            raise ValueError(f"beta must be >= 0; got {start!r}.")
        for name, value in {**self.get_params(deep=False), "beta": start}.items():
            if isinstance(value, Real) and not np.isfinite(value):  # beta would be inf or nan
                raise ValueError(f"{type(self).__name__}: {name}={value!r} must be finite.")
        self.beta_ = float(start)
        self.n_updates_ = 0
        return self

    def fit(self, X=None, y=None):
        """Start the controller at its own ``beta`` (the estimator interface).

        Parameters
        ----------
        X : None
            Ignored; a controller takes no data.
        y : None
            Ignored.

        Returns
        -------
        self : object
        """
        return self.start()

    def update(self, kl: float, n_episodes: int | None = None) -> float:
        """Move beta after one policy update and return the new value (subclasses say how).

        Parameters
        ----------
        kl : float
            Mean summed KL of the rollouts just collected.
        n_episodes : int, default=None
            Episodes in that batch.

        Returns
        -------
        beta : float
        """
        raise NotImplementedError(f"{type(self).__name__} must define update(kl, n_episodes).")

    def sample(self, kls, n_episodes=None) -> np.ndarray:
        """The beta path this controller would take for a sequence of measured KLs.

        The updates are made on a copy, so the fitted controller does not move:
        ``sample(kls)[t]`` is the beta returned by the ``t``-th of ``len(kls)`` calls to
        ``update`` from the current state (``beta_`` is the one in force before the first).

        Parameters
        ----------
        kls : array-like of shape (n_steps,)
            Mean summed KL measured at each step.
        n_episodes : int or array-like of shape (n_steps,), default=None
            Episodes per step, one number for all or one per step.

        Returns
        -------
        betas : ndarray of shape (n_steps,)

        Examples
        --------
        >>> from prefopt import AdaptiveKLController
        >>> kl = AdaptiveKLController(beta=0.1, target=6.0).fit()
        >>> kl.sample([6.0, 3.0]).round(6)   # on target, then half of it: -2%
        array([0.1  , 0.098])
        """
        check_is_fitted(self)
        kls = _check_kls(kls, f"{type(self).__name__}.sample")
        if n_episodes is None or isinstance(n_episodes, Integral):
            episodes = [n_episodes] * len(kls)
        else:
            episodes = list(np.asarray(n_episodes).ravel())
            if len(episodes) != len(kls):
                raise ValueError(
                    f"{type(self).__name__}.sample got {len(kls)} KLs and {len(episodes)} "
                    "n_episodes; pass one number for all steps or one per step."
                )
        replay = copy.deepcopy(self)
        return np.array([replay.update(kl, n) for kl, n in zip(kls, episodes)], dtype=float)

    def score(self, kls, y=None) -> float:
        """How steady a sequence of measured KLs stayed: minus their standard deviation.

        Larger is better; 0 for a KL that never moved. Subclasses with a target score
        the distance to it instead (:meth:`AdaptiveKLController.score`).

        Parameters
        ----------
        kls : array-like of shape (n_steps,)
            Mean summed KL measured at each step.
        y : None
            Ignored.

        Returns
        -------
        score : float
        """
        check_is_fitted(self)
        return -float(np.std(_check_kls(kls, f"{type(self).__name__}.score")))

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "beta_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.no_validation = True  # a controller takes no data
        tags.target_tags.required = False
        return tags


# The name the policies' parameter constraints used before the base class was public.
_KLController = KLController


def _check_kls(kls, what: str) -> np.ndarray:
    """A 1-D float array of finite KLs, at least one, with the first bad step named."""
    values = np.asarray(kls, dtype=float)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(
            f"{what} takes a 1-D sequence of at least one KL (one per step); "
            f"got shape {values.shape}."
        )
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(
            f"{what}: the KL at step {bad[0]} is {values[bad[0]]}; every KL must be finite."
        )
    return values


class FixedKLController(KLController):
    """Keep the KL coefficient beta constant.

    Parameters
    ----------
    beta : float, default=None
        The coefficient; ``None`` takes the policy's ``beta``.

    Attributes
    ----------
    beta_ : float
        The coefficient in use.
    n_updates_ : int
        Updates made since ``start``.

    See Also
    --------
    KLController, AdaptiveKLController

    Notes
    -----
    ``score(kls)`` is minus the standard deviation of the KLs. A fixed beta has no
    target KL to be measured against; what it is asked to do is hold the policy at a
    steady distance from the reference, so a KL that drifts or swings scores lower than
    one that settles, at whatever level.

    Examples
    --------
    >>> from prefopt import FixedKLController
    >>> kl = FixedKLController(beta=0.05).fit()
    >>> kl.update(kl=100.0, n_episodes=64)
    0.05
    >>> kl.sample([1.0, 5.0, 9.0])
    array([0.05, 0.05, 0.05])
    >>> kl.score([4.0, 4.0, 4.0]), round(kl.score([1.0, 5.0, 9.0]), 3)
    (-0.0, -3.266)
    """

    _parameter_constraints = {"beta": [Interval(Real, 0, None, closed="left"), None]}

    def __init__(self, *, beta: float | None = None):
        self.beta = beta

    def update(self, kl: float, n_episodes: int | None = None) -> float:
        """Return beta unchanged (the interface of :class:`AdaptiveKLController`).

        Parameters
        ----------
        kl : float
            Mean summed KL of the rollouts just collected; only checked to be finite.
        n_episodes : int, default=None
            Ignored.

        Returns
        -------
        beta : float
        """
        check_is_fitted(self)
        if not np.isfinite(kl):
            raise ValueError(f"The measured KL is {kl}; the controller needs a finite value.")
        self.n_updates_ += 1
        return self.beta_


_BETA_FLOOR, _BETA_CEIL = float(np.finfo(np.float64).tiny), 1e30


class AdaptiveKLController(KLController):
    """Log-space proportional controller steering beta towards a target KL.

    After each update of the policy, with ``KL_t`` the mean summed KL of the
    rollouts just collected (Ziegler et al., 2019):

    .. math::

        e_t = \\mathrm{clip}\\big((KL_t - KL_{target}) / KL_{target}, -0.2, 0.2\\big),
        \\qquad \\beta_{t+1} = \\beta_t (1 + K e_t)

    With the default ``gain`` K = 0.1, beta moves at most 2% a step. The original
    code uses K = n_episodes / horizon instead; pass ``horizon`` (e.g. 10000) to
    get that form.

    Parameters
    ----------
    beta : float, default=None
        Starting coefficient; ``None`` takes the policy's ``beta``.
    target : float, default=6.0
        Target KL in nats (the original code's value).
    gain : float, default=0.1
        K, used when ``horizon`` is None.
    horizon : float, default=None
        When given, K = n_episodes / horizon for each update.
    clip : float, default=0.2
        Bound on the relative error.

    Attributes
    ----------
    beta_ : float
        Current coefficient.
    n_updates_ : int
        Updates made since ``start``.

    See Also
    --------
    KLController, FixedKLController

    Notes
    -----
    ``score(kls)`` is minus the mean absolute relative error ``|KL_t - KL_target| /
    KL_target``: the controller's own error signal before clipping, averaged over the
    steps. The log-ratio ``|log(KL_t / KL_target)|`` would weigh halving and doubling
    alike, but is undefined for the zero or slightly negative KLs that the unbiased k1
    estimator measures while the policy is still at the reference.

    References
    ----------
    D. M. Ziegler et al., "Fine-Tuning Language Models from Human Preferences",
    arXiv:1909.08593, 2019.

    Examples
    --------
    >>> from prefopt import AdaptiveKLController
    >>> kl = AdaptiveKLController(beta=0.1, target=6.0).start()
    >>> round(kl.update(kl=12.0), 6)   # error clipped to +0.2: beta grows 2%
    0.102
    >>> kl = AdaptiveKLController(beta=0.1, target=6.0, horizon=10000).start()
    >>> round(kl.update(kl=3.0, n_episodes=512), 6)  # error -0.2, K = 512/10000
    0.098976
    >>> kl.score([6.0, 6.0]), kl.score([3.0, 12.0])   # on target; off by 1/2 then 1
    (-0.0, -0.75)
    """

    _parameter_constraints = {
        "beta": [Interval(Real, 0, None, closed="left"), None],
        "target": [Interval(Real, 0, None, closed="neither")],
        "gain": [Interval(Real, 0, None, closed="left")],
        "horizon": [Interval(Real, 0, None, closed="neither"), None],
        "clip": [Interval(Real, 0, None, closed="left")],
    }

    def __init__(
        self,
        *,
        beta: float | None = None,
        target: float = 6.0,
        gain: float = 0.1,
        horizon: float | None = None,
        clip: float = 0.2,
    ):
        self.beta = beta
        self.target = target
        self.gain = gain
        self.horizon = horizon
        self.clip = clip

    def update(self, kl: float, n_episodes: int | None = None) -> float:
        """Move beta after one policy update and return the new value.

        Parameters
        ----------
        kl : float
            Mean summed KL of the rollouts just collected.
        n_episodes : int, default=None
            Episodes in that batch (>= 0); required when ``horizon`` is set.

        Returns
        -------
        beta : float
            The new coefficient; never below the smallest normal float once
            positive, so a later KL over target can raise it again; at most 1e30.
        """
        check_is_fitted(self)
        if not np.isfinite(kl):
            raise ValueError(f"The measured KL is {kl}; the controller needs a finite value.")
        error = float(np.clip((kl - self.target) / self.target, -self.clip, self.clip))
        if n_episodes is not None:
            if isinstance(n_episodes, bool) or not isinstance(n_episodes, Real):
                raise TypeError(
                    f"n_episodes must be a number of episodes; got {n_episodes!r} "
                    f"({type(n_episodes).__name__})."
                )
            if not n_episodes >= 0:  # a negative gain would move beta away from the target
                raise ValueError(
                    f"n_episodes must be >= 0, the episodes in the batch just collected; got "
                    f"{n_episodes!r}."
                )
        if self.horizon is None:
            gain = self.gain
        else:
            if n_episodes is None:
                raise ValueError("AdaptiveKLController with horizon=... needs n_episodes.")
            gain = n_episodes / self.horizon
        factor = 1.0 + (step := gain * error if error else 0.0)  # huge gain, no error: 0
        if factor <= 0.0:
            # gain * clip >= 1 (a large gain, or a short horizon for the batch): the linear
            # update would zero beta or flip its sign. The log-space form exp(gain * error)
            # agrees with it to first order and keeps beta positive.
            if not getattr(self, "warned_", False):
                warnings.warn(
                    f"AdaptiveKLController: gain {gain:.3g} times the clipped error {error:.3g} "
                    "would make beta zero or negative; beta moves by exp(gain * error) instead. "
                    "Lower gain (or raise horizon) so that gain * clip < 1.",
                    RuntimeWarning,
                    stacklevel=2,
                )
                self.warned_ = True
            factor = float(np.exp(max(step, -745.0)))  # exp underflows to 0 below -745
        # A beta of exactly 0 (exp underflowing) could never grow again: beta stays at least
        # the smallest normal float, and at most _BETA_CEIL (beta * KL finite in float32).
        self.beta_ = min(max(self.beta_ * factor, _BETA_FLOOR), _BETA_CEIL) if self.beta_ else 0.0
        self.n_updates_ += 1
        return self.beta_

    def score(self, kls, y=None) -> float:
        """How close a sequence of measured KLs kept to ``target``: minus the mean relative error.

        ``-mean(|KL_t - target|) / target``; larger is better, 0 when every KL is on target.

        Parameters
        ----------
        kls : array-like of shape (n_steps,)
            Mean summed KL measured at each step.
        y : None
            Ignored.

        Returns
        -------
        score : float

        Examples
        --------
        >>> from prefopt import AdaptiveKLController
        >>> kl = AdaptiveKLController(beta=0.1, target=4.0).fit()
        >>> kl.score([4.0, 5.0, 2.0])   # errors 0, 1/4, 1/2
        -0.25
        """
        check_is_fitted(self)
        kls = _check_kls(kls, f"{type(self).__name__}.score")
        return -float(np.mean(np.abs(kls - self.target)) / self.target)
