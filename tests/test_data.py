"""The data layer (prompts, comparisons, demonstrations) and reward outputs.

Every accepted input form gives the same columns; every bad input raises one
TypeError or ValueError that names the row.
"""

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prefopt import NoisyReward
from prefopt.data import (
    Comparisons,
    check_comparisons,
    check_demonstrations,
    check_prompts,
)
from prefopt.rewards import check_rewards

PROMPTS = ["the movie was", "I think", "x"]
ROWS = [("q1", "good.", "bad."), ("q2", "yes", ""), ("q3", " a", "a")]
COLUMNS = {
    "prompt": ["q1", "q2", "q3"],
    "chosen": ["good.", "yes", " a"],
    "rejected": ["bad.", "", "a"],
}


# ---------------------------------------------------------------------------
# check_prompts: accepted forms
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: list(PROMPTS),
        lambda: tuple(PROMPTS),
        lambda: iter(PROMPTS),
        lambda: np.array(PROMPTS),
        lambda: pd.Series(PROMPTS),
        lambda: pd.DataFrame({"prompt": PROMPTS, "other": [1, 2, 3]}),
        lambda: {"prompt": PROMPTS},
        lambda: datasets.Dataset.from_dict({"prompt": PROMPTS}),
    ],
    ids=["list", "tuple", "iterator", "ndarray", "series", "dataframe", "dict", "dataset"],
)
def test_check_prompts_accepted_forms(make):
    out = check_prompts(make())
    assert out == PROMPTS
    assert type(out) is list and all(type(p) is str for p in out)


def test_check_prompts_keeps_whitespace_and_order():
    assert check_prompts([" a ", "b\n"]) == [" a ", "b\n"]


# ---------------------------------------------------------------------------
# check_prompts: errors name the row
# ---------------------------------------------------------------------------


def test_check_prompts_empty_list():
    with pytest.raises(ValueError, match="No prompts"):
        check_prompts([])
    with pytest.raises(ValueError, match="No prompts"):
        check_prompts(pd.DataFrame({"prompt": []}))


@pytest.mark.parametrize("bad", ["", "   ", "\n\t"])
def test_check_prompts_empty_string_names_row(bad):
    with pytest.raises(ValueError, match="row 2 is empty"):
        check_prompts(["a", "b", bad])


def test_check_prompts_non_string_names_row():
    with pytest.raises(TypeError, match=r"prompt at row 1 is int \(3\)"):
        check_prompts(["a", 3, "c"])
    with pytest.raises(TypeError, match="row 0 is NoneType"):
        check_prompts([None])
    with pytest.raises(TypeError, match="row 1 is float"):  # a missing value in a table
        check_prompts(pd.DataFrame({"prompt": ["a", np.nan]}))
    with pytest.raises(TypeError, match="row 0 is list"):
        check_prompts([["nested"]])


def test_check_prompts_single_string():
    with pytest.raises(TypeError, match="not one string"):
        check_prompts("the movie was")


def test_check_prompts_not_iterable():
    with pytest.raises(TypeError, match="got int"):
        check_prompts(5)
    with pytest.raises(TypeError, match="got NoneType"):
        check_prompts(None)


def test_check_prompts_missing_column():
    with pytest.raises(ValueError, match=r"missing \['prompt'\]"):
        check_prompts(pd.DataFrame({"text": ["a"]}))
    with pytest.raises(ValueError, match=r"missing \['prompt'\]"):
        check_prompts(datasets.Dataset.from_dict({"text": ["a"]}))
    with pytest.raises(ValueError, match=r"missing \['prompt'\]"):
        check_prompts({"text": ["a"]})


def test_check_prompts_2d_array():
    with pytest.raises(ValueError, match="one-dimensional"):
        check_prompts(np.array([["a", "b"]]))


def test_check_prompts_string_column_is_rejected():
    with pytest.raises(TypeError):
        check_prompts({"prompt": "the movie was"})


