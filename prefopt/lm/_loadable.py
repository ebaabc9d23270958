"""What ``prefopt.load`` may rebuild: an explicit allow-list of classes and their constructors.

A saved folder is data. Every class it names is looked up in a fixed list
(prefopt's estimators and KL controllers, the state objects prefopt's fits
hold, the transformers model classes of the auto-model tables with their own
config class, and ``peft.LoraConfig``) and built through that class's known
constructor, with arguments checked against the constructor's own names and
types. Any other name is refused with the name found; nothing is imported by a
name read from the folder.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re

from ..validation import validate_params

# prefopt's estimators and controllers (KL and learning rate), by their public names
# (``prefopt.<Name>``).
ESTIMATORS = frozenset(
    {
        "AdaptiveKLController",
        "AdaptiveLR",
        "DPOPolicy",
        "FixedKLController",
        "GRPOPolicy",
        "PPOPolicy",
        "RAFTPolicy",
        "ReinforcePlusPlusPolicy",
        "ReinforcePolicy",
        "RewardModel",
        "RLOOPolicy",
        "SFTPolicy",
    }
)
# Fitted attributes that are small state objects: built with no arguments, then
# ``load_state_dict`` (numbers only).
STATE_OBJECTS = frozenset({"prefopt.policies.reinforce.MovingAverageBaseline"})
# Attribute names a folder may set on an estimator: public, fitted (trailing underscore).
_ATTRIBUTE = re.compile(r"^[a-z][a-z0-9_]*_$")
# ``attn_implementation`` values that run no downloaded kernel.
_ATTENTION = frozenset(
    {None, "eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"}
)


def refuse(kind: str, name) -> ValueError:
    """The error for a name outside the allow-list."""
    return ValueError(
        f"Refusing to load the {kind} {name!r}: a saved folder may name only prefopt's "
        "estimators and KL controllers, transformers' model and config classes, and peft's "
        "LoraConfig, and the classes of your own passed as load(folder, algorithms=[...]); "
        "nothing else is built or imported from a folder. Was it written by prefopt.save?"
    )


def _qualname(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def user_classes(classes) -> dict:
    """The estimator classes a caller of ``load`` allows, by their module and qualified name."""
    from sklearn.base import BaseEstimator

    if isinstance(classes, type):
        classes = [classes]
    out = {}
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseEstimator)):
            raise TypeError(
                f"load(algorithms=...) takes prefopt estimator classes of your own (a subclass "
                f"of prefopt.policies.BasePolicy); got {cls!r}."
            )
        out[_qualname(cls)] = cls
    return out


def estimator_class(name, classes=None):
    """The estimator a folder names: prefopt's (``prefopt.X`` or its module path) or allowed.

    ``classes`` are the caller's own (:func:`user_classes`), matched by module and
    qualified name.
    """
    if not isinstance(name, str):
        raise refuse("class", name)
    if classes and name in classes:
        return classes[name]
    short = name.rpartition(".")[2]
    if short not in ESTIMATORS:
        raise refuse("class", name)
    cls = getattr(importlib.import_module("prefopt"), short)
    if name not in (f"prefopt.{short}", _qualname(cls)):
        raise refuse("class", name)
    return cls


def is_listed(name) -> bool:
    """Whether a class name is one of prefopt's estimators or controllers on the list."""
    try:
        estimator_class(name)
    except ValueError:
        return False
    return True


def check_attribute(name) -> str:
    """A fitted attribute's name as a folder gives it, refused unless it is one."""
    if not isinstance(name, str) or not _ATTRIBUTE.match(name):
        raise ValueError(
            f"Refusing to set the attribute {name!r} from a saved folder: only public fitted "
            "attributes (lower-case names ending in '_') are restored."
        )
    return name


