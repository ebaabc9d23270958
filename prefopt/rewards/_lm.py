"""Training and scoring of the language-model reward: a scalar head on the SFT trunk."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.utils import check_random_state

from .._config import get_config
from ..backend import (
    ScalarHeadModel,
    default_learning_rate,
    disable_dropout,
    distributed,
    join_right_padded,
    local_seed,
    make_generator,
    score_sequences,
)
from ..data import check_demonstrations
from ..lm import checkpoint as ckpt
from ..lm import context_length, too_long_error, truncate_rows, with_lora
from ..lm.supervised import SupervisedLoop, SupervisedView


def fit_lm_reward(rm, model, data, references, callback=None) -> None:
    """Bradley-Terry training of a scalar head on the SFT trunk, then normalisation."""
    rng = check_random_state(rm.random_state)
    # A fifth seed, for a LoRA adapter's initial weights, only with lora= (seeds unchanged).
    seeds = rng.randint(np.iinfo(np.int32).max, size=4 if rm.lora is None else 5)
    # A path, a config, a module, or a fitted (possibly frozen) SFTPolicy, copied.
    lm = rm._load_lm(model, rm.tokenizer, seed=int(seeds[0]))
    trunk = getattr(lm, "base_model", None)
    if trunk is None or trunk is lm or not hasattr(trunk, "config"):
        raise TypeError(
            "RewardModel needs a transformers causal LM with a base model; got "
            f"{type(lm).__name__}."
        )
    rm._resolve_sampling(lm)  # the normalisation samples the starting policy as a policy would
    if rm.normalize:
        rm._check_max_new_tokens(lm)
    # The head is drawn with std 1/sqrt(d_model + 1) from a local generator.
    head = ScalarHeadModel(
        copy.deepcopy(trunk), head_std=rm.head_std, generator=make_generator(int(seeds[1]))
    )
    rm.model_ = disable_dropout(head).to(rm.device_).eval()
    rm.gain_, rm.bias_ = 1.0, 0.0
    rm.normalization_rows_ = rm.reference_texts_ = None
    rm.learning_rate_ = (
        float(rm.learning_rate)
        if rm.learning_rate is not None
        else default_learning_rate(rm.model_, large=1e-5)
    )
    prompts = rm._prompt_tokens(data.prompt)  # BOS once at the start, as the policy's
    rm.history_, rm.n_iter_ = [], 0
    data_key = ckpt.fingerprint([data.prompt, data.chosen, data.rejected])
    with ckpt.resumable(rm, data_key) as resume:
        model_key = None if resume is None else ckpt.module_fingerprint(rm.model_)
        generator = make_generator(int(seeds[2]))
        lora_seed = None if rm.lora is None else int(seeds[4])
        train_bradley_terry(rm, data, generator, resume, model_key, callback, lora_seed)
    if rm.normalize:
        _normalize(rm, lm, prompts, check_random_state(int(seeds[3])))
    if references is not None:
        ref_prompts, ref_completions = check_demonstrations(references)
        rm.reference_texts_ = [list(ref_prompts), list(ref_completions)]
        shift_to_references(rm)


def shift_to_references(rm) -> None:
    """Shift the bias so that the reference responses score 0 on average (Huang et al.)."""
    ref_prompts, ref_completions = rm.reference_texts_
    rm.bias_ -= float(predict_text(rm, ref_prompts, ref_completions).mean())


def refit_lm_reward(rm, data, seed: int) -> None:
    """More Bradley-Terry training from the current weights, then the same normalisation."""
    train_bradley_terry(rm, data, make_generator(seed), lora_seed=seed)
    if getattr(rm, "normalization_rows_", None) is not None:
        renormalize(rm)  # mean 0, std 1 again on the same samples of the starting policy
    if getattr(rm, "reference_texts_", None) is not None:
        shift_to_references(rm)


def train_bradley_terry(
    rm, data, generator, resume=None, model_key=None, callback=None, lora_seed=None
) -> None:
    """``n_epochs`` of the Bradley-Terry loss on ``data`` from ``rm.model_``'s current weights.

    With ``rm.lora`` a LoRA adapter (its initial weights drawn under ``lora_seed``)
    trains on the trunk and the head trains in full; both are merged into
    ``rm.model_`` afterwards, which stays a plain :class:`ScalarHeadModel`.
    """
    prompts = rm._prompt_tokens(data.prompt)
    # A response ends with its stop token: the EOS, or after a conversation the turn's end.
    chosen = rm._completion_tokens(data.chosen, True, "chosen response", data.prompt)
    rejected = rm._completion_tokens(data.rejected, True, "rejected response", data.prompt)
    prompts, (chosen, rejected) = truncate_rows(rm, prompts, [chosen, rejected], "Comparison")
    for i, (c, r) in enumerate(zip(chosen, rejected)):
        if c == r:  # check_comparisons refuses equal strings; these differ only as text
            cut = "" if rm.max_length is None else f" within max_length={rm.max_length}"
            raise ValueError(
                f"Comparisons: chosen and rejected tokenize identically{cut} at row {i} "
                f"({data.chosen[i]!r} and {data.rejected[i]!r}): they differ only in what "
                "the tokenizer drops or maps to one token (whitespace, unknown words)"
                f"{' or past the cut' if cut else ''}, so the reward model cannot tell them "
                "apart; drop the row."
            )
        error = too_long_error(rm, "Comparison", i, len(prompts[i]) + max(len(c), len(r)))
        if error is not None:
            raise error

    def batch_loss(model, rows):  # model: what training passes go through (DDP's wrapper)
        # Chosen and rejected go through one forward pass together.
        both = _raw(
            rm,
            [prompts[i] for i in rows] * 2,
            [chosen[i] for i in rows] + [rejected[i] for i in rows],
            model=model,
        )
        margin = both[: len(rows)] - both[len(rows) :]
        # Means over every rank's rows in a distributed fit (rows may split unequally).
        loss = -distributed.mean(F.logsigmoid(margin), across_ranks=True)
        return loss, {
            "loss/reward": loss.item(),
            "reward/accuracy": float(distributed.mean((margin > 0).float(), across_ranks=True)),
        }

    if getattr(rm, "lora", None) is not None:
        with local_seed(0 if lora_seed is None else lora_seed):
            rm.model_ = with_lora(rm.model_, _with_head(rm.lora))
    # Linear decay to 0, as the original reward-model code (Ziegler et al. 2019).
    try:
        _train(rm, prompts, batch_loss, generator, resume, model_key, callback)
    finally:
        if hasattr(rm.model_, "merge_and_unload"):  # the adapter into the trunk's weights
            rm.model_ = rm.model_.merge_and_unload().requires_grad_(True)


def _with_head(lora):
    """The LoRA settings with the scalar head trained in full (peft's ``modules_to_save``)."""
    if isinstance(lora, dict):
        return {**lora, "modules_to_save": [*(lora.get("modules_to_save") or []), "head"]}
    config = copy.deepcopy(lora)
    config.modules_to_save = [*(getattr(config, "modules_to_save", None) or []), "head"]
    return config


def _train(rm, prompts, batch_loss, generator, resume, model_key, callback) -> None:
    view = SupervisedView.of(rm, name="RewardModel", schedule="linear")
    loop = SupervisedLoop(rm, view, len(prompts), batch_loss, parameters=rm.model_.parameters(),
                          generator=generator, resume=resume, model_key=model_key)  # fmt: skip
    loop.train(callback, record=rm._record_supervised)


def _raw(rm, prompt_rows, response_rows, model=None) -> torch.Tensor:
    """Scores of the rows under ``model`` (``rm.model_`` by default)."""
    ids, mask, last = join_right_padded(prompt_rows, response_rows, rm.tokenizer_.pad_token_id)
    context = context_length(rm.model_)
    if context is not None and ids.shape[1] > context:
        hint = (
            "shorten it, or pass max_length (at most the context; responses are then cut from "
            "the right) and max_prompt_length (prompts cut from the left)"
            if getattr(rm, "max_length", None) is None
            else f"lower max_length={rm.max_length} to at most {context}"
        )
        raise ValueError(
            f"A prompt + response has {ids.shape[1]} tokens, more than the reward "
            f"model's context of {context}; {hint}."
        )
    device = rm.device_
    model = rm.model_ if model is None else model
    return score_sequences(model, ids.to(device), mask.to(device), last.to(device))


@torch.no_grad()
def _normalize(rm, policy, prompts, rng) -> None:
    """gain and bias so that samples of the starting policy score mean 0, std 1.

    Population std (E[r^2] - mu^2), as the original code's ``set_reward_norm``
    (Ziegler et al. 2019).
    """
    rows = rng.randint(len(prompts), size=rm.normalize_samples)
    chosen = [prompts[i] for i in rows]
    responses = rm._sample_token_rows(chosen, make_generator(rng), model=policy)
    # Kept as the RL loop scores a policy's responses (a cut one gets its stop token), so
    # the rewards it trains on have mean 0 and std 1.
    rm.normalization_rows_ = list(as_text_scores_them(rm, chosen, responses))
    renormalize(rm)


@torch.no_grad()
def renormalize(rm) -> None:
    """gain and bias from the stored normalisation samples, after more training."""
    chosen, responses = rm.normalization_rows_
    scores = score_token_rows(rm, chosen, responses, normalized=False).cpu().double()
    mean, std = float(scores.mean()), float(scores.std(unbiased=False))
    rm.gain_ = 1.0 / max(std, 1e-8)
    rm.bias_ = -rm.gain_ * mean
    rm.normalization_ = {"mean": mean, "std": std, "n_samples": len(scores)}


@torch.no_grad()
def score_token_rows(rm, prompt_rows, response_rows, normalized: bool = True) -> torch.Tensor:
    # Cut to max_length / max_prompt_length as in training.
    prompt_rows, (response_rows,) = truncate_rows(rm, prompt_rows, [response_rows])
    out = []
    size = get_config()["eval_batch_size"]
    for start in range(0, len(prompt_rows), size):
        out.append(_raw(rm, prompt_rows[start : start + size], response_rows[start : start + size]))
    raw = torch.cat(out)
    return raw * rm.gain_ + rm.bias_ if normalized else raw


def predict_text(rm, prompts, completions) -> np.ndarray:
    p = rm._prompt_tokens(prompts)
    c = rm._completion_tokens(completions, add_eos=True, prompts=prompts)
    return score_token_rows(rm, p, c).cpu().double().numpy()


def as_text_scores_them(rm, prompt_rows, response_rows):
    """Token rows of sampled responses made the rows ``rm.predict`` scores for their text.

    The RL loop hands a reward model of the policy's vocabulary the sampled ids
    directly; the reward must equal what ``predict`` gives for the same prompt
    and decoded completion, so the text's rules are applied to the ids. A text
    prompt gets the reward model's own BOS prefix (the policy's tokenizer may add
    BOS where this one does not, or the other way round): its leading special
    tokens are replaced by the prefix. A prompt that ends with the chat
    template's generation prompt is a rendered conversation and is left as the
    template wrote it. A response loses its stop token and any special token
    (as decoding does), then ends with the reward model's stop token: the EOS,
    or the template's end of turn after a conversation. A response cut at
    ``max_new_tokens`` therefore gets one too, as its text does in ``predict``.

    What remains different is only what decoding and re-encoding change (a text
    that tokenizes otherwise than the ids it was decoded from, a text prompt that
    itself begins with a special token), and a conversation under a template with
    no generation prompt, which cannot be told from text and is read as text.
    """
    tok = rm.tokenizer_
    specials = set(tok.all_special_ids)
    stops = set(rm._stop_ids())
    prefix = list(rm._prompt_prefix())
    suffix = _generation_prompt_ids(rm)
    ends = {False: rm._text_end_id(), True: rm._turn_end_id() if suffix else None}
    prompts, responses = [], []
    for p, r in zip(prompt_rows, response_rows):
        p, r = list(p), list(r)
        chat = bool(suffix) and p[-len(suffix) :] == suffix
        if not chat:
            start = next((i for i, t in enumerate(p) if t not in specials), len(p))
            p = prefix + p[start:]
        if r and r[-1] in stops:
            r = r[:-1]
        r = [t for t in r if t not in specials]
        end = ends[chat]
        prompts.append(p)
        responses.append(r if end is None else r + [end])
    return prompts, responses


def _generation_prompt_ids(rm) -> list[int]:
    """Ids of the chat template's generation prompt (``<|im_start|>assistant``); [] for none."""
    tok = rm.tokenizer_
    template = getattr(tok, "chat_template", None)
    cached = rm.__dict__.get("_generation_prompt_cache")
    if cached is not None and cached[0] is tok and cached[1] == template:
        return cached[2]
    ids = []
    if template is not None:
        messages = [{"role": "user", "content": "prefopt generation prompt probe"}]
        try:
            plain = tok.apply_chat_template(messages, tokenize=False)
            prompted = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            if prompted.startswith(plain) and prompted != plain:
                ids = list(tok(prompted[len(plain) :], add_special_tokens=False)["input_ids"])
        except Exception:  # noqa: BLE001 - any template failure: no conversation is recognised
            ids = []
    rm._generation_prompt_cache = (tok, template, ids)
    return ids
