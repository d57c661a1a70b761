"""Run one algorithm on a batch of tabular problems, exactly or by sampling.

Every algorithm is assembled from ``seeupo.core``: the advantage estimator, the policy loss and the
turn schedule come from its declaration in ``core.algorithms``. Seeds run side by side (one
parameter table per seed); nothing couples them.

How the lab departs from the LLM trainer, on purpose:

- ``exact`` mode replaces sampling by enumeration: every trajectory is a row weighted by its
  probability under the sampling policy, group statistics are exact expectations, and the
  leave-one-out baseline becomes the group mean (its limit for infinite groups).
- Rows are turn rows (one per episode and turn) for every algorithm; the loss of a phase is the
  sum over its rows of ``weight * row loss`` where an episode's weights sum to one per task
  (``denom=1``), so each task's table gets the gradient of its own expected objective. For SeeUPO
  this equals the row mean of SPEC §3 (every episode reaches every turn here); joint algorithms sum
  their T turn rows per episode instead of averaging them (a factor T on their step size).
- PPO's critic is exact (the value of the sampling policy at every tree node) and GAE uses
  ``lam = 0`` by default, so its advantage is exactly ``Q - V`` per token.
- Optimisation is plain gradient descent on full batches. The schedule is the algorithm's
  declaration (``core.algorithms``) with the fields ``RunConfig`` sets; a phase takes ``epochs x
  minibatches`` full-batch steps (a "minibatch" is a step on the whole exact or sampled batch, so
  exact mode stays exact), ``minibatches="turns"`` meaning ``T``.
- SeeUPO's factor follows the trainer's rule (``core.carries_factor``): only sequential
  algorithms carry it, with the turn weight ``factor_ratio`` and the clamp ``factor_clip``.
- Chance nodes (``TreeShape.chance``) are the environment's tokens: enumerated like the policy's,
  left out of every row, with fixed logits. A turn an episode does not play (``Problem.active``)
  has weight 0 in the loss and a factor weight of 1.

The exact improvement step (``RunConfig.step = "kl"`` or ``"clip"``, exact mode, per-turn tables)
replaces the gradient steps of a phase by the surrogate's maximiser, computed per state at the
level of whole responses ``a`` (the tree of per-turn tables represents any response distribution):

- ``"kl"``: ``max_pi sum_a pi(a|s) Q(s,a) - beta KL(pi(.|s) || pi_old(.|s))`` with
  ``Q(s,a) = E_old[factor x A | s, a]``; its maximiser is ``pi_old(a|s) exp(Q(s,a) / beta)``,
  normalised. A constant added to ``Q(s, .)`` (the ``Delta(s_t)`` of GRAE's task baseline) cancels.
- ``"clip"``: ``max_r sum_tau p_old(tau) factor(tau) min(r A, clip(r, 1-eps, 1+eps) A)`` over the
  ratios ``r_a = pi(a|s) / pi_old(a|s)`` with ``sum_a pi_old(a|s) r_a = 1``. Each action's term is
  concave and piecewise linear in ``r_a`` (slopes ``P+``, ``P+ + N-``, ``N-`` with breaks at
  ``1 -+ eps``), so the maximiser is exact by filling the linear pieces in order of slope per unit of
  probability (a continuous knapsack); ties are broken by action index.

``step="gradient"`` (default) is the gradient descent above.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from seeupo.core.advantages import gae, grae, reward_to_go, turn_gae
from seeupo.core.algorithms import Algorithm, Schedule, carries_factor
from seeupo.core.estimators import Turns, estimate, mt_grpo_turns, names
from seeupo.core.losses import get_policy_loss
from seeupo.core.schedule import factor_log_ratio, turn_order, update_factor
from seeupo.lab.problems import Problem

MODES = ("exact", "sampled")
STEPS = ("gradient", "kl", "clip")
ADVANTAGES = ("returns", "q")  # exact-step GRAE: the episode's return, or its mean given (s_t, a_t)
# Every loss is length-normalised except REINFORCE's token sum; see ``effective_lr``.
AGG = {"clip_token": "seq_mean", "reinforce": "seq_sum", "clip_sequence": None}


@dataclass(frozen=True)
class RunConfig:
    iterations: int = 200
    lr: float = 1.0
    epochs: int | None = None  # None: the algorithm's schedule
    minibatches: int | str | None = None  # full-batch steps per pass, or "turns" (T); None: the schedule's
    clip_eps: float | None = None  # None: the schedule's
    clip_eps_high: float | None = None  # None: the schedule's (or symmetric)
    group_size: int = 8  # episodes per task in sampled mode
    gae_lambda: float = 0.0
    init_std: float = 0.3  # std of the initial logits
    norm: str | None = None  # None: the algorithm's default
    match_step: bool = False  # rescale lr so that every algorithm's first-order step is REINFORCE's
    factor_ratio: str = "geometric"  # SeeUPO's turn weight: geometric | full | off (core.factor_log_ratio)
    factor_clip: tuple[float, float] | None = None  # clamp of each weight and of the product
    order: str | None = None  # turn order override (None: the algorithm's); a joint algorithm gets no factor
    step: str = "gradient"  # gradient | kl | clip: a phase's surrogate solved exactly (module docstring)
    beta: float = 0.1  # the KL coefficient of step="kl"
    step_clip: float = 0.2  # the clip range of step="clip" (on the response's ratio, every algorithm)
    advantage: str = "returns"  # exact step, GRAE: "q" replaces each return by E[R | s_t, a_t] (Delta only)
    # PPO's critic with a controlled error (issue 34, the seed's two limits on one axis): every tree
    # node's exact value plus ``critic_bias`` plus Gaussian noise of std ``critic_noise``, drawn afresh
    # each iteration (one draw per node, so a state keeps one estimate within an iteration) from a
    # generator of its own, so the sampled episodes and turn orders stay the exact-critic run's
    critic_noise: float = 0.0
    critic_bias: float = 0.0


def schedule(algo: Algorithm, cfg: RunConfig) -> Schedule:
    """The algorithm's declared schedule with the fields ``cfg`` sets."""
    over = {k: getattr(cfg, k) for k in ("epochs", "minibatches", "clip_eps", "clip_eps_high")}
    return replace(algo.schedule, **{k: v for k, v in over.items() if v is not None})


