"""docs/experiments.md says reward_textworld's `outcome` arm repeats compare_textworld's `seeupo` arm
to the bit (on these one-quest games `score_delta`, the preset's default, gives the outcome's
rewards): every seed the two share, run on one CPU kind, has the same trained parameters
(`trainable_param_sha256` of its summary.json), and the prose states how many seeds that is."""

import re
from pathlib import Path

from seeupo.sweep.records import summaries

ROOT = Path(__file__).resolve().parents[2]


def _summaries(name: str, arm: str) -> dict[int, dict]:
    return {seed: s for (a, seed), s in summaries(ROOT / "results" / name, name).items() if a == arm}


def test_reward_textworld_outcome_repeats_compare_textworld_seeupo():
    old, new = _summaries("compare_textworld", "seeupo"), _summaries("reward_textworld", "outcome")
    # a CPU kind is its name and the kernels torch dispatches on it: an AMD EPYC without AVX512
    # (torch's AVX2 kernels) trains other parameters than one with it
    cpu = lambda s: [(p["cpu"], p.get("cpu_capability")) for p in s["platforms"]]  # noqa: E731
    same_kind = sorted(k for k in set(old) & set(new) if cpu(old[k]) == cpu(new[k]))
    assert same_kind, "no seed of reward_textworld's outcome arm shares a CPU kind with compare_textworld"
    differ = [k for k in same_kind if old[k]["trainable_param_sha256"] != new[k]["trainable_param_sha256"]]
    assert differ == []
    doc = (ROOT / "docs" / "experiments.md").read_text()
    said = re.search(r"the same on all (\d+) seeds? the two experiments share on one CPU kind", doc)
    assert said and int(said.group(1)) == len(same_kind)


def test_the_prose_gives_seed_4_across_cpu_kinds_from_the_records():
    """docs/experiments.md quotes reward_textworld's seed 4 (AVX2) against compare_textworld's seed 4
    (AVX512): both held-out avg@2 figures come from the records."""
    old, new = _summaries("compare_textworld", "seeupo")[4], _summaries("reward_textworld", "outcome")[4]
    doc = (ROOT / "docs" / "experiments.md").read_text()
    said = re.findall(r"held-out avg@2 (?:is )?(\d\.\d\d)\s+against\s+(\d\.\d\d)", doc)
    assert said == [(f"{new['eval_after']['avg@k']:.2f}", f"{old['eval_after']['avg@k']:.2f}")] * 2
