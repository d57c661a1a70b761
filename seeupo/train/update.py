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

from seeupo.core.schedule import SeeUPOOptions, factor_log_ratio, is_segmented, turn_order, update_factor
from seeupo.data.episode import Rows
from seeupo.models.policy import Continuation
from seeupo.train.learner import LossSpec, StepInputs, optimizer_step, score, turn_adapters_of


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
    pack: int = 0  # lane width for packing rows end to end (optim.pack_width; 0: off)
    share: bool = False  # common prefixes run once (optim.share_prefix)


def _subset(inp: StepInputs, idx: torch.Tensor) -> StepInputs:
    rows = inp.rows.select(idx)
    w = rows.input_ids.shape[1]

    def cut(x):
        if x is None:
            return None
        x = x[idx]
        return x[:, :w] if x.dim() == 2 else x

    return StepInputs(rows=rows, adv=cut(inp.adv), factor=cut(inp.factor), ref_logp=cut(inp.ref_logp),
                      returns=cut(inp.returns), old_values=cut(inp.old_values), value_mask=cut(inp.value_mask), cont=inp.cont and inp.cont.select(idx),
                      cont_old_logp=None if inp.cont is None else inp.cont_rows(idx)[1], factor_clip=inp.factor_clip,
                      factor_ratio=inp.factor_ratio)


def run_phase(ctx: UpdateContext, inp: StepInputs, after_first=None) -> list[dict]:
    """``epochs`` passes of ``minibatches`` optimizer steps. ``after_first(inp, fused_slr)``, when
    given, receives the first step's fused log ratios (in row order) and returns the inputs of the
    later steps."""
    out = []
    n = len(inp.rows)
    for _ in range(ctx.epochs):
        perm = torch.randperm(n, generator=ctx.generator)
        for chunk in torch.tensor_split(perm, min(ctx.minibatches, n)):  # exactly that many minibatches
            m = optimizer_step(ctx.model, ctx.optimizer, ctx.params, _subset(inp, chunk), ctx.spec,
                               budget_tokens=ctx.budget_tokens, grad_clip=ctx.grad_clip,
                               value_head=ctx.value_head, pack=ctx.pack, share=ctx.share)
            if after_first is not None:
                slr = torch.zeros(n)
                if "fused_slr" in m:
                    slr[chunk] = m.pop("fused_slr")
                inp, after_first = after_first(inp, slr), None
            if m:
                out.append(m)
    return out


def _mean(ms: list[dict]) -> dict:
    keys = {k for m in ms for k in m}
    return {k: sum(m.get(k, 0.0) for m in ms) / len(ms) for k in keys} if ms else {}


def _count_steps(metrics: dict, steps: list[dict]) -> None:
    """``optimizer_steps``: the steps applied; ``nonfinite_skips``: those the non-finite guard skipped."""
    skips = int(sum(m.get("nonfinite_skip", 0.0) for m in steps))
    metrics.pop("nonfinite_skip", None)
    metrics["optimizer_steps"] = len(steps) - skips
    metrics["nonfinite_skips"] = skips
    metrics["_skips"] = [bool(m.get("nonfinite_skip")) for m in steps]  # in order (popped by the trainer)


def _reference(ctx: UpdateContext, rows: Rows) -> torch.Tensor | None:
    if ctx.spec.kl_coef <= 0:
        return None
    if ctx.reference_logp is None:
        raise ValueError("kl_coef > 0 needs a reference policy (UpdateContext.reference_logp)")
    return ctx.reference_logp(rows)


def joint_update(ctx: UpdateContext, rows: Rows, adv: torch.Tensor, *, returns=None, old_values=None,
                 value_mask=None) -> dict:
    """One phase with all rows. ``adv`` is per row ``[R]`` or per token ``[R, L]``; ``value_mask``
    where the critic's loss applies (None: the loss mask)."""
    inp = StepInputs(rows=rows, adv=adv, ref_logp=_reference(ctx, rows), returns=returns, old_values=old_values,
                     value_mask=value_mask)
    steps = run_phase(ctx, inp)
    metrics = _mean(steps)
    _count_steps(metrics, steps)
    if steps:
        metrics["logp_gap_max"] = steps[0].get("logp_gap_max", 0.0)
    return metrics


