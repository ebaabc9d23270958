"""Checkpoints of a run: JSON and safetensors only, written atomically, resumed by ``fit``.

A checkpoint folder holds ``state.json`` (format, class, the run-defining
parameters and fingerprints of the data and of the starting model, the fitted
attributes that are numbers, lists or dicts, and the run state's non-tensor
part) and one ``tensors-<step>.safetensors`` file (the trained weights, the
optimiser's tensors, the random generator's state). Nothing is unpickled, so a
planted file cannot run code. ``state.json`` is written last, to a temporary
file renamed into place, so an interrupted write never replaces the last good
checkpoint.

Resuming never restores a constructor parameter: the caller's parameters that
define the run are compared with the recorded ones, and a mismatch is an error
naming the parameter. Parameters that only set the run's length or how it is
watched and saved may differ (raising ``n_steps`` continues a finished run).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from sklearn.base import BaseEstimator
from torch import nn

from ..backend import distributed

FORMAT = 2
STATE = "state.json"
OLD_CHECKPOINT = "checkpoint.joblib"
# Parameters that set a run's length or how it is watched and saved; all others define it.
NOT_DEFINING = frozenset(
    {
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
# Fitted attributes rebuilt by ``fit`` from the caller's arguments, never stored.
NOT_STORED = frozenset({"reward_model_", "starting_policy_", "tokenizer_", "device_", "ref_model_"})


# ----- fingerprints and descriptions --------------------------------------------------
def fingerprint(value) -> str:
    """A short hash of JSON-describable data (prompts, comparisons, descriptions)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def module_fingerprint(module: nn.Module) -> str:
    """A hash of a module's class, parameter names, shapes and values."""
    h = hashlib.sha256(type(module).__qualname__.encode())
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def describe(value):
    """A JSON description of a parameter, for comparing a run's settings."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float, np.integer, np.floating)):
        return value.item() if isinstance(value, np.generic) else value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): describe(v) for k, v in value.items()}
    if isinstance(value, BaseEstimator) and not hasattr(value, "model_"):
        # An unfitted nested estimator (a KL controller): its own parameters.
        return {"class": type(value).__name__, "params": describe(value.get_params(deep=False))}
    # A model, tokenizer, config, fitted estimator or callable: its type; the starting
    # model's weights are compared through their fingerprint.
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}"}


def defining_params(estimator) -> dict:
    """The described constructor parameters that define ``estimator``'s run."""
    params = estimator.get_params(deep=False)
    return {k: describe(v) for k, v in sorted(params.items()) if k not in NOT_DEFINING}


def run_folder(estimator, data_key: str) -> str | None:
    """The folder of this run: ``checkpoint_dir``, or a sub-folder of it for a clone.

    Estimators made by ``clone`` (every candidate and seed of a search) write to
    ``checkpoint_dir/<class>-<hash of the defining parameters and the data>``,
    so no two runs ever share a folder.
    """
    root = getattr(estimator, "checkpoint_dir", None)
    if root is None:
        return None
    root = os.fspath(root)
    if not getattr(estimator, "_checkpoint_subfolder", False):
        return root
    key = fingerprint({"params": defining_params(estimator), "data": data_key})
    return os.path.join(root, f"{type(estimator).__name__}-{key}")


def check_folder(path, what: str = "checkpoint_dir") -> str:
    """Refuse at once a folder that cannot be written (empty, a file, under a file).

    Parameters
    ----------
    path : str or path
        The folder; it is created when missing.
    what : str, default="checkpoint_dir"
        Named in the error.

    Returns
    -------
    path : str
    """
    path = os.fspath(path)
    if not str(path).strip():
        raise ValueError(f"{what} is an empty path; give a folder, or None for no checkpoints.")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{what}={path!r} is a file, not a folder; give a folder.")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write-test-{os.getpid()}-{threading.get_ident()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as exc:
        raise ValueError(
            f"{what}={path!r} cannot be written ({exc.strerror or exc}); a part of the path may "
            "be a file, or the folder read-only. Give a folder you can write to."
        ) from None
    return path


@contextlib.contextmanager
def locked(folder: str | None):
    """Hold an exclusive lock on ``folder`` for one fit; refuse a second writer.

    The lock is ``flock`` on ``folder/.lock``: the operating system drops it with
    the process, so a killed run can still be resumed.
    """
    if folder is None:
        yield
        return
    import fcntl

    handle = open(os.path.join(folder, ".lock"), "a+")  # noqa: SIM115 - held for the block
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(
                f"Another fit is writing to the checkpoint folder {folder!r} (in this or another "
                "process); two fits on one folder would mix their runs. Wait for it to end, or "
                "give this fit another checkpoint_dir."
            ) from None
        yield
    finally:
        handle.close()  # releases the lock


