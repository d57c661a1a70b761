"""The advantage estimators by name: what each computes, its published parameter defaults and the
settings it refuses, declared together. The trainer and the lab look estimators up here and
dispatch on their ``kind``; adding one is an entry in ``ESTIMATORS`` (docs/core.md, "Adding an
estimator").

- ``kind="episode"``: one advantage per episode ``[N]`` (GRAE and its relatives).
- ``kind="turn"``: one per episode and turn ``[N, T]``, critic-free (GiGPO, MT-GRPO, ...).
- ``kind="critic"``: needs a learned value head; the trainer's critic drivers compute it
  (``compute`` is None here).

An estimator reads one iteration's episodes as ``Turns`` (tensors only: no model, no config).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from seeupo.core.advantages import EPISODE_NORMS, NORMS, gigpo, grae, grae_to_go, hgpo, last_reached, turn_grae
from seeupo.core.registry import pick
from seeupo.core.schedule import is_segmented

KINDS = ("episode", "turn", "critic")


@dataclass(frozen=True)
class Turns:
    """One iteration's episodes as an estimator reads them; ``T`` the longest episode's turns.

    - ``rewards_N``: each episode's return (the sum of its turn rewards);
    - ``groups_N``: the group (task) of each episode;
    - ``step_rewards_NT``: the reward of each turn (0 where not reached);
    - ``mask_NT``: 1 where the episode reached the turn;
    - ``anchors_NT``: each turn's anchor key (the observation it starts from; GiGPO's step groups),
      None where the episodes carry none."""

    rewards_N: torch.Tensor
    groups_N: torch.Tensor
    step_rewards_NT: torch.Tensor
    mask_NT: torch.Tensor
    anchors_NT: torch.Tensor | None = None

    def anchors(self, estimator: str) -> torch.Tensor:
        if self.anchors_NT is None:
            raise ValueError(f"{estimator} needs the anchor key of every turn (Turns.anchors_NT)")
        return self.anchors_NT


@dataclass(frozen=True)
class Estimator:
    """One estimator's declaration.

    - ``compute(turns, *, norm, eps, **params)``: ``[N]`` (episode) or ``[N, T]`` (turn) advantages;
      None for a critic's (the trainer computes it with its value head).
    - ``defaults``: every parameter it reads, with its authors' published value (a run overrides
      them: ``algo.gamma``, ``algo.lam``, ``algo.step_weight``, ``algo.episode_norm`` or
      ``algo.params.NAME``).
    - ``check(params)``: raises ``ValueError`` on a parameter value it cannot use.
    - ``norms``: the normalisations it takes (``"batch"`` on a turn estimator: computed without
      normalisation, then standardised over the reached turns, by ``estimate``).
    - ``source``: where its definition and defaults come from."""

    name: str
    kind: str
    compute: Callable[..., torch.Tensor] | None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[Mapping[str, Any]], None] | None = None
    norms: tuple[str, ...] = NORMS
    source: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"estimator {self.name!r}: kind must be one of {', '.join(KINDS)}")
        if (self.compute is None) != (self.kind == "critic"):
            raise ValueError(f"estimator {self.name!r}: a critic has no compute here; every other kind needs one")
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))


ESTIMATORS: dict[str, Estimator] = {}


def register(est: Estimator) -> Estimator:
    """Add ``est`` to ``ESTIMATORS`` (its name must be new); returns it."""
    if est.name in ESTIMATORS:
        raise ValueError(f"estimator {est.name!r} is registered already")
    ESTIMATORS[est.name] = est
    return est


def get_estimator(name: str) -> Estimator:
    """The declaration of the estimator called ``name``; see ``ESTIMATORS``."""
    return pick(ESTIMATORS, name, "advantage estimator")


def names(kind: str | None = None) -> tuple[str, ...]:
    """The registered estimators (of one kind)."""
    return tuple(n for n, e in ESTIMATORS.items() if kind is None or e.kind == kind)


def readers(param: str) -> tuple[str, ...]:
    """The estimators that read parameter ``param``."""
    return tuple(n for n, e in ESTIMATORS.items() if param in e.defaults)


def params_of(name: str, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The estimator's parameters: its defaults with ``given`` over them, checked. A key it does not
    read raises ``ValueError``."""
    est = get_estimator(name)
    given = dict(given or {})
    unknown = sorted(set(given) - set(est.defaults))
    if unknown:
        raise ValueError(f"{name} has no parameter {', '.join(unknown)}; its parameters: "
                         f"{', '.join(est.defaults) or 'none'}")
    out = {**est.defaults, **given}
    if est.check is not None:
        est.check(out)
    return out