# ---------------------------------------------------------------------------
# check_comparisons: accepted forms
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: list(ROWS),
        lambda: [list(r) for r in ROWS],
        lambda: [{"prompt": p, "chosen": c, "rejected": r, "extra": 0} for p, c, r in ROWS],
        lambda: pd.DataFrame(COLUMNS),
        lambda: dict(COLUMNS),
        lambda: datasets.Dataset.from_dict(COLUMNS),
        lambda: Comparisons(*COLUMNS.values()),
        lambda: iter(ROWS),
    ],
    ids=["tuples", "lists", "dicts", "dataframe", "dict", "dataset", "comparisons", "iterator"],
)
def test_check_comparisons_accepted_forms(make):
    out = check_comparisons(make())
    assert isinstance(out, Comparisons)
    assert len(out) == 3
    assert list(out.prompt) == COLUMNS["prompt"]
    assert list(out.chosen) == COLUMNS["chosen"]
    assert list(out.rejected) == COLUMNS["rejected"]  # an empty response is allowed
    assert out.featurizer is None


def test_check_comparisons_keeps_featurizer():
    def featurizer(prompts, completions):
        return np.zeros((len(prompts), 1))

    out = check_comparisons(Comparisons(["q"], ["a"], ["b"], featurizer))
    assert out.featurizer is featurizer


def test_comparisons_indexing_and_pandas():
    c = Comparisons(*COLUMNS.values())
    assert list(c[1].prompt) == ["q2"]
    assert list(c[1:].chosen) == ["yes", " a"]
    assert list(c[[2, 0]].rejected) == ["a", "bad."]
    frame = c.to_pandas()
    assert frame.columns.tolist() == ["prompt", "chosen", "rejected"]
    assert frame["chosen"].tolist() == COLUMNS["chosen"]


# ---------------------------------------------------------------------------
# check_comparisons: errors name the row
# ---------------------------------------------------------------------------


def test_check_comparisons_empty():
    with pytest.raises(ValueError, match="No comparisons"):
        check_comparisons([])
    with pytest.raises(ValueError, match="No comparisons"):
        check_comparisons(pd.DataFrame({"prompt": [], "chosen": [], "rejected": []}))


def test_check_comparisons_identical_pair_names_row():
    with pytest.raises(ValueError, match=r"identical at row 1 \('same'\)"):
        check_comparisons([("q", "a", "b"), ("q", "same", "same")])
    with pytest.raises(ValueError, match="identical at row 0"):
        check_comparisons(pd.DataFrame({"prompt": ["q"], "chosen": [""], "rejected": [""]}))


def test_check_comparisons_missing_columns():
    with pytest.raises(ValueError, match=r"missing \['rejected'\]"):
        check_comparisons(pd.DataFrame({"prompt": ["q"], "chosen": ["a"]}))
    with pytest.raises(ValueError, match=r"missing \['chosen', 'rejected'\]"):
        check_comparisons(datasets.Dataset.from_dict({"prompt": ["q"], "text": ["a"]}))
    with pytest.raises(ValueError, match=r"row 1 has no \['rejected'\]"):
        check_comparisons(
            [{"prompt": "q", "chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": "a"}]
        )


def test_check_comparisons_wrong_row_length_names_row():
    with pytest.raises(ValueError, match=r"row 1 should be a tuple of 3"):
        check_comparisons([("q", "a", "b"), ("q", "a")])
    with pytest.raises(ValueError, match=r"row 0 should be a tuple of 3"):
        check_comparisons([("q", "a", "b", "c")])
    with pytest.raises(TypeError, match=r"table or a list of rows"):
        check_comparisons("qab")  # one string is not a list of rows
    with pytest.raises(TypeError, match=r"table or a list of rows"):
        check_comparisons(None)


def test_check_comparisons_mismatched_column_lengths():
    with pytest.raises(ValueError, match="different lengths"):
        check_comparisons({"prompt": ["a", "b"], "chosen": ["c"], "rejected": ["d"]})
    with pytest.raises(ValueError, match="different lengths"):
        check_comparisons(Comparisons(["a", "b"], ["c", "d"], ["e"]))


