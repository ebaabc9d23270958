"""The multi-turn tool task that prefopt and TRL's GRPOTrainer both run (throughput_tools.py).

One tokenizer with a chat template, one calculator, one set of problems, one reward
and one starting model, saved to a folder that both implementations load:

- the tokenizer: one token per character (whitespace kept), the ChatML pieces
  ``<|im_start|>`` and ``<|im_end|>`` (the EOS, which ends every turn), and one token
  for each fixed piece of a tool call and a tool result;
- the chat template (Jinja, below): ChatML turns, the tools' names in a system turn,
  tool calls written in the Hermes / Qwen format ``<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>`` and tool results in ``<tool_response>`` tags. It
  is prefix-preserving and renders a whole tool exchange, the two checks TRL makes
  (``trl/chat_template_utils.py``: ``supports_tool_calling``,
  ``is_chat_template_prefix_preserving``);
- the response template: TRL's own for Qwen 3 (``trl.chat_template_utils.qwen3_template``,
  the same ChatML and Hermes pieces), saved with the tokenizer. TRL sets one itself only
  for a chat template it knows verbatim (``add_response_schema`` compares the
  template's text to the ones it ships and raises "Unrecognized chat template" for any
  other); prefopt reads the same calls with its Hermes parser;
- the problems, the tool and the reward: :class:`prefopt.worlds.CalculatorWorld`'s
  two-digit products and its ``calculator``; the reward is 1 when the final assistant
  turn is the product;
- the starting model: a tiny GPT-2 (2 layers, width 64, the calculator world's shape)
  from a config, fitted by ``prefopt.SFTPolicy`` on the world's demonstrations rendered
  through the chat template (half of them call the tool), so that both start from a
  policy that calls the tool in most episodes.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

START, END = "<|im_start|>", "<|im_end|>"
PAD, UNK = "[PAD]", "[UNK]"
# The fixed pieces of a call and a result, one token each (as in CalculatorWorld).
CALL_OPEN = '<tool_call>{"name": "calculator", "arguments": {"expression": "'
CALL_CLOSE = '"}}</tool_call>'
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
ASSISTANT = START + "assistant\n"

CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\n<tools>' }}"
    "{%- for tool in tools -%}"
    "{{ (tool.function.name if tool.function is defined else tool.name) + ' ' }}"
    "{%- endfor -%}"
    "{{ '</tools><|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set f = call.function if call.function is defined else call -%}"
    '{{ \'<tool_call>{"name": "\' + f.name + \'", "arguments": \' }}'
    "{{- (f.arguments if f.arguments is string else f.arguments | tojson) + '}</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' -%}"
    "{{ '<|im_start|>tool\\n<tool_response>' + message.content + '</tool_response><|im_end|>\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def tool_tokenizer():
    """Characters (printable ASCII and a newline) plus the chat and tool pieces; EOS <|im_end|>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {w: i for i, w in enumerate([PAD, UNK] + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, unk_token=UNK, clean_up_tokenization_spaces=False
    )
    out.add_special_tokens({"eos_token": END, "additional_special_tokens": [START, END]})
    out.add_tokens([CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE])
    out.chat_template = CHAT_TEMPLATE
    try:
        from trl.chat_template_utils import qwen3_template  # TRL's parser of the same pieces
    except ImportError:  # prefopt alone: it parses Hermes calls itself
        return out
    out.response_template = qwen3_template
    return out


def final_answer(completion) -> str:
    """The final assistant turn's text: TRL's last message, or prefopt's transcript's last turn.

    TRL gives a conversational completion as messages (the assistant's turns, parsed,
    and the tool messages); prefopt gives the transcript after the prompt as text
    (special tokens dropped, so a later turn starts after ``assistant`` and a newline).
    A turn that is a tool call has no answer.
    """
    if isinstance(completion, list):
        last = completion[-1] if completion else {}
        if last.get("role") != "assistant" or last.get("tool_calls"):
            return ""
        return (last.get("content") or "").strip()
    text = completion.rsplit(RESPONSE_CLOSE, 1)[-1]
    text = re.sub(r"^\s*(tool|assistant)?\s*", "", text.split("assistant\n")[-1])
    return "" if "<tool_call>" in text else text.replace(END, "").strip()


def tool_calls(completion) -> int:
    """Tool calls the episode made (results it received), read the same way for both."""
    if isinstance(completion, list):
        return sum(m.get("role") == "tool" for m in completion)
    return completion.count(RESPONSE_OPEN)


def product_reward(prompts, completions, **kwargs) -> np.ndarray:
    """1 where the final assistant turn is the product of the user's problem, else 0."""
    from prefopt.worlds.arithmetic._text import solve

    out = np.zeros(len(completions))
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        problem = prompt[-1]["content"] if isinstance(prompt, list) else prompt
        out[i] = float(final_answer(completion) == solve(problem))
    return out


def conversation(problem: str) -> list:
    return [{"role": "user", "content": problem}]


def demonstrations(world, tokenizer, tools):
    """The world's demonstrations through the chat template: text prompt and completion.

    The completion is what follows the rendered prompt (with the tools), up to the last
    turn's end, whose <|im_end|> SFTPolicy appends as the EOS.
    """
    import pandas as pd

    prompts, completions = [], []
    for problem, demo in zip(world.demonstrations.prompt, world.demonstrations.completion):
        answer = world.final_answer(demo)
        messages = conversation(problem)
        head = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        if RESPONSE_CLOSE in demo:  # a call, its result, the answer
            arguments = {"expression": problem.rstrip("=")}
            call = {"type": "function", "function": {"name": "calculator", "arguments": arguments}}
            messages = messages + [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "calculator", "content": answer},
            ]
        messages = messages + [{"role": "assistant", "content": answer}]
        full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        assert full.startswith(head) and full.endswith(END + "\n")
        prompts.append(head)
        completions.append(full[len(head) : -len(END + "\n")])
    return pd.DataFrame({"prompt": prompts, "completion": completions})


