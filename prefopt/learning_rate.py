"""A learning rate that adapts to the size of each update's policy change.

No single fixed rate suits every task: the rate a tiny model needs to learn at all
collapses another task's run. Robotics PPO codebases measure, after each update, the
KL divergence between the policy before and after it and adapt the rate to keep that
KL near a target; Schulman et al. (2017) adapt the KL *penalty* of PPO by the same
rule. :class:`AdaptiveLR` is that rule as a small estimator that a policy's
``learning_rate`` parameter can hold in place of a number.
"""

from __future__ import annotations

import copy
import math
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

__all__ = ["AdaptiveLR"]


def _positive_finite(name: str, value, *, allow_none: bool = False) -> None:
    """A clear error for a parameter that is not a finite number > 0."""
    if value is None and allow_none:
        return
    ok = isinstance(value, Real) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"AdaptiveLR: {name} must be a finite number > 0"
            f"{' or None' if allow_none else ''}; got {value!r}."
        )


class AdaptiveLR(BaseEstimator):
    """Raise the learning rate when updates barely move the policy, cut it when they jump.

    After each policy update, with ``kl`` the measured change of the policy (the
    mean KL per token between the policy before and after the update, on the
    update's own tokens)::

        if kl > 2 * target:           lr = max(lr / factor, min_lr)
        elif 0 < kl < target / 2:     lr = min(lr * factor, max_lr)

    and the rate stays as it is inside the band ``[target / 2, 2 * target]``.
    A KL of 0 or below (no measured change, as when every advantage is 0, or an
    estimate's noise) leaves the rate unchanged: there is nothing to adapt to,
    and raising the rate there would spend the next real gradient at ``max_lr``.

    Parameters
    ----------
    learning_rate : float, default=None
        The starting rate; ``None`` takes the one passed to :meth:`start`,
        clipped into ``[min_lr, max_lr]`` (a policy passes the rate its own
        ``learning_rate=None`` would mean).
    target : float, default=0.01
        The KL per token an update should make, in nats (rsl_rl's common
        ``desired_kl``).
    factor : float, default=1.5
        How much one update multiplies or divides the rate (> 1).
    min_lr : float, default=1e-6
        The lowest rate (rl_games' bound).
    max_lr : float, default=1e-2
        The highest rate (rl_games' and rsl_rl's bound).
    anneal : bool, default=False
        Multiply the rate a fit uses by ``1 - done``, the share of the fit's
        steps done (:meth:`rate_at`): the linear decay to 0 of a fixed rate
        (``lr_schedule="linear"``, Ziegler et al.'s code), over the adapted rate.
        The rule adapts the rate before the decay; the decay ends the fit's
        steps small, where an adapted rate keeps its size to the last step.

    Attributes
    ----------
    learning_rate_ : float
        The rate in use.
    n_updates_ : int
        Updates seen since :meth:`start`.

    See Also
    --------
    prefopt.AdaptiveKLController : The same idea for the KL penalty's coefficient.

    Notes
    -----
    The rule, its factor 1.5, the band ``[target / 2, 2 * target]`` and the bounds
    are those of rl_games (``rl_games/common/schedulers.py``, ``AdaptiveScheduler``:
    ``kl_threshold=0.008``, ``min_lr=1e-6``, ``max_lr=1e-2``) and rsl_rl
    (``rsl_rl/algorithms/ppo.py``, ``schedule="adaptive"``: ``desired_kl``, bounds
    1e-5 and 1e-2, and a rate raised only when the measured KL is above 0).
    Schulman et al. (2017, section 4, "Adaptive KL Penalty Coefficient") adapt PPO's
    KL penalty ``beta`` by the same band and a factor of 2: halve it when the KL is
    below ``target / 1.5``, double it when above ``target * 1.5``.

    It is the default learning rate of every reinforcement-learning policy on a
    language model: ``learning_rate=None`` there means ``AdaptiveLR(target=0.002,
    max_lr=10 * start)``, starting at the rate the model's size calls for (``start``;
    the target and the ceiling measured beside ``POLICY_TARGET`` below; PPO's is
    ``AdaptiveLR(target=0.01, anneal=True, max_lr=10 * start)``, its Notes);
    ``learning_rate=AdaptiveLR(...)`` sets another target or bounds, and a number
    there stays a fixed rate. A fit sets each step's rate from ``learning_rate_``,
    measures the update's change with one forward pass without gradients on the step's own
    tokens, and logs ``optim/learning_rate`` and ``optim/policy_kl`` in ``history_``;
    its copy, ``lr_controller_``, is checkpointed, so a resumed run continues the
    adapted rate exactly.

    References
    ----------
    J. Schulman, F. Wolski, P. Dhariwal, A. Radford and O. Klimov, "Proximal
    Policy Optimization Algorithms", arXiv:1707.06347, 2017.

    N. Rudin, D. Hoeller, P. Reist and M. Hutter, "Learning to Walk in Minutes
    Using Massively Parallel Deep Reinforcement Learning", CoRL, 2021 (rsl_rl).

    Examples
    --------
    >>> from prefopt import AdaptiveLR
    >>> lr = AdaptiveLR(learning_rate=1e-3, target=0.01).fit()
    >>> lr.update(0.001)            # below target / 2: raised 1.5 times
    0.0015
    >>> lr.update(0.01)             # inside the band: unchanged
    0.0015
    >>> lr.update(0.05)             # above 2 * target: cut by 1.5
    0.001
    >>> lr.sample([0.0, 0.03, 0.03]).round(6)   # a replay on a copy
    array([0.001   , 0.000667, 0.000444])
    >>> lr.learning_rate_
    0.001
    """

    def __init__(
        self,
        *,
        learning_rate: float | None = None,
        target: float = 0.01,
        factor: float = 1.5,
        min_lr: float = 1e-6,
        max_lr: float = 1e-2,
        anneal: bool = False,
    ):
        self.learning_rate = learning_rate
        self.target = target
        self.factor = factor
        self.min_lr = min_lr
        self.max_lr = max_lr
        self.anneal = anneal

    def _check_params(self) -> None:
        _positive_finite("learning_rate", self.learning_rate, allow_none=True)
        _positive_finite("target", self.target)
        _positive_finite("factor", self.factor)
        _positive_finite("min_lr", self.min_lr)
        _positive_finite("max_lr", self.max_lr)
        if self.factor <= 1:
            raise ValueError(
                f"AdaptiveLR: factor must be > 1 (it multiplies the rate up and divides it "
                f"down); got {self.factor!r}. rl_games and rsl_rl use 1.5."
            )
        if not isinstance(self.anneal, (bool, np.bool_)):
            raise TypeError(f"AdaptiveLR: anneal must be True or False; got {self.anneal!r}.")
        if self.min_lr > self.max_lr:
            raise ValueError(
                f"AdaptiveLR: min_lr={self.min_lr!r} is above max_lr={self.max_lr!r}; "
                "swap them (min_lr is the lowest rate, max_lr the highest)."
            )

    def start(self, learning_rate: float | None = None):
        """Check the parameters, set the starting rate ``learning_rate_`` and return ``self``.

        Parameters
        ----------
        learning_rate : float, default=None
            Used when the controller's own ``learning_rate`` is None, clipped into
            ``[min_lr, max_lr]`` (a policy passes the rate its own
            ``learning_rate=None`` would mean). The controller's own rate is not
            clipped: outside the bounds it is refused.

        Returns
        -------
        self : object
        """
        self._check_params()
        rate = self.learning_rate
        if rate is None:
            if learning_rate is None:
                raise ValueError(
                    "AdaptiveLR needs a starting rate: set learning_rate=... on the controller."
                )
            _positive_finite("the starting learning rate", learning_rate)
            rate = min(max(learning_rate, self.min_lr), self.max_lr)
        if not self.min_lr <= rate <= self.max_lr:
            raise ValueError(
                f"AdaptiveLR: the starting learning rate {rate!r} is outside [min_lr, max_lr] = "
                f"[{self.min_lr!r}, {self.max_lr!r}]; start inside the bounds or widen them."
            )
        self.learning_rate_ = float(rate)
        self.n_updates_ = 0
        return self

    def fit(self, X=None, y=None):
        """Start at the controller's own ``learning_rate`` (the estimator interface).

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

    def update(self, kl: float) -> float:
        """Adapt the rate to one update's measured policy change; return the new rate.

        Parameters
        ----------
        kl : float
            The mean KL per token between the policy before and after the update.

        Returns
        -------
        learning_rate : float
            The rate for the next update.
        """
        check_is_fitted(self)
        if isinstance(kl, bool) or not isinstance(kl, (Real, np.floating)) or not np.isfinite(kl):
            raise ValueError(
                f"AdaptiveLR.update: the measured KL is {kl!r}; it must be a finite number."
            )
        if kl > 2.0 * self.target:
            self.learning_rate_ = max(self.learning_rate_ / self.factor, self.min_lr)
        elif 0.0 < kl < self.target / 2.0:
            self.learning_rate_ = min(self.learning_rate_ * self.factor, self.max_lr)
        self.n_updates_ += 1
        return self.learning_rate_

    def rate_at(self, done: float) -> float:
        """The rate to use when the share ``done`` of the fit's steps is done.

        ``learning_rate_``, times ``1 - done`` when ``anneal``.

        Parameters
        ----------
        done : float
            The share of the fit's steps done before this one, in ``[0, 1]``.

        Returns
        -------
        learning_rate : float

        Examples
        --------
        >>> from prefopt import AdaptiveLR
        >>> AdaptiveLR(learning_rate=1e-3, anneal=True).fit().rate_at(0.25)
        0.00075
        """
        check_is_fitted(self)
        if not 0.0 <= done <= 1.0:
            raise ValueError(f"AdaptiveLR.rate_at: done must be in [0, 1]; got {done!r}.")
        return self.learning_rate_ * (1.0 - done) if self.anneal else self.learning_rate_

    def sample(self, kls) -> np.ndarray:
        """The rates this controller would set for a sequence of measured KLs.

        The updates are made on a copy, so the controller does not move:
        ``sample(kls)[t]`` is the rate after the ``t``-th update.

        Parameters
        ----------
        kls : array-like of shape (n_updates,)
            The measured KL of each update.

        Returns
        -------
        learning_rates : ndarray of shape (n_updates,)
        """
        check_is_fitted(self)
        values = np.asarray(kls, dtype=float)
        if values.ndim != 1:
            raise ValueError(
                f"AdaptiveLR.sample takes a 1-D sequence of KLs; got shape {values.shape}."
            )
        replay = copy.deepcopy(self)
        return np.array([replay.update(float(kl)) for kl in values], dtype=float)

    def state_dict(self) -> dict:
        """The controller's state (what a checkpoint holds), as plain numbers.

        Returns
        -------
        state : dict
            ``{"learning_rate_": float, "n_updates_": int}``.
        """
        check_is_fitted(self)
        return {"learning_rate_": self.learning_rate_, "n_updates_": self.n_updates_}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`, so a resumed run continues the adapted rate exactly.

        Parameters
        ----------
        state : dict
            From :meth:`state_dict`; checked, as it may come from a file.
        """
        self._check_params()
        if not isinstance(state, dict) or set(state) != {"learning_rate_", "n_updates_"}:
            raise ValueError(
                "AdaptiveLR.load_state_dict takes {'learning_rate_': float, 'n_updates_': int}; "
                f"got {state!r}."
            )
        rate, n = state["learning_rate_"], state["n_updates_"]
        _positive_finite("the stored learning_rate_", rate)
        if not self.min_lr <= rate <= self.max_lr:
            raise ValueError(
                f"AdaptiveLR: the stored rate {rate!r} is outside [min_lr, max_lr] = "
                f"[{self.min_lr!r}, {self.max_lr!r}]: it was saved with other bounds."
            )
        if isinstance(n, bool) or not isinstance(n, Integral) or n < 0:
            raise ValueError(f"AdaptiveLR: the stored n_updates_ must be an int >= 0; got {n!r}.")
        self.learning_rate_, self.n_updates_ = float(rate), int(n)

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "learning_rate_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.no_validation = True  # a controller takes no data
        tags.target_tags.required = False
        return tags


