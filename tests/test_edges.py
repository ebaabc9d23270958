"""Silent failures at the edges: concurrent fits, LoRA seeds, log_prob and sample inputs."""

import threading

import numpy as np
import pytest
import torch
from _tiny import bos_tokenizer, tiny_lm
from sklearn.base import clone

from prefopt import DPOPolicy, GRPOPolicy, PPOPolicy, RewardModel, RLOOPolicy, SFTPolicy
from prefopt.worlds import PreferenceWorld

PROMPTS = ["the movie was", "the plot was"]
DEMOS = [("the movie was", "good ."), ("the plot was", "great .")] * 4
COMPARISONS = [("the movie was", "good .", "bad ."), ("the plot was", "great .", "awful .")] * 4
LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"]}


def reward(prompts, completions):
    return np.array([c.count("good") - c.count("bad") for c in completions], dtype=float)


# ----- one fit at a time -------------------------------------------------------------------
def _hold_inside_fit(monkeypatch, estimator, method):
    """Make ``estimator.<method>`` (called early in fit) wait until released."""
    entered, release = threading.Event(), threading.Event()
    original = getattr(estimator, method)

    def held(*args, **kwargs):
        entered.set()
        assert release.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setattr(estimator, method, held)
    return entered, release


def _fit_in_two_threads(estimator, data, entered, release, monkeypatch, method):
    outcome = {}

    def first():
        try:
            estimator.fit(data)
            outcome["first"] = "fitted"
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            outcome["first"] = repr(error)

    thread = threading.Thread(target=first)
    thread.start()
    assert entered.wait(60)
    with pytest.raises(RuntimeError, match=rf"This {type(estimator).__name__} is already being"):
        estimator.fit(data)
    release.set()
    thread.join(120)
    assert outcome == {"first": "fitted"}
    # The guard ends with the first fit: the same object fits again in this thread.
    monkeypatch.undo()
    return estimator.fit(data)


@pytest.mark.parametrize(
    "make, data, method",
    [
        (lambda: SFTPolicy(model=tiny_lm(), batch_size=4, random_state=0), DEMOS, "_init_model"),
        (
            lambda: DPOPolicy(model=tiny_lm(), batch_size=4, max_new_tokens=3, random_state=0),
            COMPARISONS,
            "_init_model",
        ),
        (
            lambda: RewardModel(model=tiny_lm(), batch_size=4, normalize=False, random_state=0),
            COMPARISONS,
            "_load_lm",
        ),
    ],
    ids=["sft", "dpo", "reward_model"],
)
def test_second_thread_fitting_the_same_object_is_refused(monkeypatch, make, data, method):
    estimator = make()
    entered, release = _hold_inside_fit(monkeypatch, estimator, method)
    fitted = _fit_in_two_threads(estimator, data, entered, release, monkeypatch, method)
    # Nothing mixed: the run is a fresh fit's, step for step.
    fresh = clone(estimator).fit(data)
    assert fitted.n_iter_ == fresh.n_iter_ > 0
    assert _same_losses(fitted.history_, fresh.history_)


def _same_losses(a, b):
    keys = [k for k in a[0] if k.startswith("loss/")]  # not the timings
    assert keys
    return [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]


def test_linear_reward_model_partial_fit_is_guarded_too():
    world = PreferenceWorld(random_state=0)
    entered, release = threading.Event(), threading.Event()

    def slow_features(prompts, completions):
        entered.set()
        assert release.wait(60)
        return world.features(prompts, completions)

    rm = RewardModel(features=world.features).fit(world.comparisons(50, random_state=0))
    rm.featurizer_ = slow_features
    thread = threading.Thread(target=rm.partial_fit, args=(world.comparisons(50, random_state=1),))
    thread.start()
    assert entered.wait(60)
    with pytest.raises(RuntimeError, match="already being fitted"):
        rm.fit(world.comparisons(50, random_state=2))
    release.set()
    thread.join(60)
    assert rm.n_comparisons_ == 100


# ----- LoRA adapters from random_state -----------------------------------------------------
def _adapter(policy):
    return {n: p.detach().clone() for n, p in policy.model_.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("cls", [RLOOPolicy, GRPOPolicy, PPOPolicy])
def test_lora_adapter_follows_random_state_not_the_global_seed(cls):
    pytest.importorskip("peft")
    params = dict(
        model=tiny_lm(), batch_size=4, max_new_tokens=3, n_steps=1, lora=LORA, random_state=3
    )
    if cls is not PPOPolicy:
        params["k"] = 2
    torch.manual_seed(100)
    first = _adapter(cls(**params).fit(PROMPTS, reward))
    torch.manual_seed(200)
    state = torch.get_rng_state()
    second = _adapter(cls(**params).fit(PROMPTS, reward))
    assert torch.equal(torch.get_rng_state(), state)  # the global generator was not drawn
    assert first.keys() == second.keys() and any("lora_A" in n for n in first)
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=0)
    other = _adapter(cls(**{**params, "random_state": 4}).fit(PROMPTS, reward))
    assert not all(torch.equal(first[n], other[n]) for n in first if "lora_A" in n)


