"""The benchmark's task: prompts, tokenizers, rewards and the starting model."""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def load_world(n_reviews: int = 1000):
    """The review world if it imports, else a small stand-in with the same attributes."""
    try:
        from prefopt.worlds.review import ReviewWorld
    except ImportError:
        return _StandInWorld()
    return ReviewWorld(n_reviews=n_reviews, random_state=0)


class _StandInWorld:
    """A word-level tokenizer and 36 prompts, used when ReviewWorld is not available."""

    WORDS = [
        "the",
        "movie",
        "film",
        "plot",
        "acting",
        "was",
        "and",
        "but",
        "i",
        "it",
        ".",
        "good",
        "great",
        "wonderful",
        "fun",
        "loved",
        "bad",
        "awful",
        "boring",
        "dull",
    ]

    def __init__(self):
        self.tokenizer = word_tokenizer(["[PAD]", "[UNK]", "</s>"] + self.WORDS)
        self.prompts = [
            f"{a} {b} {c}"
            for a in ("the", "i", "it")
            for c in ("was", "and", "but")
            for b in ("movie", "film", "plot", "acting")
        ]
        self.max_new_tokens = 16


def word_tokenizer(words: list[str]):
    """A whitespace word-level tokenizer; ids in list order, the first three [PAD] [UNK] </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        eos_token="</s>",
        clean_up_tokenization_spaces=False,
    )


def padded_tokenizer(tokenizer, vocab_size: int):
    """The same words plus filler words up to ``vocab_size`` (GPT-2's LM head is 50257 wide)."""
    vocab = tokenizer.get_vocab()
    words = sorted(vocab, key=vocab.get)
    if vocab_size < len(words):
        raise ValueError(f"vocab_size={vocab_size} is below the tokenizer's {len(words)} words.")
    assert [tokenizer.pad_token, tokenizer.unk_token, tokenizer.eos_token] == words[:3]
    return word_tokenizer(words + [f"w{i}" for i in range(len(words), vocab_size)])


def lexicon_reward(prompts, completions) -> np.ndarray:
    """Mean VADER-lexicon valence of the completion's words, divided by 4 (so in [-1, 1]).

    Deterministic, a function of the completion text only, and cheap (one dict
    look-up a word), so the benchmark times the RL machinery, not the reward.
    """
    lexicon = _lexicon()
    out = np.zeros(len(completions))
    for i, text in enumerate(completions):
        words = text.lower().split()
        if words:
            out[i] = sum(lexicon.get(w, 0.0) for w in words) / (4.0 * len(words))
    return out


_LEXICON: dict = {}


def _lexicon() -> dict:
    if not _LEXICON:
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

        _LEXICON.update(SentimentIntensityAnalyzer().lexicon)
    return _LEXICON


def make_reward(name: str, n_reviews: int):
    """``lexicon`` (default), or ``gold``: the review world's gold reward (VADER compound)."""
    if name == "lexicon":
        return lexicon_reward
    world = load_world(n_reviews)
    if not hasattr(world, "gold_reward"):
        sys.exit("--reward gold needs prefopt.worlds.review.ReviewWorld.")
    return world.gold_reward


class RecordingReward:
    """A text reward that records each batch's mean and response token count.

    prefopt calls it as ``reward(prompts, completions)``; TRL as
    ``reward(prompts=..., completions=..., completion_ids=..., **kwargs)``.
    """

    __name__ = "reward"

    def __init__(self, reward):
        self.reward = reward
        self.means: list[float] = []
        self.tokens: list[int] = []

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        rewards = self.reward(list(prompts), list(completions))
        self.means.append(float(rewards.mean()))
        if completion_ids is None:
            return rewards
        self.tokens.append(sum(len(ids) for ids in completion_ids))
        return rewards.tolist()


def build_model_dir(
    model_kind: str,
    world,
    out_dir: str,
    *,
    seed: int = 0,
    n_layer: int | None = None,
    vocab_size: int | None = None,
    max_new_tokens: int = 64,
    task: str = "review",
    temperature: float = 0.7,
) -> dict:
    """Build the starting model from a config; save it, its tokenizer and the prompts.

    ``model_kind`` is ``"world"`` (the review world's tiny GPT-2) or ``"gpt2"`` (GPT-2
    small's shape). ``task="summarize"`` gives long prompts (:func:`summarize_prompts`)
    and a model whose responses end at varied lengths (:func:`add_eos_bias`).
    """
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config

    model_kind = {"tiny": "world"}.get(model_kind, model_kind)  # a size's name will do
    tok = world.tokenizer
    if vocab_size and vocab_size != len(tok):
        tok = padded_tokenizer(tok, vocab_size)
    prompts = list(world.prompts)
    if task == "summarize":
        prompts = summarize_prompts(world, tok, seed=seed)
    longest = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    positions = max(64, longest + max_new_tokens)
    layers = {} if n_layer is None else {"n_layer": n_layer}
    if model_kind == "world" and hasattr(world, "model_config"):
        config = world.model_config(n_positions=positions, vocab_size=len(tok), **layers)
    else:
        if model_kind == "world":  # the stand-in world: the review world's shape
            shape = dict(n_layer=2, n_embd=64, n_head=4, n_positions=positions)
        else:  # GPT-2 small
            shape = dict(n_layer=12, n_embd=768, n_head=12, n_positions=max(1024, positions))
        config = GPT2Config(
            **{**shape, **layers},
            vocab_size=len(tok),
            bos_token_id=tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    eos_share = None
    if task == "summarize":
        eos_share = add_eos_bias(model, tok, prompts, temperature=temperature)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "prompts.json"), "w") as f:
        json.dump(prompts, f)
    lengths = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    return {
        "path": out_dir,
        "n_layer": config.n_layer,
        "n_embd": config.n_embd,
        "n_head": config.n_head,
        "vocab": config.vocab_size,
        "n_params": sum(p.numel() for p in model.parameters()),
        "prompt_tokens": (min(lengths), int(np.median(lengths)), max(lengths)),
        "eos_per_token": eos_share,
    }


