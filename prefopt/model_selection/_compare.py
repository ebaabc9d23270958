"""Comparing algorithms over the same seeds: :func:`compare`.

Re-exported by :mod:`prefopt.model_selection`; see its docstring.
"""

from __future__ import annotations

import time
import warnings
from numbers import Real

import numpy as np
import pandas as pd
from sklearn.base import clone
from sklearn.metrics import check_scoring
from sklearn.utils.parallel import Parallel, delayed

from .._config import config_context, get_config
from ..data import check_prompts
from ._cells import member, run_healthy, tracked_group
from ._comparison import BUDGETS, Comparison, control_gains, correction_note, summarise
from ._controls import check_controls, control_name, control_reward
from ._environment import environment
from ._stats import _check_seeds, split_seeds
from ._tuning import check_tune, tune_algorithms

START = "start"  # the name of the starting policy's row


def _fit_and_score_seed(
    estimator, X, X_score, fit_params, seed_param, seed, scorer, keep, config, run=(None, "")
):
    # The caller's prefopt configuration travels with the task, so worker processes
    # (loky, Ray) use the same device and progress-bar settings as the caller; ``run``
    # is the (group, run name) the fit is tracked as under report_to.
    with config_context(**config), member(*run):
        estimator = clone(estimator).set_params(**{seed_param: seed})
        start = time.perf_counter()
        estimator.fit(X, **fit_params)
        fit_time = time.perf_counter() - start
        scores = scorer(estimator, X_score)
    scores = dict(scores) if isinstance(scores, dict) else {"score": scores}
    spent = getattr(estimator, "budget_", None) or {}
    run = {
        "healthy": run_healthy(estimator),
        "fit_time": fit_time,
        **{key: float(spent.get(key, np.nan)) for key in BUDGETS},
    }
    return {k: float(v) for k, v in scores.items()}, run, estimator if keep else None


