import pytest
import torch

from seeupo.core.algorithms import ALGORITHMS, get_algorithm
from seeupo.lab.problems import TreeShape, separated_problem, trap_problem
from seeupo.lab.runner import RunConfig, run


def expected_return(theta, problem, policy):
    keys, _ = problem.shape.keys(policy)
    lp = torch.log_softmax(theta, -1)[:, :, keys, problem.shape.tokens]
    return (lp.sum(-1).exp() * problem.rewards).sum(-1).mean(-1)


def test_tree_enumeration_probabilities_sum_to_one():
    shape = TreeShape(turns=2, tokens_per_turn=2, vocab=3)
    for policy in ("per_turn", "shared"):
        keys, n = shape.keys(policy)
        assert int(keys.max()) + 1 == n
        theta = torch.randn(1, 2, n, 3, dtype=torch.float64)
        lp = torch.log_softmax(theta, -1)[:, :, keys, shape.tokens].sum(-1)
        assert torch.allclose(lp.exp().sum(-1), torch.ones(1, 2, dtype=torch.float64))
    # every trajectory is distinct and each token's tree node is its prefix
    assert torch.unique(shape.tokens, dim=0).shape[0] == shape.n_traj
    assert torch.unique(shape.tree_node[:, -1]).numel() == shape.n_traj // 3


def test_separated_problem_has_unique_separated_optimum():
    p = separated_problem(TreeShape(3, 2, 2), 4, [0, 1, 2])
    best = p.rewards.max(-1).values
    second = p.rewards.topk(2, -1).values[..., 1]
    assert torch.allclose(best, torch.ones_like(best))
    assert (best - second >= 0.7 / 3 - 1e-9).all()


@pytest.mark.parametrize("policy", ["per_turn", "shared"])
def test_exact_reinforce_step_is_the_true_policy_gradient(policy):
    # Loop-free reference: autograd of the exactly enumerated expected return.
    p = separated_problem(TreeShape(3, 2, 2), 3, [5, 6])
    lr = 1e-3
    res = run(p, get_algorithm("reinforce"), mode="exact", policy=policy,
              cfg=RunConfig(iterations=1, lr=lr), seed=3)
    theta0 = res.theta_init.clone().requires_grad_()
    (grad_J,) = torch.autograd.grad(expected_return(theta0, p, policy).sum(), theta0)
    # the lab's loss sums over tasks (per-task step sizes): step = lr * n_tasks * grad J
    assert torch.allclose(res.theta - res.theta_init, lr * p.n_tasks * grad_J, atol=1e-12)


def test_seeupo_on_one_turn_equals_gspo_with_batch_norm():
    p = separated_problem(TreeShape(1, 2, 3), 4, [0, 1])
    for mode in ("exact", "sampled"):
        cfg = RunConfig(iterations=5, lr=30.0)
        a = run(p, get_algorithm("seeupo"), mode=mode, policy="per_turn", cfg=cfg, seed=1)
        b = run(p, get_algorithm("gspo"), mode=mode, policy="per_turn",
                cfg=RunConfig(iterations=5, lr=30.0, norm="batch", epochs=1, minibatches=1, clip_eps=0.2,
                              clip_eps_high=0.2), seed=1)
        assert torch.equal(a.theta, b.theta)


def test_seeupo_order_matters_only_with_several_turns():
    p = trap_problem([0, 1])
    cfg = RunConfig(iterations=3, lr=100.0)
    rev = run(p, get_algorithm("seeupo"), mode="exact", policy="per_turn", cfg=cfg)
    nat = run(p, get_algorithm("seeupo-natural"), mode="exact", policy="per_turn", cfg=cfg)
    assert not torch.allclose(rev.theta, nat.theta)


def test_zero_learning_rate_changes_nothing():
    p = separated_problem(TreeShape(2, 2, 2), 2, [0])
    for name in ALGORITHMS:
        r = run(p, get_algorithm(name), mode="sampled", policy="per_turn", cfg=RunConfig(iterations=2, lr=0.0))
        assert torch.equal(r.theta, r.theta_init)
        assert torch.equal(r.returns[:, 0], r.returns[:, -1])


