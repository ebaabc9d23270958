"""The environment of multi-turn episodes: its protocol, checked before training, and its calls.

An **environment** is any object with two methods (Gymnasium's names, text in
and out, as OpenEnv and OpenRLHF's executors take them)::

    reset(prompt) -> None or str        # starts an episode; text shown before turn 1
    step(completion) -> (observation, reward, done)   # after each policy turn

either of which may be ``async`` (the calls of one turn then run concurrently).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import threading

import numpy as np

from ...lm._health import Detector, smoothed
from ._tools import check_tools


def check_environment(environment, who: str):
    """A function making a fresh environment per episode; refused before training when unusable.

    Parameters
    ----------
    environment : class, callable or object
        A class (or a function) returning an object with ``reset`` and
        ``step``; or such an object, deep-copied for every episode.
    who : str
        The estimator, for messages.

    Returns
    -------
    make : callable or None
        ``make()`` is a fresh environment; ``None`` when ``environment`` is.

    Examples
    --------
    >>> class Echo:
    ...     def reset(self, prompt):
    ...         return None
    ...     def step(self, completion):
    ...         return None, float(len(completion)), True
    >>> make = check_environment(Echo, "GRPOPolicy")
    >>> make().step("abc")
    (None, 3.0, True)
    >>> check_environment(object(), "GRPOPolicy")
    Traceback (most recent call last):
    ...
    TypeError: GRPOPolicy: the environment object has no reset method...
    """
    if environment is None:
        return None
    if inspect.isclass(environment):
        _check_methods(environment, who)
        return environment
    if callable(getattr(environment, "reset", None)) or callable(
        getattr(environment, "step", None)
    ):
        _check_methods(environment, who)
        return lambda: copy.deepcopy(environment)
    if callable(environment):  # a factory: one call shows what it makes
        _check_methods(environment(), who)
        return environment
    _check_methods(environment, who)  # raises, naming the missing method


def _check_methods(env, who: str) -> None:
    name = env.__name__ if inspect.isclass(env) else type(env).__name__
    for method, signature in (("reset", "reset(prompt)"), ("step", "step(completion)")):
        if not callable(getattr(env, method, None)):
            raise TypeError(
                f"{who}: the environment {name} has no {method} method. An environment has "
                "reset(prompt) -> None or str and step(completion) -> (observation, reward, "
                f"done), either possibly async; add {signature}."
            )


def gather(values: list) -> list:
    """``values`` with every awaitable among them awaited, concurrently.

    The async environments' calls of one turn run together on one event loop
    (in a thread of their own when the caller already runs one, as a notebook does).

    Examples
    --------
    >>> async def twice(x):
    ...     return 2 * x
    >>> gather([1, twice(3)])
    [1, 6]
    """
    pending = [i for i, v in enumerate(values) if inspect.isawaitable(v)]
    if not pending:
        return values

    async def wait():
        return await asyncio.gather(*(values[i] for i in pending))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        done = asyncio.run(wait())
    else:  # a running loop (a notebook): a loop of our own in a thread
        box: dict = {}
        thread = threading.Thread(target=lambda: box.update(out=asyncio.run(wait())))
        thread.start()
        thread.join()
        done = box["out"]
    out = list(values)
    for i, value in zip(pending, done):
        out[i] = value
    return out


def checked_step(answer, name: str) -> tuple:
    """``(observation, reward, done)`` of an environment's step, refused unless well formed."""
    if not (isinstance(answer, tuple) and len(answer) == 3):
        raise TypeError(
            f"The environment {name}'s step returned {type(answer).__name__}; it returns a "
            "tuple (observation, reward, done): the text shown next (or None), a number and "
            "a bool."
        )
    observation, reward, done = answer
    if observation is not None and not isinstance(observation, str):
        raise TypeError(
            f"The environment {name}'s step returned an observation of type "
            f"{type(observation).__name__}; it must be text or None."
        )
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        reward = math.nan
    if not math.isfinite(reward):
        raise ValueError(
            f"The environment {name}'s step returned the reward {answer[1]!r}; a reward is a "
            "finite number."
        )
    return observation, reward, bool(done)


def environment_rewards_only(prompts, completions):
    """The reward of a fit whose environment pays every reward: 0 for every transcript.

    Examples
    --------
    >>> environment_rewards_only(["p", "q"], ["a", "b"]).tolist()
    [0.0, 0.0]
    """
    return np.zeros(len(completions))


def check_episode_inputs(policy, reward) -> None:
    """Refuse, before any work, an environment or tools the loop cannot use with this fit.

    Parameters
    ----------
    policy : BasePolicy
        The estimator being fitted (its ``environment`` and ``tools``).
    reward : callable
        The reward given to ``fit``.
    """
    who = type(policy).__name__
    environment, tools = policy.environment, policy.tools
    if environment is None and tools is None:
        return
    check_environment(environment, who)
    check_tools(tools, who)
    if callable(getattr(reward, "score_per_token", None)):
        raise ValueError(
            f"{who}: a reward paid per token (score_per_token) cannot score multi-turn "
            "episodes, whose transcripts hold the environment's tokens; give the environment "
            "the per-turn rewards (step returns them), or a reward of the whole transcript."
        )
    if policy.max_staleness is not None:
        raise ValueError(
            f"{who}: overlapped rollouts (max_staleness) sample single responses in a process "
            "of their own; they are not available with an environment or tools yet. Pass "
            "max_staleness=None."
        )
    if policy.refit_every is not None:
        raise ValueError(
            f"{who}: refit_every (online reward learning) pairs single responses; it is not "
            "available with an environment or tools. Pass refit_every=None."
        )


# Where the episodes' detectors fire, on the smoothed share of a step's episodes: no tool
# call at all (a policy that never uses its tools), failed tool calls (a broken tool or a
# policy that cannot call it), and episodes cut by the limits (an environment that never
# says done, or a turn limit too low for the task).
NO_TOOL_CALLS, TOOL_ERRORS, TRUNCATED_EPISODES = 0.99, 0.5, 0.9


def episode_detectors(view) -> list:
    """The run-health detectors of a fit with an environment or tools (none otherwise).

    - ``no_tool_calls`` (with tools): the smoothed share of episodes without a
      tool call (``tools/no_call_share``); fires above 0.99: the policy does not
      use its tools.
    - ``tool_errors`` (with tools): the smoothed share of calls that failed
      (``tools/error_share``); fires above 0.5.
    - ``truncated_episodes``: the smoothed share of episodes cut by the turn
      limit, the token budget or a turn without a stop token
      (``episode/truncated_share``); fires above 0.9.
    """
    if view.episodes is None:
        return []

    def share(key):
        return lambda rows: smoothed([r[key] for r in rows])

    out = [
        Detector(
            "truncated_episodes",
            TRUNCATED_EPISODES,
            share("episode/truncated_share"),
            advice="Episodes do not end: check that the environment's step returns "
            "done=True, raise max_turns or max_episode_tokens, or fine-tune the model to stop.",
        )
    ]
    if view.episodes["tools"]:
        out += [
            Detector(
                "no_tool_calls",
                NO_TOOL_CALLS,
                share("tools/no_call_share"),
                advice="The policy never calls its tools: start from a model fine-tuned on "
                "tool-use demonstrations (SFTPolicy), or check the call format it was taught.",
            ),
            Detector(
                "tool_errors",
                TOOL_ERRORS,
                share("tools/error_share"),
                advice="Most tool calls fail (their messages are in the transcripts): check "
                "the tools and the argument format the model was taught.",
            ),
        ]
    return out
