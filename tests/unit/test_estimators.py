"""The estimator registry (issue 59): declarations, parameters, refusals, and a trainer that only
dispatches on them."""

import inspect
import re
from pathlib import Path

import pytest
import torch

from seeupo.core import estimators as E
from seeupo.core.algorithms import ALGORITHMS
from seeupo.core.schedule import SeeUPOOptions

ROOT = Path(__file__).resolve().parents[2]


def test_every_algorithm_names_a_registered_estimator_and_kinds_are_consistent():
    for a in ALGORITHMS.values():
        assert a.estimator in E.ESTIMATORS
        assert dict(a.params) == dict(E.get_estimator(a.estimator).defaults)
    assert set(E.names("critic")) == {"gae", "turn_gae"}
    assert "grae" in E.names("episode") and {"gigpo", "turn_grae", "grae_to_go"} <= set(E.names("turn"))
    with pytest.raises(ValueError, match="kind"):
        E.Estimator("x", "sometimes", lambda t, **k: t.rewards_N)
    with pytest.raises(ValueError, match="critic has no compute"):
        E.Estimator("x", "critic", lambda t, **k: t.rewards_N)
    with pytest.raises(ValueError, match="registered already"):
        E.register(E.get_estimator("grae"))
    with pytest.raises(TypeError):  # the declared defaults cannot be changed in place
        E.get_estimator("gigpo").defaults["gamma"] = 1.0


def test_parameters_are_the_defaults_with_the_run_over_them_and_checked():
    assert E.params_of("gigpo") == {"gamma": 0.95, "step_weight": 1.0, "episode_norm": "step"}
    assert E.params_of("turn_gae") == {"gamma": 0.99, "lam": 0.9}
    assert E.params_of("gigpo", {"gamma": 0.5})["gamma"] == 0.5
    assert E.readers("lam") == ("gae", "turn_gae")
    with pytest.raises(ValueError, match="no parameter lam"):
        E.params_of("gigpo", {"lam": 0.5})
    with pytest.raises(ValueError, match="gamma=1.5"):
        E.params_of("gigpo", {"gamma": 1.5})
    with pytest.raises(ValueError, match="step_weight=-1"):
        E.params_of("turn_grae", {"step_weight": -1})


def test_refusals_sit_beside_the_estimators():
    kw = dict(order="reverse", update_turns="all", leave_one_out=False)
    assert E.refusal("gigpo", algorithm="seeupo", own="grae", **kw) is None
    assert "learns a critic" in E.refusal("gigpo", algorithm="ppo", own="gae", order="joint", update_turns="all",
                                          leave_one_out=False)
    assert "leave-one-out" in E.refusal("gigpo", algorithm="rloo", own="grae", order="joint", update_turns="all",
                                        leave_one_out=True)
    assert "segment row" in E.refusal("gigpo", algorithm="seeupo", own="grae", order="buckets:2", update_turns="all",
                                      leave_one_out=False)
    assert "every turn's value" in E.refusal("turn_gae", algorithm="turn-ppo", own="turn_gae", order="joint",
                                             update_turns="last:1", leave_one_out=False)
    assert "set algo.name" in E.refusal("gae", algorithm="seeupo", own="grae", **kw)


def test_batch_norm_and_episode_broadcast():
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])
    t = E.Turns(r.sum(-1), torch.tensor([0, 0, 0]), r, mask, torch.zeros(3, 2, dtype=torch.long))
    a = E.estimate("grae_to_go", t, norm="batch")
    x = [0.6666667, 0.0, -0.3333333, 0.0, -0.3333333]  # reached raw values (loop: G - mean over the turn's group)
    mu, sd = sum(x) / 5, (sum((v - sum(x) / 5) ** 2 for v in x) / 4) ** 0.5
    want = [[(x[0] - mu) / (sd + 1e-6), (x[1] - mu) / (sd + 1e-6)], [(x[2] - mu) / (sd + 1e-6), (x[3] - mu) / (sd + 1e-6)],
            [(x[4] - mu) / (sd + 1e-6), 0.0]]
    assert torch.allclose(a, torch.tensor(want), atol=1e-5)
    assert E.per_turn(torch.tensor([2.0, -1.0, 0.5]), mask).tolist() == [[2.0, 2.0], [-1.0, -1.0], [0.5, 0.0]]
    with pytest.raises(ValueError, match="no leave-one-out"):
        E.estimate("grae_to_go", t, norm="none", leave_one_out=True)


def test_the_trainer_only_dispatches():
    """Updater._update is a dispatch under 30 lines; sequential_update takes SeeUPO's options as one
    object; the trainer's update modules name no critic-free estimator (a new one is a registry entry)."""
    from seeupo.train.iteration import CRITIC_DRIVERS, DRIVERS, Updater
    from seeupo.train.update import sequential_update

    assert len(inspect.getsource(Updater._update).splitlines()) < 30
    params = inspect.signature(sequential_update).parameters
    assert list(params) == ["ctx", "pools", "adv", "opts"] and params["opts"].default == SeeUPOOptions()
    assert set(DRIVERS) == {"joint", "sequential"} and set(CRITIC_DRIVERS) == set(E.names("critic"))
    for f in ("iteration.py", "update.py"):
        text = (ROOT / "seeupo" / "train" / f).read_text()
        for name in E.names("episode") + E.names("turn"):
            assert not re.search(rf"[\"']{name}[\"']", text), (f, name)


def test_the_files_adding_hgpo_touched_are_core_and_registry_only():
    """docs/core.md lists the files of the commit that added HGPO: none is under seeupo/train/, and
    each exists."""
    text = (ROOT / "docs" / "core.md").read_text()
    block = text[text.index("Adding it touched"):text.index("checks that the")]
    files = re.findall(r"`([\w./-]+\.(?:py|yaml|md))`", block)
    assert "seeupo/core/estimators.py" in files and len(files) >= 8
    for f in files:
        assert (ROOT / f).exists(), f
        assert not f.startswith("seeupo/train/"), f


def test_the_anchor_sharing_table_is_the_record():
    """docs/envs.md's anchor-sharing table is results/anchors/textworld.json, row by row."""
    import json

    rec = json.loads((ROOT / "results" / "anchors" / "textworld.json").read_text())
    text = (ROOT / "docs" / "envs.md").read_text()
    block = text[text.index("<!-- anchors:begin -->"):text.index("<!-- anchors:end -->")]
    rows = [r for r in block.splitlines() if r.startswith("| ") and not r.startswith("| anchor")]
    assert [r.split(" | ")[0][2:] for r in rows] == [x["anchor"] for x in rec["rows"]]
    for r, x in zip(rows, rec["rows"]):
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert cells == [x["anchor"], str(x["turns"]), f"{x['shared_fraction']:.3f}", f"{x['distinct_anchors_per_group']:.2f}"]


def test_the_registry_left_every_run_bit_identical():
    """results/same_numbers/: every algorithm and the dispatch variants, two tiny-preset iterations
    each, before the registry and after it (scripts/same_numbers.py, one machine, one thread): the
    same trainable parameters to the bit and the same metrics; each run took optimizer steps."""
    import json

    from seeupo.core.algorithms import ALGORITHMS as algos

    before, after = (json.loads((ROOT / "results" / "same_numbers" / f).read_text()) for f in ("before.json", "after.json"))
    assert set(algos) - {"hgpo"} <= set(before["runs"]) and before["runs"].keys() == after["runs"].keys()
    for label, run in before["runs"].items():
        assert "error" not in run and min(run["optimizer_steps"]) > 0, label
        assert run == after["runs"][label], label
