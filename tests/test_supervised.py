"""The supervised loop (prefopt/lm/supervised/): a view, a step that returns a plain result,
and a loop whose steps reach the estimator's fitted attributes only through ``record``."""

import math
from types import SimpleNamespace

import pytest
import torch
from _tiny import tiny_lm

from prefopt import SFTPolicy
from prefopt.lm.supervised import SupervisedLoop, SupervisedResult, SupervisedStep, SupervisedView


def _toy(n_iter=0):
    return SimpleNamespace(n_epochs=2, batch_size=2, learning_rate_=0.1, n_iter_=n_iter,
                           history_=[], on_unhealthy="ignore")  # fmt: skip


def test_a_step_returns_a_plain_result_and_takes_one_sgd_step():
    # loss = (w - 1)^2 at w = 0: gradient -2, so one SGD step at lr 0.25 gives w = 0.5.
    w = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([w], lr=1.0)
    seen = []

    def batch_loss(model, rows):
        seen.append((model, list(rows)))
        return ((w - 1.0) ** 2).sum(), {"loss/toy": 7.0, "data/rows": len(rows)}

    step = SupervisedStep(batch_loss, optimizer, "the-model", None, None, None, "toy")
    result = step([3, 1], lr=0.25, n_iter=5)
    assert isinstance(result, SupervisedResult)
    assert float(w.detach()) == 0.5 and result.loss == 1.0
    assert seen == [("the-model", [3, 1])]  # the training passes' model, this rank's rows
    assert set(result.row) == {"step", "loss/toy", "data/rows", "charts/learning_rate",
                               "time/step_s"}  # fmt: skip
    assert (result.row["step"], result.row["loss/toy"]) == (5, 7.0)
    assert (result.row["data/rows"], result.row["charts/learning_rate"]) == (2, 0.25)


def test_the_loop_writes_the_fit_only_through_record():
    est = _toy(n_iter=3)  # a warm start: the steps continue from 3
    w = torch.nn.Parameter(torch.zeros(1))

    def batch_loss(model, rows):
        return ((w - 1.0) ** 2).sum(), {"loss/toy": 0.0}

    results = []

    def record(result):  # keeps the rows, as health reads history_, but never n_iter_
        results.append(result)
        est.history_.append(result.row)

    view = SupervisedView.of(est, name="toy", schedule="linear")
    loop = SupervisedLoop(est, view, 5, batch_loss, parameters=[w], generator=torch.Generator())
    loop.train(record=record)
    per_epoch = math.ceil(5 / 2)
    assert [r.row["step"] for r in results] == list(range(4, 4 + 2 * per_epoch))
    assert est.n_iter_ == 3  # only record writes fitted attributes
    rates = [r.row["charts/learning_rate"] for r in results]
    assert rates == pytest.approx([0.1 * (1 - i / 6) for i in range(6)])  # linear to 0


def test_the_view_is_gathered_once_from_the_estimator():
    sft = SFTPolicy(model=tiny_lm(), batch_size=4, n_epochs=3, micro_batch_size=2,
                    gradient_checkpointing=True, checkpoint_every=7)  # fmt: skip
    sft.learning_rate_, sft.model_ = 0.01, torch.nn.Linear(1, 1)
    view = SupervisedView.of(sft, name="SFTPolicy", schedule="cosine")
    assert (view.n_epochs, view.batch_size, view.learning_rate) == (3, 4, 0.01)
    assert (view.micro_batch_size, view.gradient_checkpointing) == (2, True)
    assert view.checkpoint_every == 7 and view.model is sft.model_
