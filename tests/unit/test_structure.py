"""The trainer reads top to bottom (issue 61): Trainer.run is a few named steps, and no function in
seeupo/train/ runs over 80 lines."""

import ast
import re
import subprocess
import sys
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


OPTUNA_PRIVATE = re.compile(r"\._storage|\._trial_id|\._study_id|_get_stale_trial_ids|_cached_frozen_trial"
                            r"|\bfrom optuna[\w.]*\._|\bimport optuna[\w.]*\._")


def test_the_sweep_uses_no_private_name_of_optuna():
    """Issue 61: an Optuna upgrade cannot break the sweep silently through a private attribute."""
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "seeupo").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if OPTUNA_PRIVATE.search(line)]
    assert not found, found


def test_no_module_imports_another_modules_private_name():
    """``from seeupo.X import _name`` ties a module to another's internals (records imported engine's
    ``_params_key``, ``_queue_lock`` and ``_tune_study``, the package's one import cycle)."""
    found = []
    for path in sorted((ROOT / "seeupo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("seeupo"):
                found += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found


def test_the_records_module_stands_without_the_engine():
    """``seeupo.sweep.records`` imports the study helpers it shares with the engine, not the engine."""
    code = ("import sys, seeupo.sweep.records; "
            "print(sorted(m for m in sys.modules if m.startswith('seeupo.sweep')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "seeupo.sweep.engine" not in out and "seeupo.sweep.study" in out, out
