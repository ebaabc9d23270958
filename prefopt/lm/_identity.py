"""What defines a run: one description used to decide a resume and to name a run's folder.

:func:`describe` turns a parameter into JSON data that changes whenever the
value would change the run: numbers and strings as they are, objects by their
full content (a model config's every field, a tokenizer's vocabulary, special
tokens and chat template, a ``LoraConfig``'s fields, a KL controller's
parameters, a ``RandomState``'s state, a module's weights and config), a
fitted estimator by its parameters and fitted state (a reward model: its
weights' digest), and a function by its identity.

A function's identity is its module and qualified name, a digest of its source
(of its bytecode where the source cannot be read), its defaults, and the
values its closure captured, each described by the same rules; a bound
method's adds its instance, a ``functools.partial`` its arguments, and a
callable object its class's source and its attributes. Globals a function
reads are not part of it: a function whose behaviour depends on a global (or
on a file, or on a captured object with no readable content) should declare
its identity with an ``__prefopt_identity__`` attribute (any JSON data, e.g. a
version string), which then replaces every other rule.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
import types

import numpy as np
import torch
from torch import nn

from ..backend.models import is_fitted

IDENTITY_ATTRIBUTE = "__prefopt_identity__"
# Parameters that set a run's length, how it is watched and saved, or only how much memory
# its passes take (the same gradients: tests/test_memory_knobs.py); all others define it.
NOT_DEFINING = frozenset(
    {
        "gradient_checkpointing",
        "micro_batch_size",
        "n_steps",
        "verbose",
        "checkpoint_dir",
        "checkpoint_every",
        "max_kl",
        "max_kl_action",
        "min_eos_share",
        "on_unhealthy",
    }
)
# Config keys that name where a model came from, not what it is.
_PROVENANCE = frozenset({"_name_or_path", "_commit_hash", "transformers_version"})
# Fitted attributes that record how a fit went (timings), not what it learnt.
_NOT_CONTENT = frozenset({"history_", "device_"})
# Lists longer than this (and texts 20 times longer) are described by a digest.
_LONG = 64
# Plain objects nested deeper than this are described by their type.
_DEEP = 12


def digest(data: bytes | str) -> str:
    """A short SHA-256 hex digest of bytes or text."""
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()[:16]


def fingerprint(value) -> str:
    """A short hash of JSON-describable data (prompts, comparisons, descriptions).

    Examples
    --------
    >>> fingerprint({"a": 1}) == fingerprint({"a": 1}) != fingerprint({"a": 2})
    True
    """
    return digest(json.dumps(value, sort_keys=True, default=str))


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
    consts = [_code_digest(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return digest(code.co_code + repr((consts, code.co_names, code.co_varnames)).encode())


def _source_digest(obj) -> str | None:
    try:
        return digest(inspect.getsource(obj))
    except (OSError, TypeError):
        return None


def _qualname(obj) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def _describe_function(fn, seen) -> dict:
    closure = [
        describe(cell.cell_contents, seen) if cell.cell_contents is not None else None
        for cell in (fn.__closure__ or ())
    ]
    return {
        "function": _qualname(fn),
        "source": _source_digest(fn) or _code_digest(fn.__code__),
        "defaults": describe(fn.__defaults__, seen),
        "kwdefaults": describe(fn.__kwdefaults__, seen),
        "closure": closure,
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
    from sklearn.base import BaseEstimator
    from transformers import GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase

    if isinstance(value, BaseEstimator):
        return _describe_estimator(value, seen)
    if isinstance(value, nn.Module):
        return {"module": type(value).__qualname__, "fingerprint": module_fingerprint(value)}
    if isinstance(value, (PretrainedConfig, GenerationConfig)):
        return {"config": _qualname(type(value)), "fields": describe(_config_dict(value), seen)}
    if isinstance(value, PreTrainedTokenizerBase):
        return _describe_tokenizer(value)
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
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"dataclass": _qualname(type(value)), "fields": describe(fields, seen)}
    out = {"type": _qualname(type(value))}
    if len(seen) > _DEEP:  # deep inside other objects: their type only
        return out
    if callable(value):
        code = getattr(vars(type(value)).get("__call__"), "__code__", None)
        out["source"] = _source_digest(type(value)) or (code and _code_digest(code))
    if hasattr(value, "__dict__"):
        out["state"] = describe(vars(value), seen)
    elif type(value).__repr__ is not object.__repr__:
        out["repr"] = repr(value)
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
    seen.add(id(value))
    try:
        if isinstance(value, (list, tuple)):
            items = [describe(v, seen) for v in value]
            # A long list (a closure's corpus) by its digest: state.json stays small.
            return (
                items
                if len(items) <= _LONG
                else {"items": len(items), "digest": fingerprint(items)}
            )
        if isinstance(value, (set, frozenset)):
            return sorted((describe(v, seen) for v in value), key=repr)
        if isinstance(value, dict):
            return {str(k): describe(v, seen) for k, v in value.items()}
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
        for key in sorted(set(saved) | set(current)):
            if saved.get(key) != current.get(key):
                sub = f"{path}.{key}" if path else str(key)
                return first_difference(saved.get(key), current.get(key), sub)
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        for i, (a, b) in enumerate(zip(saved, current)):
            if a != b:
                return first_difference(a, b, f"{path}[{i}]")
    return path, saved, current


# ----- what defines a run -------------------------------------------------------------
# Parameters that only set how a run is watched and saved: not part of its folder's name.
NOT_NAMING = frozenset({"verbose", "checkpoint_dir", "checkpoint_every"})


def described_params(estimator) -> dict:
    """Every parameter of ``estimator`` described by content, common parameters included.

    The constructor's parameters, and the effective value of each common
    parameter the class declares in ``_common_parameters`` that its ``__init__``
    leaves out (a class-level default still defines the run).
    """
    params = estimator.get_params(deep=False)
    for name in getattr(type(estimator), "_common_parameters", ()):
        if name not in params:
            params[name] = getattr(estimator, name, None)
    return {k: describe(v) for k, v in sorted(params.items())}


def defining_params(estimator, *, naming: bool = False, described=None) -> dict:
    """The described parameters that define ``estimator``'s run (see :func:`described_params`).

    ``naming=True`` also keeps the parameters that set the run's length and its
    health stops (``n_steps``...): those name a search candidate's folder, while a
    resume may change them. ``described`` reuses :func:`described_params`'s output.
    """
    described = described_params(estimator) if described is None else described
    skip = NOT_NAMING if naming else NOT_DEFINING
    out = {k: v for k, v in described.items() if k not in skip}
    if _bf16_passes():  # bfloat16 autocast changes the numbers (entered only then: old runs keep)
        out["set_config(dtype)"] = "bfloat16"
    return out


def _bf16_passes() -> bool:
    from ..backend import resolve_device, uses_bf16

    try:
        return uses_bf16(resolve_device())
    except ValueError:  # dtype="bfloat16" on a device without it: refused where it runs
        return False


def run_folder(estimator, data_key: str, objects: dict | None = None, described=None) -> str | None:
    """The folder of this run: ``checkpoint_dir``, or a sub-folder of it for a clone.

    Estimators made by ``clone`` (every candidate and seed of a search) write to
    ``checkpoint_dir/<class>-<hash>``, the hash of everything that defines the run:
    every parameter (``n_steps`` included), the data, and the objects given to
    ``fit`` (the reward, the labeler; ``objects`` holds their descriptions). No
    two runs share a folder.
    """
    root = getattr(estimator, "checkpoint_dir", None)
    if root is None:
        return None
    root = os.fspath(root)
    if not getattr(estimator, "_checkpoint_subfolder", False):
        return root
    key = fingerprint(
        {
            "params": defining_params(estimator, naming=True, described=described),
            "data": data_key,
            "objects": dict(sorted((objects or {}).items())),
        }
    )
    return os.path.join(root, f"{type(estimator).__name__}-{key}")


def _short(value, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _refuse(folder: str, item: str, saved, current) -> None:
    path, old, new = first_difference(saved, current)
    where = item if not path else f"{item}.{path}"
    if path.endswith("fingerprint"):  # a module given as a parameter: its weights or config
        raise ValueError(
            f"The checkpoint in {folder!r} was written from another starting model ({where}: "
            f"its weights or config differ; fingerprint {old}, this fit's {new}); resume with "
            f"the same {item}=, use another checkpoint_dir, or delete {folder!r} to overwrite "
            "the old run."
        )
    raise ValueError(
        f"The checkpoint in {folder!r} was written with {where}={_short(old)}, but this fit "
        f"has {where}={_short(new)}; resuming would continue the old run with the old "
        f"setting. Use another checkpoint_dir for the new settings, or delete {folder!r} to "
        "overwrite the old run."
    )


def check_same_run(
    state: dict, folder: str, *, defining: dict, data: str, objects: dict | None = None
) -> None:
    """Refuse a checkpoint written with other parameters, objects or data, naming what differs."""
    saved = state.get("defining", {})
    for name in sorted(set(saved) | set(defining)):
        if saved.get(name) != defining.get(name):
            _refuse(folder, name, saved.get(name), defining.get(name))
    saved_objects = state.get("objects", {})
    for name in sorted(set(saved_objects) | set(objects or {})):
        if saved_objects.get(name) != (objects or {}).get(name):
            _refuse(folder, name, saved_objects.get(name), (objects or {}).get(name))
    if state.get("data") != data:
        raise ValueError(
            f"The checkpoint in {folder!r} was written for other data (prompts or ptx_data; "
            f"fingerprint {state.get('data')}, this fit's {data}); resume with the same data. "
            f"Use another checkpoint_dir for the new data, or delete {folder!r} to overwrite "
            "the old run."
        )


def check_same_model(state: dict, folder: str, model_key: str, tokenizer=None) -> None:
    """Refuse a checkpoint whose starting model (weights, config) or tokenizer differs."""
    if state.get("model") != model_key:
        raise ValueError(
            f"The checkpoint in {folder!r} was written from another starting model (its weights "
            f"or config; fingerprint {state.get('model')}, this fit's {model_key}); resume with "
            f"the same model=, use another checkpoint_dir, or delete {folder!r} to overwrite "
            "the old run."
        )
    if "tokenizer" in state and state["tokenizer"] != tokenizer:
        _refuse(folder, "tokenizer", state["tokenizer"], tokenizer)


def check_length(state: dict, folder: str, estimator) -> None:
    """Refuse a checkpoint that ran past this fit's ``n_steps`` (it would return the longer run)."""
    n_steps = getattr(estimator, "n_steps", None)
    run = state.get("run") or {}
    done = (state.get("fitted") or {}).get("n_iter_")
    if n_steps is None or not isinstance(done, int) or "start_step" not in run:
        return
    if done > int(run["start_step"]) + int(n_steps):
        raise ValueError(
            f"The checkpoint in {folder!r} has run {done} steps, more than this fit's "
            f"n_steps={n_steps}; resuming would return the longer run. Give n_steps>={done} to "
            f"continue it, use another checkpoint_dir, or delete {folder!r} to start over."
        )