def build_tool_task(out_dir: str, *, n_prompts: int, sft_epochs: int, n_demonstrations: int = 2000,
                    seed: int = 0) -> dict:  # fmt: skip
    """Fit the starting model (cached in ``out_dir``) and save it, the tokenizer and the prompts."""
    done = os.path.join(out_dir, "task.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    import torch
    from transformers import GPT2Config

    import prefopt
    from prefopt import SFTPolicy
    from prefopt.worlds import CalculatorWorld

    prefopt.set_config(show_progress_bar=False)
    world = CalculatorWorld(n_demonstrations=n_demonstrations, random_state=seed)
    tok = tool_tokenizer()
    demos = demonstrations(world, tok, world.tools)
    lengths = [len(tok(p + c, add_special_tokens=False)["input_ids"]) + 1
               for p, c in zip(demos.prompt, demos.completion)]  # fmt: skip
    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, n_inner=256, n_positions=128,
        vocab_size=len(tok), bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    model_dir = os.path.join(out_dir, "config")
    os.makedirs(model_dir, exist_ok=True)
    tok.save_pretrained(model_dir)
    config.name_or_path = model_dir  # a config (random weights) with its tokenizer, as the worlds'
    with torch.random.fork_rng(devices=[]):
        sft = SFTPolicy(model=config, n_epochs=sft_epochs, random_state=seed)
        sft.fit(demos)
    path = os.path.join(out_dir, "model")
    sft.model_.save_pretrained(path)
    tok.save_pretrained(path)
    prompts = [conversation(p) for p in world.prompts[:n_prompts]]
    with open(os.path.join(path, "prompts.json"), "w") as f:
        json.dump(prompts, f)
    rendered = [len(tok.apply_chat_template(p, tools=world.tools, add_generation_prompt=True,
                                            return_dict=False))
                for p in prompts[:50]]  # fmt: skip
    task = {
        "path": path,
        "n_params": sum(p.numel() for p in sft.model_.parameters()),
        "vocab": len(tok),
        "prompt_tokens": int(np.median(rendered)),
        "longest_demonstration": max(lengths),
        "tool_share": world.tool_share,
        "sft_epochs": sft_epochs,
        "n_demonstrations": len(demos),
    }
    with open(done, "w") as f:
        json.dump(task, f)
    return task
