"""What a step needs of the policy, gathered once per fit: :class:`StepView`.

:meth:`Algorithm._step_view <prefopt.policies.Algorithm>` builds it when a fit
starts; the loop, its rollout and its update read it and nothing else of the
estimator. It holds the modules (policy, value model, reference), the
tokenisation (encode, decode, pad), the sampling settings (stop and suppressed
ids, k, temperatures), the parameters the step reads, the algorithm's methods and
its declared hooks (:class:`~prefopt.policies.loop._contract.Algorithm`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...backend import distributed, response_logprobs


@dataclass(frozen=True)
class StepView:
    """The policy as the step sees it: modules, tokenisation, settings, algorithm, hooks.

    Frozen: a step reads it, never writes it; a new fit builds a new one.
    """

    # who, for messages
    name: str
    # the modules
    model: torch.nn.Module
    value_model: torch.nn.Module | None
    trained: dict  # the modules the optimiser trains, by attribute name
    reference: Callable  # a context manager yielding the frozen reference
    device: torch.device
    # tokenisation
    tokenizer: object
    tokenize_prompts: Callable  # prompts -> token lists (checked against the context)
    pretraining_tokens: Callable  # texts -> (context, continuation) token lists
    encode: Callable  # token lists -> EncodedPrompts on the device
    decode: Callable  # (response_ids, response_mask) -> list of str
    pad_responses: Callable  # token lists -> (ids, mask), right-padded, on the device
    pad_token_id: int
    stop_ids: tuple
    suppress_ids: tuple
    # sampling
    k: int
    temperature: float
    training_temperature: float
    max_new_tokens: int
    # the algorithm: its methods and declarations
    compute_advantages: Callable
    compute_loss: Callable
    after_update: Callable
    kl_penalty: str
    kl_advice: str  # what a warning of a policy far from the reference advises
    recomputes_old_logprobs: bool
    loss_reduction: str  # how compute_loss sums over a minibatch's parts
    needs_reference: bool
    resample_tied_groups: int | None  # extra rounds of resampling, or None
    # the parameters the step reads
    batch_size: int
    n_epochs: int
    n_minibatches: int
    micro_batch_size: int | None
    n_steps: int
    learning_rate: float
    lr_schedule: str
    lr_controller: object | None  # the fit's AdaptiveLR (its state moves), or None: fixed
    max_grad_norm: float | None
    entropy_coef: float
    ptx_coef: float
    kl_estimator: str
    missing_eos_reward: float | None
    importance_sampling_cap: float | None
    max_kl: float | None
    max_kl_action: str
    min_eos_share: float | None
    checkpoint_every: int
    refit_every: int | None
    # overlapped rollouts (policies/loop/_overlap.py): None is a synchronous fit
    max_staleness: int | None = None
    off_policy_cap: float | None = None
    # multi-turn episodes: the environment's maker, the tools, the turn and token limits
    # (EpisodeSampler's keyword arguments), or None for one response a prompt
    episodes: dict | None = None

    def pass_rows(self, n: int) -> int:
        """Rows per pass over ``n`` rows: ``micro_batch_size``, else a minibatch's."""
        if self.micro_batch_size is not None:
            return self.micro_batch_size
        return max(1, n // self.n_minibatches)

    def logprobs(self, model, prompts, response_ids, attend, prompt_index, rows: int):
        """``model``'s log-probs of the responses, without gradients, ``rows`` rows a pass.

        At the sampling temperature with the suppressed ids, as the rollout's and the
        update's passes take them; in passes of ``rows`` rows (:meth:`pass_rows`) so that
        the peak memory (logits over the vocabulary) is no more than a training pass's.
        """
        with torch.no_grad():
            out = torch.cat(
                [
                    response_logprobs(
                        model,
                        prompts[i : i + rows],
                        response_ids[i : i + rows],
                        attend[i : i + rows],
                        temperature=self.temperature,
                        suppress_ids=self.suppress_ids,
                        prompt_index=prompt_index[i : i + rows],
                    )
                    for i in range(0, len(response_ids), rows)
                ]
            )
        if distributed.is_sharded(model):
            # FSDP2 leaves a root module's parameters gathered after a forward pass (it
            # expects the backward next); with none coming, put them back in their shards,
            # or the optimiser no longer finds its parameters in the model (a checkpoint
            # after the adaptive rate's measuring pass failed with KeyError 0).
            model.reshard()
        return out

    @property
    def models(self) -> tuple:
        """The policy and the value model (``None`` when there is none)."""
        return self.model, self.value_model
