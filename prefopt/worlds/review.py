"""The review world: a sentiment task built locally, with VADER as the gold reward.

A stand-in for the sentiment task of Ziegler et al. (2019) that needs no
download. A grammar driven by a random seed writes short movie and product
reviews ("the movie was great and the acting was wonderful ."); each splits
into a prompt (its first 2-4 words) and a completion. A word-level tokenizer
is built from the corpus's words and a tiny GPT-2 config sized to it, so an
:class:`~prefopt.policies.SFTPolicy` learns the reviews in about a minute on a
CPU.

The gold ("true") reward is VADER's compound sentiment score of the completion,
a fixed lexicon that no estimator trains on. Simulated raters compare two
samples of a policy by Bradley-Terry on the gold reward, plus a bias towards
longer completions and Gaussian noise, so a reward model fitted to their
labels is a proxy that RL can over-optimise: past some KL its reward keeps
rising while the gold reward stalls or falls (Gao et al., 2023).
"""

from __future__ import annotations

import os
from numbers import Integral, Real

import numpy as np
import pandas as pd
from sklearn.utils import check_random_state

from ..data import Comparisons
from ..rewards._sampling import bradley_terry_labels, check_label_rows
from ._review_grammar import generate_review
from ._review_text import _check_texts, _compound, _conversational
from ._tiny_model import tiny_config
from ._tokenizer import (
    ASSISTANT,
    CHAT_TEMPLATE,
    END_OF_TURN,
    EOS,
    USER,
    word_level_tokenizer,
    words_by_frequency,
)

__all__ = ["ReviewWorld"]

# Enough redraws that a policy repeating itself half the time still yields n
# pairs; a policy that (nearly) always repeats itself gets an error instead.
_MAX_ROUNDS = 50


