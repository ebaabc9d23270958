"""Seed-aware model selection: searches and comparisons that report spread, not the best seed.

An RL run is a random variable: the same algorithm and parameters give another
policy under another seed. :class:`SeedSearchCV` fits every candidate once per
seed (and per fold, when ``cv`` is given) and ranks candidates by their *mean*
over seeds, with the standard deviation and a Student-t confidence interval
beside it; :func:`compare` fits several algorithms on the same seeds and
prompts and compares each with a baseline by a paired t-test over seeds.

Both run their fits through joblib, so ``n_jobs`` and any joblib backend
(``with joblib.parallel_backend("ray")`` after ``ray.util.joblib.register_ray()``,
or Dask) parallelise them unchanged.
"""

from ._compare import Comparison, compare
from ._search import SeedSearchCV
from ._stats import t_interval

__all__ = ["Comparison", "SeedSearchCV", "compare", "t_interval"]
