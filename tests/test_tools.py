"""Tools as plain functions: schemas, calls read from completions, results and errors as text,
counted; the tool world; bad environments and tools refused before training."""

import time

import numpy as np
import pytest
import torch
from _tiny import tiny_lm

from prefopt import GRPOPolicy, RLOOPolicy
from prefopt.backend import pad_right
from prefopt.backend.samplers import Samples
from prefopt.policies.loop._tools import check_tools, parse_tool_calls, run_tool
from prefopt.worlds import CalculatorWorld
from prefopt.worlds.arithmetic._calculator import calculator


def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return str(a + b)


def crash(a: int) -> str:
    """Fail.

    Args:
        a: Anything.
    """
    raise RuntimeError("boom")


def slow(a: int) -> str:
    """Take long.

    Args:
        a: Anything.
    """
    time.sleep(2.0)
    return "late"


def number(a: int) -> int:
    """Return a number, not text.

    Args:
        a: Anything.
    """
    return a * 2


def undocumented(a: int) -> str:
    return str(a)


class Opaque:
    pass


def odd(a: Opaque) -> str:
    """Take an object.

    Args:
        a: An object.
    """
    return ""


def test_schemas_come_from_signatures_and_docstrings():
    schema = check_tools([add], "P")["add"][1]
    assert schema["function"]["description"] == "Add two integers."
    assert schema["function"]["parameters"]["properties"]["a"] == {
        "type": "integer", "description": "The first."
    }  # fmt: skip


@pytest.mark.parametrize(
    "tools, error, words",
    [
        ([undocumented], ValueError, "docstring"),
        ([odd], ValueError, "type hints of basic types"),
        ([add, add], ValueError, "two tools are named 'add'"),
        (["add"], TypeError, "tools[0] is a str"),
        (add, TypeError, "a list of functions"),
    ],
)
def test_unusable_tools_are_refused_before_training(tools, error, words):
    policy = GRPOPolicy(model=tiny_lm(0), tools=tools, n_steps=1, batch_size=4)
    with pytest.raises(error, match=words.replace("(", r"\(").replace("[", r"\[")):
        policy.fit(["the movie was"], lambda p, c: np.zeros(len(c)))
    assert not hasattr(policy, "model_")  # refused before any model was built


def test_tool_failures_go_back_to_the_model_as_text():
    tools = check_tools([add, crash, slow, number], "P")
    assert run_tool(tools, "add", {"a": 2, "b": 3}, 1.0).content == "5"
    failed = run_tool(tools, "crash", {"a": 1}, 1.0)
    assert (failed.status, failed.content) == ("error", "Error: crash raised RuntimeError: boom")
    late = run_tool(tools, "slow", {"a": 1}, 0.05)
    assert late.status == "timeout" and "did not answer within 0.05 s" in late.content
    assert run_tool(tools, "number", {"a": 4}, 1.0).content == "8"  # shown as JSON text
    assert run_tool(tools, "number", {"a": 4}, 1.0).status == "non_string"
    assert run_tool(tools, "nope", {}, 1.0).content == (
        "Error: no tool named 'nope' (tools: add, crash, number, slow)."
    )
    assert "cannot take these arguments" in run_tool(tools, "add", {"c": 1}, 1.0).content


def test_calls_are_read_in_the_hermes_format():
    text = 'a <tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>'
    assert parse_tool_calls(text) == [("add", {"a": 1, "b": 2})]
    assert parse_tool_calls("<tool_call>{oops</tool_call>")[0][0] is None
    assert parse_tool_calls("<tool_call>[1]</tool_call>")[0][0] is None
    assert parse_tool_calls("no call") == []


class Scripted:
    def __init__(self, turns, eos):
        self.turns, self.eos = list(turns), eos

    def sample(self, model, prompts, *, max_new_tokens, pad_token_id, **kwargs):
        rows = self.turns.pop(0)
        assert len(rows) == len(prompts)  # one row a live episode
        ids, mask = pad_right(rows, pad_token_id, width=max_new_tokens)
        ended = torch.tensor([self.eos in r[:max_new_tokens] for r in rows])
        return Samples(ids, mask.long(), ended, torch.zeros(ids.shape))


@pytest.fixture(scope="module")
def world():
    return CalculatorWorld(n_eval=4, n_demonstrations=8, random_state=0)


def test_a_tool_call_is_run_and_its_result_appended_as_environment_tokens(world):
    tok = world.tokenizer
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tok.eos_token_id
    policy = RLOOPolicy(model=world.model_config(), tools=world.tools, k=2, batch_size=4,
                        n_steps=0, beta=0.0, max_new_tokens=world.max_new_tokens,
                        random_state=0).fit(world.prompts, world.correctness_reward)  # fmt: skip
    p0, p1 = world.prompts[0], world.prompts[1]
    call = ids(world.tool_use(p0, "0").split("</s>")[0]) + [eos]
    bad = ids(world.tool_use("12/3=", "0").split("</s>")[0]) + [eos]  # "/": the tool raises
    answer = ids(world.answers[0]) + [eos]
    loop = policy._loop
    loop.rollouts.sampler.sampler = Scripted(
        [[call, bad, ids("7") + [eos], call], [answer, answer]], eos
    )  # rows 0 and 3 call the tool (on prompt 0's problem), 1 makes a bad call, 2 answers
    batch = loop.rollout(np.array([0, 1]))
    result = ids(f"<tool_response>{world.answers[0]}</tool_response>")
    assert batch.response_ids[0, : len(call) + len(result)].tolist() == call + result
    assert batch.response_mask[0].tolist()[: len(call) + len(result) + len(answer)] == (
        [1] * len(call) + [0] * len(result) + [1] * len(answer)
    )
    # Row 1's error message fills the context (truncated before a second turn, so
    # missing_eos_reward); row 3 wrote prompt 0's product for prompt 1.
    assert batch.scores.tolist() == [1.0, -1.0, 0.0, 0.0]
    assert batch.ended.tolist() == [True, False, True, True]
    assert batch.stats["tools/calls"] == 0.75 and batch.stats["tools/error_share"] == 1 / 3
    assert batch.stats["tools/no_call_share"] == 0.25 and batch.stats["episode/turns"] == 1.5
    assert p1 != p0