class ReviewWorld:
    """A review-writing task built locally, with VADER sentiment as the gold reward.

    Parameters
    ----------
    n_reviews : int, default=2000
        Reviews in the corpus (at most 5000). Every review is one demonstration.
    rater_temperature : float, default=0.25
        Raters prefer completion a to b with probability
        ``sigmoid((gold_a - gold_b) / rater_temperature
        + length_bias * (words_a - words_b) / 10 + noise)``; the gold reward lies
        in [-1, 1], so 0.25 makes a clear sentiment gap decisive.
    rater_noise : float, default=0.5
        Standard deviation of the Gaussian noise added to each rater's logit.
    length_bias : float, default=1.0
        Logit added per 10 extra words: raters over-rate long completions, so a
        reward model fitted to them rewards length that the gold reward ignores.
    cache_dir : str, default=None
        Folder under which :meth:`model_config` saves the tokenizer;
        ``None`` is the system's temporary folder.
    chat : bool, default=False
        Conversational data, in TRL's format: each prompt is ``[{"role":
        "user", "content": ...}]`` and each completion ``[{"role": "assistant",
        "content": ...}]``. The tokenizer gains the words ``<user>`` and
        ``<assistant>``, the end-of-turn token ``<eot>`` and a chat template over
        them (``<user> the movie <assistant> was great . <eot>``), and
        :meth:`model_config` lists ``</s>`` and ``<eot>`` as EOS ids.
    random_state : int, RandomState instance or None, default=None
        Seed of the corpus, and default seed of :meth:`comparisons`.

    Attributes
    ----------
    corpus : list of str
        The reviews, each ending with " .".
    demonstrations : pandas.DataFrame
        Columns ``prompt`` and ``completion``, one row per review, with
        ``prompt + completion`` the review. Completions start with a space
        (the tokenizer splits on whitespace, so it changes no token) and carry
        no EOS: supervised fine-tuning appends it. Messages with ``chat=True``.
    prompts : list of str (of conversations with ``chat=True``)
        The distinct prompts, in order of first appearance: the RL prompts.
    references : pandas.DataFrame
        One reference completion per prompt (the first review with it), rows in
        the order of ``prompts``: for shifting a reward and for win rates.
    tokenizer : transformers.PreTrainedTokenizerFast
        Word-level; ``[PAD]`` (id 0), ``[UNK]`` (1) and ``</s>`` (2, EOS).
    max_new_tokens : int
        Tokens of the longest completion plus one for EOS: enough new tokens
        to sample any review.

    See Also
    --------
    prefopt.worlds.PreferenceWorld : An exactly solvable world.

    Notes
    -----
    The gold reward scores the completion alone. Prompts are cut inside each
    review's opener, whose words VADER does not score, so a prompt never
    carries sentiment that its completion would be judged without.

    References
    ----------
    C. J. Hutto and E. Gilbert, "VADER: A parsimonious rule-based model for
    sentiment analysis of social media text", ICWSM, 2014.

    D. M. Ziegler et al., "Fine-tuning language models from human
    preferences", arXiv:1909.08593, 2019 (the mock sentiment task).

    L. Gao, J. Schulman and J. Hilton, "Scaling laws for reward model
    overoptimization", ICML, 2023.

    Examples
    --------
    >>> from prefopt.worlds.review import ReviewWorld
    >>> world = ReviewWorld(n_reviews=200, random_state=0)
    >>> world.demonstrations.columns.tolist()
    ['prompt', 'completion']
    >>> world.gold_reward(["the movie was"] * 2, [" great .", " awful ."]).round(3)
    array([ 0.625, -0.459])
    >>> config = world.model_config()
    >>> config.vocab_size == len(world.tokenizer)
    True
    """

    def __init__(
        self,
        *,
        n_reviews: int = 2000,
        rater_temperature: float = 0.25,
        rater_noise: float = 0.5,
        length_bias: float = 1.0,
        cache_dir: str | None = None,
        chat: bool = False,
        random_state=None,
    ):
        if (
            isinstance(n_reviews, bool)
            or not isinstance(n_reviews, Integral)
            or not 1 <= n_reviews <= 5000
        ):
            raise ValueError(f"n_reviews must be an integer between 1 and 5000; got {n_reviews!r}.")
        checks = (
            ("rater_temperature", rater_temperature, lambda v: v > 0, ", > 0"),
            ("rater_noise", rater_noise, lambda v: v >= 0, ", >= 0"),
            ("length_bias", length_bias, lambda v: True, ""),
        )
        for name, value, ok, need in checks:
            if not (isinstance(value, Real) and np.isfinite(value) and ok(value)):
                raise ValueError(f"{name} must be a finite number{need}; got {value!r}.")
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a path or None; got {type(cache_dir).__name__}.")
        self.n_reviews = n_reviews
        self.rater_temperature = float(rater_temperature)
        self.rater_noise = float(rater_noise)
        self.length_bias = float(length_bias)
        self.cache_dir = cache_dir
        self.chat = bool(chat)
        self.random_state = random_state

        rng = check_random_state(random_state)
        pairs = [generate_review(rng) for _ in range(n_reviews)]
        self.corpus = [p + c for p, c in pairs]
        self.demonstrations = pd.DataFrame(pairs, columns=["prompt", "completion"])
        first = self.demonstrations.drop_duplicates("prompt", keep="first")
        self.prompts = first["prompt"].tolist()
        self.references = first.reset_index(drop=True)
        # Chat words go last, so every other id is the same as without them.
        self.tokenizer = word_level_tokenizer(
            words_by_frequency(self.corpus) + ([USER, ASSISTANT, END_OF_TURN] if chat else []),
            eos_token=EOS,
            split_on_whitespace=True,
            chat_template=CHAT_TEMPLATE if chat else None,
        )
        if chat:  # TRL's conversational format
            self.prompts = [[{"role": "user", "content": p}] for p in self.prompts]
            self.demonstrations, self.references = map(
                _conversational, (self.demonstrations, self.references)
            )
        self.max_new_tokens = 1 + max(len(c.split()) for _, c in pairs)
        self._longest_review = max(len(r.split()) for r in self.corpus)

    def __repr__(self) -> str:
        return (
            f"ReviewWorld(n_reviews={self.n_reviews}, rater_temperature="
            f"{self.rater_temperature}, rater_noise={self.rater_noise}, length_bias="
            f"{self.length_bias}, chat={self.chat}, random_state={self.random_state!r})"
        )

    # ----- rewards -----------------------------------------------------------------
    def gold_reward(self, prompts, completions) -> np.ndarray:
        """The gold reward: VADER's compound sentiment of each completion, in [-1, 1].

        Parameters
        ----------
        prompts : list of str
            One per completion; checked for length, not scored (see Notes of
            :class:`ReviewWorld`).
        completions : list of str
            The texts scored.

        Returns
        -------
        rewards : ndarray of shape (n,)
            VADER's compound score of each completion.

        Raises
        ------
        ImportError
            Without vaderSentiment, installed by ``pip install 'prefopt[worlds]'``.

        Examples
        --------
        >>> world = ReviewWorld(n_reviews=50, random_state=0)
        >>> world.gold_reward(["the film"], [" was not good ."]).round(3)
        array([-0.341])
        """
        _, completions = _check_texts(prompts, completions)
        return np.array([_compound(c) for c in completions], dtype=np.float64)

    def features(self, prompts, completions) -> np.ndarray:
        """Bag-of-words counts of each completion over the vocabulary, shape (n, vocab).

        The featurizer attached to :meth:`comparisons`, so that
        ``RewardModel()`` (a linear reward, no language model) can be fitted in
        this world too. Counts sum to the length in words, so a linear reward on
        them can learn the raters' length bias as well as sentiment.

        Parameters
        ----------
        prompts : list of str
            One per completion; checked for length, not counted.
        completions : list of str
            The texts counted, tokenized as by :attr:`tokenizer`.

        Returns
        -------
        features : ndarray of shape (n, len(tokenizer))
            Counts of each token id in each completion.

        Examples
        --------
        >>> world = ReviewWorld(n_reviews=50, random_state=0)
        >>> float(world.features(["the movie"], [" was good and good ."]).sum())
        5.0
        """
        _, completions = _check_texts(prompts, completions)
        out = np.zeros((len(completions), len(self.tokenizer)), dtype=np.float64)
        if completions:
            ids = self.tokenizer(completions, add_special_tokens=False)["input_ids"]
            for row, seq in enumerate(ids):
                np.add.at(out[row], seq, 1.0)
        return out

    def comparisons(self, policy, n: int, random_state=None) -> Comparisons:
        """Label ``n`` pairs of a policy's samples with the simulated raters.

        For each comparison a prompt is drawn uniformly from :attr:`prompts` and
        ``policy.sample(prompts, n=2, random_state=...)`` gives two completions;
        pairs whose completions are identical carry no preference and are
        redrawn. The rater prefers a to b with probability
        ``sigmoid((gold_a - gold_b) / rater_temperature
        + length_bias * (words_a - words_b) / 10 + eps)``, ``eps ~ N(0, rater_noise^2)``.

        Parameters
        ----------
        policy : object with ``sample(prompts, n, *, random_state)``
            A fitted prefopt policy (e.g. an ``SFTPolicy``), returning two
            completions per prompt.
        n : int
            Number of comparisons.
        random_state : int, RandomState instance or None, default=None
            ``None`` uses the world's ``random_state``.

        Returns
        -------
        comparisons : Comparisons
            With :meth:`features` attached as the featurizer.

        Examples
        --------
        >>> class TwoReviews:
        ...     def sample(self, prompts, n=2, *, random_state=None):
        ...         return [[" was great .", " was awful ."] for _ in prompts]
        >>> world = ReviewWorld(n_reviews=50, random_state=0)
        >>> data = world.comparisons(TwoReviews(), 100, random_state=0)
        >>> len(data), sum(c == " was great ." for c in data.chosen) > 90
        (100, True)
        """
        if not isinstance(n, Integral) or n < 1:
            raise ValueError(f"n must be a positive integer; got {n!r}.")
        if not callable(getattr(policy, "sample", None)):
            raise TypeError(
                f"policy must have a sample(prompts, n, random_state=...) method, "
                f"e.g. a fitted SFTPolicy; got {type(policy).__name__}."
            )
        rng = check_random_state(self.random_state if random_state is None else random_state)
        prompt, first, second = [], [], []
        drawn = 0
        for _ in range(_MAX_ROUNDS):
            need = n - len(prompt)
            if need == 0:
                break
            draw = [self.prompts[i] for i in rng.randint(len(self.prompts), size=need)]
            pairs = policy.sample(draw, n=2, random_state=int(rng.randint(2**31 - 1)))
            self._check_pairs(pairs, len(draw), policy)
            drawn += need
            before = len(prompt)
            for p, (a, b) in zip(draw, pairs):
                if a != b:
                    prompt.append(p)
                    first.append(a)
                    second.append(b)
            if need >= 10 and len(prompt) == before:
                break  # (nearly) deterministic: more rounds would only cost samples
        if len(prompt) < n:
            raise ValueError(
                f"{type(policy).__name__} gave two identical completions in "
                f"{drawn - len(prompt)} of {drawn} pairs, so only {len(prompt)} of the {n} "
                "comparisons could be drawn; sample at a higher temperature or from a less "
                "deterministic policy."
            )
        a_wins = self.labeler(prompt, first, second, random_state=rng) == 0
        chosen = [a if w else b for a, b, w in zip(first, second, a_wins)]
        rejected = [b if w else a for a, b, w in zip(first, second, a_wins)]
        return Comparisons(prompt, chosen, rejected, featurizer=self.features, policy=policy)

    def labeler(self, prompts, completions_a, completions_b, random_state=None) -> np.ndarray:
        """The simulated raters as a labeller: which of two completions each prefers.

        Row ``i`` prefers ``a`` with probability ``sigmoid((gold_a - gold_b) /
        rater_temperature + length_bias * (words_a - words_b) / 10 + eps)``,
        ``eps ~ N(0, rater_noise^2)``, as in :meth:`comparisons`. The signature
        of a fitted ``RewardModel.sample``, so it labels a policy's own samples
        in online reward learning (``refit_every``).

        Parameters
        ----------
        prompts, completions_a, completions_b : list of str
            One prompt and two completions per row.
        random_state : int, RandomState instance or None, default=None
            ``None`` uses the world's ``random_state``.

        Returns
        -------
        labels : ndarray of shape (n,), dtype int
            0 where ``a`` is preferred, 1 where ``b`` is.

        Examples
        --------
        >>> world = ReviewWorld(n_reviews=50, random_state=0)
        >>> world.labeler(["the film"] * 3, [" was great ."] * 3, [" was awful ."] * 3,
        ...               random_state=0).tolist()
        [0, 0, 0]
        """
        prompts, a, b = check_label_rows(prompts, completions_a, completions_b, "labeler")
        rng = check_random_state(self.random_state if random_state is None else random_state)
        extra_words = np.array(
            [len(x.split()) - len(y.split()) for x, y in zip(a, b)], dtype=np.float64
        )
        logit = (
            (self.gold_reward(prompts, a) - self.gold_reward(prompts, b)) / self.rater_temperature
            + self.length_bias * extra_words / 10.0
            + rng.normal(0.0, self.rater_noise, size=len(prompts))
        )
        return bradley_terry_labels(logit, rng)

    @staticmethod
    def _check_pairs(pairs, n_prompts: int, policy) -> None:
        name = type(policy).__name__
        if not isinstance(pairs, (list, tuple)) or len(pairs) != n_prompts:
            got = len(pairs) if isinstance(pairs, (list, tuple)) else type(pairs).__name__
            raise ValueError(
                f"{name}.sample(prompts, n=2) must return a list with one list of "
                f"two completions per prompt; got {got} for {n_prompts} prompts."
            )
        for i, pair in enumerate(pairs):
            if len(pair) != 2 or not all(isinstance(c, str) for c in pair):
                raise ValueError(
                    f"{name}.sample(prompts, n=2) returned {pair!r} for prompt "
                    f"{i}; it must be two completion strings."
                )

    # ----- pretraining text ---------------------------------------------------------
    def pretraining_texts(self, n: int, random_state=None) -> list[str]:
        """Fresh reviews from the world's grammar: pretraining text for PPO-ptx.

        The distribution the corpus was drawn from, so a policy's next-token
        loss on these texts measures how much of the language it keeps while RL
        moves it (the "alignment tax" the pretraining mix of Ouyang et al. 2022
        pays back). Pass them as ``ptx_data``; draw held-out ones with another
        seed.

        Parameters
        ----------
        n : int
            Number of reviews.
        random_state : int, RandomState instance or None, default=None
            Seed of the draw; ``None`` draws new reviews each call.

        Returns
        -------
        texts : list of str
            Whole reviews (prompt and completion), as in ``corpus``.

        Examples
        --------
        >>> world = ReviewWorld(n_reviews=50, random_state=0)
        >>> texts = world.pretraining_texts(3, random_state=1)
        >>> len(texts), all(t.endswith(" .") for t in texts)
        (3, True)
        """
        if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
            raise ValueError(f"n must be a positive integer; got {n!r}.")
        rng = check_random_state(random_state)
        return ["".join(generate_review(rng)) for _ in range(n)]

    # ----- the model ---------------------------------------------------------------
    def model_config(self, architecture: str = "gpt2", **overrides):
        """A tiny causal-LM config for this world's tokenizer, which it knows how to find.

        The tokenizer (and the default config) are saved once to a folder named
        by a hash of the tokenizer, under ``cache_dir`` or the system's temporary
        folder, and the config's ``name_or_path`` points there, so
        ``AutoTokenizer.from_pretrained(config.name_or_path)`` loads this world's
        tokenizer and a prefopt estimator given only the config finds it.

        Parameters
        ----------
        architecture : {"gpt2", "llama", "qwen2"}, default="gpt2"
            GPT-2 (``n_layer=2, n_head=4, n_embd=64, n_positions=64``), or a
            Llama- or Qwen2-shaped model of the same size (rotary positions,
            SwiGLU of width 128, RMSNorm, 2 key/value heads, tied embeddings).
        **overrides
            Parameters of the architecture's config replacing the defaults
            (no dropout, ``vocab_size=len(tokenizer)``, BOS and EOS ``</s>``,
            pad ``[PAD]``; with ``chat=True`` EOS lists ``</s>`` and ``<eot>``).

        Returns
        -------
        config : transformers.GPT2Config, LlamaConfig or Qwen2Config

        Examples
        --------
        >>> from transformers import AutoTokenizer
        >>> world = ReviewWorld(n_reviews=50, random_state=0)
        >>> config = world.model_config(n_layer=1)
        >>> config.n_layer, config.pad_token_id != config.eos_token_id
        (1, True)
        >>> tok = AutoTokenizer.from_pretrained(config.name_or_path)
        >>> tok.get_vocab() == world.tokenizer.get_vocab()
        True
        >>> type(world.model_config("llama")).__name__
        'LlamaConfig'
        """
        tok = self.tokenizer
        eos = [tok.eos_token_id, tok.convert_tokens_to_ids(END_OF_TURN)] if self.chat else None
        # A review plus its EOS (and the chat words) must fit, or SFT cannot learn to stop.
        return tiny_config(
            tok,
            architecture,
            need=self._longest_review + (3 if self.chat else 1),
            positions=64,
            cache_dir=self.cache_dir,
            overrides=overrides,
            name="prefopt-review-world",
            what="the longest review and its EOS",
            eos_token_id=eos,
        )