# ----- tensors out of nested state -------------------------------------------------------
def _split(value, prefix: str, tensors: dict):
    """Replace tensors and arrays in nested data by references; collect the tensors."""
    if isinstance(value, torch.Tensor):
        key = prefix
        tensors[key] = value.detach().to("cpu").contiguous().clone()
        return {"__tensor__": key}
    if isinstance(value, np.ndarray):
        return {
            "__ndarray__": _split(torch.from_numpy(np.ascontiguousarray(value)), prefix, tensors)
        }
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _split(v, f"{prefix}/{k}", tensors) for k, v in value.items()}
        return {"__items__": [[k, _split(v, f"{prefix}/{k}", tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_split(v, f"{prefix}/{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return value


def _join(value, tensors: dict):
    if isinstance(value, dict):
        if "__tensor__" in value:
            return tensors[value["__tensor__"]]
        if "__ndarray__" in value:
            return _join(value["__ndarray__"], tensors).numpy()
        if "__items__" in value:
            return {k: _join(v, tensors) for k, v in value["__items__"]}
        return {k: _join(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_join(v, tensors) for v in value]
    return value


def _is_json(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


# ----- writing and reading ---------------------------------------------------------------
def _stored(estimator, skip=NOT_STORED):
    """The fitted attributes a checkpoint or ``save`` holds, as ``(name, value)`` pairs."""
    for key, value in vars(estimator).items():
        if key.endswith("_") and not key.startswith("_") and key not in skip:
            yield key, value


def gathered_weights(estimator) -> dict:
    """The full weights of the estimator's FSDP-sharded modules (rank 0; ``{}`` elsewhere).

    A collective: every rank calls it, in the same order of attributes.
    """
    weights = {}
    for key, value in _stored(estimator):
        if isinstance(value, nn.Module) and distributed.is_sharded(value):
            weights[key] = distributed.full_state_dict(value)
    return weights


def fitted_state(estimator, skip=NOT_STORED, weights=None) -> tuple[dict, dict]:
    """The fitted attributes as data (weights, nested estimators' and objects' states, numbers).

    Returns ``(state, others)``: ``others`` maps the attributes JSON and tensors
    cannot hold (a function, a tokenizer, a module's structure) to their values,
    for the caller to handle (checkpoints rebuild them in ``fit``; ``save``
    records their types). ``weights`` gives gathered state dicts of sharded
    modules by name (:func:`gathered_weights`), written instead of their shards.
    """
    from ..backend.serialization import _qualname

    state, others = {}, {}
    weights = weights or {}
    for key, value in _stored(estimator, skip):
        if isinstance(value, nn.Module):
            state[key] = {"__module__": dict(weights.get(key) or value.state_dict())}
        elif isinstance(value, BaseEstimator):  # a KL controller: its class, parameters, state
            state[key] = {
                "__estimator__": _qualname(value),
                "params": {k: v for k, v in value.get_params(deep=False).items() if _is_json(v)},
                "fitted": {k: v for k, v in vars(value).items() if k.endswith("_") and _is_json(v)},
            }
        elif hasattr(value, "state_dict") and hasattr(value, "load_state_dict"):
            state[key] = {"__state__": value.state_dict(), "class": _qualname(value)}
        elif _is_json(value) or isinstance(value, (np.ndarray, torch.Tensor)):
            state[key] = value
        else:
            others[key] = value
    return state, others


def save(estimator, folder: str, *, header: dict, run_state: dict, weights=None) -> str:
    """Write a checkpoint of ``estimator`` into ``folder``; return the state file's path.

    Parameters
    ----------
    estimator : estimator
        The fitted estimator.
    folder : str
        The run's folder (see :func:`run_folder`).
    header : dict
        ``defining`` parameters, ``data`` and ``model`` fingerprints.
    run_state : dict
        The run state's :meth:`~prefopt.lm.RunState.state_dict`.
    weights : dict, default=None
        Gathered weights of sharded modules (:func:`gathered_weights`).

    Returns
    -------
    path : str
    """
    tensors: dict = {}
    state = {
        "format": FORMAT,
        "class": type(estimator).__name__,
        **header,
        "fitted": _split(fitted_state(estimator, weights=weights)[0], "fitted", tensors),
        "run": _split(run_state, "run", tensors),
    }
    step = int(getattr(estimator, "n_iter_", 0))
    unique = f"{os.getpid()}-{threading.get_ident()}"
    weights = f"tensors-{step:07d}.safetensors"
    tmp = os.path.join(folder, f".{weights}.tmp-{unique}")
    save_file(tensors, tmp)
    os.replace(tmp, os.path.join(folder, weights))
    state["tensors"] = weights
    path = os.path.join(folder, STATE)
    tmp = f"{path}.tmp-{unique}"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)  # the commit point: the old checkpoint stays until this is whole
    for name in os.listdir(folder):  # older weights are no longer named by state.json
        if name.startswith("tensors-") and name.endswith(".safetensors") and name != weights:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, name))
    return path


def read(folder: str | None, estimator) -> dict | None:
    """The checkpoint in ``folder`` as data (no code runs), or ``None`` when there is none."""
    if folder is None:
        return None
    path = os.path.join(folder, STATE)
    if not os.path.exists(path):
        if os.path.exists(os.path.join(folder, OLD_CHECKPOINT)):
            raise ValueError(
                f"{folder!r} holds a checkpoint in the old pickle format ({OLD_CHECKPOINT}). "
                "prefopt no longer loads it, because unpickling a file can run code; resume it "
                "with the prefopt version that wrote it, or delete it to start over."
            )
        return None
    try:
        with open(path) as f:
            state = json.load(f)
        tensors = load_file(os.path.join(folder, os.path.basename(state["tensors"])))
    except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint gets the same advice
        raise ValueError(
            f"Cannot read the checkpoint in {folder!r} ({exc}); delete the folder's state.json "
            "and tensors files to start over, or use another checkpoint_dir."
        ) from None
    if state.get("format") != FORMAT:
        raise ValueError(
            f"The checkpoint in {folder!r} has format {state.get('format')!r}; this prefopt reads "
            f"format {FORMAT}. Resume it with the prefopt version that wrote it, or delete it."
        )
    if state.get("class") != type(estimator).__name__:
        raise ValueError(
            f"The checkpoint in {folder!r} was written by a {state.get('class')}, not a "
            f"{type(estimator).__name__}; use another checkpoint_dir."
        )
    state["fitted"] = _join(state["fitted"], tensors)
    state["run"] = _join(state["run"], tensors)
    return state


def check_same_run(state: dict, folder: str, *, defining: dict, data: str) -> None:
    """Refuse a checkpoint written with other parameters or data, naming what differs."""
    way_out = (
        f"Use another checkpoint_dir for the new settings, or delete {folder!r} "
        "to overwrite the old run."
    )
    saved = state.get("defining", {})
    for name in sorted(set(saved) | set(defining)):
        if saved.get(name) != defining.get(name):
            raise ValueError(
                f"The checkpoint in {folder!r} was written with {name}={saved.get(name)!r}, but "
                f"this fit has {name}={defining.get(name)!r}; resuming would continue the old "
                f"run with the old setting. {way_out}"
            )
    if state.get("data") != data:
        raise ValueError(
            f"The checkpoint in {folder!r} was written for other data (prompts or ptx_data; "
            f"fingerprint {state.get('data')}, this fit's {data}); resume with the same data. "
            f"{way_out}"
        )


def check_same_model(state: dict, folder: str, model_key: str) -> None:
    """Refuse a checkpoint whose starting model differs from the caller's."""
    if state.get("model") != model_key:
        raise ValueError(
            f"The checkpoint in {folder!r} was written from another starting model (fingerprint "
            f"{state.get('model')}, this fit's {model_key}); resume with the same model=, use "
            f"another checkpoint_dir, or delete {folder!r} to overwrite the old run."
        )


def restore(estimator, fitted: dict) -> None:
    """Load stored fitted attributes into an estimator whose objects ``fit`` rebuilt."""
    for key, value in fitted.items():
        current = getattr(estimator, key, None)
        if isinstance(value, dict) and "__module__" in value:
            current.load_state_dict(value["__module__"])
        elif isinstance(value, dict) and "__estimator__" in value:
            for k, v in value["fitted"].items():
                setattr(current, k, v)
        elif isinstance(value, dict) and "__state__" in value:
            current.load_state_dict(value["__state__"])
        else:
            setattr(estimator, key, value)


class Resume:
    """One fit's view of its checkpoint folder: what was saved, and how to save again."""

    def __init__(self, folder: str, saved: dict | None, defining: dict, data: str):
        self.folder, self.saved = folder, saved
        self.header = {"defining": defining, "data": data, "model": None}

    def restore(self, estimator, model_key: str) -> dict | None:
        """Check the starting model, load the fitted state; return the saved run state."""
        self.header["model"] = model_key
        if self.saved is None:
            return None
        check_same_model(self.saved, self.folder, model_key)
        restore(estimator, self.saved["fitted"])
        return self.saved["run"]

    def save(self, estimator, run_state: dict) -> str | None:
        """Write a checkpoint of ``estimator`` and its run state (rank 0 alone writes).

        In a distributed fit every rank calls this and waits until the checkpoint is
        whole, so no rank can read an older one (a resume right after a failure).
        Under FSDP every rank first takes part in gathering the full weights, which
        rank 0 writes in the format of an unsharded run.
        """
        path = None
        weights = gathered_weights(estimator)  # FSDP: a collective; else nothing
        if distributed.is_main():
            path = save(
                estimator, self.folder, header=self.header, run_state=run_state, weights=weights
            )
        distributed.barrier()
        return path


@contextlib.contextmanager
def resumable(estimator, data_key: str):
    """The checkpoint of this fit, locked for its length, checked against its parameters.

    Yields ``None`` when the estimator has no ``checkpoint_dir``; else a
    :class:`Resume` whose ``saved`` is the checkpoint found (or ``None``). A
    checkpoint written with other defining parameters or other data is refused
    before any work.
    """
    folder = run_folder(estimator, data_key)
    if folder is None:
        yield None
        return
    check_folder(folder)
    # Distributed fits: rank 0 holds the lock and writes; the others only read.
    with locked(folder if distributed.is_main() else None):
        saved = read(folder, estimator)
        defining = defining_params(estimator)
        if saved is not None:
            check_same_run(saved, folder, defining=defining, data=data_key)
        yield Resume(folder, saved, defining, data_key)
