"""How an episode reaches an OpenEnv environment: in this process, or a server session.

A session is one episode's environment: :class:`_Local` awaits an ``Environment``'s
``reset_async``/``step_async``, :class:`_Remote` calls a server through OpenEnv's sync
client, in a thread of its own. Both answer ``(observation, reward, done)`` and build the
default action (the action class's one text field) once an episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import typing
from concurrent.futures import ThreadPoolExecutor

_INSTALL = 'pip install "prefopt[openenv]" (or pip install openenv-core)'
# What every OpenEnv Action and Observation carries besides its own content.
BOOKKEEPING = frozenset({"metadata", "done", "reward"})


def openenv_classes():
    """OpenEnv's ``Environment``, ``EnvClient`` and ``SyncEnvClient``, or an error naming pip."""
    try:
        from openenv.core.env_client import EnvClient
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.sync_client import SyncEnvClient
    except ImportError:
        raise ImportError(
            f"OpenEnvEnvironment needs the openenv-core package, an optional extra: {_INSTALL}."
        ) from None
    return Environment, EnvClient, SyncEnvClient


def _text_field(fields: dict, required: set, what: str):
    """The one text field of an action, which every other field lets be left out."""
    texts = [name for name, is_text in fields.items() if is_text and name not in BOOKKEEPING]
    others = sorted(required - set(texts[:1]) - BOOKKEEPING)
    if len(texts) == 1 and not others:
        return texts[0]
    raise TypeError(
        f"OpenEnvEnvironment: the action {what} has the fields "
        f"{sorted(set(fields) - BOOKKEEPING)}, not a single text field that is the only "
        "required one, so how a completion becomes an action is not clear; pass "
        "action=lambda completion: ... returning the action."
    )


def _action_class(cls, base):
    """The ``Action`` class of an ``Environment`` or ``EnvClient`` subclass, or ``None``."""
    for klass in inspect.getmro(cls):
        for parent in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(parent)
            if inspect.isclass(origin) and issubclass(origin, base):
                args = typing.get_args(parent)
                if args and inspect.isclass(args[0]) and hasattr(args[0], "model_fields"):
                    return args[0]
    try:  # the annotation of step's action
        hint = typing.get_type_hints(cls.step).get("action")
    except Exception:  # unresolvable annotations: no class to read
        hint = None
    return hint if inspect.isclass(hint) and hasattr(hint, "model_fields") else None


def _class_field(action_cls, what: str):
    fields = {name: info.annotation is str for name, info in action_cls.model_fields.items()}
    required = {name for name, info in action_cls.model_fields.items() if info.is_required()}
    field = _text_field(fields, required, what)
    return lambda completion: action_cls(**{field: completion})


def open_session(adapter):
    """The session of one episode: a fresh environment or client, per ``adapter.env``."""
    Environment, EnvClient, SyncEnvClient = openenv_classes()
    env = adapter.env
    if isinstance(env, str):
        from openenv.core import GenericEnvClient

        return _Remote(GenericEnvClient(base_url=env).sync(), url=env, generic=True)
    if isinstance(env, Environment):
        return _Local(env)
    made = env(base_url=adapter.base_url) if adapter.base_url is not None else env()
    if isinstance(made, Environment):
        return _Local(made)
    if isinstance(made, EnvClient):
        made = made.sync()
    if isinstance(made, SyncEnvClient):
        return _Remote(
            made, url=adapter.base_url or type(made.async_client).__name__, generic=False
        )
    raise TypeError(
        f"OpenEnvEnvironment: env() returned a {type(made).__name__}; it returns an OpenEnv "
        "Environment or a client (EnvClient)."
    )


class _Local:
    """An ``Environment`` in this process; its async methods (sync by default) are awaited."""

    def __init__(self, env):
        self.env, self.build = env, None

    async def reset(self, **kwargs):
        obs = await self.env.reset_async(**kwargs)
        return obs, obs.reward, obs.done

    async def step(self, action):
        obs = await self.env.step_async(action)
        return obs, obs.reward, obs.done

    async def action_builder(self):
        Environment = openenv_classes()[0]
        cls = _action_class(type(self.env), Environment)
        if cls is None:
            raise TypeError(
                f"OpenEnvEnvironment: the action class of {type(self.env).__name__} cannot be "
                "read (declare it as Environment[MyAction, ...]); or pass action=lambda "
                "completion: MyAction(...)."
            )
        return _class_field(cls, cls.__name__)

    async def close(self):
        self.env.close()


class _Remote:
    """A server session through OpenEnv's sync client, its calls in a thread of its own.

    The client keeps its WebSocket on an event loop of its own, which outlives the loop
    each turn's calls are gathered on; a worker thread per session (not a shared pool,
    which would queue them) lets every episode of a turn wait on the server at once.
    """

    def __init__(self, client, url, generic):
        self.client, self.url, self.generic, self.build = client, url, generic, None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openenv-session")

    async def call(self, method, *args, **kwargs):
        job = functools.partial(method, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.pool, job)

    async def reset(self, **kwargs):
        try:  # the session opens here
            result = await self.call(self.client.reset, **kwargs)
        except Exception as exc:
            with contextlib.suppress(Exception):  # best effort: the session did not start
                await self.close()
            refused = "CAPACITY" in str(exc) or isinstance(exc, ConnectionError)
            if not (refused or "ConnectionClosed" in type(exc).__name__):
                raise  # the environment's own error, as the server reported it
            raise RuntimeError(
                f"OpenEnvEnvironment: the OpenEnv server at {self.url} refused or closed a new "
                f"session ({type(exc).__name__}: {exc}). Every episode of a step holds a "
                "session of its own at the same time: start the server with "
                "max_concurrent_envs of at least the estimator's batch_size (its Environment "
                "with SUPPORTS_CONCURRENT_SESSIONS = True), and check that it runs."
            ) from exc
        return result.observation, result.reward, result.done

    async def step(self, action):
        result = await self.call(self.client.step, action)
        return result.observation, result.reward, result.done

    async def action_builder(self):
        if not self.generic:  # a typed client: its declared action class
            EnvClient = openenv_classes()[1]
            client = type(self.client.async_client)
            cls = _action_class(client, EnvClient)
            if cls is None:
                raise TypeError(
                    f"OpenEnvEnvironment: the action class of {client.__name__} cannot be "
                    "read; pass action=lambda completion: MyAction(...)."
                )
            return _class_field(cls, cls.__name__)
        schema = await self.call(_schema, self.url)
        properties = schema.get("properties", {})
        fields = {name: p.get("type") == "string" for name, p in properties.items()}
        field = _text_field(fields, set(schema.get("required", ())), schema.get("title", "?"))
        return lambda completion: {field: completion}

    async def close(self):
        pool, self.pool = self.pool, None
        if pool is None:  # closed already
            return
        try:
            await asyncio.get_running_loop().run_in_executor(pool, self.client.close)
        finally:
            pool.shutdown(wait=False)


def _schema(url: str) -> dict:
    """The action's JSON schema, from the server's ``/schema`` endpoint."""
    import requests  # openenv-core's own dependency

    http = url.replace("wss://", "https://", 1).replace("ws://", "http://", 1).rstrip("/")
    response = requests.get(f"{http}/schema", timeout=30)
    response.raise_for_status()
    return response.json()["action"]