# A policy's default adaptive rate: its ceiling, over its start (the fixed rate the
# model's size calls for). rl_games' bound (1e-2) is 10-30 times the fixed rates of its
# tasks (3e-4 to 1e-3). Measured on the sanity configuration of ArithmeticWorld
# (docs/guide/verifiable.rst): with rl_games' 1e-2, a policy whose groups all succeed
# measures almost no change, the rate climbs (to 4e-3 for GRPO, 1e-2 for RAFT) and the
# next informative batch undoes the learning (GRPO's batch reward 0.95 at step 85, 0.83 at
# 120; training accuracy 0.88 at the end); at 10 times the start GRPO ends at 1.00.
CEILING_RATIO = 10.0
# ... and its target, the KL per response token of one update, in nats:
# below rsl_rl's 0.01 (a Gaussian action policy's), measured on ArithmeticWorld (GRPO, GPT-2
# shape, the sweep's start, 100 steps): at the fixed 1e-4 that rule 2 of LR_SWEEP.md found
# healthy an update moves the policy by a median 0.001 nats a token; at 3e-4, which loses
# pass@1 there, by 0.005-0.025; at 1e-3 (a collapse) by 0.18. With a target of 0.01 the
# default climbed into that range and collapsed GRPO (pass@1 0.33 -> 0.20); at 0.002 the rate
# stays near the healthy 1e-4 there, and still climbs to 1e-3 on the sanity configuration.
POLICY_TARGET = 0.002


