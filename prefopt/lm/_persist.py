"""Saving a fitted estimator as JSON and safetensors, and loading it without running code.

``save(estimator, folder)`` writes ``estimator.json`` (the class, the parameters
JSON can hold, the fitted numbers and tables, how to rebuild each model, and the
SHA-256 of the tensors file), ``tensors.safetensors`` (every weight) and the
tokenizer's own JSON files. ``load(folder)`` rebuilds the estimator from these
as data: every class the folder names must be on an explicit allow-list
(``_loadable.py``) and is built through its known constructor; only regular
files inside the folder are read. What JSON cannot hold (a reward function, a
custom torch module, a model object given as a parameter) is recorded by its
type only; ``load`` takes it again as a keyword argument, as ``fit`` takes a reward.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import shutil
import warnings

from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from sklearn.base import BaseEstimator
from torch import nn

from ..backend import local_seed
from ..backend.serialization import (
    failed_write,
    loads_json,
    qualname,
    read_regular,
    regular_file,
    sha256,
    transformers_spec,
    write_files,
)
from . import _loadable
from ._checkpoint import _is_json, _join, _split, check_folder, fitted_state
from ._encoding import TokenEncoding
from ._identity import is_fitted

FORMAT = 2  # 2: estimator.json records the tensors file's SHA-256
STATE = "estimator.json"
TENSORS = "tensors.safetensors"
TOKENIZER = "tokenizer"
# The keyword ``load`` takes for the reward given to ``fit`` (the fitted attribute reward_model_).
REWARD = "reward"


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
        return {"kind": "scalar_head", "backbone": _module_spec(module.backbone, owner)}
    if isinstance(module, TokenValueTable):
        return {"kind": "token_values", "vocab_size": int(module.values.num_embeddings)}
    return {"kind": "given", "type": qualname(module)}


def _shared_trunks(estimator) -> dict:
    """The estimator's declared heads on another fitted module's trunk (``{}`` for none)."""
    if not isinstance(estimator, TokenEncoding):  # a linear reward model: no modules
        return {}
    return dict(estimator.shared_trunk_modules())


def _build(spec: dict, name: str, given: dict, built: dict) -> nn.Module:
    from ..backend import ScalarHeadModel, TokenValueTable
    from ..backend.heads import shared_value_model

    if not isinstance(spec, dict):
        raise ValueError(f"The saved description of {name} is not a mapping: {spec!r}.")
    kind = spec.get("kind")
    # The weights drawn here are overwritten by the saved tensors; drawing them under a
    # local seed leaves the caller's torch random state as it was before load.
    if kind == "transformers":
        with local_seed(0):
            return _loadable.transformers_model(spec)
    if kind == "peft":
        from peft import get_peft_model

        base = _build(spec["base"], name, given, built)
        with local_seed(0):
            return get_peft_model(base, _loadable.lora_config(spec["lora"]))
    if kind == "scalar_head":
        return ScalarHeadModel(_build(spec["backbone"], name, given, built))
    if kind == "shared_head":  # a head on another fitted module's trunk, built before it
        trunk = _loadable.check_attribute(spec.get("trunk", "model_"))
        if trunk not in built:
            raise ValueError(f"The saved {name} is a head on {trunk!r}, which is not saved.")
        return shared_value_model(built[trunk])
    if kind == "token_values":
        if not isinstance(spec.get("vocab_size"), int) or spec["vocab_size"] < 1:
            raise ValueError(f"The saved {name} has vocab_size {spec.get('vocab_size')!r}.")
        return TokenValueTable(spec["vocab_size"])
    if kind != "given":
        raise _loadable.refuse("module kind", kind)
    module = given.get(name)
    if module is None and name == "ref_model_":
        module = given.get("model_")
    if module is None:
        raise ValueError(
            f"The saved estimator's {name} is a {spec.get('type')}, which prefopt does not "
            f"rebuild by name; pass a module of that type again: load(folder, {name}=module)."
        )
    return copy.deepcopy(module)


def _is_fitted_prefopt(value) -> bool:
    """A fitted reward model or policy (saved in a sub-folder), not a KL controller."""
    return isinstance(value, TokenEncoding) and is_fitted(value)


# ----- parameters and fitted attributes -------------------------------------------------------
def _encode_param(value):
    if _is_json(value) and not isinstance(value, dict):
        return value
    if (
        isinstance(value, BaseEstimator)
        and not hasattr(value, "model_")
        and _loadable.is_listed(qualname(value))
    ):  # one of prefopt's controllers; a user's own is given to load again, as a module is
        return {
            "__estimator__": qualname(value),
            "params": {k: _encode_param(v) for k, v in value.get_params(deep=False).items()},
        }
    if isinstance(value, dict) and _is_json(value):
        return value
    return {"__object__": qualname(value)}


def _decode_param(value):
    if isinstance(value, dict) and "__estimator__" in value:
        return _loadable.build_estimator(value["__estimator__"], value.get("params"), _decode_param)
    if isinstance(value, dict) and "__object__" in value:
        return None
    return value


def save(estimator, folder) -> str:
    """Write a fitted estimator to ``folder`` as JSON and safetensors (no pickle).

    ``estimator.json`` records the SHA-256 of ``tensors.safetensors``, so
    :func:`load` refuses a tensors file from another save. Every file is written
    whole before any is renamed into place: a write that fails (a full disk)
    leaves the folder's previous save as it was and raises an ``OSError`` that
    says so.

    Parameters
    ----------
    estimator : estimator
        A fitted prefopt estimator.
    folder : str or path
        Created if missing; its ``estimator.json``, ``tensors.safetensors`` and
        ``tokenizer`` folder are replaced.

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
    trunks = _shared_trunks(estimator)  # a head on another module's trunk: the head alone
    modules = {
        key: {"kind": "shared_head", "trunk": trunks[key]}
        if key in trunks
        else _module_spec(value, estimator)
        for key, value in vars(estimator).items()
        if key in fitted and isinstance(value, nn.Module)
    }
    describe = getattr(estimator, "_describe_reward", None)
    for key, value in others.items():  # a function or object JSON cannot hold: its type
        # A weighted list of rewards: its names and weights, which load weighs again.
        described = describe(value) if key == "reward_model_" and describe else None
        objects[key] = described or _name_of(value)
        name = REWARD if key == "reward_model_" else key
        again = f"[{', '.join(described['weighted'])}]" if described else "..."
        warnings.warn(
            f"{type(estimator).__name__}.{key} ({_name_of(value)}) is not saved; pass it to "
            f"load again: load(folder, {name}={again}).",
            UserWarning,
            stacklevel=2,
        )
    tensors: dict = {}
    state = {
        "format": FORMAT,
        "class": qualname(estimator),
        "params": {k: _encode_param(v) for k, v in estimator.get_params(deep=False).items()},
        "modules": modules,
        "objects": objects,
        "fitted": _split(fitted, "fitted", tensors),
        "suppress_ids": list(getattr(estimator, "_suppress_ids", ())),
    }
    data = st_save(tensors)
    state["tensors_sha256"] = sha256(data)
    _write_folder(folder, state, data, getattr(estimator, "tokenizer_", None))
    return folder


