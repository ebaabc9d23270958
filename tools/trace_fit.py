"""Trace a 2-step ``RLOOPolicy`` fit: which prefopt files it runs and how often it crosses them.

Usage::

    python tools/trace_fit.py             # prefopt as imported (run from the repository root)
    python tools/trace_fit.py --edges     # also the 20 busiest file-to-file edges
    python tools/trace_fit.py --steps 3   # another number of steps

The fit runs on :class:`~prefopt.worlds.TinyLMWorld` (a tiny GPT-2, its exact reward)
under :func:`sys.setprofile`. A *cross-file call* is a Python call whose caller and
callee are both functions in prefopt's files and sit in two different files; calls
into torch, transformers or numpy and back are not counted, nor are calls inside one
file. The script prints, for the whole fit (setup and steps) and for each step alone
(the calls between two of ``fit``'s per-step callbacks; the first step's window
includes the fit's setup), the number of prefopt files that ran, the packages they
sit in, the distinct file-to-file edges and the cross-file calls. A newcomer
following one step reads about as many files as the step crosses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter


def _package_root() -> str:
    import prefopt

    return os.path.dirname(os.path.abspath(prefopt.__file__)) + os.sep


class Tracer:
    """Counts prefopt files run and cross-file calls, in windows the caller opens."""

    def __init__(self, root: str):
        self.root = root
        self.files: set = set()
        self.edges: Counter = Counter()

    def reset(self) -> None:
        self.files, self.edges = set(), Counter()

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        callee = frame.f_code.co_filename
        if not callee.startswith(self.root):
            return
        self.files.add(callee)
        caller = frame.f_back
        if caller is None:
            return
        source = caller.f_code.co_filename
        if source != callee and source.startswith(self.root):
            self.edges[(source, callee)] += 1

    def summary(self) -> dict:
        rel = [os.path.relpath(f, os.path.dirname(self.root.rstrip(os.sep))) for f in self.files]
        packages = {os.path.dirname(f) for f in rel}
        return {
            "files": len(self.files),
            "packages": len(packages),
            "edges": len(self.edges),
            "calls": sum(self.edges.values()),
        }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="steps of the fit (2)")
    parser.add_argument("--edges", action="store_true", help="print the busiest edges")
    args = parser.parse_args(argv)

    import prefopt
    from prefopt import RLOOPolicy
    from prefopt.worlds import TinyLMWorld

    prefopt.set_config(show_progress_bar=False)
    world = TinyLMWorld(random_state=0)
    policy = RLOOPolicy(
        model=world.policy_model(), k=2, batch_size=8, n_steps=args.steps, random_state=0
    )
    root = _package_root()
    whole, step = Tracer(root), Tracer(root)
    per_step = []

    def tracer(frame, event, arg):
        whole(frame, event, arg)
        step(frame, event, arg)

    def callback(estimator, row):
        sys.setprofile(None)
        per_step.append(step.summary())
        if args.edges and len(per_step) == args.steps:
            _print_edges(step, root)
        step.reset()
        sys.setprofile(tracer)

    sys.setprofile(tracer)
    try:
        policy.fit(world.prompts, world.reward, callback=callback)
    finally:
        sys.setprofile(None)
    total = whole.summary()
    print(f"prefopt: {prefopt.__file__}")
    print(
        f"{args.steps}-step RLOOPolicy fit (setup and steps): {total['files']} files in "
        f"{total['packages']} packages, {total['edges']} file-to-file edges, "
        f"{total['calls']} cross-file calls"
    )
    for i, s in enumerate(per_step, 1):
        note = " (with the fit's setup)" if i == 1 else ""
        print(
            f"step {i}{note}: {s['files']} files in {s['packages']} packages, "
            f"{s['edges']} edges, {s['calls']} cross-file calls"
        )
    return 0


def _print_edges(tracer: Tracer, root: str) -> None:
    base = os.path.dirname(root.rstrip(os.sep))
    print("busiest edges of the last step:")
    for (a, b), n in tracer.edges.most_common(20):
        print(f"  {n:5d}  {os.path.relpath(a, base)} -> {os.path.relpath(b, base)}")


if __name__ == "__main__":
    sys.exit(main())
