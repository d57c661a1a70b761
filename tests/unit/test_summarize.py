"""`seeupo summarize`: per-run rows and per-algorithm mean and spread from summary.json files."""

import json

from typer.testing import CliRunner

from seeupo.cli import app


def write(run, algo, seed, before, after):
    run.mkdir(parents=True)
    ev = lambda a: {"avg@k": a, "pass@k": min(1.0, 2 * a), "k": 4, "tasks": 32}  # noqa: E731
    (run / "summary.json").write_text(json.dumps({"algorithm": algo, "seed": seed, "wall_seconds": 600,
                                                  "eval_before": ev(before), "eval_after": ev(after)}))


def test_summarize_groups_by_algorithm_and_skips_unfinished_runs(tmp_path):
    write(tmp_path / "a0", "seeupo", 0, 0.1, 0.3)
    write(tmp_path / "a1", "seeupo", 1, 0.1, 0.5)
    write(tmp_path / "g0", "grpo", 0, 0.1, 0.2)
    (tmp_path / "unfinished").mkdir()
    res = CliRunner().invoke(app, ["summarize", *(str(tmp_path / r) for r in ("a0", "a1", "g0", "unfinished")),
                                   "--out", str(tmp_path / "t.json")])
    assert res.exit_code == 0, res.output
    assert "no summary.json" in res.output
    agg = json.loads((tmp_path / "t.json").read_text())["per_algorithm"]
    mean, std = agg["seeupo"]["after_avg"]
    assert abs(mean - 0.4) < 1e-9 and abs(std - 0.1414213562) < 1e-6 and agg["seeupo"]["seeds"] == [0, 1]
    assert agg["grpo"]["after_avg"] == [0.2, 0.0]
