"""What the verifiable-reward claims (19-21) share since issue 36, point 6.

The first runs of claims 19-21 (two-digit sums answered bare, 80-120 steps) could not
decide them: GRPO did not move pass@1, the answers were 2-3 characters long, the clip
bound on 0.4% of tokens and the start's pass@128 was 0.99. The reruns change the regime
and, before any verdict, check on the tuning seeds that the regime was reached:

- **the world**: ``ArithmeticWorld(scratchpad=True, n_eval=300, random_state=0)``, sums
  whose demonstrations show their column work before the answer (``"47+68="`` then
  ``"7+8=15,4+6+1=11,115"``: 8-20 tokens with EOS, 17.3 on average), rewarded on the
  answer after the last step only, so that a response has room to grow or shrink;
- **the start**: :data:`SFT` on its 4,000 demonstrations, every setting named. Measured
  before the rule (100 held-out problems, 128 samples at temperature 0.7, this
  machine's torch): pass@1 0.119, pass@8 0.591, pass@128 0.98;
- **the rate**: :func:`rlvr_rate`, one :class:`prefopt.AdaptiveLR` with stated settings
  for every arm of every claim (no tuned rate per arm, and no library default);
- **every GRPO setting** named in :data:`GRPO_SETTINGS`, a claim changing only what it
  studies;
- **the gate** (:func:`gate`): on the tuning seeds (100 and 101, never evaluation
  seeds) the claim's own GRPO configuration, against the real reward, must raise
  held-out pass@1 by at least :data:`GATE_GAIN` on every tuning seed with no health
  detector fired. A claim adds its own conditions. A claim whose gate fails is not
  decided: its verdict is "inconclusive" and its reason says which condition failed,
  with the numbers;
- **the controls** (Shao et al. 2025, arXiv:2506.10947): the same configuration, rate
  and budget against a random reward (:class:`prefopt.model_selection.RandomReward`, 1
  or 0 with probability 0.5) and against the world's format reward (1 for an integer
  after a step, right or wrong), on the first evaluation seeds; their pass@1 gains are
  reported beside the real reward's.

Every fit of a run (gate, evaluation and control fits) goes through one joblib pool of
``--jobs`` processes (:func:`run_fits`), so that a 16-core machine runs a claim in
minutes; the seeds and the settings, not the number of processes, decide the numbers.
"""

from __future__ import annotations

import numpy as np

# ----- the world and its start ------------------------------------------------------------
N_EVAL = 300  # held-out problems (issue 36: 300 problems x 128 samples for pass@k)
SCRATCHPAD_FULL = dict(n_demonstrations=4000, sft_epochs=4)
SCRATCHPAD_QUICK = dict(n_demonstrations=200, sft_epochs=1)
TEMPERATURE = 0.7  # the tiny configs' sampling temperature, named
SFT = dict(
    learning_rate=1e-3,
    batch_size=32,
    lr_schedule="cosine",
    temperature=TEMPERATURE,
    max_new_tokens=None,  # the longest demonstration + EOS: 20
    max_length=None,
    max_prompt_length=None,
    micro_batch_size=None,
    pad_token="distinct",
    stop_token_ids=None,
    lora=None,
    gradient_checkpointing=False,
    checkpoint_dir=None,
    checkpoint_every=100,
    on_unhealthy="warn",
    verbose=0,
    warm_start=False,
    random_state=0,
)
SAMPLE_SEED = 1234  # every held-out sample of every claim
GATE_GAIN = 0.10  # held-out pass@1, trained - start, on every tuning seed (issue 36)
TUNING_SEEDS = (100, 101)

_CACHE: dict = {}


def scratchpad_sft(n_demonstrations: int = 4000, sft_epochs: int = 4):
    """The scratchpad world (seed 0, 300 held out) and its SFT start, built once a process.

    Returns
    -------
    world : ArithmeticWorld
    sft : SFTPolicy
    """
    key = (n_demonstrations, sft_epochs)
    if key not in _CACHE:
        from prefopt import SFTPolicy
        from prefopt.worlds import ArithmeticWorld

        world = ArithmeticWorld(
            n_digits=2,
            operations="+",
            n_eval=N_EVAL,
            n_demonstrations=n_demonstrations,
            scratchpad=True,
            random_state=0,
        )
        sft = SFTPolicy(model=world.model_config(), n_epochs=sft_epochs, **SFT)
        _CACHE[key] = (world, sft.fit(world.demonstrations))
    return _CACHE[key]


