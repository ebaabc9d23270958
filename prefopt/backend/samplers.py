"""Sampling engines as objects: prefopt's own sampler, or a vLLM engine, given to a rollout.

A rollout holds one sampler for the whole fit and calls its ``sample``, which
returns a :class:`Samples`: the responses truncated after their first stop id,
their mask, whether each ended, the policy's log-probs of the sampled tokens (the
sampling pass's), and the engine's own log-probs when an engine other than the
policy drew them. Nothing the sampler measured travels through module state.
:func:`sampler_for` picks the one ``set_config(generation=...)`` names; a vLLM
sampler is given its engine (:class:`~prefopt.backend.vllm_engine.VLLMEngine`), an
object, and the fit's optimiser, whose steps the engine counts as weight changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._config import get_config
from . import vllm_engine
from .generation import response_logprobs, truncate_after_eos
from .generation import sample as native_sample

__all__ = ["NativeSampler", "Samples", "VLLMSampler", "sampler_for"]


@dataclass
class Samples:
    """What one sampling call drew.

    Parameters
    ----------
    response_ids, response_mask : torch.Tensor of shape (n, max_new_tokens)
        Responses truncated after the first stop id, and the mask up to and
        including it.
    ended : torch.Tensor of bool, shape (n,)
        Whether each response holds a stop id.
    logprobs : torch.Tensor of shape (n, max_new_tokens)
        The policy's log-probs of the sampled tokens at the sampling temperature.
    engine_logprobs : torch.Tensor of shape (n, max_new_tokens) or None
        The sampling engine's own log-probs, 0 outside the mask; ``None`` when
        the policy itself sampled (the native sampler).
    full_pass : bool, default=False
        Whether ``logprobs`` come from one forward pass of the policy over the
        prompts and the responses as returned (:func:`~prefopt.backend.response_logprobs`,
        the pass a policy's update takes), rather than from the sampling pass's
        cache: a rollout that needs such a pass for its old log-probs then runs
        no second one.
    behaviour_logprobs : torch.Tensor of shape (n, max_new_tokens) or None
        With overlapped rollouts (``max_staleness``): the log-probs of the
        policy that sampled, whose weights may be older than the current ones;
        ``None`` when the current weights sampled.
    staleness : int
        Updates between the weights that sampled and the current ones.
    """

    response_ids: torch.Tensor
    response_mask: torch.Tensor
    ended: torch.Tensor
    logprobs: torch.Tensor
    engine_logprobs: torch.Tensor | None = None
    full_pass: bool = False
    behaviour_logprobs: torch.Tensor | None = None
    staleness: int = 0


class NativeSampler:
    """prefopt's own batched sampler with a KV cache (:func:`prefopt.backend.sample`).

    Examples
    --------
    >>> import torch
    >>> from prefopt.backend import EncodedPrompts
    >>> from prefopt.worlds import PreferenceWorld
    >>> model = PreferenceWorld(random_state=0).policy_model()
    >>> prompts = EncodedPrompts(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1))
    >>> out = NativeSampler().sample(model, prompts, max_new_tokens=1, temperature=1.0,
    ...                              generator=torch.Generator().manual_seed(0), pad_token_id=0)
    >>> out.response_ids.shape, out.engine_logprobs is None
    (torch.Size([2, 1]), True)
    """

    def sample(
        self,
        model,
        prompts,
        *,
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator,
        pad_token_id: int,
        suppress_ids=(),
        stop_ids=(),
        prompt_index=None,
    ) -> Samples:
        """Draw one response a row of ``prompts``; see :class:`Samples`.

        Parameters
        ----------
        model : torch.nn.Module
        prompts : EncodedPrompts
            Left-padded prompts.
        max_new_tokens : int
        temperature : float
        generator : torch.Generator
        pad_token_id : int
            What pads a response after its stop id.
        suppress_ids : sequence of int, default=()
            Ids never sampled.
        stop_ids : sequence of int, default=()
            The ids that end a response; ``()``: fixed-length responses.
        prompt_index : torch.Tensor of shape (n,), default=None
            Rows with equal values hold the same prompt, run once.

        Returns
        -------
        samples : Samples
        """
        stops = tuple(stop_ids) or None
        raw, logprobs = native_sample(
            model,
            prompts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            generator=generator,
            suppress_ids=suppress_ids,
            eos_token_id=stops,
            return_logprobs=True,
            prompt_index=prompt_index,
        )
        ids, mask, ended = truncate_after_eos(raw, stops, pad_token_id)
        return Samples(ids, mask, ended, logprobs)

    def close(self) -> None:
        """Nothing to release: the native sampler holds no engine."""


class VLLMSampler:
    """The sampler of a fit under a vLLM engine (``set_config(generation=...)``); rollouts hold it.

    Its :meth:`sample` answers as :class:`~prefopt.backend.samplers.NativeSampler`'s
    does, and returns the engine's own log-probs of the sampled tokens beside the
    policy's (``Samples.engine_logprobs``). It is given its engine (the fit's,
    see :func:`~prefopt.backend.vllm_engine.sampling_engine`) and the optimiser whose
    steps change the weights the engine must hold.

    Parameters
    ----------
    model : torch.nn.Module
        The policy, a transformers causal LM (checked here, before any work).
    engine : VLLMEngine, default=None
        The engine to sample with; ``None`` builds one that :meth:`close` closes.
    optimizer : torch.optim.Optimizer, default=None
        The fit's optimiser: the engine counts its steps as weight changes (a
        fused AdamW bumps no version counter) until :meth:`close`.

    Examples
    --------
    >>> import torch
    >>> VLLMSampler(torch.nn.Linear(1, 1))
    Traceback (most recent call last):
    ...
    ValueError: generation='vllm' samples transformers causal LMs; Linear is not one...
    """

    def __init__(self, model, engine=None, optimizer=None):
        vllm_engine._check_model(model)
        vllm_engine.check_ranks()  # the fit's ranks; an engine refused a split of its own
        self.owns_engine = engine is None
        self.engine = vllm_engine.VLLMEngine() if engine is None else engine
        self._watch = None if optimizer is None else self.engine.watch(optimizer)

    def sample(self, model, prompts, *, max_new_tokens, temperature, generator, pad_token_id,
               suppress_ids=(), stop_ids=(), prompt_index=None):  # fmt: skip
        """Draw one response a row; see :meth:`NativeSampler.sample`.

        Parameters
        ----------
        model : torch.nn.Module
        prompts : EncodedPrompts
        max_new_tokens : int
        temperature : float
        generator : torch.Generator
        pad_token_id : int
        suppress_ids : sequence of int, default=()
        stop_ids : sequence of int, default=()
        prompt_index : torch.Tensor of shape (n,), default=None

        Returns
        -------
        samples : Samples
            With ``engine_logprobs``, the engine's log-probs after temperature.
        """
        stops = tuple(stop_ids) or None
        tokens, engine = self.engine.generate(model, prompts, max_new_tokens=max_new_tokens,
                                              temperature=temperature, generator=generator,
                                              suppress_ids=suppress_ids, eos_token_id=stops,
                                              prompt_index=prompt_index)  # fmt: skip
        ids, mask, ended = truncate_after_eos(tokens, stops, pad_token_id)
        # The policy's log-probs of the sampled tokens: one forward pass over the responses
        # as the rollout and the update read them (padded with pad_token_id), the very pass
        # a ratio policy's old log-probs come from, so the rollout runs no second one.
        policy = response_logprobs(
            model, prompts, ids, mask, temperature=temperature, suppress_ids=suppress_ids,
            prompt_index=prompt_index,
        )  # fmt: skip
        return Samples(ids, mask, ended, policy, engine * mask, full_pass=True)

    def close(self) -> None:
        """Stop counting the optimiser's steps; close the engine if this sampler built it."""
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
        if self.owns_engine:
            self.engine.close()


def sampler_for(model, optimizer=None):
    """The sampler ``set_config(generation=...)`` names, for ``model``.

    Parameters
    ----------
    model : torch.nn.Module
        The policy; an engine needs a transformers causal LM.
    optimizer : torch.optim.Optimizer, default=None
        The fit's optimiser, whose steps an engine counts as weight changes.

    Returns
    -------
    sampler : NativeSampler or VLLMSampler
        Under ``generation="vllm"`` the sampler builds its own engine (a fit's
        :func:`~prefopt.backend.vllm_engine.sampling_engine` block names one
        instead); under an engine object, that one.

    Examples
    --------
    >>> type(sampler_for(None)).__name__
    'NativeSampler'
    """
    generation = get_config()["generation"]
    if generation == "native":
        return NativeSampler()
    return VLLMSampler(model, None if generation == "vllm" else generation, optimizer)
