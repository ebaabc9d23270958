"""The prompt table's columns reach the reward (TRL's convention); several rewards, weighted."""

import datasets
import numpy as np
import pandas as pd
import pytest
from sklearn.pipeline import make_pipeline

import prefopt
from prefopt import GRPOPolicy, RLOOPolicy
from prefopt.data import PreferenceData, check_prompt_table
from prefopt.model_selection import compare
from prefopt.rewards import WeightedRewards, reward_columns
from prefopt.worlds import PreferenceWorld, ReviewWorld


@pytest.fixture(scope="module")
def world():
    prefopt.set_config(show_progress_bar=False)
    return PreferenceWorld(random_state=0)


def table(world, n=4, seed=3):
    """Prompts with an answer (the prompt's row number) and a tag, rows shuffled."""
    prompts = list(world.prompts)[:n]
    frame = pd.DataFrame(
        {"prompt": prompts, "answer": [f"ans{i}" for i in range(n)], "tag": list(range(n))}
    )
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def small(world, cls=GRPOPolicy, **kw):
    params = dict(k=2, batch_size=4, n_steps=2, learning_rate=0.1, optimizer="sgd")
    return cls(model=world.policy_model(), random_state=0, **{**params, **kw})


def recorder():
    calls = []

    def correct(prompts, completions, answer):
        calls.append((list(prompts), list(answer)))
        return np.zeros(len(completions))

    return correct, calls


def assert_answers_follow_prompts(calls, truth, k):
    assert calls
    for prompts, answers in calls:
        assert answers == [truth[p] for p in prompts]  # the row's own answer, in order
        assert answers[::k] == answers[1::k]  # repeated for a prompt's k samples


def test_answer_column_follows_shuffled_rows_with_k_samples(world):
    frame = table(world)
    truth = dict(zip(frame.prompt, frame.answer))
    correct, calls = recorder()
    small(world).fit(frame, correct)
    assert_answers_follow_prompts(calls, truth, k=2)
    assert len(calls) == 2 and all(len(a) == 4 for _, a in calls)


def test_answer_column_from_a_dataset_dict_rows_and_preference_data(world):
    frame = table(world)
    truth = dict(zip(frame.prompt, frame.answer))
    inputs = [
        datasets.Dataset.from_pandas(frame),
        frame.to_dict("records"),
        {"prompt": list(frame.prompt), "answer": list(frame.answer)},
    ]
    for X in inputs:
        correct, calls = recorder()
        small(world).fit(X, correct)
        assert_answers_follow_prompts(calls, truth, k=2)
    correct, calls = recorder()
    small(world, n_steps=1).fit(PreferenceData(prompts=frame), reward_model=correct)
    assert_answers_follow_prompts(calls, truth, k=2)


def test_a_pipeline_and_compare_pass_the_columns(world):
    frame = table(world)
    truth = dict(zip(frame.prompt, frame.answer))
    correct, calls = recorder()
    make_pipeline(small(world, n_steps=1)).fit(frame, grpopolicy__reward_model=correct)
    assert_answers_follow_prompts(calls, truth, k=2)
    correct, calls = recorder()
    compare({"g": small(world, n_steps=1)}, frame, reward_model=correct, seeds=[0, 1])
    # For each seed one step of the fit (k = 2 samples a prompt), then its score (one each).
    assert len(calls) == 4
    for prompts, answers in calls:
        assert answers == [truth[p] for p in prompts]
    assert_answers_follow_prompts(calls[::2], truth, k=2)


def test_kwargs_reward_receives_every_extra_column_and_score_too(world):
    frame = table(world)
    seen = []

    def everything(prompts, completions, **kwargs):
        seen.append({name: list(v) for name, v in kwargs.items()})
        return np.ones(len(completions))

    policy = small(world, cls=RLOOPolicy).fit(frame, everything)
    assert sorted(seen[0]) == ["answer", "tag"]
    tags = dict(zip(frame.prompt, frame.tag))
    assert all(isinstance(t, int) for t in seen[0]["tag"])
    assert policy.score(frame) == 1.0
    assert sorted(seen[-1]) == ["answer", "tag"] and len(seen[-1]["tag"]) == len(frame)
    assert seen[-1]["tag"] == [tags[p] for p in frame.prompt]


def test_a_reward_that_names_no_column_is_called_as_before(world):
    frame = table(world)
    got = []

    def plain(prompts, completions):
        got.append(len(completions))
        return np.zeros(len(completions))

    small(world).fit(frame, plain)
    assert got == [4, 4]


def test_conversational_prompts_get_their_answers():
    world = ReviewWorld(n_reviews=40, chat=True, random_state=0)
    prompts = world.prompts[:4]
    frame = pd.DataFrame({"prompt": prompts, "answer": ["a", "b", "c", "d"]})
    frame = frame.sample(frac=1.0, random_state=1).reset_index(drop=True)
    seen = []

    def correct(prompts, completions, answer):
        seen.append((list(prompts), list(answer)))
        return np.zeros(len(completions))

    config = world.model_config(n_layer=1, n_embd=16, n_head=2)
    GRPOPolicy(model=config, k=2, batch_size=4, n_steps=1, min_eos_share=None, random_state=0).fit(
        frame, correct
    )
    truth = {str(p): a for p, a in zip(frame.prompt, frame.answer)}
    (got_prompts, answers) = seen[0]
    assert isinstance(got_prompts[0], list)  # messages, as given
    assert answers == [truth[str(p)] for p in got_prompts]


