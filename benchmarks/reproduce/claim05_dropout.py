"""Dropout left on makes the first-epoch ratio differ from 1 and the KL estimate unreliable.

Huang et al. (2024) turn dropout off because, with it active, the same tokens get
different log-probabilities in the sampling pass and the training pass, so the PPO
ratio is not 1 at the start of the first epoch and the KL estimate is unreliable.
Here: TinyLMWorld (every response enumerated), its gold reward, PPO at prefopt's
defaults (beta = 0.1, 100 steps of 64), with dropout off (the default) or left on in
the policy at GPT-2's default rate 0.1 (``dropout=0.1``, the experiment-only switch;
the reference stays deterministic). After training, on the final policy:

- the first-epoch ratio: the log-probability of the same response in two passes at the
  same weights (what the old log-probs and the first training pass see) differs by the
  spread of log pi over dropout masks; measured as the p-weighted mean absolute log
  ratio of two independent passes over every response, and the p-weighted share of
  responses whose sequence ratio leaves PPO's [0.8, 1.2];
- the KL estimate: the loop's k1 estimate log pi(y) - log pi_ref(y) uses one dropout
  pass per sampled y, so its expectation is sum_y p(y) (E_mask log pi_mask(y) -
  log pi_ref(y)), against the true KL(p || pi_ref) of the distribution p that actually
  samples (the average of pi_mask over masks). Both are computed over every response
  with ``MASKS`` passes; with dropout off they agree exactly.

Settings and verdict rule, fixed before the first full run: 5 seeds (dropout masks
from torch's global generator, seeded per run). Two parts, on 95% t-intervals over
seeds of the dropout runs:

- "the first-epoch ratio differs from 1": the interval of the mean absolute log ratio
  lies above 0 (it is exactly 0 with dropout off);
- "the KL estimate is unreliable": the interval of the relative error of the
  estimate's expectation, |E[estimate] - KL| / KL, lies above 0.1.

"reproduced" if both hold, "partly reproduced" if one does, else "not reproduced". The
exact objective share each arm's policy reached (dropout off at evaluation) is reported.

Run::

    python benchmarks/reproduce/claim05_dropout.py          # ~4 min on 2 cores
    python benchmarks/reproduce/claim05_dropout.py --quick  # seconds

One seed of the full setting (two runs of 100 steps and the mask passes) took 40 s of
CPU time (64 s of wall time on a busy 2-core machine): 5 seeds take about 3-4 minutes
on a quiet machine, 6 on a busy one.
"""

from __future__ import annotations

import numpy as np
import torch
from _common import (
    compound_verdict,
    finish,
    fmt,
    mean_ci,
    new_figure,
    parse_args,
    parts_reason,
    pinned_ppo,
)
from _common import settings as choose

from prefopt import PPOPolicy
from prefopt.worlds import TinyLMWorld

FULL = dict(seeds=5, steps=100, batch_size=64, masks=64)
QUICK = dict(seeds=2, steps=3, batch_size=16, masks=4)
BETA = 0.1
RATE = 0.1  # GPT-2's default dropout
CLIP = 0.2
COLUMNS = [
    "seed",
    "dropout",
    "abs_log_ratio",
    "clipped_share",
    "kl_true",
    "kl_estimate_mean",
    "kl_relative_error",
    "kl_step1",
    "share",
]
# Verdict rule: see the docstring; computed in main() below.


