"""Conversational data (TRL's format) and chat models' stop tokens."""

import datasets
import numpy as np
import pytest
import torch
from _tiny import bos_tokenizer, tiny_lm
from transformers import GPT2Config, GPT2LMHeadModel

from prefopt import RewardModel, RLOOPolicy, SFTPolicy
from prefopt.backend import EncodedPrompts, make_generator, sample, truncate_after_eos
from prefopt.data import check_comparisons, check_prompts
from prefopt.metrics import make_win_rate_scorer
from prefopt.worlds import ReviewWorld


def user(text):
    return [{"role": "user", "content": text}]


def assistant(text):
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def world():
    return ReviewWorld(n_reviews=120, chat=True, random_state=0)


@pytest.fixture(scope="module")
def sft(world):
    config = world.model_config(n_layer=1, n_embd=16, n_head=2)
    demonstrations = datasets.Dataset.from_pandas(world.demonstrations)
    return SFTPolicy(model=config, batch_size=32, learning_rate=3e-3, random_state=0).fit(
        demonstrations
    )


def ids(world, *tokens):
    return [world.tokenizer.convert_tokens_to_ids(t) for t in tokens]


# ----- the path end to end ---------------------------------------------------------------
def test_conversational_dataset_through_sft_reward_model_and_rloo(world, sft):
    eos, eot = ids(world, "</s>", "<eot>")
    assert sft.stop_token_ids_ == [eos, eot]  # the model config's EOS list
    # A prompt goes through the chat template with its generation prompt; an assistant
    # turn ends with the template's end of turn, a text completion with EOS.
    prompt_ids = sft._tokenize_prompts([user("the movie was")])[0]
    assert prompt_ids == ids(world, "<user>", "the", "movie", "was", "<assistant>")
    turn, text = sft._completion_tokens([" good .", " good ."], prompts=[user("x"), "x"])
    assert turn[-1] == eot and text[-1] == eos

    samples = sft.sample(world.prompts[:3], n=2)
    assert all(isinstance(c, str) and "<eot>" not in c for row in samples for c in row)
    comparisons = world.comparisons(sft, 16, random_state=0)
    data = datasets.Dataset.from_dict(
        {
            "prompt": list(comparisons.prompt),
            "chosen": [assistant(c) for c in comparisons.chosen],
            "rejected": [assistant(c) for c in comparisons.rejected],
        }
    )
    rm = RewardModel(model=sft, batch_size=8, normalize_samples=8, random_state=0).fit(data)
    assert 0.0 <= rm.score(data) <= 1.0
    # The reward reads the sequence at the turn's end, whichever way it is given.
    conversation, completion = world.prompts[0], " was good ."
    as_text = rm.predict([conversation], [completion])
    as_message = rm.predict([conversation], [assistant(completion)])
    prompt = rm._prompt_tokens([conversation])[0]
    response = torch.tensor([rm.tokenizer_(completion)["input_ids"] + [eot]])
    as_tokens = rm.score_tokens(
        EncodedPrompts(torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long)),
        response,
        torch.ones_like(response),
    )
    assert as_text[0] == as_message[0] == pytest.approx(float(as_tokens[0]), abs=1e-6)

    prompts = datasets.Dataset.from_dict({"prompt": world.prompts[:4]})
    policy = RLOOPolicy(
        model=sft, k=2, batch_size=4, n_steps=2, min_eos_share=None, random_state=0
    ).fit(prompts, rm)
    assert policy.stop_token_ids_ == [eos, eot]
    assert all(np.isfinite(list(row.values())).all() for row in policy.history_)
    assert np.isfinite(policy.score(prompts, rm))
    assert isinstance(policy.predict(world.prompts[:2])[0], str)
    lp = policy.log_prob([conversation] * 2, [assistant(" was good ."), " was good ."])
    assert lp[0] == pytest.approx(lp[1])  # one assistant message is its content


def test_reward_callable_receives_messages_as_given(world, sft):
    seen = []

    def reward(prompts, completions):
        seen.append((list(prompts), list(completions)))
        return np.array([float(len(c.split())) for c in completions])

    prompts = [user("the movie was"), user("this phone")]
    policy = RLOOPolicy(model=sft, k=2, batch_size=4, n_steps=1, random_state=0)
    policy.fit(prompts, reward)
    assert np.isfinite(policy.score(prompts, reward))
    assert seen[-1][0] == prompts  # score: one completion per prompt
    for given, completions in seen:
        assert all(p in prompts for p in given)
        assert all(isinstance(c, str) and "<eot>" not in c for c in completions)
    # A win rate against conversational references finds their prompts.
    judge = lambda prompt, completion, reference: len(completion) - len(reference)  # noqa: E731
    scorer = make_win_rate_scorer(judge, world.references[:3])
    assert 0.0 <= scorer(policy, world.prompts[:3]) <= 1.0