# ----- log_prob and sample inputs ----------------------------------------------------------
@pytest.fixture(scope="module")
def sft():
    return SFTPolicy(model=tiny_lm(), batch_size=4, random_state=0).fit(DEMOS)


@pytest.mark.parametrize("temperature", [0, 0.0, -0.5, float("nan"), float("inf"), "1", True])
def test_log_prob_refuses_a_temperature_that_is_not_positive_and_finite(sft, temperature):
    with pytest.raises(
        ValueError, match=rf"temperature must be a finite number > 0.*{temperature!r}"
    ):
        sft.log_prob(["the movie was"], ["good ."], temperature=temperature)


def test_log_prob_at_temperature_two_is_the_tempered_softmax(sft):
    # log softmax(z / 2) over the tokens but pad, summed over the completion, by hand.
    tok = sft.tokenizer_
    prompt = tok("the movie was")["input_ids"]
    completion = tok("good .")["input_ids"] + [tok.eos_token_id]
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = sft.model_(ids).logits[0, len(prompt) - 1 : -1] / 2.0
    logits[:, tok.pad_token_id] = -float("inf")  # never sampled, so outside the distribution
    by_hand = torch.log_softmax(logits.double(), -1)[range(len(completion)), completion].sum()
    got = sft.log_prob(["the movie was"], ["good ."], temperature=2.0)
    assert got[0] == pytest.approx(float(by_hand), abs=1e-5)


def test_log_prob_of_a_completion_past_the_context_names_the_row(sft):
    long = " ".join(["good"] * 40)  # 40 tokens + EOS after a 3-token prompt; context 32
    with pytest.raises(
        ValueError, match=r"row 1 have 3 \+ 41 tokens, more than the model's context of 32"
    ):
        sft.log_prob(["the plot was"] * 2, ["good .", long])
    assert sft.log_prob(["the plot was"], [" ".join(["good"] * 28)]).shape == (1,)  # 3 + 29


def test_sample_from_non_finite_weights_is_refused_with_the_tensor_named(sft):
    broken = SFTPolicy(**sft.get_params()).fit(DEMOS)
    with torch.no_grad():
        broken.model_.transformer.h[1].mlp.c_fc.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"not finite.*'transformer\.h\.1\.mlp\.c_fc\.weight'"):
        broken.sample(PROMPTS, n=2)
    assert len(sft.sample(PROMPTS, n=2)[0]) == 2  # the healthy one still samples


# ----- the reward the loop trains on is the reward model's prediction -----------------------
CHAT = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}{{ '<u> ' + m['content'] + ' ' }}"
    "{%- else -%}{{ '<a> ' + m['content'] + ' </s> ' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<a>' }}{%- endif -%}"
)


def _lm(tokenizer, seed):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=32, n_embd=16, n_layer=1, n_head=2,
        bos_token_id=2, eos_token_id=3,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT2LMHeadModel(config)


@pytest.mark.parametrize("policy_bos, reward_bos", [(True, False), (False, True), (True, True)])
def test_loop_reward_equals_predict_across_bos_rules_and_cut_responses(policy_bos, reward_bos):
    from prefopt.backend import make_generator
    from prefopt.policies.loop._rollout import score_responses

    rm_tok, policy_tok = bos_tokenizer(CHAT, reward_bos), bos_tokenizer(CHAT, policy_bos)
    rm = RewardModel(
        model=_lm(rm_tok, 1),
        tokenizer=rm_tok,
        batch_size=4,
        normalize_samples=8,
        max_new_tokens=4,
        random_state=0,
    ).fit(COMPARISONS)
    chat = [{"role": "user", "content": "the plot was"}]
    prompts = ["the movie was", chat, "good", chat] * 8
    policy = RLOOPolicy(
        model=_lm(policy_tok, 2),
        tokenizer=policy_tok,
        k=2,
        batch_size=4,
        n_steps=1,
        max_new_tokens=6,
        temperature=3.0,  # a flat distribution: some responses end, some are cut
        missing_eos_reward=None,  # a cut response keeps its own score
        learning_rate=1e-12,
        random_state=0,
    ).fit(prompts[:4], rm)
    assert policy._loop.scores_tokens  # the loop takes the token-id path: same vocabulary
    encoded = policy._encode(policy._tokenize_prompts(prompts))
    ids, mask, ended = policy._generate(encoded, make_generator(11))
    assert 0 < int(ended.sum()) < len(prompts)  # both ended and cut responses
    trained_on = score_responses(policy._loop.rollouts, prompts, encoded, ids, mask, ended).numpy()
    reported = rm.predict(prompts, policy._decode(ids, mask))
    np.testing.assert_allclose(trained_on, reported, rtol=0, atol=1e-5)


