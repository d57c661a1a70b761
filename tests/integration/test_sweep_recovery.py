"""Several machines, one study: a worker that dies (SIGKILL, its machine gone) leaves its trial RUNNING;
its heartbeat goes stale, and the trial is failed as interrupted, queued again and resumed from its
checkpoint by another worker. The tuning budget holds when two workers ask at once, and a restore
of --records never leaves a folder that looks finished but is not."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from seeupo.sweep.study import KEY, SweepSpec
from seeupo.sweep.experiment import load_experiment

SMALL = ["warmup.episodes=16", "warmup.epochs=1", "eval.tasks=2", "eval.k=2", "rollout.tasks_per_iteration=2",
         "rollout.group_size=2", "run.loggers=[jsonl]"]


def _experiment(tmp_path: Path, seeds, overrides, tune=None) -> Path:
    path = tmp_path / "mini.yaml"
    spec = {"description": "test", "base": "tiny", "reference": "a", "seeds": list(seeds),
            "overrides": list(overrides), "arms": {"a": []}}
    if tune:
        spec["tune"] = tune
    path.write_text(yaml.safe_dump(spec))
    return path


def _trials(url: str, name: str = "mini"):
    import optuna

    return optuna.load_study(study_name=name, storage=url).get_trials()


def _child_run(pid: int) -> tuple[int, Path] | None:
    """The process id and run folder of the ``seeupo train`` child of process ``pid``, if it has one now."""
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    for kid in kids:
        try:
            args = Path(f"/proc/{kid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "train" in args and "--out" in args:
            return int(kid), Path(args[args.index("--out") + 1])
    return None


def test_a_dead_workers_trial_is_queued_again_and_resumed_by_another(tmp_path):
    """Two workers on one SQLite study; one is killed (with its run: the machine died) after its
    trial's first checkpoint. The other finishes its own trial, finds the dead one's heartbeat stale,
    takes that trial again and resumes its folder: every grid point ends with one complete trial,
    and no run was trained twice to the end."""
    path = _experiment(tmp_path, [0, 1], [*SMALL, "run.iterations=12", "run.checkpoint_every=3"])
    out, url = tmp_path / "out", f"sqlite:///{tmp_path / 'shared.db'}"
    cmd = [sys.executable, "-m", "seeupo", "sweep", str(path), "--out", str(out), "--storage", url,
           "--workers", "1", "--heartbeat", "1"]
    a = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    b = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, run = time.time() + 120, None
        while time.time() < deadline and a.poll() is None:
            run = _child_run(a.pid)
            if run is not None and (run[1] / "checkpoints" / "latest").exists():
                break
            time.sleep(0.2)
        assert run is not None and (run[1] / "checkpoints" / "latest").exists(), "worker a trained nothing"
        pid, folder = run
        a.kill()  # SIGKILL: no chance to mark its trial; then its run, as a dead machine's would be
        os.kill(pid, signal.SIGKILL)
        a.wait(timeout=30)
        text = b.communicate(timeout=240)[0]
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
    assert b.returncode == 0, text
    assert "2/2 trials finished" in text, text
    killed = f"a/{folder.name}"
    assert f"[progress] trial {killed}:" in text, text  # worker b trained the dead worker's trial
    by_key: dict[str, list] = {}
    for t in _trials(url):
        by_key.setdefault(t.user_attrs.get(KEY), []).append(t)
    assert set(by_key) == {"a/seed-0", "a/seed-1"}, by_key
    for key, ts in by_key.items():
        assert [t.state.name for t in ts].count("COMPLETE") == 1, (key, [t.state.name for t in ts])
    dead = [t for t in by_key[killed] if t.state.name == "FAIL"]
    import optuna

    marks = optuna.load_study(study_name="mini", storage=url).user_attrs  # failed by Optuna's fail_stale_trials
    assert len(dead) == 1 and marks[f"interrupted:{dead[0].number}"] == "stale"
    for seed in (0, 1):
        f = out / "trials" / "a" / f"seed-{seed}"
        log = (f / "train.log").read_text()
        assert (f / "summary.json").exists() and log.count("\ndone in ") == 1, log  # trained to the end once
        iterations = [r["iteration"] for r in map(json.loads, (f / "metrics.jsonl").read_text().splitlines())
                      if "reward_mean" in r]
        assert iterations == list(range(12)), (seed, iterations)
    commands = [x for x in (folder / "train.log").read_text().splitlines() if x.startswith("$ ")]
    assert len(commands) == 2 and "--resume" in commands[1]
    assert "resumed from" in (folder / "train.log").read_text()  # from its checkpoint, not afresh


def _spec(tmp_path: Path, **kw) -> SweepSpec:
    path = _experiment(tmp_path, [0, 1], SMALL, tune={
        "budget": 2, "seeds": [100], "space": {"algo.kl_coef": [0.0, 0.2]}, "arms": {"tuned": {"overrides": []}}})
    spec = SweepSpec(load_experiment(str(path)), tmp_path / "out", quick=False, storage=f"sqlite:///{tmp_path / 's.db'}",
                     heartbeat=1, **kw)
    spec.out.mkdir()
    return spec


def test_a_stale_trial_is_failed_as_interrupted_and_queued_again_a_live_one_is_not(tmp_path):
    """No training: a trial whose worker stopped beating is failed (interrupted, stale: not a failure)
    and its grid point queued again by prepare(); one whose heartbeat goes on is left alone; in
    tuning, the stale trial's parameters are queued again and the budget no longer counts it."""
    from optuna.trial import TrialState

    from seeupo.sweep import engine
    from seeupo.sweep import study as sweep_study

    spec = _spec(tmp_path, max_retries=0)
    assert engine.prepare(spec, owner=False) == {"done": 0, "queued": 2, "given_up": 0}
    study = sweep_study.open_study(spec)
    dead, live = sweep_study.ask(study), sweep_study.ask(study)
    with sweep_study.heartbeat(spec, study, dead):  # one beat, then its machine dies
        pass
    tune = engine.tune_study(spec, "tuned")
    gone = sweep_study.ask(tune)
    gone.suggest_categorical("algo.kl_coef", [0.0, 0.2])
    with sweep_study.heartbeat(spec, tune, gone):
        pass
    with sweep_study.heartbeat(spec, study, live):
        time.sleep(5.5)  # over 3 heartbeats of 1 s (the database's clock counts whole seconds)
        assert engine.prepare(spec, owner=False) == {"done": 0, "queued": 2, "given_up": 0}
    states = {t.number: t for t in study.get_trials()}
    assert states[dead.number].state == TrialState.FAIL and study.user_attrs[f"interrupted:{dead.number}"] == "stale"
    assert states[live.number].state == TrialState.RUNNING
    assert [t.user_attrs[KEY] for t in study.get_trials(states=(TrialState.WAITING,))] == [
        states[dead.number].user_attrs[KEY]]
    assert sweep_study.failures(study, study.get_trials()) == (0, 1)  # an interruption, not a failure (max_retries 0)

    trained = []

    def run_folder(spec, folder, *a):
        trained.append(folder.parent.name)
        return 0.5

    with pytest.MonkeyPatch.context() as m:
        m.setattr(engine, "run_folder", run_folder)
        engine.tune_work(spec)  # the stale tuning trial: failed, its parameters queued and tried again
    trials = tune.get_trials()
    # the budget, the stale trial not counted; and no trial asked once the budget was seen used
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert tune.user_attrs[f"interrupted:{trials[0].number}"] == "stale"
    assert trials[1].system_attrs.get("fixed_params") == trials[0].params  # queued again, not TPE's pick
    assert trials[1].params == trials[0].params and len(trained) == 2


