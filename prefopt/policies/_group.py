"""The GRPO family's formulas, pure functions of tensors checked against hand numbers.

Group advantages (Shao et al. 2024) and their batch-level scale (TRL; Hu 2025),
the token-loss aggregations (Shao et al. 2024; Liu et al. 2025; Yu et al. 2025),
the clipped surrogate with an asymmetric range (Yu et al. 2025), at the token or
the sequence level (Zheng et al. 2025), and DAPO's soft overlong penalty.
"""

from __future__ import annotations

import torch

from ..backend import distributed

__all__ = [
    "STD_EPS",
    "aggregate_token_loss",
    "clipped_surrogate",
    "group_advantages",
    "overlong_penalty",
    "sequence_log_ratio",
]

# TRL adds 1e-4 to the std, so a group whose samples all scored the same gets
# advantage 0 rather than 0/0.
STD_EPS = 1e-4


def group_advantages(
    rewards: torch.Tensor,
    k: int,
    scale: str = "group",
    eps: float = STD_EPS,
    *,
    across_ranks: bool = False,
) -> torch.Tensor:
    """(r_i - group mean) / (std + eps): GRPO's advantage of each sample.

    ``rewards`` holds the k samples of each prompt together. The group's mean
    and std include the sample itself (Shao et al. 2024). The std is the
    sample (Bessel-corrected, n - 1) standard deviation, as ``torch.std`` and
    TRL's ``GRPOTrainer`` compute it, plus ``eps``.

    Parameters
    ----------
    rewards : torch.Tensor of shape (n,)
        One reward per sample, k per prompt, each prompt's samples together.
    k : int
        Samples per prompt, at least 2.
    scale : {"group", "batch", "none"}, default="group"
        Divide by the group's std (Shao et al. 2024), by the std of all the
        rewards in the batch (TRL's ``scale_rewards="batch"``; the mean
        stays the group's), or not at all (Liu et al. 2025).
    eps : float, default=1e-4
        Added to the std.
    across_ranks : bool, default=False
        With ``scale="batch"`` in a distributed fit, the std of every rank's rewards.

    Returns
    -------
    advantages : torch.Tensor of shape (n,)

    Examples
    --------
    >>> import torch
    >>> r = torch.tensor([1.0, 3.0, 0.0, 0.0])
    >>> group_advantages(r, k=2, scale="none").tolist()
    [-1.0, 1.0, 0.0, 0.0]
    >>> [round(a, 4) for a in group_advantages(r, k=2).tolist()]   # group stds sqrt(2), 0
    [-0.7071, 0.7071, 0.0, 0.0]
    """
    if k < 2:
        raise ValueError(
            f"GRPO needs k >= 2 samples per prompt; got k={k}: a group of one sample has "
            "no std and its advantage r - mean is always 0."
        )
    if rewards.shape[0] % k:
        raise ValueError(f"{rewards.shape[0]} rewards do not split into groups of k={k}.")
    grouped = rewards.reshape(-1, k)
    centred = grouped - grouped.mean(1, keepdim=True)
    if scale == "group":
        centred = centred / (grouped.std(1, keepdim=True) + eps)
    elif scale == "batch":
        centred = centred / (distributed.std(rewards, across_ranks=across_ranks) + eps)
    elif scale != "none":
        raise ValueError(f"scale must be 'group', 'batch' or 'none'; got {scale!r}.")
    return centred.reshape(-1)