def rlvr_rate():
    """The one learning rate of every RLVR arm: an :class:`~prefopt.AdaptiveLR`, stated.

    It starts at 3e-5 (a fixed 3e-5 kept GRPO healthy on this world over 300 steps of 32
    in a probe before the rule, where 1e-4 to 1e-3 with beta 0 collapsed within 100
    steps) and adapts after every update to keep the policy's change near 0.002 nats a
    token, within [1e-6, 3e-4] (3e-4 is PPO's tiny-model rate, the highest any policy
    kept healthy in ``benchmarks/LR_SWEEP.md``; a probe with the 0.01 target reached it
    and collapsed). One rate for both arms of claims 19 and 20 isolates what they vary.
    """
    from prefopt import AdaptiveLR

    # anneal=False: the behaviour of the rules as committed, named since the option exists.
    return AdaptiveLR(
        learning_rate=3e-5, target=0.002, factor=1.5, min_lr=1e-6, max_lr=3e-4, anneal=False
    )


# Every GRPOPolicy hyperparameter, named (issue 36, point 5: no library default decides a
# number). A claim overrides only what it studies, and n_steps/batch_size from its budget.
GRPO_SETTINGS = dict(
    k=8,
    beta=0.04,
    kl=None,
    kl_estimator="k1",
    log_kl=True,
    scale_rewards="group",
    loss_type="dapo",
    clip_coef=0.2,
    epsilon_high=None,
    importance_sampling_level="token",
    mask_truncated=False,
    overlong_cache=None,
    dynamic_sampling=False,
    max_resamples=4,
    optimizer="adam",
    lr_schedule="constant",  # AdaptiveLR sets the rate; no schedule applies
    max_grad_norm=None,
    n_epochs=1,
    n_minibatches=1,
    micro_batch_size=None,  # the whole minibatch in one pass
    max_staleness=None,  # synchronous rollouts
    off_policy_cap=2.0,  # inert while synchronous
    environment=None,  # single-turn: the response is scored as sampled
    tools=None,
    max_turns=4,  # inert without an environment or tools
    tool_timeout=10.0,
    max_episode_tokens=None,
    temperature=TEMPERATURE,
    max_new_tokens=20,  # the longest worked answer + EOS
    # A response cut at max_new_tokens scores what the correctness reward gives it, 0
    # unless its last step is the answer: a -1 on top pushed every response shorter in a
    # probe (pass@1 0.04 -> 0: the EOS penalty was the only signal left).
    missing_eos_reward=None,
    stop_token_ids=None,
    entropy_coef=0.0,
    ptx_coef=0.0,
    refit_every=None,
    reward_weights=None,
    max_kl=None,
    max_kl_action="warn",
    min_eos_share=0.5,
    on_unhealthy="ignore",  # health_ still records every detector; runs are kept
    truncate_prompts=False,
    lora=None,
    gradient_checkpointing=False,
    vllm_importance_sampling_cap=None,
    checkpoint_dir=None,
    checkpoint_every=10,
    verbose=0,
    warm_start=False,
)


def grpo(sft, **given):
    """A :class:`~prefopt.GRPOPolicy` from ``sft`` with :data:`GRPO_SETTINGS`, the shared
    rate and ``given`` on top."""
    from prefopt import GRPOPolicy

    settings = {**GRPO_SETTINGS, "learning_rate": rlvr_rate(), **given}
    return GRPOPolicy(model=sft, **settings)


# ----- measuring ----------------------------------------------------------------------------
def correct_counts(policy, world, prompts, n: int) -> np.ndarray:
    """How many of ``n`` samples of each prompt are right (sampling seed 1234)."""
    groups = policy.sample(prompts, n=n, random_state=SAMPLE_SEED)
    rep = [p for p, g in zip(prompts, groups) for _ in g]
    right = world.correctness_reward(rep, [c for g in groups for c in g])
    return right.reshape(len(prompts), n).sum(1).astype(int)


def pass_curve(counts: np.ndarray, n: int, ks) -> dict:
    """Chen et al.'s unbiased pass@k, averaged over prompts, for each of ``ks``."""
    from prefopt.metrics import pass_at_k

    return {int(k): float(pass_at_k(n, counts, k).mean()) for k in ks}