def test_exact_reinforce_is_monotone_and_improves_multi_turn():
    p = separated_problem(TreeShape(3, 2, 2), 4, list(range(4)))
    r = run(p, get_algorithm("reinforce"), mode="exact", policy="per_turn", cfg=RunConfig(iterations=60, lr=10.0))
    assert (r.returns.diff(dim=-1) >= -1e-9).all()
    assert ((p.optimum - r.returns[:, -1]) < (p.optimum - r.returns[:, 0])).all()


def test_bad_mode_and_policy_fail_clearly():
    p = separated_problem(TreeShape(1, 1, 2), 1, [0])
    with pytest.raises(ValueError, match="exact, sampled"):
        run(p, get_algorithm("ppo"), mode="analytic", policy="per_turn", cfg=RunConfig(iterations=1))
    with pytest.raises(ValueError, match="per_turn, shared"):
        run(p, get_algorithm("ppo"), mode="exact", policy="tied", cfg=RunConfig(iterations=1))
    with pytest.raises(ValueError, match="valid names"):
        get_algorithm("dpo")


def test_trap_family_has_a_table_per_seed_and_a_separated_optimum():
    p = trap_problem(list(range(6)))
    assert len({tuple(r.flatten().tolist()) for r in p.rewards}) == 6
    top2 = p.rewards.topk(2, -1).values
    assert torch.all(top2[..., 0] == 1.0) and torch.all(top2[..., 0] - top2[..., 1] >= 0.1 - 1e-12)


def test_factor_variants_and_the_declared_clip_reach_the_update():
    p = trap_problem([0, 1, 2])
    algo = get_algorithm("seeupo")
    thetas = {}
    for name, kw in {"full": {"factor_ratio": "full"}, "geometric": {}, "off": {"factor_ratio": "off"},
                     "clamped": {"factor_ratio": "geometric", "factor_clip": (0.8, 1.2)}}.items():
        thetas[name] = run(p, algo, mode="exact", policy="per_turn", cfg=RunConfig(iterations=3, lr=100.0, **kw)).theta
    names = list(thetas)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not torch.allclose(thetas[a], thetas[b]), (a, b)
    gspo = get_algorithm("gspo")
    declared = run(p, gspo, mode="exact", policy="per_turn", cfg=RunConfig(iterations=2, lr=30.0))
    wide = run(p, gspo, mode="exact", policy="per_turn",
               cfg=RunConfig(iterations=2, lr=30.0, clip_eps=0.2, clip_eps_high=0.2))
    assert declared.schedule["clip_eps"] == 3e-4 and not torch.allclose(declared.theta, wide.theta)
    assert declared.steps_per_iteration == 4  # GSPO's declared schedule: one epoch of four minibatches


def test_matched_baseline_takes_seeupos_steps():
    p = separated_problem(TreeShape(3, 2, 2), 2, [0])
    cfg = RunConfig(iterations=2, lr=1.0, epochs=4, minibatches=1)
    seq = run(p, get_algorithm("seeupo"), mode="exact", policy="per_turn", cfg=cfg)
    matched = run(p, get_algorithm("grpo"), mode="exact", policy="per_turn",
                  cfg=RunConfig(iterations=2, lr=1.0, epochs=4, minibatches="turns"))
    assert seq.steps_per_iteration == matched.steps_per_iteration == 12


def test_lab_carries_the_factor_only_for_sequential_algorithms():
    """GSPO given SeeUPO's order, normalisation and schedule runs SeeUPO's phases without the factor:
    the same parameters as SeeUPO with the factor off, and not as SeeUPO with it."""
    p = trap_problem([0, 1])
    common = dict(iterations=3, lr=100.0, epochs=2, minibatches=1, clip_eps=0.2, clip_eps_high=0.2, norm="batch")
    gspo = run(p, get_algorithm("gspo"), mode="exact", policy="per_turn", cfg=RunConfig(order="reverse", **common))
    off = run(p, get_algorithm("seeupo"), mode="exact", policy="per_turn", cfg=RunConfig(factor_ratio="off", **common))
    on = run(p, get_algorithm("seeupo"), mode="exact", policy="per_turn", cfg=RunConfig(**common))
    assert torch.equal(gspo.theta, off.theta) and not torch.allclose(gspo.theta, on.theta)


