"""What a policy's run watches: a runaway KL, responses that never end, a greedy temperature."""

from __future__ import annotations

import warnings

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


def check_health(loop, row: dict) -> None:
    """After a step of ``loop``: a KL beyond ``max_kl`` warns or stops; too few EOS warns once."""
    policy = loop.policy
    step, kl, eos = row["step"], row["objective/kl"], row["response/eos_share"]
    if policy.max_kl is not None and kl > policy.max_kl:
        message = (
            f"{type(policy).__name__}: the KL to the reference reached {kl:.3g} nats at "
            f"step {step}, beyond max_kl={policy.max_kl}; raise beta, use an adaptive "
            "KL controller or lower learning_rate."
        )
        if policy.max_kl_action == "raise":
            raise RuntimeError(message + " The last checkpoint (if any) is intact.")
        warnings.warn(message, RuntimeWarning, stacklevel=4)  # the caller of fit
    if (
        policy.min_eos_share is not None
        and policy._stop_ids()
        and policy.missing_eos_reward is not None
        and eos < policy.min_eos_share
        and loop.run.warn_once("eos_share")
    ):
        warnings.warn(
            f"{type(policy).__name__}: only {eos:.0%} of responses ended with EOS at "
            f"step {step}; the fixed missing_eos_reward={policy.missing_eos_reward} "
            "then dominates the reward. Raise max_new_tokens or fine-tune the "
            "model to stop (SFTPolicy).",
            RuntimeWarning,
            stacklevel=4,  # the caller of fit
        )
