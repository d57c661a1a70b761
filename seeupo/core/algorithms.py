"""Named algorithms as small declarations over the core functions.

An algorithm is (advantage estimator, normalisation, policy loss, turn order, update schedule).
SeeUPO differs from GSPO only in its order (reverse sequential phases carrying the factor), its
normalisation and its schedule. Both the tabular lab and the LLM trainer read these declarations.

Each declaration's ``schedule`` is the algorithm's own published one (where its paper states one);
a run may replace any field for the algorithm it runs (``algo.schedules.<name>`` in the config), and
the shipped presets set *matched* schedules (docs/train.md): PPO, GRPO and GSPO take as many
optimizer steps per iteration as SeeUPO takes turn phases (``minibatches="turns"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from seeupo.core.estimators import get_estimator
from seeupo.core.registry import pick

TURNS = "turns"  # minibatches: one optimizer step per turn index present (SeeUPO's phase count)


@dataclass(frozen=True)
class Schedule:
    """How an algorithm turns one iteration's rows into optimizer steps.

    - ``epochs``: passes over each phase's rows.
    - ``minibatches``: optimizer steps per pass (the rows split into that many random minibatches),
      or ``"turns"`` (joint algorithms only): as many as the turn indices present in the iteration,
      i.e. the number of phases SeeUPO takes on the same rollouts.
    - ``clip_eps`` / ``clip_eps_high``: the clip range ``[1 - eps, 1 + eps_high]`` of the ratio
      (``clip_eps_high=None``: symmetric).

    >>> Schedule(epochs=2, minibatches="turns").steps_per_pass(n_turns=3)
    3
    >>> Schedule(epochs=2, minibatches="turns").optimizer_steps(n_turns=3, phases=1)
    6
    """

    epochs: int = 1
    minibatches: int | str = 1
    clip_eps: float = 0.2
    clip_eps_high: float | None = None

    def __post_init__(self):
        if int(self.epochs) < 1:
            raise ValueError(f"schedule epochs must be >= 1, got {self.epochs}")
        if self.minibatches != TURNS and (not isinstance(self.minibatches, int) or isinstance(self.minibatches, bool)
                                          or self.minibatches < 1):
            raise ValueError(f"schedule minibatches must be a positive integer or {TURNS!r}, got {self.minibatches!r}")
        if not self.clip_eps > 0 or (self.clip_eps_high is not None and not self.clip_eps_high > 0):
            raise ValueError("schedule clip_eps and clip_eps_high must be > 0")

    def steps_per_pass(self, n_turns: int) -> int:
        """Minibatches of one pass over a phase, given the number of turn indices present."""
        return max(1, n_turns) if self.minibatches == TURNS else int(self.minibatches)

    def optimizer_steps(self, n_turns: int, phases: int) -> int:
        """Planned optimizer steps of one iteration (a phase with fewer rows than minibatches takes
        fewer; the trainer reports the steps actually taken)."""
        return phases * self.epochs * self.steps_per_pass(n_turns)

    def as_dict(self) -> dict:
        return {"epochs": self.epochs, "minibatches": self.minibatches, "clip_eps": self.clip_eps,
                "clip_eps_high": self.clip_eps if self.clip_eps_high is None else self.clip_eps_high}


@dataclass(frozen=True)
class Algorithm:
    name: str
    estimator: str  # a name in core.estimators.ESTIMATORS (its parameters' defaults live there)
    loss: str  # key of core.losses.POLICY_LOSSES
    order: str = "joint"  # core.schedule.turn_order name
    norm: str = "group"  # grae normalisation
    leave_one_out: bool = False
    sequential: bool = False  # carry the SeeUPO factor between phases
    schedule: Schedule = field(default_factory=Schedule)
    summary: str = ""

    def __post_init__(self):
        get_estimator(self.estimator)  # raises with the valid names

    @property
    def params(self):
        """Its estimator's parameters at their published defaults (``core.estimators``)."""
        return get_estimator(self.estimator).defaults


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm("ppo", "gae", "clip_token", norm="none", schedule=Schedule(epochs=4, minibatches=4),
                  summary="GAE with a critic, token-level clipped ratio, joint update"),
        # DeepSeekMath's GRPO: one update per exploration stage
        Algorithm("grpo", "grae", "clip_token", norm="group", schedule=Schedule(epochs=1, minibatches=1),
                  summary="group mean/std advantage, token-level clipped ratio, joint update"),
        # the GSPO paper: each batch in four minibatches, sequence-level clip range 3e-4 / 4e-4
        Algorithm("gspo", "grae", "clip_sequence", norm="group",
                  schedule=Schedule(epochs=1, minibatches=4, clip_eps=3e-4, clip_eps_high=4e-4),
                  summary="group mean/std advantage, sequence-level clipped ratio, joint update"),
        Algorithm("rloo", "grae", "reinforce", norm="none", leave_one_out=True,
                  summary="leave-one-out advantage, one on-policy gradient step"),
        Algorithm("reinforce", "grae", "reinforce", norm="none",
                  summary="group-mean advantage, one on-policy gradient step"),
        # Turn-level credit (issue 34; sources, equations and schedules in docs/core.md).
        # GiGPO as verl-agent runs it: GRPO's token-level clip 0.2, one PPO epoch; gamma 0.95, omega 1 (core.estimators),
        # no std division ("mean_norm")
        Algorithm("gigpo", "gigpo", "clip_token", norm="none",
                  summary="episode group advantage plus the step group's (same anchor state) discounted "
                          "return advantage, token-level clipped ratio, joint update"),
        # HGPO as verl-agent's recipe/hgpo runs it: GRPO's token-level clip, one PPO epoch; history 2,
        # alpha 1, gamma 0.95 (core.estimators), its trainer config's mean_std_norm (population std)
        Algorithm("hgpo", "hgpo", "clip_token", norm="group",
                  summary="discounted step return compared within groups of turns sharing their last 1..K+1 "
                          "observations, levels weighted (k+1)^alpha; token-level clipped ratio, joint update"),
        # MT-GRPO: GRPO's objective with the turn reward's group advantage added to the outcome's (lam 1)
        Algorithm("mt-grpo", "turn_grae", "clip_token", norm="group",
                  summary="outcome group advantage plus the turn reward's group advantage per turn, "
                          "token-level clipped ratio, joint update"),
        # GRPO with the group-relative reward-to-go: a reward earned before a turn is not in its advantage
        Algorithm("grpo-togo", "grae_to_go", "clip_token", norm="group",
                  summary="group mean/std advantage of each turn's reward-to-go, token-level clipped ratio, "
                          "joint update"),
        # Turn-PPO: a critic over turn states, GAE over turns (gamma 0.99, lambda 0.9, the paper's best: core.estimators),
        # each turn's sequence ratio clipped; PPO's epochs and minibatches
        Algorithm("turn-ppo", "turn_gae", "clip_sequence", norm="none",
                  schedule=Schedule(epochs=4, minibatches=4),
                  summary="GAE over turns with a turn-state critic, turn-level (sequence) clipped ratio, "
                          "joint update"),
        # the authors' configuration: one optimizer step per turn phase
        Algorithm("seeupo", "grae", "clip_sequence", order="reverse", norm="batch", sequential=True,
                  schedule=Schedule(epochs=1, minibatches=1),
                  summary="batch-normalised advantage, sequence-level clipped ratio, one phase per "
                          "turn in reverse order carrying the factor of updated turns"),
    ]
}
ALGORITHMS["seeupo-natural"] = replace(ALGORITHMS["seeupo"], name="seeupo-natural", order="natural",
                                       summary="SeeUPO with turns updated first to last")
ALGORITHMS["seeupo-random"] = replace(ALGORITHMS["seeupo"], name="seeupo-random", order="random",
                                      summary="SeeUPO with a fresh random turn order every iteration")


def get_algorithm(name: str) -> Algorithm:
    """The declaration of the algorithm called ``name``; see ``ALGORITHMS``."""
    return pick(ALGORITHMS, name, "algorithm")


def carries_factor(algo: Algorithm, factor_ratio: str = "geometric") -> bool:
    """Whether an update carries SeeUPO's factor between phases: only sequential algorithms, and
    not with ``factor_ratio="off"``. A joint algorithm given a turn order runs phases without it.
    The trainer and the lab both use this rule.

    >>> carries_factor(get_algorithm("seeupo")), carries_factor(get_algorithm("grpo"))
    (True, False)
    """
    return algo.sequential and factor_ratio != "off"
