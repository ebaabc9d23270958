"""The verdicts of the committed results under the monotone margin rule and intention to treat.

Issue 36 changed two things in how a claim's parts are judged, after claims 10, 11, 14,
16, 17, 18, 19, 20 and 21 had run: every evaluation seed counts (an unhealthy run keeps the score it
ended with; before, only seeds healthy in both arms were compared and a part with too
few was undecided), and the margin rule is monotone ("better" is better by at least the
margin; "better or equivalent" an interval above -margin). Nothing is rerun: this reads
``results/<claim>.csv`` as committed and applies the rule of each script's docstring
with those two changes. Prints one line per claim: the old verdict (from its JSON), the
new one, and the parts' intervals over all seeds.

Run::

    python benchmarks/reproduce/itt_verdicts.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import fmt_mdd, interval_with_mdd, part_status, parts_verdict  # noqa: E402


def _evaluation(name: str) -> pd.DataFrame:
    frame = pd.read_csv(HERE / "results" / f"{name}.csv")
    ev = frame[frame.phase == "evaluation"].copy()
    ev["healthy"] = ev["healthy"].astype(str).str.lower().eq("true")
    return ev


def claim10():
    import claim10_rloo_reinforce_vpg_ppo as claim

    stats, parts, _, verdict = claim.decide(_evaluation("claim10_rloo_reinforce_vpg_ppo"))
    detail = (
        "; ".join(
            f"{a} - {b} {m} {fmt_mdd(stats[a, b, m])}" for (a, b, m) in stats if m == "win_rate"
        )
        + "; "
        + "; ".join(
            f"{a} - {b} proxy {fmt_mdd(stats[a, b, m])}" for (a, b, m) in stats if m == "proxy"
        )
    )
    return verdict, parts, detail


def claim11():
    import claim11_raft_vs_rloo as claim

    ev = _evaluation("claim11_raft_vs_rloo")

    def wide(condition, metric):
        sub = ev[ev.condition == condition]
        return sub.pivot(index="seed", columns="algorithm", values=metric)

    parts, details = {}, []
    for c in claim.CLEAN:
        win = wide(c, "win_rate")
        stat = interval_with_mdd(win["RAFT"] - win["RLOO"], claim.WIN_MARGIN)
        parts[f"A{c[1:]} RAFT below RLOO at k={c[1:]}"] = part_status(stat, ("worse",))
        details.append(f"win rate RAFT - RLOO {c} {fmt_mdd(stat)}")
    for c in claim.PERTURBED:
        fall = wide("k4", "proxy") - wide(c, "proxy")
        stat = interval_with_mdd(fall["RAFT"] - fall["RLOO"], claim.FALL_MARGIN)
        parts[f"B {c}: RAFT's proxy falls more"] = part_status(stat, ("better",))
        details.append(f"clean-proxy fall RAFT - RLOO {c} {fmt_mdd(stat)}")
    return parts_verdict(parts), parts, "; ".join(details)


def claim14():
    import claim14_online_refits as claim

    # No run of claim 14 was unhealthy: a seed leaves the comparison only when its run
    # never reached the KL (it has no gold there), as before; the rule is the new one.
    frame = pd.read_csv(HERE / "results" / "claim14_online_refits.csv")
    ev = frame[frame.phase == "evaluation"]
    kl_at = claim.FULL["kl_at"]
    at = claim.read(ev, kl_at).droplevel("learning_rate").unstack("mode")
    usable = at.notna().all(axis=1)
    stat = interval_with_mdd((at["online"] - at["offline"])[usable], claim.MARGIN)
    parts = {"online beats offline at equal KL": part_status(stat, ("better",))}
    detail = f"online - offline gold at {kl_at:g} nats {fmt_mdd(stat)}"
    return parts_verdict(parts), parts, detail


def claim16():
    import claim16_careful_ppo as claim

    stats, parts, _, verdict = claim.decide(_evaluation("claim16_careful_ppo"))
    detail = "; ".join(f"RLOO - {p} {m} {fmt_mdd(stats[p, m])}" for (p, m) in stats)
    return verdict, parts, detail


def claim17():
    import claim17_per_token_credit as claim

    ev = _evaluation("claim17_per_token_credit")
    area = ev.pivot(index="seed", columns="method", values="area")
    parts, details = {}, []
    for part, other in claim.PARTS.items():
        stat = interval_with_mdd(area["PPO per-token"] - area[other], claim.MARGIN)
        parts[part] = part_status(stat, ("better",))
        details.append(f"PPO per-token - {other} {fmt_mdd(stat)}")
    return parts_verdict(parts), parts, "; ".join(details)


def claim18():
    import claim18_ppo_length_vs_lr as claim

    runs = pd.read_csv(HERE / "results" / "claim18_ppo_length_vs_lr.csv")
    runs = runs[runs.algorithm != "SFT"]
    parts, details = {}, []
    for lr in sorted(runs.learning_rate.unique()):
        words = runs[runs.learning_rate == lr].pivot(
            index="seed", columns="algorithm", values="words"
        )
        stat = interval_with_mdd(words["PPO"] - words["RLOO"], claim.MARGIN)
        # "shorter" is the worse region; equivalent or better is "not shorter".
        parts[f"lr {lr:g} PPO shorter"] = part_status(stat, ("worse",))
        details.append(f"lr {lr:g}: PPO - RLOO words {fmt_mdd(stat, digits=1)}")
    values = list(parts.values())
    if all(v == "held" for v in values):
        verdict = "reproduced"
    elif all(v == "refuted" for v in values):
        verdict = "not reproduced"
    elif "held" in values and "refuted" in values:
        verdict = "partly reproduced"
    else:
        verdict = "inconclusive"
    return verdict, parts, "; ".join(details)


def claim19():
    import claim19_dr_grpo_length as claim

    ev = _evaluation("claim19_dr_grpo_length")
    wide = ev.pivot(index="seed", columns="arm", values="incorrect_length_growth")
    grpo = interval_with_mdd(wide["GRPO"], claim.MARGIN)
    dr = interval_with_mdd(wide["Dr. GRPO"], claim.MARGIN)
    diff = interval_with_mdd(wide["GRPO"] - wide["Dr. GRPO"], claim.MARGIN)
    parts = {
        "A GRPO's incorrect responses grow": part_status(grpo, ("better",)),
        "B Dr. GRPO's do not": part_status(dr, ("equivalent", "worse")),
        "C GRPO grows them more than Dr. GRPO": part_status(diff, ("better",)),
    }
    detail = f"GRPO {fmt_mdd(grpo)}; Dr. GRPO {fmt_mdd(dr)}; GRPO - Dr. GRPO {fmt_mdd(diff)}"
    return parts_verdict(parts), parts, detail


def claim20():
    import claim20_clip_higher_entropy as claim

    ev = _evaluation("claim20_clip_higher_entropy")
    margin = claim.MARGIN_SHARE * float(ev.entropy_start.mean())
    change = ev.pivot(index="seed", columns="arm", values="entropy_change")
    end = ev.pivot(index="seed", columns="arm", values="entropy_end")
    fall = interval_with_mdd(change["symmetric"], margin)
    kept = interval_with_mdd(end["clip-higher"] - end["symmetric"], margin)
    parts = {
        "A the symmetric clip's entropy falls": part_status(fall, ("worse",)),
        "B clip-higher keeps more entropy": part_status(kept, ("better",)),
    }
    detail = f"symmetric change {fmt_mdd(fall)}; clip-higher - symmetric end {fmt_mdd(kept)}"
    return parts_verdict(parts), parts, detail


def claim21():
    import claim21_pass_at_k as claim

    ev = _evaluation("claim21_pass_at_k")
    start = ev[ev.model == "start"].set_index("k")["pass_at_k"]
    curves = ev[ev.model == "GRPO"].pivot(index="seed", columns="k", values="pass_at_k")
    top = int(max(curves.columns))
    low_k = interval_with_mdd(curves[1] - start[1], claim.MARGIN)
    high_k = interval_with_mdd(curves[top] - start[top], claim.MARGIN)
    parts = {
        "A pass@1 rises": part_status(low_k, ("better",)),
        f"B the start matches or exceeds at k={top}": part_status(high_k, ("equivalent", "worse")),
    }
    detail = f"pass@1 trained - start {fmt_mdd(low_k)}; pass@{top} {fmt_mdd(high_k)}"
    return parts_verdict(parts), parts, detail


CLAIMS = {
    "claim10_rloo_reinforce_vpg_ppo": claim10,
    "claim11_raft_vs_rloo": claim11,
    "claim14_online_refits": claim14,
    "claim16_careful_ppo": claim16,
    "claim17_per_token_credit": claim17,
    "claim18_ppo_length_vs_lr": claim18,
    "claim19_dr_grpo_length": claim19,
    "claim20_clip_higher_entropy": claim20,
    "claim21_pass_at_k": claim21,
}


def main() -> list[dict]:
    out = []
    for name, decide in CLAIMS.items():
        with open(HERE / "results" / f"{name}.json") as f:
            old = json.load(f)["verdict"]
        verdict, parts, detail = decide()
        out.append({"claim": name, "old": old, "new": verdict, "parts": parts, "detail": detail})
        print(f"{name}: {old} -> {verdict}")
        print("  " + "; ".join(f"{k}: {v}" for k, v in parts.items()))
        print("  " + detail)
    return out


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
