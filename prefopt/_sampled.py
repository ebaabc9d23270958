"""Drawing completions from a policy for the scorers: the common base of prefopt's scorers."""

from __future__ import annotations

from numbers import Integral

from .data import check_prompts


def _check_n_samples(n_samples) -> int:
    if not isinstance(n_samples, Integral) or isinstance(n_samples, bool) or n_samples < 1:
        raise ValueError(f"n_samples must be an integer >= 1; got {n_samples!r}.")
    return int(n_samples)


def _sample_groups(estimator, prompts: list[str], n_samples: int, random_state) -> list:
    """``n_samples`` completions for each prompt, one list per prompt."""
    if hasattr(estimator, "sample"):
        groups = estimator.sample(prompts, n=n_samples, random_state=random_state)
    elif hasattr(estimator, "predict"):
        # A Pipeline has no sample(): one completion per prompt from predict, which a
        # prefopt policy draws with its own random_state.
        groups = [[c] for c in estimator.predict(prompts)]
    else:
        raise TypeError(
            f"{type(estimator).__name__} has neither sample() nor predict(); a "
            "sampled scorer needs a fitted policy."
        )
    if len(groups) != len(prompts):
        raise ValueError(
            f"{type(estimator).__name__}.sample returned {len(groups)} groups "
            f"for {len(prompts)} prompts."
        )
    return groups


def _draw(estimator, prompts: list[str], n_samples: int, random_state):
    """``n_samples`` completions per prompt: (repeated prompts, completions), flat."""
    groups = _sample_groups(estimator, prompts, n_samples, random_state)
    rep = [p for p, group in zip(prompts, groups) for _ in group]
    completions = [c for group in groups for c in group]
    return rep, completions


class _SampledScorer:
    """Base of the scorers: draws the completions, subclasses say what to average."""

    _name = "score"

    def __init__(self, n_samples: int, random_state):
        self.n_samples = _check_n_samples(n_samples)
        self.random_state = random_state

    def __call__(self, estimator, X, y=None) -> float:
        prompts, completions = _draw(estimator, check_prompts(X), self.n_samples, self.random_state)
        return float(self._value(estimator, prompts, completions))

    def _value(self, estimator, prompts, completions):  # pragma: no cover - abstract
        raise NotImplementedError

    def _args(self) -> str:
        return f"n_samples={self.n_samples}, random_state={self.random_state!r}"

    def __repr__(self) -> str:
        return f"{self._name}({self._args()})"
