"""Saving a fitted estimator as JSON and safetensors, and loading it without running code.

``save(estimator, folder)`` writes ``estimator.json`` (the class, the parameters
JSON can hold, the fitted numbers and tables, and how to rebuild each model),
``tensors.safetensors`` (every weight) and the tokenizer's own JSON files.
``load(folder)`` rebuilds the estimator from these: transformers models from
their config (never with remote code), prefopt's own heads from their shapes.
What JSON cannot hold (a reward function, a custom torch module, a model object
given as a parameter) is recorded by its type only; ``load`` takes it again as a
keyword argument, as ``fit`` takes a reward.
"""

from __future__ import annotations

import importlib
import json
import os
import warnings

from safetensors.torch import load_file, save_file
from sklearn.base import BaseEstimator
from torch import nn

from ..backend.models import _is_fitted
from ..backend.serialization import _qualname, build_transformers, transformers_spec
from ._checkpoint import _is_json, _join, _split, check_folder, fitted_state

FORMAT = 1
STATE = "estimator.json"
TENSORS = "tensors.safetensors"
# Modules whose classes load may build by name: prefopt's and transformers' own.
_SAFE_PACKAGES = ("prefopt.", "transformers.", "peft.")


def _import_safe(path: str):
    """A class from prefopt, transformers or peft by name; anything else is refused."""
    if not path.startswith(_SAFE_PACKAGES):
        raise ValueError(
            f"Refusing to load the class {path!r}: only prefopt's, transformers' "
            "and peft's classes are rebuilt by name."
        )
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


# ----- models ---------------------------------------------------------------------------
def _module_spec(module: nn.Module, owner) -> dict:
    """How to rebuild ``module`` without pickle."""
    from transformers import PreTrainedModel

    from ..backend import ScalarHeadModel, TokenValueTable

    if hasattr(module, "peft_config") and hasattr(module, "get_base_model"):
        config = {
            k: (sorted(v) if isinstance(v, set) else v)
            for k, v in module.peft_config["default"].to_dict().items()
        }
        return {
            "kind": "peft",
            "base": _module_spec(module.get_base_model(), owner),
            "lora": {k: v for k, v in config.items() if _is_json(v)},
        }
    if isinstance(module, PreTrainedModel):
        return transformers_spec(module)
    if isinstance(module, ScalarHeadModel):
        model = getattr(owner, "model_", None)
        trunk = (
            None
            if model is None
            else getattr(getattr(model, "get_base_model", lambda: model)(), "base_model", None)
        )
        if trunk is not None and module.backbone is trunk:
            return {"kind": "shared_head"}  # the policy's own trunk (value_model="shared")
        return {"kind": "scalar_head", "backbone": _module_spec(module.backbone, owner)}
    if isinstance(module, TokenValueTable):
        return {"kind": "token_values", "vocab_size": int(module.values.num_embeddings)}
    return {"kind": "given", "type": _qualname(module)}


def _build(spec: dict, name: str, given: dict, built: dict) -> nn.Module:
    from ..backend import ScalarHeadModel, TokenValueTable
    from ..backend.heads import shared_value_model

    kind = spec["kind"]
    if kind == "transformers":
        return build_transformers(spec, resolve=_import_safe)
    if kind == "peft":
        from peft import LoraConfig, get_peft_model

        return get_peft_model(_build(spec["base"], name, given, built), LoraConfig(**spec["lora"]))
    if kind == "scalar_head":
        return ScalarHeadModel(_build(spec["backbone"], name, given, built))
    if kind == "shared_head":
        return shared_value_model(built["model_"])
    if kind == "token_values":
        return TokenValueTable(spec["vocab_size"])
    module = given.get(name)
    if module is None and name == "ref_model_":
        module = given.get("model_")
    if module is None:
        raise ValueError(
            f"The saved estimator's {name} is a {spec['type']}, which prefopt does not rebuild "
            f"by name; pass a module of that type again: load(folder, {name}=module)."
        )
    import copy

    return copy.deepcopy(module)


def _is_fitted_prefopt(value) -> bool:
    """A fitted reward model or policy (saved in a sub-folder), not a KL controller."""
    from ._base import LanguageModelEstimator

    return isinstance(value, LanguageModelEstimator) and _is_fitted(value)


# ----- parameters and fitted attributes -------------------------------------------------------
def _encode_param(value):
    if _is_json(value) and not isinstance(value, dict):
        return value
    if isinstance(value, BaseEstimator) and not hasattr(value, "model_"):
        return {
            "__estimator__": _qualname(value),
            "params": {k: _encode_param(v) for k, v in value.get_params(deep=False).items()},
        }
    if isinstance(value, dict) and _is_json(value):
        return value
    return {"__object__": _qualname(value)}


def _decode_param(value):
    if isinstance(value, dict) and "__estimator__" in value:
        params = {k: _decode_param(v) for k, v in value["params"].items()}
        return _import_safe(value["__estimator__"])(**params)
    if isinstance(value, dict) and "__object__" in value:
        return None
    return value


