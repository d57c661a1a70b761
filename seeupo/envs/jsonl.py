"""``jsonl``: tasks read from a JSONL file, for agent programs (``seeupo train --agent``; docs/agents.md).

Each line is a JSON object: ``{"id": ..., "split": "train" | "test" | ..., ...}``; every other key goes
into ``Task.data`` (what the agent reads). ``id`` defaults to ``jsonl-<line number>``; ``split`` to
``train``. The family has tasks but no environment: the agent program is the environment, so a run
needs ``rollout.agent`` and no warm-up (``warmup.enabled=off``), and ``make`` says so.

Bad input is refused at load time with the file and line: a line that is not a JSON object, a
repeated id, an id or split that is not a string, an empty file, a missing file.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from seeupo.envs.base import Env, EnvFamily, Task, register


class JsonlOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(..., description="the JSONL file of tasks, one JSON object per line")


def read_tasks(path: str) -> list[Task]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"env.options.path: no file {path}")
    tasks, seen = [], set()
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{n}: a task must be a JSON object, not {type(obj).__name__}")
        tid, split = obj.pop("id", f"jsonl-{n}"), obj.pop("split", "train")
        if not isinstance(tid, str) or not isinstance(split, str):
            raise ValueError(f"{path}:{n}: id and split must be strings")
        if tid in seen:
            raise ValueError(f"{path}:{n}: the id {tid!r} is repeated")
        seen.add(tid)
        tasks.append(Task(id=tid, split=split, data=obj))
    if not tasks:
        raise ValueError(f"{path}: no tasks")
    return tasks


@register("jsonl")
class JsonlFamily(EnvFamily):
    name = "jsonl"

    def __init__(self, **options):
        self.opts = JsonlOptions(**options)
        self._tasks = read_tasks(self.opts.path)

    def tasks(self, split: str) -> list[Task]:
        found = [t for t in self._tasks if t.split == split]
        if not found:
            splits = sorted({t.split for t in self._tasks})
            raise ValueError(f"{self.opts.path} has no task of split {split!r}; its splits: {', '.join(splits)}")
        return found

    def make(self, task: Task, *, seed: int) -> Env:
        raise ValueError("env jsonl holds tasks only: the agent program is the environment; run with --agent "
                         "FILE.py:FUNCTION and warmup.enabled=off")