def _continuation(rows: Rows, prev: Rows, prev_turns: list[int]) -> tuple[Continuation, torch.Tensor] | None:
    """What follows each row of this phase in the previous phase's row of the same episode (that row
    holds this one as a prefix): the tokens up to the end of the previous phase's turns, with those
    turns' tokens marked for scoring and their sampling log-probs. None if no row continues, or if
    some row is not a prefix of its episode's previous-phase row (bounded turn contexts,
    ``rollout.history=last:K``: each turn's prompt is rendered afresh), where the factor is scored by
    its own pass instead."""
    where = {int(e): j for j, e in enumerate(prev.episode.tolist())}
    nat = rows.attention_mask.sum(-1).tolist()
    ends = prev.attention_mask.sum(-1).tolist()
    spans = [(i, where[int(e)]) for i, e in enumerate(rows.episode.tolist()) if int(e) in where]
    if any(ends[j] < nat[i] or not torch.equal(prev.input_ids[j, : nat[i]], rows.input_ids[i, : nat[i]])
           for i, j in spans):
        return None
    E = max((ends[j] - nat[i] for i, j in spans), default=0)
    if E <= 0:
        return None
    R = len(rows)
    ids, att = torch.zeros(R, E, dtype=torch.long), torch.zeros(R, E, dtype=torch.long)
    scored, old = torch.zeros(R, E, dtype=torch.long), torch.zeros(R, E)
    for i, j in spans:
        a, b = nat[i], ends[j]
        ids[i, : b - a] = prev.input_ids[j, a:b]
        att[i, : b - a] = 1
        scored[i, : b - a] = torch.isin(prev.token_turn[j, a:b], torch.tensor(prev_turns)).long()
        old[i, : b - a] = prev.old_logp[j, a:b]
    return Continuation(ids, att, scored), old


def segment_rows(pools: Rows, phase: list[int]) -> tuple[torch.Tensor, Rows]:
    """One row per episode that reached the phase: its turn row of the latest of the phase's turns,
    with the loss on all the phase's turns (a bucket of ``buckets:B`` as one segment). Returns the
    rows' indices in ``pools`` and the rows."""
    in_phase = torch.nonzero(torch.isin(pools.turn, torch.tensor(phase))).squeeze(-1)
    latest: dict[int, int] = {}
    for i in in_phase.tolist():
        e = int(pools.episode[i])
        if e not in latest or int(pools.turn[i]) > int(pools.turn[latest[e]]):
            latest[e] = i
    idx = torch.tensor(sorted(latest.values()), dtype=torch.long)
    rows = pools.select(idx)
    rows.loss_mask = torch.isin(rows.token_turn, torch.tensor(phase)).long() * rows.attention_mask
    return idx, rows