def health(policy) -> tuple[bool, str]:
    """Whether no detector of ``health_`` fired, and the ``+``-joined names of those that did."""
    detectors = policy.health_.get("detectors", {})
    fired = "+".join(name for name, d in detectors.items() if d.get("fired"))
    return bool(policy.health_["healthy"]), fired


# ----- the fits -----------------------------------------------------------------------------
def control_rewards(world) -> dict:
    """The control rewards by name: ``"random"`` (seeded per run) and the world's format.

    Examples
    --------
    >>> from prefopt.worlds import ArithmeticWorld
    >>> world = ArithmeticWorld(scratchpad=True, n_eval=300, random_state=0)
    >>> control_rewards(world)["format"](["47+68="] * 2, ["7+8=15,4+6+1=11,116", "116"])
    array([1., 0.])
    """
    return {"random": "random", "format": world.format_reward}


def _fit_one(task: dict, prompts, measure) -> dict:
    """Fit one task's estimator at its seed against its reward and measure it (a worker)."""
    from sklearn.base import clone

    from prefopt.model_selection import RandomReward

    def resolve(reward):
        if isinstance(reward, str) and reward == "random":
            return RandomReward(p=0.5, random_state=task["seed"])
        return reward

    reward = task["reward"]
    reward = [resolve(r) for r in reward] if isinstance(reward, list) else resolve(reward)
    policy = clone(task["estimator"]).set_params(random_state=task["seed"])
    policy.fit(prompts, reward_model=reward)
    healthy, fired = health(policy)
    row = {k: v for k, v in task.items() if k not in ("estimator", "reward")}
    return {**row, "healthy": healthy, "fired": fired, **measure(policy)}


def run_fits(tasks: list[dict], prompts, measure, jobs: int, deadline=None) -> list[dict]:
    """Every task's fit and measurement, ``jobs`` at a time, rows in task order.

    A task is a dict with ``estimator``, ``reward`` (a callable, ``"random"``, or a
    list of these), ``seed`` and any labels (``phase``, ``arm``, ``reward_name``),
    which its row keeps; ``measure(policy) -> dict`` adds the measurements. The
    gate's tuning fits start first, then the controls, then the evaluation fits (a
    stable order within each), so that a run cut short by ``deadline`` loses the
    evaluation seeds last of all but the gate and the controls' gains. ``deadline`` (a
    ``time.perf_counter()`` value, or None) stops waiting then: a task not finished
    by it gets a row with ``finished=False`` and its labels only, and its worker is
    stopped, so that a run on a machine lent for a fixed time still writes what it
    has (the scripts then call the claim undecided, or the gate failed, and say so).
    ``jobs=1`` fits in this process, one task after another.
    """
    import concurrent.futures as cf
    import time

    def labels(task):
        return {k: v for k, v in task.items() if k not in ("estimator", "reward")}

    rank = {"tuning": 0, "control": 1}
    order = sorted(range(len(tasks)), key=lambda i: rank.get(tasks[i].get("phase"), 2))
    if jobs == 1:
        rows = [None] * len(tasks)
        for i in order:
            late = deadline is not None and time.perf_counter() > deadline
            rows[i] = (
                {**labels(tasks[i]), "finished": False}
                if late
                else {**_fit_one(tasks[i], prompts, measure), "finished": True}
            )
        return rows
    from joblib.externals.loky import get_reusable_executor

    executor = get_reusable_executor(max_workers=jobs)
    submitted = {i: executor.submit(_fit_one, tasks[i], prompts, measure) for i in order}
    futures = [submitted[i] for i in range(len(tasks))]
    timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
    done, pending = cf.wait(futures, timeout=timeout)
    rows = [
        {**future.result(), "finished": True}
        if future in done
        else {**labels(task), "finished": False}
        for task, future in zip(tasks, futures)
    ]
    if pending:
        for future in pending:
            future.cancel()
        executor.shutdown(wait=False, kill_workers=True)
    return rows


