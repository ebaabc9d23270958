"""SFT, RewardModel and DPO as users feed them (truncation, implicit prompts, several
messages), and the prompt table's columns in the scorers."""

import numpy as np
import pandas as pd
import pytest

import prefopt
from prefopt import GRPOPolicy, SeedSearchCV
from prefopt.metrics import make_objective_scorer, make_pass_at_k_scorer, make_reward_scorer
from prefopt.model_selection import compare
from prefopt.worlds import PreferenceWorld

# ----- the prompt table's columns reach the scorers' reward ----------------------------


class _Echo:
    """A policy that answers each prompt with its samples 'p0', 'p1', ... (no model)."""

    def sample(self, X, n=1, *, random_state=None):
        return [[f"{p}{j}" for j in range(n)] for p in X]

    def log_prob(self, prompts, completions, *, reference=False):
        return np.zeros(len(prompts))


def _recorder():
    calls = []

    def correct(prompts, completions, answer):
        calls.append((list(prompts), list(completions), list(answer)))
        return np.array([float(c[-1] == "0") for c in completions])

    return correct, calls


def test_reward_and_pass_at_k_scorers_pass_the_answer_column_in_row_order():
    frame = pd.DataFrame({"prompt": ["b", "a", "c"], "answer": ["B", "A", "C"]})
    correct, calls = _recorder()
    assert make_reward_scorer(correct, n_samples=2)(_Echo(), frame) == 0.5
    assert calls[-1] == (
        ["b", "b", "a", "a", "c", "c"],
        ["b0", "b1", "a0", "a1", "c0", "c1"],
        ["B", "B", "A", "A", "C", "C"],
    )
    # pass@1 from 2 samples with one correct: 1/2 per prompt.
    assert make_pass_at_k_scorer(correct, k=1, n_samples=2)(_Echo(), frame) == 0.5
    assert calls[-1][2] == ["B", "B", "A", "A", "C", "C"]
    assert make_objective_scorer(correct, beta=0.1, n_samples=2)(_Echo(), frame) == 0.5
    assert calls[-1][2] == ["B", "B", "A", "A", "C", "C"]
    rows = frame.to_dict("records")
    make_reward_scorer(correct, n_samples=1)(_Echo(), rows)
    assert calls[-1] == (["b", "a", "c"], ["b0", "a0", "c0"], ["B", "A", "C"])


def test_scorers_refuse_a_reward_naming_a_missing_column_before_sampling():
    correct, calls = _recorder()
    with pytest.raises(ValueError, match="takes the argument 'answer', which is not a column"):
        make_reward_scorer(correct)(_Echo(), ["a", "b"])
    with pytest.raises(ValueError, match="takes the argument 'answer'"):
        make_pass_at_k_scorer(correct, n_samples=2)(_Echo(), pd.DataFrame({"prompt": ["a"]}))
    with pytest.raises(ValueError, match="'answer' column and y gives answers too"):
        make_pass_at_k_scorer(correct, n_samples=2)(
            _Echo(), pd.DataFrame({"prompt": ["a"], "answer": ["A"]}), ["A"]
        )
    # y still reaches the reward as answer= for a plain list of prompts.
    assert make_pass_at_k_scorer(correct, n_samples=2)(_Echo(), ["a"], ["A"]) == 0.5
    assert calls[-1][2] == ["A", "A"]


@pytest.fixture(scope="module")
def world():
    prefopt.set_config(show_progress_bar=False)
    return PreferenceWorld(random_state=0)


def _policy(world):
    return small_policy(
        world,
        GRPOPolicy,
        k=2,
        batch_size=4,
        n_steps=1,
        learning_rate=0.1,
        random_state=0,
        on_unhealthy="ignore",
    )


def test_policy_score_and_scorers_in_compare_and_search_get_each_rows_answer(world):
    from sklearn.model_selection import KFold

    prompts = list(world.prompts)[:4]
    frame = pd.DataFrame({"prompt": prompts, "answer": [f"ans{i}" for i in range(4)]})
    frame = frame.sample(frac=1.0, random_state=3).reset_index(drop=True)
    truth = dict(zip(frame.prompt, frame.answer))
    correct, calls = _recorder()

    def check(calls):
        assert calls
        for ps, _, answers in calls:
            assert answers == [truth[p] for p in ps]

    policy = _policy(world).fit(frame, correct)
    calls.clear()
    policy.score(frame)
    check(calls)
    assert len(calls) == 1 and calls[0][0] == list(frame.prompt)
    calls.clear()
    scorer = make_reward_scorer(correct, n_samples=3)
    compare({"g": _policy(world)}, frame, reward_model=correct, seeds=[0], scoring=scorer)
    check(calls)
    assert any(len(ps) == 12 for ps, _, _ in calls)  # the scorer's 3 samples of 4 prompts
    calls.clear()
    search = SeedSearchCV(_policy(world), {"beta": [0.1]}, seeds=1, cv=KFold(2), scoring=scorer)
    search.fit(frame, reward_model=correct)
    check(calls)
    assert any(len(ps) == 6 for ps, _, _ in calls)  # 3 samples of a 2-prompt test fold


