"""How prompts and completions become token ids, and which ids end a response.

A text prompt gets the tokenizer's BOS once, at the start, as the model saw text
in training; a conversation (TRL's list of messages) goes through the tokenizer's
chat template with the generation prompt, and the template writes BOS itself. A
completion ends with a stop token: the EOS after a text prompt, the template's
end-of-turn token after a conversation. The stop tokens are the tokenizer's EOS
and every id of the model's ``generation_config.eos_token_id`` (chat models end a
turn with a token of their own, often several) and, when none of these is the
chat template's end of turn, the special token the template closes an assistant
turn with; or the estimator's ``stop_token_ids``.
"""

from __future__ import annotations

import re
from numbers import Integral

from ..backend import EncodedPrompts, model_vocab_size, pad_left, pad_right
from ..data import is_conversation


def context_length(model) -> int | None:
    """Longest sequence the model takes, when its config says.

    Parameters
    ----------
    model : torch.nn.Module
        A model with a transformers-style ``config``, or any module.

    Returns
    -------
    length : int or None
        ``max_position_embeddings`` or ``n_positions``; ``None`` when unknown.

    Examples
    --------
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> context_length(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=32)))
    32
    """
    config = getattr(model, "config", None)
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def _default_prefix(tokenizer) -> list[int]:
    """The ids a tokenizer puts before a text by default (its BOS), without any after it.

    A probe text, one ordinary token of the vocabulary, is encoded with and without
    special tokens; what comes before the probe's own ids is the prefix. Whatever
    the tokenizer appends (an EOS after the text) is left out: a prompt goes on.
    """
    specials = set(tokenizer.all_special_ids)
    probe = next(
        (
            text
            for i in range(len(tokenizer))
            if i not in specials and (text := tokenizer.decode([i])).strip()
        ),
        None,
    )
    if probe is None:
        return []
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return list(full[:start])
    # The probe itself came out differently: keep the leading special tokens.
    start = next((i for i, t in enumerate(full) if t not in specials), len(full))
    return list(full[:start])


def _id_list(ids) -> list:
    """``None``, one id or a sequence of ids as a list."""
    if ids is None:
        return []
    return [ids] if isinstance(ids, Integral) else list(ids)


