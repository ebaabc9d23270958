"""Exact expectations over an enumerable response space, shared by the worlds."""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp


def check_probs(probs) -> np.ndarray:
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


def tilt(ref_probs, rewards, beta: float) -> np.ndarray:
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


def exact_metrics(probs, ref_probs, rewards, quality, beta: float) -> dict:
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
