"""``seeupo sweep``: the trials of an experiment (every arm x seed) on an Optuna study.

Optuna is the engine: the study (a SQLite file ``DIR/study.db`` by default, or any database URL
that several machines share) holds one trial per (arm, seed) with its state and metric; each grid
point is put on the study's queue (``enqueue_trial``) and workers take trials with ``ask`` and
report with ``tell``, so any number of worker processes, here or on other machines, share the work
(``optuna-dashboard sqlite:///DIR/study.db`` shows it live). Optuna's ``GridSampler`` is not used:
it counts a failed grid point as visited and, once every point has started, hands out running ones
again, which would run one folder twice; the queue gives each point to one worker.

Each trial is an ordinary run folder, ``DIR/trials/ARM/seed-S`` (the files of ``seeupo train``,
plus ``train.log``), trained by ``seeupo train`` in a child process with ``--trial-threads`` CPU
threads (default 1, so a trial's result depends only on its config and seed, not on the worker
count). Re-running the command skips finished trials (their ``summary.json``), resumes interrupted
ones from their checkpoints (an interruption does not count as a failure), and re-queues failed
ones up to ``max_retries`` times. A trial whose own run is stopped by SIGTERM, SIGINT or SIGHUP
while the sweep goes on is an interruption too: queued again and resumed within the same sweep.

Several machines: while a trial runs, its worker records a heartbeat in the study every
``heartbeat`` seconds (Optuna's RDBStorage heartbeat; ``study.optimize`` would start that thread,
``ask``/``tell`` do not, so ``study.heartbeat`` does). A trial whose heartbeat is older than
``GRACE_FACTOR`` heartbeats lost its worker (a machine that died, a SIGKILL): ``prepare`` and every
worker, before it takes its next trial, fail it with Optuna's ``fail_stale_trials`` as an interruption
(not a failure) and queue it again, and whoever takes it resumes its run folder from its checkpoint, so the folders (``--out``)
must be on a file system the machines share. The tuning budget counts only live trials, and a
worker whose ``ask`` came after the budget was used gives its trial back (see ``tune_work``).

Only Optuna's public API is used (``seeupo/sweep/study.py`` holds what touches the storage); a test
greps the package for Optuna's private names.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from seeupo.sweep import records
from seeupo.sweep.experiment import yaml_value
from seeupo.sweep.study import (KEY, SweepSpec, ask, choose_tuned, fail_stale, failures, finished_value, heartbeat,
                                interrupt, interruption_marks, key, open_study, params_key, parse_key, queue_lock,
                                tune_study)

REPORT_SECONDS = 5.0  # how often a running trial's new metrics lines are reported to its Optuna trial
INTERRUPTED = "interrupted"  # the value ``on_trial`` gets for a trial whose run was stopped from outside
# interruptions do not count as failures, but a trial stopped this often (e.g. by a memory watchdog
# that sends SIGTERM) is given up, so no sweep loops without bound
MAX_INTERRUPTIONS = 10


def finished_trials(spec: SweepSpec) -> int:
    """How many of the sweep's grid trials (fixed arms, and tuned arms once tuned, x seeds) have a
    finished run folder (its ``summary.json``): restored records count, trials of arms the
    experiment no longer has do not."""
    seeds, fixed = spec.exp.plan(spec.quick)
    arms = [*fixed, *spec.exp.tune_plan(spec.quick)[2]]
    return sum((spec.folder(arm, s) / "summary.json").exists() for arm in arms for s in seeds)


def duration(seconds: float) -> str:
    """A rough human duration: seconds under 2 minutes, minutes under 2 hours, else hours.

    >>> duration(42.4), duration(1500), duration(7200), duration(81000)
    ('42 s', '25 min', '2.0 h', '22.5 h')
    """
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def pace(done: int, total: int, trial_seconds: list[float], workers: int) -> str:
    """Where a sweep stands: trials done of all, and the time left if the rest take as long as the
    ``trial_seconds`` of the trials this run has finished, ``workers`` at a time (the median trial, not
    the time since the start: with N workers the first trials end together, after one trial's time; the
    median, not the mean, so that one trial that spent hours paused does not inflate the estimate);
    no estimate before the first one.

    >>> pace(37, 640, [300.0, 240.0], 2)
    '37/640 done; about 22.6 h left at 270 s a trial, 2 at a time'
    >>> pace(37, 640, [300.0, 240.0, 250.0, 18000.0], 2)  # one trial paused for five hours
    '37/640 done; about 23.0 h left at 275 s a trial, 2 at a time'
    >>> pace(28, 640, [], 2)
    '28/640 done'
    >>> pace(640, 640, [200.0], 2)
    '640/640 done'
    """
    text = f"{done}/{total} done"
    if trial_seconds and done < total:
        typical = statistics.median(trial_seconds)
        text += (f"; about {duration((total - done) * typical / max(1, workers))} left at {typical:.0f} s a trial, "
                 f"{workers} at a time")
    return text


def prepare(spec: SweepSpec, *, owner: bool = True) -> dict:
    """Queue every grid point that has no finished trial. ``owner`` (the local default storage): trials
    left RUNNING by a killed sweep are marked failed first (with a shared ``--storage`` they may be
    another machine's, so only those whose heartbeat went stale are). Returns counts: done, queued,
    given_up."""
    with queue_lock(spec):
        return _prepare(spec, owner)


def _prepare(spec: SweepSpec, owner: bool) -> dict:
    from optuna.trial import TrialState

    study = open_study(spec)
    fail_stale(study)  # their workers are gone: an interruption, queued again below
    trials = study.get_trials(deepcopy=False)
    if owner:
        for t in trials:
            if t.state == TrialState.RUNNING:  # a sweep killed hard: an interruption, not a failure
                interrupt(study, t.number)
        trials = study.get_trials(deepcopy=False)
    by_key: dict[str, list] = {}
    for t in trials:
        if KEY in t.user_attrs:
            by_key.setdefault(t.user_attrs[KEY], []).append(t)
    counts = {"done": 0, "queued": 0, "given_up": 0}
    marked = interruption_marks(study)  # read once, not once per grid point
    for arm, seed in spec.grid():
        ts = by_key.get(key(arm, seed), [])
        states = [t.state for t in ts]
        if TrialState.COMPLETE in states:
            counts["done"] += 1
        elif TrialState.WAITING in states or TrialState.RUNNING in states:
            counts["queued"] += 1
        elif (lost := failures(study, ts, marked))[0] > spec.max_retries or lost[1] > MAX_INTERRUPTIONS:
            counts["given_up"] += 1
        else:
            study.enqueue_trial({"arm": arm, "seed": seed}, user_attrs={KEY: key(arm, seed)},
                                skip_if_exists=False)
            counts["queued"] += 1
    return counts


class TrialFailed(RuntimeError):
    pass


class TrialInterrupted(RuntimeError):
    """The trial's run was stopped from outside (SIGTERM, SIGINT or SIGHUP sent to it, not to the sweep): it
    checkpointed, so it is queued again and resumed, and the stop does not count as a failure. A SIGKILL
    (the kernel's out-of-memory killer among others) stays a failure, so a run that cannot fit is not
    retried without bound."""


# exit statuses of a stopped run: the run's own 128 + signal after its checkpoint, or killed by the signal
_STOPPED = {128 + s for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)} | {
    -s for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)}


def run_trial(spec: SweepSpec, arm: str, seed: int, report=None) -> float:
    """Train (or resume, or just read) the run folder of (arm, seed); returns the experiment's metric
    of its held-out evaluation after RL. ``report(record)``: each new line of its ``metrics.jsonl``
    while it trains."""
    return run_folder(spec, spec.folder(arm, seed), spec.arms()[arm], seed, report=report)


class _Tail:
    """The lines a growing ``metrics.jsonl`` gained since the last read (whole lines only)."""

    def __init__(self, path: Path):
        self.path, self.pos = path, 0

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.pos += end
        out = []
        for line in data[:end].decode(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


def report_to(study, trial):
    """A ``report(record)`` for ``run_folder`` that shows a trial's learning curve in Optuna (so
    ``optuna-dashboard`` draws it while the sweep runs): each RL iteration's training success rate as
    the trial's intermediate value at step = iterations done (``Trial.report``), each evaluation's
    avg@k as a user attribute ``eval@ITERATION``."""

    def report(r: dict) -> None:
        try:
            if "reward_mean" in r and "iteration" in r:
                trial.report(float(r.get("success_rate", r["reward_mean"])), step=int(r["iteration"]) + 1)
            elif isinstance(r.get("eval"), dict) and "avg@k" in r["eval"]:
                trial.set_user_attr(f"eval@{int(r.get('iteration', 0))}", float(r["eval"]["avg@k"]))
        except Exception:  # noqa: BLE001 (a live view must never stop a trial)
            pass
    return report


def run_folder(spec: SweepSpec, folder: Path, overrides: list[str], seed: int, report=None) -> float:
    """``seeupo train`` into ``folder`` (resumed when it holds a run) unless it is finished;
    ``report(record)`` gets each line its ``metrics.jsonl`` gains while it runs."""
    summary = folder / "summary.json"
    if not summary.exists():
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "seeupo", "train", "--out", str(folder)]
        if (folder / "config.yaml").exists():
            cmd.append("--resume")  # from its checkpoint, or afresh when it had none
        else:
            # arms that share a seed (and everything else the warm-up depends on) share one warm-up, and
            # then one evaluation before RL
            cmd += ["--preset", spec.exp.base, "--seed", str(seed), f"warmup.cache={spec.out.resolve() / 'warmup-cache'}",
                    f"eval.cache={spec.out.resolve() / 'eval-cache'}", *overrides]
        env = {**os.environ, "OMP_NUM_THREADS": str(spec.trial_threads), "MKL_NUM_THREADS": str(spec.trial_threads),
               "SEEUPO_PROGRESS_SECONDS": "60"}
        with open(folder / "train.log", "a") as log:
            log.write(f"$ OMP_NUM_THREADS={env['OMP_NUM_THREADS']} {' '.join(cmd)}\n")
            log.flush()
            # its own session: a Ctrl-C at the terminal reaches the run once, through us, not twice
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            tail = _Tail(folder / "metrics.jsonl")
            try:
                while True:
                    try:
                        rc = proc.wait(timeout=REPORT_SECONDS if report else None)
                        break
                    except subprocess.TimeoutExpired:
                        for r in tail.read():
                            report(r)
                for r in tail.read() if report else ():
                    report(r)
            except KeyboardInterrupt:  # the sweep is stopping: the run checkpoints and exits
                proc.send_signal(signal.SIGTERM)
                proc.wait()
                raise
        if rc in _STOPPED:
            raise TrialInterrupted(f"{folder}: seeupo train was stopped by a signal (exit {rc}); resumed when queued again")
        if rc != 0 or not summary.exists():
            raise TrialFailed(f"{folder}: seeupo train exited {rc}; see {folder / 'train.log'}")
    return finished_value(spec, folder)


def _lock(folder: Path, trial_id: int | None = None):
    """An exclusive lock on a trial folder: ``(the open lock file, None)``, or ``(None, the holder's
    trial id)`` when another process holds it (the id it wrote, None if unknown)."""
    folder.mkdir(parents=True, exist_ok=True)
    f = open(folder / ".lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        text = f.read().strip()
        f.close()
        return None, int(text) if text.isdigit() else None
    f.seek(0)
    f.truncate()
    f.write(str(trial_id) if trial_id is not None else "")
    f.flush()
    return f, None


def _close(study, trial, state) -> None:
    """End a trial as ``state`` (FAIL or PRUNED) unless it was closed meanwhile (see ``_tell_done``)."""
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        study.tell(trial, state=state)
    except (ValueError, UpdateFinishedTrialError):  # already finished: nothing to add
        pass


def _tell_done(study, trial, value: float, **kept) -> None:
    """Record a finished trial. Two workers can pop the same queued trial from a SQLite study (seen
    with Optuna 4 under load); the one that does not get the folder's lock leaves it alone, but if the
    trial was closed meanwhile anyway, the result is recorded as a new complete trial with ``kept``
    (its key in ``user_attrs``, or its ``params`` and ``distributions``)."""
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    if trial.number in {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}:
        try:
            study.tell(trial, value)
            return
        except (ValueError, UpdateFinishedTrialError):  # closed between the check and the tell
            pass
    study.add_trial(optuna.trial.create_trial(value=value, **kept))


def work(spec: SweepSpec, on_trial=None) -> None:
    """One worker: take queued trials until none is left (first queueing again those whose worker is
    gone: their heartbeat went stale). A trial's heartbeat is recorded while this worker holds it."""
    from optuna.trial import TrialState

    study = open_study(spec)
    while True:
        with queue_lock(spec):
            if fail_stale(study):  # a dead worker's trials: queued again, resumed by whoever takes them
                _prepare(spec, owner=False)
        if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return
        trial = ask(study)
        with heartbeat(spec, study, trial):
            _work_one(spec, study, trial, on_trial)


def _attr(study, trial, key: str, value) -> None:
    """A user attribute of a trial, unless it was closed meanwhile (failed as stale by another worker
    while this one, alive after all, still ran it; or popped twice)."""
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        trial.set_user_attr(key, value)
    except UpdateFinishedTrialError:
        pass


def _spare(study, trial, why: str = "spare") -> None:
    """Give a trial back: marked ``why`` (while it can still take attributes), then PRUNED."""
    from optuna.trial import TrialState

    _attr(study, trial, why, True)
    _close(study, trial, TrialState.PRUNED)


def _work_one(spec: SweepSpec, study, trial, on_trial) -> None:
    from optuna.trial import TrialState

    queued = trial.user_attrs.get(KEY)
    if not queued:  # another worker took the last queued trial first (``ask`` made a new one)
        _spare(study, trial)
        return
    seeds, arms = spec.exp.plan(spec.quick)[0], spec.arms()
    # the queued key, read as it is: not Optuna parameters, whose categorical space could not grow
    # when an experiment gains arms or seeds (the study would refuse every later trial)
    arm, seed = parse_key(queued)
    if arm not in arms or seed not in seeds:  # queued by an older version of the experiment
        _close(study, trial, TrialState.PRUNED)
        return
    if any(t.user_attrs.get(KEY) == queued for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))):
        _spare(study, trial, "duplicate")  # queued twice (two machines' prepare at once): it is done
        return
    lock, holder = _lock(spec.folder(arm, seed), trial.number)
    if lock is None:  # already being trained elsewhere
        if holder != trial.number:  # (the same trial popped twice: its holder will close it)
            _close(study, trial, TrialState.PRUNED)
        return
    if (value := finished_value(spec, spec.folder(arm, seed))) is not None:
        # finished before the study knew (restored from --records, or a lost study.db): recorded as
        # it is, with no on_trial call, which would count it again and average its 0 s into the pace
        lock.close()
        _tell_done(study, trial, value, user_attrs={KEY: queued})
        return
    start = time.perf_counter()
    try:
        value = run_trial(spec, arm, seed, report=report_to(study, trial))
    except KeyboardInterrupt:  # stopped (the run checkpointed): queued again, not counted as a failure
        _attr(study, trial, "interrupted", True)
        _close(study, trial, TrialState.FAIL)
        raise
    except TrialInterrupted as e:  # its run alone was stopped: queued again by prepare(), not a failure
        _attr(study, trial, "interrupted", True)
        _attr(study, trial, "error", str(e)[:500])
        _close(study, trial, TrialState.FAIL)
        if on_trial:
            on_trial(arm, seed, INTERRUPTED, time.perf_counter() - start)
        return
    except Exception as e:  # noqa: BLE001 (recorded; prepare() re-queues it up to max_retries)
        _attr(study, trial, "error", str(e)[:500])
        _close(study, trial, TrialState.FAIL)
        if on_trial:
            on_trial(arm, seed, None, time.perf_counter() - start)
        return
    finally:
        lock.close()
    _tell_done(study, trial, value, user_attrs={KEY: queued})
    if on_trial:
        on_trial(arm, seed, value, time.perf_counter() - start)


