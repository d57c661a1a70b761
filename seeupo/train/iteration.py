"""One iteration's update from episodes, whatever produced them (the built-in runner or an agent
program): advantages (``seeupo.core``), rows, the algorithm's phases and optimizer steps, the
iteration's record. ``Updater`` holds the optimizer (built on first use) and the KL reference.
"""

from __future__ import annotations

from dataclasses import replace
import torch

from seeupo.core.advantages import gae, gae_by_episode, grae, last_reached, shared_anchor_fraction, turn_gae
from seeupo.core.estimators import Turns, estimate, get_estimator
from seeupo.core.schedule import kept_turn
from seeupo.data.episode import Episode, derive_seed, trajectory_rows, turn_rows
from seeupo.train.config import Config
from seeupo.train.evaluation import episode_stats
from seeupo.train.learner import LossSpec, adamw, score, swapped
from seeupo.train.update import UpdateContext, joint_update, sequential_update


def keep_turns(rows, *, n_turns: list[int], spec: str):
    """The rows as ``algo.update_turns`` trains them: turn rows of frozen turns dropped, and on
    trajectory rows (turn -1) the tokens of frozen turns out of the loss mask."""
    if spec == "all":
        return rows
    if bool((rows.turn >= 0).all()):
        idx = [i for i, (t, e) in enumerate(zip(rows.turn.tolist(), rows.episode.tolist()))
               if kept_turn(t, n_turns[e], spec)]
        return rows.select(torch.tensor(idx, dtype=torch.long))
    mask = torch.tensor([[kept_turn(t, n_turns[int(e)], spec) if t >= 0 else False for t in row]
                         for row, e in zip(rows.token_turn.tolist(), rows.episode)], dtype=rows.loss_mask.dtype)
    return replace(rows, loss_mask=rows.loss_mask * mask)


def _shared_anchors(episodes: list[Episode], groups: torch.Tensor) -> float:
    """The fraction of the iteration's turns whose anchor state another turn of the same group shares
    (GiGPO's step-group diagnostic, ``core.advantages.shared_anchor_fraction``)."""
    width = max((len(e.anchors) for e in episodes), default=0)
    if not width:  # episodes without anchor records (not from the runner): unknown, not "none shared"
        return float("nan")
    keys = torch.zeros(len(episodes), width, dtype=torch.long)
    mask = torch.zeros(len(episodes), width, dtype=torch.long)
    for i, e in enumerate(episodes):
        keys[i, :len(e.anchors)] = torch.tensor(e.anchors, dtype=torch.long)
        mask[i, :len(e.anchors)] = 1
    return shared_anchor_fraction(groups, keys, mask)


def turn_tables(episodes: list[Episode]) -> Turns:
    """The episodes as the estimators read them (``core.estimators.Turns``): returns, groups, and
    ``[N, T]`` step rewards, reached mask and anchor keys from each episode's first turn (T: the
    longest)."""
    width = max((e.n_turns for e in episodes), default=0)
    step = torch.zeros(len(episodes), width)
    anchors = torch.zeros(len(episodes), width, dtype=torch.long)
    mask = torch.zeros(len(episodes), width, dtype=torch.long)
    for i, e in enumerate(episodes):
        n = e.n_turns
        mask[i, :n] = 1
        r = e.step_rewards[:n]
        step[i, :len(r)] = torch.tensor(r, dtype=torch.float32)
        a = e.anchors[:n]
        if len(a) < n:  # episodes without anchor records (not from the runner): each turn its own state
            a = list(a) + [hash((i, t)) for t in range(len(a), n)]
        anchors[i, :n] = torch.tensor([int(x) % (2**62) for x in a], dtype=torch.long)
    return Turns(torch.tensor([e.reward for e in episodes], dtype=torch.float32),
                 torch.tensor([e.group for e in episodes]), step, mask, anchors)


