"""A roofline of one RL iteration: each phase's floating-point work over its time, as a share of the
machine's measured fp32 matmul throughput at the model's own shapes; the rollout's tokens per second
against the memory-bandwidth bound of a decode step.

    python benchmarks/roofline.py --preset tiny --threads 1 --json runs/bench/roofline_tiny.json
    python benchmarks/roofline.py --json runs/bench/roofline_default.json                 # the default preset
    python benchmarks/roofline.py --preset textworld --json runs/bench/roofline_textworld.json
    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/roofline.py
                                                         # an AVX512 machine's kernels capped to AVX2

The phases run in-process on the preset's ``Trainer`` through the code a run uses: the warm-up
(``warmup.warmup``: a slice of ``--warmup-steps`` supervised steps from the initial weights; then the
whole warm-up once, timed, so that the iteration starts from the policy a run has), the rollout
(``PolicyStack.train_episodes`` of iteration 0), the KL reference's scoring pass (``learner.score``
of the turn rows SeeUPO scores, under the reference weights), the update (``Trainer.update`` less
that pass: the forward and backward passes through LoRA, the fused factor passes, the optimizer
steps) and the evaluation (``evaluation.evaluate`` of one batch of ``eval.batch_episodes`` episodes).

Each phase runs twice from the same state: once timed, once under ``FlopCounterMode`` (the count;
torch does not count its CPU attention kernel, registered here with torch's own formula). The
second run also records the shapes of every decoder and LM-head call (forward pre-hooks), from which
``forward_flops``/``backward_flops`` give the analytic count: ``2 x parameters x positions`` for the
projections (LoRA's two thin products included), ``4 x heads x head_dim`` per query-key pair for
attention (its backward recomputes the scores: 2.5x), ``2 x hidden x vocab`` per LM-head row; a
backward computes input gradients for every projection whose input needs one and weight gradients
for the trained weights only. Positions are those the kernels ran (padding and dead rows included);
``real`` counts the unpadded ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import flop_counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import finish, reset  # noqa: E402

ISA_VARS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
QKV = ("q_proj", "k_proj", "v_proj")

# torch counts no FLOPs for the CPU's fused attention kernel (its formula covers the GPU kernels only)
_cpu_sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
if _cpu_sdpa not in flop_counter.flop_registry:
    flop_counter.register_flop_formula(_cpu_sdpa)(
        lambda q, k, v, *a, out_shape=None, **kw: flop_counter.sdpa_flop_count(q, k, v))
    flop_counter.register_flop_formula(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward)(
        lambda g, q, k, v, *a, out_shape=None, **kw: flop_counter.sdpa_backward_flop_count(g, q, k, v))


# ---- the analytic count: pure functions of the model's shapes ------------------------------------

@dataclass(frozen=True)
class Dims:
    """A decoder's matrix shapes: ``lora_r`` 0 for none, ``lora_targets`` the projections it wraps."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    lora_r: int = 0
    lora_targets: tuple[str, ...] = ()

    @classmethod
    def of(cls, config, lora_r: int = 0, lora_targets=()) -> "Dims":
        heads = config.num_attention_heads
        return cls(config.num_hidden_layers, config.hidden_size, config.intermediate_size, heads,
                   getattr(config, "num_key_value_heads", None) or heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads, config.vocab_size,
                   lora_r, tuple(lora_targets) if lora_r else ())

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection of one layer."""
        d, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d),
                "gate_proj": (d, i), "up_proj": (d, i), "down_proj": (i, d)}

    def _lora(self, name: str) -> int:
        return self.lora_r if name in self.lora_targets else 0


def forward_flops(dims: Dims, positions: int, pairs: int, head_rows: int) -> int:
    """Matmul FLOPs of a forward over ``positions`` decoder positions (rows x new tokens, padding
    included), ``pairs`` query-key pairs attended (rows x new tokens x keys, cached ones included) and
    ``head_rows`` LM-head rows.

    One layer, hidden 4, intermediate 8, 2 heads of 2, 1 kv head, vocab 10: 144 multiply-adds per
    position (q 4x4, k and v 4x2, o 4x4, gate, up and down 4x8):

    >>> forward_flops(Dims(1, 4, 8, 2, 1, 2, 10), positions=3, pairs=9, head_rows=1)  # 2*3*144 + 4*9*4 + 2*4*10
    1088
    """
    macs = sum(i * o + dims._lora(n) * (i + o) for n, (i, o) in dims.projections().items())
    return (2 * positions * dims.layers * macs + 4 * pairs * dims.layers * dims.heads * dims.head_dim
            + 2 * head_rows * dims.hidden * dims.vocab)


def backward_flops(dims: Dims, positions: int, pairs: int, head_rows: int, *, base_trained: bool,
                   first_input_grad: bool, head_trained: bool) -> int:
    """Matmul FLOPs of the backward of that forward: each projection's input gradient where its input
    needs one (all but the first layer's q, k and v when nothing before them trains:
    ``first_input_grad``), its weight gradient when ``base_trained``; LoRA's A and B weight gradients
    and the gradient through B (through A too where the input needs one); attention's backward
    (flash: the scores recomputed, 5 products where the forward ran 2); the LM head's input gradient,
    its weight gradient when ``head_trained``."""
    L, r = dims.layers, dims.lora_r
    macs = 0
    for n, (i, o) in dims.projections().items():
        with_input = L if first_input_grad or n not in QKV else L - 1
        macs += with_input * i * o + (L * i * o if base_trained else 0)
        if dims._lora(n):
            macs += L * (2 * r * o + r * i) + with_input * r * i
    head = (2 if head_trained else 1) * head_rows * dims.hidden * dims.vocab
    return 2 * positions * macs + 10 * pairs * L * dims.heads * dims.head_dim + 2 * head


# ---- counting a phase: FlopCounterMode, and the shapes of its decoder and LM-head calls ----------

class Count:
    """``with Count(model) as c:`` counts the matmul FLOPs run inside (``c.counted``, by op in
    ``c.by_op``) and records each decoder call (rows, new positions, keys, real positions, with
    gradient) and LM-head call (rows, with gradient), whose ``analytic()`` count follows."""

    def __init__(self, model, dims: Dims):
        from seeupo.models.policy import cache_keyword, decoder_parts

        self.model, self.dims = model, dims
        self.decoder, self.head = decoder_parts(model)
        self.kw = cache_keyword(self.decoder)
        self.calls: list[tuple[int, int, int, int, bool]] = []
        self.heads: list[tuple[int, bool]] = []

    def _on_decoder(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        B, n = ids.shape
        cache, att = kwargs.get(self.kw), kwargs.get("attention_mask")
        past = cache.get_seq_length() if cache is not None else 0
        real = int(att[:, -n:].sum()) if att is not None else B * n
        self.calls.append((B, n, past + n, real, torch.is_grad_enabled()))

    def _on_head(self, module, args):
        self.heads.append((args[0].numel() // args[0].shape[-1], torch.is_grad_enabled()))

    def __enter__(self):
        named = dict(self.model.named_parameters())

        def trains(*parts):
            return any(p.requires_grad for k, p in named.items() if all(s in k for s in parts))

        self.flags = {"base_trained": any(p.requires_grad for k, p in named.items()  # (LoRA's are lora_A/B)
                                          if "layers.0." in k and "q_proj" in k and "lora_" not in k),
                      "first_input_grad": trains("embed_tokens") or trains("layers.0.input_layernorm"),
                      "head_trained": self.head.weight.requires_grad}
        self.hooks = [self.decoder.register_forward_pre_hook(self._on_decoder, with_kwargs=True),
                      self.head.register_forward_pre_hook(self._on_head)]
        self.mode = flop_counter.FlopCounterMode(display=False)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        for h in self.hooks:
            h.remove()
        self.counted = self.mode.get_total_flops()
        self.by_op = {str(k): v for k, v in self.mode.get_flop_counts().get("Global", {}).items()}
        return False

    def analytic(self) -> dict:
        """Forward and backward FLOPs of the recorded calls; positions run and real."""
        fwd = bwd = 0
        for B, n, keys, _, grad in self.calls:
            fwd += forward_flops(self.dims, B * n, B * n * keys, 0)
            bwd += backward_flops(self.dims, B * n, B * n * keys, 0, **self.flags) if grad else 0
        for rows, grad in self.heads:
            fwd += forward_flops(self.dims, 0, 0, rows)
            bwd += backward_flops(self.dims, 0, 0, rows, **self.flags) if grad else 0
        return {"forward": fwd, "backward": bwd, "total": fwd + bwd,
                "positions": sum(B * n for B, n, *_ in self.calls), "real_positions": sum(c[3] for c in self.calls)}


def measure(name: str, model, dims: Dims, run, setup=lambda: None) -> tuple[dict, object, object, Count]:
    """``run()`` timed from ``setup()``'s state, then again from it counted: (the phase's record, the
    first run's result, the second's, its ``Count``)."""
    setup()
    t0 = time.perf_counter()
    first = run()
    seconds = time.perf_counter() - t0
    setup()
    with Count(model, dims) as c:
        second = run()
    a = c.analytic()
    rec = {"phase": name, "seconds": seconds, "flops_counted": c.counted, "flops_analytic": a["total"],
           "flops_analytic_forward": a["forward"], "flops_analytic_backward": a["backward"],
           "counted_over_analytic": c.counted / a["total"] if a["total"] else float("nan"),
           "positions": a["positions"], "real_positions": a["real_positions"], "by_op": c.by_op,
           "decoder_calls": len(c.calls), "flags": c.flags}
    return rec, first, second, c


# ---- the machine: fp32 matmul throughput at the model's shapes, memory bandwidth ----------------

def _best_rate(fn, work: float, seconds: float) -> float:
    """``work`` per call of ``fn`` over the best of three windows of about ``seconds / 3``."""
    fn()
    best = 0.0
    for _ in range(3):
        reps, t0 = 0, time.perf_counter()
        while reps == 0 or time.perf_counter() - t0 < seconds / 3:
            fn()
            reps += 1
        best = max(best, work * reps / (time.perf_counter() - t0))
    return best


def matmul_shapes(dims: Dims, rows: int, tokens: int, head_rows: int) -> dict[str, tuple[int, int, int]]:
    """(M, in, out) of the model's products: each projection at a decode step's ``rows`` and at a
    micro-batch's ``tokens``, LoRA's at ``tokens``, the LM head at a decode step and at a scoring
    chunk's ``head_rows``."""
    out = {}
    for M in (rows, tokens):
        for n, (i, o) in dims.projections().items():
            if n in ("k_proj", "up_proj", "o_proj"):  # the same shape as v_proj, gate_proj, q_proj
                continue
            out[f"{n}[{M}]"] = (M, i, o)
    if dims.lora_r:
        out[f"lora_A[{tokens}]"] = (tokens, dims.hidden, dims.lora_r)
        out[f"lora_B[{tokens}]"] = (tokens, dims.lora_r, dims.hidden)
    for M in (rows, head_rows):
        out[f"lm_head[{M}]"] = (M, dims.hidden, dims.vocab)
    return out