def test_conversational_tables_and_rows_are_read():
    rows = [
        {"prompt": user("the movie"), "chosen": assistant("good ."), "rejected": assistant("bad")},
        {"prompt": "the plot", "chosen": " great .", "rejected": " awful ."},
    ]
    frame = datasets.Dataset.from_list(rows[:1]).to_pandas()  # numpy arrays of dicts
    for data in (rows[:1], frame, datasets.Dataset.from_list(rows[:1])):
        c = check_comparisons(data)
        assert (c.prompt, c.chosen, c.rejected) == ([user("the movie")], ["good ."], ["bad"])
    assert check_comparisons(rows).prompt == [user("the movie"), "the plot"]  # mixed rows
    assert check_prompts(rows) == [user("the movie"), "the plot"]  # rows with a prompt key
    assert check_prompts(frame) == [user("the movie")]


# ----- errors ------------------------------------------------------------------------------
def test_missing_chat_template_names_the_row_and_the_fix():
    demos = [("the movie was", "good ."), (user("the plot was"), assistant("bad ."))]
    with pytest.raises(ValueError, match=r"prompt at row 1 is a conversation.*chat_template"):
        SFTPolicy(model=tiny_lm(), max_new_tokens=3, random_state=0).fit(demos)
    sft = SFTPolicy(model=tiny_lm(), max_new_tokens=3, random_state=0).fit(demos[:1])
    with pytest.raises(ValueError, match=r"row 2 .*tokenizer.chat_template"):
        sft.sample(["the movie", "the plot", user("the plot")])


def test_conversation_rows_are_checked():
    with pytest.raises(TypeError, match=r"row 0 is a conversation whose message 0"):
        SFTPolicy(model=tiny_lm()).fit([([{"role": "user"}], "good .")])
    with pytest.raises(ValueError, match=r"completion at row 0 .*one assistant message"):
        SFTPolicy(model=tiny_lm()).fit([(user("the movie"), user("good ."))])
    with pytest.raises(TypeError, match="one conversation"):
        RLOOPolicy(model=tiny_lm()).fit(user("the movie"), lambda p, c: np.zeros(len(c)))


# ----- stop tokens -------------------------------------------------------------------------
class Scripted(torch.nn.Module):
    """Emits a fixed token sequence per prompt (keyed by its last token), without a cache."""

    def __init__(self, scripts, vocab=16):
        super().__init__()
        self.scripts, self.vocab, self.calls = scripts, vocab, 0

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        self.calls += 1
        n, length = input_ids.shape
        logits = torch.zeros(n, length, self.vocab)
        for i in range(n):
            script = self.scripts[int(input_ids[i, 0])]
            logits[i, -1, script[length - 1]] = 100.0
        return type("Out", (), {"logits": logits})()


def test_any_stop_id_ends_sampling_and_truncation():
    prompts = EncodedPrompts(torch.tensor([[10], [11]]), torch.ones(2, 1, dtype=torch.long))
    scripts = {10: [5, 3, 5, 5], 11: [6, 7, 4, 5]}
    model = Scripted(scripts)
    kwargs = dict(max_new_tokens=4, temperature=1.0, generator=make_generator(0))
    out = sample(model, prompts, eos_token_id=[3, 4], **kwargs)
    assert model.calls == 3  # every row had ended after 3 tokens: no fourth pass
    assert out.tolist() == [[5, 3, 5, 3], [6, 7, 4, 3]]  # the rest filled with the first id
    model.calls = 0
    assert sample(model, prompts, eos_token_id=3, **kwargs).tolist() == [[5, 3, 5, 5], scripts[11]]
    assert model.calls == 4
    ids, mask, ended = truncate_after_eos(torch.tensor([[5, 4, 3, 6], [6, 7, 8, 9]]), [3, 4], 0)
    assert ids.tolist() == [[5, 4, 0, 0], [6, 7, 8, 9]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]] and ended.tolist() == [True, False]


