"""SeeUPO and GRPO learner time per iteration as episodes get longer (2, 4, 8, 16 turns) and as the
mix of episode lengths changes, on synthetic stored episodes (fixed-size turns, random ids):
SeeUPO's exact reverse schedule (one phase per turn) and its bucketed schedules (``buckets:2``,
``buckets:4``) against GRPO on trajectory rows (keys ``reverse_over_grpo_traj_T``,
``buckets2_over_grpo_traj_T``, ``buckets4_over_grpo_traj_T``).

    python benchmarks/turn_scaling.py --quick --json runs/bench/turn_scaling.json   # under 2 minutes
    python benchmarks/turn_scaling.py --json runs/bench/turn_scaling_full.json       # SmolLM2-135M + LoRA

For each setting it reports the rows in each SeeUPO turn pool, the tokens of the episodes
(``trajectory_tokens``) and the tokens the turn pools hold (``turn_row_tokens``: turn ``t``'s row is
the stream up to the end of turn ``t``, so this grows about quadratically with the number of turns),
and fits log-log slopes of SeeUPO's time against both. Variants run interleaved, median of the
timed rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import finish, loglog_slope, reset, score_sampling_logp, synthetic_episodes  # noqa: E402

# GRPO with one optimizer step per iteration on trajectory rows, as docs/performance.md measured it;
# SeeUPO's exact reverse schedule and its bucketed schedules (algo.order=buckets:B, issue 16)
VARIANTS = {"seeupo": ["algo.name=seeupo"], "grpo": ["algo.name=grpo", "algo.rows=trajectory", "algo.minibatches=1"],
            "buckets2": ["algo.name=seeupo", "algo.order=buckets:2"],
            "buckets4": ["algo.name=seeupo", "algo.order=buckets:4"]}


def settings(quick: bool) -> dict[str, list[int]]:
    """name -> turn count per episode (16 episodes, 4 tasks x 4; quick: 8, 2 tasks x 4)."""
    fixed = {f"all_{T}": [T] * (8 if quick else 16) for T in (2, 4, 8, 16)}
    mixed = {"mixed_1_16": [1 + (i * 5) % 16 for i in range(16)],  # lengths spread over 1..16
             "mostly_short_16": [2] * 12 + [16] * 4}  # a few long episodes among short ones
    return fixed if quick else {**fixed, **mixed}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 8 episodes of fixed lengths, 1 timed round")
    ap.add_argument("--model", default=None, help="default: tiny-random:4x128 quick, smollm2-135m-instruct full")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    model = args.model or ("tiny-random:4x128" if args.quick else "smollm2-135m-instruct")
    rounds = args.rounds or (1 if args.quick else 3)

    from seeupo.data.episode import trajectory_rows, turn_rows
    from seeupo.train.config import load_config
    from seeupo.train.trainer import Trainer

    common = [f"model.name={model}", f"model.lora={'false' if model.startswith('tiny') else 'true'}",
              "rollout.max_turns=16", "rollout.max_context=4096", "warmup.enabled=off", "run.loggers=[]",
              "run.out=/tmp/seeupo-bench"]
    trainers = {n: Trainer(load_config("default", common + extra)) for n, extra in VARIANTS.items()}
    base = trainers["seeupo"]
    pad = base.stack.tokenizer.pad_token_id
    init = {n: p.detach().clone() for n, p in base.stack.named_params}

    results = {}
    for name, lengths in settings(args.quick).items():
        episodes = synthetic_episodes(lengths, vocab=len(base.stack.tokenizer))
        score_sampling_logp(base.stack.model, episodes, pad)
        pools = turn_rows(episodes, pad)
        times = {v: [] for v in VARIANTS}
        for r in range(rounds + 1):  # round 0 untimed
            for v, tr in trainers.items():
                reset(tr, init)
                t0 = time.perf_counter()
                tr.update(episodes, 0)
                if r:
                    times[v].append(time.perf_counter() - t0)
        results[name] = {
            "turns": lengths,
            "rows_per_pool": {str(t): int((pools.turn == t).sum()) for t in sorted(set(pools.turn.tolist()))},
            "trajectory_tokens": int(trajectory_rows(episodes, pad).attention_mask.sum()),
            "turn_row_tokens": int(pools.attention_mask.sum()),
            "seconds_median": {v: statistics.median(t) for v, t in times.items()},
        }
        m = results[name]["seconds_median"]
        results[name]["over_grpo_traj"] = {v: m[v] / m["grpo"] for v in VARIANTS if v != "grpo"}
        print(f"{name:16s} traj tokens {results[name]['trajectory_tokens']:6d}  turn-row tokens "
              f"{results[name]['turn_row_tokens']:7d}  SeeUPO {m['seeupo']:6.2f} s  GRPO {m['grpo']:6.2f} s  "
              f"over GRPO(traj): reverse {m['seeupo'] / m['grpo']:.2f}, buckets:2 {m['buckets2'] / m['grpo']:.2f}, "
              f"buckets:4 {m['buckets4'] / m['grpo']:.2f}")
    names = list(results)
    t_see = [results[n]["seconds_median"]["seeupo"] for n in names]
    out = {
        "model": model, "rounds": rounds, "settings": results,
        "slope_seeupo_vs_turn_row_tokens": loglog_slope([results[n]["turn_row_tokens"] for n in names], t_see),
        "slope_seeupo_vs_trajectory_tokens": loglog_slope([results[n]["trajectory_tokens"] for n in names], t_see),
        "slope_grpo_vs_trajectory_tokens": loglog_slope([results[n]["trajectory_tokens"] for n in names],
                                                        [results[n]["seconds_median"]["grpo"] for n in names]),
    }
    for T in (2, 4, 8, 16):
        if f"all_{T}" in results:
            for v in ("seeupo", "buckets2", "buckets4"):
                key = "reverse" if v == "seeupo" else v
                out[f"{key}_over_grpo_traj_{T}"] = results[f"all_{T}"]["over_grpo_traj"][v]
    print(f"log-log slopes: SeeUPO time vs turn-row tokens {out['slope_seeupo_vs_turn_row_tokens']:.2f}, "
          f"vs trajectory tokens {out['slope_seeupo_vs_trajectory_tokens']:.2f}; GRPO time vs trajectory tokens "
          f"{out['slope_grpo_vs_trajectory_tokens']:.2f}")
    return finish(out, "turn_scaling.py", argv, args.json)


if __name__ == "__main__":
    main()
