"""Pure tensor math: advantages, losses, KL, update orders, the SeeUPO factor.

No model, no config object, no I/O, no hidden state.
"""

from seeupo.core.advantages import gae, grae
from seeupo.core.algorithms import ALGORITHMS, Algorithm, Schedule, carries_factor, get_algorithm
from seeupo.core.losses import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    get_kl,
    get_policy_loss,
    masked_mean,
    sequence_log_ratio,
)
from seeupo.core.registry import pick
from seeupo.core.schedule import factor_log_ratio, turn_order, update_factor

__all__ = [
    "ALGORITHMS", "Algorithm", "KL_ESTIMATORS", "POLICY_LOSSES", "Schedule", "carries_factor",
    "factor_log_ratio", "gae", "get_algorithm", "get_kl", "get_policy_loss", "grae", "masked_mean", "pick",
    "sequence_log_ratio", "turn_order", "update_factor",
]
