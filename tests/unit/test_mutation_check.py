"""scripts/mutation_check.py's bookkeeping: every mutation's target exists (a refactor that moves one
fails here, in the default suite, not only in the long script), what counts as caught, and a stale
target reported as STALE with the run going on."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mc(load_script):
    return load_script("mutation_check")


def test_every_target_is_in_its_file_exactly_once(mc):
    stale = [(name, path) for name, path, old, _, _ in mc.M if (ROOT / path).read_text().count(old) != 1]
    assert not stale, stale
    assert len({m[0] for m in mc.M}) == len(mc.M)  # names are unique


def test_caught_only_when_tests_ran_and_failed(mc):
    assert mc.outcome(1, {"failed": 1, "passed": 3}) == "CAUGHT"
    assert mc.outcome(0, {"passed": 4}) == "MISSED"
    assert mc.outcome(5, {}) == "ERROR"  # no test selected
    assert mc.outcome(2, {"error": 1}) == "ERROR"  # a collection error
    assert mc.outcome(1, {"errors": 1}) == "ERROR"  # errors in set-up, no failure


def test_a_stale_target_is_reported_and_the_run_goes_on(mc, monkeypatch, capsys):
    monkeypatch.setattr(mc, "M", [
        ("gone", "seeupo/sweep/stats.py", "this text is not in the file", "x", "tests/unit/test_stats.py"),
        ("also gone", "seeupo/sweep/stats.py", "nor is this one", "y", "tests/unit/test_stats.py"),
    ])
    assert mc.main([]) == 1
    out = capsys.readouterr().out
    assert "1/2 STALE  gone" in out and "2/2 STALE  also gone" in out
    assert out.strip().splitlines()[-1] == "CAUGHT 0 / MISSED 0 / STALE 2 / ERROR 0 / BROKEN 0 of 2 mutations"


def test_the_outcome_table_reads_names_that_hold_colons(mc, tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text("x\n<!-- mutation-outcome -->\nold\n<!-- /mutation-outcome -->\ny\n")
    log = tmp_path / "a.log"
    name = "sweep: a closed trial's result lost"
    assert name in [m[0] for m in mc.M]
    log.write_text(f"  1/2 CAUGHT {name}: 1 failed, 3 deselected in 2.0s\n  2/2 MISSED pass@k = avg@k: 2 passed\n")
    assert mc.table([str(log)], doc=str(doc)) == 1  # one missed, the rest not run
    text = doc.read_text()
    assert f"| {name} | CAUGHT | 1 failed, 3 deselected in 2.0s |" in text and "| pass@k = avg@k | MISSED |" in text
    assert f"CAUGHT 1 / MISSED 1 / STALE 0 / ERROR 0 / BROKEN 0 of 2 mutations; not run: {len(mc.M) - 2}." in text
    assert text.startswith("x\n") and text.endswith("<!-- /mutation-outcome -->\ny\n")
