"""Environments: the protocol, the registry, and the built-in ones."""

from seeupo.envs import appworld, bfcl, jsonl, lookup, textworld, trap  # noqa: F401  (register the built-in environments)
from seeupo.envs.base import ENVS, Env, EnvFamily, StepResult, Task, make_family

__all__ = ["ENVS", "Env", "EnvFamily", "StepResult", "Task", "make_family"]
