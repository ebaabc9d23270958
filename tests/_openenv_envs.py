"""Environments defined with OpenEnv's own classes, for tests/test_openenv.py (needs openenv-core).

``Words`` pays the number of "good" in each turn and ends after two (``Together``: its
resets wait for each other); ``WordsNative`` is the
same environment in prefopt's protocol; ``WordsClient`` is its typed client, as an OpenEnv
environment package ships one; ``Unclear`` has two text fields in its action and its
observation; ``serve`` runs an environment's server in a thread on 127.0.0.1.
"""

import socket
import threading
import time
from contextlib import contextmanager

import pytest

# Collected by the suite's doctest run too: without the openenv extra, the module is skipped.
pytest.importorskip("openenv")

from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_client import EnvClient  # noqa: E402
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app  # noqa: E402


class Say(Action):
    text: str


class Heard(Observation):
    said: str = ""
    count: int = 0


class Words(Environment[Say, Heard, State]):
    """Pays the number of "good" in each turn; says "the plot" and ends after two turns.

    ``reset`` shows "the" when given ``greet=True`` (a keyword of its own).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    closed = 0  # environments closed, over every instance (the episode loop's close)

    def reset(self, seed=None, episode_id=None, greet=False, **kwargs):
        self.turn = 0
        return Heard(said="the" if greet else "", count=0)

    def step(self, action, timeout_s=None, **kwargs):
        self.turn += 1
        good = action.text.split().count("good")
        return Heard(said="the plot", count=good, reward=float(good), done=self.turn == 2)

    @property
    def state(self):
        return State(step_count=self.turn)

    def close(self):
        type(self).closed += 1


class Together(Words):
    """``Words`` whose ``reset`` waits until ``barrier.parties`` resets are in flight at once."""

    barrier = None  # a threading.Barrier, set by the test

    def reset(self, seed=None, episode_id=None, **kwargs):
        type(self).barrier.wait(timeout=10)  # broken (an error) unless all arrive together
        return super().reset(seed, episode_id, **kwargs)


class WordsNative:
    """``Words`` in prefopt's own protocol: what the adapter must turn ``Words`` into."""

    def reset(self, prompt):
        self.turn = 0

    def step(self, completion):
        self.turn += 1
        good = float(completion.split().count("good"))
        return (None, good, True) if self.turn == 2 else ("the plot", good, False)


class WordsClient(EnvClient[Say, Heard, State]):
    """A typed client of the Words server."""

    def _step_payload(self, action):
        return action.model_dump()

    def _parse_result(self, payload):
        obs = Heard(**payload.get("observation", {}))
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload["done"])

    def _parse_state(self, payload):
        return State(**payload)


class TwoTexts(Action):
    text: str
    note: str


class TwoTextObservation(Observation):
    a: str = "x"
    b: str = "y"


class Unclear(Environment[TwoTexts, TwoTextObservation, State]):
    def reset(self, seed=None, episode_id=None, **kwargs):
        return TwoTextObservation()

    def step(self, action, timeout_s=None, **kwargs):
        return TwoTextObservation()

    @property
    def state(self):
        return State()


@contextmanager
def serve(env, action, observation, sessions):
    """OpenEnv's server of ``env`` on 127.0.0.1 (a free port), in a thread; yields its URL."""
    import uvicorn

    app = create_fastapi_app(env, action, observation, max_concurrent_envs=sessions)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the OpenEnv server did not start in 30 s"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