class TokenEncoding:
    """Tokenisation of :class:`LanguageModelEstimator`: prompts, completions, stop tokens.

    Reads the fitted ``tokenizer_``, ``model_``, ``device_``, ``max_new_tokens_``
    and ``stop_token_ids_``, and the parameters ``truncate_prompts`` and
    ``stop_token_ids`` when the estimator has them.
    """

    # ----- declarations persistence reads -------------------------------------------
    def shared_trunk_modules(self) -> dict:
        """Fitted modules that are a head on another fitted module's trunk; none by default.

        A declaration :func:`prefopt.save` and :func:`prefopt.load` read: for
        ``{"value_model_": "model_"}`` (PPO's ``value_model="shared"``) only the
        head of ``value_model_`` is saved, and loading puts it on ``model_``'s
        trunk again (no second copy of the trunk).

        Returns
        -------
        trunks : dict of str to str
            The head module's attribute name to its trunk module's.
        """
        return {}

    # ----- stop tokens --------------------------------------------------------------
    def _resolve_stop_ids(self, module) -> None:
        """``stop_token_ids_``: ``stop_token_ids``, else the EOS ids of the tokenizer and model.

        Like ``transformers``' ``generate``, every id of the generation config's
        ``eos_token_id`` ends a response (Llama 3 and Qwen chat models end a turn
        with a token other than the tokenizer's EOS); the tokenizer's EOS counts
        too. Configured ids the model cannot emit (past its vocabulary, as a
        config's default EOS with a tokenizer of its own) or never samples (the
        pad token) are left out. When none of them is among what the chat template
        writes after an assistant message, the template's special token there
        joins them (:meth:`_unlisted_turn_end`).
        """
        tok = self.tokenizer_
        vocab = model_vocab_size(module)
        given = getattr(self, "stop_token_ids", None)
        if given is None:
            configured = getattr(getattr(module, "generation_config", None), "eos_token_id", None)
            ids = [] if tok.eos_token_id is None else [tok.eos_token_id]
            ids += [
                i
                for i in _id_list(configured)
                if isinstance(i, Integral)
                and (vocab is None or 0 <= i < vocab)
                and i != tok.pad_token_id
            ]
            turn_end = self._unlisted_turn_end(ids, vocab)
            if turn_end is not None:
                ids.append(turn_end)
        else:
            ids = _id_list(given)
            if not ids:
                raise ValueError(
                    "stop_token_ids is empty; pass at least one token id, or None for the "
                    "model's generation_config.eos_token_id and the tokenizer's EOS."
                )
            for i in ids:
                bad = isinstance(i, bool) or not isinstance(i, Integral) or i < 0
                if bad or (vocab is not None and i >= vocab) or i == tok.pad_token_id:
                    raise ValueError(
                        f"stop_token_ids={given!r}: {i!r} is not a token id the model can "
                        f"sample (0 to {'...' if vocab is None else vocab - 1}, not the pad "
                        f"id {tok.pad_token_id}); pass ids such as "
                        "tokenizer.convert_tokens_to_ids('<|eot_id|>')."
                    )
        self.stop_token_ids_ = list(dict.fromkeys(int(i) for i in ids))

    def _template_turn_tail(self) -> list[int]:
        """Ids the chat template writes after an assistant message's content ([] for none)."""
        tok = self.tokenizer_
        if getattr(tok, "chat_template", None) is None:
            return []
        marker = "prefopt end of turn probe"
        try:
            text = tok.apply_chat_template(
                [{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}],
                tokenize=False,
            )
            after = text[text.rindex(marker) + len(marker) :]
            return list(tok(after, add_special_tokens=False)["input_ids"])
        except Exception:  # noqa: BLE001 - any template or tokenizer failure: no turn end
            return []

    def _unlisted_turn_end(self, stops, vocab) -> int | None:
        """The template's end-of-turn token when it is not a stop id yet, else ``None``.

        A chat template closes an assistant turn with a special token of its own
        (``<|im_end|>``, ``<|eot_id|>``, ``<|end|>``) that a base model's
        ``generation_config.eos_token_id`` may not list. Left out, an assistant
        message would be trained to end with the EOS instead and sampling would run
        past the turn's end; so the first special (or added) token after the
        assistant's content joins the stop ids, unless one of them is already there.
        """
        tail = self._template_turn_tail()
        if not tail or any(i in stops for i in tail):
            return None
        tok = self.tokenizer_
        marked = set(tok.all_special_ids) | set(getattr(tok, "added_tokens_decoder", {}) or {})
        for i in tail:
            if i in marked and i != tok.pad_token_id and (vocab is None or 0 <= i < vocab):
                return int(i)
        return None

    def _stop_ids(self) -> tuple:
        """The ids that end a response; ``()`` for fixed-length responses."""
        stops = self.__dict__.get("stop_token_ids_")
        if stops is None:  # an estimator fitted before stop tokens were resolved
            eos = self.tokenizer_.eos_token_id
            return () if eos is None else (eos,)
        return tuple(stops)

    def _text_end_id(self) -> int | None:
        """The stop token after a completion of a text prompt: the EOS, when it stops."""
        stops = self._stop_ids()
        eos = self.tokenizer_.eos_token_id
        return eos if eos in stops else (stops[0] if stops else None)

    def _turn_end_id(self) -> int | None:
        """The stop token the chat template writes after an assistant turn.

        A probe conversation is rendered; the first stop id among the tokens that
        follow the assistant's content is the turn's end (``<|eot_id|>`` for
        Llama 3, ``<|im_end|>`` for ChatML). Without one there, the text end.
        """
        tok, stops = self.tokenizer_, self._stop_ids()
        key = (tok, getattr(tok, "chat_template", None), stops)
        cached = self.__dict__.get("_turn_end_cache")
        if cached is not None and cached[0] is key[0] and cached[1:3] == key[1:]:
            return cached[3]
        ids = self._template_turn_tail()
        end = next((i for i in ids if i in stops), self._text_end_id())
        self._turn_end_cache = (*key, end)
        return end

    # ----- prompts ------------------------------------------------------------------
    def _prompt_prefix(self) -> list[int]:
        """Ids put once at the start of every text prompt: what the tokenizer adds in front.

        A prompt is encoded as the model was trained: a tokenizer that adds BOS by
        default (Llama, Mistral, Gemma) gets it once at the start of the prompt, never
        inside a completion; one that adds nothing (GPT-2) gets nothing. Computed once
        per tokenizer. A conversation gets none: its chat template writes BOS itself.
        """
        tok = self.tokenizer_
        cached = self.__dict__.get("_prefix_cache")
        if cached is None or cached[0] is not tok:
            cached = self._prefix_cache = (tok, _default_prefix(tok))
        return cached[1]

    def _with_prefix(self, ids) -> list[int]:
        """``ids`` behind the prompt prefix, unless they already begin with it."""
        prefix = self._prompt_prefix()
        ids = list(ids)
        return ids if ids[: len(prefix)] == prefix else prefix + ids

    def _render_chats(self, conversations, rows, column: str = "prompt") -> list[str]:
        """Conversations as text: the chat template with the generation prompt."""
        tok = self.tokenizer_
        if not conversations:
            return []
        if getattr(tok, "chat_template", None) is None:
            raise ValueError(
                f"The {column} at row {rows[0]} is a conversation (a list of messages), but "
                "the tokenizer has no chat template to render it; set tokenizer.chat_template "
                "to the model's Jinja template (an instruct model's tokenizer has one), or "
                f"pass the {column} as text."
            )
        out = []
        for row, messages in zip(rows, conversations):
            try:
                out.append(
                    tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                )
            except Exception as error:  # noqa: BLE001 - Jinja raises its own errors
                raise ValueError(
                    f"The chat template cannot render the {column} at row {row} ({error}); "
                    "check its roles and contents against the model's template."
                ) from None
        return out

    def _prompt_ids(self, prompts, *, check_empty: bool = False) -> list[list[int]]:
        """Ids of prompts as the model reads them.

        Text gets the BOS prefix; a conversation is rendered by the chat template and
        tokenised with no special tokens added (the template decides BOS, so there is
        never a second one); token ids stay as they are.
        """
        texts = list(prompts)
        chats = [i for i, p in enumerate(texts) if is_conversation(p)]
        for i, text in zip(chats, self._render_chats([texts[i] for i in chats], chats)):
            texts[i] = text
        rows = self._completion_tokens(texts, add_eos=False, column="prompt")
        out = []
        for i, (p, ids) in enumerate(zip(prompts, rows)):
            if check_empty and not ids:
                raise ValueError(f"Prompt at row {i} ({p!r}) has no tokens.")
            out.append(self._with_prefix(ids) if isinstance(p, str) else ids)
        return out

    def _prompt_tokens(self, prompts) -> list[list[int]]:
        """Ids of prompts as the reward model reads them (see :meth:`_prompt_ids`)."""
        return self._prompt_ids(list(prompts))

    def _encode(self, token_rows) -> EncodedPrompts:
        """Left-pad prompt token lists and move them to the device."""
        enc = pad_left(list(token_rows), self.tokenizer_.pad_token_id)
        return EncodedPrompts(enc.input_ids.to(self.device_), enc.attention_mask.to(self.device_))

    def _token_ids(
        self, texts, column: str, rows=None, add_special_tokens: bool = False
    ) -> list[list[int]]:
        """Token ids of each text, in one batched call; a text the tokenizer refuses is named.

        A word-level tokenizer without an unknown token raises a bare ``Exception``
        on a word outside its vocabulary (an emoji, a control character). ``rows``
        are the texts' row numbers in the caller's input, when not 0, 1, 2...
        """
        texts = list(texts)
        if not texts:
            return []
        try:
            return self.tokenizer_(texts, add_special_tokens=add_special_tokens)["input_ids"]
        except Exception as batch_error:  # noqa: BLE001 - the tokenizers library raises Exception
            for i, text in enumerate(texts):
                try:
                    self.tokenizer_(text, add_special_tokens=add_special_tokens)
                except Exception as error:  # noqa: BLE001
                    row = i if rows is None else rows[i]
                    raise ValueError(
                        f"The {column} at row {row} ({text!r}) cannot be tokenized ({error}): "
                        "a word-level tokenizer with no unknown token cannot encode a word "
                        "outside its vocabulary (an emoji, a control character); remove or "
                        "replace such words."
                    ) from None
            raise batch_error

    def _tokenize_prompts(
        self, prompts, check_length: bool = True, max_new_tokens=None
    ) -> list[list[int]]:
        context = context_length(self.model_)
        if check_length:
            self._check_max_new_tokens(self.model_, max_new_tokens)
        new_tokens = self.max_new_tokens_ if max_new_tokens is None else max_new_tokens
        limit = None if context is None or not check_length else context - new_tokens
        rows = []
        # One call for the whole list: the fast tokenizer batches it.
        encoded = self._prompt_ids(prompts, check_empty=True)
        for i, (p, ids) in enumerate(zip(prompts, encoded)):
            if limit is not None and len(ids) > limit:
                if getattr(self, "truncate_prompts", False) and isinstance(p, str):
                    ids = self._truncated(p, limit, i)
                else:
                    kind = "" if isinstance(p, str) else " (a conversation, never truncated)"
                    raise ValueError(
                        f"Prompt at row {i}{kind} has {len(ids)} tokens, more than the {limit} "
                        f"that fit in the model's context ({context}) with max_new_tokens="
                        f"{new_tokens}; shorten it, lower max_new_tokens, or pass "
                        "truncate_prompts=True (text prompts)."
                    )
            rows.append(ids)
        return rows

    def _truncated(self, prompt: str, limit: int, row: int) -> list[int]:
        """Cut a prompt at the last paragraph, else sentence, boundary that fits.

        The beginning is kept, as Huang et al. 2024 do (the post is cut at the
        last newline that fits the 512-token budget).
        """
        encode = lambda text: self.tokenizer_(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        for pattern in (r"\n\s*\n", r"\n", r"(?<=[.!?])\s+"):
            cuts = [m.start() for m in re.finditer(pattern, prompt)]
            for cut in reversed(cuts):
                ids = encode(prompt[:cut].rstrip())
                ids = self._with_prefix(ids) if ids else ids
                if ids and len(ids) <= limit:
                    return ids
        raise ValueError(
            f"Prompt at row {row} has no paragraph or sentence boundary within the "
            f"first {limit} tokens, so it cannot be truncated; shorten it."
        )

    def _pretraining_tokens(self, texts) -> list[tuple[list[int], list[int]]]:
        """Pretraining texts as ``(context, continuation)`` ids for a next-token loss.

        A text is read as a document: the tokenizer's BOS prefix, the text, and
        its end (the EOS), cut to the model's context. The context is the prefix,
        or the first token where there is none (GPT-2), so the loss predicts
        every other token. A text that leaves nothing to predict is an error
        naming its row.
        """
        context = context_length(self.model_)
        prefix = self._prompt_prefix()
        out = []
        for i, ids in enumerate(self._completion_tokens(texts, add_eos=True, column="text")):
            ids = prefix + ids
            if context is not None:
                ids = ids[:context]
            split = max(len(prefix), 1)
            if len(ids) <= split:
                raise ValueError(
                    f"ptx_data: the text at row {i} ({texts[i]!r}) has no token to predict "
                    "after its first; give it at least one word."
                )
            out.append((ids[:split], ids[split:]))
        return out

    # ----- completions --------------------------------------------------------------
    def _pad_responses(self, token_rows):
        """Right-pad response token lists; ``(ids, mask)`` on the device."""
        ids, mask = pad_right(list(token_rows), self.tokenizer_.pad_token_id)
        return ids.to(self.device_), mask.to(self.device_)

    def _decode(self, response_ids, response_mask) -> list[str]:
        """Text of responses: their stop token (special or not) and special tokens left out."""
        stops = set(self._stop_ids())
        # A response mask is a prefix of ones (truncate_after_eos): cut each row at its
        # length, from one conversion of the whole batch rather than one per row.
        lengths = response_mask.sum(1).tolist()
        ids = [r[:n] for r, n in zip(response_ids.tolist(), lengths)]
        ids = [r[:-1] if r and r[-1] in stops else r for r in ids]
        return self.tokenizer_.batch_decode(ids, skip_special_tokens=True)

    def _completion_tokens(
        self, completions, add_eos: bool = True, column: str = "completion", prompts=None
    ) -> list[list[int]]:
        """Ids of completions (text, messages or token ids); ``add_eos`` ends them with a stop.

        The stop token is the text end (the EOS), or, where ``prompts`` holds a
        conversation, the chat template's end of turn. A completion of several
        messages is rendered by the chat template after its prompt
        (:meth:`_chat_completion_ids`).
        """
        completions = list(completions)
        rows = [i for i, c in enumerate(completions) if isinstance(c, str)]
        encoded = iter(self._token_ids([completions[i] for i in rows], column, rows))
        chat = [is_conversation(p) for p in prompts] if prompts is not None else []
        chat = chat or [False] * len(completions)
        ends = {False: self._text_end_id() if add_eos else None}
        if add_eos and any(chat):
            ends[True] = self._turn_end_id()
        out = []
        for i, (c, in_chat) in enumerate(zip(completions, chat)):
            if isinstance(c, str):
                end = ends[in_chat]
                out.append(list(next(encoded)) + ([] if end is None else [end]))
            elif is_conversation(c):
                prompt = None if prompts is None else prompts[i]
                out.append(self._chat_completion_ids(prompt, c, i, column, add_eos))
            else:
                out.append([int(t) for t in c])
        return out

    def _chat_completion_ids(self, prompt, messages, row: int, column: str, add_eos: bool):
        """Ids of a completion of several messages, as the chat template writes them.

        The template renders the prompt with its generation prompt, and the
        prompt followed by the completion's messages; the completion is what
        the second adds to the first (TRL's rule), so the tool calls, tool
        answers and assistant turns in it are all trained or scored. With
        ``add_eos`` it ends at its last end of turn (what a template writes after
        that, a newline, is left out, as sampling stops there), or gets one.
        """
        if not is_conversation(prompt):
            raise ValueError(
                f"The {column} at row {row} is several messages, which the chat template "
                "renders after a conversation; its prompt must be a conversation (a list "
                "of messages), not text."
            )
        prompt = list(prompt)
        head = self._render_chats([prompt], [row])[0]
        try:
            full = self.tokenizer_.apply_chat_template(prompt + list(messages), tokenize=False)
        except Exception as error:  # noqa: BLE001 - Jinja raises its own errors
            raise ValueError(
                f"The chat template cannot render the {column} at row {row} after its prompt "
                f"({error}); check its roles and contents against the model's template."
            ) from None
        if not full.startswith(head):
            raise ValueError(
                f"The chat template renders the prompt and {column} at row {row} as a text "
                "that does not start with the prompt it renders alone (with its generation "
                "prompt), so the completion cannot be cut from it; give the completion as one "
                "assistant message, or use a template that keeps earlier turns as they are."
            )
        ids = list(self._token_ids([full[len(head) :]], column, [row])[0])
        end = self._turn_end_id() if add_eos else None
        if end is None:
            return ids
        last = max((j for j, t in enumerate(ids) if t == end), default=None)
        return ids[: last + 1] if last is not None else ids + [end]
