"""KL controllers and per-token KL estimators.

The KL term keeps the policy where the reward model is valid; without it the
policy writes gibberish (Ziegler et al. 2019). Its coefficient beta is either fixed or
steered towards a target KL by the log-space proportional controller of
Ziegler et al. (2019).
"""

from __future__ import annotations

import warnings
from numbers import Real

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

__all__ = ["FixedKLController", "AdaptiveKLController", "kl_estimate"]


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


class _KLController(BaseEstimator):
    """Shared interface: ``start`` sets ``beta_``, ``update`` moves it after a step."""

    def start(self, beta: float | None = None):
        """Set the starting coefficient ``beta_`` and return ``self``.

        Parameters
        ----------
        beta : float, default=None
            Used when the controller's own ``beta`` is None (the policy passes
            its ``beta`` here).
        """
        self._validate_params()
        start = self.beta if self.beta is not None else beta
        if start is None:
            raise ValueError(
                f"{type(self).__name__} needs a starting beta: set beta=... "
                "on the controller or on the policy."
            )
        if start < 0:
            raise ValueError(f"beta must be >= 0; got {start!r}.")
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

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "beta_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.no_validation = True  # a controller takes no data
        tags.target_tags.required = False
        return tags


class FixedKLController(_KLController):
    """Keep the KL coefficient beta constant.

    Parameters
    ----------
    beta : float, default=None
        The coefficient; ``None`` takes the policy's ``beta``.

    Attributes
    ----------
    beta_ : float
        The coefficient in use.

    See Also
    --------
    AdaptiveKLController

    Examples
    --------
    >>> from prefopt import FixedKLController
    >>> kl = FixedKLController(beta=0.05).start()
    >>> kl.update(kl=100.0, n_episodes=64)
    0.05
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


class AdaptiveKLController(_KLController):
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
    FixedKLController

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
            Episodes in that batch; required when ``horizon`` is set.
        """
        check_is_fitted(self)
        if not np.isfinite(kl):
            raise ValueError(f"The measured KL is {kl}; the controller needs a finite value.")
        error = float(np.clip((kl - self.target) / self.target, -self.clip, self.clip))
        if self.horizon is None:
            gain = self.gain
        else:
            if n_episodes is None:
                raise ValueError("AdaptiveKLController with horizon=... needs n_episodes.")
            gain = n_episodes / self.horizon
        factor = 1.0 + gain * error
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
            factor = float(np.exp(gain * error))
        self.beta_ *= factor
        self.n_updates_ += 1
        return self.beta_
