"""Scorers for policies: callables ``(estimator, X, y=None) -> float``, larger is better.

Each ``make_*`` function returns a scorer that can be given as ``scoring=`` to
:class:`~prefopt.model_selection.SeedSearchCV`, :func:`~prefopt.model_selection.compare`,
``GridSearchCV`` or ``cross_validate`` (alone or in a dict of named scorers).
A scorer draws ``n_samples`` completions per prompt with the policy's
``sample(X, n=..., random_state=...)`` at a fixed ``random_state``: every
scorer here samples, none uses the greedy ``predict`` (a ``Pipeline`` is sampled
through its last step; only an estimator that cannot sample is asked for
``predict(X)``), so the same policy
always gets the same score, scorers with the same ``random_state`` in one dict
see the same completions, and two candidates of a search are scored on common
random numbers.

:func:`make_pass_at_k_scorer` checks each completion with a verifiable reward
and returns the mean unbiased pass@k (Chen et al. 2021); :func:`pass_at_k` is
the estimator itself.

The KL scorer is *negated* (``-KL``), as scikit-learn scorers are
"larger is better"; the other scorers return the quantity itself.
"""

from ._pass_at_k import make_pass_at_k_scorer, pass_at_k
from ._scorer import (
    gold_reward_scorer,
    make_kl_scorer,
    make_objective_scorer,
    make_reward_scorer,
)
from ._win_rate import (
    DEFAULT_LENGTH_BINS,
    length_binned_win_rate,
    make_length_binned_win_rate,
    make_win_rate_scorer,
)

__all__ = [
    "DEFAULT_LENGTH_BINS",
    "gold_reward_scorer",
    "length_binned_win_rate",
    "make_kl_scorer",
    "make_length_binned_win_rate",
    "make_objective_scorer",
    "make_pass_at_k_scorer",
    "make_reward_scorer",
    "make_win_rate_scorer",
    "pass_at_k",
]
