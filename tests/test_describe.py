"""A run identity no function, object or data slips past, equal in another process.

Each test is a class of failure: a resume that would continue a different run
(two things described alike), and an identity that holds a memory address (so
that it differs in another process). Each lists the cases that were found and
variants of our own.
"""

import json
import os
import re
import subprocess
import sys
import threading
import weakref

import numpy as np
import pandas as pd
import pytest
from _tiny import small_policy

import prefopt
from prefopt import NoisyReward, RewardModel, WeightedRewards
from prefopt.lm._describe import describe, fingerprint
from prefopt.lm._identity import needs_probe
from prefopt.lm._object_state import kept_random_states
from prefopt.rewards._probe import reward_behaviour
from prefopt.worlds import ArithmeticWorld, PreferenceWorld, ReviewWorld, TinyLMWorld

WORLD = PreferenceWorld(rater_bias=1.0, random_state=0)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def told_apart(a, b) -> bool:
    """Two objects described differently (compared as the checkpoint compares them)."""
    return describe(a) != describe(b) and fingerprint(a) != fingerprint(b)


def small_rloo(folder, **params):
    settings = dict(beta=0.3, learning_rate=2.0, n_steps=1, batch_size=16, random_state=0)
    return small_policy(WORLD, **settings, checkpoint_dir=str(folder)).set_params(**params)


def lengths(prompts, completions):
    return np.array([float(len(c)) for c in completions])


# ----- class 1: two different runs described alike ------------------------------------------


def test_two_lambdas_on_one_line_are_told_apart(tmp_path):
    one, two = (lambda p, c: lengths(p, c)), (lambda p, c: 2 * lengths(p, c))  # noqa: E731
    assert told_apart(one, two)
    # Ours: same line, same body, other default; same line, operands swapped.
    three, four = (lambda p, c, s=1: s * lengths(p, c)), (lambda p, c, s=2: s * lengths(p, c))
    assert told_apart(three, four)
    five, six = (lambda p, c: lengths(c, p)), (lambda p, c: lengths(p, c))  # noqa: E731
    assert told_apart(five, six)
    # Through a fit: the second lambda does not resume the first one's run.
    small_rloo(tmp_path).fit(WORLD.prompts, one)
    with pytest.raises(ValueError, match=r"reward\.code="):
        small_rloo(tmp_path).fit(WORLD.prompts, two)


class SlotScale:
    __slots__ = ("scale",)

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, prompts, completions):
        return self.scale * lengths(prompts, completions)


class SlotChild(SlotScale):  # ours: slots declared on a parent, a string slot on the child
    __slots__ = "offset"

    def __init__(self, scale, offset):
        super().__init__(scale)
        self.offset = offset


def test_callable_objects_with_slots_are_described_by_their_slots(tmp_path):
    assert told_apart(SlotScale(1.0), SlotScale(2.0))
    assert describe(SlotScale(1.0)) == describe(SlotScale(1.0))
    assert told_apart(SlotChild(1.0, 0.0), SlotChild(1.0, 5.0))
    assert told_apart(SlotChild(1.0, 0.0), SlotChild(2.0, 0.0))
    small_rloo(tmp_path).fit(WORLD.prompts, SlotScale(1.0))
    with pytest.raises(ValueError, match=r"reward\.state\.scale=1\.0, but this fit has .*2\.0"):
        small_rloo(tmp_path).fit(WORLD.prompts, SlotScale(2.0))


def _keyed(table):
    def reward(prompts, completions):
        return np.array([table.get(1, 0.0) for _ in completions])

    return reward


def test_dict_keys_of_other_types_are_told_apart():
    assert told_apart(_keyed({1: 1.0}), _keyed({"1": 1.0}))
    # Ours: a tuple key and its text; a bool key and the text "True"; None and "None".
    assert told_apart({(1, 2): 0}, {"(1, 2)": 0})
    assert told_apart({True: 0}, {"True": 0})
    assert told_apart({None: 0}, {"None": 0})
    # A set of texts is described the same under any hash seed (cross-process test below).
    assert describe({"b", "a"}) == describe({"a", "b"})


class Node:
    def __init__(self, child=None, leaf=None):
        self.child, self.leaf = child, leaf