@dataclass
class RunResult:
    returns: torch.Tensor  # [S, iterations + 1] exact expected return, before and after each iteration
    theta_init: torch.Tensor  # [S, tasks, keys, V] initial logits
    theta: torch.Tensor  # final logits
    steps_per_iteration: int
    schedule: dict  # the effective schedule (Schedule.as_dict)
    lr: float
    diagnostics: dict = field(default_factory=dict)


def effective_lr(algo: Algorithm, cfg: RunConfig, tokens_per_turn: int, turns: int = 1) -> float:
    """The step size used: ``cfg.lr``, or with ``match_step`` rescaled by ``L / steps per phase``
    for length-normalised multi-step losses so that one iteration's first-order move equals one
    REINFORCE step."""
    if not cfg.match_step or algo.loss == "reinforce":
        return cfg.lr
    sched = schedule(algo, cfg)
    return cfg.lr * tokens_per_turn / (sched.epochs * sched.steps_per_pass(turns))


def run(problem: Problem, algo: Algorithm, *, mode: str, policy: str, cfg: RunConfig, seed: int = 0) -> RunResult:
    """``cfg.iterations`` iterations of ``algo`` on ``problem`` with ``policy``'s tables (``per_turn`` or
    ``shared``), each: the episodes under the sampling tables (enumerated or sampled), their
    advantages, the phases. Returns the exact expected return before and after every iteration."""
    _check(algo, mode=mode, policy=policy, cfg=cfg)
    lab = _Lab(problem, policy)
    gen = torch.Generator().manual_seed(seed)
    critic_gen = torch.Generator().manual_seed(seed + 7_919)  # the critic's error: its own stream, so the
    # episodes sampled and the turn orders drawn are the exact-critic run's
    theta_init = _initial_logits(problem, lab.n_keys, cfg, gen)
    theta = theta_init.clone().requires_grad_()
    sched = schedule(algo, cfg)
    lr = effective_lr(algo, cfg, lab.L, lab.T)
    returns = [lab.expected_return(theta)]
    steps, clipfracs = 0, []  # clipfracs: one mean per iteration
    for _ in range(cfg.iterations):
        batch = _episodes(lab, theta, mode, cfg, gen)  # 1. rollout (or enumeration) under the sampling policy pi_k
        adv_rows = _advantages(lab, batch, algo, cfg, mode, critic_gen)  # 2. advantages (core estimators)
        iteration_clip = _phases(lab, theta, batch, adv_rows, algo, cfg, sched, lr, gen)  # 3. the phases
        steps += len(iteration_clip)
        returns.append(lab.expected_return(theta))
        clipfracs.append(sum(iteration_clip) / len(iteration_clip))
    early = clipfracs[: max(1, len(clipfracs) // 10)]
    return RunResult(
        returns=torch.stack(returns, -1),
        theta_init=theta_init,
        theta=theta.detach(),
        steps_per_iteration=steps // max(cfg.iterations, 1),
        schedule=sched.as_dict(),
        lr=lr,
        diagnostics={"clipfrac_mean": sum(clipfracs) / max(len(clipfracs), 1),
                     "clipfrac_first_tenth": sum(early) / max(len(early), 1)},
    )


def _check(algo: Algorithm, *, mode: str, policy: str, cfg: RunConfig) -> None:
    """A run's mode, step and advantage that cannot work, refused with the valid choices."""
    if mode not in MODES:
        raise ValueError(f"unknown lab mode {mode!r}; valid names: {', '.join(MODES)}")
    if cfg.step not in STEPS or cfg.advantage not in ADVANTAGES:
        raise ValueError(f"unknown lab step {cfg.step!r} or advantage {cfg.advantage!r}; valid: "
                         f"{', '.join(STEPS)}; {', '.join(ADVANTAGES)}")
    if cfg.step != "gradient" and (mode != "exact" or policy != "per_turn"):
        raise ValueError(f"step={cfg.step!r} solves each state's surrogate exactly: it needs mode='exact' "
                         "and policy='per_turn' (a shared table cannot take a per-state maximiser)")
    if cfg.advantage == "q" and algo.estimator != "grae":
        raise ValueError(f"advantage='q' replaces GRAE's return by its mean given (s_t, a_t); {algo.name}'s "
                         f"estimator is {algo.estimator}")


class _Lab:
    """A run's fixed tables: the problem's shape, rewards and played turns, and where the policy's
    tokens sit in the logit tables ``theta`` ``[S, tasks, keys, V]`` (``keys`` ``[n_traj, H]``: the
    row of each position, ``tokens``: its token)."""

    def __init__(self, problem: Problem, policy: str):
        shape = self.shape = problem.shape
        self.problem = problem
        self.S, self.n_tasks, self.T, self.L, self.H = (problem.n_seeds, problem.n_tasks, shape.turns,
                                                        shape.tokens_per_turn, shape.horizon)
        self.keys, self.n_keys = shape.keys(policy)
        self.tokens, self.pcols = shape.tokens, shape.policy_cols
        self.keys_p, self.tokens_p = self.keys[:, self.pcols], self.tokens[:, self.pcols]  # [n_traj, T * L] the policy's positions only
        self.R = problem.rewards
        self.active = (problem.active if problem.active is not None
                       else torch.ones(self.S, self.n_tasks, shape.n_traj, self.T, dtype=torch.bool))
        self.turn_R = problem.turn_rewards()  # [S, tasks, n_traj, T]

    def token_logp(self, th):  # [S, tasks, n_traj, H]
        return torch.log_softmax(th, -1)[:, :, self.keys, self.tokens]

    def policy_rows(self, th, ep_TL):  # [N * T, L] the policy's tokens of the enumerated/sampled episodes
        return torch.log_softmax(th, -1)[:, :, self.keys_p, self.tokens_p].gather(2, ep_TL).reshape(-1, self.L)

    def expected_return(self, th):
        with torch.no_grad():
            return (self.token_logp(th).sum(-1).exp() * self.R).sum(-1).mean(-1)

    def per_turn(self, table, ep):  # [S, tasks, E, T] a per-trajectory, per-turn table of the episodes
        return table.gather(2, ep.unsqueeze(-1).expand(-1, -1, -1, self.T))


def _initial_logits(problem: Problem, n_keys: int, cfg: RunConfig, gen: torch.Generator) -> torch.Tensor:
    """``[S, tasks, keys, V]`` the initial tables (``init_std`` Gaussian logits); with chance nodes one
    more row, the environment's fixed logits (no row loss reaches it)."""
    shape, S, n_tasks = problem.shape, problem.n_seeds, problem.n_tasks
    theta_init = cfg.init_std * torch.randn(S, n_tasks, n_keys, shape.vocab, generator=gen, dtype=torch.float64)
    if shape.chance:
        env = problem.chance_probs.clamp_min(1e-300).log().expand(S, n_tasks, 1, -1)
        theta_init = torch.cat([theta_init, env], 2)
    return theta_init


@dataclass
class _Batch:
    """One iteration's episodes ``ep`` ``[S, tasks, E]`` (trajectory indices) under the sampling tables
    (``p_old`` ``[S, tasks, n_traj]``), weighted ``w`` (their probability in exact mode, ``1 / G``
    sampled), and their rows: one per episode and turn, ``N * T`` (episode-major)."""
    ep: torch.Tensor
    w: torch.Tensor
    p_old: torch.Tensor
    ep_TL: torch.Tensor  # [S, tasks, E, T * L] the episodes' indices at the policy's positions
    old_rows: torch.Tensor  # [N * T, L] the sampling log-probs
    rewards: torch.Tensor  # [S, tasks, E]
    played: torch.Tensor  # [N * T] the rows of turns the episodes played
    w_rows: torch.Tensor  # [N * T] each row's weight (0: a turn not played)
    row_ep: torch.Tensor  # [N * T] each row's episode
    row_turn: torch.Tensor  # [N * T] each row's turn


def _episodes(lab: _Lab, theta: torch.Tensor, mode: str, cfg: RunConfig, gen: torch.Generator) -> _Batch:
    """The episodes of one iteration under the current tables: every trajectory (exact) or
    ``cfg.group_size`` draws per task (sampled)."""
    S, n_tasks, T, L = lab.S, lab.n_tasks, lab.T, lab.L
    with torch.no_grad():
        tl_old = lab.token_logp(theta)
        p_old = tl_old.sum(-1).exp()  # [S, tasks, n_traj]
    if mode == "exact":
        ep = torch.arange(lab.shape.n_traj).expand(S, n_tasks, -1)
        w = p_old
    else:
        ep = torch.multinomial(p_old.flatten(0, 1), cfg.group_size, replacement=True,
                               generator=gen).view(S, n_tasks, -1)
        w = torch.full(ep.shape, 1.0 / cfg.group_size, dtype=torch.float64)
    N = S * n_tasks * ep.shape[-1]
    ep_TL = ep.unsqueeze(-1).expand(-1, -1, -1, T * L)
    old_rows = tl_old[..., lab.pcols].gather(2, ep_TL).reshape(N * T, L)
    played = lab.per_turn(lab.active, ep).reshape(N * T)
    w_rows = w.reshape(N).repeat_interleave(T) * played
    return _Batch(ep, w, p_old, ep_TL, old_rows, lab.R.gather(2, ep), played, w_rows,
                  torch.arange(N).repeat_interleave(T), torch.arange(T).repeat(N))


def _advantages(lab: _Lab, b: _Batch, algo: Algorithm, cfg: RunConfig, mode: str,
                critic_gen: torch.Generator) -> torch.Tensor:
    """Each row's advantage by the algorithm's estimator (``seeupo.core``): ``[N * T, L]`` per token
    (PPO's GAE), else ``[N * T]``."""
    shape, p_old, R, ep = lab.shape, b.p_old, lab.R, b.ep
    S, n_tasks, T, H = lab.S, lab.n_tasks, lab.T, lab.H
    E = ep.shape[-1]
    N = S * n_tasks * E
    norm = cfg.norm or algo.norm
    if algo.estimator == "gae":
        values = critic_values(_exact_values(p_old, R, shape.tree_node), cfg, critic_gen).gather(
            2, shape.tree_node[ep].reshape(S, n_tasks, E * H)).view(N, H)
        r_NH = torch.zeros(N, H, dtype=torch.float64)
        r_NH[:, -1] = b.rewards.reshape(N)
        adv_tok, _ = gae(r_NH, values, torch.ones(N, H), gamma=1.0, lam=cfg.gae_lambda)
        return adv_tok[:, lab.pcols].reshape(N * T, lab.L)
    if algo.estimator == "turn_gae":  # Turn-PPO: the critic's value of each turn's state, GAE over turns
        values = critic_values(_exact_values(p_old, R, shape.tree_node), cfg, critic_gen)
        return _turn_critic_advantages(shape, values, lab.per_turn(lab.turn_R, ep), ep, cfg.gae_lambda,
                                       lab.per_turn(lab.active, ep)).reshape(N * T)
    if algo.estimator in names("turn"):
        return _turn_estimates(algo, shape, lab.per_turn(lab.turn_R, ep), ep, b.w, mode=mode, norm=norm,
                               played=lab.per_turn(lab.active, ep)).reshape(N * T)
    task_ids = torch.arange(n_tasks).repeat_interleave(E)
    adv_N = torch.cat([
        grae(b.rewards[s].reshape(-1), task_ids, norm=norm,
             leave_one_out=algo.leave_one_out and mode == "sampled",
             weights_N=b.w[s].reshape(-1) if mode == "exact" else None)
        for s in range(S)])
    return adv_N.repeat_interleave(T)


def _phases(lab: _Lab, theta: torch.Tensor, b: _Batch, adv_rows: torch.Tensor, algo: Algorithm, cfg: RunConfig,
            sched: Schedule, lr: float, gen: torch.Generator) -> list[float]:
    """One iteration's phases in the schedule's order (``core.turn_order``), each a turn's (or a joint
    phase's) steps on ``theta``; SeeUPO carries the factor of updated turns into later phases
    (``core.update_factor``), as ``train.update.sequential_update`` does. Returns each step's clip
    fraction (0 for an exact step)."""
    S, n_tasks, T, E = lab.S, lab.n_tasks, lab.T, b.ep.shape[-1]
    carry = carries_factor(algo, cfg.factor_ratio)
    factor = torch.ones(S * n_tasks * E, dtype=torch.float64)  # M, keyed by episode
    phases = turn_order(range(T), cfg.order or algo.order, rng=gen)
    if cfg.step != "gradient":
        # the critic's per-token Q - V telescopes to the turn's Q(s_t, a_t) - V(s_t)
        adv_T = _exact_step_advantages(lab.problem, b.p_old, adv_rows.view(S, n_tasks, E, T, lab.L).sum(-1)
                                       if algo.estimator == "gae" else adv_rows.view(S, n_tasks, E, T), cfg)
    clip: list[float] = []
    for k, phase in enumerate(phases):
        if cfg.step != "gradient":
            with torch.no_grad():
                for t in phase:
                    _solve_turn(theta, lab.problem, t, b.p_old * lab.active[..., t],
                                (factor.view(S, n_tasks, E) if carry else 1.0) * adv_T[..., t], cfg)
            clip.append(0.0)
        else:
            clip += _gradient_steps(lab, theta, b, adv_rows, phase, factor if carry else None, algo, sched, lr)
        if carry and k + 1 < len(phases):
            factor = _settle_factor(lab, theta, b, phase, factor, cfg)
    return clip


def _gradient_steps(lab: _Lab, theta: torch.Tensor, b: _Batch, adv_rows: torch.Tensor, phase: list[int],
                    factor: torch.Tensor | None, algo: Algorithm, sched: Schedule, lr: float) -> list[float]:
    """A phase's ``epochs x minibatches`` full-batch gradient steps on the rows of its turns (fixed
    through its steps), each row's loss times ``factor`` (None: no factor); returns their clip fractions."""
    loss_fn = get_policy_loss(algo.loss)
    idx = torch.isin(b.row_turn, torch.tensor(phase)).nonzero().squeeze(1)
    mask = torch.ones(len(b.row_turn), lab.L)
    old_p, adv_p, mask_p, w_p = b.old_rows[idx], adv_rows[idx], mask[idx], b.w_rows[idx]
    factor_p = factor[b.row_ep[idx]] if factor is not None else None
    clip = []
    for _ in range(sched.epochs * sched.steps_per_pass(lab.T)):
        new_rows = lab.policy_rows(theta, b.ep_TL)[idx]
        loss, metrics = loss_fn(
            new_rows, old_p, adv_p, mask_p, clip_eps=sched.clip_eps,
            clip_eps_high=sched.clip_eps_high, factor_N=factor_p,
            weights_N=w_p, agg=AGG[algo.loss], denom=1.0)
        (grad,) = torch.autograd.grad(loss, theta)
        with torch.no_grad():
            theta -= lr * grad
        clip.append(float(metrics["clipfrac"]))
    return clip


def _settle_factor(lab: _Lab, theta: torch.Tensor, b: _Batch, phase: list[int], factor: torch.Tensor,
                   cfg: RunConfig) -> torch.Tensor:
    """The factor with the phase's turns multiplied in: each turn's weight (``core.factor_log_ratio``,
    ``cfg.factor_ratio``) of the updated tables against the sampling ones; a turn not played weighs 1."""
    factor_mask = b.played.unsqueeze(-1).expand(-1, lab.L).double()
    with torch.no_grad():
        new_all = lab.policy_rows(theta, b.ep_TL)
        for t in phase:
            rows = b.row_turn == t
            lw = factor_log_ratio(new_all[rows], b.old_rows[rows], factor_mask[rows], cfg.factor_ratio)
            factor = update_factor(factor, b.row_ep[rows], lw, clip=cfg.factor_clip)
    return factor


def _turn_nodes(shape) -> torch.Tensor:
    """``[n_traj, T]`` the tree node at which each turn starts (the state the turn observes)."""
    return shape.tree_node[:, [shape.turn_start(t) for t in range(shape.turns)]]


def _turn_critic_advantages(shape, values: torch.Tensor, step_rewards: torch.Tensor, ep: torch.Tensor,
                            lam: float, played: torch.Tensor | None = None) -> torch.Tensor:
    """``[S * tasks * E, T]`` Turn-PPO's advantages: GAE over the played turns (gamma 1, ``lam``; all
    turns without ``played`` ``[S, tasks, E, T]``) on the episodes' per-turn rewards ``[S, tasks, E,
    T]``. The critic's ``values`` ``[S, tasks, nodes]`` are of the whole return; a turn state's value
    to go is that at the turn's start node minus the rewards already earned (a function of the node);
    the turn after the last played one is terminal."""
    S, n_tasks, E, T = step_rewards.shape
    r_NT = step_rewards.reshape(-1, T)
    mask = torch.ones_like(r_NT) if played is None else played.reshape(-1, T).to(r_NT.dtype)
    earned = r_NT.cumsum(-1) - r_NT  # before each turn
    v_NT = values.gather(2, _turn_nodes(shape)[ep].reshape(S, n_tasks, E * T)).view(-1, T) - earned
    adv_NT, _ = turn_gae(r_NT * mask, v_NT * mask, mask, gamma=1.0, lam=lam)
    return adv_NT


def _turn_estimates(algo: Algorithm, shape, step_rewards: torch.Tensor, ep: torch.Tensor, w: torch.Tensor, *,
                    mode: str, norm: str, played: torch.Tensor | None = None) -> torch.Tensor:
    """``[S, tasks, E, T]`` a critic-free turn-level estimator's advantages from the episodes' per-turn
    rewards ``[S, tasks, E, T]`` (``Problem.turn_rewards``: the outcome on the last turn unless the
    problem earns rewards earlier, as the shaping break does) and the turns they played (``played``
    ``[S, tasks, E, T]``, all by default: a group of a turn holds the episodes that reached it, as in
    the trainer). The anchor state of a turn is
    its tree node (the task and every earlier token), so a step group is the turns that start from
    the same node. Sampled: ``core.estimators.estimate`` per seed. Exact: the same definitions with every
    group mean and std taken over the enumerated trajectories weighted by their probability (the
    limit of infinite groups, as ``grae`` does with ``weights_N``)."""
    S, n_tasks, E, T = step_rewards.shape
    n = n_tasks * E
    task_ids = torch.arange(n_tasks).repeat_interleave(E)
    nodes = _turn_nodes(shape)
    gamma, omega = algo.params.get("gamma", 1.0), algo.params.get("step_weight", 1.0)
    out = []
    for s in range(S):
        step_NT = step_rewards[s].reshape(n, T)
        r_N = step_NT.sum(-1)
        mask_NT = torch.ones(n, T, dtype=torch.long) if played is None else played[s].reshape(n, T).long()
        anchors_NT = nodes[ep[s].reshape(n)]
        if mode == "sampled":
            out.append(estimate(algo.estimator, Turns(r_N, task_ids, step_NT, mask_NT, anchors_NT), norm=norm))
            continue
        w_N = w[s].reshape(n)
        inner = "none" if norm == "batch" else norm

        reached = mask_NT.bool()

        def per_turn(values_NT, keys_NT, among=reached):  # grae over each turn's groups among the episodes
            out_NT = torch.zeros_like(values_NT)                # that reached it (or ``among``), weighted
            for t in range(T):
                sel = among[:, t]
                out_NT[sel, t] = grae(values_NT[sel, t], keys_NT[sel, t], norm=inner, weights_N=w_N[sel])
            return out_NT

        by_task = task_ids[:, None].expand(n, T)
        if algo.estimator == "gigpo":
            g = reward_to_go(step_NT, mask_NT, gamma=gamma)
            a = grae(r_N, task_ids, norm=inner, weights_N=w_N)[:, None] + omega * per_turn(g, by_task * shape.n_tree_nodes
                                                                                          + anchors_NT)
        elif algo.estimator == "turn_grae":
            # the outcome is the episode's return; each turn before an episode's last its own reward as turn
            # reward, compared among the episodes that went on past it (core.estimators.mt_grpo_turns)
            a = grae(r_N, task_ids, norm=inner, weights_N=w_N)[:, None] + omega * per_turn(
                step_NT, by_task, among=mt_grpo_turns(mask_NT).bool())
        else:  # grae_to_go
            a = per_turn(reward_to_go(step_NT, mask_NT), by_task)
        a = torch.where(reached, a, torch.zeros_like(a))
        if norm == "batch":  # standardised over the weighted batch of reached (trajectory, turn) entries
            ww = w_N[:, None].expand(n, T) * reached
            mean = (ww * a).sum() / ww.sum()
            a = torch.where(reached, (a - mean) / (torch.sqrt((ww * (a - mean) ** 2).sum() / ww.sum()) + 1e-6),
                            torch.zeros_like(a))
        out.append(a)
    return torch.stack(out).view(S, n_tasks, E, T)


def critic_values(exact: torch.Tensor, cfg: RunConfig, gen: torch.Generator) -> torch.Tensor:
    """The critic PPO uses: ``exact`` node values, or with ``cfg.critic_noise`` / ``cfg.critic_bias``
    those plus the bias and one Gaussian draw per node (no draw, and the same tensor, when both are 0)."""
    if not (cfg.critic_noise or cfg.critic_bias):
        return exact
    noise = torch.randn(exact.shape, generator=gen, dtype=exact.dtype) if cfg.critic_noise else 0.0
    return exact + cfg.critic_bias + cfg.critic_noise * noise


def _exact_values(p_old: torch.Tensor, R: torch.Tensor, tree_node: torch.Tensor) -> torch.Tensor:
    """``[S, tasks, n_nodes]`` value of every tree node under the sampling policy (exact critic)."""
    S, n_tasks, n_traj = p_old.shape
    H = tree_node.shape[1]
    n_nodes = int(tree_node.max()) + 1
    idx = tree_node.reshape(-1)  # traj-major, like the expand below
    reach = torch.zeros(S, n_tasks, n_nodes, dtype=p_old.dtype).index_add_(
        2, idx, p_old.unsqueeze(-1).expand(-1, -1, -1, H).reshape(S, n_tasks, -1))
    value = torch.zeros_like(reach).index_add_(
        2, idx, (p_old * R).unsqueeze(-1).expand(-1, -1, -1, H).reshape(S, n_tasks, -1))
    return value / reach.clamp_min(torch.finfo(p_old.dtype).tiny)


def _exact_step_advantages(problem: Problem, p_old: torch.Tensor, adv_ET: torch.Tensor, cfg: RunConfig) -> torch.Tensor:
    """``[S, tasks, n_traj, T]`` the advantage each turn's exact step uses: the estimator's (GRAE's
    return-based one, or the exact critic's ``Q - V``), or with ``advantage="q"`` GRAE's centred
    return replaced by its mean given the turn's state and response, ``Q(s_t, a_t) - b`` (the return's
    spread within ``(s_t, a_t)`` removed, ``Delta(s_t)`` kept)."""
    if cfg.advantage == "returns":
        return adv_ET
    shape = problem.shape
    centred = adv_ET[..., 0]  # GRAE: the same for every turn
    out = []
    for t in range(shape.turns):
        node = shape._code(slice(0, shape.turn_start(t) + shape.tokens_per_turn))  # (s_t, a_t)
        n = int(node.max()) + 1
        reach = torch.zeros(*p_old.shape[:2], n, dtype=p_old.dtype).index_add_(2, node, p_old)
        total = torch.zeros_like(reach).index_add_(2, node, p_old * centred)
        out.append((total / reach.clamp_min(1e-300))[:, :, node])
    return torch.stack(out, -1)


def _solve_turn(theta: torch.Tensor, problem: Problem, t: int, q_traj: torch.Tensor, fa_traj: torch.Tensor,
                cfg: RunConfig) -> None:
    """Set turn ``t``'s per-turn tables to the maximiser of its exact surrogate (module docstring).

    ``q_traj``: ``[S, tasks, n_traj]`` each trajectory's probability under the sampling policy (0 where
    the turn is not played); ``fa_traj``: its factor times advantage for this turn."""
    shape = problem.shape
    V, L, start = shape.vocab, shape.tokens_per_turn, shape.turn_start(t)
    n_a = V**L
    n_s = V**start
    state = shape._code(slice(0, start))
    idx = state * n_a + shape.turn_code(t)  # [n_traj] (state, response)
    S, n_tasks = q_traj.shape[:2]
    # pi_old(a | s) from the tables: the turn's token log-probs, the same on every trajectory of (s, a)
    logp = torch.log_softmax(theta, -1)[:, :, shape.tree_node, shape.tokens]
    turn_logp = logp[..., start:start + L].sum(-1)
    log_old = torch.zeros(S, n_tasks, n_s * n_a, dtype=theta.dtype).scatter_(2, idx.expand(S, n_tasks, -1), turn_logp)
    log_old = log_old.view(S, n_tasks, n_s, n_a)

    def add(values):
        return torch.zeros(S, n_tasks, n_s * n_a, dtype=theta.dtype).index_add_(2, idx, values).view(S, n_tasks, n_s, n_a)

    q = add(q_traj)  # reach of (s, a)
    d = q.sum(-1, keepdim=True)  # reach of s
    if cfg.step == "kl":
        value = add(q_traj * fa_traj) / q.clamp_min(1e-300)
        log_new = torch.log_softmax(log_old + value / cfg.beta, -1)
    else:
        eps = cfg.step_clip
        pos, neg = add(q_traj * fa_traj.clamp_min(0)), add(q_traj * fa_traj.clamp_max(0))
        qq = q.clamp_min(1e-300)
        density = torch.cat([pos / qq, (pos + neg) / qq, neg / qq], -1)  # slope per unit of probability
        cap = torch.cat([q * (1 - eps), q * 2 * eps, torch.full_like(q, float("inf"))], -1)
        order = torch.sort(density, dim=-1, descending=True, stable=True).indices
        cap_sorted = cap.gather(-1, order)
        before = torch.cat([torch.zeros_like(cap_sorted[..., :1]), cap_sorted[..., :-1].cumsum(-1)], -1)
        fill = torch.minimum((d - before).clamp_min(0), cap_sorted)
        fill = torch.zeros_like(fill).scatter_(-1, order, fill).view(S, n_tasks, n_s, 3, n_a).sum(-2)
        log_new = torch.log_softmax((fill / d.clamp_min(1e-300)).clamp_min(1e-12).log(), -1)
    log_new = torch.where(d > 0, log_new, log_old)  # a state never reached keeps its policy
    # write the response distribution into the turn's token tables: logit = log P(prefix + v) - log P(prefix)
    offset = sum(V**i for i in range(start))
    for j in range(L):
        prefix = torch.logsumexp(log_new.reshape(S, n_tasks, n_s * V**j, V**(L - j)), -1)
        child = torch.logsumexp(log_new.reshape(S, n_tasks, n_s * V**j, V, V**(L - j - 1)), -1)
        theta[:, :, offset:offset + n_s * V**j] = child - prefix.unsqueeze(-1)
        offset += n_s * V**j
