"""Values described by content: the JSON data a run identity is built from.

:func:`describe` turns a parameter into JSON data that changes whenever the
value would change the run: numbers and strings as they are, objects by their
full content (a model config's every field, a tokenizer's vocabulary, special
tokens and chat template, a ``LoraConfig``'s fields, a KL controller's
parameters, a ``RandomState``'s state, a module's weights and config), a
fitted estimator by its parameters and fitted state (a reward model: its
weights' digest), and a function by its identity.

A function's identity is its module and qualified name, a digest of its source
and one of its bytecode (two lambdas on one line share their source line, not
their code), its defaults, and the values its closure captured, each described
by the same rules; a bound method's adds its instance, a ``functools.partial``
its arguments, and a callable object its class's code and its attributes
(``__slots__`` included). Data is described by content, every element hashed:
arrays and tensors by their bytes, a pandas frame by its labels, types and
values, a dict's keys by their type as well as their text. No memory address
enters a description: an object with no readable content (no attributes, no
slots, a default ``repr``) is marked ``opaque``, and a reward whose description
is not exact is also identified by its behaviour (``_probe.py``). Globals a
function reads are not part of its description (the probe sees their effect):
a function whose behaviour depends on a global or a file can declare its
identity with an ``__prefopt_identity__`` attribute (any JSON data, e.g. a
version string), which then replaces every other rule.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
import re
import types
import weakref

import numpy as np
import torch
from torch import nn

from ..backend.models import is_fitted

IDENTITY_ATTRIBUTE = "__prefopt_identity__"
# Code from these packages reads no user global that changes a run: no behaviour probe.
LIBRARIES = ("prefopt.", "torch.", "transformers.", "peft.", "numpy.", "sklearn.", "builtins.")
# Config keys that name where a model came from, not what it is.
_PROVENANCE = frozenset({"_name_or_path", "_commit_hash", "transformers_version"})
# Fitted attributes that record how a fit went (timings), not what it learnt.
_NOT_CONTENT = frozenset({"history_", "device_"})
# Lists longer than this (and texts 20 times longer) are described by a digest.
_LONG = 64
# Objects nested deeper than this are marked opaque (a reward is then probed).
_DEEP = 100
# Keys that name what is described: the first difference reported, when they differ.
_NAMES = ("function", "type", "class", "callable", "module", "config", "tokenizer")
# A memory address in a repr ("<Foo object at 0x7f...>"): never part of an identity.
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


def digest(data: bytes | str) -> str:
    """A short SHA-256 hex digest of bytes or text."""
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()[:16]


def _json_digest(data) -> str:
    return digest(json.dumps(data, sort_keys=True))


def fingerprint(value) -> str:
    """A short hash of data by content (prompts, columns, comparisons, descriptions).

    Every element counts: arrays by their bytes, never by an abbreviated ``str``;
    ``{1: x}`` and ``{"1": x}`` differ.

    Examples
    --------
    >>> fingerprint({"a": 1}) == fingerprint({"a": 1}) != fingerprint({"a": 2})
    True
    >>> fingerprint({1: "x"}) == fingerprint({"1": "x"})
    False
    """
    return _json_digest(describe(value))


def _tensor_digest(tensor: torch.Tensor) -> str:
    t = tensor.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{tuple(t.shape)}:{t.dtype}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def _config_dict(config) -> dict:
    return {k: v for k, v in config.to_dict().items() if k not in _PROVENANCE}


def module_fingerprint(module: nn.Module) -> str:
    """A hash of a module's class, weights, and (for transformers and peft) its configs.

    Config fields that leave the weights' shapes alone (the activation, a layer
    norm's epsilon, ``rope_theta``) change the run, so they count as well.

    Examples
    --------
    >>> from torch import nn
    >>> a, b = nn.Linear(2, 1), nn.Linear(2, 1)
    >>> module_fingerprint(a) == module_fingerprint(b)
    False
    """
    h = hashlib.sha256(type(module).__qualname__.encode())
    for name, tensor in sorted(module.state_dict().items()):
        h.update(f"{name}:{_tensor_digest(tensor)}".encode())
    configs = {}
    config = getattr(module, "config", None)
    if hasattr(config, "to_dict"):
        configs["config"] = _config_dict(config)
    generation = getattr(module, "generation_config", None)
    if hasattr(generation, "to_dict"):
        configs["generation_config"] = _config_dict(generation)
    peft = getattr(module, "peft_config", None)
    if isinstance(peft, dict):
        configs["peft_config"] = {k: _config_dict(v) for k, v in peft.items()}
    if configs:
        h.update(json.dumps(describe(configs), sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _code_digest(code: types.CodeType) -> str:
    # Constants by description, not repr: a frozenset's repr follows the process's hash seed.
    consts = [
        _code_digest(c) if isinstance(c, types.CodeType) else describe(c) for c in code.co_consts
    ]
    names = (consts, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)
    return digest(code.co_code + json.dumps(names, sort_keys=True).encode())


def _source_digest(obj) -> str | None:
    try:
        return digest(inspect.getsource(obj))
    except (OSError, TypeError):
        return None


def _qualname(obj) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def _cell(cell, seen):
    try:
        return describe(cell.cell_contents, seen)
    except ValueError:  # a cell not yet assigned
        return {"cell": "empty"}


def _names(code: types.CodeType) -> set:
    """The global names a code object (and the code nested in it) may read."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def data_globals(fn, visited=None) -> list[str]:
    """The module globals holding data that a user's function reads, through its helpers too.

    Modules, classes and builtins are code, not data; a global function of the
    user's is followed into. A library's own functions read only their constants.

    Examples
    --------
    >>> data_globals(len), data_globals(describe)
    ([], [])
    """
    visited = set() if visited is None else visited
    if (
        not isinstance(fn, types.FunctionType)
        or fn in visited
        or _qualname(fn).startswith(LIBRARIES)
    ):
        return []
    visited.add(fn)
    found = set()
    for name in _names(fn.__code__):
        value = fn.__globals__.get(name)
        if isinstance(value, types.FunctionType):
            found.update(data_globals(value, visited))
        elif name in fn.__globals__ and not isinstance(
            value, (types.ModuleType, type, types.BuiltinFunctionType)
        ):
            found.add(name)
    return sorted(found)