def _aligned(adv_NT: torch.Tensor, episodes: list[Episode], alignment: str, width: int) -> torch.Tensor:
    """``[N, width]`` per-turn advantages indexed as the turn pools label turns (``from_end``: 0 is each
    episode's last turn); 0 beyond an episode's turns (the authors' placeholders train no policy loss)."""
    out = torch.zeros(adv_NT.shape[0], max(width, adv_NT.shape[1]), dtype=adv_NT.dtype)
    for i, e in enumerate(episodes):
        n = e.n_turns
        out[i, :n] = adv_NT[i, :n] if alignment == "from_start" else adv_NT[i, :n].flip(0)
    return out


def _advantage_sizes(adv: torch.Tensor) -> dict:
    return {"advantage_abs_mean": float(adv.abs().mean()) if adv.numel() else 0.0,
            "advantage_abs_max": float(adv.abs().max()) if adv.numel() else 0.0}


def _groups_with_signal(rewards: torch.Tensor, groups: torch.Tensor) -> float:
    """Share of groups whose episodes do not all have the same reward (only those carry a GRAE signal)."""
    ids = groups.unique()
    return sum(bool(rewards[groups == g].std() > 0) if (groups == g).sum() > 1 else False for g in ids) / max(len(ids), 1)


def schedule_line(sched) -> str:
    """One line stating an update schedule, printed at the start of every run."""
    d = sched.as_dict()
    mb = "one per turn index present (SeeUPO's phase count)" if d["minibatches"] == "turns" else d["minibatches"]
    return (f"{d['epochs']} epoch(s) x minibatches {mb} per phase, clip [1 - {d['clip_eps']:g}, "
            f"1 + {d['clip_eps_high']:g}]")


def mean_steps(records: list[dict]) -> float | None:
    """Mean ``optimizer_steps`` over the iterations in ``metrics.jsonl`` (the measured schedule)."""
    steps = [r["optimizer_steps"] for r in records if "reward_mean" in r and "optimizer_steps" in r]
    return sum(steps) / len(steps) if steps else None


def scheduled_lr(lr: float, warmup_iterations: int, it: int) -> float:
    """``lr`` ramped linearly over the first ``warmup_iterations`` iterations: a function of the
    iteration only, so a resumed run continues the same schedule.

    >>> [scheduled_lr(1.0, 4, i) for i in range(5)]
    [0.25, 0.5, 0.75, 1.0, 1.0]
    """
    return lr * (min(1.0, (it + 1) / warmup_iterations) if warmup_iterations else 1.0)


def health_warnings(record: dict) -> list[str]:
    """Early signs of collapse (USERS.md #3), printed as they happen and kept in metrics.jsonl."""
    out = []
    if record.get("entropy", 1.0) < 0.02:
        out.append(f"entropy {record['entropy']:.4f}: the policy is close to deterministic")
    if record.get("tool/error_rate", 0.0) > 0.5:
        out.append(f"tool-call error rate {record['tool/error_rate']:.2f}: the call format is breaking down")
    if record.get("groups_with_signal", 1.0) == 0.0:
        out.append("no group has reward variance: this iteration carried no learning signal")
    return out


