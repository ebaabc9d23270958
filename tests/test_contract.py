"""A user-written algorithm on the public contract: no private name; the loop does the rest."""

import numpy as np
import pytest
import torch

import prefopt
from prefopt.policies import BasePolicy, RLOOPolicy, store_params
from prefopt.worlds import PreferenceWorld, TinyLMWorld


class BatchMeanReinforce(BasePolicy):
    """REINFORCE with k samples per prompt and the batch's mean reward as baseline.

    With ``kl_penalty = "loss"`` (a subclass below) the KL leaves the reward and
    enters the loss as beta times the k3 estimator, as GRPO does.
    """

    samples_per_prompt = "k"
    kl_penalty = "reward"

    def __init__(
        self,
        *,
        model=None,
        beta=0.1,
        k=2,
        learning_rate=0.3,
        optimizer="sgd",
        n_steps=20,
        temperature=None,
        random_state=None,
    ):
        store_params(self, locals())

    def compute_advantages(self, batch):
        rewards = batch.sequence_rewards
        return rewards - rewards.mean()

    def compute_loss(self, batch, minibatch):
        logp = (minibatch.logprobs * minibatch.mask).sum(1)
        loss = -(minibatch.advantages * logp).mean()
        if self.kl_penalty == "loss":
            log_r = minibatch.ref_logprobs - minibatch.logprobs
            k3 = ((log_r.exp() - 1) - log_r) * minibatch.mask
            loss = loss + batch.beta * k3.sum(1).mean()
        return loss, {"loss/policy": loss.item()}

    def after_update(self, batch):
        self.last_batch_size_ = len(batch)


class Spy(BatchMeanReinforce):
    """Keeps the last batch and minibatch it saw."""

    def compute_advantages(self, batch):
        self.seen_batch_ = batch
        return super().compute_advantages(batch)

    def compute_loss(self, batch, minibatch):
        self.seen_minibatch_ = minibatch
        return super().compute_loss(batch, minibatch)


@pytest.fixture(scope="module")
def world():
    prefopt.set_config(show_progress_bar=False)
    return PreferenceWorld(random_state=0)


def test_user_algorithm_runs_on_the_shared_loop(world):
    policy = BatchMeanReinforce(model=world.policy_model(), k=4, n_steps=30, random_state=0)
    policy.fit(world.prompts, world.true_quality)
    assert policy.n_iter_ == 30 and len(policy.history_) == 30
    assert policy.last_batch_size_ == 64
    # k samples per prompt: 16 prompts a step, each prompt's 4 samples together.
    start = float((world.reference_probs() * world.rewards(world.true_quality)).sum(1).mean())
    end = world.evaluate(policy, world.true_quality, beta=0.1)["objective"]
    optimum = world.optimum(world.true_quality, beta=0.1)["objective"]
    # Measured: 0.751, 0.756, 0.762 of the way from the reference to the optimum (seeds 0-2).
    assert end > start + 0.7 * (optimum - start)


def test_kl_in_loss_leaves_the_reward_unshaped_but_reports_the_rlhf_reward(world):
    class InLoss(Spy):
        kl_penalty = "loss"

    policy = InLoss(model=world.policy_model(), k=2, n_steps=2, beta=0.5, random_state=0)
    policy.fit(world.prompts, world.true_quality)
    batch = policy.seen_batch_
    assert not batch.kl_in_reward and batch.kl.abs().sum() > 0
    torch.testing.assert_close(batch.sequence_rewards, batch.scores)
    torch.testing.assert_close(batch.rewards.sum(1), batch.scores)
    expected = float((batch.scores - batch.beta * batch.kl.sum(1)).mean())
    assert policy.history_[-1]["objective/rlhf_reward"] == pytest.approx(expected, abs=1e-6)
    # With the KL in the reward, the shaped sequence reward subtracts it.
    shaped = Spy(model=world.policy_model(), k=2, n_steps=2, beta=0.5, random_state=0)
    batch = shaped.fit(world.prompts, world.true_quality).seen_batch_
    torch.testing.assert_close(batch.sequence_rewards, batch.scores - 0.5 * batch.kl.sum(1))


def test_training_temperature_declaration_reaches_the_loss():
    from prefopt.backend import response_logprobs

    prefopt.set_config(show_progress_bar=False)
    world = TinyLMWorld(random_state=0)

    class AtOne(Spy):
        training_temperature = 1.0

    for cls, expected_temperature in ((Spy, None), (AtOne, 1.0)):
        # A zero step size: the model after fit is the one the loss saw.
        policy = cls(
            model=world.policy_model(),
            k=2,
            n_steps=1,
            learning_rate=1e-30,
            temperature=0.5,
            random_state=0,
        ).fit(world.prompts, world.reward)
        assert policy.temperature_ == 0.5
        mb = policy.seen_minibatch_
        rows = mb.rows
        temperature = policy.temperature_ if expected_temperature is None else 1.0
        again = response_logprobs(
            policy.model_,
            mb.batch.prompts[rows],
            mb.batch.response_ids[rows],
            mb.mask,
            temperature=temperature,
            suppress_ids=policy._suppress_ids,
        )
        torch.testing.assert_close(mb.logprobs.detach(), again.detach(), atol=1e-5, rtol=0)


def test_declarations_of_the_shipped_algorithms():
    assert RLOOPolicy(k=3)._samples_per_prompt() == 3
    assert prefopt.RAFTPolicy.training_temperature == 1.0
    assert prefopt.PPOPolicy(use_ratio=False).uses_ratio is False
    assert prefopt.PPOPolicy().uses_value_model
    assert BasePolicy.kl_penalty == "reward"


