"""One iteration's update of the default run (``seeupo train``'s config: SeeUPO with the KL
reference, turn rows, SmolLM2-135M + LoRA on ``lookup``), with and without running shared prefixes
once (``optim.share_prefix``), on the same episodes from the same parameters.

    python benchmarks/default_update.py --quick --json runs/bench/default_update_quick.json  # tiny model, ~1 min
    python benchmarks/default_update.py --json runs/bench/default_update.json               # the default model, ~12 min
    python benchmarks/default_update.py --gather --json runs/bench/default_update_gather.json  # issue 32's check
    python benchmarks/default_update.py --budgets 4096,2048,1024 --json runs/bench/default_update_budgets.json  # issue 36

``--gather``: both passes share prefixes; they differ in how rows are picked from the shared levels'
hidden states and KV cache: ``index_select`` (since issue 32: a backward that sums a shared
position's gradients in index order, so a run reproduces itself at any thread count) against
advanced indexing (before: its backward's order depends on thread scheduling).

The episodes are the default run's first iteration: 8 tasks x 4 samples rolled out by the policy
after the format warm-up (``--no-warmup``: by the untrained policy). ``Trainer.update`` is timed
(the reference pass, every turn phase's optimizer step, the fused factor passes), rounds
interleaved, the median reported; ``turn_row_tokens`` counts every turn row's real tokens (prefixes
included), the work an unshared update runs. The two passes must agree up to rounding: the
log-probs of the first 24 turn rows scored both ways (``logp_max_abs_diff``; the parameters after
the update are no check, since Adam's first step normalises each gradient entry, so entries that
are rounding noise move by the learning rate).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import finish, reset  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny random model (8 layers x 256), no warm-up")
    ap.add_argument("--model", default=None, help="default: tiny-random:8x256 quick, smollm2-135m-instruct full")
    ap.add_argument("--no-warmup", action="store_true", help="roll out the untrained policy")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gather", action="store_true",
                    help="time index_select against advanced indexing (both sharing prefixes) instead of shared "
                         "against unshared")
    ap.add_argument("--budgets", default=None,
                    help="e.g. 4096,1024: time the update at these micro-batch token budgets (shared prefixes) "
                         "instead of shared against unshared, with the peak resident memory of each")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    model_name = args.model or ("tiny-random:8x256" if args.quick else "smollm2-135m-instruct")
    warm = not (args.quick or args.no_warmup)

    from seeupo.data.episode import turn_rows
    from seeupo.train.config import load_config
    from seeupo.train.learner import score
    from seeupo.train.trainer import Trainer

    out_dir = tempfile.mkdtemp(prefix="seeupo-bench-")
    cfg = load_config("default", [f"model.name={model_name}", f"model.lora={'false' if model_name.startswith('tiny') else 'true'}",
                                  f"warmup.enabled={'on' if warm else 'off'}", "run.loggers=[]", f"run.out={out_dir}"])
    tr = Trainer(cfg)
    t0 = time.perf_counter()
    if warm:
        tr._warmup()
    t_warm = time.perf_counter() - t0
    init = {n: p.detach().clone() for n, p in tr.stack.named_params}
    reset(tr, init)
    t0 = time.perf_counter()
    episodes = tr._episodes(0)
    t_roll = time.perf_counter() - t0
    rows = turn_rows(episodes, tr.stack.tokenizer.pad_token_id)
    tokens = int(rows.attention_mask.sum())

    records = {}
    from seeupo.models import policy

    take = policy.take_rows

    def timed(share: bool, gather=take) -> float:
        reset(tr, init)
        tr.cfg.optim.share_prefix = share
        policy.take_rows = gather
        t = time.perf_counter()
        records[share] = tr.update(episodes, 0)
        policy.take_rows = take
        return time.perf_counter() - t

    if args.budgets:
        from seeupo.train import memory

        budgets = [int(b) for b in args.budgets.split(",")]
        times, peaks = {b: [] for b in budgets}, {b: [] for b in budgets}
        for r in range(args.rounds):
            for b in budgets:
                tr.stack.micro_batch_tokens = b  # the budget the learner reads (the stack's own)
                memory.trim()
                memory.reset_peak()
                times[b].append(timed(True))
                peaks[b].append(memory.peak_rss_gb())
        med = {b: statistics.median(v) for b, v in times.items()}
        out = {"model": model_name, "warmup": warm, "episodes": len(episodes), "turn_rows": len(rows),
               "turn_row_tokens": tokens, "seconds_median": {str(b): v for b, v in med.items()},
               "seconds_all": {str(b): v for b, v in times.items()},
               "peak_rss_gb": {str(b): max(v) for b, v in peaks.items()},
               "over_first": {str(b): med[b] / med[budgets[0]] for b in budgets}, "threads": torch.get_num_threads()}
        for b in budgets:
            print(f"micro_batch_tokens {b}: update {med[b]:.1f} s ({med[b] / med[budgets[0]]:.3f}x of {budgets[0]}), "
                  f"peak resident {max(peaks[b]):.2f} GB")
        return finish(out, "default_update.py", argv, args.json)
    if args.gather:
        times = {"index_select": [], "advanced": []}
        for r in range(args.rounds):
            for name, g in (("advanced", lambda x, i: x[i]), ("index_select", take)):
                times[name].append(timed(True, g))
        med = {k: statistics.median(v) for k, v in times.items()}
        out = {"model": model_name, "warmup": warm, "episodes": len(episodes), "turn_rows": len(rows),
               "turn_row_tokens": tokens, "seconds_median": med, "seconds_all": times,
               "index_select_over_advanced": med["index_select"] / med["advanced"], "threads": torch.get_num_threads()}
        print(f"{model_name}: {len(rows)} turn rows, shared prefixes; update with index_select {med['index_select']:.2f} s, "
              f"advanced indexing {med['advanced']:.2f} s: ratio {out['index_select_over_advanced']:.3f} "
              f"({torch.get_num_threads()} threads)")
        return finish(out, "default_update.py", argv, args.json)
    times = {"unshared": [], "shared": []}
    for r in range(args.rounds):
        for name, share in (("unshared", False), ("shared", True)):
            times[name].append(timed(share))
    med = {k: statistics.median(v) for k, v in times.items()}
    reset(tr, init)
    sub = rows.select(torch.arange(min(24, len(rows))))
    lp = {share: score(tr.stack.learner_model, sub, temperature=1.0, budget_tokens=tr.stack.micro_batch_tokens, share=share)[0]
          for share in (False, True)}
    gap = float(((lp[True] - lp[False]).abs() * sub.loss_mask).max())
    out = {"model": model_name, "warmup": warm, "episodes": len(episodes),
           "turns_mean": sum(e.n_turns for e in episodes) / len(episodes), "turn_rows": len(rows),
           "turn_row_tokens": tokens, "seconds_median": med, "seconds_all": times,
           "unshared_tok_per_s": tokens / med["unshared"], "shared_tok_per_s": tokens / med["shared"],
           "shared_speedup": med["unshared"] / med["shared"],
           "logp_max_abs_diff": gap, "warmup_s": t_warm, "rollout_s": t_roll,
           "threads": torch.get_num_threads()}
    print(f"{model_name}: {len(episodes)} episodes, {len(rows)} turn rows, {tokens} turn-row tokens; update "
          f"unshared {med['unshared']:.1f} s ({out['unshared_tok_per_s']:.0f} tok/s), shared {med['shared']:.1f} s "
          f"({out['shared_tok_per_s']:.0f} tok/s): {out['shared_speedup']:.2f}x; log-probs agree to {gap:.1e}")
    return finish(out, "default_update.py", argv, args.json)


if __name__ == "__main__":
    main()
