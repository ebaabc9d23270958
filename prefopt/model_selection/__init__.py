"""Seed-aware model selection: searches and comparisons that report spread, not the best seed.

An RL run is a random variable: the same algorithm and parameters give another
policy under another seed. :class:`SeedSearchCV` fits every candidate once per
seed (and per fold, when ``cv`` is given) and ranks candidates by their *mean*
over seeds, with the standard deviation and a Student-t confidence interval
beside it; :func:`compare` fits several algorithms on the same seeds and
prompts and compares each with a baseline by a paired t-test over seeds, with
a verdict and the minimum detectable difference per pair; with ``tune=`` it
first tunes each algorithm on seeds kept apart from the evaluation seeds.
Both read a fit's ``health_`` (a run that is unhealthy is a failure, not a low
score) and ``compare`` reports each fit's ``budget_``.

Both run their fits through joblib, so ``n_jobs`` and any joblib backend
(``with joblib.parallel_backend("ray")`` after ``ray.util.joblib.register_ray()``,
or Dask) parallelise them unchanged.
"""

from ._aggregates import (
    iqm,
    performance_profile,
    probability_of_improvement,
    stratified_bootstrap_ci,
)
from ._compare import compare
from ._comparison import Comparison
from ._controls import FormatReward, RandomReward
from ._environment import environment
from ._search import SeedSearchCV
from ._stats import claim_status, holm, minimum_detectable_difference, t_interval, verdict

__all__ = [
    "Comparison",
    "FormatReward",
    "RandomReward",
    "SeedSearchCV",
    "claim_status",
    "compare",
    "environment",
    "holm",
    "iqm",
    "minimum_detectable_difference",
    "performance_profile",
    "probability_of_improvement",
    "stratified_bootstrap_ci",
    "t_interval",
    "verdict",
]
