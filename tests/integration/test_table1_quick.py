"""The acceptance sanity checks of the quick Table 1 (standard policy-gradient theory, not the paper)."""

import json

from typer.testing import CliRunner

from seeupo.cli import app


def test_quick_table1_sanity(tmp_path):
    res = CliRunner().invoke(app, ["lab", "table1", "--quick", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "table1.json").read_text())["rows"]
    by = {(r["algorithm"], r["setting"], r["mode"], r["policy"]): r for r in rows}
    for algo in ("ppo", "gspo", "rloo", "reinforce", "seeupo", "seeupo-natural", "seeupo-random"):
        assert by[(algo, "single_turn", "exact", "per_turn")]["optimal_rate"] >= 0.9, algo
    r = by[("reinforce", "multi_turn", "exact", "per_turn")]
    assert r["monotonic_violation_rate"] == 0.0
    assert r["mean_final_gap"] < r["mean_initial_gap"]
