"""A sweep's Optuna studies, through Optuna's public API only: what the engine (which runs trials) and
the records (which carry finished trials across machines) both use.

- ``SweepSpec``: one sweep (experiment, folder, storage, workers) and where its trials' folders are.
- ``open_study`` / ``tune_study``: the comparison study and each tuned arm's study on an
  ``RDBStorage`` with Optuna's heartbeat (``heartbeat_interval``, ``grace_period``) and a
  ``heartbeat_stale_trial_callback`` that marks a trial whose worker is gone as an interruption.
- ``heartbeat``: a held trial's heartbeat (``RDBStorage.record_heartbeat``) while a block runs;
  ``study.optimize`` would start that thread, ``ask``/``tell`` do not.
- ``fail_stale``: ``optuna.storages.fail_stale_trials`` under the folder's ``queue_lock``.
- ``failures``: a trial's failures and interruptions (an interruption is FAIL in Optuna, not a failure
  here): marked on the trial (``interrupted``, by the worker that stopped it) or on the study
  (``interrupted:NUMBER``, by whoever failed it for its worker: a stale heartbeat, a sweep restarted
  after a hard kill), because a trial that Optuna failed can take no more attributes.
- ``params_key``, ``trial_uid``, ``completed_at``, ``tuned_arms``, ``choose_tuned``: tuning trials'
  identities and the choice of each tuned arm's configuration.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from seeupo.sweep.experiment import Experiment, yaml_value

KEY = "key"  # a grid trial's user attribute: "ARM/seed-S"
HEARTBEAT_S = 60  # a running trial's heartbeat in the study, every this many seconds (``seeupo sweep --heartbeat``)
GRACE_FACTOR = 3  # a trial whose last heartbeat is this many heartbeats old has lost its worker: queued again
MARK = "interrupted:"  # a study user attribute ``interrupted:NUMBER``: that trial's FAIL was an interruption


@dataclass
class SweepSpec:
    exp: Experiment
    out: Path
    quick: bool
    storage: str | None = None
    workers: int = 1
    trial_threads: int = 1
    max_retries: int = 2
    tuned: dict | None = None  # tuned arm -> its best configuration's overrides (after tuning)
    worker: int = 0  # this process's worker index (each tuning worker seeds its own sampler)
    heartbeat: int = HEARTBEAT_S  # seconds between a running trial's heartbeats; GRACE_FACTOR of them: stale
    records: Path | None = None  # --records: the tuned arms' trials are restored from here once they are tuned

    def arms(self) -> dict[str, list[str]]:
        """Every arm's full override list: the fixed arms, then the tuned ones' best configurations."""
        return {**self.exp.plan(self.quick)[1], **(self.tuned or {})}

    @property
    def url(self) -> str:
        return self.storage or f"sqlite:///{(self.out / 'study.db').resolve()}"

    @property
    def study_name(self) -> str:
        return f"{self.exp.name}{'-quick' if self.quick else ''}"

    def grid(self) -> list[tuple[str, int]]:
        """The trials in queue order: arm by arm, or (``order: seeds``) seed by seed in blocks of as many
        seeds as workers, every arm of a block before the next block."""
        seeds = self.exp.plan(self.quick)[0]
        if self.exp.order == "seeds":
            w = max(1, self.workers)
            blocks = [seeds[i:i + w] for i in range(0, len(seeds), w)]
            return [(arm, s) for block in blocks for arm in self.arms() for s in block]
        return [(arm, s) for arm in self.arms() for s in seeds]

    def folder(self, arm: str, seed: int) -> Path:
        return self.out / "trials" / arm / f"seed-{seed}"


def key(arm: str, seed: int) -> str:
    return f"{arm}/seed-{seed}"


def parse_key(text: str) -> tuple[str, int]:
    """``key``'s inverse.

    >>> parse_key("seeupo-gigpo/seed-12")
    ('seeupo-gigpo', 12)
    """
    arm, _, seed = text.rpartition("/seed-")
    return arm, int(seed)


def finished_value(spec: SweepSpec, folder: Path) -> float | None:
    """The experiment's metric of a finished run folder's held-out evaluation after RL; None while
    the run has no ``summary.json``."""
    summary = folder / "summary.json"
    if not summary.exists():
        return None
    return float(json.loads(summary.read_text())["eval_after"][spec.exp.metric])


@contextmanager
def queue_lock(spec: SweepSpec):
    """Workers of one sweep folder change the queue one at a time (re-queueing, failing stale trials),
    so two of them never queue the same trial twice; across machines when the folder is shared."""
    spec.out.mkdir(parents=True, exist_ok=True)
    with open(spec.out / ".queue.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# ----------------------------------------------------------------------------- studies
_stale: list = []  # the trials ``fail_stale_trials`` failed in this process since ``fail_stale`` last asked


def _on_stale(study, trial) -> None:
    """Optuna's ``heartbeat_stale_trial_callback``: the trial (already FAIL) lost its worker, which
    is an interruption, not a failure."""
    study.set_user_attr(f"{MARK}{trial.number}", "stale")
    _stale.append(trial)


def storage(spec: SweepSpec):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():  # heartbeat_interval is an "experimental" argument
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # SQLite: wait for a busy database (several worker processes write to it) instead of failing
        return optuna.storages.RDBStorage(
            spec.url, engine_kwargs={"connect_args": {"timeout": 60}} if spec.url.startswith("sqlite") else None,
            heartbeat_interval=spec.heartbeat, grace_period=GRACE_FACTOR * spec.heartbeat,
            heartbeat_stale_trial_callback=_on_stale)


def open_study(spec: SweepSpec):
    """The sweep's comparison study (one trial per arm and seed)."""
    import optuna

    return optuna.create_study(study_name=spec.study_name, storage=storage(spec), direction="maximize",
                               load_if_exists=True)


