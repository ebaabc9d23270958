"""The arithmetic world's text: problems, answers, completions and the character tokenizer."""

from __future__ import annotations

import re
from numbers import Integral

import numpy as np
from tokenizers import Regex, decoders, pre_tokenizers

from .._tokenizer import EOS, word_level_tokenizer

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
# Every character a problem or an answer can hold, so the vocabulary is the same for
# every choice of operations and digits: one id per character.
CHARACTERS = list("0123456789") + list(OPERATIONS) + ["="]
PROBLEM = re.compile(r"\s*(\d+)\s*([-+*])\s*(\d+)\s*=\s*")
NUMBER = re.compile(r"0|-?[1-9][0-9]*")  # no leading zeros, no "+" sign, no "-0"
STEP = ","  # separates the scratchpad's steps, and the last step from the answer


def scratchpad(prompt) -> str:
    """The column-by-column work of a sum ``"a+b="``, least significant column first.

    One step per column, ``"<digit of a>+<digit of b>[+1]=<column sum>"`` (``+1`` where
    the previous column carried), then the answer after the last :data:`STEP`:
    ``"47+68="`` gives ``"7+8=15,4+6+1=11,115"``, written as a pupil does it (Nye et al.
    2021, "Show your work: scratchpads for intermediate computation").
    """
    match = PROBLEM.fullmatch(prompt) if isinstance(prompt, str) else None
    if match is None or match.group(2) != "+":
        raise ValueError(f"A scratchpad is written for sums 'a+b=' only; got {prompt!r}.")
    a, _, b = match.groups()
    width = max(len(a), len(b))
    a, b = a.zfill(width)[::-1], b.zfill(width)[::-1]
    steps, carry = [], 0
    for x, y in zip(a, b):
        total = int(x) + int(y) + carry
        steps.append(f"{x}+{y}{'+1' if carry else ''}={total}")
        carry = total // 10
    return STEP.join([*steps, solve(prompt)])


def final_answer(completion: str) -> str:
    """The answer of a scratchpad completion: the text after its last :data:`STEP`."""
    return completion.rpartition(STEP)[2]


def solve(prompt) -> str:
    """The exact answer of a problem ``"a<op>b="`` as its canonical string."""
    match = PROBLEM.fullmatch(prompt) if isinstance(prompt, str) else None
    if match is None:
        raise ValueError(
            f"Cannot read an arithmetic problem from the prompt {prompt!r}: it must read "
            "like '12+7='. Pass the answers with answer= (a dataset's 'answer' column)."
        )
    a, op, b = match.groups()
    return str(OPERATIONS[op](int(a), int(b)))


def canonical(answer) -> str:
    """An answer given as an int or a string, as the string a correct completion must be."""
    if isinstance(answer, (Integral, np.integer)) and not isinstance(answer, bool):
        return str(int(answer))
    if isinstance(answer, str) and NUMBER.fullmatch(answer.strip()):
        return answer.strip()
    raise ValueError(
        f"An answer must be an integer or its decimal string ('82', '-3'); got {answer!r}."
    )


def check_completions(prompts, completions, name: str) -> tuple[list, list[str]]:
    prompts, completions = list(prompts), list(completions)
    if len(prompts) != len(completions):
        raise ValueError(
            f"{name} got {len(prompts)} prompts and {len(completions)} completions; "
            "give one prompt per completion."
        )
    bad = next((i for i, c in enumerate(completions) if not isinstance(c, str)), None)
    if bad is not None:
        raise TypeError(
            f"{name}: completion {bad} is a {type(completions[bad]).__name__}, not a string."
        )
    return prompts, completions


def character_tokenizer(scratchpad: bool = False):
    """The word-level tokenizer over single characters (ids of ``ArithmeticWorld.tokenizer``).

    Whitespace is split off, then every character is its own token, and
    decoding fuses the tokens back without spaces. ``scratchpad`` adds
    :data:`STEP` after the other characters, so that every other id is unchanged.
    """
    tok = word_level_tokenizer(CHARACTERS + [STEP] * scratchpad, eos_token=EOS)
    backend = tok.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("."), "isolated")]
    )
    backend.decoder = decoders.Fuse()
    return tok


def check_split(n_eval, n_demonstrations, n_problems: int, source: str) -> None:
    """Refuse split sizes that are not positive integers or need more problems than exist.

    ``source`` names what sets ``n_problems`` in the message (for example
    ``"n_digits=2"``), so the user knows which setting to raise.

    Examples
    --------
    >>> check_split(10, 20, 100, "n_digits=1")
    >>> check_split(90, 20, 100, "n_digits=1")
    Traceback (most recent call last):
    ...
    ValueError: n_eval=90 and n_demonstrations=20 need 110 distinct problems, ...
    """
    for name, value in (("n_eval", n_eval), ("n_demonstrations", n_demonstrations)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}.")
    if n_eval + n_demonstrations > n_problems:
        raise ValueError(
            f"n_eval={n_eval} and n_demonstrations={n_demonstrations} need "
            f"{n_eval + n_demonstrations} distinct problems, but {source} gives only "
            f"{n_problems}; lower them."
        )