def _interrupt(*_):
    raise KeyboardInterrupt


# ----------------------------------------------------------------------------- tuning
def tune_work(spec: SweepSpec, on_trial=None) -> None:
    """One worker of the tuning phase: TPE trials for each tuned arm until its budget is used. A
    trial runs one folder per tuning seed, ``DIR/tune/ARM/<params hash>/seed-S`` (the same parameters
    again reuse, or resume, the same folders). The budget counts complete and live running trials
    (a stale one is failed and its parameters queued again first); two workers that both saw one
    slot left both ask, and the one whose trial came second (by trial number) gives it back."""
    from optuna.trial import TrialState

    budget, seeds, arms = spec.exp.tune_plan(spec.quick)
    for arm, (overrides, space) in arms.items():
        study = tune_study(spec, arm)
        while True:
            with queue_lock(spec):
                for t in fail_stale(study):  # a dead worker's trial: its parameters again, its folders resumed
                    if t.params:
                        study.enqueue_trial(t.params)
            trials = study.get_trials(deepcopy=False)
            used = sum(t.state in (TrialState.COMPLETE, TrialState.RUNNING) for t in trials)
            failed, stopped = failures(study, trials)
            if used >= budget or failed > spec.max_retries * budget or stopped > MAX_INTERRUPTIONS * budget:
                break
            trial = ask(study)
            with heartbeat(spec, study, trial):
                if not _tune_one(spec, study, trial, arm, overrides, space, budget, seeds, on_trial):
                    break


