"""OpenEnvEnvironment: an OpenEnv environment, in-process or served, as a prefopt environment.

`OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ (the ``openenv-core``
package; the environments TRL's ``GRPOTrainer`` trains in) defines an
environment as a class with ``reset()`` and ``step(action)``, each returning an
``Observation`` (a pydantic model with ``reward`` and ``done``), run in-process
or served over HTTP and WebSocket, one session per client connection. prefopt's
environments take text and give text (``reset(prompt)`` and ``step(completion)
-> (observation, reward, done)``); this adapter maps one onto the other: a
completion becomes an ``Action``, an ``Observation`` becomes the text the
policy reads next, and its ``reward`` and ``done`` are the turn's. An optional
extra: ``pip install "prefopt[openenv]"``.
"""

from __future__ import annotations

import inspect
from numbers import Integral

from ._sessions import BOOKKEEPING, open_session, openenv_classes

__all__ = ["OpenEnvEnvironment"]

_URL_SCHEMES = ("http://", "https://", "ws://", "wss://")


class OpenEnvEnvironment:
    """An OpenEnv environment as a prefopt environment: completions in, observations out.

    Pass it as an estimator's ``environment``: every episode gets a copy of it,
    and each copy its own OpenEnv environment, in-process, or a session of a
    running server of its own. ``reset(prompt)`` resets that environment and
    shows its first observation; ``step(completion)`` makes the completion an
    action, steps, and returns the observation's text, its ``reward`` (``None``
    counts 0) and its ``done``. Both are ``async``, so the episodes of a turn
    wait on a server together.

    Parameters
    ----------
    env : str, class, callable or Environment
        Where the environment runs:

        - the URL of a running OpenEnv server (``"http://localhost:8000"``):
          one session each episode, through OpenEnv's ``GenericEnvClient``
          (observations are dicts); the server must allow as many concurrent
          sessions as a step has episodes (``create_app(...,
          max_concurrent_envs=...)``, with ``SUPPORTS_CONCURRENT_SESSIONS``);
        - a client class (an ``EnvClient`` subclass, such as the echo
          environment's ``EchoEnv``) with ``base_url``: one client each episode;
        - an ``Environment`` subclass, or a function returning an
          ``Environment`` or a client: one each episode, in this process;
        - an ``Environment`` instance: copied with the adapter, per episode.
    base_url : str, default=None
        The server of a client class ``env``.
    action : callable, default=None
        ``action(completion)`` is the action (an ``Action``, or a dict for a
        URL ``env``). ``None``: the action class's only text field holds the
        completion (the echo environment's ``message``); an action class with
        no such single field needs one.
    observation : callable, default=None
        ``observation(obs)`` is the text shown to the policy next, or ``None``
        (or ``""``) for nothing. ``None``: the observation's only text field
        (besides ``metadata``); one with none shows nothing, one with several
        needs one.
    reset_kwargs : callable, default=None
        ``reset_kwargs(prompt)`` is a dict of keyword arguments to the
        environment's ``reset`` (``seed``, ``episode_id``, or the environment's
        own), which is how the prompt reaches an environment that wants it;
        ``None``: ``reset()``.
    max_steps : int, default=None
        Steps after which an episode ends even when the environment does not
        say ``done`` (the echo environment never does); ``None``: only
        ``done`` ends one (and the estimator's ``max_turns`` cuts it).
    reset_observation : bool, default=True
        Whether the observation ``reset`` returns is shown before the first
        turn (a game's board, a task's statement); ``False`` starts from the
        prompt alone.

    See Also
    --------
    prefopt.worlds.ReasoningGymWorld : reasoning-gym's tasks with an environment.

    Notes
    -----
    An episode's session is closed when the environment says ``done``, and
    by ``close``, which the episode loop calls when it ends an episode for
    any other reason (the turn limit, the token budget). OpenEnv's ``reset``
    receives no prompt: the fit's prompt is the start of the transcript the
    policy sees, then the reset observation's text.

    References
    ----------
    Meta PyTorch, "OpenEnv: an interface library for RL post-training with
    environments", https://github.com/meta-pytorch/OpenEnv, 2025.

    Examples
    --------
    >>> import pytest
    >>> _ = pytest.importorskip("openenv")  # the optional extra
    >>> from openenv.core.env_server import Action, Environment, Observation, State
    >>> class Guess(Action):
    ...     word: str
    >>> class Reply(Observation):
    ...     hint: str = ""
    >>> class Secret(Environment[Guess, Reply, State]):
    ...     def reset(self, seed=None, episode_id=None, **kwargs):
    ...         return Reply(hint="guess the word")
    ...     def step(self, action, timeout_s=None, **kwargs):
    ...         right = action.word.strip() == "owl"
    ...         return Reply(hint="no", reward=float(right), done=right)
    ...     @property
    ...     def state(self):
    ...         return State()
    >>> import asyncio
    >>> env = OpenEnvEnvironment(Secret)
    >>> asyncio.run(env.reset("Which bird?"))
    'guess the word'
    >>> asyncio.run(env.step("cat")), asyncio.run(env.step("owl"))
    (('no', 0.0, False), (None, 1.0, True))

    In a fit, ``GRPOPolicy(model=..., environment=env, max_turns=3)``.
    """

    def __init__(self, env, *, base_url: str | None = None, action=None, observation=None,
                 reset_kwargs=None, max_steps: int | None = None,
                 reset_observation: bool = True):  # fmt: skip
        self.env = env
        self.base_url = base_url
        self.action = action
        self.observation = observation
        self.reset_kwargs = reset_kwargs
        self.max_steps = max_steps
        self.reset_observation = reset_observation
        self._check()
        self._session = None  # the episode's environment or client, from reset on
        self._steps = 0

    # ----- checks, at construction: a wrong environment is named before any fit ---------
    def _check(self) -> None:
        Environment, EnvClient, SyncEnvClient = openenv_classes()
        env, who = self.env, "OpenEnvEnvironment"
        if isinstance(env, (EnvClient, SyncEnvClient)):
            raise TypeError(
                f"{who}: env is a client instance, one server session, and every episode "
                "needs a session of its own: pass the client class with base_url= "
                f"(OpenEnvEnvironment({type(env).__name__}, base_url=...)) or the server's URL."
            )
        if isinstance(env, str):
            if not env.startswith(_URL_SCHEMES):
                raise ValueError(
                    f"{who}: env={env!r} is text but not a server URL; give the URL of a "
                    "running OpenEnv server, such as 'http://localhost:8000'."
                )
        elif inspect.isclass(env) and issubclass(env, EnvClient):
            if not isinstance(self.base_url, str):
                raise ValueError(
                    f"{who}: the client class {env.__name__} needs the server's URL: pass "
                    "base_url='http://...'."
                )
        elif not (isinstance(env, Environment) or callable(env)):
            raise TypeError(
                f"{who}: env is a {type(env).__name__}; it is the URL of an OpenEnv server, "
                "a client class (with base_url), an Environment subclass or instance, or a "
                "function returning an Environment or a client."
            )
        if self.base_url is not None and not (inspect.isclass(env) and issubclass(env, EnvClient)):
            raise ValueError(
                f"{who}: base_url is for a client class env (an EnvClient subclass); "
                "a URL env already names its server, and an Environment runs in this process."
            )
        for name in ("action", "observation", "reset_kwargs"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(
                    f"{who}: {name} must be a function or None; got {type(value).__name__}."
                )
        steps = self.max_steps
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, Integral) or steps < 1
        ):
            raise ValueError(f"{who}: max_steps must be an integer >= 1 or None; got {steps!r}.")
        if not isinstance(self.reset_observation, bool):
            raise TypeError(
                f"{who}: reset_observation must be a bool; got {self.reset_observation!r}."
            )

    # ----- the prefopt protocol ---------------------------------------------------------
    async def reset(self, prompt):
        """Start an episode on a fresh OpenEnv environment; the text of its first observation.

        Parameters
        ----------
        prompt : str or list of dict
            The episode's prompt (given to ``reset_kwargs``, when set).

        Returns
        -------
        text : str or None
        """
        await self.close()
        self._steps = 0
        kwargs = {} if self.reset_kwargs is None else dict(self.reset_kwargs(prompt))
        self._session = open_session(self)
        obs, _, _ = await self._session.reset(**kwargs)
        return self._text(obs) if self.reset_observation else None

    async def step(self, completion: str) -> tuple:
        """The completion as an action: ``(text, reward, done)`` of the observation it brings.

        Parameters
        ----------
        completion : str
            The policy's turn.

        Returns
        -------
        observation : str or None
            The observation's text; ``None`` when the episode is done.
        reward : float
            The observation's ``reward`` (``None`` counts 0).
        done : bool
            The observation's ``done``, or ``max_steps`` reached.
        """
        if self._session is None:
            raise RuntimeError(
                "OpenEnvEnvironment.step before reset: call reset(prompt) to start an episode."
            )
        action = await self._action(completion)
        obs, reward, done = await self._session.step(action)
        self._steps += 1
        done = bool(done) or (self.max_steps is not None and self._steps >= self.max_steps)
        text = None if done else self._text(obs)
        if done:
            await self.close()
        return text, 0.0 if reward is None else float(reward), done

    async def close(self) -> None:
        """Close the episode's environment or server session (nothing when none is open)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def __getstate__(self) -> dict:
        # A copy (one per episode) or a pickle holds the configuration, never a live session.
        state = dict(vars(self))
        state.update(_session=None, _steps=0)
        return state

    # ----- actions and observations -----------------------------------------------------
    async def _action(self, completion: str):
        if self.action is not None:
            return self.action(completion)
        if self._session.build is None:  # read once an episode: the action's text field
            self._session.build = await self._session.action_builder()
        return self._session.build(completion)

    def _text(self, obs):
        if self.observation is not None:
            text = self.observation(obs)
        else:
            text = default_text(obs)
        if text is not None and not isinstance(text, str):
            raise TypeError(
                f"OpenEnvEnvironment: observation returned {type(text).__name__}; it returns "
                "the text the policy reads next, or None."
            )
        return text or None  # an empty text shows nothing, as None does


def default_text(obs):
    """An observation's only text field (``None`` when it has no field of its own).

    Parameters
    ----------
    obs : Observation, dict, str or None
        An OpenEnv observation (a dict from a generic client).

    Returns
    -------
    text : str or None

    Examples
    --------
    >>> default_text({"echoed_message": "hi", "message_length": 2, "metadata": {}})
    'hi'
    >>> default_text({"metadata": {}}) is None
    True
    """
    if obs is None or isinstance(obs, str):
        return obs
    fields = _fields(obs)
    texts = [name for name, value in fields.items() if isinstance(value, str)]
    if not fields:
        return None
    if len(texts) == 1:
        return fields[texts[0]]
    raise TypeError(
        f"OpenEnvEnvironment: the observation {type(obs).__name__} has the fields "
        f"{sorted(fields)}, {len(texts)} of them text, so which one the policy reads is not "
        "clear; pass observation=lambda obs: ... returning its text (or None)."
    )


def _fields(obs) -> dict:
    if isinstance(obs, dict):
        items = obs.items()
    elif hasattr(type(obs), "model_fields"):
        items = ((name, getattr(obs, name)) for name in type(obs).model_fields)
    else:
        items = vars(obs).items()
    return {name: value for name, value in items if name not in BOOKKEEPING}
