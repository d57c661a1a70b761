"""docs/experiments.md says compare_trap_turn's `seeupo` and `grpo` arms are compare_trap's trials
again, to the bit: every (arm, seed) the two experiments share has the same trained parameters
(`trainable_param_sha256` of its summary.json) in both records."""

import re
from pathlib import Path

from seeupo.sweep.records import summaries

ROOT = Path(__file__).resolve().parents[2]


def _hashes(name: str) -> dict[tuple[str, int], str]:
    return {k: s["trainable_param_sha256"] for k, s in summaries(ROOT / "results" / name, name).items()}


def test_compare_trap_turn_repeats_compare_trap_to_the_bit():
    old, new = _hashes("compare_trap"), _hashes("compare_trap_turn")
    shared = sorted(set(old) & set(new))
    assert {arm for arm, _ in shared} == {"seeupo", "grpo"}
    assert [k for k in shared if old[k] != new[k]] == []
    doc = (ROOT / "docs" / "experiments.md").read_text()
    said = re.search(r"`compare_trap`'s on all (\d+) \(arm, seed\) pairs", doc)
    assert said and int(said.group(1)) == len(shared)
