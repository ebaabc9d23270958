"""Issue 35's acceptance at the defaults: every RL policy, 5 seeds, on ArithmeticWorld (GPT-2
and Llama shapes) and the review world, against the fixed defaults before issue 35.

The acceptance (issue 35): "ArithmeticWorld (both shapes) and the review world at defaults:
5 seeds each, no health warning, held-out score above the start on every seed, and the gain
over today's defaults reported per world". The worlds, their SFT starts, budgets and
held-out scores are those of ``benchmarks/lr_sweep.py`` (rule 2's budgets, which rule 3 of
``LR_SWEEP.md`` uses): ``arithmetic`` is :class:`prefopt.worlds.ArithmeticWorld` (world seed
0, 4,000 demonstrations, SFT 5 epochs), 300 steps of 64 episodes on the correctness reward,
scored by held-out pass@1 (8 samples of each of 200 held-out problems); ``review`` is
:class:`prefopt.worlds.ReviewWorld` (1,000 reviews, SFT 3 epochs), 30 steps of 64 episodes on
the gold (VADER) reward of 2/3 of the prompts, scored by the gold of 4 samples of each
held-out prompt. Each policy (PPO, RLOO, GRPO, REINFORCE, REINFORCE++, RAFT) runs on the
sweep's seeds 1000-1004 in two arms: ``default`` (``learning_rate=None``: the adaptive rate)
and ``old`` (the fixed tiny-model default before issue 35, ``lr_sweep_rule3.OLD_DEFAULT``,
at the batch of 64 episodes every policy had then, and RAFT ranked by the score alone,
``OLD_PARAMS``); the default arm takes each policy's own
default batch (256 for GRPO and RLOO since issue 35, point 5; 64 for the others), the steps
of the budget;
``--arms default,old,annealed`` adds the default's controller with ``anneal=True`` (the
rate decayed linearly to 0 over the fit, as the fixed rates are; every world here is a tiny
model, so the controller starts at the class's ``tiny_model_learning_rate``).
Everything else is the policy's default, ``on_unhealthy`` included ("warn"): every
:class:`~prefopt.exceptions.RunHealthWarning` is counted.

A (world, policy) holds when its default arm ran every seed with no health warning and ended
above the start on every seed; its gain over the old default is the mean over the seeds of
(default's end - old's end).

Each fit is one task of a pool of ``--jobs`` processes, one torch thread each (the SFT starts
are built first, one process per world); each row is appended to ``--out`` (JSON lines) as
it finishes, so a run cut short keeps what finished and ``--resume`` skips it.

Measured cost (seed 1000 of every world, ``--jobs 1``, a shared 2-core machine at load ~8):
54 s building the four starts one after the other; CPU seconds a fit: arithmetic PPO 37-48,
RAFT 18-25, RLOO, GRPO, REINFORCE and REINFORCE++ 8-16; review 3-10; in all 291 s for the
default arm's 24 fits, 260 s for the old arm's, 242 s for the annealed arm's. Five seeds of
two arms are about 2,760 CPU seconds: about 4 minutes with ``--jobs 14`` (5.5 with the
annealed arm), the longest fit under a minute.

Run::

    python benchmarks/defaults_5seeds.py --jobs 14 --out /tmp/defaults_5seeds.jsonl
    python benchmarks/defaults_5seeds.py --summary --out /tmp/defaults_5seeds.jsonl
    python benchmarks/defaults_5seeds.py --seeds 1 --jobs 1    # one seed of every world
    python benchmarks/defaults_5seeds.py --quick               # seconds, a temp folder
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # lr_sweep.py beside this script, however it is loaded
    sys.path.append(str(HERE))

import lr_sweep as sweep  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from joblib import Parallel, delayed  # noqa: E402
from lr_sweep_rule3 import OLD_DEFAULT  # noqa: E402

import prefopt  # noqa: E402
from prefopt.exceptions import RunHealthWarning  # noqa: E402
from prefopt.learning_rate import policy_default  # noqa: E402

WORLDS = ("arithmetic/gpt2", "arithmetic/llama", "review/gpt2", "review/llama")
# The slowest first (measured one seed per world: PPO, then RAFT), so that no worker is
# left alone with a long fit at the end.
POLICIES = ("PPO", "RAFT", "RLOO", "GRPO", "REINFORCE", "REINFORCE++")
ARMS = ("default", "old", "annealed")  # the last only when asked (--arms)
# The old arm's other defaults that issue 35 changed: RAFT ranked by the score alone before
# its default became the KL-shaped reward (RAFTPolicy's Notes).
OLD_PARAMS = {"RAFT": {"rank_by": "score"}}


def build(world: str, quick: bool) -> dict:
    """A world's SFT start, training prompts, held-out set and start score."""
    task, arch = world.split("/")
    spec = sweep.build_task(task, arch, quick)
    spec.pop("comparisons", None)  # DPO's; not sent to every fit
    return spec