def test_a_critic_with_controlled_error():
    """PPO's critic in the lab: the exact node values plus a bias and Gaussian noise of the given std,
    one draw per node (measured on 200k nodes); at 0 and 0 the exact values themselves, and the knob
    reaches PPO's update."""
    from seeupo.lab.runner import critic_values

    exact = torch.rand(4, 5, 10_000, dtype=torch.float64)
    assert critic_values(exact, RunConfig(), torch.Generator().manual_seed(0)) is exact
    err = critic_values(exact, RunConfig(critic_noise=0.3, critic_bias=-0.1), torch.Generator().manual_seed(0)) - exact
    assert abs(float(err.mean()) + 0.1) < 0.003 and abs(float(err.std()) - 0.3) < 0.003
    shifted = critic_values(exact, RunConfig(critic_bias=0.2), torch.Generator()) - exact
    assert torch.allclose(shifted, torch.full_like(exact, 0.2))
    p = trap_problem([0, 1])
    exact_run = run(p, get_algorithm("ppo"), mode="exact", policy="per_turn", cfg=RunConfig(iterations=3, lr=10.0))
    biased = run(p, get_algorithm("ppo"), mode="exact", policy="per_turn",
                 cfg=RunConfig(iterations=3, lr=10.0, critic_bias=0.5))
    assert not torch.allclose(exact_run.theta, biased.theta)


def test_outcome_only_turn_estimators_are_grpo_in_the_lab():
    """The lab's reward is the outcome alone: MT-GRPO's turn part is 0 and every turn's reward-to-go
    is the outcome, so mt-grpo and grpo-togo take GRPO's steps exactly (same schedule and loss)."""
    p = separated_problem(TreeShape(3, 2, 2), 2, [3, 4])
    for mode in ("exact", "sampled"):
        cfg = RunConfig(iterations=4, lr=10.0, epochs=2, minibatches=1)
        base = run(p, get_algorithm("grpo"), mode=mode, policy="per_turn", cfg=cfg, seed=5)
        for name in ("mt-grpo", "grpo-togo"):
            r = run(p, get_algorithm(name), mode=mode, policy="per_turn", cfg=cfg, seed=5)
            assert torch.allclose(r.theta, base.theta, atol=1e-12), (name, mode)
        assert not torch.allclose(base.theta, base.theta_init)


def _per_turn(p, ep):
    return p.turn_rewards().gather(2, ep.unsqueeze(-1).expand(-1, -1, -1, p.shape.turns))


def _brute_values(p, s, task):
    """V(s_t) of every trajectory and turn under the initial per-turn policy, by summing over the
    trajectories that share the turn's prefix (a loop, not the lab's index arithmetic)."""
    shape = p.shape
    theta = 0.3 * torch.randn(p.n_seeds, p.n_tasks, shape.keys("per_turn")[1], shape.vocab,
                              generator=torch.Generator().manual_seed(17), dtype=torch.float64)
    keys, _ = shape.keys("per_turn")
    prob = torch.log_softmax(theta, -1)[s, task][keys, shape.tokens].sum(-1).exp()
    R = p.rewards[s, task]
    toks = shape.tokens.tolist()
    V = torch.zeros(shape.n_traj, shape.turns, dtype=torch.float64)
    for k in range(shape.n_traj):
        for t in range(shape.turns):
            a = shape.turn_start(t)
            same = [j for j in range(shape.n_traj) if toks[j][:a] == toks[k][:a]]
            V[k, t] = sum(prob[j] * R[j] for j in same) / sum(prob[j] for j in same)
    return prob, R, V