def measure(world, policy, n_masks):
    """Ratio spread and KL-estimate bias of ``policy`` over every response, exactly."""
    # One pass of log pi over every (prompt, response); with dropout on, each row gets its
    # own masks, so a pass's probabilities need not sum to 1 (policy_probs would refuse).
    prompts = [x for x in world.prompts for _ in world.response_ids]
    responses = [list(r) for _ in world.prompts for r in world.response_ids]
    shape = (len(world.prompts), len(world.response_ids))
    logp = np.stack([policy.log_prob(prompts, responses).reshape(shape) for _ in range(n_masks)])
    p = np.exp(logp).mean(0)  # the distribution that samples: the average over masks
    ref = world.reference_probs()
    n = len(world.prompts)
    # Two independent passes: consecutive mask draws paired up.
    pairs = logp[: n_masks // 2 * 2].reshape(n_masks // 2, 2, *p.shape)
    log_ratio = pairs[:, 0] - pairs[:, 1]
    abs_log_ratio = float((p * np.abs(log_ratio).mean(0)).sum() / n)
    clipped = float((p * (np.abs(np.exp(log_ratio) - 1) > CLIP).mean(0)).sum() / n)
    kl_true = float((p * (np.log(p) - np.log(ref))).sum() / n)
    kl_est = float((p * (logp.mean(0) - np.log(ref))).sum() / n)
    return abs_log_ratio, clipped, kl_true, kl_est


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    world = TinyLMWorld(random_state=0)
    rows = []
    for seed in range(s["seeds"]):
        for rate in (None, RATE):
            torch.manual_seed(seed)  # dropout masks come from torch's global generator
            policy = PPOPolicy(
                **pinned_ppo(
                    model=world.policy_model(),
                    beta=BETA,
                    n_steps=s["steps"],
                    batch_size=s["batch_size"],
                    dropout=rate,
                    min_eos_share=None,
                    random_state=seed,
                )
            ).fit(world.prompts, world.reward)
            abs_log_ratio, clipped, kl_true, kl_est = measure(
                world, policy, s["masks"] if rate else 2
            )
            policy.model_.eval()  # dropout off: the policy a user would deploy
            rows.append(
                {
                    "seed": seed,
                    "dropout": 0.0 if rate is None else rate,
                    "abs_log_ratio": abs_log_ratio,
                    "clipped_share": clipped,
                    "kl_true": kl_true,
                    "kl_estimate_mean": kl_est,
                    "kl_relative_error": abs(kl_est - kl_true) / max(kl_true, 1e-12),
                    "kl_step1": policy.history_[0]["objective/kl"],
                    "share": world.objective_share(policy, world.reward, BETA),
                }
            )
            print(rows[-1], flush=True)

    get = lambda rate, key: np.array([r[key] for r in rows if r["dropout"] == rate])  # noqa: E731
    ratio = mean_ci(get(RATE, "abs_log_ratio"))
    error = mean_ci(get(RATE, "kl_relative_error"))
    parts = {
        "the first-epoch ratio differs from 1": ratio[1] > 0,
        "the KL estimate is unreliable (relative error above 0.1)": error[1] > 0.1,
    }

    fig, (left, right) = new_figure(2)
    for i, rate in enumerate((0.0, RATE)):
        left.scatter([i] * s["seeds"], get(rate, "abs_log_ratio"), color=f"C{i}")
        right.scatter(
            get(rate, "kl_true"),
            get(rate, "kl_estimate_mean"),
            color=f"C{i}",
            label=f"dropout {rate:g}",
        )
    left.set_xticks([0, 1], ["dropout off", f"dropout {RATE:g}"])
    left.set_ylabel("mean |log ratio| of two passes, same weights")
    left.set_title("the first epoch's ratio")
    lim = [0, max(1e-3, max(r["kl_true"] for r in rows), max(r["kl_estimate_mean"] for r in rows))]
    right.plot(lim, lim, color="grey", ls=":", label="estimate = truth")
    right.set_xlabel("true KL of the sampling distribution (nats)")
    right.set_ylabel("expected k1 estimate (nats)")
    right.legend(fontsize=7)
    right.set_title(f"PPO on TinyLMWorld, β = {BETA}")

    return finish(
        args,
        "claim05_dropout",
        rows,
        fig,
        number=5,
        claim="Dropout left on makes the first-epoch ratio differ from 1 and the KL estimate "
        "unreliable",
        source="Huang et al. 2024",
        setting=f"TinyLMWorld, PPO defaults (beta {BETA}, {s['steps']} steps of "
        f"{s['batch_size']}), dropout off vs {RATE:g} in the policy, {s['masks']} mask "
        f"passes over every response, {s['seeds']} seeds",
        result=f"mean |log ratio| of two passes: off {get(0.0, 'abs_log_ratio').mean():.2g}, "
        f"on {fmt(*ratio, digits=4)} (share outside [0.8, 1.2] "
        f"{fmt(*mean_ci(get(RATE, 'clipped_share')))}); KL relative error: off "
        f"{get(0.0, 'kl_relative_error').mean():.2g}, on {fmt(*error)} (true "
        f"{fmt(*mean_ci(get(RATE, 'kl_true')))}, expected estimate "
        f"{fmt(*mean_ci(get(RATE, 'kl_estimate_mean')))}); KL reported at step 1: off "
        f"{fmt(*mean_ci(get(0.0, 'kl_step1')))}, on {fmt(*mean_ci(get(RATE, 'kl_step1')))}; "
        f"objective share off {fmt(*mean_ci(get(0.0, 'share')))}, on "
        f"{fmt(*mean_ci(get(RATE, 'share')))}",
        verdict=compound_verdict(parts),
        reason=parts_reason(parts),
    )


if __name__ == "__main__":
    main()