def _describe_function(fn, seen) -> dict:
    out = {
        "function": _qualname(fn),
        "source": _source_digest(fn),
        "code": _code_digest(fn.__code__),
        "defaults": describe(fn.__defaults__, seen),
        "kwdefaults": describe(fn.__kwdefaults__, seen),
        "closure": [_cell(cell, seen) for cell in (fn.__closure__ or ())],
    }
    read = data_globals(fn)
    if read:  # their names, not values (a counter would change it): a probe sees their effect
        out["globals"] = read
    return out


def _class_code(cls) -> dict:
    """A class's code: its source, or each method's bytecode where no source can be read."""
    out = {}
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            continue
        source = _source_digest(klass)
        if source is None:
            source = {
                name: _code_digest(fn.__code__)
                for name, fn in sorted(vars(klass).items())
                if isinstance(fn, types.FunctionType)
            }
        out[_qualname(klass)] = source
    return out


def _slots(value) -> dict:
    out = {}
    for klass in type(value).__mro__:
        slots = vars(klass).get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                out[name] = getattr(value, name)
    return out


def _describe_pandas(value, seen) -> dict:
    import pandas as pd

    frame = value.to_frame() if isinstance(value, pd.Series) else value
    if isinstance(value, pd.Index):
        frame = pd.DataFrame({"index": value})
    return {
        "pandas": type(value).__name__,
        "columns": describe([describe(c, seen) for c in frame.columns], seen),
        "dtypes": [str(t) for t in frame.dtypes],
        "index": describe(frame.index.tolist(), seen),
        "values": [describe(frame.iloc[:, i].tolist(), seen) for i in range(frame.shape[1])],
    }


