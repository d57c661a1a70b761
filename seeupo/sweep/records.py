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
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from pathlib import Path

FILES = ("config.yaml", "metrics.jsonl", "summary.json")
META = "experiment.json"
_MEMBER = re.compile(r"^trials/([^/]+)/seed-(-?\d+)/([^/]+)$")


def _identity(spec) -> dict[str, list[str]]:
    """Every arm's full definition: the base preset, then its override list."""
    return {arm: [spec.exp.base, *ov] for arm, ov in spec.arms().items()}


def parts(records: Path, name: str) -> list[Path]:
    return sorted(records.glob(f"{name}-part-*.tar.xz"))


def _read(part: Path) -> tuple[dict, dict[tuple[str, int], dict[str, bytes]]]:
    """A part's experiment record and its trials' files, checked: only regular files named
    ``trials/ARM/seed-S/FILE`` with FILE one of FILES are read (nothing is extracted by path)."""
    meta, trials = None, {}
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
    except (tarfile.TarError, OSError, EOFError, json.JSONDecodeError) as e:
        raise ValueError(f"{part}: not a readable records part ({e}); move it away or delete it") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("arms"), dict):
        raise ValueError(f"{part}: no {META} with the experiment's arms; not a records part of seeupo sweep")
    return meta, trials


def packed(records: Path, name: str) -> set[tuple[str, int]]:
    """The (arm, seed) of every trial some part named ``name`` holds."""
    return {key for part in parts(records, name) for key in _read(part)[1]}


def restore(spec, records: Path) -> dict[str, int]:
    """Unpack the experiment's parts into ``spec.out``: each finished trial whose folder has no
    ``summary.json`` yet and whose arm is defined as it was when packed. Returns counts: restored,
    present (already finished here), stale (arm redefined or no longer in the experiment)."""
    from seeupo.train.checkpoint import write_atomic

    ident = _identity(spec)
    seeds = set(spec.exp.plan(spec.quick)[0])
    counts = {"restored": 0, "present": 0, "stale": 0}
    for part in parts(records, spec.study_name):
        meta, trials = _read(part)
        if bool(meta.get("quick")) != bool(spec.quick):
            continue  # the other mode's trials: other seeds and run lengths
        for (arm, seed), files in sorted(trials.items()):
            if set(files) != set(FILES):
                raise ValueError(f"{part}: trial {arm}/seed-{seed} lacks {sorted(set(FILES) - set(files))}")
            if arm not in ident or meta["arms"].get(arm) != ident[arm] or seed not in seeds:
                counts["stale"] += 1
                continue
            folder = spec.folder(arm, seed)
            if (folder / "summary.json").exists():
                counts["present"] += 1
                continue
            folder.mkdir(parents=True, exist_ok=True)
            # summary.json last, each file whole or not at all: a restore stopped at any point leaves no
            # truncated file and no summary.json before the files it vouches for
            for name in FILES:
                write_atomic(folder / name, files[name])
            counts["restored"] += 1
    return counts


def save(spec, records: Path) -> Path | None:
    """Pack the finished trials of ``spec.out`` that no part holds yet into a new part; returns its
    path (None when there was nothing new). Written to a temporary name and renamed, so an
    interrupted save leaves no half part."""
    have = packed(records, spec.study_name)
    ident = _identity(spec)
    # finished: summary.json is written last, once the run is done
    new = [(arm, seed) for arm, seed in spec.grid()
           if (arm, seed) not in have and all((spec.folder(arm, seed) / f).exists() for f in FILES)]
    if not new:
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

    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        add(tar, META, json.dumps({"name": spec.exp.name, "quick": spec.quick, "arms": ident}, indent=1).encode())
        for arm, seed in new:
            for name in FILES:
                add(tar, f"trials/{arm}/seed-{seed}/{name}", (spec.folder(arm, seed) / name).read_bytes())
    tmp.rename(path)
    return path
