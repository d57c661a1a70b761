"""``seeupo sweep`` on a small grid: the same trials with 1 or 2 workers, a re-run that only reads,
bounded retries of a failing trial, a killed sweep that resumes its interrupted trial."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from seeupo.sweep.engine import SweepSpec, finished_trials, sweep
from seeupo.sweep.experiment import load_experiment
from seeupo.sweep.report import results, write

SMALL = ["warmup.episodes=16", "warmup.epochs=1", "eval.tasks=2", "eval.k=2", "rollout.tasks_per_iteration=2",
         "rollout.group_size=2", "run.loggers=[jsonl]", "run.iterations=2"]


def _experiment(tmp_path: Path, arms: dict, seeds=(0, 1), overrides=SMALL, name="mini") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"description": "test", "base": "tiny", "reference": next(iter(arms)),
                                    "seeds": list(seeds), "overrides": list(overrides), "arms": arms}))
    return path


def _train_lines(folder: Path) -> list[dict]:
    out = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.append({k: v for k, v in r.items() if not k.startswith("time/")})
    return out


def _wait_for_training(proc, root: Path, timeout: float = 120) -> Path | None:
    """Until a trial under ``root`` has logged its first RL iteration (or the sweep ended, or
    ``timeout`` passed); returns that trial's folder."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        for metrics in root.rglob("metrics.jsonl") if root.exists() else ():
            if any("reward_mean" in json.loads(x) for x in metrics.read_text().splitlines() if x.endswith("}")):
                return metrics.parent
        time.sleep(0.2)
    return None


def _stop_run_of(folder: Path) -> None:
    """SIGTERM to the ``seeupo train`` process of one trial folder (not to the sweep)."""
    run = subprocess.run(["pgrep", "-f", f"seeupo train --out {folder}"], capture_output=True, text=True)
    pids = [int(p) for p in run.stdout.split()]
    assert len(pids) == 1, run.stdout
    os.kill(pids[0], signal.SIGTERM)


