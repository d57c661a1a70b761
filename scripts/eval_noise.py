"""How much of the seed-to-seed spread of a TextWorld score is the evaluation's own sampling noise
(issue 58): one checkpoint scored again and again with different sampling seeds, under the former
evaluation of the textworld preset (16 test games from index 0, 2 samples each) and the current one
(64 games from index 16, 4 samples each).

    .venv/bin/python scripts/eval_noise.py RUN_DIR --repeats 5 --out results/eval_noise/NAME.json

Each repeat is ``seeupo eval --checkpoint RUN_DIR`` with ``run.seed`` set to 1000 + r (the seed that
draws every sampled token of the evaluation); the checkpoint, the games and the model are fixed, so
the spread of the repeats is the evaluation's sampling noise. The JSON keeps every repeat's
``eval.json`` (per-task outcomes included). ``share``: that noise's variance over the between-seed
variance of the experiment's scores, which ``--between`` gives (a records folder and an arm: the
variance of that arm's final scores over seeds, under the evaluation those records used).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVALS = {
    "former (16 x 2, games 0-15)": ["env.options.test_from=0", "env.options.test_tasks=16", "--k", "2", "--max-tasks", "16"],
    "current (64 x 4, games 16-79)": ["env.options.test_from=16", "env.options.test_tasks=64", "--k", "4",
                                      "--max-tasks", "64"],
}


def score(run: Path, seed: int, args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        opts = [a for a in args if a.startswith("--") or "=" not in a]
        overrides = [a for a in args if "=" in a]
        cmd = [sys.executable, "-m", "seeupo", "eval", "--checkpoint", str(run), "--out", out, *opts,
               *overrides, f"run.seed={1000 + seed}"]
        subprocess.run(cmd, check=True, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        return json.loads((Path(out) / "eval.json").read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a finished run folder (its latest checkpoint is scored)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    data = {"run": str(a.run), "repeats": a.repeats, "evaluations": {}}
    if a.out.exists():
        data = json.loads(a.out.read_text())
    for name, args in EVALS.items():
        runs = data["evaluations"].setdefault(name, [])
        for r in range(len(runs), a.repeats):
            runs.append(score(a.run, r, args))
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(data, indent=1))  # resumable: each repeat kept as it lands
            print(f"{name} repeat {r}: avg@k {runs[-1]['avg@k']:.3f}", flush=True)
    for name, runs in data["evaluations"].items():
        xs = [x["avg@k"] for x in runs]
        print(f"{name}: mean {statistics.mean(xs):.3f}, sd over repeats {statistics.stdev(xs):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
