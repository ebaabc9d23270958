"""The base of the exact worlds: exact expectations over an enumerable response space."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from scipy.special import logsumexp

from .._config import config_context
from ..backend import EncodedPrompts, pad_left, pad_right, response_logprobs
from ..rewards import check_rewards

METRICS = ("true_quality", "reward", "kl", "objective")


def _check_probs(probs) -> np.ndarray:
    """A table of probabilities of shape (n_prompts, n_responses), rows summing to 1."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2:
        raise ValueError(
            f"Expected probabilities of shape (n_prompts, n_responses); got {probs.shape}."
        )
    if (probs < 0).any() or not np.allclose(probs.sum(1), 1.0, atol=1e-4):
        raise ValueError(
            "Each row of probabilities must be non-negative and sum to 1; got row "
            f"sums {np.round(probs.sum(1), 6).tolist()}."
        )
    return probs


def _tilt(ref_probs, rewards, beta: float) -> np.ndarray:
    """pi*(y|x) = pi_ref(y|x) exp(r(x,y)/beta) / Z(x), the KL-regularised optimum.

    ``beta = 0`` gives the reward-maximising policy: the reference restricted to
    the argmax responses.
    """
    if beta < 0:
        raise ValueError(f"beta must be >= 0; got {beta!r}.")
    ref_probs = np.asarray(ref_probs, dtype=np.float64)
    rewards = np.asarray(rewards, dtype=np.float64)
    if beta == 0:
        best = np.isclose(rewards, rewards.max(axis=1, keepdims=True))
        probs = ref_probs * best
        return probs / probs.sum(1, keepdims=True)
    with np.errstate(divide="ignore"):
        logits = np.log(ref_probs) + rewards / beta
    return np.exp(logits - logsumexp(logits, axis=1, keepdims=True))


def _exact_metrics(probs, ref_probs, rewards, quality, beta: float) -> dict:
    """Reward, true quality, KL(pi || pi_ref) and objective, averaged over prompts."""
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.where(probs > 0, np.log(probs) - np.log(ref_probs), 0.0)
    kl = (probs * log_ratio).sum(1)
    reward = (probs * rewards).sum(1)
    true_quality = (probs * quality).sum(1)
    return {
        "reward": float(reward.mean()),
        "true_quality": float(true_quality.mean()),
        "kl": float(kl.mean()),
        "objective": float((reward - beta * kl).mean()),
    }


def _index_of(texts, table: dict, what: str) -> np.ndarray:
    """Rows of ``texts`` in ``table``; an unknown text is an error naming it."""
    try:
        return np.array([table[t] for t in texts], dtype=int)
    except KeyError as e:
        raise ValueError(f"{e.args[0]!r} is not one of this world's {what}.") from None


