"""A policy's ``save_pretrained`` folder loads and pads in transformers (prefopt/lm/_export.py).

TRL is not installed in the test environment; its trainers embed the pad id as transformers'
``pipeline`` does on a padded batch, which is what these tests exercise.
"""

import pytest
import torch
import transformers
from _tiny import tiny_config, word_tokenizer
from packaging.version import Version
from tokenizers import processors
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2LMHeadModel, pipeline

from prefopt import SFTPolicy

DEMOS = [
    ("the movie was", "good ."),
    ("the movie was", "bad ."),
    ("the plot was", "great ."),
    ("the plot was", "awful ."),
] * 6
# Of different lengths, so that a batch of them is padded.
PROMPTS = ["the movie was", "the plot was", "the movie was good", "the"]


def _model(pad: bool, bos: bool):
    """A tiny GPT-2; without a pad token prefopt adds one past the embedding rows."""
    tokenizer = word_tokenizer(pad=pad)
    if bos:  # a tokenizer that puts BOS in front of every text, as Llama's does
        tokenizer.add_special_tokens({"bos_token": "<s>"})
        bos_id = tokenizer.convert_tokens_to_ids("<s>")
        tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", bos_id)]
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(tiny_config(tokenizer))
    model.tokenizer = tokenizer
    return model


@pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.25"),
    reason="checked at the locked transformers (5.25); at 5.15, the oldest supported, the "
    "text-generation pipeline cuts the prompt off by characters (misplaced by a word-level "
    "tokenizer's spacing) and one completion ran a word past the generation config's "
    "max_new_tokens",
)
@pytest.mark.parametrize("pad, bos", [(True, False), (False, True)])
def test_exported_folder_gives_predict_in_a_transformers_pipeline(tmp_path, pad, bos):
    sft = SFTPolicy(model=_model(pad, bos), learning_rate=1e-2, n_epochs=2, random_state=0)
    sft.fit(DEMOS)
    rows = sft.model_.get_input_embeddings().num_embeddings
    pad_id = sft.tokenizer_.pad_token_id
    assert (pad_id >= rows) == (not pad)  # the case that crashed TRL: [PAD] past the rows
    sft.save_pretrained(tmp_path)
    assert sft.model_.get_input_embeddings().num_embeddings == rows  # the estimator unchanged
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.pad_token_id == pad_id < model.get_input_embeddings().num_embeddings
    assert model.config.pad_token_id == pad_id
    assert tokenizer.padding_side == "left"
    assert model.generation_config.suppress_tokens == [pad_id]
    assert model.generation_config.max_new_tokens == sft.max_new_tokens_
    assert model.generation_config.temperature == pytest.approx(sft.temperature_)
    # The exported tokenizer encodes a prompt as the estimator does, BOS included.
    expected = sft._tokenize_prompts(PROMPTS)
    assert [tokenizer(p)["input_ids"] for p in PROMPTS] == expected
    if bos:
        assert all(row[0] == tokenizer.bos_token_id for row in expected)
    # A padded batch, greedy: the estimator's own predict.
    generate = pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    out = generate(PROMPTS, batch_size=len(PROMPTS), do_sample=False, return_full_text=False)
    got = [o[0]["generated_text"].strip() for o in out]
    assert got == sft.predict(PROMPTS)
    assert any(got)  # not all empty: the comparison has words in it
