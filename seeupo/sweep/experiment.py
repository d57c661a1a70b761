"""An experiment: a base preset, arms (dotted overrides), seeds, the metric and the reference arm.

``configs/experiments/NAME.yaml`` (or any YAML file of the same shape)::

    description: the paper's Table 4
    base: tiny                       # a preset name or path
    metric: avg@k                    # avg@k | pass@k (held-out, after RL)
    reference: reverse               # the arm others are compared with
    seeds: [0, 1, 2, 3, 4, 5, 6, 7]
    overrides: []                    # applied to every arm
    arms:
      reverse: [algo.name=seeupo]
      natural: [algo.name=seeupo, algo.order=natural]
    quick:                           # --quick: fewer seeds, shorter runs
      seeds: [0, 1]
      overrides: [run.iterations=12]
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from seeupo.train.config import PRESET_DIR, ConfigError, load_config

EXPERIMENT_DIR = PRESET_DIR / "experiments"


class Quick(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seeds: list[int] = Field(default_factory=lambda: [0, 1])
    overrides: list[str] = Field(default_factory=list)


class Experiment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = ""
    description: str = ""
    base: str = "tiny"
    metric: Literal["avg@k", "pass@k"] = "avg@k"
    reference: str
    seeds: list[int]
    overrides: list[str] = Field(default_factory=list)
    arms: dict[str, list[str]]
    quick: Quick = Field(default_factory=Quick)

    @model_validator(mode="after")
    def _check(self):
        if self.reference not in self.arms:
            raise ValueError(f"reference {self.reference!r} is not an arm; arms: {', '.join(self.arms)}")
        for arm in self.arms:
            if "/" in arm or arm.startswith("."):
                raise ValueError(f"arm name {arm!r}: no '/' or leading '.' (it names a folder)")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be distinct")
        return self

    def plan(self, quick: bool) -> tuple[list[int], dict[str, list[str]]]:
        """The seeds and each arm's full override list (experiment-wide, quick, the arm's own)."""
        seeds = self.quick.seeds if quick else self.seeds
        extra = [*self.overrides, *(self.quick.overrides if quick else [])]
        return seeds, {arm: [*extra, *ov] for arm, ov in self.arms.items()}

    def validate_arms(self, quick: bool) -> None:
        """Every arm's config loads (a typo fails here, before any run starts)."""
        _, arms = self.plan(quick)
        for arm, ov in arms.items():
            try:
                load_config(self.base, ov)
            except ConfigError as e:
                raise ConfigError(f"experiment {self.name}, arm {arm}: {e}") from None


def experiments() -> list[str]:
    return sorted(p.stem for p in EXPERIMENT_DIR.glob("*.yaml"))


def load_experiment(name: str) -> Experiment:
    """A shipped experiment by name, or a YAML file; ``ConfigError`` with the fix otherwise."""
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        path = EXPERIMENT_DIR / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"no experiment {name!r}; shipped: {', '.join(experiments())} (or a .yaml path)")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"experiment {path}: not valid YAML: {e}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"experiment {path}: the top level must be a mapping")
    tree.setdefault("name", path.stem)
    try:
        return Experiment(**tree)
    except ValidationError as e:
        detail = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"experiment {path}: {detail}") from None
