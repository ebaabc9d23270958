"""A fitted LM RewardModel read back by ``AutoModelForSequenceClassification``, scoring alike."""

import numpy as np
import pytest
import torch
from _tiny import tiny_config, tiny_lm, word_tokenizer
from transformers import AutoModelForSequenceClassification, AutoTokenizer, GPT2LMHeadModel

from prefopt import RewardModel
from prefopt.backend import join_right_padded
from prefopt.worlds import PreferenceWorld

COMPARISONS = [("the movie was", "good .", "bad ."), ("the plot was", "great .", "awful .")] * 4
PROMPTS = ["the movie was", "the plot was", "the movie was", "the plot was"]
COMPLETIONS = ["good .", "awful . . the", "bad", ""]


def _fit(model, **params):
    settings = dict(batch_size=2, normalize_samples=16, max_new_tokens=6, random_state=0)
    return RewardModel(model=model, **{**settings, **params}).fit(
        COMPARISONS, references=[("the movie was", "good .")]
    )


def _classifier_scores(folder, rm):
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = rm._prompt_tokens(PROMPTS)
    completions = rm._completion_tokens(COMPLETIONS, add_eos=True, prompts=PROMPTS)
    ids, mask, _ = join_right_padded(prompts, completions, tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    assert logits.shape == (len(PROMPTS), 1)
    return logits[:, 0].double().numpy(), model, tokenizer, ids


def test_sequence_classifier_scores_as_the_reward_model(tmp_path):
    rm = _fit(tiny_lm())
    # Normalised and shifted to the reference: gain and bias are both far from 1 and 0.
    assert abs(rm.gain_ - 1) > 0.05 and abs(rm.bias_) > 0.05
    rm.save_pretrained(tmp_path)
    scores, model, tokenizer, ids = _classifier_scores(tmp_path, rm)
    np.testing.assert_allclose(scores, rm.predict(PROMPTS, COMPLETIONS), atol=1e-5)
    assert model.config.num_labels == 1 and model.config.id2label == {0: "reward"}
    assert model.config.pad_token_id == rm.tokenizer_.pad_token_id
    # The plain tokenizer call, right-padded, gives the same rows prefopt scores.
    texts = [
        f"{p} {c} {tokenizer.eos_token}".replace("  ", " ") for p, c in zip(PROMPTS, COMPLETIONS)
    ]
    assert tokenizer(texts, padding=True, return_tensors="pt").input_ids.tolist() == ids.tolist()


def test_pad_token_outside_the_vocabulary_gets_an_embedding_row(tmp_path):
    # No pad token: prefopt adds one at id len(vocab) without resizing the embeddings.
    tokenizer = word_tokenizer(pad=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(tiny_config(tokenizer))
    model.tokenizer = tokenizer
    rm = _fit(model)
    pad = rm.tokenizer_.pad_token_id
    assert pad == model.config.vocab_size
    rm.save_pretrained(tmp_path)
    scores, exported, _, _ = _classifier_scores(tmp_path, rm)
    assert exported.get_input_embeddings().num_embeddings == pad + 1
    np.testing.assert_allclose(scores, rm.predict(PROMPTS, COMPLETIONS), atol=1e-5)


def test_linear_reward_has_no_transformers_export(tmp_path):
    world = PreferenceWorld(random_state=0)
    rm = RewardModel().fit(world.comparisons(50, random_state=0))
    with pytest.raises(TypeError, match=r"linear in features .* Use save\(folder\)"):
        rm.save_pretrained(tmp_path)


def test_the_folders_scoring_helper_gives_predicts_numbers_and_joint_text_differs(tmp_path):
    import importlib.util

    rm = _fit(tiny_lm())
    # The word-level tokenizer cannot split 'the' + 'movie' run together: a warning says so.
    with pytest.warns(UserWarning, match=r"merge tokens across .*'the' \+ 'the'.*score_reward"):
        rm.save_pretrained(tmp_path)
    spec = importlib.util.spec_from_file_location("score_reward", tmp_path / "score_reward.py")
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    expected = rm.predict(PROMPTS, COMPLETIONS)
    np.testing.assert_allclose(
        helper.score(str(tmp_path), PROMPTS, COMPLETIONS, batch_size=3), expected, atol=1e-5
    )
    # Tokenizing prompt + completion as one string (with no separator) scores other tokens.
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    joint = [tokenizer(p + c)["input_ids"] for p, c in zip(PROMPTS, COMPLETIONS)]
    assert joint != [r[:-1] for r in helper.token_rows(tokenizer, PROMPTS, COMPLETIONS)]


def test_no_merge_warning_for_a_character_tokenizer(tmp_path):
    import warnings

    from prefopt.worlds import ArithmeticWorld

    world = ArithmeticWorld(random_state=0)
    prompt = world.prompts[0]
    rm = RewardModel(model=world.model_config(), normalize=False, max_new_tokens=4, random_state=0)
    rm.fit([(prompt, "4", "5")] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rm.save_pretrained(tmp_path)
    assert (tmp_path / "score_reward.py").exists()


def _tiny_opt(**overrides):
    from transformers import OPTConfig, OPTForCausalLM

    tokenizer = word_tokenizer()
    params = dict(
        vocab_size=len(tokenizer),
        hidden_size=16,
        word_embed_proj_dim=8,  # a projection after the final norm, as in OPT-350m
        ffn_dim=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=32,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config = OPTConfig(**{**params, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = OPTForCausalLM(config)
    model.tokenizer = tokenizer
    return model


def test_a_normalised_opt_reward_model_exports_and_scores_as_predict(tmp_path):
    # OPT's last hidden state is project_out(final_layer_norm(x)): the offset folded into
    # the norm's bias goes through the projection (it was a size mismatch).
    rm = _fit(_tiny_opt())
    assert abs(rm.gain_ - 1) > 0.05 and abs(rm.bias_) > 0.05
    rm.save_pretrained(tmp_path)
    scores, model, _, _ = _classifier_scores(tmp_path, rm)
    np.testing.assert_allclose(scores, rm.predict(PROMPTS, COMPLETIONS), atol=1e-5)
    # Ours: an OPT with no projection (word_embed_proj_dim == hidden_size) exports too.
    same = _fit(_tiny_opt(word_embed_proj_dim=16))
    same.save_pretrained(tmp_path / "same")
    scores, _, _, _ = _classifier_scores(tmp_path / "same", same)
    np.testing.assert_allclose(scores, same.predict(PROMPTS, COMPLETIONS), atol=1e-5)
    # Ours: OPT-350m's post-norm layout has no final norm to hold the offset: a clear refusal.
    post = _fit(_tiny_opt(do_layer_norm_before=False))
    with pytest.raises(TypeError, match="cannot be folded in"):
        post.save_pretrained(tmp_path / "post")
