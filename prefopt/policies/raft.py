"""RAFT: reward-ranked fine-tuning (Dong et al., 2023).

Sample k responses per prompt, keep the best *within* each prompt (local ranking)
by the KL-shaped reward score - beta * KL, as Ahmadian et al. (2024) run it, and
fine-tune on the kept responses with the ordinary next-token loss. No advantage
weighting, no negatives, and beta plays no part in the loss: it enters only the
ranking (Dong et al.'s KL variant). ``rank_by="score"`` ranks by the score alone,
and iterating that sharpens the policy towards the best response the reward can
find, whatever beta is.
"""

from __future__ import annotations

from numbers import Integral

import torch

from ..validation import Interval, StrOptions
from ._base import BasePolicy, make_init
from ._docs import fill
from .loop import masked_mean

__all__ = ["RAFTPolicy", "best_of_k_mask"]


def best_of_k_mask(
    rewards: torch.Tensor,
    k: int,
    *,
    skip_dead_groups: bool = False,
    scores: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean mask selecting the highest-reward sample of each group of k.

    Ties go to the first sample of the group. With ``skip_dead_groups``, a group
    of ``k >= 2`` samples whose scores are all equal (a dead group: the reward
    does not rank them) keeps no sample.

    Parameters
    ----------
    rewards : torch.Tensor of shape (n,)
        The ranking of each sample, the k samples of a prompt together.
    k : int
        Samples per group; ``n`` must be a multiple of it.
    skip_dead_groups : bool, default=False
        Keep nothing of a group whose scores are all equal.
    scores : torch.Tensor of shape (n,), default=None
        What judges a group dead; ``None`` judges it by ``rewards``. A ranking
        by the KL-shaped reward passes the reward's scores here: its KL term
        tells apart samples that the reward scores alike (k wrong answers), and
        a group the reward does not rank keeps no sample either way.

    Returns
    -------
    mask : torch.Tensor of shape (n,), dtype bool

    Examples
    --------
    >>> import torch
    >>> best_of_k_mask(torch.tensor([0.1, 0.9, 0.5, 0.2]), k=2).tolist()
    [False, True, True, False]
    >>> best_of_k_mask(torch.tensor([0.0, 1.0, 0.0, 0.0]), k=2, skip_dead_groups=True).tolist()
    [False, True, False, False]
    >>> shaped, scores = torch.tensor([0.9, 0.8, -0.1, -0.3]), torch.tensor([1.0, 1.0, 0.0, 0.0])
    >>> best_of_k_mask(shaped, k=2, skip_dead_groups=True, scores=scores).tolist()
    [False, False, False, False]
    """
    if k < 1 or rewards.shape[0] % k:
        raise ValueError(f"{rewards.shape[0]} rewards do not split into groups of k={k}.")
    if scores is not None and scores.shape != rewards.shape:
        raise ValueError(
            f"best_of_k_mask: scores have shape {tuple(scores.shape)}, rewards "
            f"{tuple(rewards.shape)}; pass one score for each ranked sample."
        )
    grouped = rewards.reshape(-1, k)
    best = grouped.argmax(1)
    mask = torch.zeros_like(grouped, dtype=torch.bool)
    mask[torch.arange(grouped.shape[0]), best] = True
    if skip_dead_groups and k > 1:
        judged = grouped if scores is None else scores.reshape(-1, k)
        mask &= (judged != judged[:, :1]).any(1, keepdim=True)
    return mask.reshape(-1)


class RAFTPolicy(BasePolicy):
    """Reward-ranked fine-tuning: supervised learning on the best of k samples.

    Parameters
    ----------
    {common_parameters}
    k : int, default=4
        Samples per prompt; the best one is kept.
    rank_by : {"score", "shaped"}, default="shaped"
        Rank by the KL-shaped reward score - beta * KL (the KL summed over the
        response's tokens), as Ahmadian et al. (2024) rank RAFT, or by the
        reward's score alone (Dong et al. 2023 without their KL variant). It
        changes only which sample is kept; the Notes measure both.
    skip_dead_groups : bool, default=True
        Keep no sample of a dead group, one whose k scores are all equal
        (the reward's, whatever ``rank_by``; logged as
        ``objective/dead_group_share``): nothing ranks its samples, so
        its "best" would be an arbitrary one. Under a 0/1 verifiable reward a
        group that all fail would then be fine-tuned on a wrong answer, which
        grows more likely, until the prompt is answered wrong every time and
        never again gives a correct sample to keep. Xiong et al. (2025) train
        RAFT on correct samples only for this reason. ``False`` keeps the first
        sample of a dead group (Dong et al. 2023 state no rule for ties).

    Attributes
    ----------
    {common_attributes}

    See Also
    --------
    RLOOPolicy

    Notes
    -----
    ``n_epochs`` defaults to 4 passes over each step's kept samples. The paper
    fine-tunes 2 epochs per iteration on 2,048 kept samples (Dong et al. 2023);
    a step here keeps ``batch_size / k`` (16 at the defaults), and one pass over
    so few moves the policy little. Measured on TinyLMWorld, 100 steps, share
    of the way to the reward-maximising policy over seeds 0-2: 1 pass 0.73,
    2 passes 0.88-0.92, 4 passes 0.97 (PPO's number of epochs).

    Skipping dead groups, measured on the sanity configuration of
    :class:`~prefopt.worlds.ArithmeticWorld` (250 steps, training accuracy, seeds
    0-4): ranked by score, 1.000 on every seed; keeping their first sample 0.900
    on seeds 0, 2, 3 and 4 (one of the 10 problems answered wrong every time; on
    seed 0, 6+7 always "11", the answer kept from groups that all failed) and
    1.000 on seed 1. Ranked by the shaped reward (the default) 1.000 on seeds
    0-3 and 0.988 on seed 4, and 1.000 on every seed when dead groups are kept:
    the KL term keeps a different wrong answer from step to step, so none takes
    over. On the exact worlds it costs little: share of the way to the
    reward-maximising policy, seeds 0-2, preference world 0.992-0.994 (0.994-0.995
    ranked by score), TinyLMWorld at 1e-3 0.958-0.966.

    Ranked by score, RAFT ignores the KL-regularised objective: one step moves pi
    towards the best-of-k distribution of pi, whose only fixed points put all
    mass on the responses of highest reward. On the preference world it
    converges towards the reward model's argmax response, not towards
    pi_ref exp(r/beta)/Z: at beta 0.3 (SGD at 0.3, 60 steps, seeds 0-2) it ends
    at KL 1.84 and objective 1.250, against the optimum's 0.70 and 1.475. Ranked
    by the shaped reward it ends at KL 0.63 and objective 1.457, and it stays
    near the reference on language models: with the adaptive default rate on
    the review world (Llama shape, 30 steps, ``benchmarks/defaults_5seeds.py``),
    ranked by score the KL per token of one seed of five climbed past 2.1 nats
    and fired ``kl_blowup``, each update held at the rate's target while the
    updates kept one direction; ranked by the shaped reward all five seeds and
    the 15 on the other worlds stayed healthy.

    References
    ----------
    H. Dong et al., "RAFT: Reward rAnked FineTuning for Generative Foundation
    Model Alignment", TMLR 2023.

    A. Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization
    for Learning from Human Feedback in LLMs", ACL 2024.

    W. Xiong et al., "A Minimalist Approach to LLM Reasoning: from Rejection
    Sampling to Reinforce", arXiv:2504.11343, 2025.

    Examples
    --------
    >>> import prefopt
    >>> from prefopt import RAFTPolicy, RewardModel
    >>> from prefopt.worlds import PreferenceWorld
    >>> prefopt.set_config(show_progress_bar=False)
    >>> world = PreferenceWorld(random_state=0)
    >>> rm = RewardModel().fit(world.comparisons(1000, random_state=0))
    >>> raft = RAFTPolicy(model=world.policy_model(), k=4, learning_rate=0.3,
    ...                   optimizer="sgd", n_steps=3, random_state=0).fit(world.prompts, rm)
    >>> raft.n_episodes_
    192
    """

    _parameter_constraints = {
        **BasePolicy._parameter_constraints,
        "k": [Interval(Integral, 1, None, closed="left")],
        "rank_by": [StrOptions({"score", "shaped"})],
        "skip_dead_groups": ["boolean"],
    }

    # Only what this algorithm changes of the common parameters (policies/_params.py)
    # and its own parameters; make_init writes the explicit keyword-only signature.
    __init__ = make_init(n_epochs=4, k=4, rank_by="shaped", skip_dead_groups=True)

    # The advice of the warnings of a policy far from the reference (Algorithm.kl_advice):
    # beta holds RAFT only through its ranking; ranked by score, its fixed points are the
    # reward's argmax (Notes).
    kl_advice = (
        "RAFT's loss has no KL term: each step fine-tunes on its best samples and moves on "
        "from the reference. Rank by the KL-shaped reward (rank_by='shaped', the default, with "
        "beta > 0; a larger beta if it already does), take fewer steps, or lower learning_rate."
    )

    samples_per_prompt = "k"
    tiny_model_learning_rate = 3e-5  # learning_rate=None on a tiny model: LR_SWEEP.md, rule 2
    # The kept responses are trained on with the ordinary next-token loss, at
    # temperature 1 as SFT (Dong et al. 2023), not at the sampling temperature.
    training_temperature = 1.0
    # A mean over the kept responses' tokens, whose count a part of a minibatch does not
    # know: accumulated through the whole minibatch's loss (the contract's default).
    loss_reduction = "minibatch"

    def compute_advantages(self, batch):
        """1 for the best of each prompt's k samples, 0 for the rest (and dead groups).

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts, k samples per prompt together.

        Returns
        -------
        advantages : torch.Tensor of shape (n,)
        """
        ranking = batch.scores if self.rank_by == "score" else batch.rlhf_rewards
        # dead groups are judged on the reward's scores: the KL term of a shaped ranking
        # tells apart k samples the reward scores alike, and ranks none of them better
        mask = best_of_k_mask(
            ranking, self.k, skip_dead_groups=self.skip_dead_groups, scores=batch.scores
        )
        return mask.to(batch.scores.dtype)

    def compute_loss(self, batch, minibatch):
        """Next-token cross-entropy on the kept responses, averaged over their tokens.

        Parameters
        ----------
        batch : RolloutBatch
            The step's rollouts.
        minibatch : Minibatch
            The rows and the current policy's log-probs.

        Returns
        -------
        loss : torch.Tensor
        stats : dict
        """
        logprobs = minibatch.logprobs
        weight = minibatch.advantages.unsqueeze(1) * minibatch.mask
        # Next-token cross-entropy on the kept responses, averaged over their tokens.
        # With no kept response in the minibatch this is 0 (gradient 0); no branch on the
        # data, so every rank of a distributed fit runs the same reductions.
        loss = -masked_mean(logprobs, weight, across_ranks=True)
        return loss, {"loss/policy": loss.item()}


RAFTPolicy.__doc__ = fill(RAFTPolicy)