def policy_default(
    start: float, *, target: float = POLICY_TARGET, anneal: bool = False
) -> AdaptiveLR:
    """The default learning rate of a reinforcement-learning policy on a language model.

    ``AdaptiveLR(target=0.002, min_lr=1e-6, max_lr=10 * start)``: the rule of
    :class:`AdaptiveLR` at a target and a ceiling measured on the project's worlds
    (the comments beside ``POLICY_TARGET`` and ``CEILING_RATIO``); the policy
    starts it at ``start``, the fixed rate its model's size calls for. A policy
    declares its own ``target`` and ``anneal`` (``adaptive_lr_target`` and
    ``adaptive_lr_anneal``; PPO's are 0.01 and ``True``, its Notes).

    Parameters
    ----------
    start : float
        The rate the controller starts at (> 0).
    target : float, default=0.002
        The KL per token an update should make (``POLICY_TARGET``).
    anneal : bool, default=False
        Decay the adapted rate linearly to 0 over the fit.

    Returns
    -------
    controller : AdaptiveLR
        Not started.

    Examples
    --------
    >>> from prefopt.learning_rate import policy_default
    >>> policy_default(1e-4).get_params()["max_lr"]
    0.001
    >>> policy_default(1e-4).start(1e-4).update(0.0005)  # below half the target: raised
    0.00015000000000000001
    >>> policy_default(3e-4, target=0.01, anneal=True).get_params()["anneal"]
    True
    """
    _positive_finite("start", start)
    return AdaptiveLR(
        target=target, min_lr=min(1e-6, start), max_lr=CEILING_RATIO * start, anneal=anneal
    )
