"""Checkpoints: trainable parameters (safetensors), optimizer state, run state, resolved config.

Each checkpoint is written into a temporary folder and renamed into place, then ``latest`` is
replaced atomically, so an interrupted write never leaves a half checkpoint behind.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

KEEP = 2


def trainable_state(named_params) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous().clone() for n, p in named_params}


def save(folder: Path, *, iteration: int, tensors: dict[str, torch.Tensor], optimizer_state: dict, state: dict,
         config_yaml: str, reference: dict[str, torch.Tensor] | None = None) -> Path:
    """``tensors``: the trainable parameters by name, whole (not sharded); ``optimizer_state``: the
    optimizer's ``state_dict()`` with whole tensors. Written by one process."""
    root = folder / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter-{iteration:06d}"
    tmp = root / f".tmp-{iteration:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({n: t.detach().cpu().contiguous() for n, t in tensors.items()}, tmp / "trainable.safetensors")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    if reference is not None:  # the KL reference policy's trainable tensors
        save_file({n: v.detach().cpu().contiguous() for n, v in reference.items()}, tmp / "reference.safetensors")
    (tmp / "state.json").write_text(json.dumps({**state, "iteration": iteration}, indent=1))
    (tmp / "config.yaml").write_text(config_yaml)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / "latest.tmp"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    for old in sorted(p for p in root.glob("iter-*") if p != final)[:-(KEEP - 1) or None]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(folder: Path) -> Path | None:
    marker = folder / "checkpoints" / "latest"
    if not marker.exists():
        return None
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
