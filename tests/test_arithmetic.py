"""The arithmetic world (problems, split, rewards, tokenizer, configs) and pass@k."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from prefopt.metrics import make_pass_at_k_scorer, make_reward_scorer, pass_at_k
from prefopt.worlds import ArithmeticWorld


@pytest.fixture(scope="module")
def world():
    return ArithmeticWorld(random_state=0)


@pytest.fixture(scope="module")
def small():
    # Every problem of one-digit operands and all three operations: 300 problems.
    return ArithmeticWorld(
        n_digits=1, operations="+-*", n_eval=50, n_demonstrations=100, random_state=0
    )


# ----- problems, answers and the split ----------------------------------------------------


def test_answers_are_exact(small, world):
    for w in (small, world):
        for prompt, answer in zip(w.prompts + w.eval_prompts, w.answers + w.eval_answers):
            a, op, b = prompt[:-1].partition("+")
            if not op:
                for op in "-*":
                    a, _, b = prompt[:-1].partition(op)
                    if b:
                        break
            assert prompt.endswith("=")
            assert (
                int(answer)
                == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
            )
            assert answer == str(int(answer))  # canonical: no leading zeros, no "+"
    assert {"7-9=": "-2", "0*5=": "0", "9*9=": "81"}.items() <= dict(
        zip(small.prompts + small.eval_prompts, small.answers + small.eval_answers)
    ).items()
    assert ArithmeticWorld.solve(" 12 * 7 = ") == "84"
    with pytest.raises(ValueError, match="Cannot read an arithmetic problem.*answer="):
        ArithmeticWorld.solve("what is 2+2?")


def test_split_is_disjoint_complete_and_seeded(small, world):
    assert len(small.prompts) + len(small.eval_prompts) == 300
    assert len(set(small.prompts + small.eval_prompts)) == 300
    assert len(world.prompts) == 9800 and len(world.eval_prompts) == 200
    assert not set(world.prompts) & set(world.eval_prompts)
    demos = world.demonstrations
    assert demos.columns.tolist() == ["prompt", "completion"] and len(demos) == 4000
    assert set(demos.prompt) <= set(world.prompts) and demos.prompt.is_unique
    assert (demos.completion == [ArithmeticWorld.solve(p) for p in demos.prompt]).all()
    for table, prompts, answers in (
        (world.dataset, world.prompts, world.answers),
        (world.eval_dataset, world.eval_prompts, world.eval_answers),
    ):
        assert isinstance(table, pd.DataFrame) and table.columns.tolist() == ["prompt", "answer"]
        assert table.prompt.tolist() == prompts and table.answer.tolist() == answers
    from datasets import Dataset

    assert Dataset.from_pandas(world.eval_dataset)["answer"] == world.eval_answers
    again = ArithmeticWorld(random_state=0)
    assert again.prompts == world.prompts and again.eval_prompts == world.eval_prompts
    assert ArithmeticWorld(random_state=1).eval_prompts != world.eval_prompts
    assert world.max_new_tokens == 4 and small.max_new_tokens == 3  # "198" / "-9" + EOS


@pytest.mark.parametrize(
    "params, message",
    [
        ({"n_digits": 0}, "n_digits must be an integer from 1 to 3; got 0"),
        ({"n_digits": 2.0}, "n_digits must be"),
        ({"operations": "/"}, "operations must be a string"),
        ({"operations": "++"}, "operations must be a string"),
        ({"operations": ["+"]}, "operations must be a string"),
        ({"n_eval": 0}, "n_eval must be a positive integer; got 0"),
        ({"n_digits": 1, "n_eval": 50, "n_demonstrations": 60}, "need 110 distinct problems"),
    ],
)
def test_bad_parameters_are_named(params, message):
    with pytest.raises(ValueError, match=message):
        ArithmeticWorld(**params)


# ----- rewards ----------------------------------------------------------------------------


def test_correctness_reward_by_lookup_and_by_answer_keyword(world):
    reward = world.correctness_reward
    assert reward.__name__ == "correctness_reward"
    prompts = ["67+68="] * 6
    got = reward(prompts, ["135", " 135 ", "0135", "134", "", "135135"])
    np.testing.assert_array_equal(got, [1, 1, 0, 0, 0, 0])
    # TRL-style: the dataset's answer column, one per completion, overrides the lookup.
    np.testing.assert_array_equal(
        reward(["two and two?", "67+68="], ["4", "135"], answer=["4", 134]), [1.0, 0.0]
    )
    np.testing.assert_array_equal(reward(["x"], ["-3"], answer=[-3], level=["easy"]), [1.0])
    assert reward([], []).shape == (0,)
    with pytest.raises(ValueError, match="Cannot read an arithmetic problem from the prompt 'x'"):
        reward(["x"], ["4"])
    with pytest.raises(ValueError, match="got 1 answers for 2 completions"):
        reward(prompts[:2], ["1", "2"], answer=["135"])
    with pytest.raises(TypeError, match="answer must be a list"):
        reward(prompts[:1], ["135"], answer="135")
    with pytest.raises(ValueError, match=r"integer or its decimal string.*'1\.5'"):
        reward(prompts[:1], ["135"], answer=["1.5"])
    with pytest.raises(ValueError, match="2 prompts and 1 completions"):
        reward(prompts[:2], ["135"])
    with pytest.raises(TypeError, match="completion 0 is a int"):
        reward(prompts[:1], [135])


def test_format_reward_wants_a_number_that_ended(world, small):
    reward = world.format_reward
    assert reward.__name__ == "format_reward"
    completions = ["0", "82", "-3", " 135 ", "1357", "082", "-0", "", "8+2", "+5", "1 3"]
    # "1357" has max_new_tokens = 4 characters: a response cut at the limit, never ended.
    np.testing.assert_array_equal(
        reward(["1+1="] * len(completions), completions, answer=["2"] * len(completions)),
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
    )
    np.testing.assert_array_equal(small.format_reward(["1+1="] * 2, ["-9", "100"]), [1, 0])


# ----- tokenizer and model ----------------------------------------------------------------


def test_tokenizer_round_trip_and_special_tokens(world):
    tok = world.tokenizer
    assert (tok.pad_token_id, tok.unk_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.pad_token_id != tok.eos_token_id and len(tok) == 17
    texts = [p + a for p, a in zip(world.prompts[:300], world.answers[:300])]
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    assert all(len(i) == len(t) for i, t in zip(ids, texts))  # one token per character
    assert tok.batch_decode(ids) == texts
    assert tok(" 12 + 7 = ")["input_ids"] == tok("12+7=")["input_ids"]
    assert tok.decode(tok("19")["input_ids"] + [tok.eos_token_id], skip_special_tokens=True) == "19"
    loaded = AutoTokenizer.from_pretrained(world.model_config().name_or_path)
    assert loaded.get_vocab() == tok.get_vocab()
    assert loaded.batch_decode(loaded(texts[:20])["input_ids"]) == texts[:20]


@pytest.mark.parametrize("architecture", ["gpt2", "llama", "qwen2"])
def test_model_configs_build_models_over_the_vocabulary(world, architecture):
    config = world.model_config(architecture)
    assert config.model_type == architecture and config.vocab_size == 17
    assert (config.pad_token_id, config.eos_token_id) == (0, 2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    ids = torch.tensor(world.tokenizer(["67+68=135"])["input_ids"])
    assert model(ids).logits.shape == (1, 9, 17)


def test_sft_on_a_qwen2_shaped_model_writes_characters_of_the_vocabulary(world):
    from prefopt import SFTPolicy

    sft = SFTPolicy(model=world.model_config("qwen2"), batch_size=16, random_state=0)
    sft.fit(world.demonstrations[:64])
    assert sft.max_new_tokens_ == world.max_new_tokens
    samples = [
        c for group in sft.sample(world.eval_prompts[:8], n=2, random_state=0) for c in group
    ]
    assert len(samples) == 16 and all(set(c) <= set("0123456789+-*=") for c in samples)
    assert sft.history_[-1]["loss/sft"] < sft.history_[0]["loss/sft"]


def test_model_config_errors_are_named(world):
    with pytest.raises(ValueError, match="architecture must be one of 'gpt2', 'llama', 'qwen2'"):
        world.model_config("bert")
    with pytest.raises(TypeError, match=r"Unknown GPT2Config parameter\(s\) \['n_layers'\]"):
        world.model_config(n_layers=1)
    with pytest.raises(ValueError, match="n_positions=8 cannot hold.*10 tokens"):
        world.model_config(n_positions=8)
    assert world.model_config(n_layer=1).n_layer == 1


# ----- pass@k -----------------------------------------------------------------------------


def test_pass_at_k_against_hand_numbers():
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3, 2) / C(5, 2) = 1 - 3/10
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # C(7, 5) / C(10, 5)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)  # C(999, 500) / C(1000, 500) = 1/2
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_edge_cases():
    np.testing.assert_array_equal(pass_at_k([8, 8, 8], [0, 8, 7], 2), [0.0, 1.0, 1.0])
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(np.array([[4], [6]]), np.array([1, 2]), 1).shape == (2, 2)
    with pytest.raises(ValueError, match="pass@5 needs at least k=5 samples per problem; got n=4"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c must lie in"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="c must lie in"):
        pass_at_k(4, -1, 1)
    with pytest.raises(ValueError, match="k must be an integer >= 1; got 0"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match="c must hold whole numbers"):
        pass_at_k(4, 1.5, 1)


class CyclePolicy:
    """Samples cycle through a fixed list per prompt; remembers the seeds it was given."""

    def __init__(self, completions):
        self.completions, self.seeds = completions, []

    def sample(self, X, n=1, *, random_state=None):
        self.seeds.append(random_state)
        return [[self.completions[p][i % len(self.completions[p])] for i in range(n)] for p in X]


def test_pass_at_k_scorer_on_a_stub_policy(world):
    # 67+68=: 1 of 4 samples right; 1+2=: 2 of 4; 9+9=: none.
    policy = CyclePolicy({"67+68=": ["135", "1", "2", "3"], "1+2=": ["3", "4"], "9+9=": ["0"]})
    prompts = list(policy.completions)
    reward = world.correctness_reward
    one = make_pass_at_k_scorer(reward, k=1, n_samples=4, random_state=7)
    two = make_pass_at_k_scorer(reward, k=2, n_samples=4)
    assert one(policy, prompts) == pytest.approx((0.25 + 0.5 + 0) / 3)
    assert two(policy, prompts) == pytest.approx((0.5 + 5 / 6 + 0) / 3)  # 1 - C(3,2)/C(4,2), ...
    assert policy.seeds == [7, 0]
    # The answers as y reach the reward as answer=, repeated for each prompt's samples.
    assert one(policy, prompts, ["1", "4", "0"]) == pytest.approx((0.25 + 0.5 + 1) / 3)
    # No reward given: the one the policy was fitted on.
    policy.reward_model_ = reward
    assert make_pass_at_k_scorer(k=1, n_samples=4)(policy, prompts) == one(policy, prompts)
    assert "k=1, n_samples=4" in repr(one)


def test_pass_at_k_scorer_errors(world):
    policy = CyclePolicy({"1+2=": ["3"]})
    with pytest.raises(ValueError, match="Raise n_samples to 8"):
        make_pass_at_k_scorer(world.correctness_reward, k=8, n_samples=4)
    with pytest.raises(TypeError, match="reward must be callable"):
        make_pass_at_k_scorer("correct")
    with pytest.raises(ValueError, match="n_samples must be an integer >= 1"):
        make_pass_at_k_scorer(world.correctness_reward, n_samples=0)

    def no_answer(prompts, completions):
        return np.ones(len(completions))

    scorer = make_pass_at_k_scorer(no_answer, n_samples=2)
    assert scorer(policy, ["1+2="]) == 1.0
    with pytest.raises(TypeError, match="no_answer takes no such keyword"):
        scorer(policy, ["1+2="], ["3"])
    with pytest.raises(ValueError, match="y holds 2 answers for 1 prompts"):
        scorer(policy, ["1+2="], ["3", "4"])


def test_pass_at_k_scorers_as_scoring_in_compare(world):
    from prefopt import GRPOPolicy, SFTPolicy
    from prefopt.model_selection import compare

    sft = SFTPolicy(model=world.model_config(), batch_size=16, random_state=0)
    sft.fit(world.demonstrations[:32])
    scoring = {
        f"pass@{k}": make_pass_at_k_scorer(world.correctness_reward, k=k, n_samples=4)
        for k in (1, 4)
    }
    grpo = GRPOPolicy(model=sft, n_steps=1, batch_size=8, k=2, learning_rate=1e-4)
    result = compare(
        {"GRPO": grpo},
        world.prompts[:8],
        reward_model=world.correctness_reward,
        seeds=2,
        scoring=scoring,
    )
    values = result.results.pivot(index="seed", columns="metric", values="value")
    assert values.columns.tolist() == ["pass@1", "pass@4"] and len(values) == 2
    assert (values["pass@1"] <= values["pass@4"]).all()
    assert values.stack().between(0, 1).all()


# ----- training ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sft(world):
    from prefopt import SFTPolicy

    return SFTPolicy(model=world.model_config(), n_epochs=5, random_state=0).fit(
        world.demonstrations
    )


@pytest.mark.slow
def test_sft_starts_between_ten_and_fifty_percent(world, sft):
    # Slow: the fixture fits SFT for 1,250 steps of 16 demonstrations.
    pass1 = make_pass_at_k_scorer(world.correctness_reward, k=1, n_samples=16, random_state=1234)
    start = pass1(sft, world.eval_prompts)
    assert 0.1 <= start <= 0.5
    fmt = make_reward_scorer(world.format_reward, n_samples=4)(sft, world.eval_prompts)
    assert fmt > 0.95  # it writes numbers and stops


@pytest.mark.slow
def test_grpo_raises_held_out_pass_at_1(world, sft):
    # Slow: 300 steps of 64 episodes. prefopt's default learning rate for tiny models
    # (1e-3) makes held-out pass@1 fall instead (benchmarks/verifiable_world.py), so the
    # rate is the one that raised it on every seed there.
    from prefopt import GRPOPolicy

    grpo = GRPOPolicy(model=sft, n_steps=300, batch_size=64, learning_rate=1e-4, random_state=0)
    grpo.fit(world.dataset, world.correctness_reward)
    pass1 = make_pass_at_k_scorer(world.correctness_reward, k=1, n_samples=16, random_state=1234)
    start, end = pass1(sft, world.eval_prompts), pass1(grpo, world.eval_prompts)
    # The gain at this rate is small: +0.017 to +0.033 over 3 seeds in
    # benchmarks/verifiable_world.csv, +0.019 here (0.342 -> 0.361, a machine with other
    # float rounding than the one that measured +0.03); half the smallest gain seen.
    assert end > start + 0.008, (start, end)
    # Neither KL blow-up nor empty answers: the answers stay well formed.
    assert max(row["objective/kl"] for row in grpo.history_) < 2.0
    fmt = make_reward_scorer(world.format_reward, n_samples=4)(grpo, world.eval_prompts)
    assert fmt > 0.95


def test_the_benchmark_script_runs_quick(capsys):
    import importlib.util
    from pathlib import Path

    from prefopt import GRPOPolicy, RLOOPolicy

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "verifiable_world.py"
    spec = importlib.util.spec_from_file_location("verifiable_world", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.main(["--quick", "--algorithms", "GRPO,RLOO"])
    # "default" is each class's tiny-model rate (benchmarks/LR_SWEEP.md).
    assert table[["algorithm", "learning_rate"]].values.tolist() == [
        ["GRPO", GRPOPolicy.tiny_model_learning_rate],
        ["GRPO", 1e-4],
        ["RLOO", RLOOPolicy.tiny_model_learning_rate],
        ["RLOO", 1e-4],
    ]
    assert (table["start pass@1"] == table["start pass@1"][0]).all()
    assert table[["end pass@1", "end pass@8"]].stack().between(0, 1).all()
    assert (table["end pass@8"] >= table["end pass@1"]).all()
    out = capsys.readouterr().out
    assert "| algorithm | seed | learning_rate |" in out
    assert "GRPO at learning rate 0.0001: held-out pass@1 rose on every seed:" in out


# ----- the scratchpad -----------------------------------------------------------------------


def test_scratchpad_demonstrations_show_the_column_work_then_the_answer():
    pad = ArithmeticWorld(scratchpad=True, n_eval=300, random_state=0)
    plain = ArithmeticWorld(n_eval=300, random_state=0)
    assert pad.prompts == plain.prompts and pad.eval_prompts == plain.eval_prompts
    # Worked by hand: 7+8=15 carries 1 into 4+6+1=11, so 115.
    demos = dict(zip(pad.demonstrations.prompt, pad.demonstrations.completion))
    assert demos["76+55="] == "6+5=11,7+5+1=13,131"
    assert demos["40+7="] == "0+7=7,4+0=4,47"
    for prompt, completion in demos.items():
        assert completion.rpartition(",")[2] == ArithmeticWorld.solve(prompt)
    lengths = pad.demonstrations.completion.str.len() + 1  # characters + EOS = tokens
    assert lengths.min() == 8 and lengths.max() == 20  # "0+0=0,0" ... "9+9=18,9+9+1=19,198"
    assert 16.0 < lengths.mean() < 18.0  # measured 17.28 (seed 0, 4,000 demonstrations)
    assert pad.max_new_tokens == 20
    assert "scratchpad=True" in repr(pad) and "scratchpad" not in repr(plain)


def test_scratchpad_rewards_read_the_answer_after_the_last_step():
    pad = ArithmeticWorld(scratchpad=True, n_eval=300, random_state=0)
    completions = ["7+8=15,4+6+1=11,115", "115", "1+1=9,115", "7+8=15,4+6+1=11,116", "7+8=15,"]
    assert pad.correctness_reward(["47+68="] * 5, completions).tolist() == [1, 1, 1, 0, 0]
    # Format: an integer after a step; the work shown, right or wrong, at any length.
    assert pad.format_reward(["47+68="] * 5, completions).tolist() == [1, 0, 1, 1, 0]
    long = "1+1=2," * 10 + "115"  # longer than any demonstration: still read
    assert pad.correctness_reward(["47+68="], [long]).tolist() == [1.0]


def test_scratchpad_tokenizer_adds_one_character_and_keeps_every_other_id():
    pad = ArithmeticWorld(scratchpad=True, n_eval=300, random_state=0)
    plain = ArithmeticWorld(random_state=0)
    assert len(pad.tokenizer) == len(plain.tokenizer) + 1
    assert {k: pad.tokenizer.get_vocab()[k] for k in plain.tokenizer.get_vocab()} == (
        plain.tokenizer.get_vocab()
    )
    ids = pad.tokenizer("47+68=7+8=15,4+6+1=11,115")["input_ids"]
    assert len(ids) == 25 and pad.tokenizer.decode(ids) == "47+68=7+8=15,4+6+1=11,115"
    config = pad.model_config()
    assert config.vocab_size == len(pad.tokenizer) and config.n_positions == 64
    assert plain.model_config().n_positions == 32


def test_scratchpad_is_for_sums_only():
    with pytest.raises(ValueError, match="column work of sums only.*operations='\\+'"):
        ArithmeticWorld(operations="+-", scratchpad=True, random_state=0)
    with pytest.raises(TypeError, match="scratchpad must be True or False"):
        ArithmeticWorld(scratchpad="yes", random_state=0)


# ----- the sanity check: every RL policy learns what its start half knows -----------------
# prime-rl's sanity check: on problems the start solves 20-80% of the time, a sound method
# at its defaults pushes training accuracy above 95%. The sanity configuration of the world
# (ArithmeticWorld's docstring): 10 training problems of one-digit sums, a one-layer model,
# SFT for 60 epochs on them.
# The budget: 250 steps of each policy's default batch: 64 episodes (16,000 in all), 256
# for GRPO and RLOO (64,000; 14.5 s and 18.2 s of one core on the development machine).
SANITY_STEPS = 250


@pytest.fixture(scope="module")
def sanity():
    from prefopt import SFTPolicy

    world = ArithmeticWorld(n_digits=1, n_eval=90, n_demonstrations=10, random_state=0)
    sft = SFTPolicy(model=world.model_config(n_layer=1), n_epochs=60, random_state=0)
    return world, sft.fit(world.demonstrations)


def training_accuracy(policy, world) -> float:
    """Pass@1 over the training problems: 8 samples of each at the policy's temperature."""
    scorer = make_pass_at_k_scorer(world.correctness_reward, k=1, n_samples=8, random_state=0)
    return scorer(policy, world.prompts, world.answers)