def _tune_one(spec: SweepSpec, study, trial, arm: str, overrides, space, budget: int, seeds, on_trial) -> bool:
    """One tuning trial; False when it came after the budget was used (given back, marked spare)."""
    from optuna.trial import TrialState

    # the budget again, now that this trial has its number: every complete trial, and the running ones
    # asked before it (a worker that asked at the same time counts this one, or this one counts it)
    ahead = sum(t.state == TrialState.COMPLETE or (t.state == TrialState.RUNNING and t.number < trial.number)
                for t in study.get_trials(deepcopy=False))
    if ahead >= budget:
        _spare(study, trial)
        return False
    params = {k: trial.suggest_categorical(k, v) for k, v in space.items()}
    folder = spec.out / "tune" / arm / params_key(params)
    lock, holder = _lock(folder, trial.number)
    if lock is None:  # these parameters are being tried elsewhere
        if holder != trial.number:  # (the same queued trial popped twice: its holder closes it)
            _close(study, trial, TrialState.PRUNED)
        return True
    start = time.perf_counter()
    try:
        ov = [*overrides, *(f"{k}={yaml_value(v)}" for k, v in params.items())]
        value = sum(run_folder(spec, folder / f"seed-{s}", ov, s) for s in seeds) / len(seeds)
    except Exception as e:  # noqa: BLE001 (recorded; the budget counts completed trials)
        if isinstance(e, TrialInterrupted):  # not a failure: the same parameters, queued again, resume
            _attr(study, trial, "interrupted", True)  # its folders
            study.enqueue_trial(params)
        _attr(study, trial, "error", str(e)[:500])
        _close(study, trial, TrialState.FAIL)
        value = INTERRUPTED if isinstance(e, TrialInterrupted) else None
    finally:
        lock.close()
    if value is not None and value != INTERRUPTED:
        _tell_done(study, trial, value, params=params, distributions=trial.distributions)
    if on_trial:
        on_trial(f"tune:{arm}", params_key(params), value, time.perf_counter() - start)
    return True


