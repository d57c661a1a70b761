"""scripts/ holds lasting tools only (issue 61): no file named after an issue or a one-off run, no
experiment definition (those live in seeupo/configs/experiments/, where `seeupo sweep NAME` finds them)."""

import re
from pathlib import Path

from seeupo.sweep.experiment import experiments, load_experiment

ROOT = Path(__file__).resolve().parents[2]


def test_scripts_are_lasting_tools():
    names = [p.name for p in (ROOT / "scripts").iterdir() if p.is_file()]
    assert names
    for n in names:
        assert not re.search(r"issue\d*|chain|rerun|one_?off|tmp|_tiny", n), n
        assert not n.endswith((".yaml", ".yml")), n
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] if p.name != "notebook.md")
    for n in names:  # each tool is named where its figures are
        assert f"scripts/{n}" in docs, n


def test_the_moved_experiment_loads_by_name():
    assert "robustness_intel" in experiments()
    exp = load_experiment("robustness_intel")
    assert len(exp.arms) == 14