def test_one_or_two_workers_give_the_same_trials_and_a_rerun_only_reads(tmp_path):
    exp = load_experiment(str(_experiment(tmp_path, {"a": ["algo.name=seeupo"], "b": ["algo.name=grpo"]}, seeds=(0,))))
    seen = []
    one = SweepSpec(exp, tmp_path / "one", quick=False, workers=1)
    two = SweepSpec(exp, tmp_path / "two", quick=False, workers=2)
    assert sweep(one, on_trial=lambda *a: seen.append(a))["done"] == 2 and len(seen) == 2
    # the live view (issue 61): each trial's training success per iteration as Optuna intermediate
    # values, its evaluations as user attributes, read back through Optuna's public API
    done = [t for t in optuna.load_study(study_name=one.study_name, storage=one.url).get_trials()
            if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2
    for t in done:
        assert sorted(t.intermediate_values) == [1, 2] and "eval@0" in t.user_attrs and "eval@2" in t.user_attrs
    # the two arms share seed 0's warm-up, so its evaluation before RL ran once (issue 58)
    reused = [json.loads((one.folder(arm, 0) / "summary.json").read_text())["eval_before_reused"] for arm in "ab"]
    assert sorted(reused) == [False, True] and len(list((one.out / "eval-cache").glob("*.json"))) == 1
    before = {json.dumps(json.loads((one.folder(arm, 0) / "summary.json").read_text())["eval_before"]) for arm in "ab"}
    assert len(before) == 1
    assert sweep(two)["done"] == 2
    for arm, seed in one.grid():
        assert _train_lines(one.folder(arm, seed)) == _train_lines(two.folder(arm, seed)), (arm, seed)
        for spec in (one, two):  # the trial's threads do not follow the worker count
            assert (spec.folder(arm, seed) / "train.log").read_text().startswith("$ OMP_NUM_THREADS=1 ")
    res = results(one.out, experiment="mini", metric="avg@k", reference="a", arms_order=["a", "b"])
    write(one.out, res)
    first = (one.out / "results.json").read_text()
    assert [a["n"] for a in res["arms"]] == [1, 1] and (one.out / "report.md").exists()
    seen.clear()
    start = time.perf_counter()
    assert sweep(one, on_trial=lambda *a: seen.append(a))["done"] == 2
    assert seen == [] and time.perf_counter() - start < 10  # nothing trained again
    write(one.out, results(one.out, experiment="mini", metric="avg@k", reference="a", arms_order=["a", "b"]))
    assert (one.out / "results.json").read_text() == first


def test_a_failing_trial_is_retried_a_bounded_number_of_times(tmp_path):
    exp = load_experiment(str(_experiment(tmp_path, {"ok": [], "bad": ["model.name=/nonexistent/model"]}, seeds=[0])))
    spec = SweepSpec(exp, tmp_path / "out", quick=False, workers=1, max_retries=1)
    counts = sweep(spec)
    assert counts == {"done": 1, "queued": 0, "given_up": 1}
    log = (spec.folder("bad", 0) / "train.log").read_text()
    assert log.count("$ ") == 2 and "no such folder" in log  # the first try and one retry
    # alone in its sweep (no other trial's progress between the rounds) it is retried all the same
    exp = load_experiment(str(_experiment(tmp_path, {"bad": ["model.name=/nonexistent/model"]}, seeds=[0],
                                          name="alone")))
    spec = SweepSpec(exp, tmp_path / "alone", quick=False, workers=1, max_retries=2)
    assert sweep(spec) == {"done": 0, "queued": 0, "given_up": 1}
    assert (spec.folder("bad", 0) / "train.log").read_text().count("$ ") == 3


def test_a_killed_sweep_resumes_its_interrupted_trial(tmp_path):
    path = _experiment(tmp_path, {"a": []}, seeds=[0], overrides=[*SMALL[:-1], "run.iterations=15",
                                                                   "run.checkpoint_every=0"])
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "seeupo", "sweep", str(path), "--out", str(out), "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "trials" / "a" / "seed-0" / "metrics.jsonl"
    _wait_for_training(proc, metrics.parent)
    proc.send_signal(signal.SIGTERM)
    text = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, text
    log = (metrics.parent / "train.log").read_text()
    assert "stopped at a safe point; checkpoint" in log  # the run got one SIGTERM and checkpointed
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    log = (metrics.parent / "train.log").read_text()
    commands = [x for x in log.splitlines() if x.startswith("$ ")]
    assert len(commands) == 2 and "--resume" not in commands[0] and "--resume" in commands[1]
    assert [r["iteration"] for r in _train_lines(metrics.parent) if "reward_mean" in r] == list(range(15))
    assert json.loads((out / "results.json").read_text())["arms"][0]["n"] == 1
    import optuna

    trials = optuna.load_study(study_name="mini", storage=f"sqlite:///{out / 'study.db'}").get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"] and trials[0].user_attrs["interrupted"]


def test_a_tuned_arm_is_tuned_within_its_budget_then_compared_on_fresh_seeds(tmp_path):
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump({
        "description": "test", "base": "tiny", "reference": "fixed", "seeds": [0], "overrides": SMALL,
        "arms": {"fixed": ["algo.name=grpo"]},
        "tune": {"budget": 2, "seeds": [100], "space": {"algo.kl_coef": [0.0, 0.2], "rollout.group_size": [2, 4]},
                 "arms": {"tuned": {"overrides": ["algo.name=grpo"]}}}}))
    exp = load_experiment(str(path))
    spec = SweepSpec(exp, tmp_path / "out", quick=False, workers=1)
    seen = []
    assert sweep(spec, on_trial=lambda *a: seen.append(a))["done"] == 2
    assert sum(a[0] == "tune:tuned" for a in seen) == 2  # the budget
    best = json.loads((spec.out / "tuned.json").read_text())["tuned"]
    assert best["trials"] == 2 and set(best["params"]) == {"algo.kl_coef", "rollout.group_size"}
    cfg = yaml.safe_load((spec.folder("tuned", 0) / "config.yaml").read_text())
    assert cfg["algo"]["kl_coef"] == best["params"]["algo.kl_coef"]
    assert cfg["rollout"]["group_size"] == best["params"]["rollout.group_size"] and cfg["run"]["seed"] == 0
    # one folder per distinct configuration tried (TPE may propose one twice: it reuses the folder),
    # run on the tuning seed only
    assert 1 <= len(list((spec.out / "tune" / "tuned").glob("*/seed-100/summary.json"))) <= 2
    assert not list((spec.out / "tune").glob("*/*/seed-0"))
    seen.clear()
    again = SweepSpec(exp, tmp_path / "out", quick=False, workers=1)
    assert sweep(again, on_trial=lambda *a: seen.append(a))["done"] == 2 and seen == []  # nothing more to run
    # --records carries the tuning: a fresh folder restores the tuning trials into its study, chooses the
    # same configuration, restores the tuned arm's comparison trial and trains nothing
    from seeupo.sweep import records

    recs = tmp_path / "recs"
    assert records.save(spec, recs) is not None and records.save(spec, recs) is None
    fresh = SweepSpec(exp, tmp_path / "fresh", quick=False, workers=1, records=recs)
    fresh.out.mkdir()
    got = records.restore(fresh, recs)
    assert got == {"restored": 2, "present": 0, "stale": 0, "tuning": 2}, got
    assert fresh.tuned == again.tuned
    assert sweep(fresh, on_trial=lambda *a: seen.append(a))["done"] == 2 and seen == []
    assert json.loads((fresh.out / "tuned.json").read_text()) == json.loads((spec.out / "tuned.json").read_text())
    assert not list(fresh.out.rglob("train.log"))  # read, not trained
    res = [results(o, experiment="tune", metric="avg@k", reference="fixed", arms_order=["fixed", "tuned"])
           for o in (spec.out, fresh.out)]
    assert json.dumps(res[0]) == json.dumps(res[1])  # (as text: an interval of one seed is nan, which != itself)


