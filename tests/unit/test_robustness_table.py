"""scripts/robustness_table.py: each arm against its own algorithm's clean arm, collapse rates per level."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "robustness_table.py"


@pytest.fixture(scope="module")
def rt():
    spec = importlib.util.spec_from_file_location("robustness_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def arm(name, afters, collapses=0, platform="cpu A"):
    per_seed = {str(s): {"after": a, "before": 0.1} for s, a in enumerate(afters)}
    return {"name": name, "n": len(afters), "mean": sum(afters) / len(afters), "collapses": collapses,
            "trapped": None, "per_seed": per_seed, "platforms": {s: platform for s in per_seed}}


def test_each_arm_is_read_against_its_own_algorithms_clean_arm(rt, tmp_path, capsys):
    res = {"metric": "avg@k", "arms": [
        arm("lookup-clean-seeupo", [0.50, 0.70, 0.60]),
        arm("lookup-shaping0.5-seeupo", [0.25, 0.40, 0.45], collapses=1),
        arm("lookup-clean-grpo", [0.80, 0.90, 0.70]),
        arm("lookup-shaping0.5-grpo", [0.80, 0.95, 0.75], collapses=1, platform="cpu B"),
    ]}
    (tmp_path / "results.json").write_text(json.dumps(res))
    rt.main([str(tmp_path)])
    text = capsys.readouterr().out
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in text.splitlines()
            if line.startswith("| seeupo") or line.startswith("| grpo")}
    # seeupo: differences -0.25, -0.30, -0.15 -> mean -0.233; grpo: 0, +0.05, +0.05 -> +0.033
    assert "0.367 (-0.233 [" in rows[("seeupo", "shaping")]
    assert "0.833 (+0.033 [" in rows[("grpo", "shaping")]
    # 2 collapses in 6 runs at shaping 0.5: Wilson 95% interval [0.097, 0.700]; none in the clean runs
    assert "| shaping | 0.5 | 6 | 2 | 0.333 | [0.097, 0.700] |" in text
    assert "| clean | 0 | 6 | 0 | 0.000 | [0.000, 0.390] |" in text
    assert "cpu A (9 trials); cpu B (3 trials)" in text


def test_a_sweep_in_progress_says_how_many_seeds_each_difference_pairs(rt, tmp_path, capsys):
    """Part way through, an arm may have more seeds than its clean arm: its mean is over all of its
    seeds, its difference over the seeds both have, and the row says so."""
    res = {"metric": "avg@k", "arms": [
        arm("lookup-clean-seeupo", [0.50, 0.70, 0.60]),
        arm("lookup-shaping1.0-seeupo", [0.40, 0.50, 0.60, 0.90]),
        arm("lookup-noise0.5-seeupo", [0.30, 0.40, 0.50]),
    ]}
    (tmp_path / "results.json").write_text(json.dumps(res))
    rt.main([str(tmp_path)])
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("| seeupo | shaping"))
    assert "0.600 (-0.100 [" in row and ", n=3)" in row, row  # pairs 0.4-0.5, 0.5-0.7, 0.6-0.6
    row = next(line for line in text.splitlines() if line.startswith("| seeupo | noise"))
    assert "0.400 (-0.200 [" in row and "n=" not in row.split("|")[-3], row  # all 3 seeds paired


def test_arm_names_outside_the_pattern_are_refused(rt):
    assert rt.parse("trap-failure1.0-ppo") == ("trap", "failure", 1.0, "ppo")
    for bad in ("lookup-shaping-grpo", "lookup-clean0.5-grpo", "seeupo-all"):
        with pytest.raises(ValueError, match="is not FAMILY"):
            rt.parse(bad)