# ----- max_length and max_prompt_length ------------------------------------------------
from _tiny import WORDS, small_policy, tiny_lm  # noqa: E402

from prefopt import DPOPolicy, RewardModel, SFTPolicy  # noqa: E402
from prefopt.lm._identity import defining_params  # noqa: E402
from prefopt.rewards._lm import score_token_rows  # noqa: E402

LONG_PROMPT = "the movie was good bad"  # 5 tokens
LONG_COMPLETION = " great awful plot ."  # 4 tokens and the EOS


def _ids(est, text):
    return est.tokenizer_(text, add_special_tokens=False)["input_ids"]


def test_sft_cuts_prompts_from_the_left_and_completions_from_the_right():
    demos = [(LONG_PROMPT, LONG_COMPLETION), ("the plot", " good .")]
    sft = SFTPolicy(model=tiny_lm(), max_length=5, max_prompt_length=3, random_state=0)
    sft.fit(demos)
    eos = sft.tokenizer_.eos_token_id
    (p0, p1), (c0, c1) = sft._demonstration_tokens(*zip(*demos))
    assert p0 == _ids(sft, "was good bad")  # the prompt's end is kept
    assert c0 == _ids(sft, "great awful")  # the completion's start; its EOS is cut off
    assert p1 == _ids(sft, "the plot") and c1 == _ids(sft, "good .") + [eos]  # short rows stay
    assert sft.max_new_tokens_ == 3  # the longest completion kept
    # Only the prompt cut: the completion keeps its EOS.
    sft2 = SFTPolicy(model=tiny_lm(), max_prompt_length=2, random_state=0).fit(demos)
    (p0, _), (c0, _) = sft2._demonstration_tokens(*zip(*demos))
    assert p0 == _ids(sft2, "good bad") and c0 == _ids(sft2, "great awful plot .") + [eos]


def test_over_long_data_is_an_error_naming_max_length_and_fits_with_it():
    prompt = " ".join(WORDS * 4)  # 36 tokens, past the tiny model's context of 32
    demos = [(prompt, " good ."), ("the plot", " bad .")]
    with pytest.raises(ValueError, match=r"row 0 has 39 tokens, .*context of 32.*max_length"):
        SFTPolicy(model=tiny_lm(), random_state=0).fit(demos)
    sft = SFTPolicy(model=tiny_lm(), max_length=16, max_prompt_length=12, random_state=0)
    assert np.isfinite(sft.fit(demos).history_[-1]["loss/sft"])
    assert np.isfinite(sft.score(demos))
    with pytest.raises(ValueError, match="leaves no token of max_length=16 for the completion"):
        SFTPolicy(model=tiny_lm(), max_length=16, random_state=0).fit(demos)
    with pytest.raises(ValueError, match="set max_prompt_length below max_length"):
        SFTPolicy(model=tiny_lm(), max_length=8, max_prompt_length=8).fit(demos)
    comparisons = [(prompt, " good .", " bad ."), ("the plot", " great .", " awful .")]
    with pytest.raises(ValueError, match=r"Comparison at row 0 has 39 tokens.*max_length"):
        DPOPolicy(model=tiny_lm(), max_new_tokens=4, random_state=0).fit(comparisons)
    dpo = DPOPolicy(
        model=tiny_lm(),
        max_length=16,
        max_prompt_length=12,
        max_new_tokens=4,
        n_epochs=1,
        batch_size=2,
        random_state=0,
    ).fit(comparisons)
    assert np.isfinite(dpo.history_[-1]["loss/dpo"]) and 0 <= dpo.score(comparisons) <= 1
    rm = RewardModel(
        model=tiny_lm(),
        max_length=16,
        max_prompt_length=12,
        normalize=False,
        batch_size=2,
        random_state=0,
    ).fit(comparisons)
    assert np.isfinite(rm.history_[-1]["loss/reward"]) and 0 <= rm.score(comparisons) <= 1


