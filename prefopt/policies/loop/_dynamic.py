"""DAPO's dynamic sampling: replace the groups whose rewards all tie with fresh ones.

Yu et al. 2025 (DAPO, section 3.2): a group whose k samples all scored the same
has advantage 0 for every sample and gives no policy gradient, so as accuracy
rises more of each batch is wasted. Dynamic sampling over-samples: it drops such
groups and draws new prompts until the batch holds ``batch_size / k`` groups
with varied rewards, here for at most ``max_resamples`` extra rounds (a batch
still short is filled with dropped groups, so that every step has the same
size).
"""

from __future__ import annotations

import numpy as np
import torch

from ...backend import EncodedPrompts, distributed
from ._batch import RolloutBatch


def varied_groups(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Which groups of ``k`` samples have rewards that are not all equal.

    Examples
    --------
    >>> import torch
    >>> varied_groups(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2).tolist()
    [False, True]
    """
    grouped = scores.reshape(-1, k)
    return ~(grouped == grouped[:, :1]).all(1)


def dynamic_batch(rollout, batch: RolloutBatch, parts: dict, *, beta: float, step: int):
    """``batch`` with its tied groups replaced by varied groups of fresh prompts.

    ``rollout`` (a :class:`~prefopt.policies.loop._rollout.Rollout`) samples and
    scores the new prompts it draws from its run's prompt stream, for at most
    ``rollout.view.resample_tied_groups`` extra rounds. Distributed fits: every
    rank draws as many rounds as the rank that needs the most, so the ranks'
    prompt streams stay in step. Returns the batch, each reward's values and the
    resampling counts for ``history_``.
    """
    view = rollout.view
    k = view.k
    n_groups = len(batch) // k
    rounds = [(batch, parts, varied_groups(batch.scores, k))]
    have = int(rounds[0][2].sum())
    dropped, extra, count = n_groups - have, 0, 0
    while count < view.resample_tied_groups and distributed.any_rank(have < n_groups):
        rows = distributed.shard(rollout.run.next_rows(view.batch_size // k, len(rollout.prompts)))
        new, new_parts = rollout.once(rows, beta=beta, step=step)
        varied = varied_groups(new.scores, k)
        rounds.append((new, new_parts, varied))
        have += int(varied.sum())
        dropped += int((~varied).sum())
        extra += len(new)
        count += 1
    # The first n_groups varied groups in the order drawn, then tied ones of the first batch.
    picks = [(i, g) for i, (_, _, v) in enumerate(rounds) for g in torch.nonzero(v).flatten()]
    picks = picks[:n_groups]
    ties = torch.nonzero(~rounds[0][2]).flatten()
    picks += [(0, g) for g in ties[: n_groups - len(picks)]]
    out, out_parts = _take(rounds, picks, k, view.pad_token_id)
    # Counts over all ranks: the step's row averages the ranks' figures (reduce_row).
    ranks = distributed.world_size()
    stats = {
        "sampling/extra_generations": float(extra * ranks),
        "sampling/dropped_groups": float((dropped - max(0, n_groups - have)) * ranks),
        "sampling/rounds": float(count),
    }
    return out, out_parts, stats


def _take(rounds, picks, k: int, pad_id: int) -> tuple[RolloutBatch, dict]:
    """One batch of the picked groups ``(round, group)``, padded to common widths."""
    pieces = []
    for i, g in picks:
        rows = torch.arange(int(g) * k, int(g) * k + k)
        pieces.append((rounds[i][0], rows, {n: v[rows.numpy()] for n, v in rounds[i][1].items()}))
    first = rounds[0][0]
    width = max(b.prompts.input_ids.shape[1] for b, _, _ in pieces)
    length = max(b.response_ids.shape[1] for b, _, _ in pieces)

    def left(x, rows, value=0):  # prompts are padded on the left
        x = x[rows]
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x, rows, value=0):  # responses on the right
        x = x[rows]
        return torch.nn.functional.pad(x, (0, length - x.shape[1]), value=value)

    def cat(get):
        return torch.cat([get(b, rows) for b, rows, _ in pieces])

    timings: dict = {}
    for b, _, _ in rounds:
        for key, value in b.timings.items():
            timings[key] = timings.get(key, 0.0) + value
    batch = RolloutBatch(
        prompts=EncodedPrompts(
            cat(lambda b, r: left(b.prompts.input_ids, r, pad_id)),
            cat(lambda b, r: left(b.prompts.attention_mask, r)),
        ),
        prompt_index=cat(lambda b, r: b.prompt_index[r]),
        response_ids=cat(lambda b, r: right(b.response_ids, r, pad_id)),
        response_mask=cat(lambda b, r: right(b.response_mask, r)),
        ended=cat(lambda b, r: b.ended[r]),
        old_logprobs=cat(lambda b, r: right(b.old_logprobs, r)),
        ref_logprobs=cat(lambda b, r: right(b.ref_logprobs, r)),
        scores=cat(lambda b, r: b.scores[r]),
        kl=cat(lambda b, r: right(b.kl, r)),
        rewards=cat(lambda b, r: right(b.rewards, r)),
        beta=first.beta,
        kl_in_reward=first.kl_in_reward,
        values=None if first.values is None else cat(lambda b, r: right(b.values, r)),
        timings=timings,
        engine_logprobs=None
        if first.engine_logprobs is None
        else cat(lambda b, r: right(b.engine_logprobs, r)),
        attention_mask=None  # episodes: their transcripts' tokens
        if first.attention_mask is None
        else cat(lambda b, r: right(b.attention_mask, r)),
        # overlapped rollouts: every round carries its sampler's log-probs; the batch is as
        # stale as its stalest rows
        behaviour_logprobs=None
        if first.behaviour_logprobs is None
        else cat(lambda b, r: right(b.behaviour_logprobs, r)),
        staleness=max(b.staleness for b, _, _ in pieces),
    )
    names = list(rounds[0][1])
    out_parts = {n: np.concatenate([p[n] for _, _, p in pieces]) for n in names}
    return batch, out_parts