def test_every_shipped_experiment_loads_and_quick_arms_pick_a_subset(tmp_path):
    from seeupo.sweep.experiment import experiments

    for name in experiments():
        e = load_experiment(name)
        e.validate_arms(quick=True)  # every quick arm's config loads (full mode: checked by seeupo sweep)
        seeds, arms = e.plan(quick=True)
        assert seeds and arms and (e.reference in arms or e.tune)
    # cost's longer horizon is real: its train and held-out tasks need 2 and 3 lookups (with one task
    # layout, as the tiny preset has, hops_max=3 drew a 2-lookup task and the sweep ran 2-turn episodes)
    from seeupo.envs.base import make_family
    from seeupo.train.config import load_config

    e = load_experiment("cost")
    for quick in (False, True):
        for arm, ov in e.plan(quick)[1].items():
            cfg = load_config(e.base, ov)
            family = make_family(cfg.env.name, cfg.env.options)
            for split in ("train", "test"):
                assert {t.data["hops"] for t in family.tasks(split)} == {2, 3}, (arm, split)
            assert cfg.rollout.max_turns >= 3
    e = load_experiment("robustness")
    assert len(e.arms) == 80 and len(e.plan(quick=True)[1]) == 8 and len(e.plan(quick=False)[1]) == 80
    bad = _experiment(tmp_path, {"a": ["algo.name=seeupo"], "b": ["algo.name=grpo"]})
    spec = yaml.safe_load(bad.read_text())
    spec["quick"] = {"arms": ["b"]}  # the reference "a" is missing
    bad.write_text(yaml.safe_dump(spec))
    with pytest.raises(Exception, match="include the reference"):
        load_experiment(str(bad))


def test_the_cli_counts_and_finishes_the_arms_quick_mode_runs(tmp_path):
    from typer.testing import CliRunner

    from seeupo.cli import app

    path = _experiment(tmp_path, {"a": ["algo.name=seeupo"], "b": ["algo.name=grpo"], "c": ["algo.name=gspo"]})
    spec = yaml.safe_load(path.read_text())
    spec["quick"] = {"arms": ["a"], "seeds": [0]}
    path.write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["sweep", str(path), "--quick", "--out", str(tmp_path / "out"), "--workers", "1"])
    assert res.exit_code == 0, res.output  # 1 of 1 trial done: success, not "1/6 finished"
    assert "1 arms x 1 seeds = 1 trials" in res.output and "1/1 trials finished" in res.output
    assert "[progress] trial a/seed-0: avg@k" in res.output and "; 1/1 done; 1 this run" in res.output, res.output
    # --records: the finished trial is packed, and a fresh folder with the same records reads it, trains nothing
    recs = tmp_path / "recs"
    for out in ("out", "fresh"):
        res = CliRunner().invoke(app, ["sweep", str(path), "--quick", "--out", str(tmp_path / out), "--workers", "1",
                                       "--records", str(recs)])
        assert res.exit_code == 0 and "1/1 trials finished" in res.output, res.output
    assert "1 finished trial(s) restored" in res.output, res.output
    assert "[progress] trial" not in res.output, res.output  # recorded as finished, not "run" in 0 s and counted twice
    assert not (tmp_path / "fresh" / "trials" / "a" / "seed-0" / "train.log").exists()  # read, not trained
    assert [p.name.split("-part-")[0] for p in recs.iterdir()] == ["mini-quick"]  # one part: nothing new the 2nd time
    assert ((tmp_path / "fresh" / "results.json").read_text().replace("fresh", "out")
            == (tmp_path / "out" / "results.json").read_text())


