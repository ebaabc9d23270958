"""TinyLMWorld's per-token variant: a reward paid along the response, a tabular value
model over the world's states, and the exact value of every response prefix."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .._config import config_context
from ..backend import EncodedPrompts, response_logprobs
from ..rewards import check_token_rewards


class TokenReward:
    """TinyLMWorld's gold reward paid along the response.

    Each content token pays ``share`` times its part of the gold reward (+1 for
    the prompt's topic word, -0.5 for any word) when it is generated; the rest,
    ``(1 - share)`` times the total, comes at the response's last token. The
    payments add up to the gold reward, so the exact optimum and every exact
    metric of the world are those of :meth:`TinyLMWorld.reward`; only the timing
    differs. Build one with :meth:`TinyLMWorld.token_reward`.

    Called like any reward, ``reward(prompts, completions)`` returns the totals;
    prefopt's loop calls :meth:`score_per_token` instead, because the object has
    it, and puts each value at its token.

    Parameters
    ----------
    world : TinyLMWorld
        The world whose tokenizer and gold reward it uses.
    share : float, default=0.5
        Part of the reward paid at the tokens, in [0, 1].

    Examples
    --------
    >>> import torch
    >>> from prefopt.worlds import TinyLMWorld
    >>> world = TinyLMWorld()
    >>> reward = world.token_reward(share=1.0)
    >>> ids = torch.tensor([world.response_ids[world.responses.index("a b")]])
    >>> reward.score_per_token(["a"], ["a b"], ids, torch.ones_like(ids)).tolist()
    [[0.5, -0.5, 0.0]]
    >>> reward(["a"], ["a b"]).tolist()
    [0.0]
    """

    def __init__(self, world, share: float = 0.5):
        if not 0.0 <= float(share) <= 1.0:
            raise ValueError(f"share must be in [0, 1]; got {share!r}.")
        self.world = world
        self.share = float(share)

    def __call__(self, prompts, completions) -> np.ndarray:
        return self.world.reward(prompts, completions)

    def score_per_token(self, prompts, completions, response_ids, response_mask) -> np.ndarray:
        """One payment per response token; their sum is the gold reward.

        Parameters
        ----------
        prompts, completions : list of str
            Text, one per response (EOS dropped from completions).
        response_ids, response_mask : torch.Tensor of shape (n, length)
            The responses' token ids (this world's tokenizer) and mask.

        Returns
        -------
        payments : ndarray of shape (n, length)
            Zero outside the mask.
        """
        tok = self.world.tokenizer
        ids = np.asarray(response_ids.cpu() if hasattr(response_ids, "cpu") else response_ids)
        mask = np.asarray(response_mask.cpu() if hasattr(response_mask, "cpu") else response_mask)
        content = mask.astype(bool) & (ids != tok.eos_token_id) & (ids != tok.pad_token_id)
        topics = np.array([tok.convert_tokens_to_ids(p.split()[0]) for p in prompts])
        per_word = (ids == topics[:, None]).astype(np.float64) - 0.5  # LENGTH_COST
        payments = self.share * np.where(content, per_word, 0.0)
        totals = self.world.reward(prompts, completions)
        last = np.maximum(mask.sum(1) - 1, 0)
        payments[np.arange(len(ids)), last] += (1.0 - self.share) * totals
        return payments


class PrefixValueTable(nn.Module):
    """A value model with one learned number per state of a TinyLMWorld.

    A state is a prompt and the response tokens generated so far (before the
    EOS); the table holds each state's value, so PPO's value loss can fit the
    exact values of the world without a function approximator in the way.
    Positions that are no state (inside the prompt, after the EOS) get 0.

    Parameters
    ----------
    prompt_ids : list of list of int
        Token ids of the prompts.
    content_ids : list of int
        Ids of the tokens a response continues with (all but EOS and pad).
    max_len : int
        Tokens per response: states have 0 .. max_len - 1 response tokens.
    scale : float, default=10.0
        The values are ``scale`` times the parameters: with Adam, each value moves
        about ``learning_rate * scale`` per step, so a policy's small learning rate
        still fits values of order 1 in a few dozen steps.

    Examples
    --------
    >>> import torch
    >>> table = PrefixValueTable([[2]], content_ids=[2, 3], max_len=2)
    >>> len(table.states)    # the prompt alone, then after each of two tokens
    3
    >>> table(torch.tensor([[2, 3]])).shape
    torch.Size([1, 2])
    """

    def __init__(self, prompt_ids, content_ids, max_len: int, scale: float = 10.0):
        super().__init__()
        states = []
        frontier = [tuple(p) for p in prompt_ids]
        for _ in range(max_len):
            states += frontier
            frontier = [s + (c,) for s in frontier for c in content_ids]
        self.states = {s: i for i, s in enumerate(dict.fromkeys(states))}
        self.scale = float(scale)
        self.values = nn.Parameter(torch.zeros(len(self.states)))

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        """The value of the state read up to each position (0 where it is none).

        Parameters
        ----------
        input_ids : torch.Tensor of shape (n, width)
        attention_mask : torch.Tensor of shape (n, width), default=None
            Positions with 0 (padding) are skipped.
        position_ids : torch.Tensor, default=None
            Ignored.
        **kwargs
            Ignored.

        Returns
        -------
        values : torch.Tensor of shape (n, width)
        """
        ids = input_ids.tolist()
        mask = (torch.ones_like(input_ids) if attention_mask is None else attention_mask).tolist()
        index = torch.full(input_ids.shape, len(self.states), dtype=torch.long)
        for i, (row, keep) in enumerate(zip(ids, mask)):
            seen = ()
            for j, (token, k) in enumerate(zip(row, keep)):
                if k:
                    seen = seen + (token,)
                    index[i, j] = self.states.get(seen, len(self.states))
        table = torch.cat([self.scale * self.values, self.values.new_zeros(1)])
        return table[index.to(table.device)]


class PerTokenMethods:
    """TinyLMWorld's methods for rewards paid along the response (a mixin)."""

    def token_reward(self, share: float = 0.5) -> TokenReward:
        """The gold reward paid along the response: a per-token reward.

        Parameters
        ----------
        share : float, default=0.5
            Part of each token's reward paid at the token; the rest comes at
            the response's last token.

        Returns
        -------
        reward : TokenReward
            Callable as the gold reward (totals), and with ``score_per_token``.

        Examples
        --------
        >>> from prefopt.worlds import TinyLMWorld
        >>> world = TinyLMWorld()
        >>> reward = world.token_reward()
        >>> bool((world.rewards(reward) == world.rewards(world.reward)).all())
        True
        """
        return TokenReward(self, share)

    def value_model(self, scale: float = 10.0) -> PrefixValueTable:
        """A tabular value model over this world's states, for ``PPOPolicy(value_model=...)``.

        Parameters
        ----------
        scale : float, default=10.0
            See :class:`PrefixValueTable`.

        Returns
        -------
        value_model : PrefixValueTable

        Examples
        --------
        >>> from prefopt.worlds import TinyLMWorld
        >>> len(TinyLMWorld().value_model().states)   # 2 prompts x (1 + 3 + 9) prefixes
        26
        """
        content = list(range(2, 2 + len(self.vocab)))
        return PrefixValueTable(self._prompt_ids, content, self.max_len, scale)

    @torch.no_grad()
    def prefix_values(
        self, policy, reward, beta: float, *, missing_eos_reward: float | None = -1.0
    ) -> np.ndarray:
        """Exact value of every response prefix under a policy and the KL-shaped reward.

        The quantity PPO's value model learns (with ``gamma=1``, at any
        ``gae_lambda``, and ``whiten_rewards=False``, the defaults; a fixed
        beta): V(x, y_<t) = E[sum_{u >= t} (r_u - beta (log pi(y_u|.)
        - log pi_ref(y_u|.)))], the expectation over continuations drawn from
        the policy, r_u the reward paid at token u (a per-token reward's
        payments, or a plain reward's score at the last token) with the loop's
        missing-EOS rule (a response with no EOS totals ``missing_eos_reward``,
        the difference paid at its last token).

        Parameters
        ----------
        policy : fitted prefopt policy or torch.nn.Module
            A policy sampling at temperature 1 (its ``model_`` is read).
        reward : callable
            A reward; with ``score_per_token`` it pays along the response.
        beta : float
            KL coefficient of the shaped reward.
        missing_eos_reward : float or None, default=-1.0
            Total reward of a response with no EOS; match the policy's.

        Returns
        -------
        values : ndarray of shape (n_prompts, n_responses, max_len)
            ``values[x, j, t]`` is V(x, y_<t) for response j; NaN where t is
            past the response's last token.

        Examples
        --------
        >>> import numpy as np
        >>> from prefopt.worlds import TinyLMWorld
        >>> world = TinyLMWorld()
        >>> v = world.prefix_values(world.policy_model(), world.token_reward(), beta=0.3)
        >>> start = v[:, :, 0]                  # V(x): the same for every response
        >>> bool(np.allclose(start, start[:, :1]))
        True
        >>> ref = world.evaluate(world.reference_probs(), world.reward, 0.3)["reward"]
        >>> round(float(start[:, 0].mean()), 6) == round(ref, 6)   # KL 0 at pi_ref
        True
        """
        model = policy if isinstance(policy, nn.Module) else policy.model_
        prompts, ids, mask = self._grid()
        logp = self._token_logprobs(model, prompts, ids, mask)
        ref = self._token_logprobs(self.reference_model_, prompts, ids, mask)
        texts = [p for p in self.prompts for _ in self.responses]
        completions = list(self.responses) * len(self.prompts)
        pays = self._payments(reward, texts, completions, ids, mask, missing_eos_reward)
        shaped = (pays - beta * (logp - ref)) * mask.numpy()
        tails = np.flip(np.cumsum(np.flip(shaped, 1), 1), 1)  # sum over u >= t
        probs = np.exp(logp.sum(1))
        n_p, n_r, length = len(self.prompts), len(self.response_ids), ids.shape[1]
        totals: dict = {}
        for row in range(n_p * n_r):
            response = self.response_ids[row % n_r]
            for t in range(len(response)):
                key = (row // n_r, response[:t])
                acc = totals.setdefault(key, [0.0, 0.0])
                acc[0] += probs[row] * tails[row, t]
                acc[1] += probs[row]
        out = np.full((n_p, n_r, length), np.nan)
        for row in range(n_p * n_r):
            response = self.response_ids[row % n_r]
            for t in range(len(response)):
                value, mass = totals[(row // n_r, response[:t])]
                out[row // n_r, row % n_r, t] = value / mass
        return out

    def _token_logprobs(self, model, prompts, ids, mask) -> np.ndarray:
        device = next(model.parameters()).device
        enc = EncodedPrompts(prompts.input_ids.to(device), prompts.attention_mask.to(device))
        with config_context(dtype="float32"):
            logp = response_logprobs(
                model,
                enc,
                ids.to(device),
                mask.to(device),
                temperature=1.0,
                suppress_ids=(self.tokenizer.pad_token_id,),
            )
        return logp.double().cpu().numpy()

    def _payments(self, reward, prompts, completions, ids, mask, missing_eos_reward):
        """The reward paid at each token of every (prompt, response), as the loop pays it."""
        last = mask.sum(1).numpy() - 1
        ended = np.tile(self.ended_, len(self.prompts))
        if callable(getattr(reward, "score_per_token", None)):
            pays = check_token_rewards(
                reward.score_per_token(prompts, completions, ids, mask), mask
            )
        else:
            pays = np.zeros(ids.shape)
            pays[np.arange(len(ids)), last] = np.asarray(reward(prompts, completions))
        if missing_eos_reward is not None:
            rows = np.flatnonzero(~ended)
            pays[rows, last[rows]] += missing_eos_reward - pays[rows].sum(1)
        return pays