def test_check_comparisons_bad_text_names_row_and_column():
    with pytest.raises(TypeError, match="chosen at row 1 is int"):
        check_comparisons([("q", "a", "b"), ("q", 3, "b")])
    with pytest.raises(TypeError, match="rejected at row 0 is NoneType"):
        check_comparisons(pd.DataFrame({"prompt": ["q"], "chosen": ["a"], "rejected": [None]}))
    with pytest.raises(ValueError, match="prompt at row 1 is empty"):
        check_comparisons([("q", "a", "b"), (" ", "a", "b")])


def test_check_comparisons_string_columns_are_rejected():
    with pytest.raises(TypeError):
        check_comparisons({"prompt": "ab", "chosen": "cd", "rejected": "ef"})


# ---------------------------------------------------------------------------
# check_demonstrations
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: [("p1", " c1"), ("p2", " c2")],
        lambda: [{"prompt": "p1", "completion": " c1"}, {"prompt": "p2", "completion": " c2"}],
        lambda: pd.DataFrame({"prompt": ["p1", "p2"], "completion": [" c1", " c2"]}),
        lambda: {"prompt": ["p1", "p2"], "completion": [" c1", " c2"]},
        lambda: datasets.Dataset.from_dict({"prompt": ["p1", "p2"], "completion": [" c1", " c2"]}),
    ],
    ids=["tuples", "dicts", "dataframe", "dict", "dataset"],
)
def test_check_demonstrations_accepted_forms(make):
    assert check_demonstrations(make()) == (["p1", "p2"], [" c1", " c2"])


def test_check_demonstrations_errors():
    with pytest.raises(ValueError, match="No demonstrations"):
        check_demonstrations([])
    with pytest.raises(ValueError, match=r"missing \['completion'\]"):
        check_demonstrations(pd.DataFrame({"prompt": ["p"]}))
    with pytest.raises(TypeError, match="completion at row 1 is float"):
        check_demonstrations([("p", "c"), ("p", 1.5)])
    with pytest.raises(ValueError, match="row 0 should be a tuple of 2"):
        check_demonstrations([("p", "c", "extra")])


def test_check_demonstrations_mismatched_column_lengths():
    with pytest.raises(ValueError, match="different lengths"):
        check_demonstrations({"prompt": ["a", "b"], "completion": ["x"]})


# ---------------------------------------------------------------------------
# Fuzz: valid input is returned unchanged; anything else is TypeError/ValueError
# ---------------------------------------------------------------------------

nonblank = st.text(min_size=1).filter(lambda s: s.strip() != "")
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.binary())
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner, inner),
        st.dictionaries(st.sampled_from(["prompt", "chosen", "rejected", "x"]), inner, max_size=4),
    ),
    max_leaves=10,
)


@settings(max_examples=50, deadline=None)
@given(st.lists(nonblank, min_size=1, max_size=6))
def test_fuzz_check_prompts_valid_unchanged(prompts):
    assert check_prompts(prompts) == prompts
    assert check_prompts(pd.Series(prompts, dtype=object)) == prompts


@settings(max_examples=50, deadline=None)
@given(
    st.lists(nonblank, min_size=1, max_size=4),
    st.lists(st.one_of(scalars, st.just(""), st.just("  ")), min_size=1, max_size=3),
    st.randoms(use_true_random=False),
)
def test_fuzz_check_prompts_bad_entry_raises(good, bad, rnd):
    # At least one entry that is not a non-blank string: always an error.
    bad = [b for b in bad if not (isinstance(b, str) and b.strip())]
    if not bad:
        bad = [""]
    rows = good + bad
    rnd.shuffle(rows)
    with pytest.raises((TypeError, ValueError)):
        check_prompts(rows)


@settings(max_examples=50, deadline=None)
@given(junk)
def test_fuzz_check_prompts_never_crashes_otherwise(value):
    try:
        out = check_prompts(value)
    except (TypeError, ValueError):
        return
    assert isinstance(out, list) and out
    assert all(isinstance(p, str) and p.strip() for p in out)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(nonblank, st.text(), st.text()).filter(lambda r: r[1] != r[2]),
        min_size=1,
        max_size=5,
    )
)
def test_fuzz_check_comparisons_valid_unchanged(rows):
    out = check_comparisons(rows)
    assert list(zip(out.prompt, out.chosen, out.rejected)) == rows
    frame = pd.DataFrame(rows, columns=["prompt", "chosen", "rejected"])
    assert list(check_comparisons(frame).chosen) == [r[1] for r in rows]