def test_every_stop_id_counts_for_the_missing_eos_reward_and_the_reward_position():
    model = tiny_lm(seed=1)
    tok = model.tokenizer
    stops = [tok.eos_token_id, tok.convert_tokens_to_ids(".")]
    policy = RLOOPolicy(
        model=model, k=4, batch_size=16, n_steps=1, max_new_tokens=6, stop_token_ids=stops,
        random_state=0,
    )  # fmt: skip
    policy.fit(["the movie was", "the plot"], lambda p, c: np.full(len(c), 5.0))
    batch = policy._loop.rollout(np.array([0, 1, 0, 1]))  # the fit's loop, one more rollout
    last = batch.response_mask.sum(1) - 1
    last_tokens = batch.response_ids[torch.arange(len(batch)), last]
    contains = torch.isin(batch.response_ids * batch.response_mask, torch.tensor(stops))
    assert torch.equal(batch.ended, contains.any(1))
    assert torch.equal(batch.ended, torch.isin(last_tokens, torch.tensor(stops)))
    assert (last_tokens[batch.ended] == stops[1]).any()  # some end with the second id
    assert (~batch.ended).any()
    assert torch.equal(batch.scores, torch.where(batch.ended, 5.0, -1.0))
    # The score sits at the stop token (the last real one) of each response.
    shaped = batch.rewards + batch.beta * batch.kl
    assert torch.allclose(shaped[torch.arange(len(batch)), last], batch.scores)


def test_stop_token_ids_override_the_generation_config():
    model = tiny_lm()
    tok = model.tokenizer
    eos, dot = tok.eos_token_id, tok.convert_tokens_to_ids(".")
    demos = [("the movie was", "good ."), ("the plot was", "bad .")]
    default = SFTPolicy(model=model, random_state=0).fit(demos)
    assert default.stop_token_ids_ == [eos]
    sft = SFTPolicy(model=model, stop_token_ids=[dot], random_state=0).fit(demos)
    assert sft.stop_token_ids_ == [dot]
    assert sft._completion_tokens(["good"])[0][-1] == dot  # the EOS does not stop: not appended
    assert sft.model_.generation_config.eos_token_id == [dot]
    # A policy started from it stops there too (and at the tokenizer's EOS); its own
    # stop_token_ids win.
    reward = lambda p, c: np.zeros(len(c))  # noqa: E731
    kwargs = dict(k=2, batch_size=2, n_steps=1, random_state=0)
    assert RLOOPolicy(model=sft, **kwargs).fit(["the"], reward).stop_token_ids_ == [eos, dot]
    policy = RLOOPolicy(model=sft, stop_token_ids=eos, **kwargs).fit(["the"], reward)
    assert policy.stop_token_ids_ == [eos]
    for bad in ([], [len(tok) + 5], [tok.pad_token_id], ["."]):
        with pytest.raises(ValueError, match="stop_token_ids"):
            SFTPolicy(model=model, stop_token_ids=bad).fit(demos)


def test_generation_config_ids_join_the_tokenizers_eos_if_the_model_has_them():
    model = tiny_lm()
    tok = model.tokenizer
    eos, dot = tok.eos_token_id, tok.convert_tokens_to_ids(".")
    model.generation_config.eos_token_id = [dot, eos, 50256]  # 50256: past the vocabulary
    rm = RewardModel(model=model, normalize=False, random_state=0)
    rm.fit([("the movie", "good .", "bad .")])
    assert rm.stop_token_ids_ == [eos, dot]


# ----- BOS ---------------------------------------------------------------------------------
@pytest.mark.parametrize("writes_bos", [True, False], ids=["template-bos", "no-bos"])
def test_templated_prompts_get_no_second_bos(writes_bos):
    body = "{% for m in messages %}<u> {{ m['content'] }} {% endfor %}<a>"
    tok = bos_tokenizer(("{{ bos_token }} " if writes_bos else "") + body)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = GPT2Config(
            vocab_size=len(tok), n_positions=32, n_embd=16, n_layer=1, n_head=2, eos_token_id=3
        )
        model = GPT2LMHeadModel(config)
    demos = [(user("the movie"), assistant("good .")), ("the plot", "bad .")]
    sft = SFTPolicy(model=model, tokenizer=tok, max_new_tokens=3, random_state=0).fit(demos)
    chat, text = sft._tokenize_prompts([user("the movie"), "the plot"])
    words = tok.convert_tokens_to_ids(["<u>", "the", "movie", "<a>"])
    assert chat == ([2] if writes_bos else []) + words  # the template decides BOS
    assert text == tok.convert_tokens_to_ids(["<s>", "the", "plot"])  # text: BOS once
    assert sft._prompt_tokens([user("the movie")]) == [chat]  # the reward model's reading
