"""OpenEnvEnvironment: OpenEnv environments (in-process and served on localhost) as prefopt's.

Every test but the first needs the optional extra (openenv-core) and is skipped without
it; the environments are defined in ``_openenv_envs.py``, and the server runs in a thread
of this process on 127.0.0.1 (nothing leaves the machine).
"""

import asyncio
import copy
import sys
import threading

import numpy as np
import pytest
from _tiny import tiny_lm

from prefopt import GRPOPolicy
from prefopt.environments import OpenEnvEnvironment
from prefopt.policies.loop._environment import gather

PROMPTS = ["the movie was", "the plot was"]


def test_a_missing_openenv_is_an_import_error_naming_the_pip_command(monkeypatch):
    for name in [m for m in sys.modules if m == "openenv" or m.startswith("openenv.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "openenv", None)  # an import of it now fails
    with pytest.raises(ImportError, match=r'pip install "prefopt\[openenv\]"'):
        OpenEnvEnvironment("http://localhost:8000")


@pytest.fixture(scope="module")
def oe():
    """The test environments (``_openenv_envs``); the test is skipped without openenv-core."""
    pytest.importorskip("openenv", reason="the openenv extra (openenv-core)")
    import _openenv_envs

    return _openenv_envs


@pytest.fixture(scope="module")
def server(oe):
    with oe.serve(oe.Words, oe.Say, oe.Heard, sessions=16) as url:
        yield url


def run(coroutine):
    return asyncio.run(coroutine)


def policy(environment, **params):
    params = {"max_turns": 2, "n_steps": 2, **params}
    return GRPOPolicy(
        model=tiny_lm(0),
        environment=environment,
        k=2,
        batch_size=4,
        max_new_tokens=8,
        on_unhealthy="ignore",
        random_state=0,
        **params,
    )


def fit(environment, **params):
    with pytest.warns(RuntimeWarning, match="ended with EOS"):  # an untrained model rarely stops
        return policy(environment, **params).fit(PROMPTS)


def numbers(history):
    return [(k, v) for row in history for k, v in row.items() if not k.startswith("time/")]


# ----- in-process ------------------------------------------------------------------------
def test_reset_and_step_map_completions_to_actions_and_observations_to_text(oe):
    env = OpenEnvEnvironment(oe.Words)
    assert run(env.reset("the movie was")) is None  # the only text field, empty: no text
    assert run(env.step("good good bad")) == ("the plot", 2.0, False)
    assert run(env.step("bad")) == (None, 0.0, True)  # done: no text, the session closed
    assert env._session is None


def test_the_users_action_observation_and_reset_keywords_are_used(oe):
    seen = []

    def action(completion):
        seen.append(completion)
        return oe.Say(text=completion + " good")  # one "good" more

    env = OpenEnvEnvironment(
        oe.Words,
        action=action,
        observation=lambda obs: f"{obs.said} {obs.count}",
        reset_kwargs=lambda prompt: {"greet": prompt.startswith("the")},
    )
    assert run(env.reset("the movie was")) == "the 0"
    assert run(env.step("good")) == ("the plot 2", 2.0, False)
    assert seen == ["good"]
    assert run(env.reset("a movie")) == " 0"  # greet=False: the said field is empty


def test_max_steps_ends_an_episode_the_environment_does_not_and_reset_text_can_be_hidden(oe):
    env = OpenEnvEnvironment(oe.Words, max_steps=1, reset_observation=False)
    assert run(env.reset("the movie was")) is None
    assert run(env.step("good")) == (None, 1.0, True)


def test_an_environment_instance_is_copied_with_the_adapter_for_each_episode(oe):
    instance = oe.Words()
    adapter = OpenEnvEnvironment(instance)
    first, second = copy.deepcopy(adapter), copy.deepcopy(adapter)
    run(first.reset("p"))
    run(first.step("good"))
    run(second.reset("p"))
    assert first._session.env.turn == 1 and second._session.env.turn == 0
    assert not hasattr(instance, "turn")  # the parameter itself is never stepped
    assert copy.deepcopy(first)._session is None  # a copy holds no live session


def test_an_action_or_observation_without_one_text_field_asks_for_a_function(oe):
    env = OpenEnvEnvironment(oe.Unclear, observation=lambda obs: obs.a)
    assert run(env.reset("p")) == "x"
    with pytest.raises(TypeError, match=r"fields \['note', 'text'\].*pass action=lambda"):
        run(env.step("hello"))
    env = OpenEnvEnvironment(oe.Unclear, action=lambda c: oe.TwoTexts(text=c, note=""))
    with pytest.raises(TypeError, match=r"fields \['a', 'b'\], 2 of them text.*observation="):
        run(env.reset("p"))


@pytest.mark.parametrize(
    ("env", "params", "error", "message"),
    [
        ("localhost:8000", {}, ValueError, "not a server URL"),
        (3, {}, TypeError, "env is a int; it is the URL"),
        ("Words", {"base_url": "http://localhost:1"}, ValueError, "base_url is for a client"),
        ("Words", {"action": "text"}, TypeError, "action must be a function"),
        ("Words", {"max_steps": 0}, ValueError, "max_steps must be an integer >= 1"),
        ("Words", {"reset_observation": 1}, TypeError, "reset_observation must be a bool"),
    ],
)
def test_bad_arguments_are_refused_at_construction(oe, env, params, error, message):
    env = oe.Words if env == "Words" else env
    with pytest.raises(error, match=message):
        OpenEnvEnvironment(env, **params)


def test_a_client_instance_is_refused_and_step_before_reset_is_an_error(oe):
    with pytest.raises(TypeError, match="every episode needs a session of its own"):
        OpenEnvEnvironment(oe.WordsClient(base_url="http://127.0.0.1:1"))
    with pytest.raises(ValueError, match="needs the server's URL"):
        OpenEnvEnvironment(oe.WordsClient)
    with pytest.raises(RuntimeError, match="before reset"):
        run(OpenEnvEnvironment(oe.Words).step("good"))
    with pytest.raises(RuntimeError, match="server at http://127.0.0.1:1 refused or closed"):
        run(OpenEnvEnvironment("http://127.0.0.1:1").reset("p"))  # nothing listens there


def test_a_fit_through_the_adapter_is_the_fit_with_the_environment_written_for_prefopt(oe):
    closed = oe.Words.closed
    adapted, native = fit(OpenEnvEnvironment(oe.Words)), fit(oe.WordsNative)
    assert len(adapted.history_) == 2
    # Some episodes reached the environment's second turn, and some its done (at this seed:
    # 1.75 and 1.5 turns an episode, 0.25 and 0.75 of them truncated, over the two steps).
    assert max(r["episode/turns"] for r in adapted.history_) > 1
    assert min(r["episode/truncated_share"] for r in adapted.history_) < 1
    assert all(np.isfinite(v) for _, v in numbers(adapted.history_))
    assert numbers(adapted.history_) == numbers(native.history_)
    assert oe.Words.closed - closed == 2 * 4  # every episode of both steps closed its environment


@pytest.mark.filterwarnings("ignore:.*ended with EOS:RuntimeWarning")
def test_a_changed_adapter_is_not_resumed_as_the_same_run(oe, tmp_path):
    policy(OpenEnvEnvironment(oe.Words), n_steps=1, checkpoint_dir=tmp_path,
           checkpoint_every=1).fit(PROMPTS)  # fmt: skip
    with pytest.raises(ValueError, match=r"environment.state.max_steps=None, but this fit has"):
        policy(OpenEnvEnvironment(oe.Words, max_steps=1), n_steps=2, checkpoint_dir=tmp_path,
               checkpoint_every=1).fit(PROMPTS)  # fmt: skip


# ----- a server on localhost ---------------------------------------------------------------
def test_a_served_environment_through_its_url_and_through_a_typed_client(oe, server):
    by_url = OpenEnvEnvironment(server)  # dict observations; the action field from /schema
    assert run(by_url.reset("p")) is None
    assert run(by_url.step("good good")) == ("the plot", 2.0, False)
    assert run(by_url.step("good")) == (None, 1.0, True)
    typed = OpenEnvEnvironment(oe.WordsClient, base_url=server, reset_kwargs=lambda p: {"greet": 1})
    assert run(typed.reset("p")) == "the"  # the server passes reset's own keywords on
    assert run(typed.step("bad")) == ("the plot", 0.0, False)
    run(typed.close())


def test_a_fit_on_a_served_environment_is_the_in_process_fit(oe, server):
    served, local = fit(OpenEnvEnvironment(server)), fit(OpenEnvEnvironment(oe.Words))
    assert numbers(served.history_) == numbers(local.history_)
    # max_turns=1 cuts every episode (Words ends after 2) and the loop closes its session;
    # without that, the 3 fits' 12 episodes and the 16 sessions above overflow the server.
    for _ in range(3):
        fit(OpenEnvEnvironment(server), max_turns=1, n_steps=1)


def test_a_server_without_room_for_a_step_is_named_with_the_fix(oe):
    with oe.serve(oe.Words, oe.Say, oe.Heard, sessions=2) as url:
        with pytest.raises(RuntimeError, match="max_concurrent_envs of at least the estimator"):
            policy(OpenEnvEnvironment(url), n_steps=1).fit(PROMPTS)


def test_the_episodes_of_a_turn_wait_on_the_server_together(oe):
    # Eight resets gathered as the episode loop gathers a turn's calls: each waits at a
    # barrier of 8 in the server, so this passes only if all eight are in flight at once
    # (a shared pool of fewer threads would queue them and break the barrier).
    oe.Together.barrier = threading.Barrier(8)
    with oe.serve(oe.Together, oe.Say, oe.Heard, sessions=8) as url:
        episodes = [copy.deepcopy(OpenEnvEnvironment(url)) for _ in range(8)]
        assert gather([episode.reset("p") for episode in episodes]) == [None] * 8
        gather([episode.close() for episode in episodes])