def fit_one(
    spec: dict, world: str, name: str, arm: str, seed: int, budget: dict, quick: bool = False
) -> dict:
    """One policy at one arm and seed: its health warnings, held-out end score and time.

    The ``old`` arm runs the budget's batch (64 episodes, every policy's default before
    issue 35); the others each policy's own default batch, unless ``quick``.
    """
    torch.set_num_threads(1)
    prefopt.set_config(show_progress_bar=False)
    task, arch = world.split("/")
    rate = {"default": None, "old": OLD_DEFAULT[name]}.get(arm)
    if arm == "annealed":  # the default's controller, decayed linearly to 0 over the fit
        rate = policy_default(sweep.POLICIES[name].tiny_model_learning_rate)
        rate.set_params(anneal=True)
    if arm != "old" and not quick:  # the defaults' own batch (GRPO and RLOO: 256)
        budget = {key: v for key, v in budget.items() if key != "batch_size"}
    if arm == "old":
        budget = {**budget, **OLD_PARAMS.get(name, {})}
    row = {"world": world, "policy": name, "arm": arm, "seed": seed, "start": spec["start"]}
    row.update(learning_rate=rate if isinstance(rate, float) else arm, **budget)
    wall, cpu = time.perf_counter(), time.process_time()
    error, policy, caught = "", None, []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RunHealthWarning)
            policy = sweep.POLICIES[name](
                model=spec["sft"], learning_rate=rate, random_state=seed, **budget
            )
            if task == "review":
                policy.fit(spec["train"], spec["world"].gold_reward)
            else:
                policy.fit(spec["world"].prompts, spec["world"].correctness_reward)
    except Exception as exc:  # noqa: BLE001 - a raising fit is a failed row, not a crash
        error, policy = f"{type(exc).__name__}: {exc}"[:300], None
    health = [str(w.message)[:200] for w in caught if issubclass(w.category, RunHealthWarning)]
    row.update(health_warnings=len(health), warnings_text=" | ".join(health), error=error)
    if policy is not None:
        score = sweep.review_gold if task == "review" else sweep.arithmetic_gold
        last = policy.history_[-1]
        row.update(
            batch_size=policy.batch_size,
            end=score(spec, policy),
            fired=";".join(d for d, v in policy.health_["detectors"].items() if v["fired"]),
            steps=len(policy.history_),
            final_learning_rate=last.get("optim/learning_rate", last["charts/learning_rate"]),
        )
    else:
        row.update(end=float("nan"), fired="error", steps=0, final_learning_rate=float("nan"))
    row.update(seconds=time.perf_counter() - wall, cpu_seconds=time.process_time() - cpu)
    return row


def read_rows(path: Path) -> pd.DataFrame:
    """The JSON lines of ``path`` as a table (empty when there is none)."""
    if not path.exists():
        return pd.DataFrame()
    return pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line])


