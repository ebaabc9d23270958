"""benchmarks/_throughput_tools.py: the tool task prefopt and TRL share reads and scores both alike.

Speed is never asserted; these check the task itself (tokenizer, chat template,
reward, call counts) against hand-written transcripts.
"""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_task():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(
            "_throughput_tools", BENCHMARKS / "_throughput_tools.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


CALL = {
    "type": "function",
    "function": {"name": "calculator", "arguments": {"expression": "12*34"}},
}


def test_chat_template_renders_a_tool_exchange_in_the_hermes_format():
    task = load_task()
    from prefopt.worlds import CalculatorWorld

    tok = task.tool_tokenizer()
    tools = CalculatorWorld(n_eval=1, n_demonstrations=1, random_state=0).tools
    messages = [
        {"role": "user", "content": "12*34="},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "name": "calculator", "content": "408"},
        {"role": "assistant", "content": "408"},
    ]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert text == (
        "<|im_start|>system\n<tools>calculator </tools><|im_end|>\n"
        "<|im_start|>user\n12*34=<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "calculator", "arguments": '
        '{"expression": "12*34"}}</tool_call><|im_end|>\n'
        "<|im_start|>tool\n<tool_response>408</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n408<|im_end|>\n"
    )
    # The call's fixed pieces are one token each: the call is 7 tokens and the end of turn.
    call = tok.apply_chat_template(messages[:2], tokenize=False).split("assistant\n")[1]
    ids = tok(call, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1 + 5 + 1 + 1 + 1  # open, "12*34", close, <|im_end|>, newline
    assert ids[-2] == tok.eos_token_id
    assert tok.decode(ids) == call  # whitespace and every character survive


def test_prefopt_reads_the_call_and_writes_the_result_as_trl_does():
    task = load_task()
    from prefopt.policies.loop._episodes import EpisodeSampler
    from prefopt.policies.loop._tools import parse_tool_calls

    tok = task.tool_tokenizer()
    text = task.CALL_OPEN + "12*34" + task.CALL_CLOSE
    assert parse_tool_calls(text, tok) == [("calculator", {"expression": "12*34"})]
    view = SimpleNamespace(tokenizer=tok, stop_ids=[tok.eos_token_id])
    sampler = EpisodeSampler(None, view, prompts=[], prompt_tokens=[], make_env=None,
                             tools={}, max_turns=3, max_tokens=64)  # fmt: skip
    delta = sampler.chat_delta([{"role": "tool", "name": "calculator", "content": "408"}])
    # What follows the policy's <|im_end|>: TRL's _get_tool_suffix_ids cuts the same place.
    assert delta == (
        "\n<|im_start|>tool\n<tool_response>408</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_reward_and_tool_calls_read_trl_messages_and_prefopt_transcripts_alike():
    task = load_task()
    prompt = [{"role": "user", "content": "12*34="}]
    trl_done = [
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "name": "calculator", "content": "408"},
        {"role": "assistant", "content": "408"},
    ]
    trl_cut = trl_done[:2] + [{"role": "assistant", "content": "", "tool_calls": [CALL]}]
    # prefopt's transcripts, decoded without the special tokens (<|im_start|>, <|im_end|>).
    call = task.CALL_OPEN + "12*34" + task.CALL_CLOSE
    pf_done = call + "\ntool\n<tool_response>408</tool_response>\nassistant\n408"
    pf_cut = call + "\ntool\n<tool_response>408</tool_response>\nassistant\n" + call
    completions = [trl_done, trl_cut, [{"role": "assistant", "content": "407"}],
                   pf_done, pf_cut, "408", "407"]  # fmt: skip
    rewards = task.product_reward([prompt] * len(completions), completions)
    np.testing.assert_array_equal(rewards, [1, 0, 0, 1, 0, 1, 0])
    assert [task.tool_calls(c) for c in completions] == [1, 1, 0, 1, 1, 0, 0]


def test_demonstrations_continue_the_rendered_prompt():
    task = load_task()
    from prefopt.worlds import CalculatorWorld

    world = CalculatorWorld(n_eval=2, n_demonstrations=6, random_state=0)
    tok = task.tool_tokenizer()
    demos = task.demonstrations(world, tok, world.tools)
    for problem, prompt, completion, source in zip(
        world.demonstrations.prompt, demos.prompt, demos.completion, world.demonstrations.completion
    ):
        assert prompt == tok.apply_chat_template(
            [{"role": "user", "content": problem}], tools=world.tools,
            add_generation_prompt=True, tokenize=False,
        )  # fmt: skip
        answer = world.final_answer(source)
        assert completion.endswith(answer) and not completion.endswith("<|im_end|>")
        assert ("<tool_response>" in completion) == ("<tool_response>" in source)


def test_trl_accepts_the_chat_template_and_parses_its_calls():
    pytest.importorskip("trl")
    task = load_task()
    from trl.chat_template_utils import (
        is_chat_template_prefix_preserving,
        parse_response,
        supports_tool_calling,
    )

    tok = task.tool_tokenizer()
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    prefix = tok.apply_chat_template([{"role": "user", "content": "12*34="}],
                                     add_generation_prompt=True, return_dict=False)  # fmt: skip
    ids = tok(task.CALL_OPEN + "12*34" + task.CALL_CLOSE + task.END, add_special_tokens=False)
    parsed = parse_response(tok, ids["input_ids"], prefix=prefix)
    assert parsed["tool_calls"] == [CALL]
    answer = tok("408" + task.END, add_special_tokens=False)["input_ids"]
    assert parse_response(tok, answer, prefix=prefix) == {"role": "assistant", "content": "408"}


@pytest.mark.slow
def test_throughput_tools_runs_and_prints_its_line(tmp_path):
    # A smoke run: a start fitted on 32 demonstrations for 1 epoch, 1 warm-up + 1 step.
    script = BENCHMARKS / "throughput_tools.py"
    arguments = "--peer none --threads 1 --in-process --steps 1 --warmup 1 --batch-size 8 "
    arguments += f"--n-demonstrations 32 --sft-epochs 1 --n-prompts 8 --cache {tmp_path}"
    proc = subprocess.run([sys.executable, str(script), *arguments.split()], capture_output=True,
                          text=True, timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = re.search(
        r"^\[pair 1/1\] prefopt +([\d.]+) episodes/s .* tool calls/episode ([\d.]+) "
        r"+reward ([\d.]+)",
        proc.stdout,
        flags=re.MULTILINE,
    )
    assert line, proc.stdout
    episodes_per_s, calls, reward = map(float, line.groups())
    assert episodes_per_s > 0 and 0.0 <= reward <= 1.0
    assert 0.0 <= calls <= 2.0  # at most max_turns - 1 = 2 rounds of calls that are run
    assert "SFT 1 epochs on 32 demonstrations" in proc.stdout
