"""A sweep's finished trials carried across machines: ``seeupo sweep ... --records DIR``.

A long sweep can outlive the machine it runs on (a preemptible node, a CI box, a session whose disk is
wiped). Checkpoints, warm-up caches and the study database are large or machine-bound, but what a
finished trial contributes to the report is small: its ``config.yaml``, ``metrics.jsonl`` and
``summary.json`` (about 10 kB compressed). ``save`` packs the finished trials that no archive in
``DIR`` holds yet into a new part, ``DIR/NAME-part-UTCSTAMP.tar.xz`` (NAME: the experiment's name,
``NAME-quick`` in quick mode); ``restore`` unpacks every part of that name into the sweep folder, so the sweep reads those trials instead of training
them again and trains only the rest. Each part records every arm's full override list (base preset
and overrides); a trial is restored only when its arm's list is unchanged, so an experiment edited
since does not pass stale results off as its own.

An experiment that tunes arms (``tune:``) carries its tuning too: each completed tuning trial's
folders (``tune/ARM/HASH/seed-S``, one per tuning seed), its parameters, score, identity and
completion time. ``restore`` adds those trials to the arm's tuning study (so the budget
counts them and TPE sees them), and once every tuned arm's budget is used it chooses the tuned
configurations as the sweep would (``tuned.json``) and restores the tuned arms' comparison trials
whose configuration is the chosen one. A tuned arm's tuning is restored only when its overrides,
search space and tuning seeds are unchanged.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from pathlib import Path

from seeupo.sweep.study import choose_tuned, completed_at, finished_value, params_key, queue_lock, trial_uid, tune_study

FILES = ("config.yaml", "metrics.jsonl", "summary.json")
META = "experiment.json"
_MEMBER = re.compile(r"^trials/([^/]+)/seed-(-?\d+)/([^/]+)$")
_TUNE_MEMBER = re.compile(r"^tune/([^/]+)/([0-9a-f]+)/seed-(-?\d+)/([^/]+)$")


def _identity(spec) -> dict[str, list[str]]:
    """Every arm's full definition: the base preset, then its override list."""
    return {arm: [spec.exp.base, *ov] for arm, ov in spec.arms().items()}


def _tune_identity(spec) -> dict[str, list[str]]:
    """Every tuned arm's tuning: the base preset, its overrides, its search space and tuning seeds."""
    _, seeds, arms = spec.exp.tune_plan(spec.quick)
    return {arm: [spec.exp.base, *ov, f"space={json.dumps(space, sort_keys=True)}", f"seeds={json.dumps(seeds)}"]
            for arm, (ov, space) in arms.items()}


def parts(records: Path, name: str) -> list[Path]:
    return sorted(records.glob(f"{name}-part-*.tar.xz"))


def _read(part: Path) -> tuple[dict, dict[tuple[str, int], dict[str, bytes]], dict[tuple[str, str, int], dict]]:
    """A part's experiment record, its trials' files and its tuning trials' files, checked: only
    regular files named ``trials/ARM/seed-S/FILE`` or ``tune/ARM/HASH/seed-S/FILE`` with FILE one of
    FILES are read (nothing is extracted by path)."""
    meta, trials, tuning = None, {}, {}
    try:
        with tarfile.open(part, "r:xz") as tar:
            for m in tar.getmembers():
                if not m.isfile():
                    continue
                data = tar.extractfile(m).read()
                if m.name == META:
                    meta = json.loads(data)
                elif (g := _MEMBER.match(m.name)) and g.group(3) in FILES:
                    trials.setdefault((g.group(1), int(g.group(2))), {})[g.group(3)] = data
                elif (g := _TUNE_MEMBER.match(m.name)) and g.group(4) in FILES:
                    tuning.setdefault((g.group(1), g.group(2), int(g.group(3))), {})[g.group(4)] = data
    except (tarfile.TarError, OSError, EOFError, json.JSONDecodeError) as e:
        raise ValueError(f"{part}: not a readable records part ({e}); move it away or delete it") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("arms"), dict):
        raise ValueError(f"{part}: no {META} with the experiment's arms; not a records part of seeupo sweep")
    return meta, trials, tuning


def packed(records: Path, name: str) -> set[tuple[str, int]]:
    """The (arm, seed) of every trial some part named ``name`` holds."""
    return {key for part in parts(records, name) for key in _read(part)[1]}


def summaries(records: Path, name: str) -> dict[tuple[str, int], dict]:
    """The ``summary.json`` of every finished trial some part named ``name`` holds, by (arm, seed)."""
    return {key: json.loads(files["summary.json"]) for part in parts(records, name)
            for key, files in _read(part)[1].items() if "summary.json" in files}


