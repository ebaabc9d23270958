"""What a policy's run watches: the run-health detectors, a runaway KL, a greedy temperature.

The detectors (:func:`policy_monitor`) read the columns :func:`health_statistics`
adds to each ``history_`` row; the framework (the ``health/`` columns, ``health_``
and ``on_unhealthy``) is ``prefopt/lm/_health.py``'s.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ...lm._health import (
    NO_LEARNING_SUPERVISED,
    SMOOTHING,
    Detector,
    HealthMonitor,
    WeightProbe,
    count_non_finite,
    smoothed,
)
from ._environment import episode_detectors
from ._overlap import overlap_detectors

# Below this sampling temperature nothing is learned: log pi = log softmax(z / T), so at
# T = 0.05 a 1-nat gap between the two likeliest tokens becomes 20 nats and the runner-up
# is sampled with probability below e^-20 (about 2e-9). Sampling is then greedy, the k
# samples of a prompt coincide (zero advantages), and the sampled token's log-prob has
# gradient (1 - p) / T, about 0. The usual values are 0.7 to 1 (Ziegler et al. 2019).
MIN_TEMPERATURE = 0.05


def check_temperature(policy) -> None:
    """Warn when the sampling temperature is too low for anything to be learned."""
    if policy.temperature_ < MIN_TEMPERATURE:
        given = "" if policy.temperature else " (read from the model's generation config)"
        warnings.warn(
            f"{type(policy).__name__}: temperature={policy.temperature_:g}{given} makes "
            "sampling greedy: the samples of a prompt coincide and their gradient is "
            f"about 0, so nothing is learned. Use a temperature of {MIN_TEMPERATURE} or "
            "more (0.7 to 1 is usual).",
            UserWarning,
            stacklevel=3,  # the caller of fit
        )


# ----- the statistics of a step the detectors read --------------------------------
NGRAM = 3  # repeated trigrams: the loops of a degenerate sampler ("the the the", "a b a b a")


def health_statistics(view, batch) -> dict:
    """A step's columns for the detectors: reward spread, response shape, movement.

    ``objective/reward_std`` (the scores' standard deviation),
    ``response/empty_share`` (responses with no token besides a stop token),
    ``response/distinct_tokens`` (distinct tokens over tokens, the mean over
    non-empty responses: distinct-1 of Li et al. 2016), ``response/repeated_ngrams``
    (the share of a response's trigrams that repeat an earlier one, the mean over
    non-empty responses), ``policy/logprob_shift`` (the mean absolute difference
    of the sampling and reference log-probs per response token) and, for
    ``k > 1`` samples a prompt, ``objective/dead_group_share`` (groups whose
    scores are all equal: no group-relative signal).
    """
    mask = batch.response_mask.bool()
    stops = torch.as_tensor(list(view.stop_ids), dtype=batch.response_ids.dtype)
    content = mask & ~torch.isin(batch.response_ids, stops.to(batch.response_ids.device))
    ids = batch.response_ids.cpu().numpy()
    keep = content.cpu().numpy()
    distinct, repeated = [], []
    for row, ok in zip(ids, keep, strict=True):
        tokens = row[ok].tolist()
        if not tokens:
            continue
        distinct.append(len(set(tokens)) / len(tokens))
        grams = [tuple(tokens[i : i + NGRAM]) for i in range(len(tokens) - NGRAM + 1)]
        repeated.append(1 - len(set(grams)) / len(grams) if grams else 0.0)
    n_tokens = mask.sum().clamp(min=1)
    scores = batch.scores.float()
    out = {
        "objective/reward_std": float(scores.std(unbiased=False)),
        "response/empty_share": float((content.sum(1) == 0).float().mean()),
        "response/distinct_tokens": float(np.mean(distinct)) if distinct else 0.0,
        "response/repeated_ngrams": float(np.mean(repeated)) if repeated else 0.0,
    }
    if view.needs_reference:  # else no reference pass: nothing to compare
        shift = ((batch.old_logprobs - batch.ref_logprobs).abs() * mask).sum() / n_tokens
        out["policy/logprob_shift"] = float(shift)
    k = view.k
    if k > 1:  # the loop draws the k samples of a prompt in consecutive rows
        groups = scores.reshape(-1, k)
        out["objective/dead_group_share"] = float((groups == groups[:, :1]).all(1).float().mean())
    return out


# ----- the detectors ------------------------------------------------------------------
# Each threshold sits between what healthy runs reached and what constructed failures
# reached, measured by benchmarks/health_false_alarms.py (numbers in benchmarks/README.md).
REWARD_COLLAPSE = 0.28
EMPTY_RESPONSES = 0.8
REPETITIVE_RESPONSES = 0.5
KL_BLOWUP = 1.0  # the KL per token over its allowance, below
DEAD_GROUPS = 0.9
NO_LEARNING = 1e-4
# reward_collapse's start is the mean over the first steps: one batch of a few prompts
# swings widely at a fixed policy (GRPO's 8 prompts a batch on the arithmetic world: 0.09
# to 0.34), and a lucky first batch alone made healthy runs look collapsed.
BASELINE_STEPS = 5
# ... and the fall must hold this many consecutive steps: healthy GRPO runs dip for a few
# steps early on and recover, a collapsed run stays down.
PERSIST = 8
# kl_blowup's allowance, in nats a token: small while the reward is below its start (far
# and losing), large while it is above (an exact world's optimum is far too).
KL_LOSING = 1.2
KL_CAP = 2.1


def _start(rows, key: str) -> float:
    """The first step's value: its samples are the starting policy's (no update yet)."""
    return float(rows[0][key])


def _spread(rows) -> float:
    """The reward's spread at the start; a floor keeps a constant reward's ratio finite."""
    start = _start(rows, "objective/reward")
    return max(_start(rows, "objective/reward_std"), 1e-8 * (1 + abs(start)))


def reward_baseline(rows) -> tuple[float, float]:
    """The mean reward and the mean per-episode spread of the first ``BASELINE_STEPS`` rows.

    Examples
    --------
    >>> rows = [{"objective/reward": r, "objective/reward_std": 0.5} for r in (1, 0, 2)]
    >>> reward_baseline(rows)
    (1.0, 0.5)
    """
    first = rows[:BASELINE_STEPS]
    start = sum(float(r["objective/reward"]) for r in first) / len(first)
    spread = sum(float(r["objective/reward_std"]) for r in first) / len(first)
    return start, max(spread, 1e-8 * (1 + abs(start)))


def reward_falls(rows) -> list[float]:
    """``(baseline - smoothed) / spread`` at each step from the ``BASELINE_STEPS``-th on."""
    if len(rows) < BASELINE_STEPS:
        return []
    start, spread = reward_baseline(rows)
    falls, level = [], float(rows[0]["objective/reward"])
    for i, row in enumerate(rows):
        if i:  # the exponential moving average of lm._health.smoothed, step by step
            level = (1 - SMOOTHING) * level + SMOOTHING * float(row["objective/reward"])
        if i >= BASELINE_STEPS - 1:
            falls.append((start - level) / spread)
    return falls


def reward_collapse(rows) -> float:
    """The smallest fall of the last ``PERSIST`` steps, in baseline spreads (0 until then)."""
    falls = reward_falls(rows)
    return min(falls[-PERSIST:]) if len(falls) >= PERSIST else 0.0


def dead_groups(rows) -> float:
    """The smoothed share of dead groups while the reward has not risen (else 0)."""
    rewards = [r["objective/reward"] for r in rows]
    if smoothed(rewards) - _start(rows, "objective/reward") > 0.25 * _spread(rows):
        return 0.0  # learning, or converged: equal scores at the best answer are fine
    return smoothed([r["objective/dead_group_share"] for r in rows])


def _largest_shift(rows) -> float:
    """The run's largest log-prob shift (judged from 2 steps: the first samples the start)."""
    return max(r["policy/logprob_shift"] for r in rows)


def kl_per_token(rows) -> float:
    """The smoothed KL to the reference per response token (``objective/kl`` / length)."""
    return smoothed([r["objective/kl"] / max(r["response/length"], 1.0) for r in rows])


def kl_blowup(rows) -> float:
    """The smoothed KL per token over its allowance: ``KL_LOSING`` or ``KL_CAP`` nats.

    The allowance is ``KL_LOSING`` while the smoothed reward (``objective/reward``)
    is below its start (the mean of the first ``BASELINE_STEPS`` rows; before them,
    the first row's), so the policy is far and losing, and ``KL_CAP`` otherwise: a
    policy far from the reference is what a KL-regularised objective asks for when
    the reward pays for it (the exact optimum pi* has E[r] >= E_ref[r] + beta KL),
    up to a point.

    Examples
    --------
    >>> rows = [{"objective/reward": 1.0, "objective/kl": 0.0, "response/length": 2.0}]
    >>> rows.append({"objective/reward": 0.0, "objective/kl": 8.0, "response/length": 2.0})
    >>> round(kl_blowup(rows), 6)  # 0.3 * 4 nats a token = 1.2; losing: over 1.2
    1.0
    >>> rows[1]["objective/reward"] = 2.0
    >>> round(kl_blowup(rows), 6)  # the same KL while gaining: over 2.1
    0.571429
    """
    rewards = [r["objective/reward"] for r in rows]
    # the start: the first step alone until the baseline's steps are in (a rising reward's
    # moving average lags the mean of the steps so far, and would read as a fall)
    start = reward_baseline(rows)[0] if len(rows) >= BASELINE_STEPS else rewards[0]
    losing = smoothed(rewards) < start
    return kl_per_token(rows) / (KL_LOSING if losing else KL_CAP)


def _smoothed(key: str):
    return lambda rows: smoothed([r[key] for r in rows])


def _last(key: str):
    return lambda rows: rows[-1][key]


def policy_monitor(policy, view, *, first_row: int) -> HealthMonitor:
    """The run-health detectors of a policy's fit, with their default thresholds.

    - ``reward_collapse``: ``(start - smoothed) / spread``, where ``start`` is the
      mean reward (``objective/reward``) of the run's first 5 steps, ``spread``
      their mean per-episode standard deviation and ``smoothed`` the reward's
      exponential moving average (weight 0.3 on the newest step); the value is
      the smallest of the last 8 steps' (from the 5th step on), so it fires above
      0.28 only when the reward has stayed more than 0.28 starting spreads below
      its start for 8 consecutive steps (a fit of fewer than 12 steps cannot fire
      it). One batch of a few prompts is too noisy a start, and healthy runs dip
      for a few steps and recover; a collapsed run stays down.
    - ``empty_responses``: the smoothed share of responses with no token but a
      stop token; fires above 0.8 (an empty answer can be common, even best
      for a while, in a healthy run: not four in five for several steps).
    - ``repetitive_responses``: the mean share of a response's trigrams that
      repeat an earlier trigram of it (degenerate loops); fires above 0.5.
      ``response/distinct_tokens`` reports the distinct-token share beside it.
    - ``kl_blowup``: the smoothed KL to the reference per response token (a
      step's ``objective/kl`` over its ``response/length``, so that long and
      short answers compare) over its allowance: 1.2 nats a token while the
      smoothed reward is below the mean of its first 5 steps (before them, the
      first step's: far from the reference and losing), 2.1 nats a token
      otherwise (far is what a KL-regularised objective asks for when the
      reward pays for it: a preference world's exact optimum at beta 0.04 sits
      at 2.0 nats a token); fires above 1. ``max_kl`` stays a separate check, per response.
    - ``dead_groups`` (k > 1 samples a prompt): the smoothed share of groups
      whose k scores are all equal (``objective/dead_group_share`` in every
      row), counted while the smoothed reward has not risen a quarter spread
      above its start (a converged run's equal scores are not dead); fires
      above 0.9.
    - ``non_finite``: the number of non-finite values (nan, inf) in the step's
      row; fires above 0.
    - ``no_learning``: the largest ``policy/logprob_shift`` of the fit (mean
      absolute log-prob change from the reference per response token), judged
      at the end of a fit of 2 steps or more (the first step samples the
      starting policy); fires below 1e-4 nats (nothing moved). Without a
      reference pass (GRPO at ``beta=0`` without ``log_kl``) the shift is not
      measured, and the detector reads the largest relative weight change of a
      step instead (``model/weight_change``, as for SFT), firing below 1e-6.
    """
    detectors = [
        Detector(
            "reward_collapse",
            REWARD_COLLAPSE,
            reward_collapse,
            advice="The reward stayed far below its start: lower learning_rate or raise beta.",
        ),
        Detector(
            "empty_responses",
            EMPTY_RESPONSES,
            _smoothed("response/empty_share"),
            advice="The responses are empty: check that the reward does not favour them, "
            "lower learning_rate or raise beta.",
        ),
        Detector(
            "repetitive_responses",
            REPETITIVE_RESPONSES,
            _last("response/repeated_ngrams"),
            advice="The responses repeat themselves: lower learning_rate or raise beta.",
        ),
        Detector(
            "kl_blowup",
            KL_BLOWUP,
            kl_blowup,
            advice=view.kl_advice,  # the algorithm's declaration (Algorithm.kl_advice)
        ),
    ]
    if view.k > 1:
        detectors.append(
            Detector(
                "dead_groups",
                DEAD_GROUPS,
                dead_groups,
                advice="The k samples of a prompt score alike, so group-relative advantages "
                "are 0 and those groups teach nothing (objective/dead_group_share in "
                "history_ has the share each step). Check that the reward is not constant; "
                "draw more samples per prompt (raise k) or raise temperature; drop tied "
                "groups and draw again (dynamic_sampling=True, GRPO family); or change the "
                "prompt mix: groups all right mean prompts too easy, all wrong too hard.",
            )
        )
    detectors += [
        Detector(
            "non_finite",
            0.0,
            count_non_finite,
            advice="Lower learning_rate, set max_grad_norm, or check the reward.",
        ),
        _no_learning(view),
    ]
    detectors += overlap_detectors(view)  # overlapped rollouts: runaway importance weights
    detectors += episode_detectors(view)  # episodes: unused tools, failing tools, no end
    return HealthMonitor(policy, detectors, first_row=first_row)


def _no_learning(view) -> Detector:
    """``no_learning`` by the log-prob shift, or by the weights where no reference runs."""
    if view.needs_reference:
        threshold, measure, what = NO_LEARNING, _largest_shift, "log-probs"
    else:
        trained = [m for m in view.trained.values() if m is not None]
        probe = WeightProbe(p for m in trained for p in m.parameters() if p.requires_grad)
        threshold, measure, what = NO_LEARNING_SUPERVISED, probe.largest_change, "weights"
    return Detector(
        "no_learning",
        threshold,
        measure,
        advice=f"The policy's {what} did not move: raise learning_rate.",
        below=True,
        at_end=True,
        min_rows=2,
    )


def check_health(loop, row: dict) -> None:
    """After a step of ``loop``: a KL beyond ``max_kl`` warns or stops; too few EOS warns once."""
    view = loop.view
    step, kl, eos = row["step"], row["objective/kl"], row["response/eos_share"]
    if view.max_kl is not None and kl > view.max_kl:
        message = (
            f"{view.name}: the KL to the reference reached {kl:.3g} nats at "
            f"step {step}, beyond max_kl={view.max_kl}. {view.kl_advice}"
        )
        if view.max_kl_action == "raise":
            raise RuntimeError(message + " The last checkpoint (if any) is intact.")
        warnings.warn(message, RuntimeWarning, stacklevel=4)  # the caller of fit
    if (
        view.min_eos_share is not None
        and view.stop_ids
        and view.missing_eos_reward is not None
        and eos < view.min_eos_share
        and loop.run.warn_once("eos_share")
    ):
        warnings.warn(
            f"{view.name}: only {eos:.0%} of responses ended with EOS at "
            f"step {step}; the fixed missing_eos_reward={view.missing_eos_reward} "
            "then dominates the reward. Raise max_new_tokens or fine-tune the "
            "model to stop (SFTPolicy).",
            RuntimeWarning,
            stacklevel=4,  # the caller of fit
        )
