"""A worker process under another environment's Python, spoken to in JSON lines: one request
``{"op": ..., ...}`` per line in, one answer ``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``
per line out; the worker's first line says whether it started. Used where a package pins
dependencies seeupo cannot share (AppWorld: pydantic 1; vLLM: its own torch).

Every read has a timeout (``timeout`` seconds, default ``DEFAULT_TIMEOUT``): a worker that does not
answer in time is killed and the request raises ``WorkerTimeout``, so a hung worker cannot hang the
run (the caller decides what that ends: an AppWorld episode, or the vLLM engine)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path

DEFAULT_TIMEOUT = 1800.0


class WorkerTimeout(TimeoutError):
    """A worker did not answer within its timeout (it has been killed)."""


class JsonWorker:
    def __init__(self, python: str, script: Path, *, name: str, stderr=subprocess.DEVNULL, env=None, cwd=None,
                 timeout: float | None = None):
        """Start ``python -I script`` (-I: the script's folder stays off ``sys.path``, so a module named
        like the package it wraps cannot shadow it). ``hello`` holds the worker's first answer.
        ``timeout``: seconds a read may wait (default: a ``timeout`` attribute a subclass set before
        calling this, else ``DEFAULT_TIMEOUT``)."""
        self.name = name
        self.timeout = timeout or getattr(self, "timeout", None) or DEFAULT_TIMEOUT
        self.proc = subprocess.Popen([python, "-I", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, text=True, bufsize=1, env=env, cwd=cwd)
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.hello = self.read()

    def _pump(self) -> None:
        """The worker's output, line by line, into a queue (so a read can wait with a timeout)."""
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def read(self, timeout: float | None = None) -> dict:
        try:
            line = self._lines.get(timeout=timeout or self.timeout)
        except queue.Empty:
            self.proc.kill()
            raise WorkerTimeout(f"the {self.name} worker did not answer within {timeout or self.timeout:g} s "
                                "(killed)") from None
        if not line:
            self._lines.put("")  # stays closed for later reads
            return {"ok": False, "error": f"the {self.name} worker exited (code {self.proc.poll()})"}
        return json.loads(line)

    def ask(self, op: str, timeout: float | None = None, **kw) -> dict:
        """Send one request; its answer, or a RuntimeError with the worker's error (``WorkerTimeout``
        when it does not answer within ``timeout`` seconds, default the worker's)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} {op}: the worker is not running (exit code {self.proc.poll()})")
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        out = self.read(timeout)
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
