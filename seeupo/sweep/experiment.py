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
    primary: [natural - reverse]     # the question the experiment exists for (optional): "ARM - ARM"
    margin: 0.1                      # the smallest difference that matters, in the metric's units
    order: seeds                     # run seed by seed (default arms: arm by arm)

An experiment with ``primary`` contrasts gives each a verdict (higher, lower, equivalent within
+-margin, inconclusive: ``seeupo.sweep.stats.primary_verdicts``) and reports every other contrast as
an exploratory estimate; one without is exploratory as a whole. ``seeupo sweep NAME --plan --pilot
RECORDS`` simulates the seeds the primaries need; a sweep whose primaries could not reach p_holm <
0.05 at its seeds is refused (``--allow-underpowered`` for a pilot).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from seeupo.train.config import PRESET_DIR, ConfigError, load_config

EXPERIMENT_DIR = PRESET_DIR / "experiments"


class Quick(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seeds: list[int] = Field(default_factory=lambda: [0, 1])
    overrides: list[str] = Field(default_factory=list)
    tune_budget: Optional[int] = Field(None, ge=1, description="tuning trials per tuned arm in quick mode")
    tune_seeds: Optional[list[int]] = None
    arms: Optional[list[str]] = Field(None, description="the fixed arms quick mode runs (default: all); a grid "
                                      "too large for a quick look picks a few, the reference among them")


class TunedArm(BaseModel):
    """An arm whose configuration is tuned first: ``overrides`` fixed, ``space`` searched (merged over
    the experiment's common space)."""

    model_config = ConfigDict(extra="forbid")
    overrides: list[str] = Field(default_factory=list)
    space: dict[str, list] = Field(default_factory=dict)


class Tune(BaseModel):
    """Tuned arms: each gets ``budget`` trials of Optuna's TPE sampler over ``space`` (dotted key ->
    choices), each trial scored by the mean metric over ``seeds`` (tuning seeds, kept apart from the
    experiment's seeds); the best configuration then runs on the experiment's seeds like any arm."""

    model_config = ConfigDict(extra="forbid")
    budget: int = Field(8, ge=1)
    seeds: list[int] = Field(default_factory=lambda: [100])
    space: dict[str, list] = Field(default_factory=dict)
    arms: dict[str, TunedArm]


class Experiment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = ""
    description: str = ""
    base: str = "tiny"
    metric: Literal["avg@k", "pass@k"] = "avg@k"
    reference: str
    seeds: list[int]
    overrides: list[str] = Field(default_factory=list)
    arms: dict[str, list[str]] = Field(default_factory=dict)
    tune: Optional[Tune] = None
    quick: Quick = Field(default_factory=Quick)
    primary: list[str] = Field(default_factory=list, description='declared primary contrasts, "ARM - ARM" (the '
                               "spaces around the minus separate names that may hold hyphens)")
    margin: Optional[float] = Field(None, gt=0, description="the smallest difference that matters (metric units): "
                                    "the equivalence bound of the primaries and the effect their plan is sized for")
    order: Literal["arms", "seeds"] = Field("arms", description="the queue's order: arm by arm, or seed by seed "
                                            "(in blocks of as many seeds as workers, so concurrent trials are "
                                            "other seeds and a seed's arms share one warm-up and one evaluation "
                                            "before RL, and pairs tend to run on one machine)")

    @model_validator(mode="after")
    def _check(self):
        names = [*self.arms, *(self.tune.arms if self.tune else {})]
        if len(set(names)) != len(names):
            raise ValueError("an arm name is used twice (fixed and tuned arms share one namespace)")
        if self.reference not in names:
            raise ValueError(f"reference {self.reference!r} is not an arm; arms: {', '.join(names)}")
        if self.tune:
            for arm, t in self.tune.arms.items():
                space = {**self.tune.space, **t.space}
                if not space or any(not v for v in space.values()):
                    raise ValueError(f"tuned arm {arm}: the search space is empty or has a key without choices")
            if set(self.tune.seeds) & set(self.seeds):
                raise ValueError("tune.seeds must differ from seeds (the comparison runs on fresh seeds)")
        if self.quick.arms is not None:
            unknown = [a for a in self.quick.arms if a not in self.arms]
            if unknown or self.reference not in self.quick.arms:
                raise ValueError(f"quick.arms must name fixed arms and include the reference {self.reference!r}"
                                 + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
        for arm in names:
            if "/" in arm or arm.startswith("."):
                raise ValueError(f"arm name {arm!r}: no '/' or leading '.' (it names a folder)")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be distinct")
        pairs = self.primaries()
        if pairs and self.margin is None:
            raise ValueError("primary contrasts need a margin: the smallest difference that matters, in the "
                             "metric's units (it bounds equivalence and sizes the plan)")
        if len(set(pairs)) != len(pairs):
            raise ValueError("a primary contrast is declared twice")
        for a, b in pairs:
            if a == b or a not in names or b not in names:
                raise ValueError(f"primary {a} - {b}: both sides must be different arms of this experiment; "
                                 f"arms: {', '.join(names)}")
        return self

    def primaries(self) -> list[tuple[str, str]]:
        """The declared primary contrasts as (arm, arm) pairs: the first minus the second."""
        out = []
        for c in self.primary:
            parts = [x.strip() for x in c.split(" - ")]
            if len(parts) != 2 or not all(parts):
                raise ValueError(f"primary {c!r}: write it as 'ARM - ARM' (a space each side of the minus)")
            out.append((parts[0], parts[1]))
        return out

    def underpowered(self, quick: bool = False) -> int | None:
        """None when the primary family can reach p_holm < 0.05 at this experiment's seeds (or it has
        no primaries, or in quick mode); else the fewest seeds at which it could (the exact test's
        smallest p, 2 / 2^n, times the m primaries below 0.05). The plan (``--plan``) gives the seeds
        for power, which are more."""
        from seeupo.sweep.stats import ALPHA, min_p

        m = len(self.primaries())
        n = len(self.plan(quick)[0])
        if quick or not m or min_p(n) * m < ALPHA:
            return None
        need = n
        while min_p(need) * m >= ALPHA:
            need += 1
        return need

    def plan(self, quick: bool) -> tuple[list[int], dict[str, list[str]]]:
        """The seeds and each arm's full override list (experiment-wide, quick, the arm's own)."""
        seeds = self.quick.seeds if quick else self.seeds
        extra = [*self.overrides, *(self.quick.overrides if quick else [])]
        chosen = self.quick.arms if quick and self.quick.arms is not None else list(self.arms)
        return seeds, {arm: [*extra, *self.arms[arm]] for arm in chosen}

    def tune_plan(self, quick: bool) -> tuple[int, list[int], dict[str, tuple[list[str], dict[str, list]]]]:
        """Tuning trials per arm, tuning seeds, and each tuned arm's (overrides, space)."""
        if not self.tune:
            return 0, [], {}
        extra = [*self.overrides, *(self.quick.overrides if quick else [])]
        budget = (self.quick.tune_budget if quick and self.quick.tune_budget else self.tune.budget)
        seeds = (self.quick.tune_seeds if quick and self.quick.tune_seeds else self.tune.seeds)
        return budget, seeds, {arm: ([*extra, *t.overrides], {**self.tune.space, **t.space})
                               for arm, t in self.tune.arms.items()}

    def validate_arms(self, quick: bool) -> None:
        """Every arm's config loads, tuned arms with every choice of their space (a typo fails here,
        before any run starts), and no two fixed arms resolve to the same configuration (they would be
        one arm counted twice in the family)."""
        import json

        _, arms = self.plan(quick)
        checks = list(arms.items())
        for arm, (ov, space) in self.tune_plan(quick)[2].items():
            checks += [(arm, [*ov, f"{k}={yaml_value(v)}"]) for k, vs in space.items() for v in vs]
        resolved: dict[str, str] = {}
        for arm, ov in checks:
            try:
                cfg = load_config(self.base, ov)
            except ConfigError as e:
                raise ConfigError(f"experiment {self.name}, arm {arm}: {e}") from None
            if arm in arms:
                key = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
                twin = next((a for a, k in resolved.items() if k == key), None)
                if twin is not None:
                    raise ConfigError(f"experiment {self.name}: arms {twin} and {arm} have the same configuration "
                                      "(the same trials counted twice in one family); drop one")
                resolved[arm] = key


def yaml_value(value) -> str:
    """A choice of a search space as an override value (parsed back as YAML)."""
    import json

    return json.dumps(value) if not isinstance(value, str) else value


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