def sequential_update(ctx: UpdateContext, pools: Rows, adv: torch.Tensor,
                      opts: SeeUPOOptions = SeeUPOOptions()) -> tuple[dict, dict]:
    """SeeUPO's phases over turn pools. Returns (metrics, per-turn diagnostics); ``metrics["phase_order"]``
    lists the phases in the order they ran.

    ``adv`` is one advantage per episode ``[E]`` (GRAE) or per episode and turn index ``[E, W]``
    (a turn-level estimator, indexed by the pools' turn labels): phase t trains on ``A_{., t}``
    times the factor.

    ``opts`` (``core.schedule.SeeUPOOptions``): ``order`` and ``alignment`` go to ``core.turn_order``
    (reverse = latest decision stage first in either alignment). ``carry_factor=False`` runs the
    phases without SeeUPO's factor (a joint algorithm given a turn order, or ``factor_ratio="off"``).
    ``factor_ratio`` is the turn weight the factor multiplies in (``core.factor_log_ratio``: ``full``
    or ``geometric``).

    The loop below is the algorithm; each optimisation is a piece it calls:

    - ``_Phases.rows``: a phase's rows, or with ``buckets:B`` one segment row per episode over the
      bucket's turns (``segment_rows``);
    - ``_Phases.reference``: the KL reference's log-probs of every pool in one pass, read per phase;
    - ``_Phases.continuation`` (``fuse``): when a phase trains turn ``t - 1`` right after the phase of
      turn ``t`` (the reverse order), with one optimizer step per pass and the sampling ratio
      reference, the factor's forward pass for turn ``t`` is fused into the first step of the next
      phase (SPEC §6): that step's forward over the rows of turn ``t - 1`` continues, without
      gradient and from the rows' KV cache, over the tokens up to the end of turn ``t``, giving turn
      ``t``'s ratio under the updated parameters for the cost of a forward over turn ``t``'s own
      tokens (not over the prefix again). Otherwise ``_settle``, a separate scoring pass;
    - ``ratio_reference="incremental"``: each phase's ratio against the parameters it starts from;
    - the authors' placeholder rows (``Rows.placeholder``): no policy loss, still KL and factor."""
    turns = sorted(set(pools.turn.tolist()))
    phases = turn_order(turns, opts.order, rng=ctx.generator, alignment=opts.alignment)
    plan = _Phases(ctx, pools, phases, is_segmented(opts.order), opts.alignment, adv)
    factor_clip, factor_ratio = opts.factor_clip, opts.factor_ratio
    fused = (opts.fuse and opts.carry_factor and ctx.minibatches == 1 and opts.ratio_reference == "sampling"
             and opts.alignment == "from_start" and pools.token_turn is not None and pools.placeholder is None
             and turn_adapters_of(ctx.model) is None)  # (a turn adapter scores its own turn: no shared cache)
    factor = torch.ones(adv.shape[0], dtype=torch.float32)  # M, keyed by episode
    per_turn: dict = {}
    all_steps: list[dict] = []
    owed = None  # (rows, turns, segment) of the previous phase while its factor is not yet multiplied in
    for k, phase in enumerate(phases):
        idx, rows, segment = plan.rows(k, phase)
        cont = plan.continuation(rows, owed, phase, segment) if fused else None
        if owed is not None and cont is None:
            _settle(ctx, owed, per_turn, factor_clip, factor, factor_ratio)
        if opts.ratio_reference == "incremental":
            rows = replace(rows, old_logp=score(ctx.model, rows, temperature=ctx.spec.temperature,
                                                budget_tokens=ctx.budget_tokens, pack=ctx.pack, share=ctx.share)[0])
        a_rows = plan.advantages(rows)
        m_rows = factor[rows.episode]
        inp = StepInputs(rows=rows, adv=a_rows, factor=m_rows, ref_logp=plan.reference(idx, rows),
                         cont=cont and cont[0], cont_old_logp=cont and cont[1], factor_clip=factor_clip,
                         factor_ratio=factor_ratio)
        after_first = _fused_settlement(factor, rows, owed[1], cont[0], per_turn, factor_clip) if cont else None
        steps = run_phase(ctx, inp, after_first)
        all_steps += steps
        _record(per_turn, k, phase, rows, a_rows, m_rows if cont is None else factor[rows.episode], steps, segment,
                fused=cont is not None)
        owed = (rows, phase, segment) if k + 1 < len(phases) and opts.carry_factor else None
        if owed is not None and not (fused and (len(phase) == 1 or segment)):
            _settle(ctx, owed, per_turn, factor_clip, factor, factor_ratio)  # no later forward can carry it
            owed = None
    metrics = _mean(all_steps)
    _count_steps(metrics, all_steps)
    metrics["phases"] = len(phases)
    metrics["phase_order"] = phases
    if all_steps:
        metrics["logp_gap_max"] = all_steps[0].get("logp_gap_max", 0.0)
    return metrics, per_turn