def build_estimator(name, params: dict, decode, classes=None):
    """``cls(**params)`` for an allow-listed class, each argument checked by its ``__init__``."""
    cls = estimator_class(name, classes)
    if not isinstance(params, dict):
        raise ValueError(f"The saved parameters of {name} are not a mapping: {params!r}.")
    known = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(
            f"The saved {cls.__name__} has parameters {unknown} that its constructor does not "
            f"take (it takes {sorted(known)}); the folder was written by another version or "
            "changed by hand."
        )
    estimator = cls(**{k: decode(v) for k, v in params.items()})
    validate_params(estimator)  # the constructor's declared types and ranges
    return estimator


def state_object(name, state):
    """A small state object (a REINFORCE baseline) rebuilt from its numbers."""
    if name not in STATE_OBJECTS:
        raise refuse("state object", name)
    module, _, short = name.rpartition(".")
    obj = getattr(importlib.import_module(module), short)()
    obj.load_state_dict(state)
    return obj


@functools.cache
def _model_names() -> frozenset:
    from transformers.models.auto import modeling_auto

    names = set()
    for table in (
        modeling_auto.MODEL_MAPPING_NAMES,
        modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    ):
        for value in table.values():
            names.update([value] if isinstance(value, str) else value)
    return frozenset(names)


def _check_config(config, name) -> dict:
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise ValueError(f"The saved config of {name} is not a mapping of names: {config!r}.")
    for key in ("attn_implementation", "_attn_implementation", "_attn_implementation_internal"):
        if config.get(key) not in _ATTENTION:
            raise refuse("attention implementation", config.get(key))
    for key, value in config.items():  # a hub repository's kernel ("org/name") runs its code
        if "implementation" in key and isinstance(value, str) and "/" in value:
            raise refuse("kernel implementation", value)
    if config.get("auto_map") or config.get("quantization_config"):
        raise refuse(
            "config entry", "auto_map" if config.get("auto_map") else "quantization_config"
        )
    return config


def transformers_model(spec: dict):
    """A transformers model with fresh weights from a saved spec (class, config, generation config).

    The class must be one of transformers' auto-model tables (base, causal LM,
    sequence classification); its config is built by the class's own
    ``config_class`` (the saved ``config_class`` must name it); no code the
    config names is loaded.
    """
    import transformers
    from transformers import GenerationConfig, PreTrainedModel

    from ..backend.models import fuse_activations

    name = spec.get("class")
    short = name.rpartition(".")[2] if isinstance(name, str) else None
    if short not in _model_names():
        raise refuse("model class", name)
    cls = getattr(transformers, short, None)
    if not (isinstance(cls, type) and issubclass(cls, PreTrainedModel)) or name != _qualname(cls):
        raise refuse("model class", name)
    if spec.get("config_class") != _qualname(cls.config_class):
        raise refuse("config class", spec.get("config_class"))
    config = cls.config_class.from_dict(_check_config(spec.get("config"), name))
    module = cls(config)
    generation = spec.get("generation_config")
    if generation is not None:
        module.generation_config = GenerationConfig.from_dict(_check_config(generation, name))
    if spec.get("fixed_length"):
        module.fixed_length = True
    fuse_activations(module)  # as load_causal_lm did for the module that was saved
    return module


def lora_config(fields):
    """``peft.LoraConfig`` from saved fields (each a field of it); no module it names loads."""
    from peft import LoraConfig

    if not isinstance(fields, dict):
        raise ValueError(f"The saved LoRA settings are not a mapping: {fields!r}.")
    known = {f.name for f in dataclasses.fields(LoraConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"The saved LoRA settings have fields LoraConfig does not: {unknown}.")
    if fields.get("peft_type", "LORA") != "LORA":
        raise refuse("peft type", fields.get("peft_type"))
    # Megatron's parallel layers are imported by the module name in megatron_core.
    if fields.get("megatron_config") is not None:
        raise refuse("LoRA setting megatron_config", fields.get("megatron_core"))
    fields = {k: v for k, v in fields.items() if k not in ("megatron_core", "peft_type")}
    return LoraConfig(**fields)
