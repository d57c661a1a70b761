"""``appworld``: AppWorld tasks through the ``appworld`` package, run in its own Python environment.

AppWorld pins pydantic<2 and seeupo needs pydantic 2, so AppWorld lives in a separate environment
with its data, and seeupo drives it through a small worker process (``appworld_worker.py``, standard
library + ``appworld`` only), one per episode. Without that environment and its data, ``--env
appworld`` stops at start with the steps to install them; it never makes up tasks.

The agent writes Python that calls ``apis.<app>.<api>(...)``; AppWorld executes it and its own
evaluation gives the reward (1 when all of the task's checks pass). Step info: ``tool_error`` 1 when
the reply has no code or its output shows a traceback or exception, else 0; ``extra_calls`` 0 (all
of a reply's code blocks run, joined).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from seeupo.envs.base import Env, EnvFamily, EnvUnavailable, Message, StepResult, Task, register
from seeupo.envs.worker import JsonWorker

WORKER = Path(__file__).with_name("appworld_worker.py")
INSTALL = (
    "AppWorld needs its own Python environment with its data (its package pins pydantic<2; seeupo needs "
    "pydantic 2):\n"
    "  python -m venv ~/appworld-env && ~/appworld-env/bin/pip install appworld\n"
    "  ~/appworld-env/bin/appworld install && cd DATA_DIR && ~/appworld-env/bin/appworld download data\n"
    "then: seeupo ... --env appworld env.options.python=~/appworld-env/bin/python env.options.root=DATA_DIR\n"
    "(or set APPWORLD_PYTHON and APPWORLD_ROOT). The data download needs network access.")

SYSTEM = ("You are a coding agent that completes tasks for a user by writing Python that calls the apps' APIs "
          "through the `apis` object, e.g. apis.spotify.login(...). Reply with one ```python``` code block per "
          "message; you will see its output. Look up the API docs with apis.api_docs.show_api_descriptions("
          "app_name=...). When the task is done, call apis.supervisor.complete_task() (with answer=... if the "
          "task asks a question).")


class AppWorldOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    python: Optional[str] = Field(None, description="the AppWorld environment's python (default: $APPWORLD_PYTHON)")
    root: Optional[str] = Field(None, description="folder holding AppWorld's data/ (default: $APPWORLD_ROOT)")
    train_split: str = Field("train", description="AppWorld dataset for the train split")
    test_split: str = Field("test_normal", description="AppWorld dataset for the test split (dev, test_normal, ...)")
    max_output_chars: int = Field(2000, ge=100, description="execution output shown to the model")
    timeout_s: float = Field(120.0, gt=0, description="seconds one worker request may take")


class Worker(JsonWorker):
    """One AppWorld worker process under AppWorld's own Python."""

    def __init__(self, opts: AppWorldOptions):
        python = os.path.expanduser(opts.python or os.environ.get("APPWORLD_PYTHON", ""))
        if not python:
            raise EnvUnavailable("the appworld environment is not configured.\n" + INSTALL)
        if not Path(python).exists():
            raise EnvUnavailable(f"appworld: the python {python!r} does not exist.\n" + INSTALL)
        env = dict(os.environ)
        root = opts.root or os.environ.get("APPWORLD_ROOT")
        if root:
            env["APPWORLD_ROOT"] = os.path.expanduser(root)
            if not Path(env["APPWORLD_ROOT"]).is_dir():
                raise EnvUnavailable(f"appworld: the data folder {root!r} does not exist.\n" + INSTALL)
        self.timeout = opts.timeout_s
        super().__init__(python, WORKER, name="appworld", env=env, cwd=env.get("APPWORLD_ROOT"))
        if not self.hello.get("ok"):
            self.close()
            raise EnvUnavailable(f"appworld: {self.hello.get('error')}\n" + INSTALL)


def extract_code(text: str) -> str:
    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", text, re.S)
    return "\n".join(blocks).strip() if blocks else text.strip()


class AppWorldEnv(Env):
    max_turns = 10

    def __init__(self, task: Task, opts: AppWorldOptions, seed: int):
        self.task, self.opts = task, opts
        self.worker = Worker(opts)
        self.completed = False

    def reset(self) -> list[Message]:
        info = self.worker.ask("start", task_id=self.task.data["task_id"], experiment=f"seeupo-{os.getpid()}")
        sup = info["supervisor"]
        user = (f"I am {sup.get('first_name')} {sup.get('last_name')} (email {sup.get('email')}, phone "
                f"{sup.get('phone_number')}). Task: {info['instruction']}")
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]

    def step(self, assistant_text: str) -> StepResult:
        code = extract_code(assistant_text)
        if not code:
            return StepResult([{"role": "user", "content": "Write a ```python``` code block."}], 0.0, False,
                              {"tool_error": 1, "extra_calls": 0})
        out = self.worker.ask("execute", code=code)
        self.completed = out["completed"]
        text = out["output"][: self.opts.max_output_chars]
        error = int("Traceback" in text or "Exception" in text)
        if self.completed:
            return StepResult([], 0.0, True, {"tool_error": error, "extra_calls": 0})
        return StepResult([{"role": "user", "content": f"Output:\n{text}"}], 0.0, False,
                          {"tool_error": error, "extra_calls": 0})

    def score(self) -> float:
        try:
            return float(self.worker.ask("evaluate")["success"])
        finally:
            self.worker.close()


@register("appworld")
class AppWorldFamily(EnvFamily):
    name = "appworld"

    def __init__(self, **options):
        self.opts = AppWorldOptions(**options)
        worker = Worker(self.opts)  # fails here, at start, when AppWorld or its data is missing
        try:
            self._ids = {}
            for split, name in (("train", self.opts.train_split), ("test", self.opts.test_split)):
                try:
                    self._ids[split] = worker.ask("tasks", split=name)["task_ids"]
                except RuntimeError as e:
                    raise EnvUnavailable(f"appworld: cannot list the {name!r} tasks ({e}); is the data "
                                         "downloaded?\n" + INSTALL) from None
        finally:
            worker.close()

    def tasks(self, split: str) -> list[Task]:
        if split not in self._ids:
            raise ValueError(f"unknown split {split!r}; valid: train, test")
        return [Task(id=f"appworld-{t}", split=split, data={"task_id": t}) for t in self._ids[split]]

    def make(self, task: Task, *, seed: int) -> AppWorldEnv:
        return AppWorldEnv(task, self.opts, seed)


def python_has_appworld(python: str = sys.executable) -> bool:
    return subprocess.call([python, "-c", "import appworld"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL) == 0