# ----- the summarisation-shaped task ---------------------------------------------------------
SUMMARIZE_PROMPTS = 64
SUMMARIZE_LENGTHS = (200, 300)  # prompt tokens, drawn uniformly
# The starting model's chance of EOS at each response token: responses end at varied
# lengths, 1/p = 20 tokens on average before the 53-token limit (7% reach it).
EOS_PER_TOKEN = 0.05


def summarize_prompts(world, tokenizer, *, seed: int = 0) -> list[str]:
    """Prompts shaped like a summarisation task's: a long post, then the start of a summary.

    Each is reviews of the world's corpus joined until a length drawn uniformly from
    200-300 tokens, followed by one of the world's short prompts (the response
    continues it), as a TL;DR task ends its post with "TL;DR:".
    """
    rng = np.random.default_rng(seed)
    corpus = list(getattr(world, "corpus", None) or world.prompts)
    stems = list(world.prompts)
    out = []
    for _ in range(SUMMARIZE_PROMPTS):
        target = int(rng.integers(SUMMARIZE_LENGTHS[0], SUMMARIZE_LENGTHS[1] + 1))
        stem = stems[int(rng.integers(len(stems)))]
        words = []
        n_stem = len(tokenizer(stem, add_special_tokens=False)["input_ids"])
        while len(words) + n_stem < target:
            words += corpus[int(rng.integers(len(corpus)))].split()
        out.append(" ".join(words[: target - n_stem] + [stem]))
    return out


def add_eos_bias(model, tokenizer, prompts, *, temperature: float) -> float:
    """Raise the random model's EOS probability to about ``EOS_PER_TOKEN`` a token.

    A random GPT-2 spreads its probability almost evenly over the 50257 words, so it
    would never stop: every response would run to the length limit. The final layer
    norm's bias is moved along the EOS row of the (tied) output embedding, which
    raises the EOS logit at every position and leaves the other logits nearly as they
    were; the step is set by bisection so that the mean tempered EOS probability at
    the prompts' last positions is ``EOS_PER_TOKEN``. This was preferred to a short
    SFT: it costs one forward pass instead of minutes of training on a CPU, and it
    gives a known, geometric spread of response lengths. Returns the reached share.
    """
    import torch

    eos = tokenizer.eos_token_id
    head = model.get_output_embeddings().weight
    bias = model.transformer.ln_f.bias
    with torch.no_grad():
        hidden = []
        for prompt in prompts[:8]:  # the last 8 positions of 8 prompts
            ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
            hidden.append(model.transformer(input_ids=ids).last_hidden_state[0, -8:])
        hidden = torch.cat(hidden)
        unit = head[eos] / head[eos].norm()
        base, shift = hidden @ head.T, head @ unit

        def share(step: float) -> float:
            logits = (base + step * shift) / temperature
            return float(torch.softmax(logits, -1)[:, eos].mean())

        low, high = 0.0, 1.0
        while share(high) < EOS_PER_TOKEN:
            high *= 2
        for _ in range(40):
            mid = (low + high) / 2
            low, high = (mid, high) if share(mid) < EOS_PER_TOKEN else (low, mid)
        bias += high * unit
    return share(high)