def test_records_restore_only_finished_trials_of_unchanged_arms(tmp_path):
    """--records without training: fabricated trial folders are packed, restored where their arm is
    defined as it was, skipped where it changed, and an unreadable part is a clear error."""
    from seeupo.sweep import records

    def spec(arms, out):
        return SweepSpec(load_experiment(str(_experiment(tmp_path, arms, seeds=(0, 1)))), tmp_path / out, quick=False)

    a = spec({"a": ["algo.name=seeupo"], "b": ["algo.name=grpo"]}, "one")
    for arm, seed in a.grid():
        f = a.folder(arm, seed)
        f.mkdir(parents=True)
        (f / "config.yaml").write_text(f"{arm} {seed}\n")
        (f / "metrics.jsonl").write_text(f'{{"arm": "{arm}", "seed": {seed}}}\n')
        if (arm, seed) != ("b", 1):  # an unfinished trial is not packed
            (f / "summary.json").write_text(json.dumps({"eval_after": {"avg@k": seed}}))
    recs = tmp_path / "recs"
    part = records.save(a, recs)
    assert records.packed(recs, "mini") == {("a", 0), ("a", 1), ("b", 0)}
    assert records.save(a, recs) is None  # nothing new
    changed = spec({"a": ["algo.name=seeupo"], "b": ["algo.name=gspo"]}, "two")
    assert records.restore(changed, recs) == {"restored": 2, "present": 0, "stale": 1, "tuning": 0}
    assert (changed.folder("a", 1) / "metrics.jsonl").read_text() == '{"arm": "a", "seed": 1}\n'
    assert not changed.folder("b", 0).exists()
    assert records.restore(changed, recs) == {"restored": 0, "present": 2, "stale": 1, "tuning": 0}
    part.write_bytes(part.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a readable records part"):
        records.restore(changed, recs)


def test_records_carry_tuning_trials_in_their_order_and_only_where_the_tuning_is_unchanged(tmp_path):
    """Fabricated tuning trials (no training): a configuration tried twice counts twice towards the
    budget after a restore, a tie goes to the trial that completed first where it ran (not in the
    restored study's order), a trial the study already has is not added again, a partly restored
    tuning leaves the tuned arm's comparison trials for the sweep, and a changed search space makes
    the tuning stale."""
    import optuna

    from seeupo.sweep import engine, records
    from seeupo.sweep import study as study_mod

    def spec(out, space=(0.0, 0.2), budget=3):
        path = tmp_path / "tune.yaml"
        path.write_text(yaml.safe_dump({
            "description": "test", "base": "tiny", "reference": "fixed", "seeds": [0], "overrides": SMALL,
            "arms": {"fixed": ["algo.name=grpo"]},
            "tune": {"budget": budget, "seeds": [100, 101], "space": {"algo.kl_coef": list(space)},
                     "arms": {"tuned": {"overrides": ["algo.name=grpo"]}}}}))
        sp = SweepSpec(load_experiment(str(path)), tmp_path / out, quick=False)
        sp.out.mkdir(parents=True, exist_ok=True)
        return sp

    def finish(folder, value):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yaml").write_text("x\n")
        (folder / "metrics.jsonl").write_text("{}\n")
        (folder / "summary.json").write_text(json.dumps({"eval_after": {"avg@k": value}}))

    a = spec("one")
    study = engine.tune_study(a, "tuned")
    dist = {"algo.kl_coef": optuna.distributions.CategoricalDistribution([0.0, 0.2])}
    # trial 0: kl 0.2 scores 0.5; trial 1: kl 0.0 scores 0.5 too (a tie: trial 0 wins); trial 2: kl 0.2 again
    for kl in (0.2, 0.0, 0.2):
        key = engine.params_key({"algo.kl_coef": kl})
        for s in (100, 101):
            finish(a.out / "tune" / "tuned" / key / f"seed-{s}", 0.25 if s == 100 else 0.75)
        study.add_trial(optuna.trial.create_trial(params={"algo.kl_coef": kl}, distributions=dist, value=0.5))
    best = engine.choose_tuned(a)
    assert best["tuned"]["params"] == {"algo.kl_coef": 0.2} and best["tuned"]["trials"] == 3
    for arm in ("fixed", "tuned"):
        finish(a.folder(arm, 0), 0.1)
    recs = tmp_path / "recs"
    records.save(a, recs)
    assert records.save(a, recs) is None
    assert len(records.packed_tuning(recs, "tune")) == 3
    # restored in a study that holds kl 0.0's trial already, added before the others: it completes
    # first there, but where it ran it completed second
    b = spec("two")
    second = sorted(study.get_trials(), key=lambda t: t.number)[1]
    engine.tune_study(b, "tuned").add_trial(optuna.trial.create_trial(
        params={"algo.kl_coef": 0.0}, distributions=dist, value=0.5,
        user_attrs={"uid": study_mod.trial_uid(second), "completed": study_mod.completed_at(second)}))
    got = records.restore(b, recs)
    assert got == {"restored": 2, "present": 0, "stale": 0, "tuning": 2}, got  # trial 1 was there already
    assert json.loads((b.out / "tuned.json").read_text()) == json.loads((a.out / "tuned.json").read_text())
    assert (b.folder("tuned", 0) / "summary.json").exists()
    # a budget of 4: tuning not done, so the tuned arm's trial waits for the sweep; the fixed one is restored
    c = spec("three", budget=4)
    assert records.restore(c, recs) == {"restored": 1, "present": 0, "stale": 0, "tuning": 3}
    assert c.tuned is None and not c.folder("tuned", 0).exists()
    assert len(list((c.out / "tune" / "tuned").glob("*/seed-101/summary.json"))) == 2
    # another search space: the tuning is stale, nothing of it restored
    d = spec("four", space=(0.0, 0.05))
    assert records.restore(d, recs) == {"restored": 1, "present": 0, "stale": 3, "tuning": 0}
    assert not (d.out / "tune").exists() and d.tuned is None


def test_a_trial_popped_twice_is_trained_once_and_recorded_complete(tmp_path):
    """Two workers can pop the same queued trial from a SQLite study: the one without the folder's
    lock leaves the trial to its holder, and a result whose trial was closed meanwhile is still
    recorded as complete (the cost sweep crashed with "Cannot tell a PRUNED trial")."""
    from optuna.trial import TrialState

    from seeupo.sweep.engine import _lock, _tell_done, prepare
    from seeupo.sweep.study import open_study

    exp = load_experiment(str(_experiment(tmp_path, {"a": ["algo.name=seeupo"]}, seeds=(0,))))
    spec = SweepSpec(exp, tmp_path / "out", quick=False, workers=1)
    spec.out.mkdir()
    assert prepare(spec)["queued"] == 1
    study = open_study(spec)
    trial = study.ask()
    held, holder = _lock(spec.folder("a", 0), trial.number)
    again, holder = _lock(spec.folder("a", 0), trial.number)
    assert held is not None and again is None and holder == trial.number  # the second sees who holds it
    study.tell(trial.number, state=TrialState.PRUNED)  # closed meanwhile
    _tell_done(study, trial, 0.5, user_attrs={"key": "a/seed-0"})
    held.close()
    done = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert len(done) == 1 and done[0].value == 0.5 and done[0].user_attrs["key"] == "a/seed-0"
    assert prepare(spec) == {"done": 1, "queued": 0, "given_up": 0}


def test_an_experiment_that_gains_an_arm_runs_only_the_new_arm(tmp_path):
    """Adding arms (or seeds) to a finished sweep: the same command trains just the new trials
    (Optuna refused them when the arm was a categorical parameter: "dynamic value space")."""
    path = _experiment(tmp_path, {"a": ["algo.name=seeupo"]}, seeds=(0,))
    first = SweepSpec(load_experiment(str(path)), tmp_path / "out", quick=False, workers=1)
    assert sweep(first)["done"] == 1
    spec = yaml.safe_load(path.read_text())
    spec["arms"]["b"] = ["algo.name=grpo"]
    path.write_text(yaml.safe_dump(spec))
    seen = []
    grown = SweepSpec(load_experiment(str(path)), tmp_path / "out", quick=False, workers=1)
    assert finished_trials(grown) == 1  # what the CLI's progress counts from
    assert sweep(grown, on_trial=lambda *a: seen.append(a[:2])) == {"done": 2, "queued": 0, "given_up": 0}
    assert seen == [("b", 0)]
    assert finished_trials(grown) == 2
    spec["arms"] = {"b": spec["arms"]["b"]}  # an arm the experiment no longer has is not counted
    spec["reference"] = "b"
    path.write_text(yaml.safe_dump(spec))
    assert finished_trials(SweepSpec(load_experiment(str(path)), tmp_path / "out", quick=False)) == 1


def test_a_trial_stopped_from_outside_is_resumed_in_the_same_sweep_not_failed(tmp_path):
    # SIGTERM to the trial's run only (not the sweep): with no retries allowed, it must still finish
    path = _experiment(tmp_path, {"a": []}, seeds=[0], overrides=[*SMALL[:-1], "run.iterations=15",
                                                                   "run.checkpoint_every=0"])
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "seeupo", "sweep", str(path), "--out", str(out), "--workers", "1",
           "--max-retries", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    folder = out / "trials" / "a" / "seed-0"
    _wait_for_training(proc, folder)
    _stop_run_of(folder)
    text = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, text
    assert "stopped from outside: queued again" in text
    commands = [x for x in (folder / "train.log").read_text().splitlines() if x.startswith("$ ")]
    assert len(commands) == 2 and "--resume" in commands[1]
    assert [r["iteration"] for r in _train_lines(folder) if "reward_mean" in r] == list(range(15))
    assert json.loads((out / "results.json").read_text())["arms"][0]["n"] == 1
    import optuna

    trials = optuna.load_study(study_name="mini", storage=f"sqlite:///{out / 'study.db'}").get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"] and trials[0].user_attrs["interrupted"]


# slow (-m slow; about 2.5 minutes of the default run): a tuning trial and the two compared arms,
# 15 iterations each; the stop-and-resume path it takes is the one the test above checks
@pytest.mark.slow
def test_a_tuning_trial_stopped_from_outside_resumes_its_parameters(tmp_path):
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump({
        "description": "test", "base": "tiny", "reference": "fixed", "seeds": [0],
        "overrides": [*SMALL[:-1], "run.iterations=15", "run.checkpoint_every=0"], "arms": {"fixed": []},
        "tune": {"budget": 1, "seeds": [100], "space": {"algo.kl_coef": [0.0, 0.2]}, "arms": {"tuned": {"overrides": []}}}}))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "seeupo", "sweep", str(path), "--out", str(out), "--workers", "1", "--max-retries", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    folder = _wait_for_training(proc, out / "tune")
    assert folder is not None
    _stop_run_of(folder)
    text = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, text
    commands = [x for x in (folder / "train.log").read_text().splitlines() if x.startswith("$ ")]
    assert len(commands) == 2 and "--resume" in commands[1]  # the same parameters, its folder resumed
    assert len(list((out / "tune" / "tuned").glob("*/seed-100/summary.json"))) == 1
    import optuna

    trials = optuna.load_study(study_name="tune-tune-tuned", storage=f"sqlite:///{out / 'study.db'}").get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"] and trials[0].user_attrs["interrupted"]
    assert trials[0].params == trials[1].params