def aggregate_token_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str = "dapo",
    *,
    max_new_tokens: int | None = None,
    n_tokens: float | None = None,
) -> torch.Tensor:
    """One scalar from per-token losses, the way GRPO's variants weigh tokens.

    * ``"grpo"``: the mean over each sequence's tokens, then the mean over
      sequences (Shao et al. 2024). A token of a short response weighs more
      than one of a long response, which biases length (Liu et al. 2025).
    * ``"dr_grpo"``: the sum over tokens divided by
      ``n_sequences * max_new_tokens``, a constant (Liu et al. 2025).
    * ``"dapo"``: the sum over tokens divided by ``n_tokens``, the number of
      response tokens in the step's whole batch (Yu et al. 2025; TRL's
      default), so every token of a step weighs the same.

    Parameters
    ----------
    per_token : torch.Tensor of shape (n, length)
        Loss of each token.
    mask : torch.Tensor of shape (n, length)
        1 where a token belongs to the response.
    loss_type : {"grpo", "dr_grpo", "dapo"}, default="dapo"
    max_new_tokens : int, default=None
        Tokens sampled per response (``"dr_grpo"``); ``None`` takes ``length``.
    n_tokens : float, default=None
        The ``"dapo"`` normaliser; ``None`` counts the tokens in ``mask``.

    Returns
    -------
    loss : torch.Tensor

    Examples
    --------
    >>> import torch
    >>> x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    >>> m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    >>> [round(aggregate_token_loss(x, m, t).item(), 4) for t in ("grpo", "dr_grpo", "dapo")]
    [3.0, 1.6667, 2.5]
    """
    mask = mask.to(per_token.dtype)
    total = per_token * mask
    if loss_type == "grpo":
        return (total.sum(1) / mask.sum(1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        length = per_token.shape[1] if max_new_tokens is None else max_new_tokens
        return total.sum() / (per_token.shape[0] * length)
    if loss_type == "dapo":
        count = mask.sum() if n_tokens is None else torch.as_tensor(float(n_tokens))
        return total.sum() / count.clamp(min=1.0)
    raise ValueError(f"loss_type must be 'grpo', 'dr_grpo' or 'dapo'; got {loss_type!r}.")


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's log s_i = mean_t log(pi/pi_old) over a response's tokens, for every token.

    Zheng et al. 2025 ("Group Sequence Policy Optimization"): the importance
    ratio of a response is the geometric mean of its token ratios,
    ``s_i = (pi(y_i|x) / pi_old(y_i|x))^(1/|y_i|) = exp(mean_t log r_i,t)``, so it
    is clipped once per sequence rather than token by token. As TRL's
    ``importance_sampling_level="sequence"`` the value is broadcast to the
    response's tokens (with gradients through the mean).

    Parameters
    ----------
    log_ratio : torch.Tensor of shape (n, length)
        log pi - log pi_old per token.
    mask : torch.Tensor of shape (n, length)

    Returns
    -------
    log_s : torch.Tensor of shape (n, length)
        The row's mean log-ratio in every column.

    Examples
    --------
    >>> import torch
    >>> lr = torch.tensor([[0.2, 0.4, 9.0]])
    >>> sequence_log_ratio(lr, torch.tensor([[1, 1, 0]])).tolist()
    [[0.30000001192092896, 0.30000001192092896, 0.30000001192092896]]
    """
    mask = mask.to(log_ratio.dtype)
    mean = (log_ratio * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    return mean[:, None].expand_as(log_ratio)


def clipped_surrogate(
    log_ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-min(rho A, clip(rho, 1 - low, 1 + high) A): PPO's surrogate, DAPO's clip-higher.

    Schulman et al. 2017 clip symmetrically (``low == high``); Yu et al. 2025
    (DAPO) raise the upper bound (``high`` 0.28 against ``low`` 0.2) so that an
    unlikely token with a positive advantage can gain more probability in one
    step, which keeps the policy's entropy from collapsing.

    Parameters
    ----------
    log_ratio : torch.Tensor of shape (n, length)
        log rho, per token (or a sequence's, broadcast).
    advantages : torch.Tensor of shape (n, 1) or (n, length)
    low, high : float
        The clip range is [1 - low, 1 + high].

    Returns
    -------
    loss, unclipped, clipped : torch.Tensor of shape (n, length)
        The per-token loss and the two terms of the min.

    Examples
    --------
    >>> import torch, math
    >>> lr = torch.tensor([[math.log(1.5), math.log(0.5)]])
    >>> loss, _, _ = clipped_surrogate(lr, torch.tensor([[1.0]]), 0.2, 0.28)
    >>> [round(v, 4) for v in loss[0].tolist()]   # -min(1.5, 1.28), -min(0.5, 0.8)
    [-1.28, -0.5]
    """
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - low, 1.0 + high) * advantages
    return -torch.minimum(unclipped, clipped), unclipped, clipped


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache: int) -> torch.Tensor:
    """DAPO's soft overlong punishment of each response length (Yu et al. 2025, eq. 13).

    0 up to ``L_max - L_cache`` tokens, then falling linearly to -1 at ``L_max``:
    ``((L_max - L_cache) - |y|) / L_cache`` in between, -1 beyond ``L_max``.

    Parameters
    ----------
    lengths : torch.Tensor of shape (n,)
        Response lengths in tokens.
    max_length : int
        ``L_max``, the longest response (``max_new_tokens``).
    cache : int
        ``L_cache``, the width of the soft interval, 1 to ``max_length``.

    Returns
    -------
    penalty : torch.Tensor of shape (n,)

    Examples
    --------
    >>> import torch
    >>> overlong_penalty(torch.tensor([4, 6, 7, 8]), max_length=8, cache=4).tolist()
    [0.0, -0.5, -0.75, -1.0]
    """
    if not 1 <= cache <= max_length:
        raise ValueError(
            f"overlong_cache={cache} must be between 1 and max_new_tokens={max_length}; "
            "it is the width of the soft interval L_max - L_cache .. L_max."
        )
    lengths = lengths.to(torch.float32)
    start = max_length - cache
    soft = (start - lengths) / cache
    penalty = torch.where(lengths <= start, torch.zeros_like(lengths), soft)
    return torch.where(lengths > max_length, torch.full_like(lengths, -1.0), penalty)
