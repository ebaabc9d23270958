"""Tiny language models and tokenizers built in-process for the tests."""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

WORDS = ["the", "movie", "was", "good", "bad", "great", "awful", "plot", "."]


def word_tokenizer(pad=True, eos="</s>"):
    vocab = {"[UNK]": 0}
    if pad:
        vocab["[PAD]"] = len(vocab)
    if eos is not None:
        vocab[eos] = len(vocab)
    for w in WORDS:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    kwargs = {"unk_token": "[UNK]"}
    if pad:
        kwargs["pad_token"] = "[PAD]"
    if eos is not None:
        kwargs["eos_token"] = eos
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def bos_tokenizer(chat_template, adds_bos=True):
    """A word-level tokenizer with BOS ``<s>`` (2), EOS ``</s>`` (3), ``<u>``, ``<a>``.

    ``adds_bos``: the post-processor puts BOS before every text (Llama style), or
    not (GPT-2 style); ``chat_template`` is the tokenizer's template.
    """
    vocab = {"[UNK]": 0, "[PAD]": 1, "<s>": 2, "</s>": 3, "<u>": 4, "<a>": 5}
    for word in WORDS:
        vocab[word] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    if adds_bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 2)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        bos_token="<s>",
        eos_token="</s>",
        chat_template=chat_template,
    )


def tiny_config(tokenizer, **overrides):
    params = dict(
        vocab_size=len(tokenizer),
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    params.update(overrides)
    return GPT2Config(**params)


def tiny_lm(seed=0, **overrides):
    """A seeded tiny GPT-2 with its tokenizer attached as ``model.tokenizer``."""
    import torch

    tok = word_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(tiny_config(tok, **overrides))
    model.tokenizer = tok
    return model


def small_policy(world, cls=None, **params):
    """The tests' one builder of a small policy: ``cls`` on ``world``'s tiny policy model.

    ``cls`` defaults to :class:`~prefopt.RLOOPolicy`; ``params`` go to its constructor
    as given, with ``optimizer="sgd"`` unless they name another (the exact worlds'
    tests train by plain gradient steps). Nothing else is set for the caller, so a
    test states every number its result depends on.
    """
    from prefopt import RLOOPolicy

    cls = RLOOPolicy if cls is None else cls
    return cls(model=world.policy_model(), **{"optimizer": "sgd", **params})