def compare(
    estimators: dict,
    prompts,
    *,
    reward_model,
    seeds=5,
    scoring=None,
    baseline=None,
    n_jobs=None,
    confidence: float = 0.95,
    seed_param: str = "random_state",
    return_estimators: bool = False,
    tune=None,
    tuning_seeds=3,
    tuning_metric=None,
    eval_prompts=None,
    include_start=False,
    matched_budget=None,
    margin=None,
    positive_kl=(),
    controls=None,
) -> Comparison:
    """Fit several algorithms on the same seeds and prompts and compare them.

    Every estimator is cloned, given each seed as its ``random_state`` and
    fitted with ``fit(prompts, reward_model=reward_model)``, then scored on
    ``eval_prompts`` (``prompts`` when not given). Because every algorithm runs
    under the same seeds, the comparison with a baseline is paired by seed.

    Parameters
    ----------
    estimators : dict of str to estimator
        Names (used as ``algorithm``) and unfitted estimators.
    prompts : list of str or table with a ``prompt`` column, or comparisons
        Training prompts. With ``reward_model=None``, any data the estimators
        fit on, passed as given (comparisons for :class:`~prefopt.DPOPolicy`).
    reward_model : callable or None
        The reward every estimator is fitted against (``None``: fit with the
        data only).
    seeds : int or list of int, default=5
        The evaluation seeds; ``n`` means ``n`` seeds from 0 (skipping the
        tuning seeds given as a list).
    scoring : str, callable, list, tuple, dict or None, default=None
        As in :class:`SeedSearchCV`; ``None`` uses each estimator's ``score``.
    baseline : str, default=None
        Name of the algorithm every other one is compared with in ``summary``
        (``verdicts`` holds every pair).
    n_jobs : int, default=None
        (algorithm, seed) fits run in parallel through joblib.
    confidence : float, default=0.95
        Coverage of the intervals; ``1 - confidence`` is the tests' alpha.
    seed_param : str, default="random_state"
        The parameter the seed is set on.
    return_estimators : bool, default=False
        Keep the fitted estimators (``Comparison.estimators``).
    tune : dict of str to param_grid, default=None
        Tune these algorithms first, each on its own grid (as in
        :class:`SeedSearchCV`) over ``tuning_seeds``, scored on ``prompts``;
        the selected setting is then fitted and reported on the evaluation
        ``seeds``. The rule: a candidate with any unhealthy (``health_``) or
        failed tuning run ranks after every candidate without one, and the mean
        of ``tuning_metric`` over the tuning seeds orders each group. A grid
        naming a parameter the estimator does not take is an error.
    tuning_seeds : int or list of int, default=3
        Seeds of the tuning, disjoint from ``seeds`` (overlapping lists are an
        error); a count ``n`` takes the first ``n`` seeds not used for evaluation.
    tuning_metric : str, default=None
        With a dict or list ``scoring``, the metric the tuning ranks by (larger
        is better, as the scorer returns it); ``None`` takes the first.
    eval_prompts : list of str or table with a ``prompt`` column, default=None
        Held-out prompts to score the fitted policies on; ``None`` scores on
        the training ``prompts``.
    include_start : bool or str, default=False
        Add a row ``"start"``: the starting policy, fitted with ``n_steps=0``
        from the baseline's settings (or the first algorithm's; a name picks
        another) on every seed, scored as the others and compared in pairs.
    matched_budget : {"episodes", "tokens", "gradient_steps", "seconds"}, default=None
        The budget the algorithms are meant to share. ``None`` warns when their
        episodes or gradient steps differ; a name warns only when that budget
        differs.
    margin : float or dict of str to float, default=None
        Equivalence margin of the verdicts (per metric with a dict); ``None``:
        no ``"equivalent"`` verdict.
    positive_kl : str or sequence of str, default=()
        Metrics whose scorer returns the negated KL (``make_kl_scorer``,
        ``world.scorer("kl")``), reported as the positive KL; their verdicts
        call lower better.
    controls : "random", list or dict of str to "random" or callable, default=None
        Control runs beside the real reward (Shao et al. 2025): every algorithm
        is fitted again on the same seeds, with the same (tuned) settings and
        budget, against each control reward: ``"random"`` (a
        :class:`RandomReward` of 1 or 0 with probability 0.5, seeded by the
        run's seed) or a callable, such as :class:`FormatReward` (1 for a
        response in the expected format). Needs a ``scoring`` that does not
        depend on the reward a policy was fitted with (the real reward's
        scorer, a gold or exact-world scorer). ``Comparison.controls`` holds
        each algorithm's gain over each control.

    Returns
    -------
    comparison : Comparison
        ``results`` (tidy: algorithm, seed, metric, value), ``summary``,
        ``verdicts``, ``runs`` (health and budget per fit), ``budgets``,
        ``environment``, with ``tune`` the ``tuning`` table and
        ``tuned_params``, and with ``controls`` the ``controls`` table.

    Warns
    -----
    UserWarning
        When the algorithms' budgets differ (see ``matched_budget``).

    See Also
    --------
    SeedSearchCV, prefopt.plotting.plot_comparison

    Notes
    -----
    The verdict of a pair reads the ``confidence`` interval of the paired
    differences over seeds (:func:`verdict`): ``"better"`` when it lies at or
    above ``margin`` (above 0 without one), ``"worse"`` at or below
    ``-margin``, ``"equivalent"`` inside ``(-margin, margin)`` and
    ``"inconclusive"`` when it reaches two of these regions; ``verdict_holm``
    corrects the verdicts of one comparison for their number (Holm 1979;
    ``Comparison.correction`` states the family and the level).
    Every evaluation seed counts (intention to treat): a run that
    ``health_`` calls unhealthy keeps the score it ended with, is counted in
    ``n_unhealthy`` and stays in its pairs, so that a failure weighs against
    the algorithm that failed instead of leaving the comparison. A gain that
    is not larger than the gain of the same algorithm under a random or
    format-only control reward (``controls=``, ``verdict_holm`` "better" in
    ``Comparison.controls``) is not shown to come from the reward, however
    large it is. ``mdd`` is the minimum detectable
    difference of that test at 80% power (:func:`minimum_detectable_difference`),
    so an inconclusive verdict says how large a difference the seeds could
    have found. Ahmadian et al. (2024) compare PPO, RLOO, REINFORCE and RAFT
    this way on language models; Henderson et al. (2018) show why the seeds
    that select a setting must not also measure it.

    References
    ----------
    .. [1] Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
       Optimization for Learning from Human Feedback in LLMs", ACL 2024.
    .. [2] Henderson et al. 2018, "Deep Reinforcement Learning that Matters",
       AAAI 2018.
    .. [3] Holm 1979, "A simple sequentially rejective multiple test
       procedure", Scand. J. Statist. 6(2).
    .. [4] Shao et al. 2025, "Spurious Rewards: Rethinking Training Signals in
       RLVR", arXiv:2506.10947.

    Examples
    --------
    >>> import prefopt
    >>> from prefopt import RAFTPolicy, RewardModel, RLOOPolicy
    >>> from prefopt.model_selection import compare
    >>> from prefopt.worlds import PreferenceWorld
    >>> prefopt.set_config(show_progress_bar=False)
    >>> world = PreferenceWorld(random_state=0)
    >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
    >>> small = dict(beta=0.3, optimizer="sgd", n_steps=3, batch_size=16)
    >>> algorithms = {
    ...     "RLOO": RLOOPolicy(model=world.policy_model(), learning_rate=2.0, **small),
    ...     "RAFT": RAFTPolicy(model=world.policy_model(), learning_rate=0.3, **small)}
    >>> result = compare(algorithms, world.prompts, reward_model=rm, seeds=2, baseline="RLOO",
    ...                  scoring={"kl": world.scorer("kl")}, matched_budget="episodes")
    >>> result.results.shape  # 2 algorithms x 2 seeds x 1 metric
    (4, 4)
    >>> result.summary[["algorithm", "metric", "n_seeds"]].values.tolist()
    [['RLOO', 'kl', 2], ['RAFT', 'kl', 2]]
    >>> result.budgets[["algorithm", "episodes", "gradient_steps"]].values.tolist()
    [['RLOO', 48.0, 6.0], ['RAFT', 48.0, 12.0]]

    Tuning RLOO's learning rate on seeds 2 and 3, then evaluating on 0 and 1:

    >>> result = compare(algorithms, world.prompts, reward_model=rm, seeds=2,
    ...                  tune={"RLOO": {"learning_rate": [0.5, 2.0]}}, tuning_seeds=2,
    ...                  scoring=world.scorer("objective"), matched_budget="episodes")
    >>> result.tuning_seeds, result.seeds
    ([2, 3], [0, 1])
    >>> result.tuned_params
    {'RLOO': {'learning_rate': 2.0}}
    """
    if not isinstance(estimators, dict) or not estimators:
        raise TypeError("estimators must be a non-empty dict of name -> estimator.")
    if baseline is not None and baseline not in estimators and baseline != START:
        raise ValueError(f"baseline {baseline!r} is not one of the estimators {list(estimators)}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence!r}.")
    if matched_budget is not None and matched_budget not in BUDGETS:
        raise ValueError(f"matched_budget={matched_budget!r}; use one of {list(BUDGETS)} or None.")
    if baseline == START and not include_start:
        raise ValueError(f"baseline={START!r} needs include_start=True.")
    positive_kl = [positive_kl] if isinstance(positive_kl, str) else list(positive_kl)
    controls = check_controls(controls)
    if controls and (reward_model is None or scoring is None):
        raise ValueError(
            "controls= fits every algorithm against a control reward, so it needs the real "
            "reward_model and a scoring= that does not read the reward a policy was fitted "
            "with (each estimator's own score would score a control run by its random "
            "reward): pass e.g. scoring=make_reward_scorer(reward_model) or a gold scorer."
        )
    named = _metric_names(scoring)
    unknown = [m for m in positive_kl if named is not None and m not in named]
    if unknown:
        raise ValueError(f"positive_kl names {unknown}, which are not metrics of {named}.")
    if tune is not None:
        check_tune(tune, estimators, seed_param)
        seeds, tuning_seeds = split_seeds(seeds, tuning_seeds)
    else:
        seeds, tuning_seeds = _check_seeds(seeds), None
    # With no reward the data pass as given (comparisons, for DPOPolicy); prompts are checked.
    if reward_model is not None:  # prompts are checked; a table keeps its reward columns
        check_prompts(prompts)
        if eval_prompts is not None:
            check_prompts(eval_prompts)
    X_score = prompts if eval_prompts is None else eval_prompts
    fit_params = {} if reward_model is None else {"reward_model": reward_model}
    for name, est in estimators.items():
        if seed_param not in est.get_params():
            raise ValueError(
                f"{name}: {type(est).__name__} has no parameter {seed_param!r} to "
                "set the seed on; name it with seed_param=."
            )
    estimators = dict(estimators)
    tuning = tuned = None
    if tune is not None:
        tuned, tuning = tune_algorithms(
            estimators,
            tune,
            prompts,
            fit_params,
            seeds=tuning_seeds,
            scoring=scoring,
            metric=_tuning_metric(scoring, tuning_metric),
            confidence=confidence,
            n_jobs=n_jobs,
            seed_param=seed_param,
        )
        for name, params in tuned.items():
            estimators[name] = clone(estimators[name]).set_params(**params)
    if include_start:
        estimators = _with_start(estimators, include_start, baseline)
    compared = list(estimators)
    arms = {
        control_name(name, control): (name, control)
        for name in compared
        if name != START
        for control in controls
    }
    for row, (name, _) in arms.items():
        estimators[row] = estimators[name]
    scorers = {name: check_scoring(est, scoring) for name, est in estimators.items()}
    jobs = [(name, seed) for name in estimators for seed in seeds]

    def params_of(name, seed):  # a control run fits against its control reward
        if name not in arms:
            return fit_params
        return {"reward_model": control_reward(controls[arms[name][1]], seed)}

    with tracked_group("compare") as group:  # report_to: one run per algorithm and seed
        out = Parallel(n_jobs=n_jobs)(
            delayed(_fit_and_score_seed)(
                estimators[name],
                prompts,
                X_score,
                params_of(name, seed),
                seed_param,
                seed,
                scorers[name],
                return_estimators,
                get_config(),
                (group, f"{name}-seed={seed}"),
            )
            for name, seed in jobs
        )
    flip = dict.fromkeys(positive_kl, -1.0)
    rows = [
        {"algorithm": name, "seed": seed, "metric": metric, "value": flip.get(metric, 1.0) * value}
        for (name, seed), (scores, _, _) in zip(jobs, out)
        for metric, value in scores.items()
    ]
    results = pd.DataFrame(rows, columns=["algorithm", "seed", "metric", "value"])
    metrics = list(dict.fromkeys(results["metric"]))
    runs = pd.DataFrame(
        [{"algorithm": name, "seed": seed, **run} for (name, seed), (_, run, _) in zip(jobs, out)]
    )
    if START in estimators:
        runs["healthy"] = runs["healthy"].astype(object)  # True, False, or None: not a run
        runs.loc[runs["algorithm"] == START, "healthy"] = None
    budgets = runs.groupby("algorithm", sort=False)[list(BUDGETS)].mean().reset_index()
    _check_budgets(budgets[budgets["algorithm"] != START], matched_budget)
    kept = None
    if return_estimators:
        kept = {
            name: [est for (n, _), (_, _, est) in zip(jobs, out) if n == name]
            for name in estimators
        }
    summary, verdicts = summarise(
        results,
        list(estimators),
        seeds,
        baseline,
        confidence,
        runs,
        _margins(margin, metrics),
        set(positive_kl),
        compared=compared,
    )
    gains = None
    if arms:
        gains = control_gains(
            results, compared, arms, confidence, _margins(margin, metrics), set(positive_kl)
        )
    floors = _floors(scoring, X_score)
    if floors:
        summary["empty_floor"] = summary["metric"].map(floors)
    return Comparison(
        results=results,
        summary=summary,
        seeds=seeds,
        confidence=confidence,
        baseline=baseline,
        fit_times=runs[["algorithm", "seed", "fit_time"]],
        estimators=kept,
        runs=runs,
        budgets=budgets,
        verdicts=verdicts,
        tuning=tuning,
        tuned_params=tuned,
        tuning_seeds=tuning_seeds,
        controls=gains,
        environment=environment(),
        correction=correction_note(verdicts, confidence),
    )


