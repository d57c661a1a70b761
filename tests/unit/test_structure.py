"""The trainer reads top to bottom (issue 61): Trainer.run is a few named steps, no function in
seeupo/train/ runs over 80 lines, Trainer forwards no property to the stack or the updater, and the
lab's run is a few named steps too."""

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


def test_the_command_line_only_parses_and_dispatches():
    """Issue 61: seeupo/cli.py stays a thin layer (under 350 lines); its logic lives in the packages."""
    assert len((ROOT / "seeupo" / "cli.py").read_text().splitlines()) < 350


def _forwarded(node) -> str | None:
    """The text of ``node`` when it is just ``self.stack.X`` or ``self.updater.X`` (or an attribute
    below them), or a lambda returning that; else None."""
    node = node.body if isinstance(node, ast.Lambda) else node
    chain = node
    while isinstance(chain, ast.Attribute):
        if ast.unparse(chain.value) in ("self.stack", "self.updater"):
            return ast.unparse(node)
        chain = chain.value
    return None


def test_the_trainer_forwards_no_property_to_the_stack_or_the_updater():
    """Issue 61: callers reach the policy's and the update's parts as ``trainer.stack.X`` and
    ``trainer.updater.X``; a property of Trainer that merely returns (or sets) one of them is a second
    name for it. Both spellings: ``x = property(lambda self: self.stack.x)`` and a decorated method."""
    tree = ast.parse((ROOT / "seeupo" / "train" / "trainer.py").read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    found = []
    for node in trainer.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "property":
            found += [f"{ast.unparse(node.targets[0])}: {_forwarded(a)}" for a in node.value.args if _forwarded(a)]
        decorators = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
        if any(d == "property" or d.endswith((".setter", ".getter")) for d in decorators):
            body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], (ast.Return, ast.Assign)):
                value = body[0].value if isinstance(body[0], ast.Return) else body[0].targets[0]
                found += [f"{node.name}: {_forwarded(value)}"] if value is not None and _forwarded(value) else []
    assert not found, found


def test_the_labs_run_is_a_few_named_steps():
    """Issue 61: the lab's ``run`` reads as its steps (the checks, then per iteration the episodes,
    their advantages, the phases), each under 40 lines; the phase loop is a function of its own, to
    read beside ``train.update.sequential_update``."""
    from seeupo.lab import runner

    source = inspect.getsource(runner.run)
    assert len(source.splitlines()) < 40
    for step in ("_check", "_episodes", "_advantages", "_phases"):
        assert f"{step}(" in source, step
        assert len(inspect.getsource(getattr(runner, step)).splitlines()) < 40, step
    assert "for k, phase in enumerate(phases):" in inspect.getsource(runner._phases)