def _name_of(value) -> str:
    """A function or method is named by itself (``module.f``), any other object by its type."""
    if callable(value) and hasattr(value, "__qualname__") and not isinstance(value, type):
        return f"{getattr(value, '__module__', None)}.{value.__qualname__}"
    return qualname(value)


def _write_folder(folder: str, state: dict, data: bytes, tokenizer) -> None:
    """The tokenizer, tensors and JSON, each written whole before any replaces the old save."""
    keeps = f"the previous save in {folder!r}"
    staged = None
    if tokenizer is not None:
        state["tokenizer"] = TOKENIZER
        staged = os.path.join(folder, f".{TOKENIZER}.tmp-{os.getpid()}")
        try:
            tokenizer.save_pretrained(staged)
        except OSError as exc:
            shutil.rmtree(staged, ignore_errors=True)
            raise failed_write(staged, exc, keeps) from exc
    try:
        write_files(folder, {TENSORS: data, STATE: json.dumps(state)}, keeps=keeps)
    except OSError:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
        raise
    if staged is not None:  # the new tokenizer in place of the old one
        target, old = os.path.join(folder, TOKENIZER), f"{staged}-old"
        if os.path.lexists(target):
            os.replace(target, old)
        os.replace(staged, target)
        shutil.rmtree(old, ignore_errors=True)


