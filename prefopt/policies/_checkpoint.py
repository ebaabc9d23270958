"""Checkpoints of a policy's run: written atomically, resumed by ``fit``.

A checkpoint holds everything the next step depends on: model, reference and
value weights (safetensors), optimiser state, KL controller, random-number
states, the prompt stream, the baseline and ``history_``. It is written to a
temporary file and renamed, so an interrupted write never replaces the last
good checkpoint. The reward and the prompts are not stored: ``fit`` is called
again with them, and a checkpoint made for other prompts is refused.
"""

from __future__ import annotations

import hashlib
import json
import os

import joblib

from ..backend.serialization import FORMAT_VERSION

CHECKPOINT = "checkpoint.joblib"
_NOT_STORED = ("reward_model_", "_prompts", "_prompt_tokens")


def _fingerprint(prompts) -> str:
    return hashlib.sha256(json.dumps(list(prompts)).encode()).hexdigest()


def save_checkpoint(policy) -> str:
    """Write ``policy``'s state to ``checkpoint_dir`` atomically; return the path."""
    directory = os.fspath(policy.checkpoint_dir)
    os.makedirs(directory, exist_ok=True)
    state = {k: v for k, v in policy.__getstate__().items() if k not in _NOT_STORED}
    state["__prefopt_class__"] = type(policy).__name__
    path = os.path.join(directory, CHECKPOINT)
    tmp = f"{path}.tmp-{os.getpid()}"
    joblib.dump(state, tmp)
    os.replace(tmp, path)  # atomic: the old checkpoint stays until the new one is whole
    return path


def load_checkpoint(policy, prompts_key: str) -> bool:
    """Restore ``policy`` from its ``checkpoint_dir`` if a checkpoint is there."""
    if policy.checkpoint_dir is None:
        return False
    path = os.path.join(os.fspath(policy.checkpoint_dir), CHECKPOINT)
    if not os.path.exists(path):
        return False
    try:
        state = joblib.load(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same advice
        raise ValueError(
            f"Cannot read the checkpoint {path} ({exc}); it may come from another "
            "prefopt version. Delete it to start over."
        ) from exc
    if state.get("__prefopt_format__") != FORMAT_VERSION:
        raise ValueError(
            f"The checkpoint {path} has format {state.get('__prefopt_format__')!r}; "
            f"this prefopt reads format {FORMAT_VERSION}. Resume it with the "
            "prefopt version that wrote it, or delete it to start over."
        )
    if state.pop("__prefopt_class__", None) != type(policy).__name__:
        raise ValueError(
            f"The checkpoint {path} was written by another estimator class; "
            f"use another checkpoint_dir for this {type(policy).__name__}."
        )
    if state.get("_prompts_key") != prompts_key:
        raise ValueError(
            f"The checkpoint {path} was written for other prompts; resume with "
            "the same prompts, or use another checkpoint_dir."
        )
    policy.__setstate__(state)
    return True
