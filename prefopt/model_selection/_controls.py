"""Control runs: the same algorithm, tuning and budget against a reward that carries no signal.

Re-exported by :mod:`prefopt.model_selection`; :func:`compare` runs them with
``controls=``. Shao et al. (2025, arXiv:2506.10947) raised Qwen2.5-Math-7B's MATH-500
accuracy by 21.4 points with a *random* reward and by 13.8 with a reward for the answer
format alone (the correct reward gave 29.1): a gain that a control run also shows says
more about the starting model and the optimiser (there, GRPO's clipping pushing the
policy towards the code reasoning it already preferred) than about the reward.
"""

from __future__ import annotations

import re

import numpy as np
from sklearn.utils import check_random_state


class RandomReward:
    """A reward of 1 with probability ``p`` and 0 otherwise, whatever the response.

    The random-reward control of Shao et al. (2025): its expected policy gradient is
    zero, so a gain under it comes from the optimiser or the start, not the reward.

    Parameters
    ----------
    p : float, default=0.5
        The chance of a reward of 1 (Shao et al. use 0.5).
    random_state : int, RandomState instance or None, default=None
        :func:`compare` gives each control run its own seed.

    References
    ----------
    .. [1] Shao et al. 2025, "Spurious Rewards: Rethinking Training Signals in
       RLVR", arXiv:2506.10947.

    Examples
    --------
    >>> from prefopt.model_selection import RandomReward
    >>> RandomReward(random_state=1)(["2+2="] * 6, ["4", "5", "4", "x", "4", "4"]).tolist()
    [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    """

    def __init__(self, p: float = 0.5, random_state=None):
        if not 0 <= p <= 1:
            raise ValueError(f"p must be a probability in [0, 1]; got {p!r}.")
        self.p = p
        self.random_state = random_state
        self._rng = check_random_state(random_state)

    def __call__(self, prompts, completions) -> np.ndarray:
        return (self._rng.random_sample(len(completions)) < self.p).astype(np.float64)

    def __repr__(self) -> str:
        return f"RandomReward(p={self.p!r}, random_state={self.random_state!r})"


class FormatReward:
    """A reward of 1 for a response in the expected format, 0 otherwise: the format control.

    Parameters
    ----------
    pattern : str
        A regular expression the response must contain (``re.search``), e.g.
        ``r"\\\\boxed\\{.+\\}"`` for a boxed answer, or ``r"^\\d+$"`` for a bare
        number; the content of the answer does not matter.

    References
    ----------
    .. [1] Shao et al. 2025, "Spurious Rewards: Rethinking Training Signals in
       RLVR", arXiv:2506.10947.

    Examples
    --------
    >>> from prefopt.model_selection import FormatReward
    >>> FormatReward(r"^\\d+$")(["2+2="] * 3, ["4", "5", "four"]).tolist()
    [1.0, 1.0, 0.0]
    """

    def __init__(self, pattern: str):
        try:
            self._regex = re.compile(pattern)
        except (re.error, TypeError) as error:
            raise ValueError(
                f"pattern must be a regular expression; got {pattern!r}: {error}"
            ) from error
        self.pattern = pattern

    def __call__(self, prompts, completions) -> np.ndarray:
        return np.array([float(bool(self._regex.search(c))) for c in completions])

    def __repr__(self) -> str:
        return f"FormatReward({self.pattern!r})"


def check_controls(controls) -> dict:
    """``controls`` as ``{name: "random" or a reward callable}`` (an error names the fix)."""
    if controls is None:
        return {}
    if isinstance(controls, str):
        controls = [controls]
    if isinstance(controls, (list, tuple)):
        unknown = [c for c in controls if c != "random"]
        if unknown:
            raise ValueError(
                f"controls={controls!r}: only 'random' is built in; give a format control as "
                "a dict, e.g. controls={'random': 'random', 'format': FormatReward(r'^\\d+$')}."
            )
        controls = {c: c for c in controls}
    if not isinstance(controls, dict) or not controls:
        raise TypeError(
            f"controls must be 'random', a list of names or a dict of name -> reward; got "
            f"{controls!r}."
        )
    for name, reward in controls.items():
        if reward != "random" and not callable(reward):
            raise TypeError(
                f"controls[{name!r}] must be 'random' or a reward callable "
                f"reward(prompts, completions); got {reward!r}."
            )
    return dict(controls)


def control_reward(reward, seed: int):
    """The reward of one control run: a fresh :class:`RandomReward` seeded by the run's seed."""
    return RandomReward(random_state=seed) if reward == "random" else reward


def control_name(algorithm: str, control: str) -> str:
    """The row of ``algorithm``'s control run in the comparison's tables."""
    return f"{algorithm} [{control} control]"
