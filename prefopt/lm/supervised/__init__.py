"""The supervised loop: SFT, the language-model reward model and DPO train through it.

    epochs x shuffled minibatches -> learning-rate schedule -> guarded step -> record

Its shape is the policy loop's (:mod:`prefopt.policies.loop`): :class:`SupervisedView`
is what the loop needs of the estimator, gathered once per fit; :class:`SupervisedLoop`
owns the run (order, optimiser, checkpoint, health, trackers); :class:`SupervisedStep`
is given its inputs and returns a plain :class:`SupervisedResult`, which the
estimator's ``record`` writes into ``n_iter_`` and ``history_``. An estimator supplies
only its minibatch loss, ``batch_loss(model, rows) -> (loss, stats)``.
"""

from ._loop import SupervisedLoop, SupervisedView
from ._shared import SUPERVISED_CONSTRAINTS, warn_y_ignored
from ._step import SupervisedResult, SupervisedStep, schedule_scale

__all__ = [
    "SUPERVISED_CONSTRAINTS",
    "SupervisedLoop",
    "SupervisedResult",
    "SupervisedStep",
    "SupervisedView",
    "schedule_scale",
    "warn_y_ignored",
]
