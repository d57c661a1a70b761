"""The collapse detector: when a run has stopped learning for good.

A run is counted as collapsed when, over its training iterations (``metrics.jsonl`` lines with
``reward_mean``), any of these holds for ``patience`` consecutive iterations:

- **success collapse**: the training success rate, smoothed over a ``window``-iteration moving
  average, falls below ``drop`` times its running best (the best smoothed value so far, once that
  best is at least ``min_best``), *and stays there to the end of the run*;
- **entropy floor**: the policy's token entropy below ``entropy_floor`` (a near-deterministic
  policy no longer explores);
- **format collapse**: the tool-call error rate above one half (the call format is breaking down).

The first reason found (with the iteration it starts) is returned; ``None`` when the run is healthy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CollapseRule:
    window: int = 3
    drop: float = 0.5
    min_best: float = 0.2
    patience: int = 5
    entropy_floor: float = 0.02
    error_rate: float = 0.5


def _smooth(xs: list[float], w: int) -> list[float]:
    out = []
    for i in range(len(xs)):
        seg = xs[max(0, i - w + 1): i + 1]
        out.append(sum(seg) / len(seg))
    return out


def _run_of(flags: list[bool], patience: int) -> int | None:
    """Index where the first run of ``patience`` consecutive True values starts."""
    n = 0
    for i, f in enumerate(flags):
        n = n + 1 if f else 0
        if n >= patience:
            return i - patience + 1
    return None


def detect_collapse(records: list[dict], rule: CollapseRule = CollapseRule()) -> dict | None:
    """``{"reason": ..., "iteration": ...}`` for the first collapse in ``records`` (training lines of
    one run, in order), or None.

    >>> healthy = [{"iteration": i, "reward_mean": 0, "success_rate": min(1, i / 10)} for i in range(20)]
    >>> detect_collapse(healthy) is None
    True
    >>> fall = healthy[:10] + [{"iteration": i, "reward_mean": 0, "success_rate": 0.0} for i in range(10, 20)]
    >>> detect_collapse(fall)["reason"]
    'success'
    """
    train = [r for r in records if "reward_mean" in r]
    if not train:
        return None
    its = [r["iteration"] for r in train]
    success = _smooth([float(r.get("success_rate") or 0.0) for r in train], rule.window)
    best, below = 0.0, []
    for s in success:
        below.append(best >= rule.min_best and s < rule.drop * best)
        best = max(best, s)
    trail = next((k for k, b in enumerate(reversed(below)) if not b), len(below))  # below to the end
    if trail >= rule.patience:
        return {"reason": "success", "iteration": its[len(below) - trail]}
    entropy = [r.get("entropy") for r in train]
    start = _run_of([e is not None and e < rule.entropy_floor for e in entropy], rule.patience)
    if start is not None:
        return {"reason": "entropy", "iteration": its[start]}
    errors = [r.get("tool/error_rate") for r in train]
    start = _run_of([e is not None and e > rule.error_rate for e in errors], rule.patience)
    if start is not None:
        return {"reason": "format", "iteration": its[start]}
    return None


def drawdown(records: list[dict], window: int = CollapseRule.window) -> float | None:
    """The largest fall of a run's smoothed training success below its running best: over its training
    lines, ``max_t (max_{s <= t} m_s - m_t)`` with ``m`` the ``window``-iteration trailing mean of
    ``success_rate`` (the collapse detector's smoothing; over the first ``window - 1`` lines the mean of
    the lines so far). 0 for a run whose smoothed success never falls: how far a run is from
    monotonic improvement, where the detector only says yes or no. None without training lines.

    >>> drawdown([{"reward_mean": 0, "success_rate": s} for s in (0.2, 0.5, 0.5, 0.5, 0.1, 0.1, 0.1)], window=1)
    0.4
    """
    success = [float(r.get("success_rate") or 0.0) for r in records if "reward_mean" in r]
    if not success:
        return None
    best, worst = float("-inf"), 0.0
    for s in _smooth(success, window):
        best = max(best, s)
        worst = max(worst, best - s)
    return worst