def test_a_tuning_trial_popped_twice_is_left_to_its_holder_and_its_result_kept(tmp_path, monkeypatch):
    """The tuning phase's version of the double pop: the worker without the folder's lock must not
    close the trial its holder is training (the `fair` sweep lost a finished PPO trial and a worker to
    "Cannot tell a PRUNED trial"), and a result whose trial was closed anyway is kept as complete."""
    from optuna.trial import TrialState

    from seeupo.sweep import engine

    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump({
        "description": "test", "base": "tiny", "reference": "fixed", "seeds": [0], "overrides": SMALL,
        "arms": {"fixed": []},
        "tune": {"budget": 2, "seeds": [100], "space": {"algo.kl_coef": [0.0, 0.2]}, "arms": {"tuned": {"overrides": []}}}}))
    spec = SweepSpec(load_experiment(str(path)), tmp_path / "out", quick=False, workers=1)
    spec.out.mkdir()
    study = engine.tune_study(spec, "tuned")
    study.enqueue_trial({"algo.kl_coef": 0.2})
    held = study.ask()  # the holder: popped by one worker ...
    params = {"algo.kl_coef": held.suggest_categorical("algo.kl_coef", [0.0, 0.2])}
    lock, _ = engine._lock(spec.out / "tune" / "tuned" / engine.params_key(params), held.number)

    class PoppedTwice:  # ... and the same trial handed to the other worker by its first ask
        def __init__(self):
            self.first = True

        def __getattr__(self, name):
            return getattr(study, name)

        def ask(self):
            if self.first:
                self.first = False
                return held
            return study.ask()

    trained = []

    def run_folder(spec, folder, *a):  # the trial it trains is closed meanwhile by another worker
        trained.append(folder.parent)
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.number != held.number:
                study.tell(t.number, state=TrialState.PRUNED)
        return 0.5

    monkeypatch.setattr(engine, "tune_study", lambda spec, arm: PoppedTwice())
    monkeypatch.setattr(engine, "run_folder", run_folder)
    engine.tune_work(spec)  # budget 2: the held trial and one more
    assert study.get_trials()[held.number].state == TrialState.RUNNING
    other = {"algo.kl_coef": 0.0}
    assert trained == [spec.out / "tune" / "tuned" / engine.params_key(other)]
    done = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert [(t.params, t.value) for t in done] == [(other, 0.5)]  # kept, though its trial was closed
    lock.close()
    monkeypatch.undo()


