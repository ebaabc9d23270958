"""Convergence on the preference world, against the closed-form optimum.

The worked example's setting: PreferenceWorld(rater_bias=1.0, random_state=0), a reward
model fitted on 1000 comparisons (random_state=0), beta = 0.3, 64 rollouts a
step for 60 steps, plain SGD. The optimum pi* = pi_ref exp(r / beta) / Z has
reward 1.6853, KL 0.6999 and true quality 1.7154.

Tolerances come from five seeds (0-4) measured once with these settings:

==========  ====================  ===============  ==========================
algorithm   mean reward gap       mean KL vs pi*   seed std (reward, KL)
==========  ====================  ===============  ==========================
PPO         -0.0062               -2.0 %           0.0015, 0.0031
RLOO k=4    -0.0100               -3.8 %           0.0010, 0.0031
REINFORCE   -0.0111               -4.2 %           0.0012, 0.0039
==========  ====================  ===============  ==========================

The acceptance bands (|gap| <= 0.03, |KL / KL* - 1| <= 10 %) sit at least 10 seed
standard deviations beyond the worst measured mean, so they fail only when an
algorithm stops converging, not by chance.
"""

import numpy as np
import pytest
import torch
from _tiny import small_policy

from prefopt import PPOPolicy, RAFTPolicy, ReinforcePolicy, RLOOPolicy

# The healthy exact-world runs trip no run-health detector (issue 25).
pytestmark = pytest.mark.filterwarnings("error::prefopt.exceptions.RunHealthWarning")

BETA = 0.3
SEEDS = range(5)
N_STEPS = 60
BATCH = 64


def _ppo(world, **kw):
    # The worked example: step size 0.3, 4 epochs (default), clip 0.2 (default).
    return small_policy(
        world,
        PPOPolicy,
        beta=BETA,
        learning_rate=0.3,
        n_steps=N_STEPS,
        batch_size=BATCH,
        clip_coef=0.2,
    ).set_params(**kw)


def _rloo(world, **kw):
    # Same 3840 episodes; a REINFORCE-style gradient is not normalised like PPO's
    # whitened advantages, so it needs a larger SGD step (measured: 2.0).
    return RLOOPolicy(
        model=world.policy_model(),
        beta=BETA,
        k=4,
        learning_rate=2.0,
        optimizer="sgd",
        n_steps=N_STEPS,
        batch_size=BATCH,
        **kw,
    )


def _reinforce(world, **kw):
    return ReinforcePolicy(
        model=world.policy_model(),
        beta=BETA,
        learning_rate=2.0,
        optimizer="sgd",
        n_steps=N_STEPS,
        batch_size=BATCH,
        **kw,
    )


ALGORITHMS = {"ppo": _ppo, "rloo": _rloo, "reinforce": _reinforce}


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_reaches_the_closed_form_optimum(world, rm, name):
    best = world.optimum(rm, BETA)
    runs, episodes = [], set()
    for seed in SEEDS:
        est = ALGORITHMS[name](world, random_state=seed).fit(world.prompts, rm)
        runs.append(world.evaluate(est, rm, BETA))
        episodes.add(est.n_episodes_)
    reward = np.array([r["reward"] for r in runs])
    kl = np.array([r["kl"] for r in runs])
    objective = np.array([r["objective"] for r in runs])
    gap = reward.mean() - best["reward"]
    kl_rel = kl.mean() / best["kl"] - 1
    print(
        f"\n{name}: reward {reward.mean():.4f} (optimum {best['reward']:.4f}, gap {gap:+.4f}, "
        f"seed std {reward.std(ddof=1):.4f}); KL {kl.mean():.4f} (optimum {best['kl']:.4f}, "
        f"{100 * kl_rel:+.1f}%, seed std {kl.std(ddof=1):.4f}); objective gap "
        f"{objective.mean() - best['objective']:+.5f}"
    )
    assert episodes == {N_STEPS * BATCH}
    assert abs(gap) <= 0.03
    assert abs(kl_rel) <= 0.10
    # The optimum maximises E[r] - beta KL: no policy can beat it, and these come
    # within 0.003 of it (measured -0.0014 to -0.0028 per seed, all three).
    assert objective.max() <= best["objective"] + 1e-9
    assert objective.mean() >= best["objective"] - 0.01
    # Seeds agree: measured std <= 0.0015 in reward and <= 0.004 in KL.
    assert reward.std(ddof=1) < 0.01
    assert kl.std(ddof=1) < 0.02