# ----- several rewards ------------------------------------------------------------------------
def test_two_weighted_rewards_give_the_total_and_their_own_columns(world):
    frame = table(world)

    returned = []

    def length(prompts, completions):
        return np.array([float(len(c)) for c in completions])

    def is_first(prompts, completions, tag):
        returned.append(np.array([float(t == 0) for t in tag]))
        return returned[-1]

    policy = small(world, reward_weights=[0.5, 2.0]).fit(frame, [length, is_first])
    for row, values in zip(policy.history_, returned):
        total = 0.5 * row["rewards/length/mean"] + 2.0 * row["rewards/is_first/mean"]
        assert row["objective/reward"] == pytest.approx(total, rel=1e-6)
        assert row["rewards/is_first/mean"] == values.mean()
        assert row["rewards/is_first/std"] == values.std()
        assert row["rewards/length/std"] >= 0
    assert isinstance(policy.reward_model_, WeightedRewards)
    # A single reward logs no per-reward columns (history_ as before).
    single = small(world, n_steps=1).fit(frame, length)
    assert not any(key.startswith("rewards/") for key in single.history_[0])


def test_reward_names_are_made_unique():
    def r(prompts, completions):
        return np.zeros(len(completions))

    class Checker:
        def __call__(self, prompts, completions):
            return np.ones(len(completions))

    both = WeightedRewards([r, r, Checker()], weights=[1, 2, 3])
    assert both.names == ["r", "r_2", "Checker"]
    assert both(["p"], ["c"]).tolist() == [3.0]


@pytest.mark.parametrize(
    "rewards, weights, error, match",
    [
        ("two", [1.0], ValueError, r"reward_weights has 1 weight for 2 rewards"),
        ("two", [1.0, -0.5], ValueError, r"reward_weights\[1\] is -0.5.*finite number >= 0"),
        ("two", [1.0, float("nan")], ValueError, r"reward_weights\[1\] is nan"),
        ("two", [1.0, float("inf")], ValueError, r"reward_weights\[1\] is inf"),
        ("noncallable", None, TypeError, r"Reward 1 of the list is str \('oops'\), not callable"),
        ("missing", None, ValueError, r"the reward needs_solution takes the argument 'solution'"),
        ("empty", None, ValueError, r"The list of rewards is empty"),
    ],
)
def test_bad_rewards_and_weights_are_refused_before_training(world, rewards, weights, error, match):
    def a(prompts, completions):
        return np.zeros(len(completions))

    def needs_solution(prompts, completions, solution):
        return np.zeros(len(completions))

    reward = {
        "two": [a, a],
        "noncallable": [a, "oops"],
        "missing": needs_solution,
        "empty": [],
    }[rewards]
    policy = small(world, reward_weights=weights)
    with pytest.raises(error, match=match):
        policy.fit(table(world), reward)
    assert not hasattr(policy, "history_")  # nothing was trained


def test_reward_columns_reads_the_signature():
    def r(prompts, completions, answer, *, scale=1.0):
        return []

    assert reward_columns(r) == ({"answer"}, {"scale"}, False)
    prompts, columns = check_prompt_table([{"prompt": "a", "x": 1}, {"prompt": "b", "x": 2}])
    assert prompts == ["a", "b"] and columns == {"x": [1, 2]}
    with pytest.raises(ValueError, match=r"row 1 has no \['x'\]"):
        check_prompt_table([{"prompt": "a", "x": 1}, {"prompt": "b"}])


@pytest.mark.parametrize("as_rows", [False, True], ids=["DataFrame", "dict-rows"])
def test_seed_search_splits_keep_each_rows_answer(world, as_rows):
    from sklearn.model_selection import KFold

    from prefopt import SeedSearchCV

    frame = table(world)
    truth = dict(zip(frame.prompt, frame.answer))
    correct, calls = recorder()
    # (A datasets.Dataset cannot be split by scikit-learn's _safe_indexing.)
    X = frame.to_dict("records") if as_rows else frame
    search = SeedSearchCV(small(world, n_steps=1), {"beta": [0.1]}, seeds=1, cv=KFold(2))
    search.fit(X, reward_model=correct)
    # Two folds: a fit on the training half, its score on the test half; then the refit.
    assert len(calls) >= 5
    for prompts, answers in calls:
        assert answers == [truth[p] for p in prompts]


def test_score_takes_a_list_of_rewards_as_fit_does(world):
    def length(prompts, completions):
        return [float(len(c)) for c in completions]

    def half(prompts, completions):
        return [0.5] * len(completions)

    policy = small(world, cls=RLOOPolicy).fit(world.prompts, world.true_quality)
    listed = policy.score(world.prompts, [length, half])
    policy_again = small(world, cls=RLOOPolicy).fit(world.prompts, world.true_quality)
    weighted = policy_again.score(world.prompts, WeightedRewards([length, half]))
    assert listed == weighted  # the same seed samples the same completions
    # Ours: a tuple; the policy's reward_weights weigh the list, a count that differs fails.
    tupled = small(world, cls=RLOOPolicy).fit(world.prompts, world.true_quality)
    assert tupled.score(world.prompts, (length, half)) == listed
    tupled.set_params(reward_weights=[1.0, 1.0])
    with pytest.raises(ValueError, match="reward_weights has 2 weights for 3 rewards"):
        tupled.score(world.prompts, [length, half, half])