class Updater:
    """The learner's side of a run on ``stack``'s trainable parameters: ``update(episodes, it)`` runs
    the algorithm on one iteration's episodes. ``reference_state``: the KL reference (the trainable
    tensors at the start of RL, swapped in to score), set by the run; ``say``: where warnings go."""

    def __init__(self, cfg: Config, stack, say=None):
        self.cfg, self.stack, self.algo = cfg, stack, stack.algo
        self._say = say or (lambda msg: None)
        self._optimizer = None  # built on first use (an update, a checkpoint written or resumed)
        # KL reference: the trainable tensors at the start of RL (after the warm-up), swapped in to score
        self.reference_state: dict[str, torch.Tensor] | None = None

    @property
    def optimizer(self):
        """AdamW over the trainable parameters, built when the run first needs it (an update, a checkpoint
        written or resumed)."""
        if self._optimizer is None:
            self._optimizer = adamw(self.stack.params, self.cfg.optim.lr, self.cfg.optim.weight_decay)
        return self._optimizer

    @property
    def schedule(self):
        """The running algorithm's effective update schedule (``core.algorithms.Schedule``)."""
        return self.cfg.algo.schedule()

    def set_lr(self, it: int) -> float:
        """The learning rate of iteration ``it`` (``scheduled_lr``), set on the optimizer; returned."""
        lr = scheduled_lr(self.cfg.optim.lr, self.cfg.optim.lr_warmup_iterations, it)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        return lr

    def _reference_logp(self, rows):
        with swapped(self.stack.named_params, self.reference_state):
            logp, _ = score(self.stack.learner_model, rows, temperature=self.cfg.rollout.temperature,
                            budget_tokens=self.stack.micro_batch_tokens, pack=self.cfg.optim.pack_width,
                            share=self.cfg.optim.share_prefix)
        return logp

    def _loss_spec(self) -> LossSpec:
        a, sched = self.cfg.algo, self.schedule
        return LossSpec(self.algo.loss, clip_eps=sched.clip_eps, clip_eps_high=sched.clip_eps_high, kl_coef=a.kl_coef,
                        kl_estimator=a.kl_estimator, vf_coef=a.vf_coef, temperature=self.cfg.rollout.temperature)

    def update(self, episodes: list[Episode], it: int) -> dict:
        """The learner's part of iteration ``it`` on ``episodes`` (advantages, the algorithm's
        phases and optimizer steps); returns the iteration's record without timings. Episodes that
        their environment ended (a crash or a timeout) are counted and left out of the loss and the
        group baselines: they say nothing about the policy."""
        stats = episode_stats(episodes, self.cfg.eval.threshold, getattr(self.stack.family, "counters", ()))
        faulted = [e for e in episodes if e.faulted]
        for e in faulted[:3]:
            self._say(f"[yellow]iteration {it}: episode of task {e.task_id} ended by its environment "
                      f"({e.end_reason}: {e.error[:200]}); left out of the update[/]")
        episodes = [e for e in episodes if not e.faulted]
        if not episodes:
            self._say(f"[yellow]iteration {it}: every episode was ended by its environment; no update[/]")
            return {"iteration": it, **stats, "optimizer_steps": 0, "nonfinite_skips": 0,
                    "episodes_excluded": len(faulted), "turn": {}}
        record = self._update(episodes, it)
        record.update(stats)
        record["episodes_excluded"] = len(faulted)
        return record

    def _update(self, episodes: list[Episode], it: int) -> dict:
        """Advantages by the estimator in force (``core.estimators``; a critic's by its driver in
        ``CRITIC_DRIVERS``), the update by the driver in ``DRIVERS``, then the iteration's record."""
        cfg = self.cfg
        turns = turn_tables(episodes)
        # turn indices present (either alignment): SeeUPO's phase count, which minibatches="turns" matches;
        # with the authors' placeholders SeeUPO runs every index up to rollout.max_turns
        n_turns = cfg.rollout.max_turns if cfg.algo.placeholders else max((e.n_turns for e in episodes), default=0)
        ctx = self._context(n_turns, it)
        self.stack.model.train()
        est = get_estimator(cfg.algo.effective_estimator())
        if est.kind == "critic":
            adv, metrics = CRITIC_DRIVERS[est.name](self, ctx, episodes, turns)
        else:
            adv = estimate(est.name, turns, norm=cfg.algo.norm or self.algo.norm, params=cfg.algo.resolved_params(),
                           leave_one_out=self.algo.leave_one_out)
            if cfg.algo.advantage_clip:
                adv = adv.clamp(-cfg.algo.advantage_clip, cfg.algo.advantage_clip)
            driver = "sequential" if self.algo.sequential or cfg.algo.effective_order() != "joint" else "joint"
            metrics = DRIVERS[driver](self, ctx, episodes, adv)
        return self._record(it, episodes, turns, adv, metrics)

    def _context(self, n_turns: int, it: int) -> UpdateContext:
        cfg, sched = self.cfg, self.schedule
        return UpdateContext(self.stack.learner_model, self.optimizer, self.stack.params, self._loss_spec(),
                             self.stack.micro_batch_tokens, cfg.optim.grad_clip, sched.epochs, sched.steps_per_pass(n_turns),
                             torch.Generator().manual_seed(derive_seed(cfg.run.seed, "update", it)), self.stack.value_head,
                             self._reference_logp, pack=cfg.optim.pack_width, share=cfg.optim.share_prefix)

    def _keep(self, rows, episodes: list[Episode]):
        return keep_turns(rows, n_turns=[e.n_turns for e in episodes], spec=self.cfg.algo.update_turns)

    def _record(self, it: int, episodes: list[Episode], turns: Turns, adv: torch.Tensor, metrics: dict) -> dict:
        """The iteration's record: the driver's metrics, per-turn diagnostics (a joint driver's from the
        advantages by turn), advantage sizes, the share of groups with signal, the shared anchors."""
        per_turn = metrics.pop("_per_turn", None) or {}
        if not per_turn:  # joint algorithms: rows and advantages by turn
            for e_i, e in enumerate(episodes):
                for t in range(e.n_turns):
                    d = per_turn.setdefault(t, {"rows": 0, "adv_x_factor_mean": 0.0})
                    d["rows"] += 1
                    d["adv_x_factor_mean"] += float(adv[e_i] if adv.dim() == 1 else adv[e_i, t])
            for d in per_turn.values():
                d["adv_x_factor_mean"] /= max(d["rows"], 1)
        for t, d in per_turn.items():
            eps_t = [e for e in episodes if e.n_turns > t]
            d["success"] = sum(e.score >= self.cfg.eval.threshold for e in eps_t) / max(len(eps_t), 1)
            d["reward"] = sum(e.step_rewards[t] for e in eps_t if len(e.step_rewards) > t) / max(len(eps_t), 1)
        return {"iteration": it, **episode_stats(episodes, self.cfg.eval.threshold), **metrics,
                **_advantage_sizes(adv if adv.dim() == 1 else adv[turns.mask_NT.bool()]),
                "groups_with_signal": _groups_with_signal(turns.rewards_N, turns.groups_N),
                "anchors/shared_fraction": _shared_anchors(episodes, turns.groups_N),
                "turn": {str(t): d for t, d in sorted(per_turn.items())}}


