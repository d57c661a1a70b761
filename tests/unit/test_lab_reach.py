"""The lab's bandit-breaking instances and its exact improvement step, against independent
computations: a recursive expectimax, the KL step's closed form, a grid search of the clipped
surrogate, and the performance-difference argument (no drop under an exact per-state maximiser)."""


import pytest
import torch

from seeupo.core.algorithms import get_algorithm
from seeupo.lab.problems import TreeShape, broken_trap_problem, iid_problem, trap_problem
from seeupo.lab.runner import RunConfig, run


def _expectimax(problem, s, task, probs):
    """Best expected return of one task by recursion over prefixes (max at policy positions,
    expectation at chance positions), written from the tree's definition, not from its tensors."""
    shape = problem.shape
    env = set(shape.env_cols.tolist())
    V, H = shape.vocab, shape.horizon

    def value(prefix):
        if len(prefix) == H:
            k = sum(tok * V ** (H - 1 - i) for i, tok in enumerate(prefix))
            return float(problem.rewards[s, task, k])
        kids = [value(prefix + (v,)) for v in range(V)]
        return sum(p * x for p, x in zip(probs, kids)) if len(prefix) in env else max(kids)

    return value(())


@pytest.mark.parametrize("kind,level", [("tool", 0.3), ("tool", 0.0), ("noise", 0.5), ("shaping", 0.5)])
def test_the_optimum_with_chance_nodes_is_the_expectimax(kind, level):
    p = broken_trap_problem([0, 1, 2], kind, level)
    probs = p.chance_probs.tolist() if p.chance_probs is not None else []
    want = [sum(_expectimax(p, s, t, probs) for t in range(p.n_tasks)) / p.n_tasks for s in range(p.n_seeds)]
    assert p.optimum.tolist() == pytest.approx(want, abs=1e-12)


def test_a_failing_tool_spoils_only_the_paths_that_need_it_and_the_optimum_follows():
    clean, fail = trap_problem([4]), broken_trap_problem([4], "tool", 0.3)
    assert fail.optimum.item() < clean.optimum.item() - 0.05  # the deep paths lose 30% of their value
    assert broken_trap_problem([4], "tool", 0.0).optimum.item() == pytest.approx(clean.optimum.item())
    shape = fail.shape
    ok = shape.chance_code(0) == 0
    base_idx = shape.turn_code(0) * 4 + shape.turn_code(1)
    assert torch.equal(fail.rewards[..., ok], clean.rewards[..., base_idx[ok]])  # the tool answered: unchanged


def test_variable_length_drops_the_second_turn_exactly_where_the_reward_ignores_it():
    p = broken_trap_problem([0, 1], "length", 1.0)
    r = p.rewards.view(2, 2, 4, 4)
    ignores = (r.max(-1).values == r.min(-1).values)[:, :, p.shape.turn_code(0)]
    assert torch.equal(p.active[..., 1], ~ignores) and bool(p.active[..., 0].all())
    assert bool(ignores.any()) and not bool(ignores.all())


def test_environment_logits_stay_fixed_and_later_turns_see_the_chance_token():
    p = broken_trap_problem([0, 1], "tool", 0.25)
    res = run(p, get_algorithm("grpo"), mode="sampled", policy="per_turn", cfg=RunConfig(iterations=3, lr=10.0))
    want = torch.tensor([0.75, 0.25], dtype=torch.float64).log()
    assert torch.allclose(torch.log_softmax(res.theta[:, :, -1], -1), want.expand(2, 2, 2))
    keys, n = p.shape.keys("per_turn")
    first_turn2 = p.shape.turn_start(1)
    c = p.shape.chance_code(0)
    same_history = (p.shape.turn_code(0) == 0) & (p.shape.turn_code(1) == 0)
    assert keys[same_history & (c == 0), first_turn2].item() != keys[same_history & (c == 1), first_turn2].item()


def _response_probs(theta, shape, keys):
    """``[S, tasks, V**L]`` the single-turn response distribution the tables give (T=1)."""
    logp = torch.log_softmax(theta, -1)[:, :, keys, shape.tokens].sum(-1)
    return logp.exp()


def test_the_kl_step_is_the_closed_form_pi_old_exp_adv_over_beta():
    shape = TreeShape(turns=1, tokens_per_turn=2, vocab=3)
    p = iid_problem(shape, 2, [3, 4])
    keys, _ = shape.keys("per_turn")
    beta = 0.07
    res = run(p, get_algorithm("grpo"), mode="exact", policy="per_turn",
              cfg=RunConfig(iterations=1, step="kl", beta=beta, norm="none", init_std=1.0))
    old = _response_probs(res.theta_init, shape, keys)
    adv = p.rewards - (old * p.rewards).sum(-1, keepdim=True)
    want = old * torch.exp(adv / beta)
    want = want / want.sum(-1, keepdim=True)
    assert torch.allclose(_response_probs(res.theta, shape, keys), want, atol=1e-10)


