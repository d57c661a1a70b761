"""Update schedules: which turns are updated together, in what order, and SeeUPO's factor.

``turn_order`` turns a set of turn indices into **phases** (lists of turn indices updated
together). Joint algorithms (PPO, GRPO, GSPO, RLOO, REINFORCE) have one phase; SeeUPO has one phase
per turn, latest turn first. ``factor_log_ratio`` is a turn's importance weight (whole-response or
length-normalised) and ``update_factor`` carries the weights of already-updated turns into the
advantages of the turns updated after them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from seeupo.core.losses import masked_sum, sequence_log_ratio

ORDERS = ("reverse", "natural", "random", "joint", "window:W", "buckets:B", "<list of ints>")
ALIGNMENTS = ("from_start", "from_end")
FACTOR_RATIOS = ("full", "geometric", "off")
RATIO_REFERENCES = ("sampling", "incremental")


@dataclass(frozen=True)
class SeeUPOOptions:
    """How an update in turn phases runs (``train.update.sequential_update``), as one object.

    - ``order``, ``alignment``: the phases (``turn_order``; reverse = latest decision stage first);
    - ``ratio_reference``: each phase's ratio against the sampling policy, or (``incremental``)
      against the parameters the phase starts from;
    - ``factor_ratio``: the turn weight the factor multiplies in (``factor_log_ratio``);
    - ``factor_clip``: a clamp ``(lo, hi)`` of each turn's weight and of the product, or None;
    - ``carry_factor``: carry SeeUPO's factor between phases (False: a joint algorithm given a
      turn order, or ``factor_ratio="off"``);
    - ``fuse``: fuse the factor's forward pass into the next phase's first step where it can (SPEC §6).

    >>> SeeUPOOptions().order, SeeUPOOptions(order="natural").carry_factor
    ('reverse', True)
    """

    order: str | tuple | list = "reverse"
    alignment: str = "from_start"
    ratio_reference: str = "sampling"
    factor_ratio: str = "geometric"
    factor_clip: tuple[float, float] | None = None
    carry_factor: bool = True
    fuse: bool = True

    def __post_init__(self):
        if self.alignment not in ALIGNMENTS:
            raise ValueError(f"alignment={self.alignment!r}: use one of {', '.join(ALIGNMENTS)}")
        if self.ratio_reference not in RATIO_REFERENCES:
            raise ValueError(f"ratio_reference={self.ratio_reference!r}: use one of {', '.join(RATIO_REFERENCES)}")
        if self.factor_ratio not in FACTOR_RATIOS:
            raise ValueError(f"factor_ratio={self.factor_ratio!r}: use one of {', '.join(FACTOR_RATIOS)}")


def turn_order(
    turns: Iterable[int],
    order: str | Sequence[int],
    *,
    rng: torch.Generator | int | None = None,
    alignment: str = "from_start",
) -> list[list[int]]:
    """Phases of turn indices, in update order.

    ``alignment`` says how the indices relate to time: ``"from_start"`` counts from each episode's
    first turn (index 0 is the earliest decision stage), ``"from_end"`` counts back from each
    episode's last turn (index 0 is the latest stage). The named orders speak of time, so they mean
    the same in both alignments:

    - ``"reverse"``: latest stage first (SeeUPO's backward induction)
    - ``"natural"``: earliest stage first
    - ``"random"``: singletons in a permutation drawn from ``rng`` (a ``torch.Generator`` or a seed)
    - ``"joint"``: ``[[all turns, ascending]]``
    - ``"window:W"``: the latest ``W`` stages as singletons, latest first, then one joint phase
      with the rest
    - ``"buckets:B"``: ``B`` phases of consecutive stages (as equal in size as they can be, the
      later buckets the larger), latest bucket first; ``B`` at least the number of stages is
      ``"reverse"``. The driver trains each bucket as one segment per episode (SPEC §6 of issue 16:
      one sequence ratio over the bucket's turns, the factor carried per bucket)
    - a list of ints: singletons in that order, naming indices as given; listed indices absent
      from ``turns`` are skipped, and every index in ``turns`` must be listed

    Example:
        >>> turn_order([0, 2, 1], "reverse")
        [[2], [1], [0]]
        >>> turn_order([0, 2, 1], "reverse", alignment="from_end")
        [[0], [1], [2]]
        >>> turn_order([0, 1, 2, 3], "window:2")
        [[3], [2], [0, 1]]
        >>> turn_order([0, 1], [2, 1, 0])
        [[1], [0]]
        >>> turn_order(range(5), "buckets:2")
        [[2, 3, 4], [0, 1]]
    """
    given = [int(t) for t in turns]
    ts = sorted(set(given))
    if len(ts) != len(given):
        raise ValueError(f"turn indices must be unique, got {given}")
    if alignment not in ALIGNMENTS:
        raise ValueError(f"unknown turn alignment {alignment!r}; valid names: {', '.join(ALIGNMENTS)}")
    if not isinstance(order, str):
        custom = [int(t) for t in order]
        if len(set(custom)) != len(custom):
            raise ValueError(f"a custom turn order lists each turn index once, got {custom}")
        missing = [t for t in ts if t not in custom]
        if missing:
            raise ValueError(f"the custom turn order {custom} does not list the turn indices {missing} present "
                             "in this iteration; list every index up to rollout.max_turns - 1")
        return [[t] for t in custom if t in ts]
    if not ts:
        return []
    in_time = ts if alignment == "from_start" else ts[::-1]  # earliest stage first
    if order == "reverse":
        return [[t] for t in reversed(in_time)]
    if order == "natural":
        return [[t] for t in in_time]
    if order == "joint":
        return [ts]
    if order == "random":
        gen = rng if isinstance(rng, torch.Generator) else torch.Generator().manual_seed(
            int(rng) if rng is not None else int(torch.randint(0, 2**62, ()).item())
        )
        perm = torch.randperm(len(ts), generator=gen).tolist()
        return [[ts[i]] for i in perm]
    if order.startswith("window:"):
        w = positive_suffix(order, f"order {order!r}: the window")
        tail, rest = in_time[-w:], (in_time[:-w] if w < len(in_time) else [])
        return [[t] for t in reversed(tail)] + ([sorted(rest)] if rest else [])
    if order.startswith("buckets:"):
        b = bucket_count(order)
        n = len(in_time)
        b = min(b, n)
        sizes = [n // b + (1 if i >= b - n % b else 0) for i in range(b)]  # the latest buckets take the remainder
        out, start = [], 0
        for size in sizes:
            out.append(sorted(in_time[start:start + size]))
            start += size
        return out[::-1]
    raise ValueError(f"unknown turn order {order!r}; valid: {', '.join(ORDERS)}")


UPDATE_TURNS = ("all", "last:W", "skip:T")


def kept_turn(turn: int, n_turns: int, spec: str) -> bool:
    """Whether turn ``turn`` (counted from the episode's first, 0-based) of an episode of ``n_turns``
    turns is trained under ``algo.update_turns`` (the others keep their parameters' say but get no
    loss): ``"all"``; ``"last:W"``, the episode's last ``W`` turns (those nearest its outcome);
    ``"skip:T"``, every turn but index ``T`` (turn ``T`` frozen).

    Example:
        >>> [kept_turn(t, 3, "last:1") for t in range(3)], [kept_turn(t, 3, "skip:0") for t in range(3)]
        ([False, False, True], [False, True, True])
    """
    if spec == "all":
        return True
    kind, _, value = spec.partition(":")
    try:
        k = int(value)
    except ValueError:
        k = -1
    if kind == "last" and k >= 1:
        return turn >= n_turns - k
    if kind == "skip" and k >= 0:
        return turn != k
    raise ValueError(f"algo.update_turns={spec!r}; valid: {', '.join(UPDATE_TURNS)} (e.g. last:1, skip:0)")


def positive_suffix(spec: str, what: str) -> int:
    """``N`` of ``"name:N"``, a positive integer; otherwise ``ValueError`` saying ``what`` must be one,
    with an example (``spec`` with 2)."""
    head, _, value = spec.partition(":")
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{what} must be a positive integer, e.g. '{head}:2'")
    return n


def bucket_count(order: str) -> int:
    """``B`` of ``"buckets:B"`` (``ValueError`` with the expected form otherwise)."""
    return positive_suffix(order, f"order {order!r}: the bucket count")


def is_segmented(order) -> bool:
    """Whether an order's multi-turn phases train one segment row per episode (``buckets:B``)."""
    return isinstance(order, str) and order.startswith("buckets:")


def factor_log_ratio(
    logp_new_NL: torch.Tensor, logp_old_NL: torch.Tensor, mask_NL: torch.Tensor, kind: str = "full"
) -> torch.Tensor:
    """Log of each row's turn importance weight ``w_t`` for SeeUPO's factor, ``[N]``.

    - ``"full"``: the whole response's ratio, ``sum_{j: mask=1}(logp_new - logp_old)`` (the
      paper's Eq. 8 and HAML's weight; computed in log space)
    - ``"geometric"``: the length-normalised ratio, ``mean_{j: mask=1}(logp_new - logp_old)``
      (the authors' code; the same as the clipped loss's sequence ratio)
    - ``"off"``: 0 (the factor stays 1)

    A row with an empty mask gives 0 (weight 1).

    Example:
        >>> new, old = torch.tensor([[0., -1., 5.]]), torch.tensor([[-1., -1., 0.]])
        >>> m = torch.tensor([[1, 1, 0]])
        >>> factor_log_ratio(new, old, m, "full"), factor_log_ratio(new, old, m, "geometric")
        (tensor([1.]), tensor([0.5000]))
    """
    if kind == "full":
        return masked_sum(logp_new_NL - logp_old_NL, mask_NL, dim=-1)
    if kind == "geometric":
        return sequence_log_ratio(logp_new_NL, logp_old_NL, mask_NL)
    if kind == "off":
        return torch.zeros(logp_new_NL.shape[0], dtype=logp_new_NL.dtype, device=logp_new_NL.device)
    raise ValueError(f"unknown factor ratio {kind!r}; valid names: {', '.join(FACTOR_RATIOS)}")


def update_factor(
    factor_E: torch.Tensor,
    episode_index_R: torch.Tensor,
    seq_log_ratio_R: torch.Tensor,
    *,
    clip: tuple[float, float] | None = None,
) -> torch.Tensor:
    """SeeUPO's running factor after one turn's update.

    For each row ``r`` (at most one row per episode):
    ``M'[e_r] = M[e_r] * exp(seq_log_ratio_r)``, with ``seq_log_ratio_r`` the log of the row's turn
    weight (``factor_log_ratio``); with ``clip=(lo, hi)`` the ratio is clamped to
    ``[lo, hi]`` before multiplying and the product after. Episodes without a row keep their
    factor. The result does not depend on the order of the rows. Returns a new tensor.

    Args:
        factor_E: ``[E]`` current factor per episode (keyed by episode id).
        episode_index_R: ``[R]`` episode id of each row (unique).
        seq_log_ratio_R: ``[R]`` log turn weight of each row under the updated policy.

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