def refusal(name: str, *, algorithm: str, own: str, order, update_turns: str, leave_one_out: bool) -> str | None:
    """Why a run cannot use estimator ``name`` with these settings (None: it can). ``own``: the
    running algorithm's own estimator; ``order``: the turn order in force; ``update_turns``: the
    turns trained; ``leave_one_out``: the algorithm's baseline leaves each episode out (RLOO)."""
    est, mine = get_estimator(name), get_estimator(own)
    if name != own and est.kind == "critic":
        return (f"algo.estimator={name!r} learns a critic; it comes with its algorithm "
                f"({', '.join(_critic_algorithms(name))}): set algo.name instead")
    if name != own and mine.kind == "critic":
        return (f"algo.estimator={name!r}: {algorithm} learns a critic ({own}); the estimator applies to "
                "critic-free algorithms")
    if name != own and leave_one_out:
        return (f"algo.estimator={name!r}: {algorithm}'s leave-one-out baseline has no per-turn form here; use "
                "the estimator with grpo, gspo, reinforce or seeupo")
    if est.kind == "turn" and is_segmented(order):
        return (f"algo.estimator={name} gives each turn its own advantage; algo.order={order} trains a bucket of "
                "turns as one segment row with one advantage")
    if name == "turn_gae" and update_turns != "all":
        return f"{algorithm}'s turn critic needs every turn's value; algo.update_turns must be 'all'"
    if est.kind == "critic" and order != "joint":
        return (f"algo.order={order!r}: {algorithm}'s GAE update is joint over trajectory rows; drop algo.order "
                "(turn orders apply to the critic-free algorithms)")
    return None


def _critic_algorithms(name: str) -> list[str]:
    from seeupo.core.algorithms import ALGORITHMS  # (algorithms import this module)
    return [a.name for a in ALGORITHMS.values() if a.estimator == name]