def packed_tuning(records: Path, name: str) -> set[tuple[str, str]]:
    """The (tuned arm, trial identity: ``study.trial_uid``) of every tuning trial some part named
    ``name`` holds."""
    return {(arm, t["uid"]) for part in parts(records, name)
            for arm, rec in (_read(part)[0].get("tune") or {}).items() for t in rec["trials"]}


def restore(spec, records: Path) -> dict[str, int]:
    """Unpack the experiment's parts into ``spec.out``: each finished trial whose folder has no
    ``summary.json`` yet and whose arm is defined as it was when packed, and each tuning trial of a
    tuned arm whose tuning is defined as it was (added to the arm's tuning study). A tuned arm's
    comparison trials are restored once its configuration is chosen: here when every tuned arm's
    budget is used by then (``spec.tuned`` and ``tuned.json`` are set), else by the sweep after
    tuning. Returns counts: restored, present (already finished here), stale (arm redefined or no
    longer in the experiment), tuning (tuning trials added to their studies)."""
    ident, tune_ident = _identity(spec), _tune_identity(spec)
    seeds = set(spec.exp.plan(spec.quick)[0])
    counts = {"restored": 0, "present": 0, "stale": 0, "tuning": 0}
    read = []
    for part in parts(records, spec.study_name):
        meta, trials, tuning = _read(part)
        if bool(meta.get("quick")) == bool(spec.quick):  # else the other mode's: other seeds and run lengths
            read.append((part, meta, trials, tuning))
    tuning = {k: v for *_, t in read for k, v in t.items()}  # a tuning folder is packed with each trial that used it
    for part, meta, _, _ in read:
        for arm, rec in (meta.get("tune") or {}).items():
            if arm not in tune_ident or rec.get("identity") != tune_ident[arm]:
                counts["stale"] += len(rec.get("trials", []))
                continue
            for t in rec["trials"]:
                counts["tuning"] += _restore_tuning(spec, part, arm, t, tuning)
    if tune_ident and spec.tuned is None and _tuning_done(spec):
        choose_tuned(spec)
        ident = _identity(spec)
    for part, meta, trials, _ in read:
        for (arm, seed), files in sorted(trials.items()):
            if set(files) != set(FILES):
                raise ValueError(f"{part}: trial {arm}/seed-{seed} lacks {sorted(set(FILES) - set(files))}")
            if arm in tune_ident and spec.tuned is None:
                continue  # its configuration is not chosen yet: the sweep restores it after tuning
            if arm not in ident or meta["arms"].get(arm) != ident[arm] or seed not in seeds:
                counts["stale"] += 1
                continue
            folder = spec.folder(arm, seed)
            if (folder / "summary.json").exists():
                counts["present"] += 1
                continue
            _write(folder, files)
            counts["restored"] += 1
    return counts


def reuse(spec, other: Path) -> dict[str, list[str]]:
    """Take finished trials from another experiment's records folder ``other``: a trial whose arm there
    is defined exactly as an arm here (the same base preset and override list, whatever the arm is
    called) and whose seed this experiment runs becomes that arm's trial here, when this sweep has no
    finished trial there yet (the same run; no need to train it twice). Parts of the other mode
    (quick / full) are not read. From the next save on, they are packed into this experiment's own
    records like any trial finished here. Returns ``{this arm: ["OTHER_EXPERIMENT/ARM/seed-S", ...]}``."""
    ident = _identity(spec)
    by_def: dict[tuple[str, ...], list[str]] = {}
    for arm, d in ident.items():
        by_def.setdefault(tuple(d), []).append(arm)
    seeds = set(spec.exp.plan(spec.quick)[0])
    taken: dict[str, list[str]] = {}
    for part in sorted(Path(other).glob("*-part-*.tar.xz")):
        meta, trials, _ = _read(part)
        if bool(meta.get("quick")) != bool(spec.quick):
            continue
        for (theirs, seed), files in sorted(trials.items()):
            d = meta["arms"].get(theirs)
            if d is None or seed not in seeds or set(files) != set(FILES):
                continue
            for arm in by_def.get(tuple(d), []):
                folder = spec.folder(arm, seed)
                if (folder / "summary.json").exists():
                    continue
                _write(folder, files)
                taken.setdefault(arm, []).append(f"{meta.get('name', part.name)}/{theirs}/seed-{seed}")
    return taken


def _write(folder: Path, files: dict[str, bytes]) -> None:
    """A finished run folder's files: each whole or not at all, summary.json last, so a restore
    stopped at any point leaves no truncated file and no summary.json before the files it vouches for."""
    from seeupo.train.checkpoint import write_atomic

    folder.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        write_atomic(folder / name, files[name])