def test_the_clip_step_maximises_the_clipped_surrogate_over_a_grid():
    # two turns, one token each, three actions: each first action has three returns behind it, so the
    # clipped objective of turn 1 mixes positive and negative advantages (slopes P+, P+ + N-, N-)
    shape = TreeShape(turns=2, tokens_per_turn=1, vocab=3)
    p = iid_problem(shape, 1, [11])
    eps = 0.2
    res = run(p, get_algorithm("grpo"), mode="exact", policy="per_turn",
              cfg=RunConfig(iterations=1, step="clip", step_clip=eps, norm="none", init_std=1.0))
    pi_old = torch.softmax(res.theta_init[0, 0, 0], -1)
    pi_new = torch.softmax(res.theta[0, 0, 0], -1)
    tl = torch.log_softmax(res.theta_init[0, 0], -1)[shape.tree_node, shape.tokens].sum(-1).exp()
    a1 = shape.turn_code(0)
    adv = p.rewards[0, 0] - (tl * p.rewards[0, 0]).sum()

    def objective(r):  # r: [..., 3] ratios of the three first actions
        ra = r[..., a1]
        return (tl * torch.minimum(ra * adv, ra.clamp(1 - eps, 1 + eps) * adv)).sum(-1)

    got = objective(pi_new / pi_old)
    grid = torch.linspace(0, 1 / float(pi_old[0]), 601, dtype=torch.float64)
    r0, r1 = torch.meshgrid(grid, torch.linspace(0, 1 / float(pi_old[1]), 601, dtype=torch.float64), indexing="ij")
    r2 = (1 - pi_old[0] * r0 - pi_old[1] * r1) / pi_old[2]
    ok = r2 >= 0
    best = objective(torch.stack([r0[ok], r1[ok], r2[ok]], -1)).max()
    assert float(got) >= float(best) - 1e-12  # nothing on the grid beats the exact maximiser
    assert float(got) <= float(best) + 2e-3  # and the grid comes close to it (resolution)
    assert float(got) > 0  # a strict improvement of the surrogate over r = 1


@pytest.mark.parametrize("step", ["kl", "clip"])
def test_an_exact_per_state_step_never_lowers_the_exact_return(step):
    """The performance-difference argument (docs/lab.md): an exact per-state maximiser only moves
    probability towards responses with a larger E[A | s, a], and GRAE's Delta(s_t) shifts all of a
    state's responses alike, so no iteration may lower the exact expected return."""
    shape = TreeShape(turns=3, tokens_per_turn=1, vocab=3)
    p = iid_problem(shape, 2, list(range(30)))
    for algo in ("grpo", "seeupo", "seeupo-natural"):
        res = run(p, get_algorithm(algo), mode="exact", policy="per_turn",
                  cfg=RunConfig(iterations=12, step=step, beta=0.05, norm="none", init_std=1.0))
        assert float(res.returns.diff(dim=-1).min()) > -1e-12, (algo, step)
        assert float((res.returns[:, -1] - res.returns[:, 0]).min()) > 0
    # two tokens a turn: the argument holds for SeeUPO with the full factor (the later turns' new policy)
    p2 = iid_problem(TreeShape(turns=2, tokens_per_turn=2, vocab=2), 2, list(range(30)))
    res = run(p2, get_algorithm("seeupo"), mode="exact", policy="per_turn",
              cfg=RunConfig(iterations=12, step=step, beta=0.05, norm="none", init_std=1.0, factor_ratio="full"))
    assert float(res.returns.diff(dim=-1).min()) > -1e-12


def test_grae_and_the_exact_critic_take_the_same_kl_step():
    """The KL step depends on a state's advantages only up to a constant, so GRAE's Delta(s_t) cancels:
    with the same scale (no normalisation), GRPO and PPO with an exact critic coincide."""
    p = broken_trap_problem(list(range(4)), "shaping", 0.5)
    kw = dict(mode="exact", policy="per_turn")
    g = run(p, get_algorithm("grpo"), cfg=RunConfig(iterations=5, step="kl", norm="none"), **kw)
    c = run(p, get_algorithm("ppo"), cfg=RunConfig(iterations=5, step="kl"), **kw)
    assert torch.allclose(g.returns, c.returns, atol=1e-12)


def test_the_exact_step_refuses_what_it_cannot_solve():
    p = trap_problem([0])
    with pytest.raises(ValueError, match="per_turn"):
        run(p, get_algorithm("grpo"), mode="exact", policy="shared", cfg=RunConfig(iterations=1, step="kl"))
    with pytest.raises(ValueError, match="exact"):
        run(p, get_algorithm("grpo"), mode="sampled", policy="per_turn", cfg=RunConfig(iterations=1, step="clip"))
    with pytest.raises(ValueError, match="unknown break"):
        broken_trap_problem([0], "rain", 0.1)


def test_an_unplayed_turn_gets_no_update_in_sampled_training():
    kw = dict(mode="sampled", policy="per_turn", cfg=RunConfig(iterations=4, lr=10.0, norm="none"))
    fixed, variable = (broken_trap_problem([0, 1], "length", lv) for lv in (0.0, 1.0))
    keys, _ = fixed.shape.keys("per_turn")
    unplayed = ~variable.active[..., 1]  # [S, tasks, n_traj]
    for problem, moves in ((fixed, True), (variable, False)):
        res = run(problem, get_algorithm("grpo"), **kw)
        delta = (res.theta - res.theta_init).abs().sum(-1)  # [S, tasks, keys]
        rows = keys[:, fixed.shape.turn_start(1):]  # [n_traj, L]
        moved = torch.stack([delta[s, t][rows[unplayed[s, t]].flatten()].sum() for s in range(2) for t in range(2)])
        assert bool((moved > 0).any()) == moves