def test_exact_gigpo_is_the_episode_advantage_plus_the_discounted_value_gap():
    """Exact GiGPO on outcome rewards: ``A_t = (R - E[R]) + omega * gamma^(T-1-t) * (R - V(s_t))``
    (the step group of a turn is every trajectory through its start node, norm "none"), checked
    on the first iteration's per-row advantages against a brute-force value computation."""
    from seeupo.lab import runner

    p = separated_problem(TreeShape(2, 2, 2), 2, [8])
    prob, R, V = _brute_values(p, 0, 1)
    algo = get_algorithm("gigpo")
    ep = torch.arange(p.shape.n_traj).expand(1, p.n_tasks, -1)
    theta = 0.3 * torch.randn(1, p.n_tasks, p.shape.keys("per_turn")[1], p.shape.vocab,
                              generator=torch.Generator().manual_seed(17), dtype=torch.float64)
    keys, _ = p.shape.keys("per_turn")
    w = torch.log_softmax(theta, -1)[:, :, keys, p.shape.tokens].sum(-1).exp()
    got = runner._turn_estimates(algo, p.shape, _per_turn(p, ep), ep, w, mode="exact", norm="none")[0, 1]
    T = p.shape.turns
    want = torch.stack([(R - (prob * R).sum()) + algo.params["gamma"] ** (T - 1 - t) * (R - V[:, t]) for t in range(T)], -1)
    assert torch.allclose(got, want, atol=1e-12)


def test_turn_ppo_with_an_exact_critic_gives_the_value_steps_per_turn():
    """Turn-PPO in the lab: GAE over turns with lam 0 and the exact critic gives turn t
    ``V(s_{t+1}) - V(s_t)`` and the last turn ``R - V(s_{T-1})`` (brute-force values); with lam 1
    every turn gets the Monte-Carlo ``R - V(s_t)``. Run end to end, it improves monotonically."""
    from seeupo.lab import runner

    p = separated_problem(TreeShape(2, 2, 2), 2, [8])
    prob, R, V = _brute_values(p, 0, 1)
    theta = 0.3 * torch.randn(1, p.n_tasks, p.shape.keys("per_turn")[1], p.shape.vocab,
                              generator=torch.Generator().manual_seed(17), dtype=torch.float64)
    keys, _ = p.shape.keys("per_turn")
    p_old = torch.log_softmax(theta, -1)[:, :, keys, p.shape.tokens].sum(-1).exp()
    values = runner._exact_values(p_old, p.rewards, p.shape.tree_node)
    ep = torch.arange(p.shape.n_traj).expand(1, p.n_tasks, -1)
    n = p.shape.n_traj
    lam0 = runner._turn_critic_advantages(p.shape, values, _per_turn(p, ep), ep, 0.0)[n:]  # task 1
    lam1 = runner._turn_critic_advantages(p.shape, values, _per_turn(p, ep), ep, 1.0)[n:]
    assert torch.allclose(lam0, torch.stack([V[:, 1] - V[:, 0], R - V[:, 1]], -1), atol=1e-12)
    assert torch.allclose(lam1, torch.stack([R - V[:, 0], R - V[:, 1]], -1), atol=1e-12)
    q = separated_problem(TreeShape(3, 2, 2), 2, [1, 2])
    tppo = run(q, get_algorithm("turn-ppo"), mode="exact", policy="per_turn",
               cfg=RunConfig(iterations=30, lr=10.0, epochs=2, minibatches=1), seed=3)
    assert (tppo.returns.diff(dim=-1) >= -1e-9).all() and (tppo.returns[:, -1] > tppo.returns[:, 0]).all()


