"""Checkpoints of a run: JSON and safetensors only, written atomically, resumed by ``fit``.

A checkpoint folder holds ``state.json`` (format, class, the run identity, the
fitted attributes that are numbers, lists or dicts, the run state's non-tensor
part, and the name and SHA-256 of its tensors file) and one
``tensors-<step>.safetensors`` file (the trained weights, the optimiser's
tensors, the random generator's state). Nothing is unpickled, so a planted file
cannot run code; only regular files inside the folder are read, so a planted
FIFO cannot block a resume. Both files are written whole to temporary files
first and renamed into place, ``state.json`` last, so an interrupted write (a
full disk) never replaces the last good checkpoint.

Resuming never restores a constructor parameter: the run identity
(``_identity.py``: every parameter by content, the reward and labeler, the data,
the starting model and tokenizer) is compared with the recorded one, and a
mismatch is an error naming the item. Parameters that only set the run's length
or how it is watched and saved may differ (raising ``n_steps`` continues a
finished run; a smaller one than the checkpoint reached is refused).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from sklearn.base import BaseEstimator
from torch import nn

from ..backend import distributed
from ..backend.serialization import loads_json, qualname, read_regular, sha256, write_files
from ._identity import (  # noqa: F401 - fingerprint, module_fingerprint: used as ckpt.*
    NOT_DEFINING,
    check_length,
    check_same_model,
    check_same_run,
    defining_params,
    describe,
    described_params,
    fingerprint,
    module_fingerprint,
    needs_probe,
    run_folder,
)
from ._object_state import kept_random_states, random_states, set_random_states

FORMAT = 4
STATE = "state.json"
OLD_CHECKPOINT = "checkpoint.joblib"
# Fitted attributes rebuilt by ``fit`` from the caller's arguments, never stored.
NOT_STORED = frozenset({"reward_model_", "starting_policy_", "tokenizer_", "device_", "ref_model_"})


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
    state, others = {}, {}
    weights = weights or {}
    for key, value in _stored(estimator, skip):
        if isinstance(value, nn.Module):
            state[key] = {"__module__": dict(weights.get(key) or value.state_dict())}
        elif isinstance(value, BaseEstimator):  # a KL controller: its class, parameters, state
            state[key] = {
                "__estimator__": qualname(value),
                "params": {k: v for k, v in value.get_params(deep=False).items() if _is_json(v)},
                "fitted": {k: v for k, v in vars(value).items() if k.endswith("_") and _is_json(v)},
            }
        elif hasattr(value, "state_dict") and hasattr(value, "load_state_dict"):
            state[key] = {"__state__": value.state_dict(), "class": qualname(value)}
        elif _is_json(value) or isinstance(value, (np.ndarray, torch.Tensor)):
            state[key] = value
        else:
            others[key] = value
    return state, others


def save(estimator, folder: str, *, header: dict, run_state: dict, weights=None) -> str:
    """Write a checkpoint of ``estimator`` into ``folder``; return the state file's path.

    The tensors file is written first, then ``state.json`` (which names it and
    records its SHA-256), each through a temporary file renamed into place. A
    write that fails (a full disk) leaves the last complete checkpoint as it was
    and raises an ``OSError`` that says so.

    Parameters
    ----------
    estimator : estimator
        The fitted estimator.
    folder : str
        The run's folder (see :func:`run_folder`).
    header : dict
        What defines the run: ``defining`` parameters, ``objects``, ``data``,
        ``model`` and ``tokenizer`` fingerprints.
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
    name = f"tensors-{step:07d}.safetensors"
    data = st_save(tensors)
    state["tensors"] = name
    state["tensors_sha256"] = sha256(data)
    path = os.path.join(folder, STATE)
    keeps = f"the last complete checkpoint in {folder!r}"
    write_files(folder, {name: data, STATE: json.dumps(state)}, keeps=keeps)  # state.json last
    for other in os.listdir(folder):  # older weights are no longer named by state.json
        if other.startswith("tensors-") and other.endswith(".safetensors") and other != name:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, other))
    return path