# ---- update drivers: one per way of turning rows into optimizer steps ----------------------------

def _joint(up: Updater, ctx: UpdateContext, episodes: list[Episode], adv: torch.Tensor) -> dict:
    """One phase with every row: per-turn advantages train one row per turn; an episode advantage
    trains trajectory rows (or turn rows with ``algo.rows=turn``)."""
    cfg, pad = up.cfg, up.stack.tokenizer.pad_token_id
    if adv.dim() == 2:
        rows = up._keep(turn_rows(episodes, pad), episodes)
        return joint_update(ctx, rows, adv[rows.episode, rows.turn])
    rows = up._keep(trajectory_rows(episodes, pad) if cfg.algo.rows == "trajectory"
                    else turn_rows(episodes, pad, alignment=cfg.algo.turn_alignment), episodes)
    return joint_update(ctx, rows, adv[rows.episode])


def _sequential(up: Updater, ctx: UpdateContext, episodes: list[Episode], adv: torch.Tensor) -> dict:
    """Turn phases (SeeUPO, or a joint algorithm given a turn order) over turn pools."""
    a = up.cfg.algo
    pools = up._keep(turn_rows(episodes, up.stack.tokenizer.pad_token_id, alignment=a.turn_alignment,
                               placeholders_to=up.cfg.rollout.max_turns if a.placeholders else None), episodes)
    if adv.dim() == 2:
        adv = _aligned(adv, episodes, a.turn_alignment, int(pools.turn.max()) + 1 if len(pools) else 1)
    metrics, per_turn = sequential_update(ctx, pools, adv, a.seeupo_options())
    return {**metrics, "_per_turn": per_turn}


