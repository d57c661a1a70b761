import pytest
import torch

from seeupo.core.algorithms import ALGORITHMS, get_algorithm
from seeupo.lab.problems import TreeShape, iid_problem, separated_problem, trap_problem
from seeupo.lab.runner import RunConfig, run


def expected_return(theta, problem, policy):
    keys, _ = problem.shape.keys(policy)
    lp = torch.log_softmax(theta, -1)[:, :, keys, problem.shape.tokens]
    return (lp.sum(-1).exp() * problem.rewards).sum(-1).mean(-1)


def test_tree_enumeration_probabilities_sum_to_one():
    shape = TreeShape(turns=2, tokens_per_turn=2, vocab=3)
    p = iid_problem(shape, 2, [0])
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