def _fail_running(spec: SweepSpec) -> None:
    """Local storage: tuning trials left RUNNING by a stopped sweep become FAIL, marked interrupted
    (not a failure), with their parameters queued again so the next run resumes their folders."""
    from optuna.trial import TrialState

    for arm in spec.exp.tune_plan(spec.quick)[2]:
        study = tune_study(spec, arm)
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            interrupt(study, t.number)
            if t.params:
                study.enqueue_trial(t.params)


def _run_workers(spec: SweepSpec, target, on_trial) -> None:
    if spec.workers <= 1:
        target(spec, on_trial)
        return
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(replace(spec, worker=i), queue, target))
             for i in range(spec.workers)]
    for p in procs:
        p.start()
    alive = len(procs)
    try:
        while alive:
            item = queue.get()
            if item is None:
                alive -= 1
            elif on_trial:
                on_trial(*item)
    except KeyboardInterrupt:  # stop the workers; each stops its run at a safe point
        for p in procs:
            p.terminate()
        for p in procs:
            p.join()
        raise
    for p in procs:
        p.join()


def _worker_main(spec: SweepSpec, queue, target=None) -> None:
    signal.signal(signal.SIGTERM, _interrupt)  # the sweep stops its workers with SIGTERM
    try:
        (target or work)(spec, lambda *a: queue.put(a))
    except KeyboardInterrupt:
        pass
    finally:
        queue.put(None)


