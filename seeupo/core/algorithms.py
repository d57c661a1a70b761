"""Named algorithms as small declarations over the core functions.

An algorithm is (advantage estimator, normalisation, policy loss, update schedule, defaults).
SeeUPO differs from GSPO only in its schedule (reverse sequential phases with the factor).
Both the tabular lab and the LLM trainer read these declarations.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from seeupo.core.registry import pick


@dataclass(frozen=True)
class Algorithm:
    name: str
    estimator: str  # "grae" (critic-free, one scalar per episode) | "gae" (critic, per token)
    loss: str  # key of core.losses.POLICY_LOSSES
    order: str = "joint"  # core.schedule.turn_order name
    norm: str = "group"  # grae normalisation
    leave_one_out: bool = False
    epochs: int = 1  # optimisation passes over each phase's rows
    sequential: bool = False  # carry the SeeUPO factor between phases
    summary: str = ""


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm("ppo", "gae", "clip_token", epochs=4, norm="none",
                  summary="GAE with a critic, token-level clipped ratio, joint update"),
        Algorithm("grpo", "grae", "clip_token", norm="group", epochs=4,
                  summary="group mean/std advantage, token-level clipped ratio, joint update"),
        Algorithm("gspo", "grae", "clip_sequence", norm="group", epochs=4,
                  summary="group mean/std advantage, sequence-level clipped ratio, joint update"),
        Algorithm("rloo", "grae", "reinforce", norm="none", leave_one_out=True,
                  summary="leave-one-out advantage, one on-policy gradient step"),
        Algorithm("reinforce", "grae", "reinforce", norm="none",
                  summary="group-mean advantage, one on-policy gradient step"),
        Algorithm("seeupo", "grae", "clip_sequence", order="reverse", norm="batch", epochs=4,
                  sequential=True,
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