@settings(max_examples=50, deadline=None)
@given(junk)
def test_fuzz_check_comparisons_never_crashes_otherwise(value):
    try:
        out = check_comparisons(value)
    except (TypeError, ValueError):
        return
    assert isinstance(out, Comparisons) and len(out) > 0
    assert all(isinstance(p, str) and p.strip() for p in out.prompt)
    assert all(c != r for c, r in zip(out.chosen, out.rejected))


# ---------------------------------------------------------------------------
# check_rewards and NoisyReward
# ---------------------------------------------------------------------------


def test_check_rewards_accepts_lists_arrays_columns_and_tensors():
    np.testing.assert_array_equal(check_rewards([1, 2], 2), [1.0, 2.0])
    assert check_rewards([1, 2], 2).dtype == np.float64
    np.testing.assert_array_equal(check_rewards(np.array([[1.5], [2.5]]), 2), [1.5, 2.5])
    out = check_rewards(torch.tensor([0.5, -1.0], requires_grad=True), 2)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, [0.5, -1.0])
    np.testing.assert_array_equal(check_rewards(torch.tensor([[3.0], [4.0]]), 2), [3.0, 4.0])


@pytest.mark.parametrize("values", [[1.0, 2.0, 3.0], [[1.0, 2.0], [3.0, 4.0]], 1.0, [[1.0, 2.0]]])
def test_check_rewards_wrong_shape(values):
    with pytest.raises(ValueError, match=r"one number per completion"):
        check_rewards(values, 2)


def test_check_rewards_wrong_shape_names_source():
    with pytest.raises(ValueError, match=r"my reward returned shape \(3,\) for 2 completions"):
        check_rewards([1, 2, 3], 2, "my reward")


@pytest.mark.parametrize(
    "bad,shown", [(float("nan"), "nan"), (float("inf"), "inf"), (-float("inf"), "-inf")]
)
def test_check_rewards_non_finite_names_completion(bad, shown):
    with pytest.raises(ValueError, match=rf"non-finite value \({shown}\) for completion 2"):
        check_rewards([0.0, 1.0, bad], 3)


def test_check_rewards_not_numbers():
    with pytest.raises(TypeError, match="must return numbers"):
        check_rewards(["good", "bad"], 2)


def test_noisy_reward_std_zero_is_clean():
    clean = lambda p, c: [float(len(x)) for x in c]
    out = NoisyReward(clean, std=0.0, random_state=0)(["a", "b"], ["xy", "xyz"])
    np.testing.assert_array_equal(out, [2.0, 3.0])


def test_noisy_reward_seed_determinism():
    clean = lambda p, c: np.ones(len(c))
    a = NoisyReward(clean, std=2.0, random_state=7)
    b = NoisyReward(clean, std=2.0, random_state=7)
    first = a(["p"] * 4, ["c"] * 4)
    np.testing.assert_array_equal(first, b(["p"] * 4, ["c"] * 4))
    # the noise is N(0, std^2) drawn from RandomState(seed)
    np.testing.assert_allclose(first, 1.0 + np.random.RandomState(7).normal(0.0, 2.0, 4))
    # a second call draws fresh noise; another seed gives other noise
    assert not np.array_equal(first, a(["p"] * 4, ["c"] * 4))
    assert not np.array_equal(
        first, NoisyReward(clean, std=2.0, random_state=8)(["p"] * 4, ["c"] * 4)
    )


def test_noisy_reward_checks_inner_reward_and_std():
    with pytest.raises(ValueError, match="std"):
        NoisyReward(lambda p, c: np.zeros(len(c)), std=-1.0)
    with pytest.raises(ValueError, match="non-finite"):
        NoisyReward(lambda p, c: [np.nan], std=1.0, random_state=0)(["p"], ["c"])