def tune_study(spec: SweepSpec, arm: str):
    """The arm's tuning study; each worker's sampler has its own seed (with one seed, two workers
    propose the same start-up configurations in step: the second one's proposals were pruned or,
    once the first had finished, re-read its folder and took a budget slot as a duplicate)."""
    import optuna

    from seeupo.data.episode import derive_seed

    seed = derive_seed(spec.exp.name, arm, *([spec.worker] if spec.worker else [])) % (2 ** 31)  # worker 0: as before
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    return optuna.create_study(study_name=f"{spec.study_name}-tune-{arm}", storage=storage(spec), sampler=sampler,
                               direction="maximize", load_if_exists=True)


def ask(study):
    """``study.ask()`` without Optuna's warning that heartbeats are meant for ``study.optimize``
    (``heartbeat`` records them here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
        return study.ask()


@contextmanager
def heartbeat(spec: SweepSpec, study, trial):
    """The trial's heartbeat in the study while the block runs: one now, then one every
    ``spec.heartbeat`` seconds from a thread (a busy database only delays a beat). The thread has its
    own storage connection; the trial's storage id comes from the public study-name and number lookups."""
    beats = storage(spec)
    trial_id = beats.get_trial_id_from_study_id_trial_number(beats.get_study_id_from_name(study.study_name),
                                                            trial.number)
    beats.record_heartbeat(trial_id)  # at once: a trial that never beat is never found stale
    stop = threading.Event()

    def beat():
        while not stop.wait(spec.heartbeat):
            try:
                beats.record_heartbeat(trial_id)
            except Exception:  # noqa: BLE001 (the next beat tries again; the grace period is several beats)
                pass

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def fail_stale(study) -> list:
    """Fail the study's trials whose heartbeat went stale (their worker is gone) with Optuna's
    ``fail_stale_trials``, each marked an interruption; returns them (failed, as Optuna left them).
    Call it under ``queue_lock``: a trial found stale twice would be queued again twice."""
    import optuna

    _stale.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    found, _stale[:] = list(_stale), []
    return found


def interrupt(study, number: int) -> None:
    """Fail another worker's running trial (a sweep restarted after a hard kill: its worker is gone) as
    an interruption: marked on the study first, so it never reads as a failure."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    study.set_user_attr(f"{MARK}{number}", "restart")
    try:
        study.tell(number, state=TrialState.FAIL)
    except (ValueError, UpdateFinishedTrialError):  # it ended meanwhile
        pass


def interruption_marks(study) -> set[int]:
    """The numbers of the trials the study marks as interrupted (``interrupted:NUMBER``)."""
    return {int(k[len(MARK):]) for k in study.user_attrs if k.startswith(MARK)}


def failures(study, trials, marked: set[int] | None = None) -> tuple[int, int]:
    """(failures, interruptions) among ``trials`` of ``study``: an interrupted trial is FAIL in Optuna
    but not a failure; marked on the trial or on the study (see the module's docstring). ``marked``:
    ``interruption_marks(study)`` when the caller has read it already (one read for many calls)."""
    from optuna.trial import TrialState

    marked = interruption_marks(study) if marked is None else marked
    failed = [t for t in trials if t.state == TrialState.FAIL]
    stopped = sum(bool(t.user_attrs.get("interrupted")) or t.number in marked for t in failed)
    return len(failed) - stopped, stopped


# ----------------------------------------------------------------------------- tuning trials
def params_key(params: dict) -> str:
    """A tuning configuration's folder name: a short hash of its parameters."""
    return hashlib.blake2b(json.dumps(params, sort_keys=True).encode(), digest_size=5).hexdigest()


def trial_uid(trial) -> str:
    """A completed tuning trial's identity across machines: set when it is restored from --records,
    else from when it started and its number in the study that ran it (numbers alone repeat: a study
    restored elsewhere numbers its new trials from its own count)."""
    return str(trial.user_attrs.get("uid") or f"{trial.datetime_start:%Y%m%dT%H%M%S.%f}-{trial.number}")


def completed_at(trial) -> str:
    """When a completed tuning trial completed, where it ran (kept by a restore): the tie-break."""
    return str(trial.user_attrs.get("completed") or trial.datetime_complete.isoformat())


def tuned_arms(spec: SweepSpec) -> dict[str, dict]:
    """Each tuned arm's best trial: ``{arm: {"params", "value", "trials", "overrides", "scores"}}``
    (``scores``: every completed tuning trial's completion time, parameters and value; a tie goes to
    the trial that completed first; arms without a completed trial are left out)."""
    from optuna.trial import TrialState

    out = {}
    for arm, (overrides, _) in spec.exp.tune_plan(spec.quick)[2].items():
        study = tune_study(spec, arm)
        done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
        if not done:
            continue
        best = min(done, key=lambda t: (-t.value, completed_at(t), trial_uid(t)))  # a tie: the earlier one
        out[arm] = {"params": best.params, "value": best.value, "trials": len(done),
                    "overrides": [*overrides, *(f"{k}={yaml_value(v)}" for k, v in best.params.items())],
                    # every tuning trial's score, in the order they completed
                    "scores": [{"completed": completed_at(t), "params": t.params, "value": t.value}
                               for t in sorted(done, key=lambda t: (completed_at(t), trial_uid(t)))]}
    return out


def choose_tuned(spec: SweepSpec) -> dict[str, dict]:
    """Each tuned arm's best configuration (``tuned_arms``) written to ``DIR/tuned.json`` and set as
    the arm's overrides for the comparison trials."""
    best = tuned_arms(spec)
    (spec.out / "tuned.json").write_text(json.dumps(best, indent=1))
    spec.tuned = {arm: b["overrides"] for arm, b in best.items()}
    return best