def _restore_tuning(spec, part: Path, arm: str, t: dict, tuning: dict) -> int:
    """One packed tuning trial: its seeds' folders written where unfinished, and the trial added to
    the arm's tuning study (with its identity and completion time) unless the study has it already
    (checked and added under the sweep folder's queue lock: machines sharing a study restore at once).
    Returns 1 when added."""
    import optuna
    from optuna.trial import TrialState

    _, seeds, arms = spec.exp.tune_plan(spec.quick)
    params, key = t["params"], t["key"]
    space = arms[arm][1]
    if params_key(params) != key or set(params) != set(space) or any(params[k] not in space[k] for k in params):
        raise ValueError(f"{part}: tuning trial {arm}/{key} does not match its parameters {params}")
    folder = spec.out / "tune" / arm / key
    for s in seeds:
        files = tuning.get((arm, key, s), {})
        if set(files) != set(FILES):
            raise ValueError(f"{part}: tuning trial {arm}/{key}/seed-{s} lacks {sorted(set(FILES) - set(files))}")
        if not (folder / f"seed-{s}" / "summary.json").exists():
            _write(folder / f"seed-{s}", files)
    value = sum(finished_value(spec, folder / f"seed-{s}") for s in seeds) / len(seeds)
    dists = {k: optuna.distributions.CategoricalDistribution(space[k]) for k in params}
    with queue_lock(spec):
        study = tune_study(spec, arm)
        if any(x.state == TrialState.COMPLETE and trial_uid(x) == t["uid"] for x in study.get_trials(deepcopy=False)):
            return 0
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions=dists, value=value,
            user_attrs={"restored": part.name, "uid": t["uid"], "completed": t["completed"]}))
    return 1


def _tuning_done(spec) -> bool:
    """Every tuned arm's study holds as many completed trials as the budget."""
    from optuna.trial import TrialState

    budget, _, arms = spec.exp.tune_plan(spec.quick)
    return all(sum(t.state == TrialState.COMPLETE for t in tune_study(spec, arm).get_trials(deepcopy=False)) >= budget
               for arm in arms)


def _tuning_trials(spec, have: set[tuple[str, str]]) -> dict[str, list[dict]]:
    """Each tuned arm's completed tuning trials that no part holds yet, in the order they completed
    (a configuration TPE proposed twice is two trials of one folder: both count towards the budget)."""
    from optuna.trial import TrialState

    _, seeds, arms = spec.exp.tune_plan(spec.quick)
    out = {}
    for arm in arms:
        done = [t for t in tune_study(spec, arm).get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
        new = []
        for t in sorted(done, key=lambda t: (completed_at(t), trial_uid(t))):
            key = params_key(t.params)
            folder = spec.out / "tune" / arm / key
            if (arm, trial_uid(t)) not in have and all((folder / f"seed-{s}" / f).exists() for s in seeds for f in FILES):
                new.append({"uid": trial_uid(t), "completed": completed_at(t), "key": key, "params": t.params,
                            "value": t.value})
        if new:
            out[arm] = new
    return out


def save(spec, records: Path) -> Path | None:
    """Pack the finished trials of ``spec.out`` that no part holds yet, and the completed tuning
    trials (with their folders) likewise, into a new part; returns its path (None when there was
    nothing new). Written to a temporary name and renamed, so an interrupted save leaves no half part."""
    have = packed(records, spec.study_name) if records.exists() else set()
    ident = _identity(spec)
    # finished: summary.json is written last, once the run is done
    new = [(arm, seed) for arm, seed in spec.grid()
           if (arm, seed) not in have and all((spec.folder(arm, seed) / f).exists() for f in FILES)]
    tune_new = (_tuning_trials(spec, packed_tuning(records, spec.study_name) if records.exists() else set())
                if spec.exp.tune else {})
    if not new and not tune_new:
        return None
    records.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = records / f"{spec.study_name}-part-{stamp}.tar.xz"
    n = 1
    while path.exists():
        n += 1
        path = records / f"{spec.study_name}-part-{stamp}-{n}.tar.xz"
    tmp = path.with_name(f".{path.name}.tmp")

    def add(tar, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        tar.addfile(info, io.BytesIO(data))

    tune_ident = _tune_identity(spec)
    meta = {"name": spec.exp.name, "quick": spec.quick, "arms": ident}
    if tune_new:
        meta["tune"] = {arm: {"identity": tune_ident[arm], "trials": ts} for arm, ts in tune_new.items()}
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        add(tar, META, json.dumps(meta, indent=1).encode())
        for arm, seed in new:
            for name in FILES:
                add(tar, f"trials/{arm}/seed-{seed}/{name}", (spec.folder(arm, seed) / name).read_bytes())
        tune_seeds = spec.exp.tune_plan(spec.quick)[1]
        for arm, ts in tune_new.items():
            for key in dict.fromkeys(t["key"] for t in ts):
                for s in tune_seeds:
                    for name in FILES:
                        rel = f"tune/{arm}/{key}/seed-{s}/{name}"
                        add(tar, rel, (spec.out / rel).read_bytes())
    tmp.rename(path)
    return path