def test_reward_model_and_dpo_read_exactly_the_cut_tokens():
    comparisons = [(LONG_PROMPT, LONG_COMPLETION, " bad plot ."), ("the plot", " good", " bad")]
    rm = RewardModel(
        model=tiny_lm(),
        max_length=5,
        max_prompt_length=3,
        normalize=False,
        batch_size=2,
        random_state=0,
    ).fit(comparisons)
    eos = rm.tokenizer_.eos_token_id
    full_p, full_c = _ids(rm, LONG_PROMPT), _ids(rm, LONG_COMPLETION) + [eos]
    cut = score_token_rows(rm, [full_p], [full_c])
    rm.set_params(max_length=None, max_prompt_length=None)
    exact = score_token_rows(rm, [_ids(rm, "was good bad")], [_ids(rm, "great awful")])
    whole = score_token_rows(rm, [full_p], [full_c])
    assert float(cut[0]) == pytest.approx(float(exact[0]), abs=1e-6)
    assert float(cut[0]) != pytest.approx(float(whole[0]), abs=1e-4)

    dpo = DPOPolicy(
        model=tiny_lm(),
        max_length=5,
        max_prompt_length=3,
        max_new_tokens=4,
        n_epochs=1,
        batch_size=2,
        random_state=0,
    ).fit(comparisons)
    lp_cut = dpo.log_prob([LONG_PROMPT], [LONG_COMPLETION], temperature=1.0)
    dpo.set_params(max_length=None, max_prompt_length=None)
    lp_exact = dpo.log_prob(["was good bad"], [_ids(dpo, "great awful")], temperature=1.0)
    lp_whole = dpo.log_prob([LONG_PROMPT], [LONG_COMPLETION], temperature=1.0)
    assert lp_cut[0] == pytest.approx(lp_exact[0], abs=1e-6)
    assert lp_cut[0] != pytest.approx(lp_whole[0], abs=1e-4)


def test_lengths_define_the_run():
    for cls in (SFTPolicy, RewardModel, DPOPolicy):
        a, b = defining_params(cls()), defining_params(cls(max_length=64))
        c = defining_params(cls(max_prompt_length=32))
        assert (
            a["max_length"] != b["max_length"] and a["max_prompt_length"] != c["max_prompt_length"]
        )


# ----- implicit prompts and completions of several messages ----------------------------
import datasets  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast  # noqa: E402

from prefopt.data import check_comparisons  # noqa: E402

ROLES = ["<user>", "<assistant>", "<tool>", "<eot>"]
TEMPLATE = (
    "{%- for m in messages -%}{{ '<' + m['role'] + '> ' + m['content'] + ' <eot> ' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<assistant>' }}{%- endif -%}"
)


def chat_lm(seed=0):
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "</s>", *ROLES, *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        eos_token="</s>",
        chat_template=TEMPLATE,
    )
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=32,
        n_embd=16,
        n_layer=1,
        n_head=2,
        bos_token_id=2,
        eos_token_id=[2, vocab["<eot>"]],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    model.tokenizer = tok
    return model


def msg(role, content):
    return {"role": role, "content": content}


PROMPT = [msg("user", "the movie")]
TOOL_CALL = [msg("assistant", "good"), msg("tool", "bad"), msg("assistant", "great .")]


def test_a_completion_of_several_messages_is_rendered_and_all_of_it_trained():
    sft = SFTPolicy(model=chat_lm(), batch_size=1, random_state=0).fit([(PROMPT, TOOL_CALL)])
    (p,), (c,) = sft._demonstration_tokens([PROMPT], [TOOL_CALL])
    tok = sft.tokenizer_
    assert p == tok.convert_tokens_to_ids(["<user>", "the", "movie", "<eot>", "<assistant>"])
    words = ["good", "<eot>", "<tool>", "bad", "<eot>", "<assistant>", "great", ".", "<eot>"]
    assert c == tok.convert_tokens_to_ids(words)  # ends at its last end of turn
    assert sft.history_[0]["data/tokens"] == 9
    one = [(PROMPT, [msg("assistant", "good")])]  # one assistant message: its content, as before
    assert sft._demonstration_tokens(*zip(*one))[1][0] == tok.convert_tokens_to_ids(
        ["good", "<eot>"]
    )
    with pytest.raises(ValueError, match="several messages.*prompt must be a conversation"):
        SFTPolicy(model=chat_lm()).fit([("the movie", TOOL_CALL)])
    with pytest.raises(ValueError, match="several messages that end with the assistant's"):
        SFTPolicy(model=chat_lm()).fit([(PROMPT, TOOL_CALL[:2])])
    rejected = [msg("assistant", "bad"), msg("tool", "bad"), msg("assistant", "awful .")]
    rm = RewardModel(model=chat_lm(), normalize=False, batch_size=1, random_state=0)
    rm.fit([(PROMPT, TOOL_CALL, rejected)])
    assert np.isfinite(rm.predict([PROMPT], [TOOL_CALL])).all()
    dpo = DPOPolicy(model=chat_lm(), max_new_tokens=4, batch_size=1, n_epochs=1, random_state=0)
    dpo.fit([(PROMPT, TOOL_CALL, rejected)])
    # The trained log-prob is the sum over every completion token (with the last end of turn).
    lp = dpo.log_prob([PROMPT], [TOOL_CALL], temperature=1.0)
    ids = dpo.tokenizer_.convert_tokens_to_ids(words)
    assert lp[0] == pytest.approx(dpo.log_prob([PROMPT], [ids], temperature=1.0)[0], abs=1e-6)


