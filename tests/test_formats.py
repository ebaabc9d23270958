"""Tables whose shape would be guessed are refused, naming what is wrong.

The class of failure: two columns read as one (a DataFrame with two ``prompt``
columns trained on the label text ``"prompt"``), and columns whose names the
reward's own arguments use. Also names that collide once they become keys
(reward parts, history columns, tracker tags): unique by construction.
"""

import numpy as np
import pandas as pd
import pytest

import prefopt
from prefopt import DPOPolicy, RLOOPolicy, SFTPolicy, WeightedRewards
from prefopt.data import check_comparisons, check_demonstrations, check_prompt_table
from prefopt.rewards._combined import unique_names
from prefopt.worlds import PreferenceWorld, TinyLMWorld

WORLD = PreferenceWorld(random_state=0)
PROMPTS = list(WORLD.prompts)


@pytest.fixture(autouse=True)
def quiet():
    prefopt.set_config(show_progress_bar=False)


def rloo():
    return RLOOPolicy(
        model=WORLD.policy_model(), k=2, batch_size=4, n_steps=1, optimizer="sgd", random_state=0
    )


def duplicated(frame, label):
    return pd.concat([frame, frame[[label]]], axis=1)


def test_duplicate_column_labels_are_refused_by_name():
    calls = []

    def reward(prompts, completions):
        calls.append(1)
        return np.zeros(len(completions))

    prompts = duplicated(pd.DataFrame({"prompt": PROMPTS}), "prompt")
    with pytest.raises(ValueError, match=r"column label 'prompt' appears 2 times"):
        rloo().fit(prompts, reward)
    assert not calls
    demos = pd.DataFrame({"prompt": ["a", "b"], "completion": [" x", " y"]})
    tiny = TinyLMWorld(random_state=0)
    with pytest.raises(ValueError, match=r"Demonstrations: the column label 'completion' appears"):
        SFTPolicy(model=tiny.policy_model()).fit(duplicated(demos, "completion"))
    # Ours: a duplicated column besides the prompt (it would reach the reward as a frame).
    table = pd.DataFrame({"prompt": PROMPTS, "answer": list("abcd")[: len(PROMPTS)]})
    with pytest.raises(ValueError, match=r"label 'answer' appears 2 times"):
        check_prompt_table(duplicated(table, "answer"))
    # Ours: DPO's chosen twice; labels 1 and "1" (one name once they are text).
    pairs = pd.DataFrame({"prompt": ["q"], "chosen": ["a"], "rejected": ["b"]})
    with pytest.raises(ValueError, match=r"label 'chosen' appears 2 times"):
        DPOPolicy(model=tiny.policy_model()).fit(duplicated(pairs, "chosen"))
    mixed = pd.DataFrame({"prompt": PROMPTS, 1: 0, "1": 1})
    with pytest.raises(ValueError, match=r"label '1' appears 2 times \(as \[1, '1'\]\)"):
        check_prompt_table(mixed)
    rows = [{"prompt": p, 1: 0, "1": 1} for p in PROMPTS]
    with pytest.raises(ValueError, match=r"label '1' appears 2 times"):
        check_prompt_table(rows)
    with pytest.raises(ValueError, match=r"label 'prompt' appears 2 times"):
        check_demonstrations(
            duplicated(pd.DataFrame({"prompt": ["a"], "completion": ["b"]}), "prompt")
        )
    with pytest.raises(ValueError, match=r"label 'rejected' appears 2 times"):
        check_comparisons(duplicated(pairs, "rejected"))


@pytest.mark.parametrize("name", ["prompts", "completions"])
def test_reserved_column_names_are_refused_up_front(name):
    calls = []

    def reward(prompts, completions, **columns):
        calls.append(1)
        return np.zeros(len(completions))

    table = pd.DataFrame({"prompt": PROMPTS, name: PROMPTS})
    with pytest.raises(ValueError, match=rf"column '{name}' has a name the reward's own"):
        rloo().fit(table, reward)
    assert not calls


def length(prompts, completions):
    return [float(len(c)) for c in completions]


def length_2(prompts, completions):  # a reward whose own name is the old suffix
    return [100.0] * len(completions)


def test_reward_names_are_unique_by_construction():
    both = WeightedRewards([length, length, length_2])
    assert len(set(both.names)) == 3
    # 3 + 3 + 100 for a completion of 3 characters (the old names summed 3 + 100 + 100).
    assert both(["q"], ["abc"]).tolist() == [106.0]
    values = both.score_each(["q"], ["abc"])
    assert sorted(values[n][0] for n in both.names) == [3.0, 3.0, 100.0]
    # Ours: names that are equal once made safe for a metric key, lambdas, a slash.
    adversarial = ["a/b", "a_b", "<lambda>", "<lambda>", "_lambda_", "x_2", "x", "x", "", ""]
    names = unique_names(adversarial)
    assert len(set(names)) == len(names) == len(adversarial)
    assert all(n and set(n) <= set("abcdefghijklmnopqrstuvwxyz_0123456789.-") for n in names)
    assert names[5] == "x_2" and names[6] == "x"  # given names are kept, suffixes avoid them


def test_a_fit_logs_every_part_and_the_true_total():
    est = rloo().fit(PROMPTS, [length, length, length_2])
    row = est.history_[0]
    parts = {k: v for k, v in row.items() if k.startswith("rewards/") and k.endswith("/mean")}
    assert len(parts) == 3
    assert row["objective/reward"] == pytest.approx(sum(parts.values()))