def test_tuning_workers_propose_apart(tmp_path):
    """Each worker's sampler has its own seed: with one seed for all, two workers proposed the same
    start-up configurations in step (in `fair`, duplicates that took budget slots)."""
    from seeupo.sweep import engine

    path = tmp_path / "tune.yaml"
    space = {"algo.kl_coef": [0.0, 0.05, 0.1, 0.2], "algo.clip_eps": [0.1, 0.2, 0.3, 0.4]}
    path.write_text(yaml.safe_dump({
        "description": "test", "base": "tiny", "reference": "fixed", "seeds": [0], "overrides": SMALL,
        "arms": {"fixed": []}, "tune": {"budget": 4, "seeds": [100], "space": space, "arms": {"tuned": {"overrides": []}}}}))

    def proposals(worker: int, out: str) -> list[dict]:
        spec = SweepSpec(load_experiment(str(path)), tmp_path / out, quick=False, workers=2, worker=worker)
        spec.out.mkdir()
        study = engine.tune_study(spec, "tuned")
        out = []
        for _ in range(4):
            t = study.ask()
            out.append({k: t.suggest_categorical(k, v) for k, v in space.items()})
        return out

    assert proposals(0, "a") == proposals(0, "b")  # one worker: reproducible
    assert proposals(0, "c") != proposals(1, "d")


def test_the_report_names_the_platforms_when_trials_ran_on_several(tmp_path):
    """A sweep continued on another machine (--records): the report lists each platform its trials
    ran on, and says nothing when there was one."""
    summary = {"eval_before": {"avg@k": 0.1}, "eval_after": {"avg@k": 0.5}, "wall_seconds": 60}
    plat = {"cpu": "EPYC", "cpu_capability": "AVX2", "gpu": None, "threads": 1, "python": "3.11",
            "torch": "2.13.0", "transformers": "5.24.0", "peft": "0.21.2"}
    for seed, cap in ((0, "AVX2"), (1, "AVX2"), (2, "AVX512")):
        f = tmp_path / "trials" / "a" / f"seed-{seed}"
        f.mkdir(parents=True)
        (f / "metrics.jsonl").write_text("")
        (f / "summary.json").write_text(json.dumps({**summary, "platforms": [{**plat, "cpu_capability": cap}]}))
    res = results(tmp_path, experiment="mini", metric="avg@k", reference="a", arms_order=["a"])
    assert res["arms"][0]["platforms"]["2"].startswith("EPYC (AVX512), torch 2.13.0, transformers 5.24.0")
    write(tmp_path, res)
    report = (tmp_path / "report.md").read_text()
    assert "ran on 2 platforms" in report and "- EPYC (AVX2), torch" in report and "- EPYC (AVX512)" in report
    assert res["arms"][0]["diff_pairs_across_platforms"] == 0  # the reference is not paired with itself
    (tmp_path / "trials" / "a" / "seed-2" / "summary.json").write_text(json.dumps({**summary, "platforms": [plat]}))
    write(tmp_path, results(tmp_path, experiment="mini", metric="avg@k", reference="a", arms_order=["a"]))
    assert "platforms" not in (tmp_path / "report.md").read_text()


def test_the_report_counts_the_pairs_whose_trials_ran_on_different_platforms(tmp_path):
    """Arm b's seed 1 ran on another CPU kind than the reference's seed 1: its paired difference says
    that one of its pairs crosses platforms; seed 2's platform is not recorded, so it is not counted."""
    plat = {"cpu": "EPYC", "cpu_capability": "AVX2", "gpu": None, "threads": 1, "python": "3.11",
            "torch": "2.13.0", "transformers": "5.24.0", "peft": "0.21.2"}
    where = {("a", 0): "AVX2", ("a", 1): "AVX2", ("a", 2): "AVX2",
             ("b", 0): "AVX2", ("b", 1): "AVX512", ("b", 2): None}
    for (arm, seed), cap in where.items():
        f = tmp_path / "trials" / arm / f"seed-{seed}"
        f.mkdir(parents=True)
        (f / "metrics.jsonl").write_text("")
        s = {"eval_before": {"avg@k": 0.1}, "eval_after": {"avg@k": 0.5 + 0.1 * seed}, "wall_seconds": 60}
        if cap:
            s["platforms"] = [{**plat, "cpu_capability": cap}]
        (f / "summary.json").write_text(json.dumps(s))
    res = results(tmp_path, experiment="mini", metric="avg@k", reference="a", arms_order=["a", "b"])
    assert [a["diff_pairs_across_platforms"] for a in res["arms"]] == [0, 1]
    write(tmp_path, res)
    assert "`b` 1 of 3" in (tmp_path / "report.md").read_text()