def _metric_names(scoring) -> list | None:
    """The metrics of ``scoring``: dict keys, list items or ``["score"]`` (None: unknown)."""
    if isinstance(scoring, (dict, list, tuple)):
        return list(scoring)
    return ["score"] if scoring is None or isinstance(scoring, str) else None


def _tuning_metric(scoring, metric):
    """The metric the tuning ranks by: ``metric``, or the first of a dict or list ``scoring``."""
    if not isinstance(scoring, (dict, list, tuple)):
        return "score"
    names = list(scoring)
    if metric is None:
        return names[0]
    if metric not in names:
        raise ValueError(
            f"tuning_metric={metric!r} is not a metric of scoring; use one of {names}."
        )
    return metric


def _with_start(estimators: dict, include_start, baseline) -> dict:
    """The estimators with the starting policy first, as ``"start"`` (``n_steps=0``)."""
    if START in estimators:
        raise ValueError(f"include_start adds a row {START!r}; rename the algorithm {START!r}.")
    source = include_start if isinstance(include_start, str) else baseline
    if source is None or source == START:
        source = next(iter(estimators))
    if source not in estimators:
        raise ValueError(
            f"include_start={include_start!r} names no algorithm of {list(estimators)}."
        )
    if "n_steps" not in estimators[source].get_params():
        raise ValueError(
            f"include_start: {type(estimators[source]).__name__} has no n_steps to set to 0; "
            "name a policy with include_start='<name>'."
        )
    return {START: clone(estimators[source]).set_params(n_steps=0), **estimators}


