"""Checkpoints: trainable parameters (safetensors), optimizer state, run state, resolved config.

Each checkpoint is written into a temporary folder (every file fsync'd), renamed into place, then
``latest`` is replaced atomically, so an interrupted write never leaves a half checkpoint behind; a
temporary left by a killed write is removed by the next save or load. Pruning keeps the newest
``KEEP`` checkpoints of this run (by iteration number, never another run's).

A run folder is never clobbered: ``refuse_existing`` (called before a new run starts) raises
``RunExists`` when the folder holds a run, unless the caller resumes or overwrites it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

KEEP = 2


def trainable_state(named_params) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous().clone() for n, p in named_params}


RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "curves.png")
RUN_DIRS = ("checkpoints", "tensorboard", "vllm", "wandb")


class RunExists(RuntimeError):
    """A new run was pointed at a folder that holds one."""


def holds_run(folder: Path) -> bool:
    return any((folder / f).exists() for f in RUN_FILES) or (folder / "checkpoints").exists()


def refuse_existing(folder: Path) -> None:
    """Raise ``RunExists`` (with the three ways on) when ``folder`` holds a run."""
    if holds_run(folder):
        raise RunExists(f"{folder} already holds a run; continue it with --resume, replace it with --overwrite, "
                        "or choose a new --out")


def clear_run(folder: Path, *, overwrite: bool) -> None:
    """Before a new run in ``folder``: refuse (not ``overwrite``) or delete the old run's files (only
    those a run writes; anything else in the folder stays)."""
    if not holds_run(folder):
        return
    if not overwrite:
        refuse_existing(folder)
    for f in RUN_FILES:
        (folder / f).unlink(missing_ok=True)
    for d in RUN_DIRS:
        shutil.rmtree(folder / d, ignore_errors=True)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write ``text`` (or bytes) to ``path`` through a temporary file, fsync'd and renamed into place:
    a write stopped at any point leaves ``path`` as it was, never truncated."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _iteration(p: Path) -> int:
    m = re.fullmatch(r"iter-(\d+)", p.name)
    return int(m.group(1)) if m else -1


def _run_id(p: Path) -> str | None:
    try:
        return json.loads((p / "state.json").read_text()).get("run_id")
    except (OSError, ValueError):
        return None


def clean_temporaries(root: Path) -> None:
    """Remove what a killed checkpoint write left (``.tmp-*`` folders, ``latest.tmp``)."""
    for t in root.glob(".tmp-*"):
        shutil.rmtree(t, ignore_errors=True)
    (root / "latest.tmp").unlink(missing_ok=True)


def save(folder: Path, *, iteration: int, tensors: dict[str, torch.Tensor], optimizer_state: dict, state: dict,
         config_yaml: str, reference: dict[str, torch.Tensor] | None = None) -> Path:
    """``tensors``: the trainable parameters by name, whole (not sharded); ``optimizer_state``: the
    optimizer's ``state_dict()`` with whole tensors. Written by one process."""
    from seeupo.train.runlog import dumps

    root = folder / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    clean_temporaries(root)
    final = root / f"iter-{iteration:06d}"
    tmp = root / f".tmp-{iteration:06d}"
    tmp.mkdir()
    save_file({n: t.detach().cpu().contiguous() for n, t in tensors.items()}, tmp / "trainable.safetensors")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    if reference is not None:  # the KL reference policy's trainable tensors
        save_file({n: v.detach().cpu().contiguous() for n, v in reference.items()}, tmp / "reference.safetensors")
    (tmp / "state.json").write_text(dumps({**state, "iteration": iteration}, indent=1))
    (tmp / "config.yaml").write_text(config_yaml)
    for f in tmp.iterdir():
        _fsync_file(f)
    _fsync_dir(tmp)
    if final.exists():  # the same iteration again (a stop right after a scheduled checkpoint)
        old = root / f".tmp-old-{iteration:06d}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    write_atomic(root / "latest", final.name)
    run_id = state.get("run_id")
    mine = sorted((p for p in root.glob("iter-*") if p != final and _run_id(p) == run_id), key=_iteration)
    for old in mine[:max(len(mine) - (KEEP - 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(folder: Path) -> Path | None:
    marker = folder / "checkpoints" / "latest"
    if not marker.exists():
        return None
    clean_temporaries(folder / "checkpoints")
    path = folder / "checkpoints" / marker.read_text().strip()
    return path if (path / "state.json").exists() else None


def load(path: Path, named_params, optimizer) -> dict:
    """Whole tensors into the parameters (this process's shard of each where they are sharded), so
    a checkpoint loads into any number of processes."""
    from seeupo.train.parallel import like, shard_optimizer_state

    tensors = load_file(path / "trainable.safetensors")
    params = dict(named_params)
    missing = set(params) - set(tensors)
    if missing:
        raise ValueError(f"checkpoint {path} lacks parameters {sorted(missing)[:3]}...; was it written "
                         "with another model or LoRA setting? (see its config.yaml)")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(like(tensors[n], p))
    if optimizer is not None:
        # The config in force wins over hyper-parameters stored with the optimizer state (a resumed
        # run with a new learning rate must use it, not silently keep the old one).
        current = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        optimizer.load_state_dict(shard_optimizer_state(torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu"),
                                                        optimizer))
        for group, hyper in zip(optimizer.param_groups, current):
            group.update(hyper)
    return json.loads((path / "state.json").read_text())


def load_reference(path: Path) -> dict[str, torch.Tensor] | None:
    f = path / "reference.safetensors"
    return load_file(f) if f.exists() else None