def test_the_calculator_world_tool_and_gold():
    assert calculator(" 12*34 ") == "408"
    world = CalculatorWorld(n_eval=4, n_demonstrations=8, random_state=0)
    assert world.correctness_reward(["12*34="], ["<tool_response>408</tool_response>408"]) == 1
    assert world.calls_tool(["408"]).tolist() == [False]
    with pytest.raises(ValueError, match="n_digits must be 2 or 3"):
        CalculatorWorld(n_digits=1)


class NoStep:
    def reset(self, prompt):
        return None


def test_an_environment_missing_a_method_is_refused_before_training():
    policy = GRPOPolicy(model=tiny_lm(0), environment=NoStep, n_steps=1, batch_size=4)
    with pytest.raises(TypeError, match=r"NoStep has no step method.*step\(completion\)"):
        policy.fit(["the movie was"])
    assert not hasattr(policy, "model_")


class Counter:
    """Counts its own steps: a deep copy per episode keeps episodes apart."""

    def __init__(self):
        self.steps = 0

    def reset(self, prompt):
        return None

    def step(self, completion):
        self.steps += 1
        return "the", float(self.steps), self.steps == 2


def test_an_environment_instance_is_copied_per_episode_and_pays_without_a_reward():
    env = Counter()
    policy = GRPOPolicy(model=tiny_lm(0), environment=env, n_steps=1, batch_size=4, k=2,
                        max_new_tokens=3, random_state=0)  # fmt: skip
    policy.fit(["the movie was", "the plot"])
    assert env.steps == 0  # the parameter itself is never stepped
    row = policy.history_[-1]
    assert row["episode/turns"] <= 2 and "tools/calls" not in row
    assert np.isfinite(policy.score(["the movie was"]))


def test_a_different_tool_list_is_another_run(tmp_path):
    def fit(tools):
        policy = GRPOPolicy(model=tiny_lm(0), tools=tools, n_steps=1, batch_size=4, k=2,
                            max_new_tokens=3, checkpoint_dir=tmp_path, random_state=0)  # fmt: skip
        return policy.fit(["the movie was"], lambda p, c: np.zeros(len(c)))

    fit([add])
    with pytest.raises(ValueError, match="tools"):
        fit([add, number])


def test_a_policy_that_never_calls_its_tools_is_flagged():
    from prefopt.exceptions import RunHealthWarning

    # The tiny word-level model cannot even write a call: every episode is without one.
    policy = GRPOPolicy(model=tiny_lm(0), tools=[add], n_steps=2, batch_size=4, k=2,
                        max_new_tokens=3, random_state=0)  # fmt: skip
    with pytest.warns(RunHealthWarning, match="no_tool_calls") as caught:
        policy.fit(["the movie was", "the plot"], lambda p, c: np.zeros(len(c)))
    assert policy.history_[-1]["tools/no_call_share"] == 1.0
    assert policy.history_[-1]["health/no_tool_calls"] == 1.0
    assert "tool_errors" not in " ".join(str(w.message) for w in caught)


# A ChatML-like template with a tool role, over the words of a word-level vocabulary.
TOOL_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{ '<user> ' + message['content'] + ' ' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{ '<assistant> ' + message['content'] + ' <eot> ' }}"
    "{%- elif message['role'] == 'tool' -%}{{ '<tool> ' + message['content'] + ' ' }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<assistant>' }}{%- endif -%}"
)


def echo(word: str) -> str:
    """Say a word back.

    Args:
        word: The word.
    """
    return word


def test_in_a_chat_the_tool_result_is_a_tool_message_between_the_turns():
    from transformers import GPT2Config, GPT2LMHeadModel

    from prefopt.worlds._tokenizer import word_level_tokenizer

    call = '<tool_call> {"name": "echo", "arguments": {"word": "b"}} </tool_call>'
    words = ["<user>", "<assistant>", "<eot>", "<tool>", "a", "b", *call.split()]
    tok = word_level_tokenizer(words, eos_token="</s>", split_on_whitespace=True,
                               chat_template=TOOL_TEMPLATE)  # fmt: skip
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=16,
                                       n_layer=1, n_head=2))  # fmt: skip
    model.tokenizer = tok
    eot = tok.convert_tokens_to_ids("<eot>")
    policy = RLOOPolicy(model=model, tools=[echo], k=2, batch_size=2, n_steps=0, beta=0.0,
                        max_new_tokens=12, stop_token_ids=[eot], random_state=0)  # fmt: skip
    policy.fit([[{"role": "user", "content": "a"}]], lambda p, c: np.zeros(len(c)))
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    turn1, turn2 = ids(call) + [eot], ids("b") + [eot]
    loop = policy._loop
    loop.rollouts.sampler.sampler = Scripted([[turn1, turn1], [turn2, turn2]], eot)
    batch = loop.rollout(np.array([0]))
    tool = ids("<tool> b <assistant>")  # the template's tool message and next assistant turn
    assert batch.response_ids[0].tolist()[: len(turn1 + tool + turn2)] == turn1 + tool + turn2
    assert batch.response_mask[0].tolist()[: len(turn1 + tool + turn2)] == (
        [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
    )
    assert batch.ended.all() and batch.stats["tools/error_share"] == 0.0