class _Phases:
    """What ``sequential_update``'s phases read: each phase's rows (segments for buckets), their
    advantages and the KL reference of every pool, computed once."""

    def __init__(self, ctx: UpdateContext, pools: Rows, phases: list[list[int]], segmented: bool, alignment: str,
                 adv: torch.Tensor):
        if segmented and (alignment != "from_start" or pools.token_turn is None):
            raise ValueError("buckets:B needs turn rows aligned from the start (with each token's turn)")
        if adv.dim() == 2 and segmented and any(len(p) > 1 for p in phases):
            raise ValueError("per-turn advantages cannot train buckets:B: a bucket's segment row is one sequence "
                             "over several turns, each with its own advantage")
        self.pools, self.adv = pools, adv
        self.segments = {k: segment_rows(pools, phase) for k, phase in enumerate(phases)
                         if segmented and len(phase) > 1}
        # a bucket's segment row is a pool row with its loss on every turn of the bucket, so that row is
        # scored on all of them (and no other row is)
        ref_pools = pools
        if self.segments and ctx.spec.kl_coef > 0:
            ref_mask = pools.loss_mask.clone()
            for idx, seg in self.segments.values():
                w = seg.loss_mask.shape[1]  # (a segment's rows are trimmed to their own width)
                ref_mask[idx, :w] = torch.maximum(ref_mask[idx, :w], seg.loss_mask.to(ref_mask.dtype))
            ref_pools = replace(pools, loss_mask=ref_mask)
        self.ref_all = _reference(ctx, ref_pools)

    def rows(self, k: int, phase: list[int]) -> tuple[torch.Tensor, Rows, bool]:
        """(indices in the pools, rows, whether they are segment rows) of phase ``k``."""
        if k in self.segments:
            return (*self.segments[k], True)
        idx = torch.nonzero(torch.isin(self.pools.turn, torch.tensor(phase))).squeeze(-1)
        return idx, self.pools.select(idx), False

    def reference(self, idx: torch.Tensor, rows: Rows) -> torch.Tensor | None:
        return None if self.ref_all is None else self.ref_all[idx][:, : rows.input_ids.shape[1]]

    def advantages(self, rows: Rows) -> torch.Tensor:
        """``A`` of each row's episode (and turn); 0 on the authors' placeholder rows."""
        a = self.adv[rows.episode] if self.adv.dim() == 1 else self.adv[rows.episode, rows.turn]
        if rows.placeholder is not None:
            a = torch.where(rows.placeholder, torch.zeros_like(a), a)
        return a

    @staticmethod
    def continuation(rows: Rows, owed, phase: list[int], segment: bool):
        """The owed factor's fused continuation for this phase's rows, or None: only for a phase of one
        turn (or a segment) that comes right before the owed phase's turns in time."""
        if owed is None or not (len(phase) == 1 or segment) or min(owed[1]) != max(phase) + 1:
            return None
        return _continuation(rows, owed[0], owed[1])


def _fused_settlement(factor: torch.Tensor, rows: Rows, owed_turns: list[int], cont: Continuation, per_turn: dict,
                      factor_clip):
    """``run_phase``'s ``after_first``: the owed turns' ratios from the first step's fused forward
    multiply into the factor, and the later steps of the phase use the settled factor."""
    has = cont.score_mask.sum(-1) > 0

    def settle(inp: StepInputs, slr: torch.Tensor) -> StepInputs:
        for t in owed_turns:
            per_turn[t]["ratio_mean"] = float(slr[has].exp().mean()) if bool(has.any()) else 1.0
        factor.copy_(update_factor(factor, rows.episode[has], slr[has], clip=factor_clip))
        return replace(inp, factor=factor[rows.episode], cont=None, cont_old_logp=None)
    return settle


def _record(per_turn: dict, k: int, phase: list[int], rows: Rows, a_rows: torch.Tensor, f_rows: torch.Tensor,
            steps: list[dict], segment: bool, fused: bool) -> None:
    """Per-turn diagnostics of phase ``k`` (a segment row counts for every turn its episode reached)."""
    phase_m = _mean(steps)
    for t in phase:
        sel = rows.turn >= t if segment else rows.turn == t
        f_sel = f_rows[sel]
        per_turn[t] = {"rows": int(sel.sum()), "adv_x_factor_mean": float((a_rows[sel] * f_sel).mean()),
                       "factor_mean": float(f_sel.mean()), "factor_min": float(f_sel.min()),
                       "factor_max": float(f_sel.max()), "clipfrac": phase_m.get("clipfrac", 0.0),
                       "kl": phase_m.get("kl", 0.0), "entropy": phase_m.get("entropy", 0.0), "phase": k,
                       "fused": fused}


def _settle(ctx: UpdateContext, owed, per_turn: dict, factor_clip, factor: torch.Tensor, factor_ratio: str):
    """The factor of a finished phase (``owed``: its rows, turns and whether they are segment rows) by
    its own scoring pass under the updated parameters. A segment phase has one row per episode: its
    ratio is the bucket's."""
    rows, turns, segment = owed
    new, _ = score(ctx.model, rows, temperature=ctx.spec.temperature, budget_tokens=ctx.budget_tokens, pack=ctx.pack,
                   share=ctx.share)
    slr = factor_log_ratio(new, rows.old_logp, rows.loss_mask, factor_ratio)
    if segment:
        for t in turns:
            per_turn[t]["ratio_mean"] = float(slr.exp().mean())
        factor.copy_(update_factor(factor, rows.episode, slr, clip=factor_clip))
        return
    for t in turns:
        sel = rows.turn == t
        per_turn[t]["ratio_mean"] = float(slr[sel].exp().mean())
        factor.copy_(update_factor(factor, rows.episode[sel], slr[sel], clip=factor_clip))