def test_bad_kl_penalty_is_refused(world):
    class Wrong(BatchMeanReinforce):
        kl_penalty = "elsewhere"

    with pytest.raises(ValueError, match="kl_penalty"):
        Wrong(model=world.policy_model(), n_steps=1).fit(world.prompts, world.true_quality)


def test_missing_methods_say_what_to_define(world):
    class Empty(BasePolicy):
        def __init__(self, *, model=None, n_steps=1):
            store_params(self, locals())

    with pytest.raises(NotImplementedError, match="compute_advantages"):
        Empty(model=world.policy_model()).fit(world.prompts, world.true_quality)


class Hooked(BatchMeanReinforce):
    """Uses every hook of the contract: no reference pass, resampling of tied groups, and a
    module trained beside the policy and saved with it (a learned per-prompt baseline)."""

    needs_reference = False
    dynamic_sampling = True
    max_resamples = 2

    def extra_modules(self, reward):
        from prefopt.backend import TokenValueTable

        return {"baseline_": TokenValueTable(len(self.tokenizer_))}

    def compute_loss(self, batch, minibatch):
        loss, stats = super().compute_loss(batch, minibatch)
        # The baseline of a prompt: the table's value at the prompt's last (left-padded) token.
        baseline = self.baseline_(batch.prompts.input_ids[minibatch.rows])[:, -1]
        fit = ((baseline - batch.sequence_rewards[minibatch.rows]) ** 2).mean()
        return loss + fit, {**stats, "loss/baseline": fit.item()}


def test_a_user_algorithm_uses_every_hook(world):
    def ties(prompts, completions):  # every group ties: resampling runs all its rounds
        return np.zeros(len(completions))

    policy = Hooked(model=world.policy_model(), k=2, n_steps=2, random_state=0)
    with pytest.warns(prefopt.RunHealthWarning):  # a constant reward: dead groups
        policy.fit(world.prompts, ties)
    batch = policy._loop.rollout(np.arange(4))
    # needs_reference = False: no reference pass, a KL of 0, no log-prob shift measured.
    torch.testing.assert_close(batch.ref_logprobs, batch.old_logprobs, rtol=0, atol=0)
    assert all(row["objective/kl"] == 0.0 for row in policy.history_)
    assert not any("policy/logprob_shift" in row for row in policy.history_)
    # dynamic_sampling with max_resamples = 2: two extra rounds of a whole batch (64) a step.
    for row in policy.history_:
        assert row["sampling/rounds"] == 2.0 and row["sampling/extra_generations"] == 128.0
        assert row["sampling/dropped_groups"] == 64.0  # the 32 groups of each extra round
    # extra_modules: trained by the fit's optimiser (zeros at the start) and listed.
    assert policy.extra_modules_ == ["baseline_"]
    assert policy._loop.view.trained["baseline_"] is policy.baseline_
    assert policy.value_model_ is None


def test_a_user_algorithm_saves_and_loads_with_explicit_registration(world, tmp_path):
    policy = Hooked(model=world.policy_model(), k=2, n_steps=2, random_state=0)
    policy.fit(world.prompts, world.true_quality)
    assert float(policy.baseline_.values.weight.abs().sum()) > 0  # the baseline learned
    folder = policy.save(tmp_path / "hooked")
    # The folder names a class of the user's: refused unless the caller allows it.
    with pytest.raises(ValueError, match=r"Refusing to load the class .*Hooked.*algorithms="):
        prefopt.load(folder, reward=None, model_=world.policy_model())
    with pytest.raises(TypeError, match="algorithms="):
        prefopt.load(folder, algorithms=[dict], reward=None, model_=world.policy_model())
    loaded = prefopt.load(folder, algorithms=[Hooked], reward=None, model_=world.policy_model())
    assert type(loaded) is Hooked and loaded.get_params() == {**policy.get_params(), "model": None}
    assert loaded.extra_modules_ == ["baseline_"]
    torch.testing.assert_close(loaded.baseline_.values.weight, policy.baseline_.values.weight)
    assert torch.equal(loaded.model_.theta, policy.model_.theta)
    assert loaded.history_ == policy.history_ and loaded.beta_ == policy.beta_
    assert loaded.sample(world.prompts[:2], n=3) == policy.sample(world.prompts[:2], n=3)


def test_the_hooks_have_defaults_on_the_contract():
    from prefopt.policies import Algorithm

    assert Algorithm.needs_reference is True
    assert Algorithm.dynamic_sampling is False and Algorithm.max_resamples == 0
    policy = BatchMeanReinforce()
    assert policy.extra_modules(reward=None) == {}  # uses_value_model is False
    assert policy.shared_trunk_modules() == {}
    assert prefopt.PPOPolicy(value_model="shared").shared_trunk_modules() == {
        "value_model_": "model_"
    }


@pytest.mark.parametrize(
    ("modules", "error", "match"),
    [
        ([], TypeError, "must return a dict"),
        ({"critic_": "a module"}, TypeError, "str for 'critic_'.*torch.nn.Module"),
        ({"Critic": torch.nn.Linear(1, 1)}, ValueError, "name 'Critic'.*ending in '_'"),
        ({"model_": torch.nn.Linear(1, 1)}, ValueError, "'model_', a fitted attribute"),
    ],
)
def test_a_bad_extra_modules_answer_is_refused_before_training(world, modules, error, match):
    class Bad(BatchMeanReinforce):
        def extra_modules(self, reward):
            return modules

    policy = Bad(model=world.policy_model(), n_steps=1)
    with pytest.raises(error, match=match):
        policy.fit(world.prompts, world.true_quality)
    assert not hasattr(policy, "n_iter_")  # refused before any step
