"""The example agent's rollouts through the run's endpoint (`seeupo train --agent`) against the built-in
runner on the same tasks and per-episode seeds, side by side in one process, rounds interleaved.

    python benchmarks/agent_overhead.py --quick --json runs/bench/agent_overhead_quick.json   # ~2 min
    python benchmarks/agent_overhead.py --json runs/bench/agent_overhead.json
    python benchmarks/agent_overhead.py --model smollm2-135m-instruct --rounds 5 --http   # ~8 min

An untimed round of 8 episodes runs each path first. The policy is the tiny preset's after a short
format warm-up (so episodes take their 2 turns as in training); both sources sample from one model.
(The example agent mirrors the tiny preset's `lookup` options, not the default preset's, so the two
paths run the same episodes only on the tiny preset's tasks; `--model` keeps those tasks and swaps the
model, e.g. for the default preset's SmolLM2-135M with LoRA.) `--http` also times the agents over a
socket (`serve.transport=http`: a second endpoint on the same sampler) each round, beside the run's
in-process transport. Reported: the seconds of each source per round, the
ratio agent / built-in (median over rounds), the requests per sampler call the endpoint batched,
and the share of episodes whose sampled ids equal the built-in runner's, turn by turn (same seeds;
the agent's prompts are rendered from its messages, so where they differ from the built-in runner's
stream the samples may too).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import finish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXTRA = [a for a in os.environ.get("BENCH_OVERRIDES", "").split() if a]


def _sampled(e) -> list[list[int]]:
    """An episode's sampled ids, turn by turn (the built-in runner's stream and the agent's segments differ
    around them: the agent's prompts are rendered from its messages, with the tool list)."""
    return [[i for i, m, t in zip(e.ids, e.gen_mask, e.turn_of) if m and t == k] for k in range(e.n_turns)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="32 episodes, 2 rounds")
    ap.add_argument("--episodes", type=int, default=64, help="episodes per round (tasks x 8)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--model", default=None, help="another model than the tiny preset's (with LoRA), the "
                    "tiny preset's lookup tasks kept: e.g. smollm2-135m-instruct, the default preset's")
    ap.add_argument("--http", action="store_true", help="also time the agents over a local socket "
                    "(serve.transport=http) each round, beside the run's in-process transport")
    args = ap.parse_args(argv)
    episodes, rounds = (32, 2) if args.quick else (args.episodes, args.rounds)

    from seeupo.data.episode import derive_seed
    from seeupo.rollout.runner import run_episodes
    from seeupo.train.config import load_config
    from seeupo.train.trainer import Trainer

    cfg = load_config("tiny", ["warmup.episodes=128", "warmup.epochs=3", "run.loggers=[]", "run.iterations=0",
                               "run.out=/tmp/seeupo-bench-agent",
                               *([f"model.name={args.model}", "model.lora=true"] if args.model else []), *EXTRA, f"rollout.agent={ROOT}/examples/agents/lookup_agent.py:run"])
    tr = Trainer(cfg, overwrite=True)
    tr._warmup()
    tasks = tr.stack.family.tasks("train")
    group = 8
    out: dict = {"episodes": episodes, "rounds": rounds, "model": cfg.model.name, "transport": cfg.serve.transport,
                 "rounds_s": []}
    warm = [(tasks[i], i, 0, derive_seed(4, i)) for i in range(8)]  # untimed: first calls of both paths
    with torch.no_grad():
        run_episodes(tr.stack.sampler, tr.stack.chat, tr.stack.family, warm, tr.stack.limits)
    http = None
    if args.http:  # a second endpoint on the same sampler, over a socket
        http = tr.stack._agent_source(transport="http")
        tr.stack.sampler.retain = http.engine.recorder.is_open
        http.run(warm)
    tr.stack.sampler.retain = tr.stack.agent.engine.recorder.is_open  # (one sampler, the endpoint that runs keeps its prefixes)
    tr.stack.agent.run(warm)
    for r in range(rounds):
        jobs = [(tasks[(r * 97 + i // group) % len(tasks)], i // group, i % group, derive_seed(5, r, i))
                for i in range(episodes)]
        pre0 = tr.stack.sampler.prefilled_tokens
        t0 = time.perf_counter()
        with torch.no_grad():
            built_in = run_episodes(tr.stack.sampler, tr.stack.chat, tr.stack.family, jobs, tr.stack.limits)
        t_builtin = time.perf_counter() - t0
        pre1 = tr.stack.sampler.prefilled_tokens
        batches0, requests0, sampling0 = tr.stack.agent.engine.batches, tr.stack.agent.engine.requests, tr.stack.agent.engine.sample_seconds
        t0 = time.perf_counter()
        agent = tr.stack.agent.run(jobs)
        t_agent = time.perf_counter() - t0
        pre2 = tr.stack.sampler.prefilled_tokens
        if http is not None:
            tr.stack.sampler.retain = http.engine.recorder.is_open
            t0 = time.perf_counter()
            over_http = http.run(jobs)
            t_http = time.perf_counter() - t0
            tr.stack.sampler.retain = tr.stack.agent.engine.recorder.is_open
        per_batch = (tr.stack.agent.engine.requests - requests0) / max(tr.stack.agent.engine.batches - batches0, 1)
        same = sum(_sampled(a) == _sampled(b) for a, b in zip(agent, built_in)) / len(jobs)
        in_sampler = tr.stack.agent.engine.sample_seconds - sampling0
        out["rounds_s"].append({"built_in": t_builtin, "agent": t_agent, "agent_in_sampler": in_sampler,
                                "requests_per_batch": per_batch,
                                "identical_episodes": same,
                                "prefilled_built_in": pre1 - pre0, "prefilled_agent": pre2 - pre1,
                                "success_built_in": sum(e.score >= 1 for e in built_in) / len(jobs),
                                "success_agent": sum(e.score >= 1 for e in agent) / len(jobs)})
        if http is not None:
            out["rounds_s"][-1].update(agent_http=t_http, identical_http=sum(
                _sampled(a) == _sampled(b) for a, b in zip(over_http, built_in)) / len(jobs))
            print(f"round {r}: agents over http {t_http:.2f} s ({t_http / t_builtin:.2f}x)", flush=True)
        print(f"round {r}: built-in {t_builtin:.2f} s, agent {t_agent:.2f} s ({t_agent / t_builtin:.2f}x), "
              f"of which {in_sampler:.2f} s in the sampler, {per_batch:.1f} requests per sampler call, "
              f"identical episodes {same:.0%}, prefilled tokens {pre1 - pre0} / {pre2 - pre1}", flush=True)
    tr.close()
    ratios = [x["agent"] / x["built_in"] for x in out["rounds_s"]]
    out["ratio_median"] = statistics.median(ratios)
    print(f"agent / built-in: median {out['ratio_median']:.2f}x over {rounds} rounds of {episodes} episodes "
          f"({cfg.serve.transport} transport)")
    if http is not None:
        http.close()
        out["ratio_median_http"] = statistics.median(x["agent_http"] / x["built_in"] for x in out["rounds_s"])
        print(f"agents over http / built-in: median {out['ratio_median_http']:.2f}x")
    return finish(out, "agent_overhead.py", argv, args.json)


if __name__ == "__main__":
    main()