def summary(rows: pd.DataFrame, n_seeds: int = 5) -> pd.DataFrame:
    """Per world and policy: the default arm's verdict and its gain over the old default.

    ``holds``: the default arm ran ``n_seeds`` seeds, none with a health warning, a fired
    detector or an error, each ending above the start. ``gain over old``: the mean over the
    seeds both arms ran of (default's end - old's end). With an ``annealed`` arm, its mean end,
    warned runs, seeds above the start and gain over the old default too.
    """
    out = []
    annealed = "arm" in rows and (rows.arm == "annealed").any()
    for (world, name), g in rows.groupby(["world", "policy"], sort=False):
        ada = g[g.arm == "default"].set_index("seed")
        old = g[g.arm == "old"].set_index("seed")
        both = sorted(set(ada.index) & set(old.index))
        bad = (ada.health_warnings > 0) | (ada.fired != "") | (ada.error != "")
        above = int((ada["end"] > ada["start"]).sum())
        entry = {}
        if annealed:
            ann = g[g.arm == "annealed"].set_index("seed")
            paired = sorted(set(ann.index) & set(old.index))
            entry = {
                "annealed end": float(ann["end"].mean()) if len(ann) else np.nan,
                "annealed above": int((ann["end"] > ann["start"]).sum()),
                "annealed warned": int(((ann.health_warnings > 0) | (ann.fired != "")).sum()),
                "annealed gain over old": (
                    float((ann.loc[paired, "end"] - old.loc[paired, "end"]).mean())
                    if paired
                    else np.nan
                ),
            }
        out.append(
            {
                "world": world,
                "policy": name,
                "seeds": len(ada),
                "start": float(g.start.iloc[0]),
                "default end": float(ada["end"].mean()),
                "min gain": float((ada["end"] - ada["start"]).min()),
                "above start": above,
                "warned runs": int(bad.sum()),
                "old end": float(old["end"].mean()) if len(old) else np.nan,
                "old warned": int(((old.health_warnings > 0) | (old.fired != "")).sum()),
                "gain over old": (
                    float((ada.loc[both, "end"] - old.loc[both, "end"]).mean()) if both else np.nan
                ),
                "paired seeds": len(both),
                "fit s (mean)": float(ada.cpu_seconds.mean()),
                "holds": bool(len(ada) >= n_seeds and not bad.any() and above == len(ada)),
                **entry,
            }
        )
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame) -> str:
    """The summary as a Markdown table, one line per world's mean gain after it."""
    cols = list(table.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in table.itertuples(index=False):
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in r]
        lines.append("| " + " | ".join(cells) + " |")
    for world, g in table.groupby("world", sort=False):
        lines.append(
            f"\n{world}: gain over the old defaults, mean over policies "
            f"{g['gain over old'].mean():+.3f}; {int(g.holds.sum())}/{len(g)} policies hold"
            + (
                f"; annealed: gain over the old defaults {g['annealed gain over old'].mean():+.3f}"
                if "annealed gain over old" in g
                else ""
            )
        )
    return "\n".join(lines)


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="processes, one thread each")
    parser.add_argument("--out", type=Path, default=HERE / "defaults_5seeds.jsonl")
    parser.add_argument("--worlds", default=",".join(WORLDS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--arms", default="default,old")
    parser.add_argument("--seeds", type=int, default=5, help="the first N of 1000-1004")
    parser.add_argument("--resume", action="store_true", help="skip the fits in --out")
    parser.add_argument("--summary", action="store_true", help="only print --out's table")
    parser.add_argument("--quick", action="store_true", help="seconds; a temp folder only")
    args = parser.parse_args(argv)
    worlds, names = args.worlds.split(","), args.policies.split(",")
    arms = args.arms.split(",")
    for given, known in ((worlds, WORLDS), (names, POLICIES), (arms, ARMS)):
        if set(given) - set(known):
            parser.error(f"unknown {sorted(set(given) - set(known))}; choose among {known}")
    if not 1 <= args.seeds <= len(sweep.SEEDS):
        parser.error(f"--seeds must be 1-{len(sweep.SEEDS)}; got {args.seeds}")
    out = Path(tempfile.mkdtemp(prefix="defaults5_")) / "rows.jsonl" if args.quick else args.out
    if args.summary:
        table = summary(read_rows(out), args.seeds)
        print(markdown(table))
        return table
    budget = sweep.QUICK_BUDGET if args.quick else sweep.BUDGET_2
    seeds = sweep.SEEDS[: args.seeds]
    done = read_rows(out) if args.resume else pd.DataFrame()
    have = set() if done.empty else set(zip(done.world, done.policy, done.arm, done.seed))
    # Arithmetic first (300 steps against review's 30), each world's slowest policy first.
    todo = [
        (w, n, a, s)
        for w in sorted(worlds, key=lambda w: not w.startswith("arithmetic"))
        for n in names
        for s in seeds
        for a in arms
        if (w, n, a, s) not in have
    ]
    if not args.resume:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("")
    began = time.perf_counter()
    specs = Parallel(n_jobs=min(args.jobs, len(worlds)), backend="loky")(
        delayed(build)(w, args.quick) for w in worlds
    )
    specs = dict(zip(worlds, specs, strict=True))
    print(f"starts built in {time.perf_counter() - began:.0f} s:", flush=True)
    for w, spec in specs.items():
        print(f"  {w}: start {spec['start']:.4f}", flush=True)
    print(f"{len(todo)} fits on {args.jobs} processes; rows to {out}", flush=True)
    # In task order ("generator"): joblib's unordered generator needs joblib 1.4, above the
    # oldest joblib prefopt supports (1.3.2).
    results = Parallel(n_jobs=args.jobs, backend="loky", return_as="generator")(
        delayed(fit_one)(specs[w], w, n, a, s, budget[w.split("/")[0]], args.quick)
        for w, n, a, s in todo
    )
    for i, row in enumerate(results, 1):
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(
            f"[{i}/{len(todo)}, {time.perf_counter() - began:.0f} s] {row['world']} "
            f"{row['policy']} {row['arm']} seed {row['seed']}: {row['start']:.3f} -> "
            f"{row['end']:.3f}, {row['health_warnings']} health warnings "
            f"{row['fired'] or ''}{row['error']} ({row['cpu_seconds']:.0f} s CPU)",
            flush=True,
        )
    table = summary(read_rows(out), len(seeds))
    print(markdown(table))
    print(f"total {time.perf_counter() - began:.0f} s", flush=True)
    return table


if __name__ == "__main__":
    main()
