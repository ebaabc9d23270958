"""Saving estimators without pickled tensors: weights as safetensors, structure as data.

A fitted estimator's ``__getstate__`` replaces each torch module by
:func:`dump_module` (the weights as safetensors bytes, the structure as a
config or a tensor-free skeleton) and each optimizer or generator by its state;
``__setstate__`` rebuilds them. ``joblib.dump`` / ``joblib.load`` and
checkpoints use this path. Optimizer states are stored with ``torch.save`` and
read back with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import importlib
import io
import json
import os
import pickle
import stat
import threading
import warnings

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from .models import fuse_activations

FORMAT_VERSION = 1
_MODULE_KEY = "__prefopt_module__"
_OPTIMIZER_KEY = "__prefopt_optimizer__"
_GENERATOR_KEY = "__prefopt_generator__"


# ----- reading and writing files of a saved folder ---------------------------------------
def regular_file(folder: str, name: str, what: str) -> str:
    """The path of ``folder/name`` when it is a regular file inside ``folder``; else an error.

    A FIFO, a device or a socket would block or never end a read, and a link
    that leaves the folder would read a file the folder does not hold; each is
    refused with the name it found.

    Parameters
    ----------
    folder : str
        The saved folder.
    name : str
        A file name inside it (no path separators, no ``..``).
    what : str
        What the file is, named in the error.

    Returns
    -------
    path : str

    Examples
    --------
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> os.mkfifo(os.path.join(folder, "pipe"))
    >>> regular_file(folder, "pipe", "the tensors file")
    Traceback (most recent call last):
    ...
    ValueError: ...the tensors file ...pipe' is a FIFO, not a regular file...
    """
    if (
        not isinstance(name, str)
        or not name
        or name != os.path.basename(name)
        or name
        in {
            ".",
            "..",
        }
    ):
        raise ValueError(
            f"{what} in {folder!r} is named {name!r}, which is not a plain file name in the "
            "folder; the folder was not written by prefopt. Save the estimator again."
        )
    path = os.path.join(folder, name)
    real, inside = os.path.realpath(path), os.path.realpath(folder)
    if os.path.commonpath([real, inside]) != inside:
        raise ValueError(
            f"{what} {path!r} is a link to {real!r}, outside the folder; refusing to read it. "
            "Save the estimator again, or copy the file itself into the folder."
        )
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ValueError(f"{what} {path!r} cannot be read ({exc.strerror or exc}).") from None
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a folder"
            if stat.S_ISDIR(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "not a file"
        )
        raise ValueError(
            f"{what} {path!r} is {kind}, not a regular file; refusing to read it (a read could "
            "block for ever). Save the estimator again."
        )
    return path


# JSON nested deeper than this is refused when read: prefopt writes a few levels (a run
# identity's descriptions at most about 150), and reading deeper would recurse past
# Python's limit (a RecursionError out of load or a resume).
MAX_JSON_DEPTH = 256


def loads_json(data: bytes | str, what: str):
    """Parse a JSON file prefopt wrote, refusing one nested past :data:`MAX_JSON_DEPTH`.

    Parameters
    ----------
    data : bytes or str
        The file's content.
    what : str
        Names the file in the error.

    Returns
    -------
    value : JSON data

    Examples
    --------
    >>> loads_json('{"a": [1, 2]}', "the file")
    {'a': [1, 2]}
    >>> loads_json("[" * 300 + "]" * 300, "the file")
    Traceback (most recent call last):
    ...
    ValueError: the file is nested more than 256 levels deep; prefopt writes far fewer, ...
    """
    error = ValueError(
        f"{what} is nested more than {MAX_JSON_DEPTH} levels deep; prefopt writes far fewer, "
        "so it was not written by prefopt (or was edited). Save or fit again."
    )
    try:
        value = json.loads(data)
    except RecursionError:
        raise error from None
    stack = [(value, 1)]
    while stack:  # by hand, not by recursion: the depth itself is what is checked
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise error
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, (dict, list)):
            stack.extend((child, depth + 1) for child in children)
    return value


def read_regular(folder: str, name: str, what: str) -> bytes:
    """The bytes of ``folder/name``, refused unless it is a regular file inside ``folder``."""
    path = regular_file(folder, name, what)
    # O_NONBLOCK: a file swapped for a FIFO after the check still cannot block the read.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{what} {path!r} is not a regular file; refusing to read it.")
        return f.read()


def sha256(data: bytes) -> str:
    """The SHA-256 hex digest of ``data`` (ties a folder's JSON to its tensors file)."""
    return hashlib.sha256(data).hexdigest()


def _write(handle, data: bytes) -> None:
    handle.write(data)
    handle.flush()
    os.fsync(handle.fileno())


def failed_write(path: str, exc: OSError, keeps: str) -> OSError:
    reason = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else exc
    return OSError(
        exc.errno,
        f"Could not write {path!r} ({reason}); {keeps} is kept as it was. Free some space "
        "(or give a folder on another disk) and try again.",
    )


def write_files(folder: str, files: dict, *, keeps: str) -> None:
    """Write each ``name: bytes`` of ``files`` into ``folder``, all or none.

    Every file is first written whole to a temporary file; only when all are
    written are they renamed into place, in the order given (the last one is
    the commit point: a checkpoint's ``state.json``). A write that fails (a full
    disk, a quota) removes the temporary files, leaves the folder's files as they
    were, and raises an ``OSError`` that says so.

    Parameters
    ----------
    folder : str
        The folder to write into.
    files : dict
        File names to their whole content (bytes or str).
    keeps : str
        What stays intact when a write fails, for the error message
        (e.g. "the last complete checkpoint").

    Examples
    --------
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> write_files(folder, {"a.txt": "1", "b.txt": b"2"}, keeps="nothing")
    >>> sorted(os.listdir(folder))
    ['a.txt', 'b.txt']
    """
    unique = f"{os.getpid()}-{threading.get_ident()}"
    written = []
    try:
        for name, data in files.items():
            tmp = os.path.join(folder, f".{name}.tmp-{unique}")
            written.append((tmp, os.path.join(folder, name)))
            with open(tmp, "wb") as handle:
                _write(handle, data.encode() if isinstance(data, str) else data)
    except OSError as exc:
        for tmp, _ in written:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        raise failed_write(written[-1][1], exc, keeps) from exc
    for tmp, path in written:
        os.replace(tmp, path)


def _import(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def qualname(obj) -> str:
    """``module.QualName`` of a class, or of an object's class."""
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _tensors(module: nn.Module) -> dict:
    named = dict(module.named_parameters())
    named.update({f"buffer::{k}": v for k, v in module.named_buffers()})
    # safetensors refuses shared storage; tied weights are re-tied on load.
    return {k: v.detach().cpu().contiguous().clone() for k, v in named.items()}


def transformers_spec(module) -> dict:
    """A transformers model's class, config and generation config as JSON data (no weights).

    Parameters
    ----------
    module : transformers.PreTrainedModel
        The model.

    Returns
    -------
    spec : dict
        What :func:`build_transformers` rebuilds the (untrained) model from.
    """
    generation = getattr(module, "generation_config", None)
    return {
        "kind": "transformers",
        "class": qualname(module),
        "config_class": qualname(module.config),
        "config": module.config.to_dict(),
        "generation_config": None if generation is None else generation.to_dict(),
        "fixed_length": bool(getattr(module, "fixed_length", False)),
    }


def build_transformers(spec: dict, resolve=None):
    """The model :func:`transformers_spec` described, with fresh weights.

    Parameters
    ----------
    spec : dict
        From :func:`transformers_spec`.
    resolve : callable, default=None
        Turns a class's dotted name into the class; ``None`` imports any name
        (the joblib path, for files the user trusts).

    Returns
    -------
    module : transformers.PreTrainedModel
    """
    from transformers import GenerationConfig

    resolve = _import if resolve is None else resolve
    module = resolve(spec["class"])(resolve(spec["config_class"]).from_dict(spec["config"]))
    if spec.get("generation_config") is not None:
        module.generation_config = GenerationConfig.from_dict(spec["generation_config"])
    if spec.get("fixed_length"):
        module.fixed_length = True
    fuse_activations(module)  # as load_causal_lm did for the module that was saved
    return module


def dump_module(module: nn.Module) -> dict:
    """A tensor-free description of ``module`` plus its weights as safetensors bytes.

    Hugging Face models are stored as (class, config, generation config,
    weights) and rebuilt with their class, so tied weights stay tied. Other
    modules are stored as a skeleton on the ``meta`` device plus their
    parameters and buffers.

    Examples
    --------
    >>> from torch import nn
    >>> m = nn.Linear(2, 1)
    >>> m2 = load_module(dump_module(m))
    >>> bool((m2.weight == m.weight).all())
    True
    """
    from transformers import PreTrainedModel

    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    weights = st_save(_tensors(module))
    if isinstance(module, PreTrainedModel):
        extra = {k: v for k, v in vars(module).items() if k == "tokenizer"}
        return {
            **transformers_spec(module),
            "extra": extra,
            "weights": weights,
            "device": str(device),
        }
    # Tied (shared) parameters: remember which names alias which, to re-tie them on load.
    first, aliases = {}, {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    skeleton = copy.deepcopy(module).to("meta")
    return {
        "kind": "skeleton",
        "skeleton": skeleton,
        "weights": weights,
        "aliases": aliases,
        "device": str(device),
    }


def load_module(state: dict, device=None) -> nn.Module:
    """Rebuild a module written by :func:`dump_module`."""
    tensors = st_load(state["weights"])
    if state["kind"] == "transformers":
        module = build_transformers(state)
        for k, v in state.get("extra", {}).items():
            setattr(module, k, v)
    elif state["kind"] == "skeleton":
        module = state["skeleton"].to_empty(device="cpu")
        for alias, name in state.get("aliases", {}).items():
            owner, _, attr = alias.rpartition(".")
            setattr(module.get_submodule(owner), attr, module.get_parameter(name))
    else:
        raise ValueError(
            f"Unknown module format {state['kind']!r}; this file was written by "
            "another prefopt version."
        )
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    with torch.no_grad():
        for name, value in tensors.items():
            if name.startswith("buffer::"):
                target = buffers.get(name[len("buffer::") :])
            else:
                target = params.get(name)
            if target is None:
                raise ValueError(f"Saved tensor {name!r} has no place in {type(module).__name__}.")
            target.copy_(value)
    module.eval()
    return module.to(device or state.get("device", "cpu"))


def dump_optimizer(optimizer: torch.optim.Optimizer) -> dict:
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    return {"class": qualname(optimizer), "state": buffer.getvalue()}


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    loaded = torch.load(io.BytesIO(state["state"]), weights_only=True)
    optimizer.load_state_dict(loaded)


def dump_state(obj) -> dict:
    """``obj.__dict__`` with modules, optimizers and generators replaced by data."""
    out = {"__prefopt_format__": FORMAT_VERSION}
    for key, value in obj.__dict__.items():
        if isinstance(value, nn.Module):
            out[key] = {_MODULE_KEY: dump_module(value)}
        elif isinstance(value, torch.optim.Optimizer):
            out[key] = {_OPTIMIZER_KEY: dump_optimizer(value)}
        elif isinstance(value, torch.Generator):
            out[key] = {
                _GENERATOR_KEY: value.get_state().numpy().tobytes(),
                "device": str(value.device),
            }
        elif key == "reward_model_" and not _picklable(value):
            warnings.warn(
                f"The reward given to {type(obj).__name__}.fit ({value!r}) cannot be "
                "pickled (a lambda or local function?); it is not saved. After "
                "loading, pass it again: score(X, y=reward) or fit(..., reward).",
                UserWarning,
                stacklevel=3,
            )
            out[key] = None
        else:
            out[key] = value
    return out


def _picklable(value) -> bool:
    from sklearn.base import BaseEstimator

    if isinstance(value, BaseEstimator):
        return True  # prefopt's own reward models pickle through this module
    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - any failure means "cannot be saved"
        return False
    return True


def restore_state(obj, state: dict, make_optimizer=None) -> None:
    """Inverse of :func:`dump_state`; ``make_optimizer(obj)`` rebuilds optimizers."""
    version = state.get("__prefopt_format__")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"This {type(obj).__name__} was saved in prefopt format {version!r}, but this "
            f"prefopt reads format {FORMAT_VERSION}; load it with the prefopt version that "
            "wrote it, or refit."
        )
    optimizers = {}
    for key, value in state.items():
        if key == "__prefopt_format__":
            continue
        if isinstance(value, dict) and _MODULE_KEY in value:
            value = load_module(value[_MODULE_KEY])
        elif isinstance(value, dict) and _OPTIMIZER_KEY in value:
            optimizers[key] = value[_OPTIMIZER_KEY]
            continue
        elif isinstance(value, dict) and _GENERATOR_KEY in value:
            generator = torch.Generator(device=value["device"])
            generator.set_state(
                torch.frombuffer(bytearray(value[_GENERATOR_KEY]), dtype=torch.uint8)
            )
            value = generator
        obj.__dict__[key] = value
    for key, saved in optimizers.items():
        if make_optimizer is None:
            raise ValueError(f"Cannot rebuild the optimizer {key!r} of {type(obj).__name__}.")
        optimizer = make_optimizer(obj)
        load_optimizer_state(optimizer, saved)
        obj.__dict__[key] = optimizer