def load(folder, *, algorithms=(), **objects):
    """Rebuild an estimator written by :func:`save`; no code from the folder runs.

    A saved folder is data. Every class it names must be one prefopt itself
    writes: prefopt's estimators and KL controllers, transformers' model classes
    (with their own config class) and ``peft.LoraConfig``; each is built through
    its known constructor with checked arguments, and any other name is refused
    with the name found. Only regular files inside ``folder`` are read (a FIFO,
    a device or a link out of the folder is refused), and the tensors file must
    be the one ``estimator.json`` recorded (its SHA-256). A malformed folder
    gives a ``ValueError`` that says what is wrong.

    Parameters
    ----------
    folder : str or path
        What :func:`save` wrote.
    algorithms : sequence of classes, default=()
        Estimator classes of your own (an algorithm subclassing
        :class:`~prefopt.policies.BasePolicy`) that the folder may name, added
        to the allow-list for this call: the folder's class name must be one of
        theirs (module and qualified name), and the class is built through its
        constructor with checked parameters, as prefopt's own. The folder never
        names code to import: the class comes from your code.
    **objects
        What JSON could not hold, by name: ``reward=`` (the reward given to
        ``fit`` when it was a function; ``reward=None`` loads a policy for
        sampling only), ``model_=`` (a custom policy module of the saved type),
        ``featurizer_=`` (a linear reward model's features), or a constructor
        parameter that was an object (``model=``). A name the folder does not
        take is refused with a ``TypeError``.

    Returns
    -------
    estimator : estimator

    Examples
    --------
    >>> import tempfile, prefopt
    >>> from prefopt import RewardModel
    >>> from prefopt.worlds import PreferenceWorld
    >>> world = PreferenceWorld(random_state=0)
    >>> rm = RewardModel().fit(world.comparisons(200, random_state=0))
    >>> folder = rm.save(tempfile.mkdtemp())
    >>> again = prefopt.load(folder, featurizer_=world.features)
    >>> bool((again.coef_ == rm.coef_).all())
    True
    >>> prefopt.load(folder, featuriser_=world.features)
    Traceback (most recent call last):
    ...
    TypeError: load() got ... 'featuriser_' (did you mean 'featurizer_'?)...
    """
    folder = os.fspath(folder)
    taken = _accepted(folder)
    unknown = sorted(set(objects) - taken)
    if unknown:
        hints = {
            # reward_model= (fit's name for it), rewards=...: the reward, by its one name.
            n: [REWARD] if "reward" in n else difflib.get_close_matches(n, sorted(taken), n=1)
            for n in unknown
        }
        said = ", ".join(
            f"{n!r}" + (f" (did you mean {hints[n][0]!r}?)" if hints[n] else "") for n in unknown
        )
        raise TypeError(
            f"load() got keyword arguments this folder does not take: {said}. It takes "
            f"{sorted(taken) or 'none'}; the reward given to fit is passed as {REWARD}=."
        )
    return _load(folder, objects, _loadable.user_classes(algorithms))


def _accepted(folder: str) -> set:
    """The keyword arguments ``load`` takes for ``folder`` and its nested estimators."""
    state = _read_state(folder)
    names = {k for k, v in state["params"].items() if isinstance(v, dict) and "__object__" in v}
    for name, spec in state["modules"].items():
        if isinstance(spec, dict) and spec.get("kind") == "given":
            names.update({name, "model_"} if name == "ref_model_" else {name})
    for key, kind in state["objects"].items():
        if kind == "saved":
            names |= _accepted(_subfolder(folder, _loadable.check_attribute(key).rstrip("_")))
        else:
            names.add(REWARD if key == "reward_model_" else key)
    return names


def _read_state(folder: str) -> dict:
    path = os.path.join(folder, STATE)
    if not os.path.lexists(path):
        raise ValueError(f"{folder!r} holds no saved estimator ({STATE} is missing).")
    try:
        state = loads_json(read_regular(folder, STATE, "The saved estimator file"), repr(path))
    except ValueError as exc:
        raise ValueError(f"{path!r} is not a saved prefopt estimator ({exc}).") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path!r} is not a saved prefopt estimator (not a JSON object).")
    if state.get("format") != FORMAT:
        raise ValueError(
            f"{folder!r} has format {state.get('format')!r}; this prefopt reads format {FORMAT}. "
            "Load it with the prefopt version that wrote it, or save the estimator again."
        )
    expected = {"params": dict, "modules": dict, "objects": dict, "suppress_ids": list}
    for key, kind in expected.items():
        if not isinstance(state.get(key), kind):
            raise ValueError(
                f"{path!r} is malformed: {key!r} is {state.get(key)!r}, not a "
                f"{kind.__name__}. Save the estimator again."
            )
    if state.get("tokenizer") not in (None, TOKENIZER):
        raise ValueError(f"{path!r} names the tokenizer folder {state['tokenizer']!r}; refused.")
    return state


def _subfolder(folder: str, name: str) -> str:
    path = os.path.join(folder, name)
    real, inside = os.path.realpath(path), os.path.realpath(folder)
    if os.path.islink(path) or os.path.commonpath([real, inside]) != inside:
        raise ValueError(f"{path!r} is a link; a saved folder's parts must be inside it.")
    if not os.path.isdir(path):
        raise ValueError(f"{path!r} is missing or not a folder; save the estimator again.")
    return path


