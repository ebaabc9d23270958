"""ReasoningGymWorld: reasoning-gym's procedural tasks as prompts, a reward and an environment.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ (Stojanovski et
al. 2025) generates verifiable problems procedurally (arithmetic, logic,
puzzles...), with nothing to download; each of its datasets scores an answer
itself (``score_answer``). This world wraps one of them for prefopt: its
questions are the prompts, its scoring is the reward, and an ``environment``
that gives the policy ``retries`` more turns after a wrong answer is the
multi-turn form. An optional extra: ``pip install "prefopt[reasoning-gym]"``.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np

__all__ = ["ReasoningGymWorld"]

_INSTALL = 'pip install "prefopt[reasoning-gym]" (or pip install reasoning-gym)'


def _reasoning_gym():
    """The ``reasoning_gym`` module, or an error naming the pip command."""
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError(
            f"ReasoningGymWorld needs the reasoning-gym package, an optional extra: {_INSTALL}."
        ) from None
    return reasoning_gym


class ReasoningGymWorld:
    """One of reasoning-gym's procedural datasets as prompts, a reward and an environment.

    Parameters
    ----------
    name : str, default="basic_arithmetic"
        The dataset (``reasoning_gym.create_dataset``'s name).
    size : int, default=500
        Problems generated.
    retries : int, default=1
        Turns the :attr:`environment` gives after a wrong answer (its message
        says so); 0 makes one answer the episode.
    random_state : int, default=0
        The dataset's seed.
    **config
        The dataset's own settings (``min_terms=2``, ...).

    Attributes
    ----------
    prompts, answers : list of str
        The questions and their reference answers.
    environment : class
        An environment (``reset``/``step``) for the estimators' ``environment``:
        1 for a right answer, at the turn it is given, and the episode ends.

    References
    ----------
    Z. Stojanovski et al., "REASONING GYM: Reasoning environments for
    reinforcement learning with verifiable rewards", arXiv:2505.24760, 2025.

    Examples
    --------
    >>> import pytest
    >>> _ = pytest.importorskip("reasoning_gym")  # the optional extra
    >>> world = ReasoningGymWorld(size=4, random_state=0)
    >>> world.correctness_reward(world.prompts[:2], [world.answers[0], "no"])
    array([1., 0.])
    >>> env = world.environment()
    >>> env.reset(world.prompts[1])
    >>> env.step("no")[1:], env.step(world.answers[1])
    ((0.0, False), (None, 1.0, True))
    """

    def __init__(self, name: str = "basic_arithmetic", *, size: int = 500, retries: int = 1,
                 random_state: int = 0, **config):  # fmt: skip
        for label, value, low in (("size", size, 1), ("retries", retries, 0)):
            if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
                raise ValueError(f"{label} must be an integer >= {low}; got {value!r}.")
        gym = _reasoning_gym()
        self.name, self.size, self.retries = name, size, retries
        self.random_state, self.config = random_state, dict(config)
        self.dataset = gym.create_dataset(name, size=size, seed=random_state, **config)
        self.entries = {entry["question"]: entry for entry in self.dataset}
        self.prompts = list(self.entries)
        self.answers = [str(self.entries[p]["answer"]) for p in self.prompts]
        self.environment = self._environment_class()

    def score(self, prompt: str, completion: str) -> float:
        """reasoning-gym's own score of ``completion`` as the answer to ``prompt`` (0 to 1).

        Parameters
        ----------
        prompt : str
            One of :attr:`prompts`.
        completion : str

        Returns
        -------
        score : float
        """
        entry = self.entries.get(prompt)
        if entry is None:
            raise ValueError(f"The prompt {prompt[:60]!r} is not one of this world's problems.")
        return float(self.dataset.score_answer(completion.strip(), entry))

    def correctness_reward(self, prompts, completions, **kwargs) -> np.ndarray:
        """The dataset's score of each completion, a plain reward for ``fit``.

        Parameters
        ----------
        prompts, completions : list of str
        **kwargs
            Dataset columns, ignored.

        Returns
        -------
        rewards : ndarray of shape (n,)
        """
        return np.array([self.score(p, c) for p, c in zip(prompts, completions)])

    def _environment_class(self):
        world = self

        class ReasoningGymEnvironment:
            """A problem of the world: a right answer pays 1 and ends; a wrong one may retry."""

            def reset(self, prompt):
                world.score(prompt, "")  # an unknown prompt is named here
                self.prompt, self.tries = prompt, 0

            def step(self, completion):
                self.tries += 1
                reward = world.score(self.prompt, completion)
                if reward >= 1.0 or self.tries > world.retries:
                    return None, reward, True
                return "Incorrect, try again.", 0.0, False

        ReasoningGymEnvironment.__qualname__ = f"ReasoningGymWorld({self.name!r}).environment"
        return ReasoningGymEnvironment