def _describe_tokenizer(tok) -> dict:
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:  # a fast tokenizer: its whole definition (vocab, BOS/EOS rules)
        content = digest(backend.to_str())
    else:
        content = fingerprint(sorted(tok.get_vocab().items()))
    return {
        "tokenizer": type(tok).__qualname__,
        "content": content,
        "special_tokens": describe(tok.special_tokens_map),
        "special_ids": describe(
            {
                k: getattr(tok, f"{k}_token_id", None)
                for k in ("bos", "eos", "pad", "unk", "sep", "cls")
            }
        ),
        "added_tokens": fingerprint(sorted(tok.get_added_vocab().items())),
        "chat_template": describe(getattr(tok, "chat_template", None)),
        "padding_side": tok.padding_side,
        "truncation_side": tok.truncation_side,
        "add_bos_token": describe(getattr(tok, "add_bos_token", None)),
        "add_eos_token": describe(getattr(tok, "add_eos_token", None)),
    }


def _describe_estimator(est, seen) -> dict:
    out = {"class": _qualname(type(est)), "params": describe(est.get_params(deep=False), seen)}
    if is_fitted(est):  # a reward model or starting policy: what it learnt
        out["fitted"] = {
            k: describe(v, seen)
            for k, v in sorted(vars(est).items())
            if k.endswith("_") and not k.startswith("_") and k not in _NOT_CONTENT
        }
    return out


def _describe_object(value, seen):  # noqa: PLR0911, C901 - one rule per kind of object
    import pandas as pd
    from sklearn.base import BaseEstimator
    from transformers import GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase

    if isinstance(value, BaseEstimator):
        return _describe_estimator(value, seen)
    if isinstance(value, nn.Module):
        out = {"module": type(value).__qualname__, "fingerprint": module_fingerprint(value)}
        if not _qualname(type(value)).startswith(LIBRARIES):  # a user's module: its forward too
            out["code"] = _class_code(type(value))
        return out
    if isinstance(value, (PretrainedConfig, GenerationConfig)):
        return {"config": _qualname(type(value)), "fields": describe(_config_dict(value), seen)}
    if isinstance(value, PreTrainedTokenizerBase):
        return _describe_tokenizer(value)
    if isinstance(value, (pd.DataFrame, pd.Series, pd.Index)):
        return _describe_pandas(value, seen)
    if isinstance(value, np.ndarray) and value.dtype.kind in "OUSVMm":  # objects, text: each one
        return {"array": list(value.shape), "items": describe(value.ravel().tolist(), seen)}
    if isinstance(value, (torch.Tensor, np.ndarray)):
        tensor = torch.as_tensor(value) if isinstance(value, np.ndarray) else value
        return {"tensor": _tensor_digest(tensor)}
    if isinstance(value, np.random.RandomState):
        name, keys, pos, has_gauss, gauss = value.get_state()
        return {
            "RandomState": digest(keys.tobytes() + repr((name, pos, has_gauss, gauss)).encode())
        }
    if isinstance(value, np.random.Generator):
        return {"Generator": describe(value.bit_generator.state, seen)}
    if isinstance(value, torch.Generator):
        return {"torch.Generator": digest(value.get_state().numpy().tobytes())}
    if hasattr(value, "to_dict") and type(value).__module__.startswith("peft"):
        return {"config": _qualname(type(value)), "fields": describe(value.to_dict(), seen)}
    if isinstance(value, functools.partial):
        return {
            "partial": describe(value.func, seen),
            "args": describe(value.args, seen),
            "keywords": describe(value.keywords, seen),
        }
    if isinstance(value, types.MethodType):
        return {"method": describe(value.__func__, seen), "self": describe(value.__self__, seen)}
    if isinstance(value, types.FunctionType):
        return _describe_function(value, seen)
    if isinstance(value, (types.BuiltinFunctionType, type)):
        return {"callable": _qualname(value)}
    if isinstance(value, types.ModuleType):
        return {"module": value.__name__}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": len(value), "digest": digest(bytes(value))}
    if isinstance(value, weakref.ref):  # what it points to, never where
        return {"weakref": describe(value(), seen)}
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"dataclass": _qualname(type(value)), "fields": describe(fields, seen)}
    return _describe_plain(value, seen)


