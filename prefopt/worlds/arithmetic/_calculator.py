"""CalculatorWorld: products beyond a tiny model's reach, and a calculator tool within it."""

from __future__ import annotations

from numbers import Integral

import numpy as np
import pandas as pd
from sklearn.utils import check_random_state

from .._tiny_model import tiny_config
from .._tokenizer import EOS
from ._text import character_tokenizer, check_completions, check_split
from ._text import solve as solve_problem

__all__ = ["CalculatorWorld", "calculator"]

# The tool call and result as the Hermes format writes them (what prefopt reads without a
# chat template), each fixed piece one token of the world's vocabulary.
CALL_OPEN = '<tool_call>{"name": "calculator", "arguments": {"expression": "'
CALL_CLOSE = '"}}</tool_call>'
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def calculator(expression: str) -> str:
    """Compute a product, sum or difference of two integers.

    Args:
        expression: Two integers and an operation, such as "37*45".
    """
    return solve_problem(expression.strip() + "=")


class CalculatorWorld:
    """Multiplication of multi-digit numbers with a calculator tool: a multi-turn tool world.

    A problem ``"a*b="`` (operands of ``n_digits`` digits, products of up to
    ``2 * n_digits`` digits) is beyond what a tiny model computes, but not
    beyond what it can copy: with the tool, the policy's first turn calls
    ``calculator`` on the problem, the tool's result comes back as a tool
    message, and its second turn writes the result. The gold success of an
    episode is whether its final answer (what follows the last tool result,
    or the whole completion when the tool was not called) is the product.

    Of the demonstrations (for :class:`~prefopt.SFTPolicy`), a share
    ``tool_share`` calls the tool; the rest answer at once (rightly), which
    the model cannot learn to do, so the start calls the tool only part of
    the time and reinforcement learning on :meth:`correctness_reward` has
    a clear gain to make: call the tool, then copy its answer.

    Parameters
    ----------
    n_digits : int, default=2
        Digits of each operand (2 or 3).
    n_eval : int, default=200
        Held-out problems (:attr:`eval_prompts`).
    n_demonstrations : int, default=2000
        Training problems given with a demonstration.
    tool_share : float, default=0.5
        Share of the demonstrations that use the tool.
    cache_dir : str, default=None
        Folder under which :meth:`model_config` saves the tokenizer.
    random_state : int, RandomState instance or None, default=None
        Seed of the split and of the demonstrations.

    Attributes
    ----------
    prompts, answers : list of str
        The training problems and their products.
    eval_prompts, eval_answers : list of str
        The held-out problems and their products.
    demonstrations : pandas.DataFrame
        Columns ``prompt`` and ``completion``: a tool call, its end of turn,
        the tool's result and the answer; or the answer alone.
    tools : list of callables
        ``[calculator]``, the estimators' ``tools``.
    tokenizer : transformers.PreTrainedTokenizerFast
        One token per character, and one for each fixed piece of a tool call
        and a tool result.
    max_new_tokens : int
        Tokens of the longest turn (a tool call) and its EOS.

    See Also
    --------
    prefopt.worlds.ArithmeticWorld : The single-turn arithmetic world.

    Notes
    -----
    Measured by ``python benchmarks/calculator_world.py --seeds 0 1 2 3 4 --n-steps 30``
    (commit fcd81d7; ``benchmarks/calculator_world.csv``): one SFT start (world seed 0,
    4 epochs on the 2,000 demonstrations), then GRPO and RLOO at their defaults with
    ``tools=world.tools``, ``max_turns=3``, ``batch_size=64`` and 30 steps, 2-6 minutes a
    fit on a shared CPU. Held-out gold success (one episode on each of the 200 held-out
    problems, so a standard error of about 0.03) rises on every seed: GRPO from
    0.205-0.305 to 0.305-0.38, RLOO to 0.33-0.425; the share of episodes calling the tool
    from 0.60-0.70 to 0.835-0.915; no health warning (the episodes' detectors were
    added after this run; its last steps' shares of tool errors, at most 0.07, of
    truncated episodes, at most 0.0625, and of held-out episodes without a call, at most
    0.165, are far below their thresholds). Seed 2's gains (0.03 and 0.025) are within one
    standard error.

    Examples
    --------
    >>> world = CalculatorWorld(n_eval=4, n_demonstrations=8, random_state=0)
    >>> world.prompts[0], world.answers[0]
    ('93*65=', '6045')
    >>> calculator("93*65")
    '6045'
    >>> done = world.demonstrations.completion[world.demonstrations.completion.str.len() > 10]
    >>> done.iloc[0]
    '<tool_call>{"name": ...
    >>> world.correctness_reward(["12*34="] * 2, ["<tool_response>408</tool_response>408", "408"])
    array([1., 1.])
    """

    def __init__(self, *, n_digits: int = 2, n_eval: int = 200, n_demonstrations: int = 2000,
                 tool_share: float = 0.5, cache_dir=None, random_state=None):  # fmt: skip
        if isinstance(n_digits, bool) or not isinstance(n_digits, Integral) or n_digits not in (
            2, 3,
        ):  # fmt: skip
            raise ValueError(f"n_digits must be 2 or 3; got {n_digits!r}.")
        low, high = 10 ** (n_digits - 1), 10**n_digits
        n_problems = (high - low) ** 2
        check_split(n_eval, n_demonstrations, n_problems, f"n_digits={n_digits}")
        if not 0.0 <= float(tool_share) <= 1.0:
            raise ValueError(f"tool_share must be in [0, 1]; got {tool_share!r}.")
        self.n_digits, self.n_eval, self.n_demonstrations = n_digits, n_eval, n_demonstrations
        self.tool_share, self.cache_dir, self.random_state = tool_share, cache_dir, random_state
        rng = check_random_state(random_state)
        order = rng.permutation(n_problems)
        size = high - low
        problems = [f"{low + i // size}*{low + i % size}=" for i in order.tolist()]
        answers = [solve_problem(p) for p in problems]
        self.eval_prompts, self.eval_answers = problems[:n_eval], answers[:n_eval]
        self.prompts, self.answers = problems[n_eval:], answers[n_eval:]
        uses = rng.random_sample(n_demonstrations) < tool_share
        self.demonstrations = pd.DataFrame({
            "prompt": self.prompts[:n_demonstrations],
            "completion": [
                self.tool_use(p, a) if use else a
                for p, a, use in zip(self.prompts, self.answers, uses)
            ],
        })  # fmt: skip
        self.tools = [calculator]
        tok = character_tokenizer()
        tok.add_tokens([CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE])
        self.tokenizer = tok
        self.max_new_tokens = 2 * n_digits + 4  # the call: open, operands, "*", close, EOS

    def __repr__(self) -> str:
        return (
            f"CalculatorWorld(n_digits={self.n_digits}, n_eval={self.n_eval}, "
            f"n_demonstrations={self.n_demonstrations}, tool_share={self.tool_share}, "
            f"random_state={self.random_state!r})"
        )

    @staticmethod
    def tool_use(prompt: str, answer: str) -> str:
        """The demonstration of a tool call: the call, its end of turn, the result, the answer.

        Parameters
        ----------
        prompt : str
            A problem, ``"a*b="``.
        answer : str
            Its product.

        Returns
        -------
        completion : str

        Examples
        --------
        >>> CalculatorWorld.tool_use("12*34=", "408")[-53:]
        '</tool_call></s><tool_response>408</tool_response>408'
        """
        expression = prompt.rstrip("=")
        result = f"{RESPONSE_OPEN}{answer}{RESPONSE_CLOSE}"
        return f"{CALL_OPEN}{expression}{CALL_CLOSE}{EOS}{result}{answer}"

    @staticmethod
    def final_answer(completion: str) -> str:
        """What follows the last tool result, or the whole completion (stripped).

        Parameters
        ----------
        completion : str
            One episode's transcript.

        Returns
        -------
        answer : str
            The text after the last ``</tool_response>``, stripped.

        Examples
        --------
        >>> CalculatorWorld.final_answer("<tool_response>408</tool_response> 408")
        '408'
        """
        return completion.rsplit(RESPONSE_CLOSE, 1)[-1].strip()

    def correctness_reward(self, prompts, completions, **kwargs) -> np.ndarray:
        """1 where an episode's final answer is the product, else 0: the gold success.

        Parameters
        ----------
        prompts : list of str
            One problem per completion.
        completions : list of str
            The episodes' transcripts (tool results included).
        **kwargs
            Dataset columns, ignored.

        Returns
        -------
        rewards : ndarray of shape (n,)

        Examples
        --------
        >>> world = CalculatorWorld(n_eval=4, n_demonstrations=8, random_state=0)
        >>> world.correctness_reward(["12*34="] * 2, ["407", "<tool_call>"])
        array([0., 0.])
        """
        prompts, completions = check_completions(prompts, completions, "correctness_reward")
        truth = [solve_problem(p) for p in prompts]
        return np.array(
            [self.final_answer(c) == t for c, t in zip(completions, truth)], dtype=np.float64
        )

    @staticmethod
    def calls_tool(completions) -> np.ndarray:
        """Whether each transcript called the tool (its result is in it).

        Parameters
        ----------
        completions : list of str
            The episodes' transcripts.

        Returns
        -------
        called : ndarray of bool, shape (n,)

        Examples
        --------
        >>> CalculatorWorld.calls_tool(["408", "<tool_response>408</tool_response>408"])
        array([False,  True])
        """
        return np.array([RESPONSE_CLOSE in c for c in completions])

    def gold_success(self, policy, prompts=None, *, random_state=0) -> float:
        """Share of held-out problems a policy with the tool solves: one episode each.

        Parameters
        ----------
        policy : fitted policy
            Fitted with ``tools=world.tools``.
        prompts : list of str, default=None
            ``None``: :attr:`eval_prompts`.
        random_state : int, default=0
            Seed of the episodes' sampling.

        Returns
        -------
        success : float

        Examples
        --------
        >>> import prefopt
        >>> from prefopt import GRPOPolicy
        >>> prefopt.set_config(show_progress_bar=False)
        >>> world = CalculatorWorld(n_eval=4, n_demonstrations=8, random_state=0)
        >>> policy = GRPOPolicy(model=world.model_config(), tools=world.tools, n_steps=0,
        ...                     max_new_tokens=world.max_new_tokens, random_state=0)
        >>> policy = policy.fit(world.prompts, world.correctness_reward)
        >>> 0.0 <= world.gold_success(policy) <= 1.0
        True
        """
        prompts = self.eval_prompts if prompts is None else list(prompts)
        episodes = policy.sample_episodes(prompts, random_state=random_state)
        return float(self.correctness_reward(prompts, episodes["transcript"]).mean())

    def model_config(self, architecture: str = "gpt2", **overrides):
        """A tiny causal-LM config for this world's tokenizer (see ``ArithmeticWorld``).

        Parameters
        ----------
        architecture : {"gpt2", "llama", "qwen2"}, default="gpt2"
        **overrides
            Parameters of the architecture's config replacing the defaults.

        Returns
        -------
        config : transformers config

        Examples
        --------
        >>> world = CalculatorWorld(n_eval=4, n_demonstrations=8, random_state=0)
        >>> world.model_config().vocab_size == len(world.tokenizer)
        True
        """
        digits = 2 * self.n_digits
        # The prompt and BOS, a call, the result and the answer with its EOS.
        need = (digits + 2) + self.max_new_tokens + (digits + 2) + (digits + 1)
        return tiny_config(
            self.tokenizer, architecture, need=need, positions=32 if need <= 32 else 64,
            cache_dir=self.cache_dir, overrides=overrides, name="prefopt-calculator-world",
            what="a problem, a tool call, its result and the answer",
        )  # fmt: skip
