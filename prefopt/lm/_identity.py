"""What defines a run: one description used to decide a resume and to name a run's folder.

Every parameter is described by content (:func:`describe`, ``_describe.py``),
as are the objects given to ``fit`` (the reward, the labeler) and the data; a
reward whose description is not exact (:func:`needs_probe`) is also identified
by its outputs on a seeded probe drawn from the run's own data.
"""

from __future__ import annotations

import os

from ..backend.models import is_fitted  # noqa: F401 - used as _identity.is_fitted
from ._describe import (  # noqa: F401 - the description rules, re-exported
    IDENTITY_ATTRIBUTE,
    describe,
    digest,
    fingerprint,
    first_difference,
    module_fingerprint,
)

# Parameters that set a run's length, how it is watched and saved, or only how much memory
# its passes take (the same gradients: tests/test_memory.py); all others define it.
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


def needs_probe(description) -> bool:
    """Whether a described object may hold what its description cannot see.

    True when a part of it is opaque (no readable content, nested too deep) or
    is a user's function (or callable class) that reads module globals holding
    data (:func:`~prefopt.lm._describe.data_globals`): such an object is then
    also identified by its behaviour on a seeded probe. A function reading only
    its arguments, closure and defaults is described exactly, and never called
    before training.

    Examples
    --------
    >>> SCALE = 2.0
    >>> def reward(prompts, completions):
    ...     return [SCALE * len(c) for c in completions]  # SCALE: a global of the user's
    >>> reward.__module__ = "my_rewards"
    >>> needs_probe(describe(len)), needs_probe(describe(reward))
    (False, True)
    """
    if isinstance(description, list):
        return any(needs_probe(v) for v in description)
    if not isinstance(description, dict):
        return False
    if "opaque" in description or description.get("globals"):
        return True
    return any(needs_probe(v) for v in description.values())


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
    if "objects_now" in state and state["objects_now"] == objects:
        saved_objects = state["objects_now"]  # the same objects, their generators advanced
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
