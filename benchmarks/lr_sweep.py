"""The learning-rate sweep that sets prefopt's tiny-model default rate of every policy.

The rule (grid, tasks, seeds, budgets, what passes) is in ``benchmarks/LR_SWEEP.md``
and was committed before the full run. For every policy, task and architecture (a
*cell*) the rates are tried from the highest down; a rate passes a cell when none of
the 5 sweep seeds trips a run-health detector (``on_unhealthy="stop"``: a stopped
run has one fired) and every seed's held-out gold ends above the start. A cell stops
at its first passing rate. A policy's new default is the minimum over its cells of
their passing rates.

Tasks (each with a GPT-2- and a Llama-shaped model):

* ``tiny_lm``: :class:`prefopt.worlds.TinyLMWorld` (world seed 0), exact: the
  objective share (> 0) and the expected gold reward (above the reference's).
* ``review``: :class:`prefopt.worlds.ReviewWorld` (world seed 0), an SFT model, the
  gold (VADER) reward on 2/3 of the prompts; the gold of samples on the other 1/3
  (held out) against the SFT model's. DPO here too, on comparisons of SFT samples.
* ``arithmetic``: :class:`prefopt.worlds.ArithmeticWorld` (world seed 0), an SFT
  model, the correctness reward; held-out pass@1 against the SFT model's.

Run::

    python benchmarks/lr_sweep.py --workers 2            # the full sweep, ~35 min
    python benchmarks/lr_sweep.py --quick --workers 2    # a smoke run, a temp folder
    python benchmarks/lr_sweep.py --workers 2 --resume   # skip runs already in the CSV
    python benchmarks/lr_sweep.py --rule 2 --workers 2   # rule 2: rule 1's undecided cells

The full run writes ``benchmarks/lr_sweep.csv`` (one row per run) and prints the
summary table; ``--quick`` writes only under a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from joblib import Parallel, delayed  # noqa: E402

import prefopt  # noqa: E402
from prefopt import (  # noqa: E402
    DPOPolicy,
    GRPOPolicy,
    PPOPolicy,
    RAFTPolicy,
    ReinforcePlusPlusPolicy,
    ReinforcePolicy,
    RLOOPolicy,
    SFTPolicy,
)
from prefopt.metrics import make_pass_at_k_scorer  # noqa: E402
from prefopt.worlds import ArithmeticWorld, ReviewWorld, TinyLMWorld  # noqa: E402

HERE = Path(__file__).resolve().parent
GRID = (1e-3, 3e-4, 1e-4, 3e-5)  # descending
SEEDS = (1000, 1001, 1002, 1003, 1004)  # not the tests' or the reproductions' seeds
ARCHS = ("gpt2", "llama")
POLICIES = {
    "PPO": PPOPolicy,
    "RLOO": RLOOPolicy,
    "GRPO": GRPOPolicy,
    "REINFORCE": ReinforcePolicy,
    "REINFORCE++": ReinforcePlusPlusPolicy,
    "RAFT": RAFTPolicy,
    "DPO": DPOPolicy,  # review only: the one task with comparisons
}
# The budget per run: the same for every rate and every policy of a task (see LR_SWEEP.md).
BUDGET = {
    "tiny_lm": {"n_steps": 40, "batch_size": 16},
    "review": {"n_steps": 16, "batch_size": 32},
    "arithmetic": {"n_steps": 16, "batch_size": 32},
}
QUICK_BUDGET = {task: {"n_steps": 2, "batch_size": 16} for task in BUDGET}
# Rule 2 (LR_SWEEP.md, committed before its run): the cells rule 1 left without a passing
# rate are run again at these budgets; the cells rule 1 decided keep their result.
BUDGET_2 = {
    "review": {"n_steps": 30, "batch_size": 64},  # benchmarks/review_defaults.py's
    "arithmetic": {"n_steps": 300, "batch_size": 64},  # benchmarks/verifiable_world.py's
}
EVAL_SEED = 4321


# ----- the tasks: their models, rewards and held-out gold ---------------------------
def build_task(task: str, arch: str, quick: bool) -> dict:
    """What a run of ``task`` on ``arch`` needs, the SFT model fitted, and the start."""
    torch.set_num_threads(1)
    prefopt.set_config(show_progress_bar=False)
    if task == "tiny_lm":
        world = TinyLMWorld(random_state=0, architecture=arch)
        ref = world.evaluate(world.reference_probs(), world.reward, 0.05)
        return {"world": world, "start": float(ref["reward"])}
    if task == "review":
        world = ReviewWorld(n_reviews=300 if quick else 1000, random_state=0)
        sft = SFTPolicy(
            model=world.model_config(arch),
            n_epochs=1 if quick else 3,
            learning_rate=3e-3,
            batch_size=32,
            random_state=0,
            on_unhealthy="ignore",
        ).fit(world.demonstrations)
        order = np.random.RandomState(0).permutation(len(world.prompts))
        cut = len(order) * 2 // 3
        spec = {
            "world": world,
            "sft": sft,
            "train": [world.prompts[i] for i in order[:cut]],
            "held": [world.prompts[i] for i in order[cut:]][: 16 if quick else None],
            "comparisons": world.comparisons(sft, 100 if quick else 1000, random_state=0),
        }
        spec["start"] = review_gold(spec, sft)
        return spec
    # The world's documented start (its docstring's table): 4,000 demonstrations, 5 epochs.
    world = ArithmeticWorld(n_demonstrations=200 if quick else 4000, random_state=0)
    sft = SFTPolicy(
        model=world.model_config(arch),
        n_epochs=1 if quick else 5,
        random_state=0,
        on_unhealthy="ignore",
    ).fit(world.demonstrations)
    n_eval = 20 if quick else 200
    spec = {
        "world": world,
        "sft": sft,
        "held": (world.eval_prompts[:n_eval], world.eval_answers[:n_eval]),
    }
    spec["start"] = arithmetic_gold(spec, sft)
    return spec


def build_tasks(quick: bool, archs, workers: int, only=None) -> dict:
    """Every (task, arch)'s spec (those in ``only`` if given); the SFT models are fitted
    in parallel, slowest first."""
    keys = [(t, a) for t in ("arithmetic", "review", "tiny_lm") for a in archs]
    keys = [k for k in keys if only is None or k in only]
    specs = Parallel(n_jobs=workers, backend="loky")(
        delayed(build_task)(t, a, quick) for t, a in keys
    )
    return dict(zip(keys, specs, strict=True))


def review_gold(spec, policy) -> float:
    """Mean gold (VADER) reward of 4 samples of each held-out prompt, a fixed seed."""
    n = 4
    held = spec["held"]
    completions = [c for row in policy.sample(held, n=n, random_state=EVAL_SEED) for c in row]
    repeated = [p for p in held for _ in range(n)]
    return float(spec["world"].gold_reward(repeated, completions).mean())


def arithmetic_gold(spec, policy) -> float:
    """Held-out pass@1 (Chen et al.'s estimator from 8 samples of each problem)."""
    world = spec["world"]
    scorer = make_pass_at_k_scorer(
        world.correctness_reward, k=1, n_samples=8, random_state=EVAL_SEED
    )
    return float(scorer(policy, *spec["held"]))


def cells(archs) -> list[tuple[str, str, str]]:
    """Every (policy, task, arch); DPO only on the review world."""
    out = []
    for name in POLICIES:
        for task in BUDGET:
            if name == "DPO" and task != "review":
                continue
            for arch in archs:
                out.append((name, task, arch))
    return out


# ----- one run ------------------------------------------------------------------------
def one_run(spec, name: str, task: str, arch: str, rate: float, seed: int, budget) -> dict:
    """Fit one policy at one rate and seed; its health, start and end gold, KL."""
    torch.set_num_threads(1)
    prefopt.set_config(show_progress_bar=False)
    began = time.perf_counter()
    cls = POLICIES[name]
    common = dict(learning_rate=rate, random_state=seed, on_unhealthy="stop")
    error = ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if name == "DPO":
                policy = cls(model=spec["sft"], batch_size=budget["batch_size"], **common)
                policy.fit(spec["comparisons"])
            elif task == "tiny_lm":
                policy = cls(model=spec["world"].policy_model(), **budget, **common)
                policy.fit(spec["world"].prompts, spec["world"].reward)
            elif task == "review":
                policy = cls(model=spec["sft"], **budget, **common)
                policy.fit(spec["train"], spec["world"].gold_reward)
            else:
                world = spec["world"]
                policy = cls(model=spec["sft"], **budget, **common)
                policy.fit(world.prompts, world.correctness_reward)
        except Exception as exc:  # noqa: BLE001 - a raising run counts as tripped
            error = f"{type(exc).__name__}: {exc}"[:200]
            policy = None
    row = {
        "policy": name,
        "task": task,
        "arch": arch,
        "rate": rate,
        "seed": seed,
        "tripped": "error" if error else "",
        "start": spec["start"],
        "end": np.nan,
        "objective_share": np.nan,
        "kl": np.nan,
        "steps": 0,
        "seconds": 0.0,
        "error": error,
    }
    if policy is not None:
        fired = [d for d, v in policy.health_["detectors"].items() if v["fired"]]
        row["tripped"] = ";".join(fired)
        row["steps"] = len(policy.history_)
        if task == "tiny_lm":
            world = spec["world"]
            metrics = world.evaluate(policy, world.reward, policy.beta_)
            row["end"] = float(metrics["reward"])
            row["kl"] = float(metrics["kl"])
            row["objective_share"] = float(
                world.objective_share(policy, world.reward, policy.beta_)
            )
        else:
            row["end"] = (review_gold if task == "review" else arithmetic_gold)(spec, policy)
            if name != "DPO":
                row["kl"] = float(np.mean([h["objective/kl"] for h in policy.history_[-3:]]))
    row["seconds"] = time.perf_counter() - began
    return row


def passes(row) -> bool:
    """The rule for one run: no detector tripped, gold above the start (and share > 0)."""
    if row["tripped"]:
        return False
    if not np.isfinite(row["end"]) or row["end"] <= row["start"]:
        return False
    return not (row["task"] == "tiny_lm" and not row["objective_share"] > 0)


# ----- the sweep ----------------------------------------------------------------------
def run_cell(spec, cell, grid, seeds, budget, done) -> list[dict]:
    """One cell down the grid: a rate's seeds in order, the rate abandoned at its first
    failing seed (the rate fails whatever the others do), the cell ended at the first rate
    whose every seed passes. ``done`` holds runs of an earlier invocation (``--resume``)."""
    name, task, arch = cell
    rows = []
    for rate in grid:
        ok = True
        for seed in seeds:
            key = (name, task, arch, float(rate), int(seed))
            row = done.get(key) or one_run(spec, name, task, arch, rate, seed, budget)
            rows.append(row)
            if not passes(row):
                ok = False
                break
        if ok:
            break
    return rows


def read_runs(csv: Path) -> pd.DataFrame:
    """A sweep's CSV as written: empty cells of the float columns are NaN, the rest as is."""
    table = pd.read_csv(csv, keep_default_na=False)
    for col in ("end", "objective_share", "kl"):
        table[col] = pd.to_numeric(table[col].replace("", np.nan))
    return table


def undecided_cells() -> list[tuple[str, str, str]]:
    """The cells rule 1's run (``lr_sweep.csv``) left without a passing rate."""
    cell = summary(read_runs(HERE / "lr_sweep.csv"), GRID, len(SEEDS))
    missing = cell[~np.isfinite(cell["passing rate"].to_numpy(float))]
    return [tuple(c) for c in missing[["policy", "task", "arch"]].itertuples(index=False)]


def sweep(args) -> pd.DataFrame:
    out = Path(tempfile.mkdtemp(prefix="lr_sweep_")) if args.quick else HERE
    csv = out / ("lr_sweep_rule2.csv" if args.rule == 2 else "lr_sweep.csv")
    archs = args.archs.split(",")
    policies = args.policies.split(",")
    budget = QUICK_BUDGET if args.quick else (BUDGET_2 if args.rule == 2 else BUDGET)
    seeds = SEEDS[:2] if args.quick else SEEDS
    grid = GRID[:2] if args.quick else GRID
    torch.set_num_threads(1)
    prefopt.set_config(show_progress_bar=False)
    began = time.perf_counter()
    if args.rule == 2:
        todo = [c for c in undecided_cells() if c[0] in policies and c[2] in archs]
        tasks = build_tasks(args.quick, archs, args.workers, only={(c[1], c[2]) for c in todo})
    else:
        todo = [c for c in cells(archs) if c[0] in policies]
        tasks = build_tasks(args.quick, archs, args.workers)
    print(f"tasks built in {time.perf_counter() - began:.0f} s", flush=True)
    for key, spec in tasks.items():
        print(f"  {key}: start {spec['start']:.4f}", flush=True)
    done = {}
    if args.resume and csv.exists():
        for row in pd.read_csv(csv, keep_default_na=False).to_dict("records"):
            for col in ("end", "objective_share", "kl"):
                row[col] = float(row[col]) if row[col] != "" else np.nan
            done[row["policy"], row["task"], row["arch"], float(row["rate"]), int(row["seed"])] = (
                row
            )
    # The slow cells first, so the last worker is not left alone with one.
    todo.sort(key=lambda c: (c[0] != "PPO", c[1] == "tiny_lm"))
    print(f"{len(todo)} cells, {len(seeds)} seeds, rates {grid}", flush=True)
    jobs = Parallel(n_jobs=args.workers, backend="loky", return_as="generator_unordered")(
        delayed(run_cell)(tasks[c[1], c[2]], c, grid, seeds, budget[c[1]], done) for c in todo
    )
    rows = []
    for i, cell_rows in enumerate(jobs, 1):
        rows += cell_rows
        pd.DataFrame(rows).to_csv(csv, index=False)
        last = cell_rows[-1]
        print(
            f"[{i}/{len(todo)}, {time.perf_counter() - began:.0f} s] {last['policy']} "
            f"{last['task']} {last['arch']}: {len(cell_rows)} runs, last rate {last['rate']:g} "
            f"({'pass' if passes(last) else 'fail'})",
            flush=True,
        )
    table = pd.DataFrame(rows)
    table.to_csv(csv, index=False)
    print(f"\nruns: {csv} ({time.perf_counter() - began:.0f} s)")
    if args.rule == 2:
        print(rule2_markdown(table))
    else:
        print(summary_markdown(table, grid, len(seeds)))
    return table


def summary(table: pd.DataFrame, grid, n_seeds: int) -> pd.DataFrame:
    """Per cell: the highest passing rate (NaN if none), then per policy the default."""
    table = table.copy()
    table["pass"] = table.apply(passes, axis=1)
    out = []
    for (name, task, arch), g in table.groupby(["policy", "task", "arch"], sort=False):
        best, notes = np.nan, []
        for rate in grid:
            at = g[np.isclose(g.rate.astype(float), rate)]
            if at.empty:
                continue
            tripped = int((at.tripped.astype(str) != "").sum())
            above = int((at["end"] > at["start"]).sum())
            notes.append(f"{rate:g}: {tripped} tripped, {above}/{len(at)} above")
            if len(at) == n_seeds and at["pass"].all():
                best = rate
                break
        out.append(
            {
                "policy": name,
                "task": task,
                "arch": arch,
                "passing rate": best,
                "runs": "; ".join(notes),
            }
        )
    return pd.DataFrame(out)


def summary_markdown(table: pd.DataFrame, grid, n_seeds: int) -> str:
    cell = summary(table, grid, n_seeds)
    lines = [
        "| policy | task | arch | highest passing rate | per rate tried |",
        "|---|---|---|---|---|",
    ]
    for r in cell.itertuples(index=False):
        rate = f"{r[3]:g}" if np.isfinite(r[3]) else "none (flagged)"
        lines.append(f"| {r[0]} | {r[1]} | {r[2]} | {rate} | {r[4]} |")
    lines += [
        "",
        "| policy | new tiny-model default | cells without a passing rate |",
        "|---|---|---|",
    ]
    for name, g in cell.groupby("policy", sort=False):
        rates = g["passing rate"].to_numpy(float)
        missing = g[~np.isfinite(rates)]
        default = min(grid) if len(missing) else float(np.nanmin(rates))
        flag = ", ".join(f"{t}/{a}" for t, a in zip(missing.task, missing.arch)) or "-"
        lines.append(f"| {name} | {default:g}{' (flagged)' if len(missing) else ''} | {flag} |")
    return "\n".join(lines)


def rule2_markdown(table2: pd.DataFrame) -> str:
    """Rule 2's tables: its re-run cells, then every cell's rate (rule 1's where it
    decided) and per policy the default: the minimum over the cells with a passing rate,
    the cells with none named (LR_SWEEP.md, rule 2)."""
    rerun = summary(table2, GRID, len(SEEDS))
    lines = ["| policy | task | arch | highest passing rate (rule 2) | per rate tried |"]
    lines.append("|---|---|---|---|---|")
    for r in rerun.itertuples(index=False):
        rate = f"{r[3]:g}" if np.isfinite(r[3]) else "none"
        lines.append(f"| {r[0]} | {r[1]} | {r[2]} | {rate} | {r[4]} |")
    first = summary(read_runs(HERE / "lr_sweep.csv"), GRID, len(SEEDS))
    first = first[np.isfinite(first["passing rate"].to_numpy(float))]
    cell = pd.concat([first, rerun], ignore_index=True)
    lines += ["", "| policy | new tiny-model default | cells without a passing rate |"]
    lines.append("|---|---|---|")
    for name, g in cell.groupby("policy", sort=False):
        rates = g["passing rate"].to_numpy(float)
        missing = g[~np.isfinite(rates)]
        flag = ", ".join(f"{t}/{a}" for t, a in zip(missing.task, missing.arch)) or "-"
        lines.append(f"| {name} | {np.nanmin(rates):g} | {flag} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="seconds; a temp folder only")
    parser.add_argument("--resume", action="store_true", help="keep the runs in the CSV")
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--summary", action="store_true", help="only print the CSV's table")
    parser.add_argument(
        "--rule",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: re-run the cells rule 1 left undecided at rule 2's budgets (LR_SWEEP.md)",
    )
    args = parser.parse_args(argv)
    if args.summary and args.rule == 2:
        print(rule2_markdown(read_runs(HERE / "lr_sweep_rule2.csv")))
        return None
    if args.summary:
        print(summary_markdown(read_runs(HERE / "lr_sweep.csv"), GRID, 5))
        return None
    return sweep(args)


if __name__ == "__main__":
    main()
