"""Multi-turn episodes: a policy that acts in an environment and calls tools, batched.

An **environment** is any object with two methods (Gymnasium's names, text in
and out, as OpenEnv and OpenRLHF's executors take them)::

    reset(prompt) -> None or str        # starts an episode; text shown before turn 1
    step(completion) -> (observation, reward, done)   # after each policy turn

either of which may be ``async``, and an optional ``close()`` (also possibly
``async``), called when the episode ends. The estimator's ``environment`` is a class (or
any function returning a fresh environment), one instance per episode, or an
instance, deep-copied per episode. **Tools** are plain functions
(:mod:`~prefopt.policies.loop._tools`).

:class:`EpisodeSampler` stands where a sampler stands in a rollout and answers as
one: every live episode of a step advances together (one generation call per
turn for all of them; an episode that ends drops out), and its
:class:`EpisodeSamples` hold the whole transcript after the prompt (the
policy's turns, the tool results and observations between them), a mask of the
policy's own tokens (``response_mask``: what every loss, KL, entropy and value
target reads), the transcript's mask (``attention_mask``: what the forward
passes attend to), and each turn's reward at that turn's last policy token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.utils import check_random_state

from ...backend import make_generator
from ...backend.samplers import Samples, sampler_for
from ...backend.vllm_engine import sampling_engine
from ...data import is_conversation
from ...lm import context_length
from ._environment import checked_step, gather
from ._tools import TOOL_RESPONSE, parse_tool_calls, run_tool


@dataclass
class EpisodeSamples(Samples):
    """What one batch of episodes produced: a :class:`~prefopt.backend.samplers.Samples`, and more.

    ``response_ids`` hold each transcript after the prompt, ``response_mask``
    the policy's own tokens in it and ``ended`` whether the episode ended
    (the environment said done, or a tools-only episode answered without a
    call) rather than being cut by the turn limit, the token budget or a turn
    with no stop token.

    Parameters
    ----------
    attention_mask : torch.Tensor of shape (n, length)
        1 on every token of the transcript (the policy's and the
        environment's): what a forward pass attends to.
    token_rewards : torch.Tensor of shape (n, length)
        The environment's reward of each turn, at the turn's last policy token.
    stats : dict of str to float
        The episodes' figures for ``history_`` (``episode/...``, ``tools/...``).
    """

    attention_mask: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None
    stats: dict = field(default_factory=dict)


@dataclass
class _Episode:
    """One episode's transcript after the prompt, built turn by turn."""

    ids: list = field(default_factory=list)  # token tensors, in order
    policy: list = field(default_factory=list)  # 1 for the policy's segments, 0 otherwise
    logprobs: list = field(default_factory=list)
    engine: list = field(default_factory=list)
    rewards: dict = field(default_factory=dict)  # position -> the turn's reward
    length: int = 0
    turns: int = 0
    calls: int = 0
    live: bool = True
    ended: bool = False

    def add(self, ids, policy: bool, logprobs=None, engine=None) -> None:
        self.ids.append(ids)
        self.policy.append(policy)
        self.logprobs.append(torch.zeros(len(ids)) if logprobs is None else logprobs)
        self.engine.append(None if engine is None else engine)
        self.length += len(ids)

    def finish(self, ended: bool) -> None:
        self.live, self.ended = False, ended


class EpisodeSampler:
    """A sampler that runs episodes: the environment's and the tools' turns between the policy's.

    Parameters
    ----------
    sampler : NativeSampler or VLLMSampler
        The engine that samples each turn of every live episode at once.
    view : StepView
        Tokenisation (tokenizer, stop ids, encode).
    prompts : list
        The fit's prompts (what ``reset`` receives), indexed by ``prompt_index``.
    prompt_tokens : list of list of int
        Their token ids, which each later turn's context starts with.
    make_env : callable or None
        :func:`check_environment`'s answer.
    tools : dict
        :func:`~prefopt.policies.loop._tools.check_tools`' answer.
    max_turns : int
        Policy turns an episode may take; one that is still going after them is
        truncated (``ended`` false: the missing-EOS rule and GRPO's truncation
        options apply as to a response cut at ``max_new_tokens``).
    max_tokens : int
        Tokens an episode's transcript may hold after its prompt (the policy's
        and the environment's); a turn is cut where the budget ends.
    context : int or None
        The model's context length, which a transcript also stays within.
    tool_timeout : float
        Seconds a tool call may take.
    """

    def __init__(self, sampler, view, *, prompts, prompt_tokens, make_env, tools, max_turns,
                 max_tokens, context=None, tool_timeout=10.0):  # fmt: skip
        self.sampler = sampler
        self.view = view
        self.prompts = prompts
        self.prompt_tokens = prompt_tokens
        self.make_env = make_env
        self.tools = tools
        self.max_turns = int(max_turns)
        self.max_tokens = int(max_tokens)
        self.context = context
        self.tool_timeout = float(tool_timeout)

    def sample(self, model, prompts, *, max_new_tokens, temperature, generator, pad_token_id,
               suppress_ids=(), stop_ids=(), prompt_index=None) -> EpisodeSamples:  # fmt: skip
        """Run one episode a row of ``prompts``; ``prompt_index`` names each row's prompt.

        The first turn is the single-turn call itself (the k samples of a prompt
        share it); each later turn samples every live episode's context (its
        prompt and transcript so far) in one call.
        """
        n = len(prompts)
        rows = prompt_index.tolist()
        envs = [self.make_env() for _ in rows] if self.make_env is not None else [None] * n
        episodes = [_Episode() for _ in rows]
        counts = {"ok": 0, "error": 0, "timeout": 0, "non_string": 0}
        if envs[0] is not None:
            starts = gather([env.reset(self.prompts[r]) for env, r in zip(envs, rows)])
            for episode, r, text in zip(episodes, rows, starts):
                if text is not None:
                    self.add_observation(episode, r, self.observation_ids(text, r))
        full_pass = False
        sampler_kw = dict(temperature=temperature, generator=generator, pad_token_id=pad_token_id,
                          suppress_ids=suppress_ids, stop_ids=stop_ids)  # fmt: skip
        for _ in range(self.max_turns):
            live = [i for i, e in enumerate(episodes) if e.live]
            room = {i: self.room(episodes[i], rows[i]) for i in live}
            for i in [i for i in live if room[i] < 1]:  # the budget is spent: truncated
                episodes[i].finish(False)
            live = [i for i in live if room[i] >= 1]
            if not live:
                break
            width = min(max_new_tokens, min(room[i] for i in live))
            if all(e.length == 0 for e in episodes) and len(live) == n:
                # The first turn is the single-turn call: the k samples of a prompt share it.
                context, index = prompts, prompt_index
            else:
                context = self.view.encode(
                    [self.prompt_tokens[rows[i]] + self.transcript(episodes[i]) for i in live]
                )
                index = None
            sampled = self.sampler.sample(
                model, context, max_new_tokens=width, prompt_index=index, **sampler_kw
            )
            full_pass = sampled.full_pass  # the engine's log-probs: a full pass (vLLM)
            stepping = []  # (row, completion) pairs the environment answers
            for j, i in enumerate(live):
                episode = episodes[i]
                length = min(int(sampled.response_mask[j].sum()), room[i])
                cut = length < int(sampled.response_mask[j].sum())
                engine = sampled.engine_logprobs
                episode.add(
                    sampled.response_ids[j, :length].cpu(),
                    True,
                    sampled.logprobs[j, :length].detach().float().cpu(),
                    None if engine is None else engine[j, :length].float().cpu(),
                )
                episode.turns += 1
                if cut or not bool(sampled.ended[j]):  # no stop token: a truncated turn
                    episode.finish(False)
                    continue
                text = self.view.decode(
                    sampled.response_ids[j : j + 1, :length],
                    sampled.response_mask[j : j + 1, :length],
                )[0]
                calls = parse_tool_calls(text, self.view.tokenizer) if self.tools else []
                if calls:
                    if episode.turns == self.max_turns:  # no turn left to read the results
                        episode.finish(False)
                        continue
                    timeout = self.tool_timeout
                    results = [run_tool(self.tools, name, a, timeout) for name, a in calls]
                    episode.calls += len(results)
                    for result in results:
                        counts[result.status] += 1
                    self.add_observation(episode, rows[i], self.tool_ids(results, rows[i]))
                elif envs[i] is not None:
                    stepping.append((i, text))
                else:  # a tools-only episode answers without a call: it ends
                    episode.finish(True)
            answers = gather([envs[i].step(text) for i, text in stepping])
            for (i, _), answer in zip(stepping, answers):
                episode = episodes[i]
                observation, reward, done = checked_step(answer, type(envs[i]).__name__)
                if reward:
                    episode.rewards[episode.length - 1] = reward  # the turn's last token
                if done:
                    episode.finish(True)
                elif episode.turns == self.max_turns:  # the turn limit: truncated
                    episode.finish(False)
                elif observation:
                    text = self.observation_ids(observation, rows[i])
                    self.add_observation(episode, rows[i], text)
        for episode in episodes:
            if episode.live:  # turns left over: the turn limit
                episode.finish(False)
        # An environment holding a resource (a server session) may have close(): every
        # episode has ended, whether the environment said done or a limit cut it.
        gather([env.close() for env in envs if callable(getattr(env, "close", None))])
        out = self.assemble(episodes, max_new_tokens, pad_token_id, prompts, counts)
        out.full_pass = full_pass
        return out

    # ----- tokens -----------------------------------------------------------------------
    def room(self, episode: _Episode, row: int) -> int:
        """Tokens the episode's next turn may still add, within the budget and the context."""
        room = self.max_tokens - episode.length
        if self.context is not None:
            room = min(room, self.context - len(self.prompt_tokens[row]) - episode.length)
        return room

    def add_observation(self, episode: _Episode, row: int, ids: torch.Tensor) -> None:
        """The environment's tokens, cut to the budget and the context (the next turn sees it)."""
        episode.add(ids[: max(0, self.room(episode, row))], False)

    @staticmethod
    def transcript(episode: _Episode) -> list:
        return torch.cat(episode.ids).tolist() if episode.ids else []

    def text_ids(self, text: str) -> torch.Tensor:
        ids = self.view.tokenizer(text, add_special_tokens=False)["input_ids"]
        return torch.as_tensor(ids, dtype=torch.long)

    def tool_ids(self, results, row: int) -> torch.Tensor:
        """The tool results as the model reads them after its turn."""
        if is_conversation(self.prompts[row]):
            messages = [{"role": "tool", "name": r.name or "error", "content": r.content}
                        for r in results]  # fmt: skip
            return self.text_ids(self.chat_delta(messages))
        return self.text_ids("".join(TOOL_RESPONSE.format(r.content) for r in results))

    def observation_ids(self, text: str, row: int) -> torch.Tensor:
        """An environment's observation: a user message after a conversation, else its text."""
        if is_conversation(self.prompts[row]):
            return self.text_ids(self.chat_delta([{"role": "user", "content": text}]))
        return self.text_ids(text)

    def chat_delta(self, messages) -> str:
        """What the chat template writes after an assistant turn's end for ``messages``.

        A probe conversation is rendered with and without them (and the
        generation prompt): the text after the assistant's end of turn, which the
        policy sampled itself, up to the next assistant turn's start.
        """
        tok = self.view.tokenizer
        marker = "prefopt episode probe"
        head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}]
        base = tok.apply_chat_template(head, tokenize=False)
        full = tok.apply_chat_template(head + messages, tokenize=False, add_generation_prompt=True)
        start = base.rindex(marker) + len(marker)
        cut = start
        for stop in self.view.stop_ids:  # the end of turn the policy sampled, and no further
            text = tok.decode([stop])
            at = base.find(text, start) if text else -1
            if at >= 0 and (cut == start or at + len(text) < cut):
                cut = at + len(text)
        if not full.startswith(base[:cut]):
            raise ValueError(
                "The chat template rewrites earlier turns when a message follows them, so the "
                "transcript of an episode cannot grow turn by turn; use a template that keeps "
                "earlier turns as they are."
            )
        return full[cut:]

    def assemble(self, episodes, max_new_tokens, pad_token_id, prompts, counts) -> EpisodeSamples:
        """The episodes as right-padded tensors on the prompts' device."""
        device = prompts.input_ids.device
        width = max([max_new_tokens] + [e.length for e in episodes])
        n = len(episodes)
        ids = torch.full((n, width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        seen = torch.zeros((n, width), dtype=torch.long)
        logprobs = torch.zeros((n, width))
        rewards = torch.zeros((n, width))
        has_engine = any(x is not None for e in episodes for x in e.engine)
        engine = torch.zeros((n, width)) if has_engine else None
        for i, e in enumerate(episodes):
            at = 0
            for seg, own, lp, en in zip(e.ids, e.policy, e.logprobs, e.engine):
                end = at + len(seg)
                ids[i, at:end] = seg
                mask[i, at:end] = int(own)
                logprobs[i, at:end] = lp
                if en is not None:
                    engine[i, at:end] = en
                at = end
            seen[i, :at] = 1
            for position, value in e.rewards.items():
                rewards[i, position] = value
        calls = sum(counts.values())
        stats = {
            "episode/turns": sum(e.turns for e in episodes) / n,
            "episode/truncated_share": sum(not e.ended for e in episodes) / n,
            "episode/length": float(seen.sum()) / n,
        }
        if self.tools:
            failed = counts["error"] + counts["timeout"] + counts["non_string"]
            stats.update({
                "tools/calls": calls / n,
                "tools/error_share": failed / calls if calls else 0.0,
                "tools/timeouts": float(counts["timeout"]),
                "tools/non_string": float(counts["non_string"]),
                "tools/no_call_share": sum(e.calls == 0 for e in episodes) / n,
            })  # fmt: skip
        ended = torch.tensor([e.ended for e in episodes], dtype=torch.bool)
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return EpisodeSamples(
            move(ids), move(mask), move(ended), move(logprobs), move(engine),
            attention_mask=move(seen), token_rewards=move(rewards), stats=stats,
        )  # fmt: skip


def episode_token_scores(token_scores, samples: EpisodeSamples, last, view) -> torch.Tensor:
    """The per-token rewards of episodes: the final score at the last token, each turn's at its.

    ``token_scores`` holds the reward's score of each transcript at the
    policy's last token (``last``); the environment's reward of each turn
    (``samples.token_rewards``) is added at that turn's last token. A truncated
    episode totals ``missing_eos_reward`` when the rule is on, as a
    per-token reward does: the turns' rewards stay and the last token gets the
    difference.
    """
    rewards = samples.token_rewards
    out = token_scores + rewards
    if view.missing_eos_reward is not None and view.stop_ids:
        rows = torch.nonzero(~samples.ended).flatten()
        out[rows, last[rows]] -= rewards[rows].sum(1)
    return out


def episode_sampler(sampler, view, prompts, prompt_tokens) -> EpisodeSampler:
    """The fit's :class:`EpisodeSampler` around ``sampler``, from ``view.episodes``.

    Conversation prompts are rendered again with the tools' schemas (the chat
    template's ``tools`` argument), which is how a chat model learns what it may call.
    """
    settings = dict(view.episodes)
    tools = settings["tools"]
    if tools:
        schemas = [schema for _, schema in tools.values()]
        prompt_tokens = list(prompt_tokens)
        for i, prompt in enumerate(prompts):
            if is_conversation(prompt):
                text = view.tokenizer.apply_chat_template(
                    list(prompt), tools=schemas, add_generation_prompt=True, tokenize=False
                )
                prompt_tokens[i] = view.tokenizer(text, add_special_tokens=False)["input_ids"]
    return EpisodeSampler(
        sampler, view, prompts=prompts, prompt_tokens=prompt_tokens,
        context=context_length(view.model), **settings,
    )  # fmt: skip


def run_episodes(view, prompts, *, random_state) -> dict:
    """One episode a prompt with a fitted policy's view, outside a fit (sampling, no gradient).

    Returns the transcripts as text (``transcript``), the environment's total
    reward of each (``environment_reward``), whether each ended (``ended``),
    and the episodes' figures (``stats``).
    """
    tokens = view.tokenize_prompts(prompts)
    seed = check_random_state(random_state).randint(np.iinfo(np.int32).max)
    # Under generation="vllm", one engine for the episodes' turns, closed after them.
    with sampling_engine():
        sampler = episode_sampler(sampler_for(view.model), view, prompts, tokens)
        with torch.inference_mode():
            out = sampler.sample(
                view.model,
                view.encode(sampler.prompt_tokens),
                max_new_tokens=view.max_new_tokens,
                temperature=view.temperature,
                generator=make_generator(int(seed)),
                pad_token_id=view.pad_token_id,
                suppress_ids=view.suppress_ids,
                stop_ids=view.stop_ids,
                prompt_index=torch.arange(len(prompts)),
            )
    return {
        "transcript": view.decode(out.response_ids, out.attention_mask),
        "environment_reward": out.token_rewards.sum(1).cpu().numpy().astype(np.float64),
        "ended": out.ended.cpu().numpy(),
        "stats": out.stats,
    }
