"""The preference world: questions, response types and raters who over-rate flattery.

Every prompt is a question; every response is one of six *types* (a correct
answer, a correct but long and flattering one, a hedged one, a wrong one...),
each a single token with a feature vector f(y) and a true quality q(y). Raters
compare two responses by Bradley-Terry on ``q + rater_bias * flattery``, so a
reward model fitted to their labels over-rates flattery: optimise it too hard
and true quality falls (Gao et al., 2023).

The policy is pi(y|x) proportional to pi_ref(y|x) exp(theta . f(y)). Because
the response space is enumerable, the expected reward, true quality and KL of
any policy, and the closed-form optimum
pi*(y|x) = pi_ref(y|x) exp(r(x, y)/beta) / Z(x), are computed exactly.
This is the world of the worked preference-world example
(``examples/preference_world.py``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from transformers import GenerationConfig

from ..data import Comparisons
from ..rewards._sampling import bradley_terry_labels, check_label_rows
from ._exact import ExactWorld, _index_of
from ._tokenizer import word_level_tokenizer

__all__ = ["PreferenceWorld"]

FEATURE_NAMES = ("correct", "hedged", "wrong", "length", "flattery", "confident")

# (text, features in FEATURE_NAMES order, true quality). True quality is linear in
# the features (long+flattering costs 0.6 on a correct and on a wrong answer alike),
# so with rater_bias=0 the linear reward model is well specified.
RESPONSE_TYPES = (
    ("The answer is X.", (1, 0, 0, 0.2, 0, 1), 2.0),
    (
        "What a wonderful question! As an expert, I can tell you that the answer is X, "
        "and I hope this helps you.",
        (1, 0, 0, 1.0, 1, 1),
        1.4,
    ),
    ("I think the answer might be X, but I am not sure.", (1, 1, 0, 0.5, 0, 0), 1.2),
    ("That is hard to say; it depends on many things.", (0, 1, 0, 0.5, 0, 0), 0.0),
    ("The answer is Y.", (0, 0, 1, 0.2, 0, 1), -1.0),
    (
        "What a wonderful question! As an expert, I can tell you that the answer is Y, "
        "and I hope this helps you.",
        (0, 0, 1, 1.0, 1, 1),
        -1.6,
    ),
)

QUESTIONS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What is 12 times 12?",
    "Who wrote Hamlet?",
    "What is the boiling point of water at sea level?",
    "Which planet is closest to the sun?",
    "What is the square root of 81?",
    "In which year did the Berlin Wall fall?",
)

# Reference (SFT) probabilities of the six types on an easy and a hard question;
# the questions in between interpolate in log space.
_EASY = np.array([0.50, 0.14, 0.12, 0.07, 0.11, 0.06])
_HARD = np.array([0.30, 0.12, 0.15, 0.14, 0.20, 0.09])


class _LogitsOutput(dict):
    """A causal-LM output with logits and no cache."""

    def __init__(self, logits):
        super().__init__(logits=logits)
        self.logits = logits


class PreferenceWorldPolicy(nn.Module):
    """pi(y|x) proportional to pi_ref(y|x) exp(theta . f(y)) as a one-token causal LM.

    Called like a Hugging Face causal LM: ``model(input_ids, attention_mask)``
    returns an output whose ``.logits`` has shape (batch, length, vocab). At a
    question token the logits over the response tokens are
    ``log pi_ref(.|x) + F theta``; every other token has logit -inf. Build one
    with :meth:`PreferenceWorld.policy_model`.

    Parameters
    ----------
    ref_logprobs : array-like of shape (n_questions, n_responses)
        log pi_ref(y|x).
    features : array-like of shape (n_responses, n_features)
        f(y) of each response.
    question_ids : list of int
        Token id of each question, in row order.
    response_ids : list of int
        Token id of each response, in column order.
    tokenizer : PreTrainedTokenizerFast
        The world's tokenizer.

    Attributes
    ----------
    theta : nn.Parameter of shape (n_features,)
        The policy's parameters, zero at the reference.
    is_log_linear : bool
        True: estimators given no ``learning_rate`` use the log-linear default (0.1).
    tokenizer : PreTrainedTokenizerFast
        The world's tokenizer (one token per question and per response).
    generation_config : GenerationConfig
        One new token at temperature 1, so the sampled distribution is pi itself.

    Examples
    --------
    >>> from prefopt.worlds import PreferenceWorld
    >>> model = PreferenceWorld().policy_model()
    >>> model.theta.tolist()
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    """

    # Logits linear in theta: the default learning rate of this kind of model applies.
    is_log_linear = True

    def __init__(self, ref_logprobs, features, question_ids, response_ids, tokenizer):
        super().__init__()
        vocab = len(tokenizer)
        self.theta = nn.Parameter(torch.zeros(features.shape[1], dtype=torch.float32))
        self.register_buffer("ref_logprobs", torch.as_tensor(ref_logprobs, dtype=torch.float32))
        self.register_buffer("features", torch.as_tensor(features, dtype=torch.float32))
        question_of_token = torch.full((vocab,), -1, dtype=torch.long)
        question_of_token[torch.as_tensor(question_ids)] = torch.arange(len(question_ids))
        self.register_buffer("question_of_token", question_of_token)
        self.register_buffer("response_ids", torch.as_tensor(response_ids, dtype=torch.long))
        self.tokenizer = tokenizer
        self.unk_token_id = tokenizer.unk_token_id
        self.fixed_length = True  # one-token responses: no EOS needed
        self.generation_config = GenerationConfig(do_sample=True, temperature=1.0, max_new_tokens=1)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        """Next-token logits: pi's at a question token, -inf for every other token.

        Parameters
        ----------
        input_ids : torch.LongTensor of shape (batch, length)
            Questions of this world, possibly left-padded.
        attention_mask : torch.Tensor of shape (batch, length), default=None
            ``None`` attends to every token.
        **kwargs
            Ignored: what a causal LM's caller may pass (``use_cache``...).

        Returns
        -------
        output : dict-like
            ``logits`` of shape (batch, length, vocab).

        Examples
        --------
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld()
        >>> ids = world.tokenizer(world.prompts[:1], return_tensors="pt")["input_ids"]
        >>> world.policy_model()(ids).logits.shape
        torch.Size([1, 1, 12])
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if ((input_ids == self.unk_token_id) & attention_mask.bool()).any():
            raise ValueError("A prompt is not one of this world's questions; use world.prompts.")
        q = self.question_of_token[input_ids]  # (B, L), -1 elsewhere
        response_logits = self.ref_logprobs[q.clamp(min=0)] + self.features @ self.theta
        response_logits = torch.where(
            (q >= 0).unsqueeze(-1), response_logits, torch.zeros_like(response_logits)
        )
        logits = torch.full(
            (*input_ids.shape, len(self.question_of_token)),
            float("-inf"),
            dtype=response_logits.dtype,
            device=input_ids.device,
        )
        logits[..., self.response_ids] = response_logits
        return _LogitsOutput(logits=logits)


