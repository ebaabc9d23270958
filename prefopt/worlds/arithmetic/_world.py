"""ArithmeticWorld: the problems, their split, the demonstrations and the two rewards."""

from __future__ import annotations

import os
from numbers import Integral

import numpy as np
import pandas as pd
from sklearn.utils import check_random_state

from .._tiny_model import tiny_config
from ._text import (
    NUMBER,
    OPERATIONS,
    canonical,
    character_tokenizer,
    check_completions,
    check_split,
    final_answer,
)
from ._text import scratchpad as scratchpad_text
from ._text import solve as solve_problem

__all__ = ["ArithmeticWorld"]


class ArithmeticWorld:
    """Generated arithmetic problems with exact answers: a verifiable-reward task.

    Every problem ``"a<op>b="`` with operands of at most ``n_digits`` digits
    and an operation of ``operations`` is enumerated once; a seeded draw puts
    ``n_eval`` of them aside as the held-out split and the rest are the
    training prompts. ``n_demonstrations`` training problems, each with its
    answer as the completion, are the demonstrations that
    :class:`~prefopt.SFTPolicy` learns from.

    The tokenizer has one token per character (digits, ``+ - * =``), so an
    answer is written digit by digit and then ended by EOS; whitespace is
    ignored and decoding joins characters without spaces (``"37+45="`` and
    ``"82"``).

    Two rewards, plain callables ``reward(prompts, completions, *, answer=None,
    **kwargs) -> ndarray`` as TRL's ``reward_funcs`` are:
    :meth:`correctness_reward` (1 when the completion is the exact answer, else
    0) and :meth:`format_reward` (1 when it is a well-formed integer short
    enough to have ended with EOS). Pass@k (Chen et al. 2021) of a policy is
    :func:`prefopt.metrics.make_pass_at_k_scorer` with the correctness reward.

    Parameters
    ----------
    n_digits : int, default=2
        Most digits of an operand (1 to 3): operands are 0 to ``10**n_digits - 1``.
    operations : str, default="+"
        The operations drawn, any of ``"+"``, ``"-"`` and ``"*"`` (``"+-"`` for
        sums and differences; a difference may be negative).
    n_eval : int, default=200
        Problems held out: :attr:`eval_prompts`, never a prompt or a
        demonstration.
    n_demonstrations : int, default=4000
        Training problems (distinct) given with their answers as demonstrations.
    scratchpad : bool, default=False
        Demonstrations that show their work before the answer, one step per
        column of a sum (``"47+68="`` then ``"7+8=15,4+6+1=11,115"``: 7 to 19
        characters for two-digit sums), and rewards that read the answer after
        the last ``","``; the scratchpad itself is not checked, as a verifiable
        reward checks only the final answer. Sums only (``operations="+"``).
        The tokenizer gets ``","`` as one more character; without a scratchpad
        the world is as before, id for id.
    cache_dir : str, default=None
        Folder under which :meth:`model_config` saves the tokenizer; ``None``
        is the system's temporary folder.
    random_state : int, RandomState instance or None, default=None
        Seed of the split and of the demonstrations.

    Attributes
    ----------
    prompts : list of str
        The training problems (RL prompts), in a seeded random order.
    answers : list of str
        The exact answer of each of :attr:`prompts`.
    eval_prompts, eval_answers : list of str
        The held-out problems and their answers.
    dataset, eval_dataset : pandas.DataFrame
        Columns ``prompt`` and ``answer``: the training and the held-out
        problems as a table (``datasets.Dataset.from_pandas`` takes it as is),
        whose ``answer`` column a reward receives as the keyword ``answer``
        where the loop passes dataset columns to rewards.
    demonstrations : pandas.DataFrame
        Columns ``prompt`` and ``completion`` (the answer, or with ``scratchpad``
        the work and the answer, without EOS: supervised fine-tuning appends it).
    tokenizer : transformers.PreTrainedTokenizerFast
        ``[PAD]`` (id 0), ``[UNK]`` (1), ``</s>`` (2, EOS), then one id per character.
    max_new_tokens : int
        Characters of the longest answer (with ``scratchpad``, of the longest
        worked answer) plus one for EOS.

    See Also
    --------
    prefopt.metrics.pass_at_k : The unbiased pass@k estimator.
    prefopt.worlds.ReviewWorld : A task whose gold reward is a sentiment lexicon.

    Notes
    -----
    A response that never samples EOS is cut at :attr:`max_new_tokens`
    characters (the policies' default after SFT on the demonstrations), one
    more than the longest answer, so its text is never a well-formed answer:
    both rewards give it 0 even where the loop's missing-EOS rule is off.

    The start: ``SFTPolicy(model=world.model_config(), n_epochs=6,
    random_state=0)`` on the 4,000 demonstrations. Its held-out pass@1 (8 samples
    of each of 200 held-out problems) is 0.18-0.45 on world seeds 0-3, GPT-2- and
    Llama-shaped (5 epochs left seeds 1 and 3 near 0.08).

    Measured by ``python benchmarks/verifiable_world.py --learning-rate default``
    (commit a416596, world seed 0; pass@k from 16 samples of each held-out
    problem at the policy's temperature, 0.7): the start has held-out pass@1 0.317
    and pass@8 0.817. Each algorithm at prefopt's defaults (the tiny-model rates of
    ``benchmarks/LR_SWEEP.md``) except ``n_steps=300`` and ``batch_size=64``,
    rewarded by :meth:`correctness_reward`, seeds 0, 1 and 2, 18-86 s a fit on one
    core, no health warning:

    =========  =============  =======================  =======================  ======
    algorithm  learning rate  end pass@1, seeds 0/1/2  end pass@8, seeds 0/1/2  max KL
    =========  =============  =======================  =======================  ======
    GRPO       0.0001         0.343 / 0.339 / 0.335    0.828 / 0.816 / 0.829    0.7
    RLOO       0.0001         0.359 / 0.353 / 0.356    0.833 / 0.834 / 0.839    0.7
    PPO        0.0003         0.582 / 0.600 / 0.590    0.863 / 0.890 / 0.869    1.7
    =========  =============  =======================  =======================  ======

    Each raises held-out pass@1 on every seed; pass@8 moves less than pass@1. At
    1e-3 (the earlier default, 5-epoch start, ``benchmarks/verifiable_world.csv``)
    GRPO and RLOO collapse in their first steps (KL 9-13 nats) and end below the
    start on every seed; PPO falls, then recovers to 0.60-0.67.
    ``benchmarks/verifiable_world_defaults.csv`` holds every run.

    The sanity configuration (prime-rl's sanity check: on problems its start
    solves 20-80% of the time, a sound method pushes training accuracy above
    95%): ``ArithmeticWorld(n_digits=1, n_eval=90, n_demonstrations=10,
    random_state=0)``, its 10 training problems learnt by
    ``SFTPolicy(model=world.model_config(n_layer=1), n_epochs=60,
    random_state=0)``, which solves 0.36 of them (8 samples each). At their
    defaults (the adaptive learning rate), 250 steps of 64 episodes, seed 0, no
    health warning, training accuracy ends at: GRPO 1.000, RLOO 1.000 (256
    episodes a step), PPO 1.000, REINFORCE 1.000, RAFT 1.000 and REINFORCE++
    0.975, in 6-25 s of CPU a fit
    (``tests/test_arithmetic.py``).

    References
    ----------
    M. Chen et al., "Evaluating large language models trained on code",
    arXiv:2107.03374, 2021 (pass@k).

    Z. Shao et al., "DeepSeekMath: Pushing the limits of mathematical reasoning
    in open language models", arXiv:2402.03300, 2024 (GRPO with a rule-based
    reward).

    N. Lambert et al., "Tulu 3: Pushing frontiers in open language model
    post-training", arXiv:2411.15124, 2024 (reinforcement learning with
    verifiable rewards).

    Examples
    --------
    >>> from prefopt.worlds import ArithmeticWorld
    >>> world = ArithmeticWorld(random_state=0)
    >>> world.prompts[0], world.answers[0]
    ('67+68=', '135')
    >>> len(world.prompts), len(world.eval_prompts)
    (9800, 200)
    >>> world.correctness_reward(["67+68="] * 3, ["135", "134", "0135"])
    array([1., 0., 0.])
    >>> world.format_reward(["67+68="] * 3, ["135", "134", "0135"])
    array([1., 1., 0.])
    >>> world.tokenizer.decode(world.tokenizer("67+68=135")["input_ids"])
    '67+68=135'
    """

    def __init__(
        self,
        *,
        n_digits: int = 2,
        operations: str = "+",
        n_eval: int = 200,
        n_demonstrations: int = 4000,
        scratchpad: bool = False,
        cache_dir: str | None = None,
        random_state=None,
    ):
        if (
            isinstance(n_digits, bool)
            or not isinstance(n_digits, Integral)
            or not 1 <= n_digits <= 3
        ):
            raise ValueError(f"n_digits must be an integer from 1 to 3; got {n_digits!r}.")
        if (
            not isinstance(operations, str)
            or not operations
            or set(operations) - set(OPERATIONS)
            or len(set(operations)) != len(operations)
        ):
            raise ValueError(
                "operations must be a string of distinct characters among '+', '-' and '*' "
                f"(such as '+-'); got {operations!r}."
            )
        n_problems = len(operations) * 10 ** (2 * n_digits)
        check_split(
            n_eval, n_demonstrations, n_problems,
            f"n_digits={n_digits} with operations={operations!r} (raise n_digits)",
        )  # fmt: skip
        if not isinstance(scratchpad, bool):
            raise TypeError(f"scratchpad must be True or False; got {scratchpad!r}.")
        if scratchpad and operations != "+":
            raise ValueError(
                f"scratchpad=True writes the column work of sums only; got operations="
                f"{operations!r}. Use operations='+' or scratchpad=False."
            )
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a path or None; got {type(cache_dir).__name__}.")
        self.n_digits = int(n_digits)
        self.operations = operations
        self.n_eval = int(n_eval)
        self.n_demonstrations = int(n_demonstrations)
        self.scratchpad = scratchpad
        self.cache_dir = cache_dir
        self.random_state = random_state

        rng = check_random_state(random_state)
        size = 10**n_digits
        # Problem i is operation i // size**2 on operands (i // size) % size and i % size.
        order = rng.permutation(n_problems)
        problems = [
            f"{(i // size) % size}{operations[i // size**2]}{i % size}=" for i in order.tolist()
        ]
        answers = [solve_problem(p) for p in problems]
        self.eval_prompts, self.eval_answers = problems[:n_eval], answers[:n_eval]
        self.prompts, self.answers = problems[n_eval:], answers[n_eval:]
        self.dataset = pd.DataFrame({"prompt": self.prompts, "answer": self.answers})
        self.eval_dataset = pd.DataFrame({"prompt": self.eval_prompts, "answer": self.eval_answers})
        # The training problems are in random order already: the first ones are a draw.
        shown = self.prompts[:n_demonstrations]
        completions = [scratchpad_text(p) for p in shown] if scratchpad else self.answers
        self.demonstrations = pd.DataFrame(
            {"prompt": shown, "completion": completions[:n_demonstrations]}
        )
        self.tokenizer = character_tokenizer(scratchpad)
        written = [scratchpad_text(p) for p in problems] if scratchpad else answers
        self.max_new_tokens = 1 + max(len(a) for a in written)

    def __repr__(self) -> str:
        return (
            f"ArithmeticWorld(n_digits={self.n_digits}, operations={self.operations!r}, "
            f"n_eval={self.n_eval}, n_demonstrations={self.n_demonstrations}, "
            + (f"scratchpad={self.scratchpad}, " if self.scratchpad else "")
            + f"random_state={self.random_state!r})"
        )

    # ----- answers and rewards -----------------------------------------------------
    @staticmethod
    def solve(prompt: str) -> str:
        """The exact answer of a problem, computed from its text.

        Parameters
        ----------
        prompt : str
            A problem such as ``"12+7="`` (whitespace allowed).

        Returns
        -------
        answer : str
            The answer's canonical decimal string.

        Examples
        --------
        >>> ArithmeticWorld.solve("12 * 7 =")
        '84'
        """
        return solve_problem(prompt)

    def _answers(self, prompts, answer, n: int, name: str) -> list[str]:
        if answer is None:
            return [solve_problem(p) for p in prompts]
        if isinstance(answer, (str, bytes)) or not hasattr(answer, "__len__"):
            raise TypeError(
                f"{name}: answer must be a list with one answer per completion (a dataset "
                f"column); got {type(answer).__name__}."
            )
        if len(answer) != n:
            raise ValueError(
                f"{name} got {len(answer)} answers for {n} completions; answer= must hold "
                "one answer per completion, repeated for the samples of a prompt."
            )
        return [canonical(a) for a in answer]

    def correctness_reward(self, prompts, completions, *, answer=None, **kwargs) -> np.ndarray:
        """1 where the completion is the exact answer, else 0: the verifiable reward.

        The completion, stripped of surrounding whitespace, must be the answer's
        canonical decimal string (``"82"``, not ``"082"`` or ``"82.0"``); with
        ``scratchpad``, the text after its last ``","`` must be (the work before
        it is not checked, and a response of any length can be right).

        Parameters
        ----------
        prompts : list of str
            One problem per completion.
        completions : list of str
            The responses, without their EOS (as the policies decode them).
        answer : list of str or int, default=None
            The answer of each completion (a dataset's ``answer`` column, repeated
            for the samples of a prompt); ``None`` solves each prompt.
        **kwargs
            Other dataset columns, ignored.

        Returns
        -------
        rewards : ndarray of shape (n,)
            0.0 or 1.0.

        Examples
        --------
        >>> world = ArithmeticWorld(n_digits=1, n_eval=10, n_demonstrations=10, random_state=0)
        >>> world.correctness_reward(["2+3=", "2+3="], ["5", " 5 "])
        array([1., 1.])
        >>> world.correctness_reward(["what is two and three?"], ["5"], answer=["5"])
        array([1.])
        """
        prompts, completions = check_completions(prompts, completions, "correctness_reward")
        truth = self._answers(prompts, answer, len(completions), "correctness_reward")
        if self.scratchpad:
            completions = [final_answer(c) for c in completions]
        return np.array([c.strip() == t for c, t in zip(completions, truth)], dtype=np.float64)

    def format_reward(self, prompts, completions, **kwargs) -> np.ndarray:
        """1 where the completion is a well-formed integer that ended with EOS, else 0.

        Well formed: an optional minus sign and digits without leading zeros
        (``"0"``, ``"82"``, ``"-3"``), whitespace around it allowed, and at most
        ``max_new_tokens - 1`` characters, so that sampling stopped at an EOS
        rather than at the length limit. With ``scratchpad``, the text after the
        last ``","`` is the integer, and a ``","`` must be there (work shown),
        at any length. Whether the answer is right is not checked.

        Parameters
        ----------
        prompts : list of str
            One per completion; checked for length only.
        completions : list of str
            The responses, without their EOS.
        **kwargs
            Dataset columns (``answer``, ...), ignored.

        Returns
        -------
        rewards : ndarray of shape (n,)
            0.0 or 1.0.

        Examples
        --------
        >>> world = ArithmeticWorld(n_digits=1, n_eval=10, n_demonstrations=10, random_state=0)
        >>> world.format_reward(["2+3="] * 4, ["5", "-0", "", "123"])
        array([1., 0., 0., 0.])
        """
        _, completions = check_completions(prompts, completions, "format_reward")
        if self.scratchpad:
            return np.array(
                [bool(NUMBER.fullmatch(final_answer(c).strip())) and "," in c for c in completions],
                dtype=np.float64,
            )
        longest = self.max_new_tokens - 1
        return np.array(
            [bool(NUMBER.fullmatch(c.strip())) and len(c.strip()) <= longest for c in completions],
            dtype=np.float64,
        )

    # ----- the model ---------------------------------------------------------------
    def model_config(self, architecture: str = "gpt2", **overrides):
        """A tiny causal-LM config for this world's tokenizer, which it knows how to find.

        The tokenizer is saved once to a folder named by a hash of it and the
        default config, under ``cache_dir`` or the system's temporary folder,
        and the config's ``name_or_path`` points there, so a prefopt estimator
        given only the config loads this world's tokenizer.

        Parameters
        ----------
        architecture : {"gpt2", "llama", "qwen2"}, default="gpt2"
            GPT-2 (learned positions, GELU, LayerNorm), or a Llama- or
            Qwen2-shaped model (rotary positions, SwiGLU, RMSNorm, grouped
            key/value heads; Qwen2 adds biases to the query, key and value).
            Each has 2 layers of width 64 and 4 heads (2 key/value heads for
            Llama and Qwen2), no dropout, 32 positions (64 with ``scratchpad``,
            room for a response to grow to twice the longest worked answer).
        **overrides
            Parameters of the architecture's config replacing the defaults.

        Returns
        -------
        config : transformers.GPT2Config, LlamaConfig or Qwen2Config

        Examples
        --------
        >>> world = ArithmeticWorld(n_digits=1, n_eval=10, n_demonstrations=10, random_state=0)
        >>> config = world.model_config()
        >>> type(config).__name__, config.vocab_size == len(world.tokenizer)
        ('GPT2Config', True)
        >>> type(world.model_config("llama", num_hidden_layers=1)).__name__
        'LlamaConfig'
        """
        need = 2 * self.n_digits + 2 + self.max_new_tokens  # longest problem, answer, EOS
        return tiny_config(
            self.tokenizer,
            architecture,
            need=need,
            positions=64 if self.scratchpad else 32,
            cache_dir=self.cache_dir,
            overrides=overrides,
            name="prefopt-arithmetic-world",
            what="the longest problem, its answer and EOS",
        )
