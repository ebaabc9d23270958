"""Models and tokenizers as users bring them: no pad token, odd trunk widths, a BOS token.

Each architecture is a tiny model built from its own config class, with a tokenizer
built locally, as the checkpoints that show each case ship them.
"""

import numpy as np
import pytest
import torch
from _tiny import word_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    OPTConfig,
    PreTrainedTokenizerFast,
)

from prefopt import PPOPolicy, RewardModel, RLOOPolicy, SFTPolicy

WORDS = ["the", "movie", "was", "good", "bad", "great", "awful", "plot", "."]
PROMPTS = ["the movie was", "the plot was", "the movie"]
# Completions of different lengths, so every batch has padding after some EOS.
DEMOS = [("the movie was", "good ."), ("the plot was", "great . great .")] * 4
COMPARISONS = [
    ("the movie was", "good .", "bad . bad ."),
    ("the plot was", "great . great .", "awful ."),
] * 4
# The tiny models here rarely stop within a few tokens; that warning is not under test.
pytestmark = pytest.mark.filterwarnings("ignore:.*ended with EOS:RuntimeWarning")


def length_reward(prompts, completions):
    return np.array([float(len(c.split())) for c in completions])


def no_pad_tokenizer():
    """GPT-2, Llama 2/3 and Mistral ship no pad token: only UNK, EOS and words."""
    vocab = {"[UNK]": 0, "</s>": 1}
    for w in WORDS:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>")


def _build(config):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config)


def _gpt2(tok):
    return GPT2Config(
        vocab_size=len(tok), n_positions=32, n_embd=16, n_layer=1, n_head=2, eos_token_id=1
    )


def _llama(tok):
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        eos_token_id=1,
    )


@pytest.mark.parametrize("config", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_vocabulary_exactly_the_models_size_without_pad(config):
    tok = no_pad_tokenizer()
    model = _build(config(tok))
    assert model.config.vocab_size == len(tok) and tok.pad_token is None
    sft = SFTPolicy(
        model=model, tokenizer=tok, n_epochs=2, batch_size=4, max_new_tokens=6, random_state=0
    ).fit(DEMOS)
    # The added pad id is the vocabulary size: one past the last embedding row.
    assert sft.tokenizer_.pad_token_id == len(tok) == model.config.vocab_size
    assert np.isfinite(sft.score(DEMOS))
    assert np.isfinite(sft.log_prob([p for p, _ in DEMOS], [c for _, c in DEMOS])).all()
    assert all(isinstance(c, str) for row in sft.sample(PROMPTS, n=4) for c in row)
    rm = RewardModel(model=sft, normalize_samples=8, random_state=0).fit(COMPARISONS)
    assert np.isfinite(rm.predict(PROMPTS, ["good .", "great . great .", "bad"])).all()
    for policy in (
        RLOOPolicy(model=sft, k=2, batch_size=4, n_steps=2, random_state=0),
        PPOPolicy(model=sft, batch_size=4, n_steps=2, random_state=0),  # values from rm
    ):
        policy.fit(PROMPTS, rm)
        assert all(np.isfinite(list(h.values())).all() for h in policy.history_)
        assert all(isinstance(c, str) for row in policy.sample(PROMPTS, n=2) for c in row)
    RLOOPolicy(model=sft, k=2, batch_size=4, n_steps=1, random_state=0).fit(PROMPTS, length_reward)


def test_heads_sized_from_the_trunks_output_width():
    # OPT projects its last hidden state from hidden_size to word_embed_proj_dim.
    tok = word_tokenizer()
    config = OPTConfig(
        vocab_size=len(tok),
        hidden_size=16,
        word_embed_proj_dim=8,
        ffn_dim=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=32,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = _build(config)
    rm = RewardModel(
        model=model, tokenizer=tok, max_new_tokens=4, normalize_samples=8, random_state=0
    ).fit(COMPARISONS)
    assert rm.model_.head.in_features == 8
    assert np.isfinite(rm.predict(PROMPTS, ["good .", "bad .", "great ."])).all()
    for value_model in (None, "shared"):  # the policy's trunk, copied or shared
        ppo = PPOPolicy(
            model=model,
            tokenizer=tok,
            value_model=value_model,
            max_new_tokens=4,
            batch_size=4,
            n_steps=2,
            random_state=0,
        ).fit(PROMPTS, length_reward)
        assert ppo.value_model_.head.in_features == 8
        assert np.isfinite(ppo.history_[-1]["loss/value"])


def bos_tokenizer(append_eos=False):
    """Llama/Mistral/Gemma-style: the post-processor puts BOS before every text.

    ``append_eos`` also appends EOS after it (as some tokenizers do), which must never
    end up after a prompt.
    """
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2}
    for w in WORDS:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    specials = [("<s>", 1), ("</s>", 2)] if append_eos else [("<s>", 1)]
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>" if append_eos else "<s> $A", special_tokens=specials
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    )