def save(estimator, folder) -> str:
    """Write a fitted estimator to ``folder`` as JSON and safetensors (no pickle).

    Parameters
    ----------
    estimator : estimator
        A fitted prefopt estimator.
    folder : str or path
        Created if missing; its ``estimator.json`` and ``tensors.safetensors`` are replaced.

    Returns
    -------
    folder : str
    """
    folder = check_folder(folder, "folder")
    objects = {}
    for key, value in vars(estimator).items():  # a reward model, a starting SFT policy: nested
        if key.endswith("_") and not key.startswith("_") and _is_fitted_prefopt(value):
            save(value, os.path.join(folder, key.rstrip("_")))
            objects[key] = "saved"
    fitted, others = fitted_state(estimator, skip={"device_", "tokenizer_", *objects})
    modules = {
        key: _module_spec(value, estimator)
        for key, value in vars(estimator).items()
        if key in fitted and isinstance(value, nn.Module)
    }
    for key, value in others.items():  # a function or object JSON cannot hold: its type
        objects[key] = _qualname(value)
        warnings.warn(
            f"{type(estimator).__name__}.{key} ({_qualname(value)}) is not saved; pass it to "
            f"load again: load(folder, {key}=...).",
            UserWarning,
            stacklevel=2,
        )
    tensors: dict = {}
    state = {
        "format": FORMAT,
        "class": _qualname(estimator),
        "params": {k: _encode_param(v) for k, v in estimator.get_params(deep=False).items()},
        "modules": modules,
        "objects": objects,
        "fitted": _split(fitted, "fitted", tensors),
        "suppress_ids": list(getattr(estimator, "_suppress_ids", ())),
    }
    if getattr(estimator, "tokenizer_", None) is not None:
        estimator.tokenizer_.save_pretrained(os.path.join(folder, "tokenizer"))
        state["tokenizer"] = "tokenizer"
    save_file(tensors, os.path.join(folder, TENSORS))
    with open(os.path.join(folder, STATE), "w") as f:
        json.dump(state, f)
    return folder


def load(folder, **objects):
    """Rebuild an estimator written by :func:`save`; no code from the folder runs.

    Parameters
    ----------
    folder : str or path
        What :func:`save` wrote.
    **objects
        What JSON could not hold, by name: ``reward=`` (the reward given to
        ``fit``, when it was a function), ``model_=`` (a custom policy module of
        the saved type), ``featurizer_=`` (a linear reward model's features),
        or a constructor parameter that was an object (``model=``).

    Returns
    -------
    estimator : estimator
    """
    from transformers import AutoTokenizer

    from ..backend import resolve_device

    folder = os.fspath(folder)
    path = os.path.join(folder, STATE)
    if not os.path.exists(path):
        raise ValueError(f"{folder!r} holds no saved estimator ({STATE} is missing).")
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path!r} is not a saved prefopt estimator ({exc}).") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(
            f"{folder!r} has format {state.get('format')!r}; this prefopt reads format {FORMAT}."
        )
    cls = _import_safe(state["class"])
    params = {k: _decode_param(v) for k, v in state["params"].items()}
    params.update({k: v for k, v in objects.items() if k in params})
    estimator = cls(**params)
    fitted = _join(state["fitted"], load_file(os.path.join(folder, TENSORS)))
    device = resolve_device()
    estimator.device_ = device
    if state.get("tokenizer"):
        estimator.tokenizer_ = AutoTokenizer.from_pretrained(
            os.path.join(folder, state["tokenizer"]), trust_remote_code=False
        )
    built: dict = {}
    for name in sorted(state["modules"], key=lambda n: n != "model_"):  # model_ first
        module = _build(state["modules"][name], name, objects, built)
        module.load_state_dict(fitted.pop(name)["__module__"])
        module.eval()
        if name == "ref_model_":
            module.requires_grad_(False)
        built[name] = module.to(device)
        setattr(estimator, name, built[name])
    for key, value in fitted.items():
        if isinstance(value, dict) and "__estimator__" in value:
            params = {k: _decode_param(v) for k, v in value["params"].items()}
            obj = _import_safe(value["__estimator__"])(**params)
            vars(obj).update(value["fitted"])
            setattr(estimator, key, obj)
        elif isinstance(value, dict) and "__state__" in value:
            obj = _import_safe(value["class"])()
            obj.load_state_dict(value["__state__"])
            setattr(estimator, key, obj)
        else:
            setattr(estimator, key, value)
    estimator._suppress_ids = tuple(state.get("suppress_ids", ()))
    for key, kind in state.get("objects", {}).items():
        if kind == "saved":
            setattr(estimator, key, load(os.path.join(folder, key.rstrip("_")), **objects))
        elif key in objects or (key == "reward_model_" and "reward" in objects):
            setattr(estimator, key, objects.get(key, objects.get("reward")))
    return estimator