def _load(folder: str, objects: dict, classes: dict):
    state = _read_state(folder)
    try:
        estimator = _rebuild(folder, state, objects, classes)
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ValueError(
            f"{os.path.join(folder, STATE)!r} is malformed ({type(exc).__name__}: {exc}); save "
            "the estimator again."
        ) from None
    _restore_objects(folder, state, estimator, objects, classes)
    return estimator


def _rebuild(folder: str, state: dict, objects: dict, classes: dict):
    """The estimator from its class and parameters, then its tokenizer, modules and numbers."""
    from transformers import AutoTokenizer

    from ..backend import resolve_device

    params = state["params"]
    given = {k for k, v in params.items() if isinstance(v, dict) and "__object__" in v}
    estimator = _loadable.build_estimator(
        state["class"],
        {**params, **{k: objects[k] for k in given & set(objects)}},
        _decode_param,
        classes,
    )
    data = read_regular(folder, TENSORS, "The saved tensors file")
    if state.get("tensors_sha256") != sha256(data):
        raise ValueError(
            f"{os.path.join(folder, TENSORS)!r} is not the tensors file {STATE} was written with "
            "(a file from another save beside this one?); save the estimator again."
        )
    fitted = _join(state["fitted"], st_load(data))
    if not isinstance(fitted, dict):
        raise ValueError(f"{os.path.join(folder, STATE)!r} is malformed: 'fitted' is no mapping.")
    estimator.device_ = device = resolve_device()
    if state.get("tokenizer"):
        path = _subfolder(folder, TOKENIZER)
        for name in os.listdir(path):
            regular_file(path, name, "A saved tokenizer file")
        estimator.tokenizer_ = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    built: dict = {}
    for name in sorted(state["modules"], key=lambda n: n != "model_"):  # model_ first
        spec = state["modules"][name]
        _loadable.check_attribute(name)
        module = _build(spec, name, objects, built)
        module.load_state_dict(fitted.pop(name)["__module__"])
        module.eval()
        if name == "ref_model_":
            module.requires_grad_(False)
        built[name] = module.to(device)
        setattr(estimator, name, built[name])
    for key, value in fitted.items():
        _loadable.check_attribute(key)
        if isinstance(value, dict) and "__estimator__" in value:
            obj = _fitted_estimator(key, value, objects)
            for k, v in value["fitted"].items():
                setattr(obj, _loadable.check_attribute(k), v)
            value = obj
        elif isinstance(value, dict) and "__state__" in value:
            value = _loadable.state_object(value["class"], value["__state__"])
        setattr(estimator, key, value)
    estimator._suppress_ids = tuple(int(i) for i in state["suppress_ids"])
    return estimator


def _fitted_estimator(key: str, value: dict, objects: dict):
    """A fitted controller: prefopt's rebuilt from its parameters, a user's cloned from load's."""
    from sklearn.base import clone

    name, given = value["__estimator__"], objects.get(key.rstrip("_"))
    if _loadable.is_listed(name):
        return _loadable.build_estimator(name, value["params"], _decode_param)
    if isinstance(given, BaseEstimator) and qualname(given) == name:
        return clone(given)
    raise ValueError(
        f"{_loadable.refuse('class', name)} A controller of your own: pass the one it was "
        f"fitted with again, load(folder, {key.rstrip('_')}=...)."
    )


def _restore_objects(folder: str, state: dict, estimator, objects: dict, classes: dict) -> None:
    """Nested estimators from their sub-folders; what JSON could not hold from ``objects``."""
    for key, kind in state["objects"].items():
        _loadable.check_attribute(key)
        if kind == "saved":
            nested = _load(_subfolder(folder, key.rstrip("_")), objects, classes)
            setattr(estimator, key, nested)
        elif key == "reward_model_":
            if REWARD not in objects:
                raise ValueError(
                    f"This {type(estimator).__name__} was fitted on the reward {kind}, which a "
                    f"saved folder cannot hold; pass it again: load(folder, {REWARD}=...), or "
                    f"load(folder, {REWARD}=None) to sample only (score then needs y=reward)."
                )
            reward, rebuild = objects.get(REWARD), getattr(estimator, "_rebuild_reward", None)
            if reward is not None and rebuild is not None:
                reward = rebuild(reward, kind)  # a weighted list, weighed as it was saved
            setattr(estimator, key, reward)
        elif key in objects:
            setattr(estimator, key, objects[key])