def matmul_peak(shapes: dict, seconds: float) -> dict[str, float]:
    """GFLOP/s of ``F.linear`` (the model's own call) at each (M, in, out), fp32."""
    out = {}
    for name, (M, i, o) in shapes.items():
        x, w = torch.randn(M, i), torch.randn(o, i)
        out[name] = _best_rate(lambda x=x, w=w: F.linear(x, w), 2 * M * i * o, seconds) / 1e9
    return out


def bandwidth(seconds: float, mib: int = 256) -> dict[str, float]:
    """GB/s of reading a ``mib`` MiB fp32 tensor (a sum) and of copying it (read + write)."""
    a = torch.rand(mib * 2**18)
    b = torch.empty_like(a)
    size = a.numel() * a.element_size()
    return {"read_GBps": _best_rate(a.sum, size, seconds) / 1e9,
            "copy_GBps": _best_rate(lambda: b.copy_(a), 2 * size, seconds) / 1e9}


def machine() -> dict:
    from seeupo.train.runlog import platform_info

    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    info = {**platform_info(), "avx2": "avx2" in flags, "avx512f": "avx512f" in flags,
            "isa_env": {v: os.environ[v] for v in ISA_VARS if v in os.environ}}
    info["kernels"] = (f"{info['cpu_capability']}, capped by {info['isa_env']} on an AVX512 machine"
                       if info["avx512f"] and info["isa_env"] else info["cpu_capability"])
    return info