# ----- seeds, scorers and comparisons ------------------------------------------------------
def _world_rloo():
    from prefopt.worlds import PreferenceWorld

    world = PreferenceWorld(random_state=0)
    rm = RewardModel().fit(world.comparisons(200, random_state=0))
    policy = RLOOPolicy(
        model=world.policy_model(), learning_rate=1.0, optimizer="sgd", n_steps=2, batch_size=8
    )
    return world, rm, policy


@pytest.mark.parametrize(
    "seeds, error, match",
    [
        ([3, 2**32], ValueError, r"seeds must be in \[0, 2\*\*32\).*4294967296"),
        ([-1, 4], ValueError, r"seeds must be in \[0, 2\*\*32\).*-1"),
        ([0, 2.0], TypeError, r"seeds must be integers; got 2.0 \(float\)"),
        ([np.float64(7.5)], TypeError, r"got np.float64\(7.5\)|got 7.5"),
        ([True, 1], TypeError, "seeds must be integers; got True"),
    ],
)
def test_seed_lists_are_checked_before_any_fit(seeds, error, match):
    from prefopt.model_selection import SeedSearchCV, compare

    world, rm, policy = _world_rloo()
    with pytest.raises(error, match=match):
        SeedSearchCV(policy, {"beta": [0.1]}, seeds=seeds).fit(world.prompts, rm)
    with pytest.raises(error, match=match):
        compare({"a": policy}, world.prompts, reward_model=rm, seeds=seeds)
    assert not hasattr(policy, "model_")


def test_seed_search_scorer_sees_the_fitted_models_not_wrappers():
    from prefopt.model_selection import SeedSearchCV

    world, rm, policy = _world_rloo()
    seen = []

    def scorer(estimator, X, y=None):
        seen.append((type(estimator.model_), type(estimator.reward_model_), estimator.n_iter_))
        return float(estimator.score(X, rm))  # methods still run under the caller's config

    SeedSearchCV(policy, {"beta": [0.1]}, seeds=[5, 6], scoring=scorer, refit=False).fit(
        world.prompts, rm
    )
    assert seen and all(
        issubclass(model, torch.nn.Module) and reward is RewardModel and n == 2
        for model, reward, n in seen
    )


def test_compare_with_a_metric_nan_on_every_seed_reports_nan_and_warns():
    from prefopt.model_selection import compare

    world, rm, policy = _world_rloo()
    scoring = {"reward": lambda est, X, y=None: est.score(X, rm), "broken": lambda *a: np.nan}
    with pytest.warns(
        RuntimeWarning, match=r"'broken' of 'rloo' is NaN on every seed \(\[0, 1\]\)"
    ):
        out = compare(
            {"rloo": policy, "again": clone(policy)},
            world.prompts,
            reward_model=rm,
            seeds=2,
            scoring=scoring,
            baseline="rloo",
        )
    summary = out.summary.set_index(["algorithm", "metric"])
    assert summary.loc[("rloo", "broken"), "n_seeds"] == 2
    assert np.isnan(summary.loc[("rloo", "broken"), "mean"])
    assert np.isnan(summary.loc[("again", "broken"), "p_value"])
    # The finite metric is summarised as before: the same runs, so a zero difference.
    assert np.isfinite(summary.loc[("rloo", "reward"), "mean"])
    assert summary.loc[("again", "reward"), "diff_mean"] == 0.0


# ----- a chat template whose end of turn the model's config does not list ------------------
def test_template_end_of_turn_missing_from_the_eos_ids_becomes_a_stop_token():
    from _tiny import WORDS
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, "</s>": 2, "<|user|>": 3, "<|assistant|>": 4, "<|end|>": 5}
    for word in WORDS:
        vocab[word] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    template = (
        "{% for m in messages %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' <|end|> ' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        eos_token="</s>",
        chat_template=template,
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    # A base model's config: its only EOS is </s> (id 2), not the template's <|end|> (5).
    config = GPT2Config(
        vocab_size=len(tok), n_positions=32, n_embd=16, n_layer=1, n_head=2, eos_token_id=2
    )
    demos = [
        ([{"role": "user", "content": "the movie"}], [{"role": "assistant", "content": "good ."}]),
        ("the plot", " bad ."),
    ] * 2
    sft = SFTPolicy(model=GPT2LMHeadModel(config), tokenizer=tok, max_new_tokens=3, batch_size=4)
    sft.fit(demos)
    assert sft.stop_token_ids_ == [2, 5]
    turn, text = sft._completion_tokens(["good .", "good ."], prompts=[demos[0][0], "x"])
    assert turn[-1] == 5 and text[-1] == 2  # an assistant turn ends at <|end|>, text at </s>
    # Given explicitly, the stop ids are the caller's alone.
    only_eos = SFTPolicy(**{**sft.get_params(), "stop_token_ids": [2]}).fit(demos)
    assert only_eos.stop_token_ids_ == [2]