def test_the_report_gives_each_arms_drawdown_from_its_training_curves(tmp_path):
    """Per arm, the mean over seeds of each run's drawdown (the largest fall of its 3-iteration mean
    training success below its running best): a run that only rises has 0; one at 0.6 that falls to 0
    and stays has 0.6 (trailing means 0.6, 0.6, 0.6, 0.4, 0.2, 0.0)."""
    curves = {("a", 0): [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], ("a", 1): [0.2, 0.2, 0.3, 0.3, 0.4, 0.4],
              ("b", 0): [0.6, 0.6, 0.6, 0.0, 0.0, 0.0], ("b", 1): [0.3, 0.3, 0.3, 0.3, 0.3, 0.0]}
    for (arm, seed), success in curves.items():
        f = tmp_path / "trials" / arm / f"seed-{seed}"
        f.mkdir(parents=True)
        (f / "metrics.jsonl").write_text("".join(
            json.dumps({"iteration": i, "reward_mean": s, "success_rate": s}) + "\n" for i, s in enumerate(success)))
        (f / "summary.json").write_text(json.dumps(
            {"eval_before": {"avg@k": 0.1}, "eval_after": {"avg@k": 0.5}, "wall_seconds": 60}))
    res = results(tmp_path, experiment="mini", metric="avg@k", reference="a", arms_order=["a", "b"])
    a, b = res["arms"]
    assert a["drawdown_mean"] == pytest.approx(0.0)
    # b: seed 0 falls 0.6; seed 1's trailing mean ends at (0.3 + 0.3 + 0) / 3 = 0.2, 0.1 below 0.3
    assert b["per_seed"]["0"]["drawdown"] == pytest.approx(0.6)
    assert b["per_seed"]["1"]["drawdown"] == pytest.approx(0.1)
    assert b["drawdown_mean"] == pytest.approx(0.35)
    write(tmp_path, res)
    report = (tmp_path / "report.md").read_text()
    assert "| drawdown |" in report
    row = next(line for line in report.splitlines() if line.startswith("| b |"))
    assert "| 0.350 |" in row, row