def test_turn_level_estimators_see_the_shaping_reward_on_its_turn():
    """The shaping break earns part of the return on turn 1 (Problem.step_rewards). Reward-to-go
    leaves it out of turn 2's advantage; Turn-PPO's value to go subtracts it from turn 2's state
    value: with lam 0 turn 2 gets ``r_2 - (V(s_2) - r_1)``, brute-force values."""
    from seeupo.lab import runner
    from seeupo.lab.problems import broken_trap_problem

    p = broken_trap_problem([0], "shaping", 1.0)
    assert torch.allclose(p.step_rewards.sum(-1), p.rewards)
    assert float(p.step_rewards[..., 0].abs().max()) > 0.05
    ep = torch.arange(p.shape.n_traj).expand(1, p.n_tasks, -1)
    keys, _ = p.shape.keys("per_turn")
    w = torch.full((1, p.n_tasks, p.shape.n_traj), 1.0 / p.shape.n_traj, dtype=torch.float64)  # uniform policy
    togo = runner._turn_estimates(get_algorithm("grpo-togo"), p.shape, _per_turn(p, ep), ep, w, mode="exact",
                                  norm="none")
    last = p.step_rewards[..., 1]
    assert torch.allclose(togo[..., 1], last - last.mean(-1, keepdim=True), atol=1e-12)
    values = runner._exact_values(w, p.rewards, p.shape.tree_node)
    adv = runner._turn_critic_advantages(p.shape, values, _per_turn(p, ep), ep, 0.0).view(p.n_tasks, -1, 2)
    toks = p.shape.tokens.tolist()
    a = p.shape.turn_start(1)
    for task in range(p.n_tasks):
        for k in range(0, p.shape.n_traj, 5):
            same = [j for j in range(p.shape.n_traj) if toks[j][:a] == toks[k][:a]]
            v_total = sum(float(p.rewards[0, task, j]) for j in same) / len(same)
            r1, r2 = (float(x) for x in p.step_rewards[0, task, k])
            assert float(adv[task, k, 1]) == pytest.approx(r2 - (v_total - r1), abs=1e-12)


def test_turn_level_estimators_group_a_turn_among_the_episodes_that_played_it():
    """Variable length (trap-length@1): an episode that ended after turn 1 has its outcome on turn 1,
    no turn-2 advantage, and is left out of turn 2's groups (the trainer's rule); Turn-PPO treats the
    turn after its last played one as terminal."""
    from seeupo.lab import runner
    from seeupo.lab.problems import broken_trap_problem

    p = broken_trap_problem([0], "length", 1.0)
    played = p.active
    assert bool((~played[..., 1]).any()) and bool(played[..., 1].any())
    R = p.turn_rewards()
    assert torch.equal(R.sum(-1), p.rewards) and bool((R[..., 1][~played[..., 1]] == 0).all())
    ep = torch.arange(p.shape.n_traj).expand(1, p.n_tasks, -1)
    w = torch.full((1, p.n_tasks, p.shape.n_traj), 1.0 / p.shape.n_traj, dtype=torch.float64)
    togo = runner._turn_estimates(get_algorithm("grpo-togo"), p.shape, _per_turn(p, ep), ep, w, mode="exact",
                                  norm="none", played=played)
    for task in range(p.n_tasks):
        on = played[0, task, :, 1]
        g2 = p.rewards[0, task][on]
        assert torch.allclose(togo[0, task, on, 1], g2 - g2.mean(), atol=1e-12)
        assert bool((togo[0, task, ~on, 1] == 0).all())
        assert torch.allclose(togo[0, task, :, 0], p.rewards[0, task] - p.rewards[0, task].mean(), atol=1e-12)
    values = runner._exact_values(w, p.rewards, p.shape.tree_node)
    adv = runner._turn_critic_advantages(p.shape, values, _per_turn(p, ep), ep, 1.0, played).view(p.n_tasks, -1, 2)
    V0 = values[0].gather(1, runner._turn_nodes(p.shape)[:, 0].expand(p.n_tasks, -1))
    assert torch.allclose(adv[..., 0], p.rewards[0] - V0, atol=1e-12)  # lam 1: Monte-Carlo from turn 1
    assert bool((adv[..., 1][~played[0, :, :, 1]] == 0).all())
