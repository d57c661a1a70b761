"""The acceptance sanity checks of the quick Table 1 (standard policy-gradient theory, not the paper).

Only the rows checked here are computed, from the quick plan itself (same instances, seeds and
settings as ``seeupo lab table1 --quick``; each job is seeded on its own, so a row does not depend on
the other jobs). The CLI path that writes the whole table is ``tests/integration/test_lab_cli.py``'s.
"""

from seeupo.lab import table1

SINGLE = ("ppo", "gspo", "rloo", "reinforce", "seeupo", "seeupo-natural", "seeupo-random")


def test_quick_table1_sanity():
    wanted = {(a, "single_turn", "exact", "per_turn") for a in SINGLE} | {("reinforce", "multi_turn", "exact", "per_turn")}
    jobs = [j for j in table1.plan(quick=True)
            if j.section == "rows" and (j.algorithm, j.setting, j.mode, j.policy) in wanted]
    assert len(jobs) == len(wanted)
    by = {(r["algorithm"], r["setting"], r["mode"], r["policy"]): r for _, r, _ in table1.measure(jobs)}
    for algo in SINGLE:
        assert by[(algo, "single_turn", "exact", "per_turn")]["optimal_rate"] >= 0.9, algo
    r = by[("reinforce", "multi_turn", "exact", "per_turn")]
    assert r["monotonic_violation_rate"] == 0.0
    assert r["mean_final_gap"] < r["mean_initial_gap"]