def test_the_report_gives_verdicts_to_declared_primaries_only(tmp_path):
    """p: the exact sign-flip p-value of each arm's paired differences (enumerated by hand in
    tests/unit/test_stats.py). Without declared primaries every contrast is exploratory: no p_holm,
    no detectable, no verdict. With b, c and d against a declared (margin 0.1): p_holm is Holm across
    those three alone, d is higher, b and c (4 pairs) inconclusive with no detectable difference at
    n = 4; a primary between two non-reference arms is reported too. Gains: the exact test, Holm
    across the four arms' gains."""
    import math

    base = [0.2, 0.3, 0.4, 0.5, 0.25, 0.35, 0.45, 0.55]
    shifts = {"b": [0.3, 0.1, -0.05, 0.2], "c": [0.4, 0.3, 0.2, 0.1], "d": [0.2, 0.1, 0.3, 0.2, 0.25, 0.15, 0.2, 0.3]}
    arms = {"a": base, **{k: [x + dx for x, dx in zip(base, v)] for k, v in shifts.items()}}
    for arm, values in arms.items():
        for seed, v in enumerate(values):
            f = tmp_path / "trials" / arm / f"seed-{seed}"
            f.mkdir(parents=True)
            (f / "metrics.jsonl").write_text("")
            (f / "summary.json").write_text(json.dumps(
                {"eval_before": {"avg@k": 0.1}, "eval_after": {"avg@k": v}, "wall_seconds": 60}))
    res = results(tmp_path, experiment="mini", metric="avg@k", reference="a", arms_order=list(arms))
    by = {a["name"]: a for a in res["arms"]}
    assert res["exploratory"] and res["primary"] == []
    assert by["b"]["p"] == pytest.approx(4 / 16) and by["c"]["p"] == pytest.approx(2 / 16)
    assert by["d"]["p"] == pytest.approx(2 / 256)
    assert all(by[k]["p_holm"] is None and by[k]["detectable"] is None and by[k]["exploratory"] for k in "bcd")
    assert not any("verdict" in by[k] for k in "bcd")
    # gains: a and d rise on 8 of 8 seeds (p 2/256), b and c on 4 of 4 (2/16); Holm across the four arms
    assert [by[k]["gain_verdict"] for k in "abcd"] == ["higher", "inconclusive", "inconclusive", "higher"]
    assert by["a"]["gain_p_holm"] == pytest.approx(4 * 2 / 256)
    write(tmp_path, res)
    assert "exploratory as a whole" in (tmp_path / "report.md").read_text()

    res = results(tmp_path, experiment="mini", metric="avg@k", reference="a", arms_order=list(arms),
                  primary=[("d", "a"), ("c", "a"), ("b", "a"), ("d", "c")], margin=0.1)
    by = {a["name"]: a for a in res["arms"]}
    prim = {c["contrast"]: c for c in res["primary"]}
    assert list(prim) == ["d - a", "c - a", "b - a", "d - c"] and not res["exploratory"]
    # sorted p: d-a 2/256 x 4, c-a 2/16 x 3, d-c (4 pairs: -0.2, -0.2, 0.1, 0.1) and b-a, made non-decreasing
    assert by["d"]["p_holm"] == pytest.approx(8 / 256) == prim["d - a"]["p_holm"]
    assert by["c"]["p_holm"] == pytest.approx(0.375)
    assert [prim[k]["verdict"] for k in prim] == ["higher", "inconclusive", "inconclusive", "inconclusive"]
    assert by["d"]["verdict"] == "higher" and not by["d"]["exploratory"]
    assert by["b"]["detectable"] is None and by["c"]["detectable"] is None  # 4 pairs: nothing can be declared
    d = shifts["d"]
    sd = math.sqrt(sum((x - sum(d) / 8) ** 2 for x in d) / 7)
    assert 1.2 * sd < by["d"]["detectable"] < 2.5 * sd  # simulated: exact test, Holm over 4 at n = 8
    for key in ("p", "p_holm", "tost_p", "tost_p_holm", "tost_p_lower", "tost_p_upper", "detectable", "verdict"):
        assert key in prim["d - a"]
    assert prim["d - a"]["ci"][0] > 0  # the inverted interval agrees with the verdict
    # the t interval of the paired differences: mean 0.2125 +- t_{0.975, 7} sd / sqrt(8)
    assert by["d"]["diff_ci95"] == pytest.approx([0.2125 - 2.364624 * sd / math.sqrt(8),
                                                   0.2125 + 2.364624 * sd / math.sqrt(8)], rel=1e-5)
    write(tmp_path, res)
    report = (tmp_path / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| d - a |"))
    assert "| 0.008 | 0.031 |" in row and "**higher**" in row, row


def test_the_report_gives_the_environment_counters_before_and_after(tmp_path):
    """Per arm, the mean over seeds of each counter the evaluations recorded (trap: guess, vault,
    deep), before RL and after; an arm whose summaries have none gets none."""
    envs = {("a", 0): ({"deep": 0.05, "guess": 0.2}, {"deep": 0.25, "guess": 0.1}),
            ("a", 1): ({"deep": 0.15, "guess": 0.4}, {"deep": 0.35, "guess": 0.0})}
    for (arm, seed), (before, after) in envs.items():
        f = tmp_path / "trials" / arm / f"seed-{seed}"
        f.mkdir(parents=True)
        (f / "summary.json").write_text(json.dumps({"eval_before": {"avg@k": 0.1, "env": before},
                                                    "eval_after": {"avg@k": 0.5, "env": after}, "wall_seconds": 60}))
    for seed in (0, 1):
        f = tmp_path / "trials" / "b" / f"seed-{seed}"
        f.mkdir(parents=True)
        (f / "summary.json").write_text(json.dumps({"eval_before": {"avg@k": 0.1}, "eval_after": {"avg@k": 0.2 + seed},
                                                    "wall_seconds": 60}))
    res = results(tmp_path, experiment="mini", metric="avg@k", reference="a", arms_order=["a", "b"])
    a, b = res["arms"]
    assert a["env_before"] == pytest.approx({"deep": 0.10, "guess": 0.30})
    assert a["env_after"] == pytest.approx({"deep": 0.30, "guess": 0.05})
    assert b["env_before"] == {} == b["env_after"]
    write(tmp_path, res)
    report = (tmp_path / "report.md").read_text()
    assert "- a: deep 0.100 -> 0.300, guess 0.300 -> 0.050" in report and "- b:" not in report


def test_arms_of_one_configuration_and_underpowered_primaries_are_refused(tmp_path):
    """Two arms that resolve to one configuration would count the same trials twice in a family; a
    primary family that cannot reach p_holm < 0.05 at its seeds is refused at start with the seeds it
    needs (issue 58)."""
    from seeupo.train.config import ConfigError

    twins = load_experiment(str(_experiment(tmp_path, {"a": ["algo.name=grpo"], "b": ["algo.name=grpo", "optim.lr=5e-4"]})))
    with pytest.raises(ConfigError, match="arms a and b have the same configuration"):
        twins.validate_arms(False)
    path = tmp_path / "under.yaml"
    path.write_text(yaml.safe_dump({"description": "t", "base": "tiny", "reference": "a", "seeds": [0, 1, 2, 3, 4],
                                    "primary": ["b - a", "c - a"], "margin": 0.1,
                                    "arms": {"a": ["algo.name=seeupo"], "b": ["algo.name=grpo"], "c": ["algo.name=gspo"]}}))
    exp = load_experiment(str(path))
    assert exp.underpowered() == 7  # 2 primaries: 2 x 2/2^n < 0.05 first at n = 7
    run = subprocess.run([sys.executable, "-m", "seeupo", "sweep", str(path), "--out", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "it needs at least 7 seeds" in " ".join(run.stderr.split())
    assert not (tmp_path / "s" / "trials").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("margin: 0.1", "margin: null"))
    with pytest.raises(Exception, match="primary contrasts need a margin"):
        load_experiment(str(bad))


def test_seed_order_runs_blocks_of_seeds_as_wide_as_the_workers(tmp_path):
    path = tmp_path / "ordered.yaml"
    path.write_text(yaml.safe_dump({"description": "t", "base": "tiny", "reference": "a", "seeds": [0, 1, 2],
                                    "order": "seeds", "arms": {"a": ["algo.name=seeupo"], "b": ["algo.name=grpo"]}}))
    exp = load_experiment(str(path))
    assert SweepSpec(exp, tmp_path, quick=False, workers=2).grid() == [("a", 0), ("a", 1), ("b", 0), ("b", 1),
                                                                        ("a", 2), ("b", 2)]
    assert SweepSpec(exp, tmp_path, quick=False, workers=1).grid() == [("a", 0), ("b", 0), ("a", 1), ("b", 1),
                                                                        ("a", 2), ("b", 2)]