def sweep(spec: SweepSpec, on_trial=None, say=print) -> dict:
    """Queue what is missing and run it with ``spec.workers`` processes; returns prepare()'s counts
    from before the run and after it."""
    spec.out.mkdir(parents=True, exist_ok=True)
    spec.exp.validate_arms(spec.quick)
    old_term = signal.signal(signal.SIGTERM, _interrupt) if _main_thread() else None
    try:
        return _sweep(spec, on_trial)
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _main_thread() -> bool:

    return threading.current_thread() is threading.main_thread()


def _sweep(spec: SweepSpec, on_trial) -> dict:
    if spec.exp.tune:
        if spec.storage is None:
            _fail_running(spec)
        _run_workers(spec, tune_work, on_trial)
        choose_tuned(spec)
        if spec.records is not None:  # the tuned arms' comparison trials, where they ran as now chosen
            records.restore(spec, spec.records)
    before = prepare(spec, owner=spec.storage is None)
    # a failed or interrupted trial is queued again by the next prepare(); rounds go on while trials end
    # (each failure counts towards its trial's max_retries, so this ends), and stop when a round ends
    # none (the queued ones run elsewhere, on a shared --storage)
    while before["queued"]:
        ended = _ended(spec)
        _run_workers(spec, work, on_trial)
        before = prepare(spec, owner=spec.storage is None)
        if _ended(spec) == ended:
            break
    return before


def _ended(spec: SweepSpec) -> int:
    """How many grid trials of the study have ended (complete or failed, interruptions included)."""
    from optuna.trial import TrialState

    return sum(t.state in (TrialState.COMPLETE, TrialState.FAIL) and KEY in t.user_attrs
               for t in open_study(spec).get_trials(deepcopy=False))