def chain(depth, leaf):
    node = Node(leaf=leaf)
    for _ in range(depth):
        node = Node(child=node)
    return node


class DeepReward:
    def __init__(self, depth, scale):
        self.root = chain(depth, scale)

    def __call__(self, prompts, completions):
        node = self.root
        while node.child is not None:
            node = node.child
        return node.leaf * lengths(prompts, completions)


def test_objects_nested_deep_are_told_apart(tmp_path):
    # Thirteen levels (past the old limit of 12): described exactly now.
    assert told_apart(chain(13, 1.0), chain(13, 2.0))
    assert "opaque" not in json.dumps(describe(chain(13, 1.0)))
    # Ours: past what a description follows (300 levels), the part is marked opaque, with no
    # address, and a reward holding it is told apart by its behaviour on the probe.
    deep = describe(chain(300, 1.0))
    assert "opaque" in json.dumps(deep) and not ADDRESS.search(json.dumps(deep))
    assert needs_probe(deep)
    small_rloo(tmp_path).fit(WORLD.prompts, DeepReward(300, 1.0))
    with pytest.raises(ValueError, match=r"reward_behaviour\.outputs"):
        small_rloo(tmp_path).fit(WORLD.prompts, DeepReward(300, 2.0))
    small_rloo(tmp_path).fit(WORLD.prompts, DeepReward(300, 1.0))  # the same one resumes


def test_data_is_fingerprinted_by_every_element(tmp_path):
    # A column of long arrays that differ in one element hidden by numpy's abbreviated str().
    a = [np.zeros(2000) for _ in WORLD.prompts]
    b = [np.zeros(2000) for _ in WORLD.prompts]
    b[0][1000] = 1.0
    assert str(a[0]) == str(b[0])
    assert fingerprint(a) != fingerprint(b)
    frame = pd.DataFrame({"prompt": WORLD.prompts, "vec": a})
    small_rloo(tmp_path).fit(frame, lengths)
    with pytest.raises(ValueError, match="written for other data"):
        small_rloo(tmp_path).fit(frame.assign(vec=b), lengths)
    # Ours: an object array of texts; a float column whose values differ past str()'s digits;
    # a DataFrame captured by a reward, one cell changed (a frame's blocks have no __dict__).
    texts = np.array(["a", "b"], dtype=object)
    assert fingerprint(texts) != fingerprint(np.array(["a", "c"], dtype=object))
    assert fingerprint(np.array([1.0, 2.0])) != fingerprint(np.array([1.0, 2.0 + 1e-12]))
    table = pd.DataFrame({"w": np.arange(100.0)})
    other = table.copy()
    other.loc[57, "w"] = -1.0
    assert told_apart(table, other)
    assert told_apart(pd.Series([1, 2]), pd.Series([1, 3]))


SCALE = 1.0


def global_scaled(prompts, completions):
    return SCALE * lengths(prompts, completions)


def test_what_a_description_cannot_see_is_told_apart_by_behaviour(tmp_path, monkeypatch):
    # Ours: a global the reward reads, changed between two fits of one script.
    assert needs_probe(describe(global_scaled))
    small_rloo(tmp_path).fit(WORLD.prompts, global_scaled)
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 3.0)
    with pytest.raises(ValueError, match=r"reward_behaviour\.outputs\[0\]=.*, but this fit"):
        small_rloo(tmp_path).fit(WORLD.prompts, global_scaled)
    # Ours: an object with no readable content (a lock) is opaque, never its address.
    locked = describe({"lock": threading.Lock()})
    assert locked["lock"]["opaque"] and not ADDRESS.search(json.dumps(locked))
    # A weakref by what it points to.
    target = DeepReward(2, 4.0)
    assert describe(weakref.ref(target)) == {"weakref": describe(target)}
    # A probe leaves a stochastic reward's random state as it was.
    noisy = NoisyReward(global_scaled, std=1.0, random_state=0)
    with kept_random_states({"reward": noisy}):
        first = reward_behaviour(noisy, WORLD.prompts)
    with kept_random_states({"reward": noisy}):
        assert reward_behaviour(noisy, WORLD.prompts) == first
    assert reward_behaviour(noisy, WORLD.prompts) == first  # unguarded: it advances after
    assert reward_behaviour(noisy, WORLD.prompts) != first


