"""An exactly solvable token-level world: a tiny transformer over a few tokens.

The vocabulary is a few content tokens ("a", "b", "c"), an EOS token and a pad
token; the prompts are one or two content tokens; the policy is a small
``transformers.GPT2LMHeadModel`` that samples exactly ``max_len`` tokens at
temperature 1, as prefopt's loop does. Responses are truncated after their
first EOS, and a response with no EOS has its reward *replaced* by
``missing_eos_reward`` (the EOS trick of Huang et al., 2024). So the response space
is finite:

* every sequence of 0 .. max_len - 1 content tokens followed by EOS, and
* every sequence of exactly max_len content tokens (no EOS),

``sum_{l < L} V^l + V^L`` responses for V content tokens and L = max_len. The
text of a response (EOS dropped) names it uniquely: a text of L tokens never
ended, a shorter one did. pi(y|x) of any policy is read exactly from its
per-token log-probs, so the expected reward, the sequence-level KL to the
reference and the closed-form optimum
pi*(y|x) = pi_ref(y|x) exp(r(x, y)/beta) / Z(x) are all exact.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable

import numpy as np
import torch
from sklearn.utils import check_random_state
from transformers import (
    GPT2LMHeadModel,
)

from ..backend import response_logprobs
from ..rewards._sampling import bradley_terry_labels, check_label_rows
from ._exact import ExactWorld, _tilt
from ._per_token import PerTokenMethods
from ._tiny_model import ARCHITECTURES, prompt_words, tiny_lm_model, tree_target
from ._tokenizer import EOS, PAD, word_level_tokenizer

__all__ = ["TinyLMWorld"]

LENGTH_COST = 0.5  # gold reward: +1 per topic token, -0.5 per token of length

# The reference is a few exact cross-entropy steps towards a random target, so
# pi_ref depends on the prompt and is far from uniform, while every response keeps
# a probability that float32 log-probs resolve (above 4e-6 for seeds 0-5).
_PRETRAIN_STEPS = 40
_PRETRAIN_LR = 1e-2
_TARGET_LOGIT_STD = 1.0
_TARGET_TOPIC_BONUS = 1.0
_REFERENCE_WEIGHTS: dict = {}  # (vocab, max_len, n_prompts, seed, architecture) -> state dict


class TinyLMWorld(ExactWorld, PerTokenMethods):
    """A tiny language-model world whose every response can be enumerated.

    The methods shared with :class:`PreferenceWorld` are documented on their
    base, ``prefopt.worlds._exact.ExactWorld``; here ``evaluate``, ``optimum``,
    ``optimal_probs``, ``objective_share`` and ``rewards`` also take the
    keyword-only ``missing_eos_reward``, and :meth:`scorer` uses the
    estimator's own.

    Its per-token variant: :meth:`token_reward` pays the gold reward along the
    response (a reward with ``score_per_token``), :meth:`value_model` is a
    tabular value model over the world's states, and :meth:`prefix_values`
    gives the exact value of every response prefix under a policy, what PPO's
    value model learns.

    Parameters
    ----------
    vocab : tuple of str, default=("a", "b", "c")
        The content tokens (distinct words without whitespace).
    max_len : int, default=3
        Tokens sampled per response (``max_new_tokens`` of the policy), so a
        response has at most ``max_len - 1`` content tokens before its EOS, or
        ``max_len`` content tokens and no EOS.
    n_prompts : int, default=2
        Number of prompts, at most ``2 * len(vocab)``: one-word and two-word
        prompts alternate (``"a"``, ``"b c"``, ``"b"``, ``"c a"``, ...).
    random_state : int, RandomState instance or None, default=0
        Seeds the reference model's weights and its pre-training target.
    architecture : {"gpt2", "llama", "qwen2"}, default="gpt2"
        The reference's shape: GPT-2, or Llama or Qwen2 (rotary positions,
        SwiGLU, RMSNorm, one key/value head), each 2 layers of width 32.

    Attributes
    ----------
    prompts : list of str
        The prompts.
    responses : list of str
        Text of every response (EOS dropped), shortest first.
    response_ids : list of tuple of int
        Token ids of every response, with the EOS id when it ended.
    ended_ : ndarray of bool, shape (n_responses,)
        Whether each response contains an EOS.
    tokenizer : PreTrainedTokenizerFast
        Pad id 0, EOS id 1, then the content tokens; whitespace-split.
    reference_model_ : GPT2LMHeadModel
        The reference policy; :meth:`policy_model` returns copies of it.

    See Also
    --------
    PreferenceWorld : One-token responses of six types, biased raters.

    Notes
    -----
    The built-in gold reward :meth:`reward` is ``+1`` per occurrence of the
    prompt's first word (its *topic*) minus ``0.5`` per content token, so for
    ``max_len=3`` the best response to ``"a"`` is ``"a a"`` then EOS: neither
    the empty nor the longest response (a response with no EOS scores
    ``missing_eos_reward``).

    The reference is a two-layer GPT-2 of width 32, trained for a few exact
    cross-entropy steps towards a random next-token distribution at every node
    of the response tree (slightly favouring the topic), so pi_ref depends on
    the prompt, is far from uniform, and gives no-EOS responses a sizeable
    share. Worlds built with the same integer ``random_state`` are identical;
    their weights are computed once per process.

    References
    ----------
    S. Huang et al., "The N+ implementation details of RLHF with PPO: a case
    study on TL;DR summarization", COLM, 2024 (the missing-EOS penalty).

    Examples
    --------
    >>> from prefopt.worlds.tiny_lm import TinyLMWorld
    >>> world = TinyLMWorld(random_state=0)
    >>> world.prompts
    ['a', 'b c']
    >>> len(world.responses)       # 1 + 3 + 9 ended, 27 without EOS
    40
    >>> world.reference_probs().sum(1).round(6).tolist()
    [1.0, 1.0]
    >>> best = world.optimum(world.reward, beta=0.2)
    >>> best["objective"] > world.evaluate(world.reference_probs(), world.reward, 0.2)["objective"]
    True
    """

    def __init__(
        self,
        *,
        vocab=("a", "b", "c"),
        max_len: int = 3,
        n_prompts: int = 2,
        random_state=0,
        architecture: str = "gpt2",
    ):
        vocab = tuple(vocab)
        if (
            len(vocab) < 1
            or len(set(vocab)) != len(vocab)
            or any(
                not isinstance(w, str) or not w or w.split() != [w] or w in (PAD, EOS)
                for w in vocab
            )
        ):
            raise ValueError(
                f"vocab must be distinct non-empty words without whitespace; got {vocab!r}."
            )
        if int(max_len) != max_len or max_len < 1:
            raise ValueError(f"max_len must be a positive integer; got {max_len!r}.")
        if not 1 <= n_prompts <= 2 * len(vocab):
            raise ValueError(
                f"n_prompts must be between 1 and {2 * len(vocab)}; got {n_prompts!r}."
            )
        if architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}; got {architecture!r}.")
        self.vocab, self.architecture = vocab, architecture
        self.max_len = int(max_len)
        self.n_prompts = n_prompts
        self.random_state = random_state
        # No unknown token: every id the model can emit (all but pad) is EOS or a content
        # token, so the enumerated responses are the whole support of the policy.
        self.tokenizer = word_level_tokenizer(
            vocab, unk_token=None, eos_token=EOS, split_on_whitespace=True
        )
        self.prompts = [" ".join(prompt_words(i, vocab)) for i in range(n_prompts)]
        self._prompt_ids = [
            self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in self.prompts
        ]
        content = list(range(2, 2 + len(vocab)))
        eos = self.tokenizer.eos_token_id
        ids = [
            seq + (eos,)
            for n in range(self.max_len)
            for seq in itertools.product(content, repeat=n)
        ]
        ids += list(itertools.product(content, repeat=self.max_len))
        self.response_ids = ids
        self.ended_ = np.array([len(r) > 0 and r[-1] == eos for r in ids])
        self.responses = self.tokenizer.batch_decode(
            [list(r) for r in ids], skip_special_tokens=True
        )
        self.reference_model_ = self._reference(random_state)
        self._ref = self.model_probs(self.reference_model_)

    # ----- the reference policy ----------------------------------------------------
    def _new_model(self, seed: int) -> GPT2LMHeadModel:
        longest_prompt = max(len(p) for p in self._prompt_ids)
        n_positions = longest_prompt + self.max_len + 1
        return tiny_lm_model(self.tokenizer, n_positions, self.max_len, seed, self.architecture)

    def _reference(self, random_state) -> GPT2LMHeadModel:
        # An integer seed defines the world, so its pre-trained weights are built once
        # per process: tests and doctests construct the same worlds many times.
        if not isinstance(random_state, (int, np.integer)):
            return self._pretrained_reference(check_random_state(random_state))
        key = (self.vocab, self.max_len, self.n_prompts, int(random_state), self.architecture)
        if key not in _REFERENCE_WEIGHTS:
            model = self._pretrained_reference(check_random_state(int(random_state)))
            _REFERENCE_WEIGHTS[key] = {k: v.clone() for k, v in model.state_dict().items()}
            return model
        model = self._new_model(0)
        model.load_state_dict(_REFERENCE_WEIGHTS[key])
        return model

    def _pretrained_reference(self, rng) -> GPT2LMHeadModel:
        model = self._new_model(int(rng.randint(np.iinfo(np.int32).max)))
        # Target: at every node of the response tree (prompt, content prefix) a random
        # next-token distribution over EOS and the content tokens; its sequence
        # probabilities are products along each response.
        n_next = len(self.vocab) + 1
        target = tree_target(
            rng, self._prompt_ids, self.response_ids, n_next, _TARGET_LOGIT_STD, _TARGET_TOPIC_BONUS
        )
        prompts, responses, mask = self._grid()
        weights = torch.as_tensor(target.reshape(-1), dtype=torch.float32)
        optimizer = torch.optim.Adam(model.parameters(), lr=_PRETRAIN_LR)
        # Exact cross-entropy sum_y target(y|x) log pi(y|x): no sampling noise.
        for _ in range(_PRETRAIN_STEPS):
            logp = response_logprobs(
                model,
                prompts,
                responses,
                mask,
                temperature=1.0,
                suppress_ids=(self.tokenizer.pad_token_id,),
            ).sum(1)
            loss = -(weights * logp).sum() / self.n_prompts
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return model

    def policy_model(self) -> GPT2LMHeadModel:
        """A fresh copy of the reference policy, to pass as a policy's ``model``.

        Returns
        -------
        model : GPT2LMHeadModel
            It carries ``tokenizer`` (this world's) and a ``generation_config``
            with ``do_sample=True``, ``temperature=1.0`` and
            ``max_new_tokens=max_len``.

        Examples
        --------
        >>> from prefopt.worlds.tiny_lm import TinyLMWorld
        >>> world = TinyLMWorld()
        >>> world.policy_model().generation_config.max_new_tokens
        3
        """
        model = copy.deepcopy(self.reference_model_)
        model.tokenizer = self.tokenizer  # shared, not copied
        return model

    # ----- rewards -----------------------------------------------------------------
    def reward(self, prompts, completions) -> np.ndarray:
        """The gold reward: +1 per topic word in the completion, -0.5 per word.

        The topic of a prompt is its first word. Completions are text (EOS
        dropped), as prefopt's loop passes them.

        Parameters
        ----------
        prompts : list of str
            One per completion; its first word is the topic.
        completions : list of str
            Text of the completions (EOS dropped).

        Returns
        -------
        rewards : ndarray of shape (n,)

        Examples
        --------
        >>> from prefopt.worlds.tiny_lm import TinyLMWorld
        >>> TinyLMWorld().reward(["a", "b c"], ["a a", "b c c"]).tolist()
        [1.0, -0.5]
        """
        prompts, completions = list(prompts), list(completions)
        if len(prompts) != len(completions):
            raise ValueError(f"Got {len(prompts)} prompts and {len(completions)} completions.")
        out = np.empty(len(prompts))
        for i, (p, c) in enumerate(zip(prompts, completions)):
            words, topic = c.split(), p.split()[:1]
            out[i] = sum(w in topic for w in words) - LENGTH_COST * len(words)
        return out

    true_quality = reward  # the gold reward's name in every exact world

    def labeler(self, prompts, completions_a, completions_b, random_state=None) -> np.ndarray:
        """Raters who prefer by Bradley-Terry on the gold reward: P(a) = sigmoid(r_a - r_b).

        The signature of a fitted ``RewardModel.sample``, so it labels a
        policy's own samples in online reward learning (``refit_every``).

        Parameters
        ----------
        prompts, completions_a, completions_b : list of str
            One prompt and two completions (text, EOS dropped) per row.
        random_state : int, RandomState instance or None, default=None
            ``None`` uses the world's ``random_state``.

        Returns
        -------
        labels : ndarray of shape (n,), dtype int
            0 where ``a`` is preferred, 1 where ``b`` is.

        Examples
        --------
        >>> from prefopt.worlds.tiny_lm import TinyLMWorld
        >>> world = TinyLMWorld()
        >>> topic = world.prompts[0].split()[0]
        >>> labels = world.labeler([world.prompts[0]] * 100, [topic] * 100, [""] * 100,
        ...                        random_state=0)
        >>> bool(0.1 < labels.mean() < 0.5)  # P(a preferred) = sigmoid(0.5) = 0.62
        True
        """
        prompts, a, b = check_label_rows(prompts, completions_a, completions_b, "labeler")
        seed = self.random_state if random_state is None else random_state
        return bradley_terry_labels(self.reward(prompts, a) - self.reward(prompts, b), seed)

    def rewards(self, reward: Callable, *, missing_eos_reward: float | None = -1.0) -> np.ndarray:
        """Effective r(x, y) for every prompt and response, as prefopt's loop scores them.

        Parameters
        ----------
        reward : callable
            ``reward(prompts, completions) -> array`` on text (EOS dropped).
        missing_eos_reward : float or None, default=-1.0
            Replaces the reward of a response with no EOS, as in prefopt's loop
            (Huang et al., 2024); ``None`` keeps the reward's own score.

        Returns
        -------
        rewards : ndarray of shape (n_prompts, n_responses)

        Examples
        --------
        >>> from prefopt.worlds.tiny_lm import TinyLMWorld
        >>> world = TinyLMWorld()
        >>> column = world.responses.index("a a a")
        >>> float(world.rewards(world.reward)[0, column])
        -1.0
        >>> float(world.rewards(world.reward, missing_eos_reward=None)[0, column])
        1.5
        """
        r = super().rewards(reward)
        if missing_eos_reward is not None:
            r = np.where(self.ended_[None, :], r, float(missing_eos_reward))
        return r

    def _tables(self, reward, missing_eos_reward: float | None = -1.0):
        return (
            self.rewards(reward, missing_eos_reward=missing_eos_reward),
            self.rewards(self.reward, missing_eos_reward=missing_eos_reward),
        )

    def _scorer_tables(self, estimator, reward):
        # Score the objective the estimator optimised, with its own missing-EOS rule.
        return self._tables(reward, getattr(estimator, "missing_eos_reward", -1.0))

    # ----- exact evaluation, with the missing-EOS rule -----------------------------
    def evaluate(
        self, policy, reward: Callable, beta: float, *, missing_eos_reward: float | None = -1.0
    ) -> dict:
        """Exact expected reward, true quality, KL and objective of a policy.

        Parameters
        ----------
        policy : fitted prefopt policy, torch.nn.Module or ndarray
            A fitted estimator (its ``log_prob`` is read for every response), a
            policy model, or probabilities of shape (n_prompts, n_responses).
        reward : callable
            ``reward(prompts, completions) -> array`` on text.
        beta : float
            KL coefficient of the objective E[r] - beta KL.
        missing_eos_reward : float or None, default=-1.0
            Reward of a response with no EOS; match the policy's parameter.

        Returns
        -------
        metrics : dict
            ``reward``, ``true_quality`` (the expected gold :meth:`reward`, with
            the same missing-EOS rule), ``kl`` (nats, the sequence-level
            KL(pi || pi_ref)) and ``objective``, each averaged over prompts.

        Examples
        --------
        >>> from prefopt.worlds.tiny_lm import TinyLMWorld
        >>> world = TinyLMWorld()
        >>> world.evaluate(world.reference_probs(), world.reward, 0.2)["kl"]
        0.0
        """
        tables = self._tables(reward, missing_eos_reward)
        return self._evaluate(self._probs(policy), *tables, beta)

    def optimal_probs(
        self, reward: Callable, beta: float, *, missing_eos_reward: float | None = -1.0
    ) -> np.ndarray:
        """pi*(y|x) = pi_ref(y|x) exp(r(x,y)/beta) / Z(x), the objective's maximiser.

        Parameters
        ----------
        reward : callable
            ``reward(prompts, completions) -> array`` on text.
        beta : float
            KL coefficient, >= 0.
        missing_eos_reward : float or None, default=-1.0
            Reward of a response with no EOS.

        Returns
        -------
        probs : ndarray of shape (n_prompts, n_responses)

        Examples
        --------
        >>> from prefopt.worlds.tiny_lm import TinyLMWorld
        >>> world = TinyLMWorld()
        >>> best = world.optimal_probs(world.reward, 0.2)
        >>> world.responses[int(best[0].argmax())]
        'a a'
        """
        return _tilt(self._ref, self.rewards(reward, missing_eos_reward=missing_eos_reward), beta)

    def optimum(
        self, reward: Callable, beta: float, *, missing_eos_reward: float | None = -1.0
    ) -> dict:
        """The metrics of the closed-form optimum :meth:`optimal_probs`.

        Parameters
        ----------
        reward : callable
            ``reward(prompts, completions) -> array`` on text.
        beta : float
            KL coefficient of the objective E[r] - beta KL.
        missing_eos_reward : float or None, default=-1.0
            Reward of a response with no EOS.

        Returns
        -------
        metrics : dict
            The keys of :meth:`evaluate`.

        Examples
        --------
        >>> from prefopt.worlds.tiny_lm import TinyLMWorld
        >>> world = TinyLMWorld()
        >>> world.optimum(world.reward, 0.2)["kl"] > 0
        True
        """
        rewards, gold = self._tables(reward, missing_eos_reward)
        return self._evaluate(_tilt(self._ref, rewards, beta), rewards, gold, beta)

    def objective_share(
        self, policy, reward: Callable, beta: float, *, missing_eos_reward: float | None = -1.0
    ) -> float:
        """Share of the achievable objective a policy reached: 0 at pi_ref, 1 at pi*.

        ``(J(pi) - J(pi_ref)) / (J(pi*) - J(pi_ref))`` with
        ``J = E[r] - beta KL(pi || pi_ref)``, all exact.

        Parameters
        ----------
        policy : fitted prefopt policy, torch.nn.Module or ndarray
            As in :meth:`evaluate`.
        reward : callable
            ``reward(prompts, completions) -> array`` on text.
        beta : float
            KL coefficient of the objective.
        missing_eos_reward : float or None, default=-1.0
            Reward of a response with no EOS; match the policy's parameter.

        Returns
        -------
        share : float
            Below 0 for a policy worse than the reference; at most 1.

        Examples
        --------
        >>> from prefopt.worlds.tiny_lm import TinyLMWorld
        >>> world = TinyLMWorld()
        >>> round(world.objective_share(world.reference_probs(), world.reward, 0.2), 6)
        0.0
        """
        return self._share(self._probs(policy), *self._tables(reward, missing_eos_reward), beta)
