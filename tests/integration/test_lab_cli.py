import json
import subprocess
import sys

from typer.testing import CliRunner

from seeupo.cli import app
from seeupo.lab import table1

KEYS = {"algorithm", "setting", "mode", "policy", "seeds", "optimal_rate", "mean_final_gap",
        "monotonic_violation_rate"}


def test_table1_small_plan_writes_contract(tmp_path, monkeypatch):
    # A reduced plan (2 seeds, 20 iterations) through the real CLI path.
    real_plan = table1.plan

    def small_plan(*, quick, seeds=None):
        jobs = real_plan(quick=True, seeds=2)
        return [j.__class__(**{**j.__dict__, "cfg": j.cfg.__class__(**{**j.cfg.__dict__, "iterations": 20})})
                for j in jobs]

    monkeypatch.setattr(table1, "plan", small_plan)
    res = CliRunner().invoke(app, ["lab", "table1", "--quick", "--out", str(tmp_path), "--workers", "1"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "table1.json").read_text())
    rows = data["rows"]
    assert {r["algorithm"] for r in rows} == set(table1.ALGOS)
    assert {(r["setting"], r["mode"], r["policy"]) for r in rows} >= {
        ("single_turn", "exact", "per_turn"), ("multi_turn", "exact", "per_turn"),
        ("multi_turn", "sampled", "shared")}
    for r in rows:
        assert KEYS <= set(r)
        assert r["setting"] in ("single_turn", "multi_turn") and r["mode"] in ("exact", "sampled")
        assert 0.0 <= r["optimal_rate"] <= 1.0 and 0.0 <= r["monotonic_violation_rate"] <= 1.0
    # one row per (algorithm, setting, mode, policy) in the contract section
    assert len({tuple(r[k] for k in ("algorithm", "setting", "mode", "policy")) for r in rows}) == len(rows)
    assert (tmp_path / "table1.md").read_text().startswith("# Table 1, measured")
    assert (tmp_path / "table1.png").stat().st_size > 10_000
    assert "Table 1 (main rows)" in res.output


def test_cli_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "seeupo", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "train" in out.stdout and "lab" in out.stdout
