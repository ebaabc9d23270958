"""How far a sampling engine's log-probs are from the policy's, and the truncated
importance-sampling weights that correct for it (Yao et al. 2025).

Pure functions of tensors, without vLLM: ``prefopt.backend.vllm_engine``
re-exports them.
"""

from __future__ import annotations

import torch

__all__ = ["logprob_gap", "truncated_importance_weights"]


def logprob_gap(policy_logprobs, engine_logprobs, mask) -> dict:
    """How far the engine's log-probs are from the policy's on the sampled tokens.

    Parameters
    ----------
    policy_logprobs, engine_logprobs : torch.Tensor of shape (n, length)
        Per-token log-probs of the same tokens, at the same temperature.
    mask : torch.Tensor of shape (n, length)
        1 on response tokens.

    Returns
    -------
    gap : dict
        ``engine/logprob_gap_mean`` and ``engine/logprob_gap_max`` (absolute
        differences over the response tokens), and ``engine/kl`` (the mean of
        ``log pi_engine - log pi``, an estimate of KL(engine || policy), since
        the tokens are the engine's samples).

    Examples
    --------
    >>> import torch
    >>> gap = logprob_gap(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]]),
    ...                   torch.tensor([[1, 1]]))
    >>> {k: round(v, 3) for k, v in gap.items()}
    {'engine/logprob_gap_mean': 0.25, 'engine/logprob_gap_max': 0.5, 'engine/kl': -0.25}
    """
    valid = mask.bool()
    diff = (engine_logprobs.detach().float() - policy_logprobs.detach().float())[valid]
    if diff.numel() == 0:
        return {"engine/logprob_gap_mean": 0.0, "engine/logprob_gap_max": 0.0, "engine/kl": 0.0}
    return {
        "engine/logprob_gap_mean": float(diff.abs().mean()),
        "engine/logprob_gap_max": float(diff.abs().max()),
        "engine/kl": float(diff.mean()),
    }


def truncated_importance_weights(policy_logprobs, engine_logprobs, mask=None, *, cap=2.0):
    """Truncated importance-sampling weights ``min(pi / pi_engine, cap)`` per token.

    The engine samples from ``pi_engine``, which differs from the policy ``pi``
    the loss differentiates (another kernel, another precision); Yao et al.
    (2025, "Your efficient RL framework secretly brings you off-policy RL
    training") reweight each token's policy-gradient term by this ratio, truncated
    at ``cap`` to bound the variance. The weights carry no gradient.

    Parameters
    ----------
    policy_logprobs, engine_logprobs : torch.Tensor of shape (n, length)
        Per-token log-probs of the sampled tokens under the policy (at rollout
        time) and the engine.
    mask : torch.Tensor of shape (n, length), default=None
        1 on response tokens; the weights are 0 elsewhere.
    cap : float, default=2.0
        The truncation ``C`` (> 0).

    Returns
    -------
    weights : torch.Tensor of shape (n, length)

    Examples
    --------
    >>> import math, torch
    >>> w = truncated_importance_weights(torch.tensor([[math.log(0.5), math.log(0.9)]]),
    ...                                  torch.tensor([[math.log(0.25), math.log(0.9)]]), cap=1.5)
    >>> w.tolist()
    [[1.5, 1.0]]
    """
    if not cap > 0:
        raise ValueError(f"cap must be > 0; got {cap!r}.")
    ratio = torch.exp(policy_logprobs.detach().float() - engine_logprobs.detach().float())
    weights = ratio.clamp(max=float(cap))
    if mask is not None:
        weights = weights * mask.to(weights.dtype)
    return weights
