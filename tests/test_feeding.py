"""SFT, RewardModel and DPO as users feed them (truncation, implicit prompts, several
messages), and the prompt table's columns in the scorers."""

import numpy as np
import pandas as pd
import pytest

import prefopt
from prefopt import GRPOPolicy, SeedSearchCV
from prefopt.metrics import make_objective_scorer, make_pass_at_k_scorer, make_reward_scorer
from prefopt.model_selection import compare
from prefopt.worlds import PreferenceWorld

# ----- the prompt table's columns reach the scorers' reward ----------------------------


class _Echo:
    """A policy that answers each prompt with its samples 'p0', 'p1', ... (no model)."""

    def sample(self, X, n=1, *, random_state=None):
        return [[f"{p}{j}" for j in range(n)] for p in X]

    def log_prob(self, prompts, completions, *, reference=False):
        return np.zeros(len(prompts))


def _recorder():
    calls = []

    def correct(prompts, completions, answer):
        calls.append((list(prompts), list(completions), list(answer)))
        return np.array([float(c[-1] == "0") for c in completions])

    return correct, calls


def test_reward_and_pass_at_k_scorers_pass_the_answer_column_in_row_order():
    frame = pd.DataFrame({"prompt": ["b", "a", "c"], "answer": ["B", "A", "C"]})
    correct, calls = _recorder()
    assert make_reward_scorer(correct, n_samples=2)(_Echo(), frame) == 0.5
    assert calls[-1] == (
        ["b", "b", "a", "a", "c", "c"],
        ["b0", "b1", "a0", "a1", "c0", "c1"],
        ["B", "B", "A", "A", "C", "C"],
    )
    # pass@1 from 2 samples with one correct: 1/2 per prompt.
    assert make_pass_at_k_scorer(correct, k=1, n_samples=2)(_Echo(), frame) == 0.5
    assert calls[-1][2] == ["B", "B", "A", "A", "C", "C"]
    assert make_objective_scorer(correct, beta=0.1, n_samples=2)(_Echo(), frame) == 0.5
    assert calls[-1][2] == ["B", "B", "A", "A", "C", "C"]
    rows = frame.to_dict("records")
    make_reward_scorer(correct, n_samples=1)(_Echo(), rows)
    assert calls[-1] == (["b", "a", "c"], ["b0", "a0", "c0"], ["B", "A", "C"])


def test_scorers_refuse_a_reward_naming_a_missing_column_before_sampling():
    correct, calls = _recorder()
    with pytest.raises(ValueError, match="takes the argument 'answer', which is not a column"):
        make_reward_scorer(correct)(_Echo(), ["a", "b"])
    with pytest.raises(ValueError, match="takes the argument 'answer'"):
        make_pass_at_k_scorer(correct, n_samples=2)(_Echo(), pd.DataFrame({"prompt": ["a"]}))
    with pytest.raises(ValueError, match="'answer' column and y gives answers too"):
        make_pass_at_k_scorer(correct, n_samples=2)(
            _Echo(), pd.DataFrame({"prompt": ["a"], "answer": ["A"]}), ["A"]
        )
    # y still reaches the reward as answer= for a plain list of prompts.
    assert make_pass_at_k_scorer(correct, n_samples=2)(_Echo(), ["a"], ["A"]) == 0.5
    assert calls[-1][2] == ["A", "A"]


@pytest.fixture(scope="module")
def world():
    prefopt.set_config(show_progress_bar=False)
    return PreferenceWorld(random_state=0)


def _policy(world):
    return GRPOPolicy(
        model=world.policy_model(),
        k=2,
        batch_size=4,
        n_steps=1,
        learning_rate=0.1,
        optimizer="sgd",
        random_state=0,
        on_unhealthy="ignore",
    )


def test_policy_score_and_scorers_in_compare_and_search_get_each_rows_answer(world):
    from sklearn.model_selection import KFold

    prompts = list(world.prompts)[:4]
    frame = pd.DataFrame({"prompt": prompts, "answer": [f"ans{i}" for i in range(4)]})
    frame = frame.sample(frac=1.0, random_state=3).reset_index(drop=True)
    truth = dict(zip(frame.prompt, frame.answer))
    correct, calls = _recorder()

    def check(calls):
        assert calls
        for ps, _, answers in calls:
            assert answers == [truth[p] for p in ps]

    policy = _policy(world).fit(frame, correct)
    calls.clear()
    policy.score(frame)
    check(calls)
    assert len(calls) == 1 and calls[0][0] == list(frame.prompt)
    calls.clear()
    scorer = make_reward_scorer(correct, n_samples=3)
    compare({"g": _policy(world)}, frame, reward_model=correct, seeds=[0], scoring=scorer)
    check(calls)
    assert any(len(ps) == 12 for ps, _, _ in calls)  # the scorer's 3 samples of 4 prompts
    calls.clear()
    search = SeedSearchCV(_policy(world), {"beta": [0.1]}, seeds=1, cv=KFold(2), scoring=scorer)
    search.fit(frame, reward_model=correct)
    check(calls)
    assert any(len(ps) == 6 for ps, _, _ in calls)  # 3 samples of a 2-prompt test fold
