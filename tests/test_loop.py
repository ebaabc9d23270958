"""The loop object of a fit, the parameters scikit-learn sees, a controller's betas."""

import inspect
import pickle
import warnings

import numpy as np
import pytest

import prefopt
from prefopt import GRPOPolicy, PPOPolicy, RAFTPolicy, ReinforcePolicy, RLOOPolicy
from prefopt.kl import KLController
from prefopt.policies import BasePolicy, store_params
from prefopt.policies._params import COMMON_CONSTRAINTS
from prefopt.policies.loop._loop import PolicyLoop
from prefopt.worlds import PreferenceWorld

BUILT_IN = [PPOPolicy, RLOOPolicy, GRPOPolicy, ReinforcePolicy, RAFTPolicy]
PHASES = {"time/generation", "time/logprobs", "time/reward"}


@pytest.fixture(scope="module")
def world():
    prefopt.set_config(show_progress_bar=False)
    return PreferenceWorld(random_state=0)


def _rloo(world, **kw):
    kw = {"beta": 0.3, "k": 2, "learning_rate": 0.3, "optimizer": "sgd", "n_steps": 2, **kw}
    return RLOOPolicy(model=world.policy_model(), batch_size=8, random_state=0, **kw)


# ----- the loop object ------------------------------------------------------------------
def test_a_fit_keeps_its_state_in_one_loop_and_the_rest_are_fitted_attributes(world):
    policy = _rloo(world).fit(world.prompts, world.true_quality)
    loop = policy._loop
    assert isinstance(loop, PolicyLoop) and loop.policy is policy
    assert loop.prompts == list(world.prompts) and len(loop.prompt_tokens) == len(world.prompts)
    # Beside the loop, the private names are the language-model layer's own.
    assert {k for k in vars(policy) if k.startswith("_")} <= {
        "_loop",
        "_fitting",
        "_suppress_ids",
        "_prefix_cache",
        "_max_new_tokens_from",
    }
    assert "_loop" not in pickle.loads(pickle.dumps(policy)).__dict__


def test_rollout_returns_a_batch_with_its_phase_timings(world):
    policy = _rloo(world).fit(world.prompts, world.true_quality)
    batch = policy._loop.rollout(np.array([0, 1, 2, 3]))
    assert len(batch) == 8 and batch.prompt_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert set(batch.timings) == PHASES and all(v >= 0 for v in batch.timings.values())
    assert batch.clone().timings == batch.timings
    assert PHASES <= set(policy.history_[-1]) and "time/update" in policy.history_[-1]


def test_warm_start_continues_the_last_loops_run(world):
    policy = _rloo(world).fit(world.prompts, world.true_quality)
    first = policy._loop
    optimizer = first.run.optimizer
    policy.set_params(warm_start=True).fit(world.prompts, world.true_quality)
    # A new loop per fit, on the same run: its random streams and optimiser go on.
    assert policy._loop is not first and policy._loop.run is first.run
    assert policy._loop.run.optimizer is optimizer and policy._loop.run.start_step == 2
    assert policy.n_iter_ == 4 and [r["step"] for r in policy.history_] == [1, 2, 3, 4]
    fresh = _rloo(world).fit(world.prompts, world.true_quality)
    assert fresh.set_params(warm_start=False).fit(world.prompts, world.true_quality).n_iter_ == 2


# ----- every parameter seen by scikit-learn -----------------------------------------------
def test_common_parameters_are_named_on_the_base_class():
    assert BasePolicy._common_parameters == tuple(COMMON_CONSTRAINTS)
    for name in BasePolicy._common_parameters:
        assert hasattr(BasePolicy, name), name  # the fallback of a subclass that omits it


@pytest.mark.parametrize("cls", BUILT_IN)
def test_built_in_algorithms_take_every_common_parameter(cls, world):
    signature = inspect.signature(cls.__init__).parameters
    assert set(cls._common_parameters) <= set(signature)
    assert set(cls._common_parameters) <= set(cls().get_params())


class Few(BasePolicy):
    """An algorithm whose __init__ leaves most common parameters out."""

    def __init__(self, *, model=None, learning_rate=0.3, optimizer="sgd", n_steps=1, k=2):
        store_params(self, locals())

    samples_per_prompt = "k"
    batch_size = 8

    def compute_advantages(self, batch):
        rewards = batch.sequence_rewards
        return rewards - rewards.mean()

    def compute_loss(self, batch, minibatch):
        loss = -(minibatch.advantages * (minibatch.logprobs * minibatch.mask).sum(1)).mean()
        return loss, {"loss/policy": loss.item()}


def test_a_subclass_is_told_once_which_common_parameters_it_hides(world):
    with pytest.warns(UserWarning, match="Few.__init__ does not take tokenizer, beta, kl,") as got:
        Few(model=world.policy_model()).fit(world.prompts, world.true_quality)
    (message,) = [str(w.message) for w in got if "does not take" in str(w.message)]
    assert "batch_size" in message and "learning_rate" not in message and "n_steps," not in message
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*does not take")
        Few(model=world.policy_model()).fit(world.prompts, world.true_quality)  # once a class
        _rloo(world, n_steps=1).fit(world.prompts, world.true_quality)  # built-ins: never
    # The class-level value is used: 8 episodes a step.
    assert Few(model=world.policy_model()).fit(world.prompts, world.true_quality).n_episodes_ == 8


# ----- the beta a controller returns ------------------------------------------------------
class Wild(KLController):
    """A user's controller returning a given beta at start or after the first update.

    A non-finite beta is given as text ("nan", "inf"): KLController.start refuses a
    non-finite numeric parameter itself, and here the controller's own code makes it.
    """

    def __init__(self, *, beta=None, at_start=0.1, after=0.1):
        self.beta, self.at_start, self.after = beta, at_start, after

    def start(self, beta=None):
        super().start(beta)
        self.beta_ = _number(self.at_start)
        return self

    def update(self, kl, n_episodes=None):
        self.beta_ = _number(self.after)
        return self.beta_


def _number(value):
    return float(value) if isinstance(value, str) else value


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"after": "nan"}, r"Wild\(.*\) returned beta=nan after step 1"),
        ({"after": -0.5}, r"returned beta=-0.5 after step 1"),
        ({"after": None}, r"returned beta=None after step 1"),
        ({"at_start": "inf"}, r"returned beta=inf at the start"),
    ],
)
def test_a_controllers_bad_beta_is_refused_naming_it(world, kw, match):
    with pytest.raises(ValueError, match=match + r".*finite number >= 0"):
        _rloo(world, kl=Wild(**kw)).fit(world.prompts, world.true_quality)


def test_a_controllers_good_beta_is_used(world):
    policy = _rloo(world, kl=Wild(at_start=0.2, after=0.7)).fit(world.prompts, world.true_quality)
    assert [r["objective/beta"] for r in policy.history_] == [0.2, 0.7]
    assert policy.beta_ == 0.7


def test_recomputes_old_logprobs_is_the_clearer_name_of_uses_ratio():
    assert PPOPolicy().recomputes_old_logprobs and not PPOPolicy(use_ratio=False).uses_ratio
    assert not PPOPolicy(use_ratio=False).recomputes_old_logprobs
    assert (
        not GRPOPolicy().recomputes_old_logprobs and GRPOPolicy(n_epochs=2).recomputes_old_logprobs
    )
    assert not RLOOPolicy().recomputes_old_logprobs

    class OldName(Few):
        uses_ratio = True

    class NewName(Few):
        recomputes_old_logprobs = True

    assert OldName().recomputes_old_logprobs and NewName().recomputes_old_logprobs