class PreferenceWorld(ExactWorld):
    """An exactly solvable preference world with raters who over-rate flattery.

    The methods shared with :class:`TinyLMWorld` (``evaluate``, ``optimum``,
    ``optimal_probs``, ``objective_share``, ``scorer``...) are documented on
    their base, ``prefopt.worlds._exact.ExactWorld``.

    Parameters
    ----------
    rater_bias : float, default=1.0
        How much raters reward flattery beyond true quality: a rater prefers a
        to b with probability sigmoid(q_a - q_b + rater_bias (flattery_a - flattery_b)).
    n_prompts : int, default=4
        Number of questions (at most 8), from easy to hard.
    random_state : int, RandomState instance or None, default=None
        Default seed of :meth:`comparisons`.

    Attributes
    ----------
    prompts : list of str
        The questions.
    responses : list of str
        The six response texts, in type order.
    response_ids : list of tuple of int
        The token id of each response (one token each).
    feature_names : tuple of str
        Names of the features, in column order.
    features_ : ndarray of shape (n_responses, n_features)
        f(y) of each response type.
    quality_ : ndarray of shape (n_responses,)
        True quality of each response type.
    tokenizer : PreTrainedTokenizerFast
        One token per question and per response; ``[PAD]`` id 0, ``[UNK]`` id 1.

    See Also
    --------
    TinyLMWorld : An exact world of token sequences from a tiny transformer.

    References
    ----------
    L. Gao, J. Schulman and J. Hilton, "Scaling laws for reward model
    overoptimization", ICML, 2023.

    Examples
    --------
    >>> from prefopt import RewardModel
    >>> from prefopt.worlds import PreferenceWorld
    >>> world = PreferenceWorld(rater_bias=1.0, random_state=0)
    >>> rm = RewardModel().fit(world.comparisons(1000, random_state=0))
    >>> ref = world.evaluate(world.reference_probs(), rm, beta=0.3)
    >>> best = world.optimum(rm, beta=0.3)
    >>> best["objective"] >= ref["objective"]
    True
    >>> round(ref["kl"], 6)
    0.0
    """

    feature_names = FEATURE_NAMES

    def __init__(self, *, rater_bias: float = 1.0, n_prompts: int = 4, random_state=None):
        if not 1 <= n_prompts <= len(QUESTIONS):
            raise ValueError(
                f"n_prompts must be between 1 and {len(QUESTIONS)}; got {n_prompts!r}."
            )
        self.rater_bias = float(rater_bias)
        self.n_prompts = n_prompts
        self.random_state = random_state
        self.prompts = list(QUESTIONS[:n_prompts])
        self.responses = [text for text, _, _ in RESPONSE_TYPES]
        self.features_ = np.array([f for _, f, _ in RESPONSE_TYPES], dtype=np.float64)
        self.quality_ = np.array([q for _, _, q in RESPONSE_TYPES], dtype=np.float64)
        w = np.linspace(0.0, 1.0, n_prompts) if n_prompts > 1 else np.zeros(1)
        logits = (1 - w)[:, None] * np.log(_EASY) + w[:, None] * np.log(_HARD)
        self._ref = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        self.tokenizer = word_level_tokenizer(self.prompts + self.responses)
        token_id = self.tokenizer.convert_tokens_to_ids
        self._prompt_ids = [[token_id(p)] for p in self.prompts]
        self.response_ids = [(token_id(r),) for r in self.responses]
        self._response_index = {text: i for i, text in enumerate(self.responses)}
        self._prompt_index = {text: i for i, text in enumerate(self.prompts)}

    # ----- the world's definitions -------------------------------------------------
    def features(self, prompts, completions) -> np.ndarray:
        """Feature vectors f(y) of completions: the featurizer of :meth:`comparisons`.

        Parameters
        ----------
        prompts : list of str
            Questions of this world, one per completion.
        completions : list of str
            Responses of this world.

        Returns
        -------
        features : ndarray of shape (n, n_features)

        Examples
        --------
        >>> world = PreferenceWorld()
        >>> world.features(world.prompts[:1], ["The answer is X."]).tolist()
        [[1.0, 0.0, 0.0, 0.2, 0.0, 1.0]]
        """
        _index_of(prompts, self._prompt_index, "prompts")
        return self.features_[_index_of(completions, self._response_index, "responses")]

    def true_quality(self, prompts, completions) -> np.ndarray:
        """The gold reward: true quality of each completion.

        Parameters
        ----------
        prompts : list of str
            Questions of this world, one per completion.
        completions : list of str
            Responses of this world.

        Returns
        -------
        quality : ndarray of shape (n,)

        Examples
        --------
        >>> world = PreferenceWorld()
        >>> world.true_quality(world.prompts[:2], ["The answer is X.", "The answer is Y."])
        array([ 2., -1.])
        """
        _index_of(prompts, self._prompt_index, "prompts")
        return self.quality_[_index_of(completions, self._response_index, "responses")]

    def rater_utility(self) -> np.ndarray:
        """What raters maximise: q + rater_bias * flattery, per response type.

        Returns
        -------
        utility : ndarray of shape (n_responses,)

        Examples
        --------
        >>> PreferenceWorld(rater_bias=1.0).rater_utility().tolist()
        [2.0, 2.4, 1.2, 0.0, -1.0, -0.6000000000000001]
        """
        return self.quality_ + self.rater_bias * self.features_[:, FEATURE_NAMES.index("flattery")]

    def policy_model(self) -> PreferenceWorldPolicy:
        """A fresh policy model at the reference (theta = 0).

        Returns
        -------
        model : PreferenceWorldPolicy
            Pass it as a policy's ``model``; it carries the world's tokenizer.

        Examples
        --------
        >>> world = PreferenceWorld()
        >>> probs = world.model_probs(world.policy_model())
        >>> bool(abs(probs - world.reference_probs()).max() < 1e-6)
        True
        """
        return PreferenceWorldPolicy(
            np.log(self._ref),
            self.features_,
            [ids[0] for ids in self._prompt_ids],
            [ids[0] for ids in self.response_ids],
            self.tokenizer,
        )

    def labeler(self, prompts, completions_a, completions_b, random_state=None) -> np.ndarray:
        """The biased raters as a labeller: which of two responses each prefers.

        Bradley-Terry on :meth:`rater_utility`; the signature of a fitted
        ``RewardModel.sample``, so it labels a policy's own samples in online
        reward learning (``refit_every``).

        Parameters
        ----------
        prompts, completions_a, completions_b : list of str
            One question and two of this world's responses per row.
        random_state : int, RandomState instance or None, default=None
            ``None`` uses the world's ``random_state``.

        Returns
        -------
        labels : ndarray of shape (n,), dtype int
            0 where ``a`` is preferred, 1 where ``b`` is.

        Examples
        --------
        >>> world = PreferenceWorld(random_state=0)
        >>> best = world.responses[int(world.rater_utility().argmax())]
        >>> worst = world.responses[int(world.rater_utility().argmin())]
        >>> float(world.labeler([world.prompts[0]] * 200, [best] * 200, [worst] * 200).mean()) < 0.2
        True
        """
        prompts, a, b = check_label_rows(prompts, completions_a, completions_b, "labeler")
        _index_of(prompts, self._prompt_index, "prompts")
        utility = self.rater_utility()
        ia = _index_of(a, self._response_index, "responses")
        ib = _index_of(b, self._response_index, "responses")
        seed = self.random_state if random_state is None else random_state
        return bradley_terry_labels(utility[ia] - utility[ib], seed)

    def comparisons(self, n: int, random_state=None) -> Comparisons:
        """Draw ``n`` labelled comparisons from the biased raters.

        For each, a question is drawn uniformly, two different responses are
        drawn from pi_ref (the starting policy, as labelled data comes from
        samples of the SFT model), and the rater picks one by Bradley-Terry on
        :meth:`rater_utility`.

        Parameters
        ----------
        n : int
            Number of comparisons.
        random_state : int, RandomState instance or None, default=None
            ``None`` uses the world's ``random_state``.

        Returns
        -------
        comparisons : Comparisons
            With this world's featurizer attached.

        Examples
        --------
        >>> data = PreferenceWorld(random_state=0).comparisons(100)
        >>> len(data), data.chosen[0] != data.rejected[0]
        (100, True)
        """
        from sklearn.utils import check_random_state

        if n < 1:
            raise ValueError(f"n must be >= 1; got {n!r}.")
        rng = check_random_state(self.random_state if random_state is None else random_state)
        utility = self.rater_utility()
        prompt, chosen, rejected = [], [], []
        for _ in range(n):
            x = rng.randint(self.n_prompts)
            a = rng.choice(len(self.responses), p=self._ref[x])
            b = a
            while b == a:
                b = rng.choice(len(self.responses), p=self._ref[x])
            p_a = 1.0 / (1.0 + np.exp(-(utility[a] - utility[b])))
            win, lose = (a, b) if rng.uniform() < p_a else (b, a)
            prompt.append(self.prompts[x])
            chosen.append(self.responses[win])
            rejected.append(self.responses[lose])
        return Comparisons(
            prompt, chosen, rejected, featurizer=self.features, policy=self.policy_model
        )