@pytest.mark.parametrize("other_first", [True, False])
def test_two_tuning_workers_asking_for_the_last_slot_train_one_trial(tmp_path, monkeypatch, other_first):
    """Budget 2, one trial complete: two workers both see one slot left and both ask. The one whose
    trial came second (by number) gives it back as spare, trained nothing; the first trains."""
    import optuna
    from optuna.trial import TrialState

    from seeupo.sweep import engine
    from seeupo.sweep import study as sweep_study

    spec = _spec(tmp_path)
    study = engine.tune_study(spec, "tuned")
    study.add_trial(optuna.trial.create_trial(value=0.1, params={"algo.kl_coef": 0.0},
                                              distributions={"algo.kl_coef": optuna.distributions.CategoricalDistribution([0.0, 0.2])}))
    other = []

    class Racing:  # the other worker's ask comes between this one's count and its ask (or just after)
        def __getattr__(self, name):
            return getattr(study, name)

        def ask(self):
            if other_first and not other:
                other.append(sweep_study.ask(study))
            mine = sweep_study.ask(study)
            if not other:
                other.append(sweep_study.ask(study))
            return mine

    trained = []
    monkeypatch.setattr(engine, "tune_study", lambda spec, arm: Racing())
    monkeypatch.setattr(engine, "run_folder", lambda spec, folder, *a: trained.append(folder) or 0.5)
    engine.tune_work(spec)
    mine = [t for t in study.get_trials() if t.number not in (0, other[0].number)]
    if other_first:  # second by number: given back, nothing trained
        assert trained == [] and [t.state for t in mine] == [TrialState.PRUNED] and mine[0].user_attrs["spare"]
        assert study.get_trials()[other[0].number].state == TrialState.RUNNING  # the other one trains
    else:  # first: trains; the other worker's recount gives its trial back
        assert len(trained) == 1 and [t.state for t in mine] == [TrialState.COMPLETE]
        assert not engine._tune_one(spec, study, other[0], "tuned", [], {"algo.kl_coef": [0.0, 0.2]}, 2, [100], None)
        assert study.get_trials()[other[0].number].state == TrialState.PRUNED and len(trained) == 1