def gate(rows, start_pass1: float, extra: dict | None = None) -> tuple[bool, str]:
    """The regime check on the tuning rows: ``(passed, reason)``.

    Passes when every tuning run is healthy and raised held-out pass@1 by at least
    :data:`GATE_GAIN` over ``start_pass1``, and every condition of ``extra`` (name ->
    (held, measured text)) held.

    Examples
    --------
    >>> rows = [{"seed": 100, "pass1": 0.31, "healthy": True, "fired": ""},
    ...         {"seed": 101, "pass1": 0.25, "healthy": False, "fired": "kl_blowup"}]
    >>> gate(rows, 0.12)[0]
    False
    >>> text = gate(rows, 0.12)[1]
    >>> text.startswith("gate failed on tuning seeds [100, 101]")
    True
    >>> "flag: no (gains 0.190, 0.130; unhealthy: 101 (kl_blowup))" in text
    True
    """
    late = [r for r in rows if not r.get("finished", True)]
    rows = [r for r in rows if r.get("finished", True)]
    gains = [r["pass1"] - start_pass1 for r in rows]
    names = [f"{r['arm']} {r['seed']}" if r.get("arm") else str(r["seed"]) for r in rows]
    sick = [f"{n} ({r['fired']})" for n, r in zip(names, rows) if not r["healthy"]]
    moved = bool(rows) and min(gains) >= GATE_GAIN and not sick and not late
    conditions = {
        f"pass@1 gain >= {GATE_GAIN} on every tuning seed with no health flag": (
            moved,
            "gains "
            + ", ".join(
                f"{n}: {g:.3f}" if r.get("arm") else f"{g:.3f}"
                for n, g, r in zip(names, gains, rows)
            )
            + (f"; unhealthy: {', '.join(sick)}" if sick else "; none unhealthy")
            + (f"; {len(late)} tuning run(s) did not finish in time" if late else ""),
        ),
        **(extra or {}),
    }
    passed = all(held for held, _ in conditions.values())
    seeds = sorted({r["seed"] for r in rows + late})
    text = "; ".join(
        f"{name}: {'yes' if held else 'no'} ({measured})"
        for name, (held, measured) in conditions.items()
    )
    return passed, f"gate {'passed' if passed else 'failed'} on tuning seeds {seeds}: {text}"


def control_summary(ev_rows, control_rows, start_pass1: float, arm_label: str) -> str:
    """The real reward's pass@1 gain beside each control's, 95% t-intervals over seeds."""
    from _common import fmt, mean_ci

    parts = []
    real = [r["pass1"] - start_pass1 for r in ev_rows]
    parts.append(
        f"{arm_label} pass@1 gain, real reward {fmt(*mean_ci(real))} ({_seeds(len(real))})"
    )
    for name in sorted({r["reward_name"] for r in control_rows}):
        gains = [r["pass1"] - start_pass1 for r in control_rows if r["reward_name"] == name]
        parts.append(f"{name} control {fmt(*mean_ci(gains))} ({_seeds(len(gains))})")
    return "; ".join(parts)


def _seeds(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


PHASES = ("tuning", "evaluation", "control")
NO_STAT = dict(mean=np.nan, low=np.nan, high=np.nan, verdict="inconclusive", margin=np.nan)
NO_STAT.update(mdd=np.nan, n=0)  # an interval that could not be computed (too few runs)


def finished_by_phase(rows) -> dict:
    """The finished rows of each phase (``tuning``, ``evaluation``, ``control``)."""
    return {p: [r for r in rows if r["phase"] == p and r["finished"]] for p in PHASES}


def late_note(rows) -> str:
    """``""``, or which fits did not finish by the deadline (left out of every interval).

    Examples
    --------
    >>> note = late_note([{"phase": "evaluation", "seed": 3, "finished": False},
    ...                   {"phase": "tuning", "seed": 100, "finished": True}])
    >>> note.split(" and ")[0], note.endswith("(evaluation 3); the claim is undecided.")
    (' 1 of 2 fits did not finish by the deadline', True)
    """
    late = [r for r in rows if not r["finished"]]
    if not late:
        return ""
    names = ", ".join(
        " ".join(str(r[k]) for k in ("phase", "arm", "reward_name", "seed") if r.get(k) is not None)
        for r in late
    )
    return (
        f" {len(late)} of {len(rows)} fits did not finish by the deadline and are left out "
        f"({names}); the claim is undecided."
    )


def deadline_of(args):
    """The ``time.perf_counter()`` value of ``--deadline`` seconds after the start, or None."""
    return None if not args.deadline else args.began + args.deadline
