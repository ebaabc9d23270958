"""Over-optimisation: the proxy rises with KL while the gold reward peaks and falls (Gao et al.).

Gao et al. (2023): optimising a learned (proxy) reward, the gold reward first rises
then falls as the policy moves away from the initial one; with d = sqrt(KL), the gold
reward (minus the initial policy's) follows R(d) = d (alpha - beta log d) for RL and
R(d) = d (alpha - beta d) for best-of-n. Here: the review world's SFT policy and proxy
reward model (as claim 14; raters with a length bias and noise, so the proxy is
imperfect) and the gold reward VADER. RL: PPO with no KL penalty (Gao et al.'s main
runs), evaluated every few steps along the run on 2 samples of each evaluation prompt
(proxy, gold, and KL as the mean sequence log-ratio to the SFT policy). Best-of-n: 32
SFT samples of each evaluation prompt, split into groups of n = 1, 2, ..., 32, the
proxy's favourite of each group kept; its KL is log n - (n - 1)/n (Gao et al.).
``scipy.optimize.curve_fit`` fits each form to all seeds' points; alpha and beta are
reported with 95% intervals from the fit's covariance.

Settings and verdict rule, fixed before the first full run: 5 seeds, 80 PPO steps of 64
episodes at learning rate 1e-3, evaluation every 8 steps on 64 prompts. RL
over-optimises if the fitted beta's interval lies above 0, the fitted peak
d* = exp(alpha/beta - 1) lies inside the measured range of d, and the proxy keeps
rising past the gold reward's peak: per seed, the proxy at the last evaluation minus
the proxy where that seed's gold reward was highest, whose 95% t-interval lies above 0.
Best-of-n over-optimises if its beta's interval lies above 0 and its peak
alpha/(2 beta) lies inside the measured range. "reproduced" if both, "partly
reproduced" if one, "not reproduced" if neither.

Run::

    python benchmarks/reproduce/claim12_overoptimisation.py          # ~8 min (est.)
    python benchmarks/reproduce/claim12_overoptimisation.py --quick  # seconds
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from _common import (
    REVIEW_FULL,
    REVIEW_QUICK,
    finish,
    fmt,
    mean_ci,
    new_figure,
    parse_args,
    review_metrics,
    review_setup,
)
from _common import settings as choose
from scipy.optimize import curve_fit

from prefopt import PPOPolicy

FULL = dict(
    **REVIEW_FULL, steps=80, batch_size=64, seeds=5, eval_every=8, eval_prompts=64, bon_samples=32
)
QUICK = dict(
    **REVIEW_QUICK, steps=2, batch_size=8, seeds=2, eval_every=1, eval_prompts=8, bon_samples=4
)
COLUMNS = [
    "seed",
    "method",
    "step",
    "n",
    "kl",
    "d",
    "proxy",
    "gold",
    "gold_gain",
    "proxy_gain",
    "words",
]
# Verdict rule (see the docstring): RL: beta > 0 (95% CI), peak inside the range, proxy
# still rising past the gold peak (paired CI > 0); best-of-n: beta > 0, peak inside.


def rl_form(d, alpha, beta):
    return d * (alpha - beta * np.log(np.maximum(d, 1e-12)))


def bon_form(d, alpha, beta):
    return d * (alpha - beta * d)


def fit(form, d, y):
    """(alpha, beta), their 95% half-widths, or NaNs when the fit fails."""
    try:
        params, cov = curve_fit(form, d, y, p0=(0.1, 0.05), maxfev=20000)
        return params, 1.96 * np.sqrt(np.diag(cov))
    except (RuntimeError, ValueError, TypeError):
        return np.full(2, np.nan), np.full(2, np.nan)


def _picked(values, pick, groups, n):
    """Mean of ``values`` at the picked sample of each group of ``n``."""
    grouped = values[:, : groups * n].reshape(len(values), groups, n)
    return float(np.take_along_axis(grouped, pick[..., None], 2).mean())


def best_of_n(world, sft, rm, prompts, n_max, seed):
    groups = sft.sample(prompts, n=n_max, random_state=seed)
    rep = [p for p, g in zip(prompts, groups) for _ in g]
    texts = [c for g in groups for c in g]
    proxy = np.asarray(rm.predict(rep, texts)).reshape(len(prompts), n_max)
    gold = world.gold_reward(rep, texts).reshape(len(prompts), n_max)
    words = np.array([len(t.split()) for t in texts], dtype=float).reshape(len(prompts), n_max)
    table = {"proxy": proxy, "gold": gold, "words": words}
    out, n = [], 1
    while n <= n_max:
        g = n_max // n
        pick = proxy[:, : g * n].reshape(len(prompts), g, n).argmax(2)
        kl = np.log(n) - (n - 1) / n
        out.append({"n": n, "kl": kl, **{k: _picked(v, pick, g, n) for k, v in table.items()}})
        n *= 2
    return out


def main(argv=None):
    args = parse_args(__doc__, argv)
    s = choose(args, FULL, QUICK)
    world, sft, rm = review_setup(**{k: s[k] for k in REVIEW_FULL})
    prompts = world.prompts[: s["eval_prompts"]]
    rows = []
    for seed in range(s["seeds"]):
        start = review_metrics(world, sft, rm, prompts, seed=seed)
        rows.append({"seed": seed, "method": "RL", "step": 0, "n": 1, **start})

        def track(policy, row, seed=seed):
            if row["step"] % s["eval_every"] == 0:
                m = review_metrics(world, policy, rm, prompts, seed=seed)
                rows.append({"seed": seed, "method": "RL", "step": row["step"], "n": 1, **m})

        PPOPolicy(
            model=sft,
            beta=0.0,
            learning_rate=1e-3,
            batch_size=s["batch_size"],
            n_steps=s["steps"],
            random_state=seed,
        ).fit(world.prompts, rm, callback=track)
        for rec in best_of_n(world, sft, rm, prompts, s["bon_samples"], seed):
            rows.append({"seed": seed, "method": "BoN", "step": 0, **rec})
        # Gains over the initial policy, as Gao et al. normalise: RL's first point is the
        # SFT policy, best-of-n's is n = 1 (its own samples).
        for method in ("RL", "BoN"):
            mine = [r for r in rows if r["seed"] == seed and r["method"] == method]
            for r in mine:
                r["gold_gain"] = r["gold"] - mine[0]["gold"]
                r["proxy_gain"] = r["proxy"] - mine[0]["proxy"]
        print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    frame["kl"] = frame["kl"].clip(lower=0.0)  # a sampled estimate can dip below 0 near the start
    frame["d"] = np.sqrt(frame["kl"])
    frame = frame[COLUMNS]

    found = {}
    for method, form in (("RL", rl_form), ("BoN", bon_form)):
        sub = frame[frame.method == method]
        (alpha, beta), (ha, hb) = fit(form, sub["d"].to_numpy(), sub["gold_gain"].to_numpy())
        peak = np.exp(alpha / beta - 1) if method == "RL" else alpha / (2 * beta)
        inside = bool(beta - hb > 0 and 0 < peak < sub["d"].max())
        found[method] = dict(
            alpha=alpha, beta=beta, ha=ha, hb=hb, peak=peak, inside=inside, d_max=sub["d"].max()
        )
    rises = []
    for _, sub in frame[frame.method == "RL"].groupby("seed"):
        sub = sub.sort_values("step")
        rises.append(sub["proxy"].iloc[-1] - sub.loc[sub["gold"].idxmax(), "proxy"])
    rise = mean_ci(rises)
    rl_holds = found["RL"]["inside"] and rise[1] > 0
    bon_holds = found["BoN"]["inside"]
    verdict = (
        "reproduced"
        if rl_holds and bon_holds
        else "partly reproduced"
        if rl_holds or bon_holds
        else "not reproduced"
    )

    fig, axes = new_figure(2)
    for ax, method, form in zip(axes, ("RL", "BoN"), (rl_form, bon_form)):
        sub = frame[frame.method == method]
        ax.scatter(sub["d"], sub["gold_gain"], s=10, color="C0", label="gold - initial")
        ax.scatter(
            sub["d"], sub["proxy_gain"], s=10, color="C1", marker="x", label="proxy - initial"
        )
        grid = np.linspace(1e-3, max(sub["d"].max(), 1e-2), 100)
        f = found[method]
        if np.isfinite(f["alpha"]):
            ax.plot(grid, form(grid, f["alpha"], f["beta"]), color="C0", lw=1.5, label="Gao fit")
        ax.set_xlabel("d = sqrt(KL to SFT) (sqrt nats)")
        ax.set_title({"RL": "PPO, no KL penalty", "BoN": "best of n by proxy"}[method])
    axes[0].set_ylabel("reward gain over the SFT policy")
    axes[0].legend(fontsize=7)

    def describe(method):
        f = found[method]
        return (
            f"{method}: alpha {f['alpha']:.3f} +- {f['ha']:.3f}, beta {f['beta']:.3f} +- "
            f"{f['hb']:.3f}, peak d* {f['peak']:.2f} (measured up to {f['d_max']:.2f})"
        )

    return finish(
        args,
        "claim12_overoptimisation",
        frame,
        fig,
        number=12,
        claim="As KL grows the proxy reward keeps rising while the gold reward peaks and falls; "
        "R(d) = d(alpha - beta log d) for RL, d(alpha - beta d) for best-of-n, d = sqrt(KL)",
        source="Gao et al. 2023",
        setting=f"review world, proxy RM on length-biased raters, gold VADER; PPO beta 0, lr 1e-3, "
        f"{s['steps']} steps of {s['batch_size']}; best-of-{s['bon_samples']} from SFT; "
        f"{s['seeds']} seeds, {s['eval_prompts']} prompts",
        result=describe("RL")
        + "; "
        + describe("BoN")
        + f"; proxy at the end minus at the gold peak (RL) {fmt(*rise)}",
        verdict=verdict,
        reason=(
            ("RL over-optimises" if rl_holds else "RL does not peak and fall with a rising proxy")
            + f" (beta > 0 and peak inside: {found['RL']['inside']}; "
            + f"proxy still rising: {rise[1] > 0}); "
            + ("best-of-n over-optimises" if bon_holds else "best-of-n shows no peak in range")
        ),
    )


if __name__ == "__main__":
    main()
