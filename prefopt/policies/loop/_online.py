"""Online reward learning: label the policy's own samples and refit a copy of the reward.

Ziegler et al. (2019) collected labels on the current policy's samples during
training ("online"); it mattered for summarisation. Every ``refit_every`` steps
the loop pairs its own samples of each prompt of the step ((0, 1), (2, 3), ...
of the k), asks the labeler which is preferred, and trains a copy of the
reward further on the pairs so labelled (``partial_fit``: a warm start, then
the reward's own normalisation again); the reward passed to ``fit`` is never
changed. In a distributed fit every rank's pairs are gathered, and every rank
refits the same reward on the same global pairs.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from sklearn.utils import check_random_state

from ...backend import distributed
from ...data import check_comparisons


def start(policy, reward, labeler):
    """The online state of a fit, or ``None`` for an offline one; bad settings raise."""
    who = type(policy).__name__
    if policy.refit_every is None:
        if labeler is not None:
            raise ValueError(
                f"{who}.fit got a labeler but refit_every=None: the labeler is only used by "
                "online reward learning. Set refit_every=N to refit the reward every N steps "
                "on labelled samples of the policy, or drop labeler=."
            )
        return None
    if labeler is None or not callable(labeler):
        raise ValueError(
            f"{who}(refit_every={policy.refit_every}) needs fit(..., labeler=f) with "
            "f(prompts, completions_a, completions_b, random_state) -> labels (0 where a is "
            "preferred, 1 where b is), e.g. a world's labeler or a fitted RewardModel's "
            f"sample; got {labeler!r}."
        )
    if not callable(getattr(reward, "partial_fit", None)):
        raise TypeError(
            f"{who}(refit_every={policy.refit_every}) refits the reward on new labels, so the "
            "reward needs partial_fit(comparisons), as a fitted RewardModel has; got "
            f"{type(reward).__name__}."
        )
    language_model = isinstance(getattr(reward, "model_", None), torch.nn.Module)
    if language_model and distributed.world_size() > 1:
        # Its partial_fit would split the gathered pairs across ranks again, and a count of
        # pairs (ties dropped) that leaves a rank without a row stops the fit mid-run.
        raise ValueError(
            f"{who}(refit_every={policy.refit_every}): online refits of a language-model "
            "reward are not supported in a distributed fit yet; refit a feature reward "
            "(RewardModel() on a world's features), or run the fit in one process."
        )
    return OnlineRewards(policy, labeler)


class OnlineRewards:
    """The refits of one fit: the labeler, a log of every labelled pair, and the replay.

    The log holds what each refit labelled (prompts, the two completions, the
    labels and the refit's seed), so a resumed or warm-started fit rebuilds the
    refitted reward exactly from the reward passed to ``fit``.
    """

    def __init__(self, policy, labeler):
        self.labeler = labeler
        self.log: list[dict] = []
        # Seeds of the labeler and the refits, drawn apart from the run's streams, so an
        # online run samples the same prompts as the offline run with the same seed.
        self._base_seed = int(check_random_state(policy.random_state).randint(2**31 - 1))

    def state_dict(self) -> list[dict]:
        """The refit log, JSON-describable (for checkpoints)."""
        return self.log

    def replay(self, reward, log):
        """The reward given to ``fit`` with the refits of ``log`` redone; returns it."""
        for record in log or []:
            reward, _ = self._apply(reward, record)
        return reward

    def after_step(self, loop, batch, step: int, reward) -> tuple[dict, object]:
        """On every ``refit_every``-th ``step`` of ``loop``: label pairs of its samples, refit.

        Returns the statistics for ``history_`` and the reward (refitted, or as given).
        """
        stats = {"reward/refits": float(len(self.log))}
        if step % loop.view.refit_every:
            return stats, reward
        # Distributed fits: every rank's pairs, in rank order (the global batch's order), so
        # every rank labels the same pairs with the same seed and refits the same reward.
        shares = distributed.gather_objects(_pairs(loop, batch))
        prompts, first, second = ([x for share in shares for x in share[i]] for i in range(3))
        keep = [i for i in range(len(first)) if first[i] != second[i]]  # ties say nothing
        seed = int(np.random.SeedSequence([self._base_seed, step]).generate_state(1)[0])
        record = {
            "step": step,
            "seed": seed,
            "prompts": [prompts[i] for i in keep],
            "a": [first[i] for i in keep],
            "b": [second[i] for i in keep],
        }
        labels = np.asarray([], dtype=int)
        if keep:
            labels = _check_labels(
                self.labeler(record["prompts"], record["a"], record["b"], random_state=seed),
                len(keep),
            )
        record["labels"] = labels.tolist()
        reward, accuracy = self._apply(reward, record)
        stats.update(
            {
                "reward/refits": float(len(self.log)),
                "reward/new_labels": float(len(keep)),
                "reward/labels": float(sum(len(r["labels"]) for r in self.log)),
                "reward/online_accuracy": accuracy,
            }
        )
        return stats, reward

    def _apply(self, reward, record: dict) -> tuple[object, float]:
        """A copy of ``reward`` refitted on the record's pairs, and its accuracy before."""
        self.log.append(record)
        if not record["labels"]:
            return reward, float("nan")
        chosen, rejected = [], []
        for a, b, label in zip(record["a"], record["b"], record["labels"]):
            chosen.append(a if label == 0 else b)
            rejected.append(b if label == 0 else a)
        data = check_comparisons(
            {"prompt": record["prompts"], "chosen": chosen, "rejected": rejected}
        )
        old = reward
        accuracy = float(
            np.mean(
                np.asarray(old(data.prompt, data.chosen))
                > np.asarray(old(data.prompt, data.rejected))
            )
        )
        return _warm_copy(old).partial_fit(data, random_state=record["seed"]), accuracy


def _pairs(loop, batch) -> tuple[list, list, list]:
    """Disjoint pairs of the step's samples of each prompt: (0, 1), (2, 3), ... of its k.

    At k = 1 one more sample of each prompt is drawn to pair with it.
    """
    view = loop.view
    k = view.k
    rows = batch.prompt_index.cpu().numpy()
    texts = view.decode(batch.response_ids, batch.response_mask)
    if k >= 2:  # independent samples of the same prompt
        heads = np.array([g + j for g in range(0, len(rows), k) for j in range(0, k - 1, 2)])
        first = [texts[i] for i in heads]
        second = [texts[i + 1] for i in heads]
        rows = rows[heads]
    else:
        with torch.inference_mode():
            again = loop.rollouts.sampler.sample(
                view.model,
                batch.prompts,
                max_new_tokens=view.max_new_tokens,
                temperature=view.temperature,
                generator=loop.run.generator,
                pad_token_id=view.pad_token_id,
                suppress_ids=view.suppress_ids,
                stop_ids=view.stop_ids,
            )
        first, second = texts, view.decode(again.response_ids, again.response_mask)
    return [loop.prompts[i] for i in rows], first, second


def _check_labels(labels, n: int) -> np.ndarray:
    out = np.asarray(labels)
    if out.shape != (n,) or not np.isin(out, (0, 1)).all():
        raise ValueError(
            f"The labeler returned {out.shape if out.ndim else out!r} for {n} pairs; it must "
            "return an array of n labels, 0 where completions_a is preferred and 1 where "
            "completions_b is (as RewardModel.sample does)."
        )
    return out.astype(int)


def _warm_copy(reward):
    """A copy of a fitted reward to train further; its starting policy and features shared."""
    memo = {}
    for name in ("starting_policy_", "featurizer_", "features", "model"):
        value = getattr(reward, name, None)
        if value is not None:
            memo[id(value)] = value  # large or functions: shared, never trained here
    return copy.deepcopy(reward, memo)
