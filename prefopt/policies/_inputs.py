"""What ``fit`` is given besides the prompts: the reward's starting policy, pretraining texts."""

from __future__ import annotations

import warnings

from ..data import check_pretraining_texts


def check_ptx(policy, ptx_data) -> list | None:
    """The pretraining texts of PPO-ptx, or ``None`` when the run mixes none in."""
    if policy.ptx_coef > 0 and ptx_data is None:
        raise ValueError(
            f"{type(policy).__name__}(ptx_coef={policy.ptx_coef}) mixes a next-token loss on "
            "pretraining text into the policy loss; pass the texts: fit(prompts, reward, "
            "ptx_data=texts), or set ptx_coef=0."
        )
    if ptx_data is not None and policy.ptx_coef == 0:
        warnings.warn(
            f"ptx_data was given but {type(policy).__name__} has ptx_coef=0, so it is "
            "ignored; set ptx_coef > 0 to mix in the pretraining loss.",
            UserWarning,
            stacklevel=3,
        )
        return None
    return None if ptx_data is None else check_pretraining_texts(ptx_data)


def starting_policy(reward, who: str):
    """The starting policy a reward knows (see ``RewardModel.starting_policy_``)."""
    from torch import nn

    start = getattr(reward, "starting_policy_", None)
    if start is None:
        raise ValueError(
            f"{who}.fit has no starting policy: pass model= (a local path, a transformers "
            "config, a torch module or a fitted SFTPolicy). A RewardModel fitted on an "
            "SFTPolicy, or on a world's comparisons, knows where the policy starts; this "
            f"reward ({type(reward).__name__}) does not."
        )
    if callable(start) and not isinstance(start, nn.Module) and not hasattr(start, "fit"):
        start = start()  # a factory of fresh copies, as PreferenceWorld.policy_model
    return start
