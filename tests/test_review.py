import sys

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, GPT2LMHeadModel

from prefopt.data import check_comparisons
from prefopt.rewards import RewardModel
from prefopt.worlds import _review_text as review_module
from prefopt.worlds.review import ReviewWorld


@pytest.fixture(scope="module")
def world():
    return ReviewWorld(n_reviews=600, random_state=0)


class FixedPolicy:
    """A stand-in policy: the same two completions for every prompt."""

    def __init__(self, a, b):
        self.pair = [a, b]

    def sample(self, prompts, n=2, *, random_state=None):
        assert n == 2
        return [list(self.pair) for _ in prompts]


class CorpusPolicy:
    """A stand-in policy sampling completions of the world's corpus at random."""

    def __init__(self, completions, repeat_prob=0.0):
        self.completions = list(completions)
        self.repeat_prob = repeat_prob

    def sample(self, prompts, n=2, *, random_state=None):
        rng = np.random.RandomState(random_state)
        out = []
        for _ in prompts:
            a, b = (self.completions[i] for i in rng.randint(len(self.completions), size=2))
            out.append([a, a] if rng.uniform() < self.repeat_prob else [a, b])
        return out


def test_corpus_is_deterministic_given_the_seed(world):
    again = ReviewWorld(n_reviews=600, random_state=0)
    assert again.corpus == world.corpus
    assert again.prompts == world.prompts
    assert again.tokenizer.get_vocab() == world.tokenizer.get_vocab()
    assert ReviewWorld(n_reviews=600, random_state=1).corpus != world.corpus


def test_reviews_split_into_neutral_prompts_and_completions(world):
    demos = world.demonstrations
    assert demos.columns.tolist() == ["prompt", "completion"]
    assert len(demos) == len(world.corpus) == 600
    assert (demos.prompt + demos.completion).tolist() == world.corpus
    assert all(r.endswith(" .") and "</s>" not in r for r in world.corpus)
    n_words = demos.prompt.str.split().str.len()
    assert n_words.min() == 2 and n_words.max() == 4
    # Prompts carry no sentiment: the completion alone decides the gold reward.
    assert not world.gold_reward(world.prompts, world.prompts).any()
    assert len(set(world.prompts)) == len(world.prompts) > 100
    assert world.references.prompt.tolist() == world.prompts
    lengths = demos.completion.str.split().str.len()
    assert lengths.min() <= 3 and lengths.max() >= 20  # varied lengths
    assert world.max_new_tokens == lengths.max() + 1
    # Positive, negative and neutral reviews all occur.
    gold = world.gold_reward(demos.prompt, demos.completion)
    assert 0.25 < (gold > 0.05).mean() < 0.55
    assert 0.25 < (gold < -0.05).mean() < 0.55
    assert (gold == 0).mean() > 0.1