def test_true_quality_rises_along_a_ppo_run(world, rm):
    # One run of the worked example (seed 0), evaluated exactly every 20 steps (callback).
    quality = {0: world.evaluate(world.reference_probs(), rm, BETA)["true_quality"]}

    def track(policy, row):
        if row["step"] % 20 == 0:
            quality[row["step"]] = world.evaluate(policy, rm, BETA)["true_quality"]

    ppo = _ppo(world, random_state=0).fit(world.prompts, rm, callback=track)
    path = [quality[step] for step in (0, 20, 40, 60)]
    print(f"\nPPO true quality at steps 0/20/40/60: {np.round(path, 4).tolist()}")
    # Measured 0.872, 1.651, 1.724, 1.709; the optimum's is 1.7154. The big rise
    # happens in the first ~15 steps, as wrong answers lose their mass. After that
    # the policy wanders around pi* with the SGD noise (true quality +-0.04 from
    # step to step; peaks of 1.744-1.749 at steps 18-34 for seeds 0-2, as high as
    # the tilted family ever gets: 1.743 at beta = 0.46) until the annealed step
    # size settles it. So the rise is asserted between 0, 20 and the settled end,
    # not at every checkpoint.
    assert path[1] > path[0] + 0.7
    assert path[3] > path[1]
    assert path[3] == pytest.approx(world.optimum(rm, BETA)["true_quality"], abs=0.03)
    assert max(path) < world.optimum(rm, BETA)["true_quality"] + 0.05
    assert ppo.n_iter_ == 60


def _strip_time(history):
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in history]


def test_warm_start_chunks_equal_one_fit(world, rm):
    # With a constant step size, two warm-started fits of 5 steps are exactly one
    # fit of 10 steps: same parameters, same history (wall time aside).
    kw = {"random_state": 3, "lr_schedule": "constant", "n_steps": 10}
    one = _ppo(world, **kw).fit(world.prompts, rm)
    two = _ppo(world, warm_start=True, **{**kw, "n_steps": 5})
    two.fit(world.prompts, rm).fit(world.prompts, rm)
    assert torch.equal(one.model_.theta, two.model_.theta)
    for a, b in zip(one.value_model_.parameters(), two.value_model_.parameters()):
        assert torch.equal(a, b)
    assert _strip_time(one.history_) == _strip_time(two.history_)
    assert two.n_iter_ == 10 and two.n_episodes_ == 10 * BATCH
    assert [row["step"] for row in two.history_] == list(range(1, 11))
    # Without warm_start, a second fit starts over (and repeats the first).
    again = _ppo(world, **kw).fit(world.prompts, rm).fit(world.prompts, rm)
    assert torch.equal(again.model_.theta, one.model_.theta)
    assert again.n_iter_ == 10


def test_raft_ignores_beta_and_sharpens_towards_the_argmax(world, rm):
    # RAFT fine-tunes on the best of k; beta enters neither the ranking
    # (rank_by="score") nor the loss. Its only fixed points put all mass on the
    # reward model's argmax (here the flattering correct answer, type 1), so it
    # runs past pi* towards the beta -> 0 optimum. A constant step size shows
    # that limit; fit's callback reads its path.
    best = world.rewards(rm).argmax(1)
    assert best.tolist() == [1] * world.n_prompts
    rows = np.arange(world.n_prompts)
    star = world.optimum(rm, BETA)
    p_star = world.optimal_probs(rm, BETA)[rows, best].mean()  # 0.458
    p_ref = world.reference_probs()[rows, best].mean()  # 0.131
    final = {}
    for beta in (0.03, 0.3, 3.0):
        path = []

        def track(policy, row, path=path):
            if row["step"] % 20 == 0:
                path.append(world.policy_probs(policy)[rows, best].mean())

        raft = small_policy(
            world,
            RAFTPolicy,
            beta=beta,
            rank_by="score",
            k=4,
            learning_rate=0.3,
            lr_schedule="constant",
            n_steps=N_STEPS,
            batch_size=BATCH,
            random_state=0,
        ).fit(world.prompts, rm, callback=track)
        final[beta] = (world.policy_probs(raft), world.evaluate(raft, rm, BETA))
        if beta == BETA:
            print(
                f"\nRAFT p(argmax) at steps 20/40/60: {np.round(path, 4).tolist()} "
                f"(pi_ref {p_ref:.3f}, pi* {p_star:.3f}); {final[beta][1]}"
            )
            # Measured 0.744, 0.888, 0.929 (seed 1: 0.755, 0.891, 0.930; 0.967 by step
            # 120). With the worked example's linearly annealed step it stops at 0.846, KL 1.37.
            assert np.all(np.diff(path) > 0)
            assert path[-1] > 0.9 and path[-1] > p_star + 0.4
            metrics = final[beta][1]
            # Measured KL 1.68 (pi*: 0.70) and true quality 1.33 (pi*: 1.72).
            assert metrics["kl"] > 2 * star["kl"]
            assert metrics["true_quality"] < star["true_quality"] - 0.3
            assert metrics["reward"] > star["reward"]  # 1.753 > 1.685: reward hacked
    # beta plays no part: the three runs give the same policy (bit for bit here).
    for beta in (0.03, 3.0):
        np.testing.assert_allclose(final[beta][0], final[BETA][0], rtol=0, atol=1e-6)