def estimate(name: str, turns: Turns, *, norm: str, params: Mapping[str, Any] | None = None,
             leave_one_out: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """The critic-free advantages of estimator ``name`` on ``turns``: ``[N]`` or ``[N, T]``.

    ``norm="batch"`` (SeeUPO's) on a turn estimator computes it without normalisation and then
    standardises its reached entries over the batch, ``(A - mean) / (std + eps)`` (unbiased std), as
    ``grae``'s ``"batch"`` does with episode advantages. ``leave_one_out``: RLOO's baseline (episode
    estimators only).

    Example (one group of two 2-turn episodes, a reward 1 on episode 0's first turn only):
        >>> r = torch.tensor([[1., 0.], [0., 0.]])
        >>> t = Turns(r.sum(-1), torch.tensor([0, 0]), r, torch.ones(2, 2))
        >>> estimate("grae", t, norm="none")
        tensor([ 0.5000, -0.5000])
        >>> estimate("grae_to_go", t, norm="none")
        tensor([[ 0.5000,  0.0000],
                [-0.5000,  0.0000]])
    """
    est = get_estimator(name)
    if est.kind == "critic":
        raise ValueError(f"{name} needs a value head: the trainer's critic driver computes it")
    if norm not in est.norms and not (norm == "batch" and est.kind == "turn"):
        raise ValueError(f"{name} takes norm {', '.join(est.norms)}; got {norm!r}")
    p = params_of(name, params)
    if est.kind == "episode":
        return est.compute(turns, norm=norm, eps=eps, leave_one_out=leave_one_out, **p)
    if leave_one_out:
        raise ValueError(f"{name} has no leave-one-out form")
    if norm != "batch":
        return est.compute(turns, norm=norm, eps=eps, **p)
    a = est.compute(turns, norm="none", eps=eps, **p)
    reached = turns.mask_NT.bool()
    x = a[reached]
    if x.numel() == 0:
        return a
    std = x.std() if x.numel() > 1 else x.new_zeros(())
    return torch.where(reached, (a - x.mean()) / (std + eps), torch.zeros_like(a))


def per_turn(adv: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` advantages of every reached turn: an episode estimator's on each of its turns.

    >>> per_turn(torch.tensor([1., -1.]), torch.tensor([[1, 1], [1, 0]]))
    tensor([[ 1.,  1.],
            [-1.,  0.]])
    """
    if adv.dim() == 2:
        return adv
    return torch.where(mask_NT.bool(), adv[:, None].expand(mask_NT.shape).to(adv.dtype), torch.zeros((), dtype=adv.dtype))


# ---- the estimators ---------------------------------------------------------------------------

def _check_range(params: Mapping[str, Any], key: str, lo: float, hi: float | None = None) -> None:
    v = params[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < lo or (hi is not None and v > hi):
        raise ValueError(f"{key}={v!r}: must be a number in [{lo}, {'inf' if hi is None else hi}]")


def _check_gamma_lam(p: Mapping[str, Any]) -> None:
    for k in ("gamma", "lam"):
        if k in p:
            _check_range(p, k, 0.0, 1.0)


def _check_gigpo(p: Mapping[str, Any]) -> None:
    _check_gamma_lam(p)
    _check_range(p, "step_weight", 0.0)
    if p["episode_norm"] not in EPISODE_NORMS:
        raise ValueError(f"episode_norm={p['episode_norm']!r}: use one of {', '.join(EPISODE_NORMS)}")


def _grae(t: Turns, *, norm, eps, leave_one_out=False):
    return grae(t.rewards_N, t.groups_N, norm=norm, leave_one_out=leave_one_out, eps=eps)


def _gigpo(t: Turns, *, norm, eps, gamma, step_weight, episode_norm):
    return gigpo(t.rewards_N, t.groups_N, t.step_rewards_NT, t.anchors("gigpo"), t.mask_NT, omega=step_weight,
                 gamma=gamma, norm=norm, episode_norm=episode_norm, eps=eps)


def mt_grpo_turns(mask_NT: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` the turns that carry an MT-GRPO turn reward: every reached turn but each episode's
    last (the authors' final turn takes the outcome's advantage alone).

    >>> mt_grpo_turns(torch.tensor([[1, 1, 1], [1, 0, 0]]))
    tensor([[1, 1, 0],
            [0, 0, 0]])
    """
    m = mask_NT.long()
    return m.scatter(1, last_reached(m), 0)


def _turn_grae(t: Turns, *, norm, eps, step_weight):
    """MT-GRPO from one run's per-turn rewards: the outcome is the episode's return (with score deltas
    or TextWorld's progress reward the last turn's reward is only its last step); each earlier turn's
    own reward is its turn reward, compared among the group's episodes that had turn t before their
    last; an episode's last turn takes the outcome's advantage alone."""
    return turn_grae(t.rewards_N, t.groups_N, t.step_rewards_NT, t.mask_NT, lam=step_weight, norm=norm,
                     turn_mask_NT=mt_grpo_turns(t.mask_NT), eps=eps)


def _grae_to_go(t: Turns, *, norm, eps):
    return grae_to_go(t.step_rewards_NT, t.groups_N, t.mask_NT, norm=norm, eps=eps)


def _check_hgpo(p: Mapping[str, Any]) -> None:
    _check_gamma_lam(p)
    if isinstance(p["history"], bool) or not isinstance(p["history"], int) or p["history"] < 0:
        raise ValueError(f"history={p['history']!r}: must be an integer >= 0 (the observations before the current one)")
    _check_range(p, "alpha", 0.0)
    if not isinstance(p["base_group"], bool):
        raise ValueError(f"base_group={p['base_group']!r}: must be true or false")


def _hgpo(t: Turns, *, norm, eps, gamma, history, alpha, base_group):
    return hgpo(t.groups_N, t.step_rewards_NT, t.anchors("hgpo"), t.mask_NT, history=history, alpha=alpha, gamma=gamma,
                norm=norm, base_group=base_group, episode_rewards_N=t.rewards_N, eps=eps)


for _e in [
    Estimator("grae", "episode", _grae, source="GRPO (DeepSeekMath); RLOO with leave_one_out; SeeUPO's batch norm"),
    Estimator("gigpo", "turn", _gigpo, {"gamma": 0.95, "step_weight": 1.0, "episode_norm": "step"},
              check=_check_gigpo, norms=("none", "group"),
              source="GiGPO (arXiv 2505.10978); defaults from verl-agent's run scripts and gigpo/core_gigpo.py"),
    Estimator("turn_grae", "turn", _turn_grae, {"step_weight": 1.0}, check=lambda p: _check_range(p, "step_weight", 0.0),
              source="MT-GRPO (arXiv 2505.11821), lambda 1"),
    Estimator("grae_to_go", "turn", _grae_to_go, source="GRPO with each turn's group-relative reward-to-go"),
    Estimator("hgpo", "turn", _hgpo, {"gamma": 0.95, "history": 2, "alpha": 1.0, "base_group": False},
              check=_check_hgpo, norms=("none", "group"),
              source="HGPO (arXiv 2602.22817); defaults from verl-agent's recipe/hgpo run scripts and core_hgpo.py"),
    Estimator("gae", "critic", None, {"gamma": 1.0, "lam": 1.0}, check=_check_gamma_lam, norms=("none",),
              source="PPO with a critic, GAE over tokens"),
    Estimator("turn_gae", "critic", None, {"gamma": 0.99, "lam": 0.9}, check=_check_gamma_lam, norms=("none",),
              source="Turn-PPO (arXiv 2512.17008): GAE over turns, its best gamma and lambda"),
]:
    register(_e)
