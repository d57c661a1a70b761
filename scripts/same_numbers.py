"""Does a change keep every run bit-identical? Runs each algorithm (and the estimator, row, order and
ratio variants the trainer dispatches on) for two iterations of the tiny preset from one source tree,
and records each run's trainable-parameter digest and a digest of its metrics without timings.

    python scripts/same_numbers.py --tree DIR --out before.json   # DIR: a copy of the old seeupo/
    python scripts/same_numbers.py --tree . --out after.json
    python scripts/same_numbers.py --compare before.json after.json

Two records are comparable when they come from one machine at one thread count (floating-point
kernels differ between CPU kinds); ``--compare`` says which runs differ and exits non-zero if any does.
The refactor of issue 59 was checked this way (results/same_numbers/)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMING = ("time", "seconds", "wall")
# (label, overrides): every algorithm, then the variants Updater dispatches on
RUNS = [(name, [f"algo.name={name}"]) for name in (
    "ppo", "grpo", "gspo", "rloo", "reinforce", "gigpo", "mt-grpo", "grpo-togo", "turn-ppo", "seeupo",
    "seeupo-natural", "seeupo-random")] + [
    ("seeupo+gigpo", ["algo.name=seeupo", "algo.estimator=gigpo"]),
    ("seeupo+turn_grae", ["algo.name=seeupo", "algo.estimator=turn_grae"]),
    ("seeupo+grae_to_go", ["algo.name=seeupo", "algo.estimator=grae_to_go"]),
    ("grpo+rows=turn", ["algo.name=grpo", "algo.rows=turn"]),
    ("grpo+order=reverse", ["algo.name=grpo", "algo.order=reverse", "algo.schedules.grpo.minibatches=1"]),
    ("seeupo+buckets", ["algo.name=seeupo", "algo.order=buckets:1"]),
    ("seeupo+placeholders", ["algo.name=seeupo", "algo.placeholders=true"]),
    ("seeupo+incremental", ["algo.name=seeupo", "algo.ratio_reference=incremental"]),
    ("seeupo+from_end", ["algo.name=seeupo", "algo.turn_alignment=from_end"]),
    ("seeupo+last1", ["algo.name=seeupo", "algo.update_turns=last:1"]),
    ("gigpo+episode", ["algo.name=gigpo", "algo.episode_norm=episode", "algo.advantage_clip=1.0"]),
]
SHORT = ["eval.tasks=4", "eval.k=1", "run.loggers=[jsonl]"]  # the preset's warm-up (computed once: warmup.cache)


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if not any(t in k for t in TIMING)}
    return x


def run_one(tree: Path, overrides: list[str], out: Path, cache: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "seeupo.cli", "train", "--preset", "tiny", "--steps", "2", "--seed", "0",
           "--out", str(out), *SHORT, f"warmup.cache={cache}", *overrides]
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        return {"error": p.stderr[-2000:]}
    lines = [_strip(json.loads(x)) for x in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    steps = [x.get("optimizer_steps", 0) for x in lines if "reward_mean" in x]
    signal = [x.get("groups_with_signal", 0) for x in lines if "reward_mean" in x]
    return {"trainable_param_sha256": summary["trainable_param_sha256"], "optimizer_steps": steps,
            "groups_with_signal": signal,
            "metrics_sha256": hashlib.sha256(json.dumps(lines, sort_keys=True).encode()).hexdigest(),
            "eval_after": summary.get("eval_after")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, help="the source tree to run (its seeupo/ package)")
    ap.add_argument("--out", type=Path, help="the record to write (resumed: runs already in it are kept)")
    ap.add_argument("--only", nargs="*", help="labels to run (default: all)")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    a = ap.parse_args(argv)
    if a.compare:
        x, y = (json.loads(p.read_text()) for p in a.compare)
        bad = []
        for label in x["runs"]:
            same = x["runs"][label] == y["runs"].get(label)
            bad += [] if same else [label]
            print(f"{'same' if same else 'DIFFERENT':9s} {label}")
        print(f"{len(x['runs']) - len(bad)} of {len(x['runs'])} runs identical")
        return 1 if bad else 0
    rec = json.loads(a.out.read_text()) if a.out.exists() else {
        "machine": platform.processor() or platform.machine(), "cpu_flags_avx512": "avx512f" in Path("/proc/cpuinfo").read_text(),
        "threads": 1, "command": " ".join(["seeupo train --preset tiny --steps 2 --seed 0", *SHORT]), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for label, over in RUNS:
            if (a.only and label not in a.only) or label in rec["runs"]:
                continue
            t0 = time.time()
            rec["runs"][label] = run_one(a.tree.resolve(), over, Path(tmp) / label.replace("+", "_").replace("=", "_"),
                                         Path(tmp) / "warmup-cache")
            print(f"{label}: {rec['runs'][label].get('trainable_param_sha256', 'ERROR')[:16]} ({time.time() - t0:.0f} s)",
                  flush=True)
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