def decode_bound(calls, dims: Dims, param_bytes: int, elem: int, gbps: float, peak_gflops: float) -> dict:
    """The rollout's decode steps (one new position per row) against the memory bound: a step reads
    every parameter once and each row's keys and values (``2 x layers x kv_heads x head_dim`` per
    cached position), so it cannot beat ``bytes / bandwidth``, nor ``flops / peak``; bound tokens per
    second = rows / that time, summed over the steps."""
    steps = [(B, keys) for B, n, keys, _, _ in calls if n == 1]
    kv = 2 * dims.layers * dims.kv_heads * dims.head_dim * elem
    mem_s = sum((param_bytes + B * keys * kv) / (gbps * 1e9) for B, keys in steps)
    roof_s = sum(max((param_bytes + B * keys * kv) / (gbps * 1e9),
                     (forward_flops(dims, B, B * keys, B)) / (peak_gflops * 1e9)) for B, keys in steps)
    rows = sum(B for B, _ in steps)
    return {"decode_steps": len(steps), "decode_positions": rows,
            "bytes_per_step_mean": (param_bytes * len(steps) + sum(B * keys * kv for B, keys in steps)) / max(len(steps), 1),
            "rows_per_step_mean": rows / max(len(steps), 1), "memory_bound_tok_per_s": rows / mem_s if mem_s else 0.0,
            "roofline_bound_tok_per_s": rows / roof_s if roof_s else 0.0}


