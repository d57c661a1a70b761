"""Environments: the protocol, the registry, and the built-in ones."""

from seeupo.envs import bfcl, lookup  # noqa: F401  (register "bfcl", "lookup")
from seeupo.envs.base import ENVS, Env, EnvFamily, StepResult, Task, make_family

__all__ = ["ENVS", "Env", "EnvFamily", "StepResult", "Task", "make_family"]
