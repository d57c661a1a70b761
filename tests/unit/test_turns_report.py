"""The per-turn analysis (seeupo report RUN_DIR) on constructed metric streams."""

import json

from seeupo.sweep.turns import pooled_summary, turn_summary


def stream(successes_t0, successes_t1):
    return [{"iteration": 0, "eval": {"avg@k": 0.0}}] + [
        {"iteration": i, "reward_mean": 0.0,
         "turn": {"0": {"success": a, "factor_mean": 1.0 - 0.1 * i, "rows": 4},
                  **({"1": {"success": b, "rows": 2}} if b is not None else {})}}
        for i, (a, b) in enumerate(zip(successes_t0, successes_t1))]


def test_early_and_late_thirds_per_turn():
    recs = stream([0.0, 0.0, 0.3, 0.6, 1.0, 1.0], [0.5, None, None, 0.5, 1.0, 0.0])
    s = turn_summary(recs)
    assert set(s) == {"0", "1"}
    assert s["0"]["success"] == {"early": 0.0, "late": 1.0}  # iterations 0-1 and 4-5
    assert abs(s["0"]["factor_mean"]["late"] - (0.6 + 0.5) / 2) < 1e-12
    assert s["1"]["success"] == {"early": 0.5, "late": 0.5}  # turn 1 absent at iteration 1: its mean is iteration 0's
    assert s["1"]["ratio_mean"]["early"] != s["1"]["ratio_mean"]["early"]  # never logged: NaN, not 0


def test_pooled_over_seeds_is_the_mean_of_each_seeds_thirds():
    a = stream([0.0, 0.0, 0.0], [None] * 3)
    b = stream([1.0, 1.0, 0.0, 0.0, 0.0, 0.0], [None] * 6)
    p = pooled_summary([a, b])
    assert p["0"]["success"]["early"] == (0.0 + 1.0) / 2 and p["0"]["success"]["late"] == 0.0


def test_report_command_on_a_run_folder(tmp_path):
    from typer.testing import CliRunner

    from seeupo.cli import app

    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in stream([0.0, 0.5, 1.0], [0.0, 0.0, 1.0])))
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "turns.json").read_text())["1"]["success"]["late"] == 1.0
    assert (tmp_path / "turns.png").exists() and "| 1 |" in (tmp_path / "turns.md").read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(app, ["report", str(empty)])
    assert res.exit_code == 2 and "neither a sweep folder" in res.output


def test_half_rise_says_which_turn_moved_first():
    # turn 1 jumps at iteration 2, turn 0 at iteration 6 (10 iterations: thirds of 3)
    t0 = [0.0] * 6 + [1.0] * 4
    t1 = [0.0, 0.0] + [1.0] * 8
    s = turn_summary(stream(t0, t1))
    # by hand: trailing 3-mean of turn 0 is 0, 0, .., 1/3 at 6, 2/3 at 7 >= mid 0.5 -> 7; turn 1: 1/3 at 2, 2/3 at 3 -> 3
    assert s["0"]["half_rise"]["success"] == 7 and s["1"]["half_rise"]["success"] == 3
    flat = turn_summary(stream([0.5] * 6, [0.5, 0.52, 0.5, 0.5, 0.53, 0.52]))
    assert flat["0"]["half_rise"]["success"] is None and flat["1"]["half_rise"]["success"] is None
    # one noisy first point does not count as the rise: only full 3-point windows do
    noisy = [0.7, 0.1, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 0.8]  # early 0.3, late 0.833, mid 0.567
    # full-window means: it2 0.3, it3 0.133, it4 0.2, it5 0.333, it6 0.533, it7 0.733 >= 0.567 -> 7
    assert turn_summary(stream(noisy, [None] * 9))["0"]["half_rise"]["success"] == 7
    down = turn_summary(stream([1.0, 1.0, 1.0, 0.0, 0.0, 0.0], [None] * 6))
    assert down["0"]["half_rise"]["success"] == 4  # falls: 2/3 at 3 is above 0.5, 1/3 at 4 is below
    # pooled: the median over the seeds in which the turn moved, and their count
    # (a late jump: early 0, late 2/3, mid 1/3, reached at iteration 8 by the trailing mean 1/3)
    p = pooled_summary([stream(t0, t1), stream([0.0] * 10, t1), stream([0.0] * 4 + [1.0] * 6, t1),
                        stream([0.0] * 8 + [1.0] * 2, t1)])
    assert p["0"]["half_rise"]["success"] == {"median": 7, "moved": 3, "runs": 4}  # of 7, 5, 8 (the mean is 6.67)
    assert p["1"]["half_rise"]["success"] == {"median": 3, "moved": 4, "runs": 4}
