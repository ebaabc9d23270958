"""policies/_params.py: one table for the common parameters, and the ``__init__`` made from it.

Each built-in's signature, constraints and docstring agree with the table (a built-in
declares only the defaults it changes); make_init writes what scikit-learn asks of an
``__init__``: keyword-only, literal defaults, arguments stored verbatim.
"""

import inspect
import re
import warnings
from numbers import Real

import pytest
from sklearn.base import clone

import prefopt
from prefopt.policies import BasePolicy, make_init
from prefopt.policies._params import COMMON_PARAMETERS, Parameter
from prefopt.validation import Interval, InvalidParameterError, validate_params
from prefopt.worlds import PreferenceWorld

BUILT_IN = [
    prefopt.PPOPolicy,
    prefopt.RLOOPolicy,
    prefopt.GRPOPolicy,
    prefopt.ReinforcePolicy,
    prefopt.ReinforcePlusPlusPolicy,
    prefopt.RAFTPolicy,
]
# What each built-in declares it changes of the table; every other common default is the
# table's. (The class-level defaults of BasePolicy disagreed with exactly these six before
# the table: n_epochs, n_minibatches and beta.)
CHANGED = {
    prefopt.PPOPolicy: {"n_epochs": 4},
    prefopt.RLOOPolicy: {"batch_size": 256, "n_minibatches": 2},
    prefopt.GRPOPolicy: {"batch_size": 256, "beta": 0.04},
    prefopt.ReinforcePolicy: {"n_minibatches": 2},
    prefopt.ReinforcePlusPlusPolicy: {"beta": 0.01},
    prefopt.RAFTPolicy: {"n_epochs": 4},
}


def disagreements(cls) -> list[str]:
    """Where ``cls.__init__``'s signature and the table disagree, beyond what it declares."""
    signature = inspect.signature(cls.__init__).parameters
    declared = getattr(cls.__init__, "differs", {})
    found = []
    for name, parameter in COMMON_PARAMETERS.items():
        if name not in signature:
            found.append(f"{name} missing")
            continue
        want = declared.get(name, parameter.default)
        got = signature[name].default
        if got != want or type(got) is not type(want):
            found.append(f"{name}={got!r}, the table says {parameter.default!r}")
    return found


@pytest.mark.parametrize("cls", BUILT_IN, ids=lambda c: c.__name__)
def test_built_in_signatures_agree_with_the_table(cls):
    assert disagreements(cls) == []
    assert cls.__init__.differs == CHANGED[cls]
    signature = inspect.signature(cls.__init__).parameters
    assert all(p.kind is p.KEYWORD_ONLY for n, p in signature.items() if n != "self")
    assert cls().get_params(deep=False) == {
        n: p.default for n, p in signature.items() if n != "self"
    }


def test_a_hand_written_init_that_disagrees_is_caught():
    class Drifted(BasePolicy):
        def __init__(self, *, model=None, beta=0.1, n_epochs=1):
            self.model, self.beta, self.n_epochs = model, beta, n_epochs

    found = disagreements(Drifted)
    assert "beta=0.1, the table says 0.05" in found and "n_epochs=1" not in " ".join(found)
    assert "tokenizer missing" in found
    # A default of another type is a disagreement too (1 is not 1.0 for a verbatim default).
    Typed = type("Typed", (BasePolicy,), {"__init__": make_init(beta=1)})
    assert disagreements(Typed) == [] and Typed().beta == 1 and type(Typed().beta) is int


@pytest.mark.parametrize("cls", BUILT_IN, ids=lambda c: c.__name__)
def test_built_in_constraints_and_docstrings_come_from_the_table(cls):
    for name, parameter in COMMON_PARAMETERS.items():
        assert cls._parameter_constraints[name] is parameter.constraints, name
    doc = cls.__doc__
    default = inspect.signature(cls.__init__).parameters
    for name, parameter in COMMON_PARAMETERS.items():
        if cls is prefopt.GRPOPolicy and name == "beta":  # GRPO documents its own beta
            assert "beta : float, default=0.04\n        KL coefficient: weight of the k3" in doc
            continue
        value = default[name].default
        shown = f'"{value}"' if isinstance(value, str) else repr(value)
        header = f"    {name} : {parameter.type}, default={shown}\n"
        assert header in doc, header
        first = parameter.doc.split("\n")[0].replace("{tiny_learning_rate}", "")
        assert first.split("  ")[0][:40] in doc, name


