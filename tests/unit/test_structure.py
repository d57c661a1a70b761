"""The trainer reads top to bottom (issue 61): Trainer.run is a few named steps, and no function in
seeupo/train/ runs over 80 lines."""

import ast
import inspect
from pathlib import Path

from seeupo.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def test_trainer_run_is_a_few_named_steps():
    assert len(inspect.getsource(Trainer.run).splitlines()) < 40
    for step in ("_start", "_before_rl", "_loop", "_finish"):
        assert step in inspect.getsource(Trainer.run) or step == "_start"
        assert len(inspect.getsource(getattr(Trainer, step)).splitlines()) < 60, step


def test_no_function_in_the_trainer_package_runs_over_80_lines():
    for path in sorted((ROOT / "seeupo" / "train").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 80, f"{path.name}:{node.name}"
