"""Open question: with rewards paid along the response, does per-token credit assignment win back?

Ahmadian et al. (2024) argue that RLHF is a bandit problem, because the reward comes
only at the end of the response, so treating the response as one action (RLOO) beats
PPO's per-token machinery; their case assumes that reward. Here the reward is paid
along the response: TinyLMWorld's per-token variant (``world.token_reward(share=1)``)
pays each content token its part of the gold reward (+1 for the prompt's topic word,
-0.5 per word) when it is generated, the sum being the world's gold reward, so the
exact optimum is unchanged and only the timing differs. PPO (GAE, lambda 0.95, the
world's tabular value model over its states, ``world.value_model()``, so credit
assignment is not limited by a function approximator) reads the payments at their
tokens; RLOO and GRPO (k = 4) see only their sum, as the bandit view does. Control:
the same PPO with the whole reward paid at the last token (``share=0``), to tell the
per-token payment from PPO itself. Everything is exact: every few steps the policy's
share of the achievable KL-regularised objective, (J(pi) - J(pi_ref)) / (J(pi*) -
J(pi_ref)), is computed by enumerating the responses (GRPO's own fixed point is not
pi*, so its share stops short of 1 by design; Notes of ``GRPOPolicy``).

Settings and verdict rule, fixed before the first full run: TinyLMWorld(max_len=4,
random_state=0), beta 0.3, 40 steps of 64 episodes, Adam at 3e-3 for every algorithm,
evaluation every 5 steps, 10 seeds. The measure is the mean objective share over the
evaluation points (the area under the learning curve: how fast, not only where, each
gets). With paired 95% t-intervals over seeds: (A) PPO with per-token payments minus
RLOO > 0 and minus GRPO > 0; (B) PPO with per-token payments minus PPO with the reward
at the end > 0. "reproduced" (per-token credit assignment wins back) if A (both) and
B; "partly reproduced" if PPO beats at least one bandit algorithm but B fails (PPO
wins, but not through the per-token payments) or if only B holds; "not reproduced"
otherwise.

Run::

    python benchmarks/reproduce/claim17_per_token_credit.py          # ~5 min (est.)
    python benchmarks/reproduce/claim17_per_token_credit.py --quick  # seconds
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from _common import finish, fmt, mean_ci, new_figure, paired_ci, parse_args
from _common import settings as choose

from prefopt import GRPOPolicy, PPOPolicy, RLOOPolicy
from prefopt.worlds import TinyLMWorld

FULL = dict(
    max_len=4, beta=0.3, steps=40, batch_size=64, learning_rate=3e-3, eval_every=5, seeds=10
)
QUICK = dict(max_len=3, beta=0.3, steps=2, batch_size=8, learning_rate=3e-3, eval_every=1, seeds=2)
METHODS = ["PPO per-token", "PPO end-only", "RLOO", "GRPO"]
COLUMNS = ["seed", "method", "step", "objective_share", "reward", "kl", "true_quality"]
# Verdict rule (see the docstring), on the mean objective share over the evaluation
# points: A PPO per-token - RLOO > 0 and - GRPO > 0; B PPO per-token - PPO end-only > 0.


def make(method, world, s, seed):
    common = dict(
        model=world.policy_model(),
        beta=s["beta"],
        learning_rate=s["learning_rate"],
        batch_size=s["batch_size"],
        n_steps=s["steps"],
        random_state=seed,
    )
    if method.startswith("PPO"):
        return PPOPolicy(value_model=world.value_model(), gae_lambda=0.95, **common)
    if method == "RLOO":
        return RLOOPolicy(k=4, **common)
    return GRPOPolicy(k=4, **common)


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    world = TinyLMWorld(max_len=s["max_len"], random_state=0)
    paid = {"per-token": world.token_reward(share=1.0), "end-only": world.token_reward(share=0.0)}
    gold, beta = world.reward, s["beta"]
    rows = []
    for seed in range(s["seeds"]):
        for method in METHODS:
            reward = paid["end-only"] if method == "PPO end-only" else paid["per-token"]

            def track(policy, row, seed=seed, method=method):
                if row["step"] % s["eval_every"] == 0:
                    m = world.evaluate(policy, gold, beta)
                    rows.append(
                        {
                            "seed": seed,
                            "method": method,
                            "step": row["step"],
                            "objective_share": world.objective_share(policy, gold, beta),
                            **{k: m[k] for k in ("reward", "kl", "true_quality")},
                        }
                    )

            make(method, world, s, seed).fit(world.prompts, reward, callback=track)
        print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)[COLUMNS]
    area = frame.groupby(["method", "seed"])["objective_share"].mean().unstack("method")
    final = frame[frame.step == frame.step.max()].pivot(
        index="seed", columns="method", values="objective_share"
    )

    diffs = {
        other: paired_ci(area["PPO per-token"], area[other])
        for other in ("RLOO", "GRPO", "PPO end-only")
    }
    beats = {k: v[1] > 0 for k, v in diffs.items()}
    a = beats["RLOO"] and beats["GRPO"]
    b = beats["PPO end-only"]
    if a and b:
        verdict = "reproduced"
    elif beats["RLOO"] or beats["GRPO"] or b:
        verdict = "partly reproduced"
    else:
        verdict = "not reproduced"

    fig, axes = new_figure(2)
    for i, method in enumerate(METHODS):
        curve = frame[frame.method == method].groupby("step")["objective_share"]
        m = curve.mean()
        stats = [mean_ci(v) for _, v in curve]
        lo, hi = np.array([v[1] for v in stats]), np.array([v[2] for v in stats])
        axes[0].plot(m.index, m.values, color=f"C{i}", label=method)
        axes[0].fill_between(m.index, lo, hi, color=f"C{i}", alpha=0.2)
        mm, ml, mh = mean_ci(area[method])
        axes[1].errorbar([i], [mm], yerr=[[mm - ml], [mh - mm]], fmt="o", capsize=4, color=f"C{i}")
    axes[0].set_xlabel(f"step ({s['batch_size']} episodes each)")
    axes[0].set_ylabel("share of the achievable objective (exact)")
    axes[0].legend(fontsize=8)
    axes[1].set_xticks(range(len(METHODS)), [m.replace(" ", "\n") for m in METHODS])
    axes[1].set_ylabel("mean share over the run")
    axes[1].set_title(f"{s['seeds']} seeds, 95% CI")
    findings = (
        "With the gold reward paid at its tokens, PPO (GAE over a tabular value model) "
        + (
            "learns faster than both RLOO and GRPO"
            if a
            else "learns faster than " + " and ".join(k for k in ("RLOO", "GRPO") if beats[k])
            if beats["RLOO"] or beats["GRPO"]
            else "does not learn faster than RLOO or GRPO"
        )
        + " by the mean objective share over the run ("
        + "; ".join(f"PPO per-token - {k} {fmt(*v)}" for k, v in diffs.items())
        + "). The same PPO with the reward paid at the end "
        + (
            "does worse, so the per-token payments are what helps."
            if b
            else "does as well or better, so the per-token payments are not what helps."
        )
        + " Final shares: "
        + ", ".join(f"{m} {mean_ci(final[m])[0]:.3f}" for m in METHODS)
        + "."
    )
    return finish(
        args,
        "claim17_per_token_credit",
        frame,
        fig,
        number=17,
        claim="Open question: with rewards paid along the response, does per-token credit "
        "assignment (PPO with GAE) win back over the bandit view (RLOO, GRPO)?",
        source="Ahmadian et al. 2024 (the limits of the bandit argument)",
        setting=f"TinyLMWorld(max_len={s['max_len']}) per-token gold reward, beta {beta}, "
        f"{s['steps']} steps of {s['batch_size']}, Adam {s['learning_rate']:g}, PPO with the "
        f"tabular value model, RLOO and GRPO k=4, {s['seeds']} seeds",
        result="mean objective share over the run: "
        + ", ".join(f"{m} {fmt(*mean_ci(area[m]))}" for m in METHODS),
        verdict=verdict,
        reason=findings,
    )


if __name__ == "__main__":
    main()