def test_base_class_values_and_constraints_are_the_table():
    assert BasePolicy._common_parameters == tuple(COMMON_PARAMETERS)
    for name, parameter in COMMON_PARAMETERS.items():
        assert getattr(BasePolicy, name) is parameter.default
        assert BasePolicy._parameter_constraints[name] is parameter.constraints
    for parameter in COMMON_PARAMETERS.values():
        assert type(parameter.default) in (type(None), bool, int, float, str)
        assert isinstance(parameter, Parameter) and parameter.type


def test_every_table_default_is_valid():
    class Everything(BasePolicy):
        __init__ = make_init()

    validate_params(Everything())
    assert set(Everything().get_params()) == set(COMMON_PARAMETERS)


def test_make_init_is_keyword_only_and_stores_verbatim():
    init = make_init(k=4, n_minibatches=2)
    assert list(inspect.signature(init).parameters)[:5] == [
        "self",
        "model",
        "tokenizer",
        "beta",
        "k",
    ]
    assert init.own == ["k"] and init.differs == {"n_minibatches": 2}
    weights = [1.0, 2.0]
    policy = prefopt.RLOOPolicy(reward_weights=weights, k=3)
    assert policy.reward_weights is weights and policy.k == 3
    with pytest.raises(TypeError, match="positional"):
        prefopt.RLOOPolicy(None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'kk'"):
        prefopt.RLOOPolicy(kk=3)
    assert prefopt.RLOOPolicy.__init__.__qualname__ == "RLOOPolicy.__init__"
    assert prefopt.RLOOPolicy.__init__.__module__ == "prefopt.policies.rloo"
    cloned = clone(prefopt.PPOPolicy(n_epochs=2, clip_coef=0.3))
    assert cloned.get_params()["n_epochs"] == 2 and cloned.clip_coef == 0.3


def test_make_init_refuses_a_mutable_default_and_a_redundant_declaration():
    with pytest.raises(TypeError, match=re.escape("reward_weights=[1.0] is not a literal")):
        make_init(reward_weights=[1.0])
    with pytest.raises(ValueError, match="n_epochs=1 is the common default already"):
        make_init(n_epochs=1)
    make_init(n_epochs=1.0)  # another type is a change (validation refuses a float n_epochs)


def test_an_own_parameter_needs_a_constraint():
    with pytest.raises(TypeError, match=r"Loose's parameters \['cap'\] have no entry"):
        type("Loose", (BasePolicy,), {"__init__": make_init(cap=1.0)})


class Capped(BasePolicy):
    """A user algorithm on the table: its own parameter and every common one."""

    _parameter_constraints = {
        **BasePolicy._parameter_constraints,
        "cap": [Interval(Real, 0, None, closed="neither")],
    }
    __init__ = make_init(cap=1.0, n_steps=2, optimizer="sgd", learning_rate=0.3)

    def compute_advantages(self, batch):
        rewards = batch.sequence_rewards
        return (rewards - rewards.mean()).clamp(max=self.cap)

    def compute_loss(self, batch, minibatch):
        loss = -(minibatch.advantages * (minibatch.logprobs * minibatch.mask).sum(1)).mean()
        return loss, {"loss/policy": loss.item()}


def test_a_user_algorithm_on_the_table_is_searchable_and_not_told_anything():
    prefopt.set_config(show_progress_bar=False)
    world = PreferenceWorld(random_state=0)
    params = Capped().get_params()
    assert set(params) == set(COMMON_PARAMETERS) | {"cap"} and params["n_steps"] == 2
    with pytest.raises(InvalidParameterError, match="'cap' parameter of Capped"):
        Capped(model=world.policy_model(), cap=-1.0).fit(world.prompts, world.true_quality)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*does not take")
        policy = Capped(model=world.policy_model(), batch_size=8, random_state=0)
        policy.fit(world.prompts, world.true_quality)
    assert policy.n_iter_ == 2 and policy.n_episodes_ == 16
    assert clone(policy.set_params(cap=0.5)).cap == 0.5