def _implicit_rows():
    second = [msg("user", "the plot")]
    return [
        {
            "chosen": PROMPT + [msg("assistant", "good .")],
            "rejected": PROMPT + [msg("assistant", "bad")],
        },
        {"chosen": second + TOOL_CALL, "rejected": second + [msg("assistant", "awful .")]},
    ]


def test_implicit_prompt_conversations_from_rows_a_frame_and_a_dataset():
    rows = _implicit_rows()
    explicit = check_comparisons(
        [
            (PROMPT, [msg("assistant", "good .")], [msg("assistant", "bad")]),
            ([msg("user", "the plot")], TOOL_CALL, [msg("assistant", "awful .")]),
        ]
    )
    dataset = datasets.Dataset.from_list(rows)
    for X in (rows, dataset, dataset.to_pandas()):
        got = check_comparisons(X)
        assert (got.prompt, got.chosen, got.rejected) == (
            explicit.prompt,
            explicit.chosen,
            explicit.rejected,
        )
    # Fitted on the implicit and explicit forms, the same run.
    kw = dict(normalize=False, batch_size=2, random_state=0)
    a = RewardModel(model=chat_lm(), **kw).fit(dataset)
    b = RewardModel(model=chat_lm(), **kw).fit(explicit)
    assert a.history_[0]["loss/reward"] == b.history_[0]["loss/reward"]
    kw = dict(max_new_tokens=4, batch_size=2, n_epochs=1, random_state=0)
    a = DPOPolicy(model=chat_lm(), **kw).fit(rows)
    b = DPOPolicy(model=chat_lm(), **kw).fit(explicit)
    assert a.history_[0]["loss/dpo"] == b.history_[0]["loss/dpo"]


def test_implicit_prompt_texts_follow_trls_rule():
    frame = pd.DataFrame(
        {
            "chosen": ["the movie was good .", "the plot"],
            "rejected": ["the movie was bad", "the plot ."],
        }
    )
    got = check_comparisons(frame)
    # Cut where they first differ; the space before goes with the completions; when one text
    # is the other's start, the prompt ends one character before the shorter one does.
    assert got.prompt == ["the movie was", "the plo"]
    assert got.chosen == [" good .", "t"] and got.rejected == [" bad", "t ."]
    assert check_comparisons(datasets.Dataset.from_pandas(frame)).prompt == got.prompt
    kw = dict(max_new_tokens=4, batch_size=2, n_epochs=1, random_state=0)
    a = DPOPolicy(model=tiny_lm(), **kw).fit(frame.iloc[:1])
    b = DPOPolicy(model=tiny_lm(), **kw).fit([("the movie was", " good .", " bad")])
    assert a.history_[0]["loss/dpo"] == b.history_[0]["loss/dpo"]


@pytest.mark.parametrize(
    ("chosen", "rejected", "error", "match"),
    [
        ("good", "bad", ValueError, "they share none"),
        (" good", " bad", ValueError, "they share none"),  # only a space: no prompt
        ("same", "same", ValueError, "identical at row 0"),
        (
            PROMPT + [msg("assistant", "a")],
            PROMPT + [msg("assistant", "a")],
            ValueError,
            "identical",
        ),
        (PROMPT, PROMPT + [msg("assistant", "a")], ValueError, "leave no messages"),
        ([msg("user", "a")], [msg("user", "b")], ValueError, "share no leading message"),
        ("the movie", PROMPT, TypeError, "both be texts or both conversations"),
    ],
)
def test_implicit_prompt_errors(chosen, rejected, error, match):
    with pytest.raises(error, match=match):
        check_comparisons([{"chosen": chosen, "rejected": rejected}])
