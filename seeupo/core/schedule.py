"""Update schedules: which turns are updated together, in what order, and SeeUPO's factor.

``turn_order`` turns a set of turn indices into **phases** (lists of turn indices updated
together). Joint algorithms (PPO, GRPO, GSPO, RLOO, REINFORCE) have one phase; SeeUPO has one phase
per turn, latest turn first. ``update_factor`` carries the importance ratios of already-updated
turns into the advantages of the turns updated after them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

ORDERS = ("reverse", "natural", "random", "joint", "window:W", "<list of ints>")


def turn_order(
    turns: Iterable[int],
    order: str | Sequence[int],
    *,
    rng: torch.Generator | int | None = None,
) -> list[list[int]]:
    """Phases of turn indices, in update order.

    - ``"reverse"``: ``[[t_max], ..., [t_min]]`` (SeeUPO's backward induction)
    - ``"natural"``: ``[[t_min], ..., [t_max]]``
    - ``"random"``: singletons in a permutation drawn from ``rng`` (a ``torch.Generator`` or a seed)
    - ``"joint"``: ``[[all turns, ascending]]``
    - ``"window:W"``: the last ``W`` turns as reverse singletons, then one joint phase with the rest
    - a list of ints: singletons in that order; it must be a permutation of ``turns``

    Example:
        >>> turn_order([0, 2, 1], "reverse")
        [[2], [1], [0]]
        >>> turn_order([0, 1, 2, 3], "window:2")
        [[3], [2], [0, 1]]
    """
    given = [int(t) for t in turns]
    ts = sorted(set(given))
    if len(ts) != len(given):
        raise ValueError(f"turn indices must be unique, got {given}")
    if not isinstance(order, str):
        custom = [int(t) for t in order]
        if sorted(custom) != ts:
            raise ValueError(
                f"a custom turn order must be a permutation of the turns present {ts}, got {custom}"
            )
        return [[t] for t in custom]
    if not ts:
        return []
    if order == "reverse":
        return [[t] for t in reversed(ts)]
    if order == "natural":
        return [[t] for t in ts]
    if order == "joint":
        return [ts]
    if order == "random":
        gen = rng if isinstance(rng, torch.Generator) else torch.Generator().manual_seed(
            int(rng) if rng is not None else int(torch.randint(0, 2**62, ()).item())
        )
        perm = torch.randperm(len(ts), generator=gen).tolist()
        return [[ts[i]] for i in perm]
    if order.startswith("window:"):
        try:
            w = int(order.split(":", 1)[1])
        except ValueError:
            w = 0
        if w < 1:
            raise ValueError(f"order {order!r}: the window must be a positive integer, e.g. 'window:2'")
        tail, rest = ts[-w:], ts[:-w] if w < len(ts) else []
        return [[t] for t in reversed(tail)] + ([rest] if rest else [])
    raise ValueError(f"unknown turn order {order!r}; valid: {', '.join(ORDERS)}")


def update_factor(
    factor_E: torch.Tensor,
    episode_index_R: torch.Tensor,
    seq_log_ratio_R: torch.Tensor,
    *,
    clip: tuple[float, float] | None = None,
) -> torch.Tensor:
    """SeeUPO's running factor after one turn's update.

    For each row ``r`` (at most one row per episode):
    ``M'[e_r] = M[e_r] * exp(seq_log_ratio_r)``; with ``clip=(lo, hi)`` the ratio is clamped to
    ``[lo, hi]`` before multiplying and the product after. Episodes without a row keep their
    factor. The result does not depend on the order of the rows. Returns a new tensor.

    Args:
        factor_E: ``[E]`` current factor per episode (keyed by episode id).
        episode_index_R: ``[R]`` episode id of each row (unique).
        seq_log_ratio_R: ``[R]`` log sequence ratio of each row under the updated policy.

    Example:
        >>> update_factor(torch.ones(3), torch.tensor([2, 0]), torch.log(torch.tensor([2., .5])))
        tensor([0.5000, 1.0000, 2.0000])
    """
    if episode_index_R.shape != seq_log_ratio_R.shape or episode_index_R.dim() != 1:
        raise ValueError("episode_index_R and seq_log_ratio_R must be 1-D of equal length")
    idx = episode_index_R.long()
    if idx.numel() and (idx.min() < 0 or idx.max() >= factor_E.shape[0]):
        raise ValueError(f"episode index out of range [0, {factor_E.shape[0]})")
    if torch.unique(idx).numel() != idx.numel():
        raise ValueError("update_factor: more than one row for an episode in one turn pool")
    ratio = torch.exp(seq_log_ratio_R.detach().to(factor_E.dtype))
    if clip is not None:
        lo, hi = clip
        ratio = ratio.clamp(lo, hi)
    product = factor_E[idx] * ratio
    if clip is not None:
        product = product.clamp(lo, hi)
    out = factor_E.clone()
    out[idx] = product
    return out