def test_a_restore_stopped_midway_leaves_no_folder_that_looks_finished(tmp_path, monkeypatch):
    """--records: each file is written whole under a temporary name and renamed, summary.json last; a
    restore that dies while writing leaves no truncated file and no summary.json, and the next one
    completes the folder."""
    from seeupo.sweep import records

    path = _experiment(tmp_path, [0], SMALL)
    one = SweepSpec(load_experiment(str(path)), tmp_path / "one", quick=False)
    f = one.folder("a", 0)
    f.mkdir(parents=True)
    files = {"config.yaml": b"a: 1\n", "metrics.jsonl": b'{"iteration": 0}\n' * 1000,
             "summary.json": json.dumps({"eval_after": {"avg@k": 0.5}}).encode()}
    for name, data in files.items():
        (f / name).write_bytes(data)
    recs = tmp_path / "recs"
    records.save(one, recs)
    two = SweepSpec(load_experiment(str(path)), tmp_path / "two", quick=False)
    real = os.fsync
    seen = []

    def crash(fd):  # the machine dies with metrics.jsonl's bytes not yet on disk
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        if "metrics.jsonl" in seen[-1]:
            raise OSError("killed")
        real(fd)

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="killed"):
        records.restore(two, recs)
    g = two.folder("a", 0)
    assert (g / "config.yaml").read_bytes() == files["config.yaml"]
    assert not (g / "metrics.jsonl").exists() and not (g / "summary.json").exists()  # not truncated, not "finished"
    monkeypatch.setattr(os, "fsync", real)
    assert records.restore(two, recs) == {"restored": 1, "present": 0, "stale": 0, "tuning": 0}
    assert {n: (g / n).read_bytes() for n in files} == files
    assert sorted(p.name for p in g.iterdir()) == sorted(files)  # no temporary left behind


def test_reuse_takes_another_experiments_trials_of_an_identically_defined_arm_only(tmp_path):
    """--reuse-records: a finished trial of another experiment whose arm has the same definition (base and
    overrides, under another name) and a seed this one runs is taken; one of a differently defined arm,
    of a seed this one does not run, or where this sweep already finished, is not."""
    from seeupo.sweep import records

    other_path = tmp_path / "other.yaml"
    other_path.write_text(yaml.safe_dump({"description": "test", "base": "tiny", "reference": "x", "seeds": [0, 5],
                                          "overrides": SMALL, "arms": {"b": ["algo.name=grpo"], "x": []}}))
    other = SweepSpec(load_experiment(str(other_path)), tmp_path / "other", quick=False)
    for arm, seed in [("b", 0), ("x", 0), ("x", 5)]:  # b, defined otherwise, is read first
        f = other.folder(arm, seed)
        f.mkdir(parents=True)
        for name in records.FILES:
            (f / name).write_text(f"{arm} {seed} {name}\n")
    recs = tmp_path / "recs"
    records.save(other, recs)
    mine = SweepSpec(load_experiment(str(_experiment(tmp_path, [0, 1], SMALL))), tmp_path / "mine", quick=False)
    assert records.reuse(mine, recs) == {"a": ["other/x/seed-0"]}  # b: algo.name=grpo; seed 5: not run here
    assert (mine.folder("a", 0) / "summary.json").read_text() == "x 0 summary.json\n"
    assert not mine.folder("a", 1).exists()
    (mine.folder("a", 0) / "summary.json").write_text("mine\n")  # finished here: left alone
    assert records.reuse(mine, recs) == {}
    assert (mine.folder("a", 0) / "summary.json").read_text() == "mine\n"