def read(folder: str | None, estimator) -> dict | None:
    """The checkpoint in ``folder`` as data (no code runs), or ``None`` when there is none.

    Only regular files inside ``folder`` are read (a FIFO named as the tensors
    file is refused, not waited on), and the tensors file must be the one
    ``state.json`` recorded (its SHA-256).
    """
    if folder is None:
        return None
    path = os.path.join(folder, STATE)
    if not os.path.lexists(path):
        if os.path.exists(os.path.join(folder, OLD_CHECKPOINT)):
            raise ValueError(
                f"{folder!r} holds a checkpoint in the old pickle format ({OLD_CHECKPOINT}). "
                "prefopt no longer loads it, because unpickling a file can run code; resume it "
                "with the prefopt version that wrote it, or delete it to start over."
            )
        return None
    advice = (
        "delete the folder's state.json and tensors files to start over, or use another "
        "checkpoint_dir."
    )
    try:
        state = loads_json(read_regular(folder, STATE, "The checkpoint's state file"), STATE)
        if not isinstance(state, dict):
            raise ValueError("state.json does not hold a JSON object")
        name = state["tensors"]
        data = read_regular(folder, name, "The checkpoint's tensors file")
        if state.get("tensors_sha256") not in (None, sha256(data)):
            raise ValueError(
                f"{name!r} is not the tensors file state.json was written with (another "
                "save's file beside this state.json?)"
            )
        tensors = st_load(data)
    except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint gets the same advice
        raise ValueError(f"Cannot read the checkpoint in {folder!r} ({exc}); {advice}") from None
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
    try:
        state["fitted"] = _join(state["fitted"], tensors)
        state["run"] = _join(state["run"], tensors)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(
            f"The checkpoint in {folder!r} is malformed ({type(exc).__name__}: {exc}); {advice}"
        ) from None
    return state


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
    """One fit's view of its checkpoint folder: what was saved, and how to save again.

    ``live`` holds the objects given to ``fit`` themselves (the reward, the
    labeler): the random generators inside them are saved with every checkpoint
    and set back on a resume.
    """

    def __init__(
        self, folder: str, saved: dict | None, defining: dict, data: str, objects=None, live=None
    ) -> None:
        self.folder, self.saved = folder, saved
        self.live = live or {}
        self.header = {
            "defining": defining,
            "objects": objects or {},
            "data": data,
            "model": None,
            "tokenizer": None,
        }

    def restore(self, estimator, model_key: str) -> dict | None:
        """Check the starting model, tokenizer and length; load the fitted state.

        Returns the saved run state, or ``None`` when there is no checkpoint.
        """
        self.header["model"] = model_key
        tokenizer = getattr(estimator, "tokenizer_", None)
        self.header["tokenizer"] = None if tokenizer is None else describe(tokenizer)
        if self.saved is None:
            return None
        check_same_model(self.saved, self.folder, model_key, self.header["tokenizer"])
        check_length(self.saved, self.folder, estimator)
        restore(estimator, self.saved["fitted"])
        run = dict(self.saved["run"])
        # A stochastic reward draws on from where the checkpoint left it (a new process
        # built it afresh): the resumed run is the uninterrupted one.
        set_random_states(self.live, run.pop("object_random_states", None) or {})
        return run

    def save(self, estimator, run_state: dict) -> str | None:
        """Write a checkpoint of ``estimator`` and its run state (rank 0 alone writes).

        In a distributed fit every rank calls this and waits until the checkpoint is
        whole, so no rank can read an older one (a resume right after a failure).
        Under FSDP every rank first takes part in gathering the full weights, which
        rank 0 writes in the format of an unsharded run.
        """
        path = None
        weights = gathered_weights(estimator)  # FSDP: a collective; else nothing
        states = random_states(self.live)
        if states:  # the objects as they are now, and their generators' states
            run_state = {**run_state, "object_random_states": states}
            now = {k: describe(v) for k, v in self.live.items()}
            self.header["objects_now"] = {**self.header["objects"], **now}
        if distributed.is_main():
            path = save(
                estimator, self.folder, header=self.header, run_state=run_state, weights=weights
            )
        distributed.barrier()
        return path


def described_objects(objects: dict, probes: dict | None = None) -> dict:
    """The objects given to ``fit`` by description, and by behaviour where that is not exact.

    ``probes`` maps an object's name to a function returning its behaviour
    (``rewards/_probe.py``); it is called only for an object whose description
    :func:`needs_probe`, with the object's random generators set back after it,
    and its result is recorded as ``<name>_behaviour``.
    """
    described = {k: describe(v) for k, v in sorted(objects.items())}
    for name, probe in (probes or {}).items():
        if objects.get(name) is not None and needs_probe(described[name]):
            with kept_random_states({name: objects[name]}):
                described[f"{name}_behaviour"] = probe()
    return described


@contextlib.contextmanager
def resumable(estimator, data_key: str, probes: dict | None = None, **objects):
    """The checkpoint of this fit, locked for its length, checked against its parameters.

    Yields ``None`` when the estimator has no ``checkpoint_dir``; else a
    :class:`Resume` whose ``saved`` is the checkpoint found (or ``None``). A
    checkpoint written with other defining parameters, other ``objects`` (the
    reward, the labeler: compared by their identity, see
    :func:`described_objects`) or other data is refused before any work, naming
    what differs.
    """
    if getattr(estimator, "checkpoint_dir", None) is None:
        yield None
        return
    check_folder(estimator.checkpoint_dir)  # before a probe calls the reward
    described = described_objects(objects, probes)
    params = described_params(estimator)  # a model's weights are hashed once
    folder = run_folder(estimator, data_key, described, params)
    check_folder(folder)
    # Distributed fits: rank 0 holds the lock and writes; the others only read.
    with locked(folder if distributed.is_main() else None):
        saved = read(folder, estimator)
        defining = defining_params(estimator, described=params)
        if saved is not None:
            check_same_run(saved, folder, defining=defining, data=data_key, objects=described)
        yield Resume(folder, saved, defining, data_key, described, objects)