class ExactWorld:
    """Base of the worlds whose every response can be enumerated.

    For a reward r and a KL coefficient beta, the objective of a policy pi is
    J(pi) = E_x[E_{y ~ pi(.|x)} r(x, y) - beta KL(pi(.|x) || pi_ref(.|x))],
    maximised by pi*(y|x) = pi_ref(y|x) exp(r(x, y)/beta) / Z(x)
    (Rafailov et al., 2023, eq. 4). Because the responses can be listed, a
    world computes J, its parts and pi* exactly, with no sampling. Every
    exact world answers the same methods with the same signatures:

    * :meth:`evaluate` ``(policy, reward, beta)``: the exact ``reward``,
      ``true_quality``, ``kl`` and ``objective`` of a policy;
    * :meth:`optimal_probs` ``(reward, beta)`` and :meth:`optimum`
      ``(reward, beta)``: pi* and its metrics;
    * :meth:`objective_share` ``(policy, reward, beta)``: how much of the
      achievable objective a policy reached;
    * :meth:`scorer` ``(metric, *, reward=None, beta=None)``: one of the
      metrics as a scikit-learn scorer;
    * :meth:`reference_probs`, :meth:`rewards`, :meth:`policy_probs` and
      :meth:`model_probs`: the tables these are computed from, of shape
      (n_prompts, n_responses).

    A *policy* is a fitted prefopt policy (its ``log_prob`` is read for every
    response), a policy model (a torch module called like a causal LM), or a
    table of probabilities of shape (n_prompts, n_responses). A *reward* is a
    callable ``reward(prompts, completions) -> array`` on text.

    A subclass may add keyword-only options after these parameters
    (:class:`TinyLMWorld` adds ``missing_eos_reward``). Its constructor sets
    ``prompts``, ``responses`` (text), ``response_ids`` (token ids of each
    response), ``tokenizer``, ``_prompt_ids`` (token ids of each prompt) and
    ``_ref`` (pi_ref), and it defines ``true_quality(prompts, completions)``,
    the gold reward.

    See Also
    --------
    PreferenceWorld : One-token responses of six types, biased raters.
    TinyLMWorld : A tiny transformer whose responses are enumerated.

    References
    ----------
    R. Rafailov et al., "Direct preference optimization: your language model
    is secretly a reward model", NeurIPS, 2023.

    Examples
    --------
    >>> from prefopt.worlds import PreferenceWorld
    >>> world = PreferenceWorld(random_state=0)
    >>> gold = world.true_quality
    >>> best = world.optimal_probs(gold, beta=0.5)
    >>> world.objective_share(best, gold, beta=0.5)
    1.0
    """

    prompts: list
    responses: list
    response_ids: list
    _prompt_ids: list
    _ref: np.ndarray

    # ----- tables ------------------------------------------------------------------
    def reference_probs(self) -> np.ndarray:
        """pi_ref(y|x) for every prompt and response.

        Returns
        -------
        probs : ndarray of shape (n_prompts, n_responses)
            A copy; rows sum to 1.

        Examples
        --------
        >>> from prefopt.worlds import PreferenceWorld
        >>> PreferenceWorld(n_prompts=1).reference_probs().round(2).tolist()
        [[0.5, 0.14, 0.12, 0.07, 0.11, 0.06]]
        """
        return self._ref.copy()

    def rewards(self, reward: Callable) -> np.ndarray:
        """r(x, y) for every prompt and response.

        Parameters
        ----------
        reward : callable
            ``reward(prompts, completions) -> array`` on text; it is called once
            with every (prompt, response) pair, prompt-major.

        Returns
        -------
        rewards : ndarray of shape (n_prompts, n_responses)

        Examples
        --------
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(n_prompts=1)
        >>> world.rewards(world.true_quality).tolist()
        [[2.0, 1.4, 1.2, 0.0, -1.0, -1.6]]
        """
        prompts = [p for p in self.prompts for _ in self.responses]
        completions = list(self.responses) * len(self.prompts)
        r = check_rewards(reward(prompts, completions), len(prompts), "the reward")
        return r.reshape(len(self.prompts), len(self.responses))

    def _grid(self):
        """Every (prompt, response) pair, prompt-major, as padded tensors."""
        n = len(self.response_ids)
        pad = self.tokenizer.pad_token_id
        prompts = pad_left([p for p in self._prompt_ids for _ in range(n)], pad)
        ids, mask = pad_right([list(r) for r in self.response_ids] * len(self.prompts), pad)
        return prompts, ids, mask

    @torch.no_grad()
    def model_probs(self, model: torch.nn.Module) -> np.ndarray:
        """pi(y|x) of a policy model at temperature 1, exactly.

        Parameters
        ----------
        model : torch.nn.Module
            Called like a causal LM over this world's token ids, e.g. one from
            ``policy_model()``.

        Returns
        -------
        probs : ndarray of shape (n_prompts, n_responses)

        Examples
        --------
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld()
        >>> probs = world.model_probs(world.policy_model())
        >>> bool(abs(probs - world.reference_probs()).max() < 1e-6)
        True
        """
        prompts, ids, mask = self._grid()
        device = next(model.parameters()).device
        prompts = EncodedPrompts(prompts.input_ids.to(device), prompts.attention_mask.to(device))
        with config_context(dtype="float32"):  # exact, even where training uses bfloat16
            logp = response_logprobs(
                model,
                prompts,
                ids.to(device),
                mask.to(device),
                temperature=1.0,
                suppress_ids=(self.tokenizer.pad_token_id,),
            )
        logp = logp.sum(1).double().cpu().numpy()
        return _check_probs(np.exp(logp).reshape(len(self.prompts), -1))

    def policy_probs(self, policy) -> np.ndarray:
        """pi(y|x) of a fitted prefopt policy, read from its ``log_prob``, exactly.

        Parameters
        ----------
        policy : fitted prefopt policy
            It must sample as the world does: at temperature 1 and with as many
            new tokens as the longest response (the defaults of the world's
            ``policy_model()``).

        Returns
        -------
        probs : ndarray of shape (n_prompts, n_responses)

        Examples
        --------
        >>> from prefopt import PPOPolicy
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld()
        >>> ppo = PPOPolicy(model=world.policy_model(), n_steps=1, batch_size=4, random_state=0)
        >>> ppo = ppo.fit(world.prompts, world.true_quality)
        >>> world.policy_probs(ppo).shape
        (4, 6)
        """
        length = max(len(r) for r in self.response_ids)
        temperature = getattr(policy, "temperature_", 1.0)
        new_tokens = getattr(policy, "max_new_tokens_", length)
        if temperature != 1.0 or new_tokens != length:
            raise ValueError(
                f"The policy samples {new_tokens} tokens at temperature {temperature}; this "
                f"world's responses are {length} tokens at temperature 1. Leave temperature "
                "and max_new_tokens at None so the policy model's generation config sets them."
            )
        prompts = [p for p in self.prompts for _ in self.response_ids]
        completions = [list(r) for r in self.response_ids] * len(self.prompts)
        # In float32 even where training uses bfloat16 autocast: the rows that share a
        # prefix must see the same next-token distribution for the sum over y to be 1.
        with config_context(dtype="float32"):
            logp = np.asarray(policy.log_prob(prompts, completions), dtype=np.float64)
        return _check_probs(np.exp(logp).reshape(len(self.prompts), -1))

    def _probs(self, policy) -> np.ndarray:
        if isinstance(policy, np.ndarray):
            probs = _check_probs(policy)
            if probs.shape != self._ref.shape:
                raise ValueError(
                    f"Expected probabilities of shape {self._ref.shape}; got {probs.shape}."
                )
            return probs
        if isinstance(policy, torch.nn.Module):
            return self.model_probs(policy)
        return self.policy_probs(policy)

    def _tables(self, reward) -> tuple[np.ndarray, np.ndarray]:
        """The reward's table and the gold reward's."""
        return self.rewards(reward), self.rewards(self.true_quality)

    def _scorer_tables(self, estimator, reward) -> tuple[np.ndarray, np.ndarray]:
        return self._tables(reward)

    # ----- exact evaluation --------------------------------------------------------
    def _evaluate(self, probs, rewards, gold, beta: float) -> dict:
        return _exact_metrics(probs, self._ref, rewards, gold, beta)

    def _share(self, probs, rewards, gold, beta: float) -> float:
        j = self._evaluate(probs, rewards, gold, beta)["objective"]
        j_ref = self._evaluate(self._ref, rewards, gold, beta)["objective"]
        j_best = self._evaluate(_tilt(self._ref, rewards, beta), rewards, gold, beta)["objective"]
        if j_best - j_ref <= 1e-12:  # J(pi*) >= J(pi_ref); what is left is rounding
            raise ValueError(
                "The reference is already optimal for this reward and beta; the "
                "share of the achievable objective is undefined."
            )
        return float((j - j_ref) / (j_best - j_ref))

    def evaluate(self, policy, reward: Callable, beta: float) -> dict:
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

        Returns
        -------
        metrics : dict
            ``reward``, ``true_quality`` (the expected gold reward), ``kl``
            (nats, KL(pi || pi_ref)) and ``objective``, each averaged over the
            prompts.

        Examples
        --------
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> out = world.evaluate(world.reference_probs(), world.true_quality, beta=0.3)
        >>> sorted(out), out["kl"]
        (['kl', 'objective', 'reward', 'true_quality'], 0.0)
        """
        return self._evaluate(self._probs(policy), *self._tables(reward), beta)

    def optimal_probs(self, reward: Callable, beta: float) -> np.ndarray:
        """pi*(y|x) = pi_ref(y|x) exp(r(x,y)/beta) / Z(x), the objective's maximiser.

        Parameters
        ----------
        reward : callable
            ``reward(prompts, completions) -> array`` on text.
        beta : float
            KL coefficient, >= 0; 0 gives the reference restricted to the
            highest-reward responses.

        Returns
        -------
        probs : ndarray of shape (n_prompts, n_responses)

        Examples
        --------
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(n_prompts=1)
        >>> world.optimal_probs(world.true_quality, beta=0.0).tolist()
        [[1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
        """
        return _tilt(self._ref, self.rewards(reward), beta)

    def optimum(self, reward: Callable, beta: float) -> dict:
        """The metrics of the closed-form optimum :meth:`optimal_probs`.

        Parameters
        ----------
        reward : callable
            ``reward(prompts, completions) -> array`` on text.
        beta : float
            KL coefficient of the objective E[r] - beta KL.

        Returns
        -------
        metrics : dict
            The keys of :meth:`evaluate`.

        Examples
        --------
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> best = world.optimum(world.true_quality, beta=0.3)
        >>> best["objective"] > world.evaluate(world.reference_probs(), world.true_quality, 0.3)[
        ...     "objective"
        ... ]
        True
        """
        rewards, gold = self._tables(reward)
        return self._evaluate(_tilt(self._ref, rewards, beta), rewards, gold, beta)

    def objective_share(self, policy, reward: Callable, beta: float) -> float:
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

        Returns
        -------
        share : float
            Below 0 for a policy worse than the reference; at most 1.

        Examples
        --------
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld()
        >>> round(world.objective_share(world.reference_probs(), world.true_quality, 0.3), 6)
        0.0
        """
        return self._share(self._probs(policy), *self._tables(reward), beta)

    def scorer(
        self,
        metric: str = "true_quality",
        *,
        reward: Callable | None = None,
        beta: float | None = None,
    ) -> Callable:
        """A scikit-learn scorer ``(estimator, X, y=None) -> float`` computed exactly.

        Parameters
        ----------
        metric : {"true_quality", "reward", "kl", "objective"}, default="true_quality"
            A key of :meth:`evaluate`; ``"kl"`` is returned negated, so larger is
            better.
        reward : callable, default=None
            ``None`` uses the estimator's fitted ``reward_model_``.
        beta : float, default=None
            ``None`` uses the estimator's ``beta``.

        Returns
        -------
        scorer : callable
            Scores the policy on the prompts in ``X`` only.

        Examples
        --------
        >>> from prefopt.worlds import PreferenceWorld
        >>> scoring = PreferenceWorld().scorer("objective")
        >>> scoring.__name__
        'objective_scorer'
        """
        if metric not in METRICS:
            raise ValueError(f"Unknown metric {metric!r}; use one of {list(METRICS)}.")

        def score(estimator, X, y=None):
            table = {p: i for i, p in enumerate(self.prompts)}
            rows = np.unique(_index_of(list(X), table, "prompts"))
            r = reward if reward is not None else estimator.reward_model_
            b = beta if beta is not None else estimator.beta
            rewards, gold = self._scorer_tables(estimator, r)
            probs = self._probs(estimator)[rows]
            value = _exact_metrics(probs, self._ref[rows], rewards[rows], gold[rows], b)[metric]
            return -value if metric == "kl" else value

        score.__name__ = f"{metric}_scorer"
        return score
