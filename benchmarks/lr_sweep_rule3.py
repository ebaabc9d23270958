"""Rule 3 of the learning-rate sweep: the adaptive default against fixed rates, per cell.

The rule (cells, rates, seeds, order, budgets, what passes) is in
``benchmarks/LR_SWEEP.md`` ("Rule 3") and was committed before this script's run. Per
cell (policy x task x architecture of ``lr_sweep.py``) and sweep seed, the policy runs
at its default learning rate (``learning_rate=None``: the adaptive rate) and at the
cell's best healthy fixed rate (its highest passing rate of rules 1 and 2), then, where
it differs, at the policy's old fixed default; the runs go seed by seed over every cell,
so that a run cut short leaves the same seeds for every cell.

Run::

    python benchmarks/lr_sweep_rule3.py --workers 2              # the whole rule
    python benchmarks/lr_sweep_rule3.py --workers 2 --resume     # skip runs in the CSV
    python benchmarks/lr_sweep_rule3.py --summary                # the tables from the CSV
    python benchmarks/lr_sweep_rule3.py --quick                  # seconds, a temp folder

Rows go to ``benchmarks/lr_sweep_rule3.csv`` as they finish (``--quick``: a temporary
folder).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import lr_sweep as sweep  # benchmarks/, the script's folder, is on sys.path
import numpy as np
import pandas as pd
from joblib import Parallel, delayed

HERE = Path(__file__).resolve().parent
POLICIES = ("GRPO", "RLOO", "PPO", "REINFORCE", "REINFORCE++", "RAFT")
# The order of the tasks, the first the most wanted (LR_SWEEP.md, rule 3).
TASKS = (
    ("arithmetic", "gpt2"),
    ("arithmetic", "llama"),
    ("review", "gpt2"),
    ("review", "llama"),
    ("tiny_lm", "gpt2"),
    ("tiny_lm", "llama"),
)
BUDGET = {**sweep.BUDGET, **sweep.BUDGET_2}  # rule 2's where it set one, else rule 1's
# The fixed tiny-model defaults before issue 35 (rule 2's verdict).
OLD_DEFAULT = {
    "PPO": 3e-4,
    "RLOO": 1e-4,
    "GRPO": 1e-4,
    "REINFORCE": 3e-4,
    "REINFORCE++": 3e-4,
    "RAFT": 3e-5,
}
DEFAULT = "default"


def best_fixed() -> dict:
    """Per cell, the highest rate that passed rule 1 or (for the cells it re-ran) rule 2."""
    first = sweep.summary(sweep.read_runs(HERE / "lr_sweep.csv"), sweep.GRID, 5)
    second = sweep.summary(sweep.read_runs(HERE / "lr_sweep_rule2.csv"), sweep.GRID, 5)
    out = {}
    for table in (first, second):  # rule 2's re-run cells replace rule 1's verdict
        for r in table.itertuples(index=False):
            out[r[0], r[1], r[2]] = float(r[3])
    return out


def plan(seeds) -> list[tuple]:
    """Every run of the rule, in its order: (policy, task, arch, rate, seed)."""
    best = best_fixed()
    first, later = [], []
    for seed in seeds:
        for task, arch in TASKS:
            for name in POLICIES:
                fixed = best.get((name, task, arch), np.nan)
                fixed = OLD_DEFAULT[name] if not np.isfinite(fixed) else fixed
                first += [(name, task, arch, DEFAULT, seed), (name, task, arch, fixed, seed)]
                if not np.isclose(fixed, OLD_DEFAULT[name]):
                    later.append((name, task, arch, OLD_DEFAULT[name], seed))
    return first + later


def budget_of(name: str, budget: dict, quick: bool = False) -> dict:
    """A run's budget: the task's, with GRPO's and RLOO's own default batch (256).

    LR_SWEEP.md, rule 3's second amendment: since issue 35, point 5, GRPO and RLOO default
    to batches of 256 episodes, and every rate of their cells runs at it (``quick``: the
    quick budget's batch, for seconds).

    >>> budget_of("GRPO", {"n_steps": 300, "batch_size": 64})
    {'n_steps': 300, 'batch_size': 256}
    >>> budget_of("PPO", {"n_steps": 300, "batch_size": 64})
    {'n_steps': 300, 'batch_size': 64}
    """
    if name in ("GRPO", "RLOO") and not quick:
        return {**budget, "batch_size": sweep.POLICIES[name]().batch_size}
    return dict(budget)


def run(spec, job, budget) -> dict:
    name, task, arch, rate, seed = job
    row = sweep.one_run(spec, name, task, arch, None if rate == DEFAULT else rate, seed, budget)
    row["rate"] = rate
    row["batch_size"] = budget["batch_size"]
    return row


def main(argv=None) -> pd.DataFrame | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="seconds; a temp folder only")
    parser.add_argument("--resume", action="store_true", help="keep the runs in the CSV")
    parser.add_argument("--summary", action="store_true", help="only print the CSV's tables")
    args = parser.parse_args(argv)
    csv = HERE / "lr_sweep_rule3.csv"
    if args.summary:
        print(markdown(read(csv)))
        return None
    if args.quick:
        csv = Path(tempfile.mkdtemp(prefix="lr_sweep3_")) / "lr_sweep_rule3.csv"
    seeds = sweep.SEEDS[:1] if args.quick else sweep.SEEDS
    jobs = plan(seeds)
    if args.quick:
        jobs = [j for j in jobs if j[1:3] == ("arithmetic", "gpt2")][:4]
    budget = sweep.QUICK_BUDGET if args.quick else BUDGET
    began = time.perf_counter()
    tasks = sweep.build_tasks(args.quick, sweep.ARCHS, args.workers, only={j[1:3] for j in jobs})
    print(f"tasks built in {time.perf_counter() - began:.0f} s", flush=True)
    done = {}
    if args.resume and csv.exists():
        for row in read(csv).to_dict("records"):
            done[row["policy"], row["task"], row["arch"], str(row["rate"]), int(row["seed"])] = row
    rows = [done[k] for k in (tuple(map(str, j[:4])) + (j[4],) for j in jobs) if k in done]
    todo = [j for j in jobs if (*map(str, j[:4]), j[4]) not in done]
    print(f"{len(todo)} runs to do ({len(rows)} kept)", flush=True)
    results = Parallel(n_jobs=args.workers, backend="loky", return_as="generator")(
        delayed(run)(tasks[j[1], j[2]], j, budget_of(j[0], budget[j[1]], args.quick)) for j in todo
    )
    for i, row in enumerate(results, 1):
        rows.append(row)
        pd.DataFrame(rows).to_csv(csv, index=False)
        print(
            f"[{i}/{len(todo)}, {time.perf_counter() - began:.0f} s] {row['policy']} "
            f"{row['task']} {row['arch']} rate {row['rate']} seed {row['seed']}: "
            f"{row['start']:.3f} -> {row['end']:.3f} {row['tripped'] or 'healthy'} "
            f"({row['seconds']:.0f} s)",
            flush=True,
        )
    table = pd.DataFrame(rows)
    print(markdown(table))
    return table


def read(csv: Path) -> pd.DataFrame:
    table = sweep.read_runs(csv)
    table["rate"] = table["rate"].astype(str)
    return table


def cells(table: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the seeds both the default and the best fixed rate ran, their gains, the
    default's trips and the rule's verdict (LR_SWEEP.md, rule 3)."""
    table = table.copy()
    table["rate"] = table["rate"].astype(str)
    table["gain"] = table["end"] - table["start"]
    best = best_fixed()
    out = []
    for (name, task, arch), g in table.groupby(["policy", "task", "arch"], sort=False):
        fixed = best.get((name, task, arch), np.nan)
        fixed = OLD_DEFAULT[name] if not np.isfinite(fixed) else fixed
        ada = g[g.rate == DEFAULT].set_index("seed")
        fix = g[g.rate.astype(str) == str(fixed)].set_index("seed")
        old = g[g.rate.astype(str) == str(OLD_DEFAULT[name])].set_index("seed")
        seeds = sorted(set(ada.index) & set(fix.index))
        if not seeds:
            continue
        a, f = ada.loc[seeds], fix.loc[seeds]
        both_old = sorted(set(ada.index) & set(old.index))
        gain_a, gain_f = float(a.gain.mean()), float(f.gain.mean())
        trips = int((a.tripped.astype(str) != "").sum())
        ratio = gain_a / gain_f if gain_f > 0 else np.nan
        above = int((a["end"] > a["start"]).sum())
        kept = gain_a >= 0.9 * gain_f if gain_f > 0 else gain_a >= gain_f
        ok = trips == 0 and above == len(seeds) and kept
        out.append(
            {
                "policy": name,
                "task": task,
                "arch": arch,
                "seeds": len(seeds),
                "start": float(a.start.iloc[0]),
                "default end": float(a["end"].mean()),
                "default gain": gain_a,
                "default above start": above,
                "default trips": trips,
                "fixed rate": fixed,
                "fixed gain": gain_f,
                "fixed trips": int((f.tripped.astype(str) != "").sum()),
                "ratio": ratio,
                "old default gain": (float(old.loc[both_old].gain.mean()) if both_old else np.nan),
                "old default seeds": len(both_old),
                "passes": bool(ok),
            }
        )
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame) -> str:
    c = cells(table)
    head = (
        "| policy | task | arch | seeds | start | default: end (mean) | gain | above start "
        "| trips | best fixed rate | its gain | its trips | ratio | old default's gain "
        "(seeds) | passes |"
    )
    lines = [head, "|" + "---|" * 15]
    for r in c.itertuples(index=False):
        lines.append(
            f"| {r.policy} | {r.task} | {r.arch} | {r.seeds} | {r.start:.3f} | "
            f"{r[5]:.3f} | {r[6]:+.3f} | {r[7]}/{r.seeds} | {r[8]} | {r[9]:g} | "
            f"{r[10]:+.3f} | {r[11]} | {r.ratio:.2f} | {r[13]:+.3f} ({r[14]}) | "
            f"{'yes' if r.passes else 'no'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
