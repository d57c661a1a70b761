"""``seeupo summarize RUN...``: finished runs' held-out avg@k and pass@k before and after RL, per run and
per algorithm (mean and standard deviation over seeds)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from rich.table import Table

KEYS = ("before_avg", "after_avg", "before_pass", "after_pass")


def read_runs(runs: list[Path]) -> tuple[list[dict], list[Path]]:
    """Each finished run's row (from its summary.json), and the folders without one (unfinished)."""
    found, skipped = [], []
    for r in runs:
        f = r / "summary.json"
        if not f.exists():
            skipped.append(r)
            continue
        s = json.loads(f.read_text())
        found.append({"run": str(r), "algorithm": s["algorithm"], "seed": s["seed"], "minutes": s["wall_seconds"] / 60,
                      **{f"{w}_{m}": s[f"eval_{w}"][f"{m}@k"] for w in ("before", "after") for m in ("avg", "pass")},
                      "k": s["eval_after"]["k"], "tasks": s["eval_after"]["tasks"]})
    return found, skipped


def per_algorithm(found: list[dict]) -> dict[str, dict]:
    """``{algorithm: {key: (mean, sd), "seeds": [...]}}`` over its runs (sd 0 for a single run)."""
    groups: dict[str, list[dict]] = {}
    for r in found:
        groups.setdefault(r["algorithm"], []).append(r)
    agg = {}
    for algo, rs in groups.items():
        agg[algo] = {k: (statistics.mean(x[k] for x in rs), statistics.stdev(x[k] for x in rs) if len(rs) > 1 else 0.0)
                     for k in KEYS}
        agg[algo]["seeds"] = sorted(r["seed"] for r in rs)
    return agg


def tables(found: list[dict], agg: dict[str, dict]) -> list[Table]:
    runs = Table(title="runs")
    for c in ("run", "algorithm", "seed", "min", "avg@k before", "avg@k after", "pass@k before", "pass@k after"):
        runs.add_column(c)
    for r in found:
        runs.add_row(r["run"], r["algorithm"], str(r["seed"]), f"{r['minutes']:.1f}", *(f"{r[k]:.3f}" for k in KEYS))
    algos = Table(title="per algorithm: mean +- std over seeds")
    for c in ("algorithm", "seeds", "avg@k before", "avg@k after", "pass@k before", "pass@k after"):
        algos.add_column(c)
    for algo, a in agg.items():
        algos.add_row(algo, ",".join(map(str, a["seeds"])), *(f"{a[k][0]:.3f} +- {a[k][1]:.3f}" for k in KEYS))
    return [runs, algos]


def write_json(path: Path, found: list[dict], agg: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": found, "per_algorithm": agg}, indent=1))