def test_no_identity_holds_a_memory_address():
    """Every public estimator, world, world reward and reward wrapper, scanned for 0x...."""
    arith = ArithmeticWorld(random_state=0)
    review = ReviewWorld(n_reviews=200, random_state=0)
    tiny = TinyLMWorld(random_state=0)
    things = {
        "worlds": [WORLD, arith, review, tiny],
        "world rewards": [
            WORLD.true_quality,
            WORLD.labeler,
            arith.correctness_reward,
            arith.format_reward,
            [arith.correctness_reward, arith.format_reward],
            review.gold_reward,
            review.labeler,
            tiny.reward,
            tiny.labeler,
            tiny.token_reward(),
        ],
        "wrappers": [
            NoisyReward(tiny.reward, std=0.5, random_state=0),
            WeightedRewards([arith.correctness_reward, lengths], weights=[1.0, 0.1]),
            RewardModel().fit(WORLD.comparisons(50, random_state=0)),
        ],
        "estimators": [
            cls()
            for name in prefopt.__all__
            if isinstance(cls := getattr(prefopt, name), type)
            and hasattr(cls, "get_params")
            and name != "SeedSearchCV"
        ],
    }
    for kind, values in things.items():
        for value in values:
            text = json.dumps(describe(value), sort_keys=True)
            assert not ADDRESS.search(text), (kind, value, ADDRESS.search(text))
            assert "opaque" not in text, (kind, value)  # prefopt's own objects: all readable


_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
import numpy as np
import torch
torch.set_num_threads({threads})  # as here: TinyLMWorld trains its reference, bit for bit
from prefopt import NoisyReward, RewardModel, WeightedRewards
from prefopt.lm._describe import fingerprint
from prefopt.worlds import ArithmeticWorld, PreferenceWorld, ReviewWorld, TinyLMWorld

pref = PreferenceWorld(rater_bias=1.0, random_state=0)
arith = ArithmeticWorld(random_state=0)
review = ReviewWorld(n_reviews=200, random_state=0)
tiny = TinyLMWorld(random_state=0)
things = {{
    "pref.true_quality": pref.true_quality,
    "pref.labeler": pref.labeler,
    "arith.correctness_reward": arith.correctness_reward,
    "arith.format_reward": arith.format_reward,
    "arith.both": [arith.correctness_reward, arith.format_reward],
    "review.gold_reward": review.gold_reward,
    "review.labeler": review.labeler,
    "tiny.reward": tiny.reward,
    "tiny.labeler": tiny.labeler,
    "tiny.token_reward": tiny.token_reward(),
    "noisy": NoisyReward(tiny.reward, std=0.5, random_state=0),
    "weighted": WeightedRewards([arith.correctness_reward, arith.format_reward]),
    "reward_model": RewardModel().fit(pref.comparisons(50, random_state=0)),
    "set": {{"alpha", "beta", "gamma", "delta"}},
    "frame": review.demonstrations,
}}
print(json.dumps({{k: fingerprint(v) for k, v in things.items()}}))  # in the subprocess
"""


def test_identities_are_equal_in_another_process():
    import torch

    script = _SCRIPT.format(root=ROOT, threads=torch.get_num_threads())
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # other set orders, other addresses
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    here: dict = {}
    exec(script.rsplit("\nprint(", 1)[0], here)  # the same objects, built in this process
    mine = {k: fingerprint(v) for k, v in here["things"].items()}
    assert set(theirs) == set(mine) and len(mine) == 15
    assert theirs == mine


def test_a_reward_described_exactly_is_never_called_before_training(tmp_path):
    # Ours: a closure with a counter (its description is exact: no data global, nothing
    # opaque), so no probe calls it; a run of 2 steps calls it twice, resumed or not.
    calls = []

    def counted(prompts, completions):
        calls.append(len(completions))
        return lengths(prompts, completions)

    assert not needs_probe(describe(counted))
    small_rloo(tmp_path, n_steps=2).fit(WORLD.prompts, counted)
    assert calls == [16, 16]
