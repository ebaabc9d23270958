"""The verdicts of the committed results under the monotone margin rule and intention to treat.

Issue 36 changed two things in how a claim's parts are judged, after claims 10, 16, 19,
20 and 21 had run: every evaluation seed counts (an unhealthy run keeps the score it
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


def claim16():
    import claim16_careful_ppo as claim

    stats, parts, _, verdict = claim.decide(_evaluation("claim16_careful_ppo"))
    detail = "; ".join(f"RLOO - {p} {m} {fmt_mdd(stats[p, m])}" for (p, m) in stats)
    return verdict, parts, detail


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
    "claim16_careful_ppo": claim16,
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
