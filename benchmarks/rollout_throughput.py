"""Generated tokens per second of the batched multi-turn runner against a plain loop that runs one
episode at a time, same model, same tasks, same per-episode seeds (so the same episodes, up to float noise in the logits: the share that
match token for token is reported).

    python benchmarks/rollout_throughput.py --quick --json runs/bench/rollout.json   # 16 episodes
    python benchmarks/rollout_throughput.py --episodes 32 --json runs/bench/rollout_full.json
    python benchmarks/rollout_throughput.py --quick --vllm-python ~/vllm-env/bin/python   # + the vLLM backend

With ``--vllm-python`` the same batch of episodes also runs through the vLLM backend (the engine's
start and a first batch untimed) and the JSON gains ``vllm_tok_per_s`` and ``vllm_over_hf``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import finish  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 episodes, max 24 new tokens per turn")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--vllm-python", default=None, help="a Python with vLLM: also time the vLLM backend")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    new_tokens = args.max_new_tokens or (24 if args.quick else 40)

    from seeupo.data.episode import derive_seed
    from seeupo.rollout.runner import run_episodes
    from seeupo.train.config import load_config
    from seeupo.train.trainer import Trainer

    overrides = [f"model.name={args.model}", "warmup.enabled=off", "run.loggers=[]",
                 "run.out=/tmp/seeupo-bench", f"rollout.max_new_tokens={new_tokens}"]
    cfg = load_config("default", overrides)
    tr = Trainer(cfg)
    tasks = tr.stack.family.tasks("train")
    jobs = [(tasks[i % len(tasks)], i, 0, derive_seed(11, i)) for i in range(args.episodes)]

    def run(batch, tr=tr):
        t0 = time.perf_counter()
        with torch.no_grad():
            eps = [e for b in batch for e in run_episodes(tr.stack.sampler, tr.stack.chat, tr.stack.family, b, tr.stack.limits)]
        return time.perf_counter() - t0, eps

    run([jobs[:2]])  # warm-up, untimed
    t_batched, batched = run([jobs])
    t_loop, looped = run([[j] for j in jobs])
    tr.stack.sampler.prefix_cache = False  # the batched runner again, every turn pre-filling the whole history
    t_nocache, _ = run([jobs])
    tr.stack.sampler.prefix_cache = True
    same = sum(a.ids == b.ids for a, b in zip(batched, looped)) / len(jobs)  # float noise may flip a rare draw
    tokens = sum(sum(e.gen_mask) for e in batched)
    out = {"model": args.model, "episodes": args.episodes, "generated_tokens": tokens,
           "batched_s": t_batched, "loop_s": t_loop,
           "batched_tok_per_s": tokens / t_batched, "loop_tok_per_s": tokens / t_loop,
           "speedup": t_loop / t_batched, "identical_episodes": same,
           "batched_without_prefix_cache_s": t_nocache, "prefix_cache_speedup": t_nocache / t_batched}
    print(f"{args.episodes} episodes, {tokens} generated tokens: batched {out['batched_tok_per_s']:.0f} tok/s, "
          f"one at a time {out['loop_tok_per_s']:.0f} tok/s, speedup {out['speedup']:.2f}x; "
          f"identical episodes: {same:.0%}; the batched runner without the prefix cache "
          f"(rollout.prefix_cache=false) takes {out['prefix_cache_speedup']:.2f}x as long")
    if args.vllm_python:
        tv = Trainer(load_config("default", overrides + ["rollout.backend=vllm",
                                                         f"rollout.vllm_python={args.vllm_python}"]))
        try:
            t0 = time.perf_counter()
            tv.stack.sync_sampler()  # engine start (and the adapter), untimed
            run([jobs], tv)  # a first batch, untimed
            out["vllm_start_s"] = time.perf_counter() - t0
            t_vllm, eps = run([jobs], tv)
        finally:
            tv.close()
        v_tokens = sum(sum(e.gen_mask) for e in eps)
        out.update({"vllm_s": t_vllm, "vllm_generated_tokens": v_tokens, "vllm_tok_per_s": v_tokens / t_vllm,
                    "vllm_over_hf": (v_tokens / t_vllm) / out["batched_tok_per_s"]})
        print(f"vLLM backend: {v_tokens} generated tokens, {out['vllm_tok_per_s']:.0f} tok/s "
              f"({out['vllm_over_hf']:.2f}x the batched HF runner; engine start and first batch "
              f"{out['vllm_start_s']:.0f} s, untimed)")
    return finish(out, "rollout_throughput.py", argv, args.json)


if __name__ == "__main__":
    main()