def test_tokenizer_round_trip_and_special_tokens(world):
    tok = world.tokenizer
    assert (tok.pad_token, tok.unk_token, tok.eos_token) == ("[PAD]", "[UNK]", "</s>")
    assert (tok.pad_token_id, tok.unk_token_id, tok.eos_token_id) == (0, 1, 2)
    assert 100 < len(tok) < 400
    for review in world.corpus[:50]:
        ids = tok(review, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert len(ids) == len(review.split())
        assert tok.decode(ids + [tok.eos_token_id, 0, 0], skip_special_tokens=True) == review
    assert tok("the zebra was", add_special_tokens=False)["input_ids"][1] == tok.unk_token_id
    # Leading spaces change no token, so completions tokenize alone as in the review.
    assert (
        tok(" was great .", add_special_tokens=False)["input_ids"]
        == tok("was great .", add_special_tokens=False)["input_ids"]
    )


def test_config_points_to_a_loadable_tokenizer(world, tmp_path):
    world = ReviewWorld(n_reviews=600, cache_dir=str(tmp_path), random_state=0)
    config = world.model_config()
    assert config.name_or_path.startswith(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(config.name_or_path)
    assert loaded.get_vocab() == world.tokenizer.get_vocab()
    assert (loaded.pad_token_id, loaded.eos_token_id) == (0, 2)
    ids = loaded(world.corpus[:20], add_special_tokens=False)["input_ids"]
    assert ids == world.tokenizer(world.corpus[:20], add_special_tokens=False)["input_ids"]
    assert loaded.decode(ids[0]) == world.corpus[0]
    # A second call reuses the saved folder.
    assert world.model_config(n_layer=1).name_or_path == config.name_or_path


def test_model_config_builds_a_gpt2_covering_the_vocabulary(world, tmp_path):
    world = ReviewWorld(n_reviews=600, cache_dir=str(tmp_path), random_state=0)
    config = world.model_config()
    assert (config.n_layer, config.n_head, config.n_embd, config.n_positions) == (2, 4, 64, 64)
    assert config.vocab_size == len(world.tokenizer)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (2, 2, 0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    ids = torch.tensor([world.tokenizer(world.corpus[0])["input_ids"]])
    assert model(ids).logits.shape == (1, ids.shape[1], len(world.tokenizer))
    assert world.model_config(n_embd=32, n_head=2).n_embd == 32
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        world.model_config(vocab_size=10)
    with pytest.raises(ValueError, match="n_positions=8"):
        world.model_config(n_positions=8)
    with pytest.raises(TypeError, match="n_layers"):
        world.model_config(n_layers=3)


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_model_config_builds_llama_and_qwen2_shapes(world, architecture):
    from transformers import AutoModelForCausalLM

    config = world.model_config(architecture)
    assert config.model_type == architecture
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 2, 4)
    assert (config.num_key_value_heads, config.max_position_embeddings) == (2, 64)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (2, 2, 0)
    loaded = AutoTokenizer.from_pretrained(config.name_or_path)
    assert loaded.get_vocab() == world.tokenizer.get_vocab()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    ids = torch.tensor([world.tokenizer(world.corpus[0])["input_ids"]])
    assert model(ids).logits.shape == (1, ids.shape[1], len(world.tokenizer))
    with pytest.raises(ValueError, match="max_position_embeddings=8 cannot hold"):
        world.model_config(architecture, max_position_embeddings=8)
    with pytest.raises(ValueError, match="architecture must be one of"):
        world.model_config("bert")


def test_gold_reward_is_vader_on_the_completion(world):
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    completions = [
        " was great and the acting was wonderful .",
        " was awful and boring .",
        " was long .",
        "",
    ]
    gold = world.gold_reward(["the movie"] * 4, completions)
    assert gold.shape == (4,) and gold.dtype == np.float64
    np.testing.assert_allclose(gold, [0.8316, -0.6486, 0.0, 0.0], atol=1e-4)
    vader = SentimentIntensityAnalyzer()
    assert gold[0] == vader.polarity_scores(completions[0])["compound"]
    # VADER handles negation: "not good" is negative.
    assert world.gold_reward(["the film"], [" was not good ."])[0] < 0
    assert world.gold_reward([], []).shape == (0,)


def test_gold_reward_without_vader_names_the_extra(world, monkeypatch):
    # vaderSentiment is optional (the ``worlds`` extra): simulate its absence.
    monkeypatch.setitem(sys.modules, "vaderSentiment", None)
    monkeypatch.setitem(sys.modules, "vaderSentiment.vaderSentiment", None)
    review_module._analyzer.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"pip install 'prefopt\[worlds\]'"):
            world.gold_reward(["the movie"], [" was a text no test scored before ."])
    finally:
        review_module._analyzer.cache_clear()


def test_gold_reward_errors(world):
    with pytest.raises(ValueError, match="2 prompts and 1 completions"):
        world.gold_reward(["a", "b"], [" good ."])
    with pytest.raises(TypeError, match="not one string"):
        world.gold_reward("the movie", " good .")
    with pytest.raises(TypeError, match="completion at row 1 is int"):
        world.gold_reward(["a", "b"], [" good .", 3])


def test_constructor_validates_parameters():
    with pytest.raises(ValueError, match="n_reviews"):
        ReviewWorld(n_reviews=0)
    with pytest.raises(ValueError, match="n_reviews"):
        ReviewWorld(n_reviews=10**6)
    with pytest.raises(ValueError, match=r"rater_temperature must be a finite number, > 0"):
        ReviewWorld(rater_temperature=0.0)
    with pytest.raises(ValueError, match=r"rater_noise must be a finite number, >= 0"):
        ReviewWorld(rater_noise=-1.0)
    with pytest.raises(ValueError, match="length_bias must be a finite number"):
        ReviewWorld(length_bias=float("nan"))


def test_comparisons_are_deterministic_and_never_identical(world):
    policy = CorpusPolicy(world.demonstrations.completion, repeat_prob=0.5)
    first = world.comparisons(policy, 300, random_state=3)
    second = world.comparisons(policy, 300, random_state=3)
    assert first.to_pandas().equals(second.to_pandas())
    assert not first.to_pandas().equals(world.comparisons(policy, 300, random_state=4).to_pandas())
    assert len(first) == 300
    assert all(c != r for c, r in zip(first.chosen, first.rejected))
    assert set(first.prompt) <= set(world.prompts)
    check_comparisons(first)  # would raise on an identical pair
    # The world's own seed is the default.
    assert (
        world.comparisons(policy, 50)
        .to_pandas()
        .equals(world.comparisons(policy, 50, random_state=0).to_pandas())
    )


def test_comparisons_follow_the_gold_reward(world):
    data = world.comparisons(FixedPolicy(" was great .", " was awful ."), 1000, random_state=0)
    share = np.mean([c == " was great ." for c in data.chosen])
    assert share > 0.97
    # With random corpus pairs, raters agree with the gold sign most of the time.
    data = world.comparisons(CorpusPolicy(world.demonstrations.completion), 2000, random_state=0)
    gap = world.gold_reward(data.prompt, data.chosen) - world.gold_reward(
        data.prompt, data.rejected
    )
    agree = np.mean(gap[gap != 0] > 0)
    assert 0.8 < agree < 0.95


def test_length_bias_shifts_choices_towards_longer_completions():
    # Both completions are VADER-neutral (gold 0): only length and noise decide.
    short, long_ = " was long .", " was long and the plot was slow and the ending was short ."
    policy = FixedPolicy(short, long_)

    def share_long(length_bias):
        world = ReviewWorld(n_reviews=50, length_bias=length_bias, random_state=0)
        assert not world.gold_reward(["x", "x"], [short, long_]).any()
        data = world.comparisons(policy, 4000, random_state=0)
        return np.mean([c == long_ for c in data.chosen])

    # 10 extra words: logit +length_bias, so P(long) = E[sigmoid(length_bias + noise)].
    assert abs(share_long(0.0) - 0.5) < 0.03
    assert 0.70 < share_long(1.0) < 0.75
    assert share_long(-1.0) < 0.30


def test_comparisons_errors(world):
    with pytest.raises(ValueError, match="identical completions in"):
        world.comparisons(FixedPolicy(" same .", " same ."), 10)
    with pytest.raises(TypeError, match="sample"):
        world.comparisons(object(), 10)
    with pytest.raises(ValueError, match="positive integer"):
        world.comparisons(FixedPolicy(" a .", " b ."), 0)

    class OneEach:
        def sample(self, prompts, n=2, *, random_state=None):
            return [[" good ."] for _ in prompts]

    with pytest.raises(ValueError, match="two completion strings"):
        world.comparisons(OneEach(), 5)


def test_linear_reward_model_on_world_features_learns_sentiment(world):
    policy = CorpusPolicy(world.demonstrations.completion)
    rm = RewardModel(alpha=1.0).fit(world.comparisons(policy, 1000, random_state=0))
    demos = world.demonstrations
    gold = world.gold_reward(demos.prompt, demos.completion)
    proxy = rm.predict(demos.prompt, demos.completion)
    assert 0.7 < np.corrcoef(proxy, gold)[0, 1] < 0.9  # a proxy, not the gold reward
    # The proxy learned the raters' length bias that the gold reward does not have.
    longer = rm.predict(["the movie"] * 2, [" was long .", " was long and the plot was slow ."])
    assert longer[1] > longer[0]


@pytest.mark.slow
def test_sft_on_the_demonstrations_writes_reviews_that_end():
    # About 15 s on one CPU core: the one test here that trains.
    from prefopt.policies import SFTPolicy

    world = ReviewWorld(n_reviews=600, random_state=0)
    sft = SFTPolicy(
        model=world.model_config(), n_epochs=8, learning_rate=3e-3, batch_size=32, random_state=0
    ).fit(world.demonstrations)
    held_out = ReviewWorld(n_reviews=300, random_state=1).demonstrations
    logp = sft.log_prob(held_out.prompt, held_out.completion)
    per_token = logp.sum() / sum(len(c.split()) + 1 for c in held_out.completion)
    assert per_token > -1.6  # untrained: log(1 / vocab) = -5.0; one default epoch: -1.96
    samples = sft.sample(world.prompts[:64], n=2, random_state=0)
    flat = [c for pair in samples for c in pair]
    # Sampling must stop: EOS is a trained target, and the KV-cached sampler must
    # draw from the distribution the model was trained on.
    assert np.mean([c.endswith(" .") for c in flat]) > 0.97
    words = set(world.tokenizer.get_vocab())
    assert all(set(c.split()) <= words for c in flat)
    data = world.comparisons(sft, 64, random_state=0)
    assert len(data) == 64