def _ppo(up: Updater, ctx: UpdateContext, episodes: list[Episode], turns: Turns) -> tuple[torch.Tensor, dict]:
    """PPO: GAE over each episode's action tokens with the value head; one row per turn with bounded
    turn contexts, else trajectory rows. Returns (the episodes' group-centred rewards, for the
    diagnostics; metrics)."""
    cfg, pad = up.cfg, up.stack.tokenizer.pad_token_id
    gamma, lam = cfg.algo.estimator_param("gamma"), cfg.algo.estimator_param("lam")
    segmented = any(e.segmented for e in episodes)
    rows = up._keep(turn_rows(episodes, pad) if segmented else trajectory_rows(episodes, pad), episodes)
    _, old_values = score(up.stack.learner_model, rows, temperature=cfg.rollout.temperature,
                          budget_tokens=up.stack.micro_batch_tokens, value_head=up.stack.value_head,
                          pack=cfg.optim.pack_width, share=cfg.optim.share_prefix)
    if segmented:  # each turn row's reward (on its last action token, by gae_by_episode)
        r_row = torch.tensor([episodes[e_i].step_rewards[t] if t < len(episodes[e_i].step_rewards) else 0.0
                              for e_i, t in zip(rows.episode.tolist(), rows.turn.tolist())])
        adv_tok, returns = gae_by_episode(r_row, old_values, rows.loss_mask, rows.episode, rows.turn,
                                          gamma=gamma, lam=lam)
    else:
        r_tok = torch.zeros(rows.input_ids.shape)
        for i, e in enumerate(episodes):
            for t, end in enumerate(e.turn_ends):
                if t < len(e.step_rewards):
                    r_tok[i, end - 1] += e.step_rewards[t]
        adv_tok, returns = gae(r_tok, old_values, rows.loss_mask, gamma=gamma, lam=lam)
    metrics = joint_update(ctx, rows, adv_tok, returns=returns, old_values=old_values)
    return grae(turns.rewards_N, turns.groups_N, norm="none"), metrics


def _turn_ppo(up: Updater, ctx: UpdateContext, episodes: list[Episode], turns: Turns) -> tuple[torch.Tensor, dict]:
    """Turn-PPO: one row per turn; the critic's value of each turn state is the value head at the
    row's first action token (the state after the turn's whole prompt); GAE over turns
    (``core.turn_gae``), an episode cut before its end (``max_turns``, ``context``) bootstrapped from
    the value of its last turn state (the latest the critic has; an ended one from 0); the value loss
    at those positions only. Returns ([N, T] advantages, metrics)."""
    cfg = up.cfg
    rows = turn_rows(episodes, up.stack.tokenizer.pad_token_id)
    _, old_values = score(up.stack.learner_model, rows, temperature=cfg.rollout.temperature,
                          budget_tokens=up.stack.micro_batch_tokens, value_head=up.stack.value_head,
                          pack=cfg.optim.pack_width, share=cfg.optim.share_prefix)
    has = rows.loss_mask.sum(-1) > 0
    first = rows.loss_mask.argmax(-1)  # first action token of each row (0 for a row without one)
    values_NT = torch.zeros_like(turns.step_rewards_NT)
    r_idx = torch.arange(len(rows))
    values_NT[rows.episode, rows.turn] = old_values[r_idx, first] * has
    cut = torch.tensor([e.end_reason in CUT for e in episodes], dtype=values_NT.dtype)
    last = last_reached(turns.mask_NT)
    adv_NT, ret_NT = turn_gae(turns.step_rewards_NT, values_NT, turns.mask_NT, gamma=cfg.algo.estimator_param("gamma"),
                              lam=cfg.algo.estimator_param("lam"), bootstrap_N=values_NT.gather(1, last).squeeze(1) * cut)
    returns = torch.zeros_like(old_values)
    returns[r_idx, first] = ret_NT[rows.episode, rows.turn]
    value_mask = torch.zeros_like(rows.loss_mask)
    value_mask[r_idx, first] = has.to(value_mask.dtype)
    metrics = joint_update(ctx, rows, adv_NT[rows.episode, rows.turn], returns=returns, old_values=old_values,
                           value_mask=value_mask)
    return adv_NT, metrics


CUT = ("max_turns", "context")  # end reasons of an episode stopped before the game ended: bootstrapped

# how a critic-free estimator's advantages become optimizer steps
DRIVERS = {"joint": _joint, "sequential": _sequential}
# the estimators that need the value head: each computes its advantages and runs its update
CRITIC_DRIVERS = {"gae": _ppo, "turn_gae": _turn_ppo}
