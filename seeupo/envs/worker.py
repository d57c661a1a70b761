"""A worker process under another environment's Python, spoken to in JSON lines: one request
``{"op": ..., ...}`` per line in, one answer ``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``
per line out; the worker's first line says whether it started. Used where a package pins
dependencies seeupo cannot share (AppWorld: pydantic 1; vLLM: its own torch)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


class JsonWorker:
    def __init__(self, python: str, script: Path, *, name: str, stderr=subprocess.DEVNULL, env=None, cwd=None):
        """Start ``python -I script`` (-I: the script's folder stays off ``sys.path``, so a module named
        like the package it wraps cannot shadow it). ``hello`` holds the worker's first answer."""
        self.name = name
        self.proc = subprocess.Popen([python, "-I", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, text=True, bufsize=1, env=env, cwd=cwd)
        self.hello = self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            return {"ok": False, "error": f"the {self.name} worker exited (code {self.proc.poll()})"}
        return json.loads(line)

    def ask(self, op: str, **kw) -> dict:
        """Send one request; its answer, or a RuntimeError with the worker's error."""
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        out = self.read()
        if not out.get("ok"):
            raise RuntimeError(f"{self.name} {op}: {out.get('error')}")
        return out

    def close(self, timeout: float = 10) -> None:
        """Close its input (the worker's loop ends there) and wait; kill it if it does not exit."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=timeout)
            except Exception:
                self.proc.kill()