def _check_budgets(budgets: pd.DataFrame, matched: str | None) -> None:
    """Warn when the algorithms spend different budgets (those that are not declared)."""
    checked = ["episodes", "gradient_steps"] if matched is None else [matched]
    for key in checked:
        values = budgets[key].to_numpy(dtype=np.float64)
        if len(values) < 2 or np.isnan(values).any() or np.allclose(values, values[0], rtol=0.01):
            continue
        spent = ", ".join(f"{n}: {v:g}" for n, v in zip(budgets["algorithm"], values))
        hint = (
            f"declare the budget the comparison matches with matched_budget= (one of "
            f"{list(BUDGETS)}), or set the algorithms' n_steps, batch_size, n_epochs and "
            "n_minibatches to match it"
            if matched is None
            else f"matched_budget={matched!r} is declared but not matched"
        )
        warnings.warn(
            f"compare: the algorithms' {key.replace('_', ' ')} differ ({spent}, mean over "
            f"seeds); a difference in scores may be a difference in budget: {hint}.",
            UserWarning,
            stacklevel=3,
        )


def _margins(margin, metrics: list) -> dict:
    """The equivalence margin of each metric (``None``: no equivalence verdict)."""
    if isinstance(margin, dict):
        unknown = [m for m in margin if m not in metrics]
        if unknown:
            raise ValueError(f"margin names {unknown}, which are not metrics of {metrics}.")
        values = {m: margin.get(m) for m in metrics}
    else:
        values = {m: margin for m in metrics}
    for m, value in values.items():
        ok = value is None or (
            isinstance(value, Real) and not isinstance(value, bool) and value > 0
        )
        if not ok:
            raise ValueError(f"margin for {m!r} must be a number > 0 or None; got {value!r}.")
    return values


def _floors(scoring, X) -> dict:
    """The empty answer's win rate for each win-rate metric of ``scoring``."""
    named = scoring if isinstance(scoring, dict) else {"score": scoring}
    return {
        name: scorer.floor(X)
        for name, scorer in named.items()
        if callable(getattr(scorer, "floor", None))
    }
