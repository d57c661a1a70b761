import json
import subprocess
import sys

import pytest

from typer.testing import CliRunner

from seeupo.cli import app
from seeupo.lab import table1

KEYS = {"algorithm", "setting", "mode", "policy", "seeds", "optimal_rate", "mean_final_gap",
        "monotonic_violation_rate"}


def test_table1_small_plan_writes_contract(tmp_path, monkeypatch):
    # A reduced plan (2 seeds, 5 iterations) through the real CLI path: what is checked is the table it
    # writes, not what the algorithms reach (tests/integration/test_table1_quick.py checks that)
    real_plan = table1.plan

    def small_plan(*, quick, seeds=None):
        jobs = real_plan(quick=True, seeds=2)
        return [j.__class__(**{**j.__dict__, "cfg": j.cfg.__class__(**{**j.cfg.__dict__, "iterations": 5})})
                for j in jobs]

    monkeypatch.setattr(table1, "plan", small_plan)
    res = CliRunner().invoke(app, ["lab", "table1", "--quick", "--out", str(tmp_path), "--workers", "1"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "table1.json").read_text())
    rows = data["rows"]
    assert {r["algorithm"] for r in rows} == set(table1.ALGOS + table1.TURN_ALGOS)
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


def test_lab_reach_small_plan_writes_its_tables(tmp_path, monkeypatch):
    from dataclasses import replace

    from seeupo.lab import reach

    real_plan = reach.plan

    def small_plan(*, quick, seeds=None):  # 2 seeds, 6 iterations, 4 search instances
        return [replace(j, seeds=j.seeds[:4] if j.section == "search" else j.seeds[:2],
                        cfg=replace(j.cfg, iterations=6)) for j in real_plan(quick=True)]

    monkeypatch.setattr(reach, "plan", small_plan)
    res = CliRunner().invoke(app, ["lab", "reach", "--quick", "--out", str(tmp_path), "--workers", "1"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "reach.json").read_text())
    assert {r["variant"] for r in data["gradient"]} == set(reach.LEVELS)
    assert {r["step"] for r in data["exact_step"]} == {"kl", "clip"}
    assert {r["policy"] for r in data["gradient"]} == {"per_turn", "shared"} and data["sampled"]
    tool = sorted({r["level"] for r in data["gradient"] if r["variant"] == "tool"})
    assert tool == list(reach.LEVELS["tool"])
    md = (tmp_path / "reach.md").read_text()
    assert md.startswith("# How far the guarantees reach") and "| tool | 0.3 |" in md
    assert (tmp_path / "reach.png").stat().st_size > 10_000
    assert "with a drop under the exact step" in res.output


def test_lab_limits_small_plan_writes_its_table(tmp_path, monkeypatch):
    """seeupo lab limits through the CLI on a reduced plan: every critic error and break at every level,
    shares in [0, 1], and the critic's noise reaches PPO's update."""
    from dataclasses import replace

    from seeupo.lab import limits

    real_plan = limits.plan

    def small_plan(*, quick, seeds=None):  # 3 seeds, 15 iterations
        return [replace(j, seeds=j.seeds[:3], cfg=replace(j.cfg, iterations=15)) for j in real_plan(quick=True)]

    monkeypatch.setattr(limits, "plan", small_plan)
    res = CliRunner().invoke(app, ["lab", "limits", "--quick", "--out", str(tmp_path), "--workers", "1"])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "limits.json").read_text())["rows"]
    got = {(r["limit"], r["algorithm"], r["error"], r["level"]) for r in rows}
    want = {("critic", a, f"critic {k}", lv) for a in limits.CRITIC_ALGOS for k, lvs in limits.CRITIC_ERRORS.items()
            for lv in lvs} | {("bandit", a, k, lv) for a in limits.BANDIT_ALGOS for k, lvs in limits.BREAKS.items()
                              for lv in lvs}
    assert got == want
    assert all(0 <= r["monotonic"] <= 1 and 0 <= r["optimal"] <= 1 for r in rows)
    ppo = {(r["error"], r["level"]): r for r in rows if r["algorithm"] == "ppo"}
    assert ppo["critic noise", 0.4]["mean_final_gap"] != pytest.approx(ppo["critic noise", 0.0]["mean_final_gap"], abs=1e-6)
    assert (tmp_path / "limits.png").stat().st_size > 10_000
    assert (tmp_path / "limits.md").read_text().startswith("# The two limits on one axis")