# ---- the phases of one iteration --------------------------------------------------------------

def _warmup(tr, wcfg) -> dict:
    """The supervised warm-up with settings ``wcfg``, called as ``Trainer`` calls it."""
    from seeupo.train.warmup import warmup

    st, cfg = tr.stack, tr.cfg
    params, by_adapter = st.prepare_warmup()
    out = warmup(st.learner_model, params, st.chat, st.family, st.limits, wcfg, seed=cfg.run.seed,
                 budget_tokens=st.micro_batch_tokens, pack=cfg.optim.pack_width, share=cfg.optim.share_prefix,
                 by_adapter=by_adapter, cache=wcfg.cache,
                 cache_key={"model": cfg.model.model_dump(mode="json"), "device": cfg.run.device})
    st.weights_changed()
    return out


def phases(tr, dims: Dims, args, eval_batches: int) -> tuple[list[dict], dict]:
    """Each phase's record (``measure``) and what the rollout's decode bound needs."""
    from seeupo.data.episode import turn_rows
    from seeupo.train import checkpoint, memory
    from seeupo.train.evaluation import evaluate
    from seeupo.train.iteration import keep_turns
    from seeupo.train.learner import score, swapped

    st, cfg = tr.stack, tr.cfg
    model = st.model
    init = {n: p.detach().clone() for n, p in st.named_params}
    out, extra = [], {}
    if st.warmup_enabled():
        w = cfg.warmup
        total = w.epochs * -(-w.episodes // w.batch_episodes)
        k = min(args.warmup_steps, total)
        part = w.model_copy(update={"episodes": k * w.batch_episodes, "epochs": 1, "cache": None})
        rec, *_ = measure(f"warm-up ({k} of {total} steps)", model, dims, lambda: _warmup(tr, part),
                          setup=lambda: reset(tr, init))
        rec["whole_estimate_s"] = rec["seconds"] * total / k
        out.append(rec)
        reset(tr, init)
        if not args.skip_full_warmup:  # the policy a run's first iteration starts from
            t0 = time.perf_counter()
            extra["warmup_whole"] = {**_warmup(tr, w), "seconds": time.perf_counter() - t0, "steps": total}
    # RL starts as in Trainer: the KL reference is the warmed-up policy; embeddings fixed unless trained
    if cfg.algo.kl_coef > 0:
        tr.updater.reference_state = checkpoint.trainable_state(st.named_params)
    if not cfg.optim.train_embeddings:
        st.freeze_embeddings()
    w0 = {n: p.detach().clone() for n, p in st.named_params}

    def rollout():
        eps = st.train_episodes(0)
        memory.trim()  # as Trainer.iteration times it
        return eps

    rec, episodes, again, c_roll = measure("rollout", model, dims, rollout)
    rec["generated_tokens"] = sum(sum(e.gen_mask) for e in episodes)
    rec["episodes"] = len(episodes)
    rec["count_run_same_episodes"] = all(a.ids == b.ids for a, b in zip(episodes, again))
    out.append(rec)
    extra["decode_calls"] = c_roll.calls

    ref = None
    if cfg.algo.kl_coef > 0:  # the KL reference's pass over SeeUPO's turn pools (Updater's, as it scores them)
        kept = [e for e in episodes if not e.faulted]
        rows = keep_turns(turn_rows(kept, st.tokenizer.pad_token_id, alignment=cfg.algo.turn_alignment),
                          n_turns=[e.n_turns for e in kept], spec=cfg.algo.update_turns)

        def reference():
            with swapped(st.named_params, tr.updater.reference_state):
                return score(st.learner_model, rows, temperature=cfg.rollout.temperature,
                             budget_tokens=st.micro_batch_tokens, pack=cfg.optim.pack_width,
                             share=cfg.optim.share_prefix)[0]

        ref, *_ = measure("reference pass", model, dims, reference)
        ref["row_tokens"] = int(rows.attention_mask.sum())  # the rows' own tokens (shared prefixes counted per row)
        out.append(ref)

    def update():
        r = tr.update(episodes, 0)
        memory.trim()
        return r

    def from_w0():
        reset(tr, w0)
        tr.updater.set_lr(0)

    upd, *_ = measure("update", model, dims, update, setup=from_w0)
    if ref is not None:  # Trainer.update runs the reference pass first: the rest is the update proper
        extra["update_with_reference"] = dict(upd)
        for key in ("seconds", "flops_counted", "flops_analytic", "flops_analytic_forward",
                    "flops_analytic_backward", "positions", "real_positions", "decoder_calls"):
            upd[key] -= ref[key]
        upd["counted_over_analytic"] = upd["flops_counted"] / upd["flops_analytic"]
        upd["by_op"] = {k: v - ref["by_op"].get(k, 0) for k, v in upd["by_op"].items()}
        upd["phase"] = "update (less the reference pass)"
    out.append(upd)

    rec, res, _, _ = measure(f"evaluation (1 of {eval_batches} batches)", model, dims,
                             lambda: evaluate(st, detailed=True), setup=lambda: reset(tr, w0))
    rec["episodes"] = res.tasks * res.k
    rec["generated_tokens"] = round(res.stats["episode/generated_tokens"] * rec["episodes"])
    rec["whole_estimate_s"] = rec["seconds"] * eval_batches
    out.append(rec)
    return out, extra


def _row(cells, widths):
    return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def report(out: dict) -> None:
    m, peak = out["platform"], out["peak_gflops"]
    print(f"{m['cpu']} ({m['kernels']}; avx512f {'yes' if m['avx512f'] else 'no'}), {m['threads']} thread(s), "
          f"torch {m['torch']}; preset {out['preset']} ({out['model']})")
    print(f"fp32 matmul at the model's shapes (F.linear, M x in -> out), peak {peak:.1f} GFLOP/s ({out['peak_shape']}):")
    print("  " + ", ".join(f"{k} {v:.1f}" for k, v in out["matmul_gflops"].items()))
    bw = out["bandwidth"]
    print(f"memory: read {bw['read_GBps']:.1f} GB/s, copy {bw['copy_GBps']:.1f} GB/s")
    widths = (34, 8, 9, 9, 6, 8, 6, 9)
    print(_row(("phase", "seconds", "GFLOP", "GFLOP", "ratio", "GFLOP/s", "share", "real"), widths))
    print(_row(("", "", "counted", "analytic", "", "", "of peak", "positions"), widths))
    for p in out["phases"]:
        print(_row((p["phase"], f"{p['seconds']:.2f}", f"{p['flops_counted'] / 1e9:.2f}",
                    f"{p['flops_analytic'] / 1e9:.2f}", f"{p['counted_over_analytic']:.3f}",
                    f"{p['gflops']:.1f}", f"{p['share_of_peak']:.1%}",
                    f"{p['real_positions'] / max(p['positions'], 1):.0%}"), widths))
    d = out["decode"]
    print(f"rollout: {d['generated_tokens']} generated tokens in {d['rollout_s']:.2f} s = {d['achieved_tok_per_s']:.0f} "
          f"tok/s (the phase's whole time: pre-fills and environment steps too)\n  {d['decode_steps']} decode "
          f"steps of {d['rows_per_step_mean']:.1f} rows on average ({d['decode_positions']} positions), "
          f"{d['bytes_per_step_mean'] / 2**20:.0f} MiB read per step: memory bound "
          f"{d['memory_bound_tok_per_s']:.0f} tok/s (share {d['share_of_memory_bound']:.1%}), "
          f"roofline bound (memory or compute) {d['roofline_bound_tok_per_s']:.0f} tok/s "
          f"(share {d['share_of_roofline_bound']:.1%})")
    if "warmup_whole" in out:
        w = out["warmup_whole"]
        print(f"the whole warm-up, run once so that the iteration starts from a run's policy: {w['seconds']:.1f} s "
              f"for {w['steps']} steps")
    print(f"wall time of this benchmark: {out['wall_s']:.0f} s")


PHASES = ("warm-up", "rollout", "reference pass", "update", "evaluation")


def markdown(records: list[dict]) -> str:
    """The docs' table (docs/performance.md, between its ``roofline`` markers) from ``--json`` records:
    one row per record, each phase's achieved GFLOP/s and its share of the measured peak, and the
    rollout's tokens per second against its memory-bandwidth bound."""
    head = ("| CPU (kernels torch used) | threads | preset | peak GFLOP/s | "
            + " | ".join(PHASES) + " | rollout tok/s (memory bound) |")
    lines = [head, "|" + "---|" * (5 + len(PHASES))]
    for r in records:
        pl = r["platform"]
        kernels = pl["kernels"] if not pl["isa_env"] else f"{pl['cpu_capability']}, capped by environment variables"
        cpu = f"{pl['cpu']}, {'AVX512' if pl['avx512f'] else 'AVX2'} ({kernels})"
        cells = []
        for name in PHASES:
            ph = next(p for p in r["phases"] if p["phase"].startswith(name))
            cells.append(f"{ph['gflops']:.0f} ({ph['share_of_peak']:.0%})")
        d = r["decode"]
        lines.append(f"| {cpu} | {pl['threads']} | {r['preset']} | {r['peak_gflops']:.0f} | " + " | ".join(cells)
                     + f" | {d['achieved_tok_per_s']:.0f} ({d['memory_bound_tok_per_s']:.0f}) |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if argv is None and sys.argv[1:2] == ["--table"]:  # python benchmarks/roofline.py --table JSON...
        print(markdown([json.loads(Path(f).read_text()) for f in sys.argv[2:]]))
        return {}
    ap.add_argument("--preset", default="default", choices=["default", "textworld", "tiny"])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, as a run uses)")
    ap.add_argument("--warmup-steps", type=int, default=2, help="the warm-up slice timed and counted")
    ap.add_argument("--skip-full-warmup", action="store_true",
                    help="roll out from the initial weights (faster; episodes unlike a run's)")
    ap.add_argument("--warmup-cache", default=None, help="warmup.cache for the whole warm-up (reused if there)")
    ap.add_argument("--matmul-seconds", type=float, default=0.6, help="time per matmul shape")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    wall = time.perf_counter()

    from seeupo.models.policy import LORA_TARGETS, head_logprobs, is_peft
    from seeupo.train.config import load_config
    from seeupo.train.trainer import Trainer

    plain = load_config(args.preset)
    k, batch = plain.eval.k, plain.eval.batch_episodes or plain.eval.tasks * plain.eval.k
    tasks = max(1, min(plain.eval.tasks, batch // k))  # one batch of the evaluation's episodes
    eval_batches = -(-plain.eval.tasks * k // (tasks * k))
    overrides = ["run.loggers=[]", f"run.out={tempfile.mkdtemp(prefix='seeupo-roofline-')}", f"eval.tasks={tasks}"]
    if args.warmup_cache:
        overrides.append(f"warmup.cache={args.warmup_cache}")
    tr = Trainer(load_config(args.preset, overrides))
    st, cfg = tr.stack, tr.cfg
    base = st.model.get_base_model() if is_peft(st.model) else st.model
    present = {n.rsplit(".", 1)[-1] for n, _ in base.named_modules()}
    dims = Dims.of(base.config, cfg.model.lora_r if is_peft(st.model) else 0,
                   [t for t in LORA_TARGETS if t in present])

    chunk = head_logprobs.__kwdefaults__["chunk_elements"] // dims.vocab  # the LM head's rows per scoring chunk
    decode_rows = min(cfg.rollout.tasks_per_iteration * cfg.rollout.group_size, cfg.rollout.batch_size)
    shapes = matmul_shapes(dims, decode_rows, st.micro_batch_tokens, max(16, chunk))
    rates = matmul_peak(shapes, args.matmul_seconds)
    peak_shape = max(rates, key=rates.get)
    bw = bandwidth(args.matmul_seconds)
    recs, extra = phases(tr, dims, args, eval_batches)
    peak = rates[peak_shape]
    for p in recs:
        p["gflops"] = p["flops_counted"] / p["seconds"] / 1e9
        p["share_of_peak"] = p["gflops"] / peak
    roll = next(p for p in recs if p["phase"] == "rollout")
    elem = next(st.model.parameters()).element_size()
    param_bytes = sum(p.numel() * p.element_size() for p in st.model.parameters())
    dec = decode_bound(extra.pop("decode_calls"), dims, param_bytes, elem, bw["read_GBps"], peak)
    dec.update({"rollout_s": roll["seconds"], "generated_tokens": roll["generated_tokens"],
                "achieved_tok_per_s": roll["generated_tokens"] / roll["seconds"],
                "param_bytes": param_bytes, "bandwidth_GBps": bw["read_GBps"]})
    dec["share_of_memory_bound"] = dec["achieved_tok_per_s"] / dec["memory_bound_tok_per_s"]
    dec["share_of_roofline_bound"] = dec["achieved_tok_per_s"] / dec["roofline_bound_tok_per_s"]
    tr.close()
    out = {"preset": args.preset, "model": cfg.model.name, "dims": dims.__dict__, "platform": machine(),
           "matmul_shapes": {k: list(v) for k, v in shapes.items()}, "matmul_gflops": rates,
           "peak_gflops": peak, "peak_shape": peak_shape, "bandwidth": bw, "phases": recs, "decode": dec,
           **extra, "wall_s": time.perf_counter() - wall}
    report(out)
    return finish(out, "roofline.py", argv, args.json)


if __name__ == "__main__":
    main()