def _record(monkeypatch, owner, name, store):
    """Record the token rows passed to ``owner.name`` (its first argument after self)."""
    original = getattr(owner, name)

    def spy(self, rows, *args, **kwargs):
        store.extend(list(r) for r in rows)
        return original(self, rows, *args, **kwargs)

    monkeypatch.setattr(owner, name, spy)


def _starts_with_one_bos(rows, bos):
    return all(r[0] == bos and bos not in r[1:] for r in rows)


@pytest.mark.parametrize("append_eos", [False, True], ids=["bos", "bos-and-eos"])
def test_prompts_get_bos_once_completions_none(monkeypatch, append_eos):
    import prefopt.rewards._lm as lm_reward
    from prefopt.lm import LanguageModelEstimator

    tok = bos_tokenizer(append_eos)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    assert tok("the movie")["input_ids"][0] == bos  # what the model was trained on
    model = _build(
        LlamaConfig(**{**_llama(tok).to_dict(), "bos_token_id": bos, "eos_token_id": eos})
    )
    prompts, completions = [], []
    _record(monkeypatch, LanguageModelEstimator, "_encode", prompts)
    _record(monkeypatch, LanguageModelEstimator, "_pad_responses", completions)
    # A prompt that already begins with the BOS string keeps exactly one.
    demos = DEMOS + [("<s> the plot was", "bad .")]
    sft = SFTPolicy(
        model=model, tokenizer=tok, n_epochs=1, batch_size=4, max_new_tokens=4, random_state=0
    ).fit(demos)
    sft.sample(PROMPTS + ["<s> the movie"], n=2)
    sft.log_prob([p for p, _ in demos], [c for _, c in demos])
    assert prompts and _starts_with_one_bos(prompts, bos)
    assert all(r[-1] != eos for r in prompts)
    assert completions and all(bos not in r for r in completions)
    assert sft._prompt_prefix() == [bos]  # never the EOS the tokenizer appends

    # The reward model reads BOS + prompt + completion, with no BOS in the completion.
    pairs = []
    original = lm_reward.join_right_padded

    def spy(prompt_rows, response_rows, pad_token_id):
        pairs.extend(zip(prompt_rows, response_rows))
        return original(prompt_rows, response_rows, pad_token_id)

    monkeypatch.setattr(lm_reward, "join_right_padded", spy)
    rm = RewardModel(model=sft, normalize_samples=4, random_state=0).fit(COMPARISONS)
    rm.predict(["the movie was", "<s> the movie was"], ["good .", "bad ."])
    assert pairs and _starts_with_one_bos([p for p, _ in pairs], bos)
    assert all(bos not in r for _, r in pairs if r)
    prompts.clear()
    RLOOPolicy(model=sft, k=2, batch_size=4, n_steps=1, random_state=0).fit(PROMPTS, rm)
    assert prompts and _starts_with_one_bos(prompts, bos)


def test_tokenizers_that_add_nothing_get_no_prefix():
    from prefopt.worlds import PreferenceWorld, ReviewWorld

    for tok in (word_tokenizer(), PreferenceWorld().tokenizer, ReviewWorld().tokenizer):
        sft = SFTPolicy()
        sft.tokenizer_ = tok
        assert sft._prompt_prefix() == []
