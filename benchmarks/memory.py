"""Peak resident memory of each phase of the default run (load, warm-up, evaluation, rollout, update)
and what holds it, measured in one process (issue 36).

    OMP_NUM_THREADS=2 python benchmarks/memory.py --json runs/bench/memory_after.json
    OMP_NUM_THREADS=2 python benchmarks/memory.py --before --json runs/bench/memory_before.json
    python benchmarks/memory.py optim.micro_batch_tokens=2048          # any config override

Each phase starts a new peak (``/proc/self/clear_refs``) and reports the process's peak resident
memory during it (VmHWM), its resident memory at the end, and that after ``malloc_trim`` (the
difference: pages glibc's allocator kept after the phase freed them). What holds it: the weights and
trainable tensors, the optimizer's moments and the KL reference (their tensors' bytes), the tensors
autograd saved for backward at once at most (counted by storage while the warm-up and the update
run: activations and the log-prob and logit buffers; ``largest`` is the largest one), the KV caches the
sampler keeps for the next turn at the phase's end, and Python with torch and transformers imported
before the model loads. ``--before`` runs the code as it was before issue 36: no pages handed back
between phases and a 4096-token micro-batch.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import finish  # noqa: E402


def _kv_gb(sampler) -> float:
    from seeupo.train.memory import tensor_gb

    prefixes = getattr(sampler, "_prefixes", {}) or {}
    return sum(tensor_gb([t for layer in p.kv for t in layer]) for p in prefixes.values())


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", action="store_true", help="as before issue 36: no trimming, 4096-token micro-batches")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--json", default=None)
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. optim.micro_batch_tokens=2048")
    args = ap.parse_args(argv)

    import torch  # Python with torch and transformers imported: the floor every phase stands on
    import transformers

    from seeupo.train import checkpoint, memory
    from seeupo.train.config import load_config
    from seeupo.train.trainer import Trainer

    trimming = not args.before
    if not trimming:
        memory.trim = lambda: False  # the trainer's own calls too
    python_gb = memory.rss_gb()
    out_dir = tempfile.mkdtemp(prefix="seeupo-memory-")
    over = [f"run.out={out_dir}", "run.iterations=1", "run.loggers=[jsonl]", *args.overrides]
    if args.before:
        over.append("optim.micro_batch_tokens=4096")
    cfg = load_config(args.preset, over)
    phases, held = [], {"python_torch_gb": round(python_gb, 3)}

    def phase(name, fn, *, count=False):
        memory.trim()
        memory.reset_peak()
        counter = memory.SavedActivations()
        t0 = time.perf_counter()
        if count:
            with counter.counting():
                result = fn()
        else:
            result = fn()
        seconds = time.perf_counter() - t0
        end = memory.rss_gb()
        row = {"phase": name, "peak_gb": round(memory.peak_rss_gb(), 3), "end_gb": round(end, 3),
               "seconds": round(seconds, 2)}
        if trimming:
            memory.trim()
            row["retained_gb"] = round(end - memory.rss_gb(), 3)
        if count:
            row["saved_peak_gb"] = round(counter.peak / memory.GB, 3)
            row["saved_largest_gb"] = round(counter.largest / memory.GB, 3)
        phases.append(row)
        print(f"{name:<11} {seconds:6.1f} s  peak {row['peak_gb']:.2f} GB  end {row['end_gb']:.2f} GB" +
              (f"  retained {row['retained_gb']:.2f}" if "retained_gb" in row else "") +
              (f"  saved for backward {row['saved_peak_gb']:.2f} (largest {row['saved_largest_gb']:.2f})" if count else ""),
              flush=True)
        return result

    tr = phase("load", lambda: Trainer(cfg))
    held["weights_gb"] = round(memory.tensor_gb(tr.stack.model.parameters()), 3)
    held["trainable_gb"] = round(memory.tensor_gb(tr.stack.params), 4)
    held["micro_batch_tokens"] = tr.stack.micro_batch_tokens  # the budget the run uses (fit_memory may lower it)
    if tr.stack.warmup_enabled():
        phase("warm-up", tr._warmup, count=True)
    if cfg.algo.kl_coef > 0:
        tr.updater.reference_state = checkpoint.trainable_state(tr.stack.named_params)
        held["kl_reference_gb"] = round(memory.tensor_gb(tr.updater.reference_state.values()), 4)
    phase("evaluation", tr.evaluate)
    held["sampler_kv_after_eval_gb"] = round(_kv_gb(tr.stack.sampler), 3)
    episodes = phase("rollout", lambda: tr._episodes(0))
    held["sampler_kv_after_rollout_gb"] = round(_kv_gb(tr.stack.sampler), 3)
    held["rollout_tokens"] = sum(len(e.ids) for e in episodes)
    phase("update", lambda: tr.update(episodes, 0), count=True)
    held["optimizer_gb"] = round(memory.tensor_gb(
        [t for st in tr.updater.optimizer.state.values() for t in st.values() if torch.is_tensor(t)]), 4)
    print("held: " + ", ".join(f"{k} {v}" for k, v in held.items()))
    res = {"before": args.before, "preset": args.preset, "overrides": args.overrides, "phases": phases,
           "held": held, "peak_gb": max(p["peak_gb"] for p in phases),
           "threads": torch.get_num_threads(), "transformers": transformers.__version__}
    print(f"peak over the phases: {res['peak_gb']:.2f} GB")
    return finish(res, "memory.py", argv, args.json)


if __name__ == "__main__":
    main()
