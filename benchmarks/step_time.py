"""Learner time per iteration on identical stored rollouts: SeeUPO vs GRPO (turn rows and trajectory
rows) vs the ``authors_code`` preset, side by side in one process.

    python benchmarks/step_time.py --quick --json runs/bench/step_time.json   # under 2 minutes
    python benchmarks/step_time.py --json runs/bench/step_time_full.json       # SmolLM2-135M + LoRA

The rollouts are generated once (answer-blind demonstration episodes of the lookup tasks with 1-3
lookups: 2-5 turns, so episode lengths are mixed), their sampling log-probs are scored under the
initial model, and every variant then runs ``Trainer.update`` on the same episodes from the same
initial parameters. Variants run interleaved after one untimed round, the order rotating from round to
round (A B C D, B C D A, ...: no variant always runs right after the same one), and the median per
variant is reported. The JSON holds the ratios ``seeupo_over_grpo_turn``,
``seeupo_over_grpo_traj`` and ``authors_over_seeupo``, plus the rows and tokens each variant processed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import finish, reset  # noqa: E402

# GRPO takes one optimizer step per iteration here, the schedule docs/performance.md's figures were
# measured with (the default preset's matched GRPO takes one per turn index; add algo.minibatches=turns)
VARIANTS = {
    "seeupo": ("default", ["algo.name=seeupo"]),
    "grpo_turn": ("default", ["algo.name=grpo", "algo.rows=turn", "algo.minibatches=1"]),
    "grpo_traj": ("default", ["algo.name=grpo", "algo.rows=trajectory", "algo.minibatches=1"]),
    "authors_code": ("authors_code", []),
}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 6 timed rounds (under 2 minutes)")
    ap.add_argument("--model", default=None, help="model (default: tiny-random:8x256 quick, smollm2-135m-instruct full)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 6 quick, 3 full)")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--pack-width", type=int, default=0,
                    help="also time SeeUPO and GRPO with optim.pack_width=N (rows packed end to end)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time, per update, the fused continuation (SeeUPO's factor pass) and the LM head")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    variants = dict(VARIANTS)
    if args.pack_width:
        for n in ("seeupo", "grpo_turn", "grpo_traj"):
            preset, extra = VARIANTS[n]
            variants[n + "_packed"] = (preset, extra + [f"optim.pack_width={args.pack_width}"])
    # the quick model's LM head is a realistic share of its compute (SmolLM2's is about that of
    # tiny-random:8x256, issue 16); the 4x128 model of before spent most of its time in the head
    model = args.model or ("tiny-random:8x256" if args.quick else "smollm2-135m-instruct")
    rounds = args.rounds or (6 if args.quick else 3)

    from seeupo.data.episode import derive_seed, trajectory_rows
    from seeupo.rollout.runner import run_episodes
    from seeupo.rollout.sampler import ScriptedPolicy
    from seeupo.train.config import load_config
    from seeupo.train.learner import score
    from seeupo.train.trainer import Trainer

    common = [f"model.name={model}", f"model.lora={'false' if model.startswith('tiny') else 'true'}",
              "env.options={hops_min: 1, hops_max: 3, n_keys: 5}", "rollout.max_turns=5",
              f"rollout.tasks_per_iteration={args.tasks}", f"rollout.group_size={args.group}",
              "warmup.enabled=off", "run.loggers=[]", "run.out=/tmp/seeupo-bench"]
    trainers = {name: Trainer(load_config(preset, common + extra)) for name, (preset, extra) in variants.items()}
    base = trainers["seeupo"]
    init = {n: p.detach().clone() for n, p in base.stack.named_params}

    # identical stored rollouts for every variant
    tasks = base.stack.family.tasks("train")[: args.tasks]
    jobs = [(t, i, g, derive_seed(7, t.id, g)) for i, t in enumerate(tasks) for g in range(args.group)]
    demo = ScriptedPolicy(lambda env, rng: env.demo_action(rng), base.stack.chat.encode, base.stack.chat.eos_id)
    episodes = run_episodes(demo, base.stack.chat, base.stack.family, jobs, base.stack.limits)
    rows = trajectory_rows(episodes, base.stack.tokenizer.pad_token_id)
    logp, _ = score(base.stack.model, rows, temperature=1.0, budget_tokens=4096)
    for i, e in enumerate(episodes):
        e.logp = [float(x) if m else 0.0 for x, m in zip(logp[i, : len(e.ids)].tolist(), e.gen_mask)]
    turns = [e.n_turns for e in episodes]

    parts: dict = {}
    if args.breakdown:
        _time_parts(parts)

    def one(name: str) -> tuple[float, dict]:
        tr = trainers[name]
        reset(tr, init)
        parts.clear()
        t0 = time.perf_counter()
        rec = tr.update(episodes, 0)
        rec["_parts"] = dict(parts)
        return time.perf_counter() - t0, rec

    times = {name: [] for name in variants}
    split = {name: [] for name in variants}
    records = {}
    names = list(variants)
    for r in range(rounds + 1):  # round 0 is untimed
        this = {}
        for name in names[r % len(names):] + names[: r % len(names)]:
            dt, rec = one(name)
            this[name] = dt
            if r:
                times[name].append(dt)
                split[name].append(rec.pop("_parts"))
            records[name] = rec
        print(f"round {r}/{rounds}{' (untimed)' if r == 0 else ''}: "
              + "  ".join(f"{n} {this[n]:.2f} s" for n in names), file=sys.stderr, flush=True)
    med = {n: statistics.median(v) for n, v in times.items()}
    out = {
        "model": model, "episodes": len(episodes), "turns_per_episode": {str(k): turns.count(k) for k in sorted(set(turns))},
        "rounds": rounds, "seconds_median": med, "seconds_all": times,
        "optimizer_steps": {n: r.get("optimizer_steps") for n, r in records.items()},
        "seeupo_over_grpo_turn": med["seeupo"] / med["grpo_turn"],
        "seeupo_over_grpo_traj": med["seeupo"] / med["grpo_traj"],
        "authors_over_seeupo": med["authors_code"] / med["seeupo"],
    }
    if args.breakdown:
        keys = ("continuation", "continuation_lm_head", "lm_head_forward")
        out["breakdown_median_s"] = {n: {k: statistics.median(d.get(k, 0.0) for d in split[n]) for k in keys}
                                     for n in variants}
    if args.pack_width:
        out["pack_width"] = args.pack_width
        out["packed_over_padded"] = {n: med[n + "_packed"] / med[n] for n in ("seeupo", "grpo_turn", "grpo_traj")}
    print(f"model {model}, {len(episodes)} episodes, turns per episode {out['turns_per_episode']}, "
          f"{rounds} timed rounds")
    for n in variants:
        print(f"  {n:16s} median {med[n]:7.2f} s   steps {out['optimizer_steps'][n]}")
    print(f"  SeeUPO / GRPO(turn rows) = {out['seeupo_over_grpo_turn']:.2f}   SeeUPO / GRPO(trajectory rows) = "
          f"{out['seeupo_over_grpo_traj']:.2f}   authors_code / SeeUPO = {out['authors_over_seeupo']:.2f}")
    if args.breakdown:
        for n, d in out["breakdown_median_s"].items():
            print(f"  {n:16s} continuation {d['continuation']:.3f} s (its LM head {d['continuation_lm_head']:.3f} s), "
                  f"LM head forwards in all {d['lm_head_forward']:.3f} s per update")
    if args.pack_width:
        print(f"  packed (width {args.pack_width}) / padded: "
              + "   ".join(f"{n} {r:.2f}" for n, r in out["packed_over_padded"].items()))
    return finish(out, "step_time.py", argv, args.json)


def _time_parts(parts: dict) -> None:
    """Wrap the fused continuation and the LM head with timers that add into ``parts``."""
    import seeupo.models.policy as policy

    cont, head = policy._continue, policy.head_logprobs
    inside = [False]

    def timed_cont(*a, **k):
        inside[0], t0 = True, time.perf_counter()
        try:
            return cont(*a, **k)
        finally:
            inside[0] = False
            parts["continuation"] = parts.get("continuation", 0.0) + time.perf_counter() - t0

    def timed_head(*a, **k):
        t0 = time.perf_counter()
        out = head(*a, **k)
        dt = time.perf_counter() - t0
        parts["lm_head_forward"] = parts.get("lm_head_forward", 0.0) + dt
        if inside[0]:
            parts["continuation_lm_head"] = parts.get("continuation_lm_head", 0.0) + dt
        return out

    policy._continue, policy.head_logprobs = timed_cont, timed_head


if __name__ == "__main__":
    main()
