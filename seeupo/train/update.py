"""Algorithm drivers: how the rows of one iteration become optimizer steps.

- ``joint_update`` (PPO, GRPO, GSPO, RLOO, REINFORCE): one phase with every row, ``epochs`` passes,
  ``minibatches`` optimizer steps per pass.
- ``sequential_update`` (SeeUPO): turn pools in the schedule's order (reverse by default). Each
  phase trains on its pool with advantages ``A_i * M_i``; then the factor ``M`` of the episodes in the
  pool is multiplied by their turn ratio under the updated parameters (``core.update_factor``,
  keyed by episode id). Episodes that never reached a turn have no row in its pool and cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from seeupo.core.losses import sequence_log_ratio
from seeupo.core.schedule import turn_order, update_factor
from seeupo.data.episode import Rows
from seeupo.train.learner import LossSpec, StepInputs, optimizer_step, score


@dataclass
class UpdateContext:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    params: list
    spec: LossSpec
    budget_tokens: int
    grad_clip: float | None
    epochs: int
    minibatches: int
    generator: torch.Generator  # minibatch shuffles and random orders, seeded per iteration
    value_head: torch.nn.Module | None = None
    reference_logp: object = None  # rows -> [R, L] log-probs under the KL reference policy


def _subset(inp: StepInputs, idx: torch.Tensor) -> StepInputs:
    rows = inp.rows.select(idx)
    w = rows.input_ids.shape[1]

    def cut(x):
        if x is None:
            return None
        x = x[idx]
        return x[:, :w] if x.dim() == 2 else x

    return StepInputs(rows=rows, adv=cut(inp.adv), factor=cut(inp.factor), ref_logp=cut(inp.ref_logp),
                      returns=cut(inp.returns), old_values=cut(inp.old_values))


def run_phase(ctx: UpdateContext, inp: StepInputs) -> list[dict]:
    out = []
    n = len(inp.rows)
    for _ in range(ctx.epochs):
        perm = torch.randperm(n, generator=ctx.generator)
        for chunk in perm.chunk(min(ctx.minibatches, n)):
            m = optimizer_step(ctx.model, ctx.optimizer, ctx.params, _subset(inp, chunk), ctx.spec,
                               budget_tokens=ctx.budget_tokens, grad_clip=ctx.grad_clip,
                               value_head=ctx.value_head)
            if m:
                out.append(m)
    return out


def _mean(ms: list[dict]) -> dict:
    keys = {k for m in ms for k in m}
    return {k: sum(m.get(k, 0.0) for m in ms) / len(ms) for k in keys} if ms else {}


def _reference(ctx: UpdateContext, rows: Rows) -> torch.Tensor | None:
    if ctx.spec.kl_coef <= 0:
        return None
    if ctx.reference_logp is None:
        raise ValueError("kl_coef > 0 needs a reference policy (UpdateContext.reference_logp)")
    return ctx.reference_logp(rows)


def joint_update(ctx: UpdateContext, rows: Rows, adv: torch.Tensor, *, returns=None, old_values=None) -> dict:
    """One phase with all rows. ``adv`` is per row ``[R]`` or per token ``[R, L]``."""
    inp = StepInputs(rows=rows, adv=adv, ref_logp=_reference(ctx, rows), returns=returns, old_values=old_values)
    steps = run_phase(ctx, inp)
    metrics = _mean(steps)
    metrics["optimizer_steps"] = len(steps)
    if steps:
        metrics["logp_gap_max"] = steps[0].get("logp_gap_max", 0.0)
    return metrics


def sequential_update(ctx: UpdateContext, pools: Rows, adv_E: torch.Tensor, *, order: str,
                      ratio_reference: str = "sampling", factor_clip=None) -> tuple[dict, dict]:
    """SeeUPO's phases over turn pools. Returns (metrics, per-turn diagnostics)."""
    E = adv_E.shape[0]
    factor = torch.ones(E, dtype=torch.float32)
    turns = sorted(set(pools.turn.tolist()))
    phases = turn_order(turns, order, rng=ctx.generator)
    per_turn: dict = {}
    all_steps: list[dict] = []
    for k, phase in enumerate(phases):
        idx = torch.nonzero(torch.isin(pools.turn, torch.tensor(phase))).squeeze(-1)
        rows = pools.select(idx)
        if ratio_reference == "incremental":
            old, _ = score(ctx.model, rows, temperature=ctx.spec.temperature, budget_tokens=ctx.budget_tokens)
            rows = replace(rows, old_logp=old)
        f_rows = factor[rows.episode]
        a_rows = adv_E[rows.episode]
        inp = StepInputs(rows=rows, adv=a_rows, factor=f_rows, ref_logp=_reference(ctx, rows))
        steps = run_phase(ctx, inp)
        all_steps += steps
        phase_m = _mean(steps)
        need_factor = k + 1 < len(phases)
        if need_factor:
            new, _ = score(ctx.model, rows, temperature=ctx.spec.temperature, budget_tokens=ctx.budget_tokens)
            slr = sequence_log_ratio(new, rows.old_logp, rows.loss_mask)
        for t in phase:
            sel = rows.turn == t
            d = {"rows": int(sel.sum()), "adv_x_factor_mean": float((a_rows[sel] * f_rows[sel]).mean()),
                 "factor_mean": float(f_rows[sel].mean()), "factor_min": float(f_rows[sel].min()),
                 "factor_max": float(f_rows[sel].max()), "clipfrac": phase_m.get("clipfrac", 0.0),
                 "kl": phase_m.get("kl", 0.0), "entropy": phase_m.get("entropy", 0.0),
                 "phase": k}
            if need_factor:
                d["ratio_mean"] = float(slr[sel].exp().mean())
                factor = update_factor(factor, rows.episode[sel], slr[sel], clip=factor_clip)
            per_turn[t] = d
    metrics = _mean(all_steps)
    metrics["optimizer_steps"] = len(all_steps)
    metrics["phases"] = len(phases)
    if all_steps:
        metrics["logp_gap_max"] = all_steps[0].get("logp_gap_max", 0.0)
    return metrics, per_turn