def _describe_plain(value, seen) -> dict:
    """Any other object: its class's code (when callable), its attributes and slots."""
    out = {"type": _qualname(type(value))}
    if callable(value):
        out["code"] = _class_code(type(value))
        read = sorted(
            {n for f in vars(type(value)).values() if callable(f) for n in data_globals(f)}
        )
        if read:
            out["globals"] = read
    state = dict(vars(value)) if hasattr(value, "__dict__") else {}
    state.update(_slots(value))
    text = repr(value) if type(value).__repr__ is not object.__repr__ else None
    if state:
        out["state"] = describe(state, seen)
    elif text is not None and not _ADDRESS.search(text):
        out["repr"] = text if len(text) <= 20 * _LONG else digest(text)
    elif not callable(value) or type(value).__module__ != "builtins":
        out["opaque"] = "no readable content"
    return out


def describe(value, seen=None):
    """A JSON description of a value that changes whenever the value would change a run.

    Parameters
    ----------
    value : object
        A parameter, a reward, a labeler, or anything they hold.
    seen : set, default=None
        Ids of the objects being described (a cycle is described by its type).

    Returns
    -------
    description : JSON data

    Examples
    --------
    >>> import numpy as np
    >>> describe([1, "a", None])
    [1, 'a', None]
    >>> describe(np.random.RandomState(0)) == describe(np.random.RandomState(0))
    True
    >>> describe(np.random.RandomState(0)) == describe(np.random.RandomState(1))
    False
    >>> def reward(prompts, completions):
    ...     return [len(c) for c in completions]
    >>> reward.__prefopt_identity__ = "length v1"
    >>> describe(reward)
    {'declared': 'length v1'}
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value if len(value) <= 20 * _LONG else {"text": len(value), "digest": digest(value)}
    if isinstance(value, (int, float, np.integer, np.floating)):
        value = value.item() if isinstance(value, np.generic) else value
        # NaN is not equal to itself, and JSON has no infinity: compare their text.
        return value if not isinstance(value, float) or np.isfinite(value) else repr(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, torch.dtype):
        return str(value)
    seen = set() if seen is None else seen
    if id(value) in seen:
        return {"cycle": _qualname(type(value))}
    if len(seen) > _DEEP:  # nested past what a description can follow: the probe tells it
        return {"type": _qualname(type(value)), "opaque": "nested too deep"}
    seen.add(id(value))
    try:
        if isinstance(value, (list, tuple)):
            items = [describe(v, seen) for v in value]
            # A long list (a closure's corpus) by its digest: state.json stays small.
            return (
                items
                if len(items) <= _LONG
                else {"items": len(items), "digest": _json_digest(items)}
            )
        if isinstance(value, (set, frozenset)):
            items = [describe(v, seen) for v in value]
            return {"set": sorted(items, key=lambda v: json.dumps(v, sort_keys=True))}
        if isinstance(value, dict):
            if all(isinstance(k, str) for k in value):
                return {k: describe(v, seen) for k, v in value.items()}
            # Keys of other types by their description: {1: x} is not {"1": x}.
            items = [[describe(k, seen), describe(v, seen)] for k, v in value.items()]
            return {"dict": sorted(items, key=lambda kv: json.dumps(kv, sort_keys=True))}
        declared = getattr(value, IDENTITY_ATTRIBUTE, None)
        if declared is not None and not isinstance(value, type):
            return {"declared": describe(declared, seen)}
        return _describe_object(value, seen)
    finally:
        seen.discard(id(value))


def first_difference(saved, current, path: str = "") -> tuple[str, object, object]:
    """The first place two descriptions differ: ``(path, saved value, current value)``.

    Examples
    --------
    >>> first_difference({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}})
    ('a.c', 2, 3)
    """
    if isinstance(saved, dict) and isinstance(current, dict):
        # What a thing is called before how it is written: "function" before "code".
        for key in sorted(set(saved) | set(current), key=lambda k: (k not in _NAMES, k)):
            if saved.get(key) != current.get(key):
                sub = f"{path}.{key}" if path else str(key)
                return first_difference(saved.get(key), current.get(key), sub)
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        for i, (a, b) in enumerate(zip(saved, current)):
            if a != b:
                return first_difference(a, b, f"{path}[{i}]")
    return path, saved, current