def test_the_sanity_start_solves_between_20_and_80_percent(sanity):
    world, sft = sanity
    assert len(world.prompts) == 10
    # measured 0.362 (8 samples of each of the 10 training problems)
    assert 0.2 <= training_accuracy(sft, world) <= 0.8


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, measured",
    [  # final training accuracy measured at SANITY_STEPS, seed 0 (the threshold is 0.95)
        ("GRPOPolicy", 1.000),
        ("RLOOPolicy", 1.000),  # 0.988 at its old batch of 64
        ("PPOPolicy", 1.000),  # 0.975 at the shared target 0.002 (PPOPolicy's Notes)
        ("ReinforcePolicy", 1.000),
        ("ReinforcePlusPlusPolicy", 0.975),
        ("RAFTPolicy", 1.000),  # 0.900 before it skipped dead groups (RAFTPolicy's Notes)
    ],
)
def test_every_rl_policy_passes_the_sanity_check_at_its_defaults(sanity, name, measured):
    import warnings

    import prefopt
    from prefopt.exceptions import RunHealthWarning

    world, sft = sanity
    policy = getattr(prefopt, name)(model=sft, n_steps=SANITY_STEPS, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunHealthWarning)  # no health warning
        policy.fit(world.prompts, world.correctness_reward)
    assert policy.health_["healthy"]
    assert policy.lr_controller_ is not None  # the default is the adaptive rate
    assert training_accuracy(policy, world) >= 0.95
