"""The statistics of a sweep's seeds (issue 32): intervals that keep their coverage at 3-8 seeds, an
exact test for a paired difference, Holm's correction across an experiment's contrasts, and the
smallest difference an experiment could have detected.

- ``t_interval``: Student's t interval of a mean, from ``scipy.stats.t``. Chosen by the coverage
  simulation in ``scripts/coverage.py`` (tested in ``tests/unit/test_stats.py``, table in
  docs/experiments.md, "Statistics"): on normal data it covers the mean 95% of the time at any n,
  where the percentile bootstrap covers about 76% at n = 3 and 88% at n = 8, and BCa does no better.
- ``sign_flip_p``: the exact two-sided paired sign-flip (permutation) test of ``scipy.stats.
  permutation_test``: under "no difference" each seed's difference is as likely to have either sign,
  so the p-value is the share of the ``2^n`` sign assignments whose mean is at least as far from 0 as
  the one observed. It assumes nothing about the differences' distribution beyond symmetry under the
  null, but at n seeds it can reach no p-value below ``2 / 2^n`` (``min_p``): 0.25 at n = 3, 0.0625
  at n = 5, 0.0078 at n = 8.
- ``holm``: Holm's step-down adjustment of an experiment's p-values (strong control of the
  family-wise error rate at any dependence between the contrasts).
- ``detectable``: the smallest true mean difference the experiment would detect with 80% power at
  the 5% level, from the paired differences' spread at its n (a t approximation); None where the exact
  test cannot reach 0.05 at that n at all. "Not detected" then reads as "none larger than this was
  likely to be missed".
"""

from __future__ import annotations

import math
import random

ALPHA = 0.05
POWER = 0.8
N_BOOT = 10_000
EXACT_MAX_N = 20  # sign flips enumerated exactly up to 2^20 assignments; above, 100,000 seeded draws


def _finite(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and x == x]


def mean(xs) -> float:
    xs = _finite(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def sd(xs) -> float:
    """The sample standard deviation (n - 1 in the denominator); nan below two values."""
    xs = _finite(xs)
    if len(xs) < 2:
        return float("nan")
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def t_interval(xs, level: float = 0.95) -> list[float]:
    """Student's t interval of the mean of ``xs``: ``mean +- t_{(1+level)/2, n-1} * sd / sqrt(n)``.
    Below two values there is no interval: [nan, nan].

    >>> [round(v, 4) for v in t_interval([1.0, 2.0, 3.0])]  # t_{0.975, 2} = 4.3027
    [-0.4841, 4.4841]
    >>> t_interval([0.5, 0.5, 0.5])
    [0.5, 0.5]
    """
    from scipy.stats import t

    xs = _finite(xs)
    n = len(xs)
    if n < 2:
        return [float("nan"), float("nan")]
    m, s = sum(xs) / n, sd(xs)
    if s == 0:
        return [m, m]
    half = float(t.ppf((1 + level) / 2, n - 1)) * s / math.sqrt(n)
    return [m - half, m + half]


def bootstrap_ci(xs, *, n: int = N_BOOT, seed: int = 0, level: float = 0.95) -> list[float]:
    """Percentile bootstrap CI of the mean of ``xs`` (resampled with replacement ``n`` times, seeded).
    One value: [x, x]; none: [nan, nan]. Kept for the coverage comparison: it undercovers at the
    seed counts of a sweep (``scripts/coverage.py``), so the report uses ``t_interval``.

    >>> bootstrap_ci([1.0, 1.0, 1.0])
    [1.0, 1.0]
    """
    xs = _finite(xs)
    if not xs:
        return [float("nan"), float("nan")]
    rng = random.Random(seed)
    k = len(xs)
    means = sorted(sum(xs[rng.randrange(k)] for _ in range(k)) / k for _ in range(n))
    lo = means[int((1 - level) / 2 * n)]
    hi = means[min(n - 1, int((1 + level) / 2 * n))]
    return [lo, hi]


def min_p(n: int) -> float:
    """The smallest two-sided p-value the exact sign-flip test can give at ``n`` pairs.

    >>> min_p(3), min_p(8)
    (0.25, 0.0078125)
    """
    return 1.0 if n < 1 else min(1.0, 2.0 / 2 ** n)


def sign_flip_p(diffs) -> float:
    """Exact two-sided p-value of the paired sign-flip test of ``mean(diffs) == 0`` (every one of the
    ``2^n`` sign assignments, equally likely under the null; ``scipy.stats.permutation_test``).
    nan without pairs; 1.0 when every difference is 0 or there is one pair (its two signs are equally
    extreme), as while a sweep's first seed of an arm is all there is.

    >>> sign_flip_p([0.1, 0.2, 0.3])  # only all-plus and all-minus reach |mean| 0.2: 2 of 8
    0.25
    >>> sign_flip_p([0.3])
    1.0
    """
    import numpy as np
    from scipy.stats import permutation_test

    d = _finite(diffs)
    if not d:
        return float("nan")
    if len(d) == 1 or all(x == 0 for x in d):
        return 1.0
    exact = len(d) <= EXACT_MAX_N
    res = permutation_test((np.asarray(d),), np.mean, permutation_type="samples", vectorized=True,
                           n_resamples=np.inf if exact else 100_000, alternative="two-sided",
                           rng=None if exact else np.random.default_rng(0))
    return float(min(1.0, res.pvalue))


def holm(ps) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: sorted ascending, the k-th smallest
    (from 0) is multiplied by ``m - k``, made non-decreasing, capped at 1. nan entries stay nan and do
    not count in ``m``.

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    """
    idx = [i for i, p in enumerate(ps) if p is not None and p == p]
    m = len(idx)
    out = [float("nan")] * len(ps)
    running = 0.0
    for k, i in enumerate(sorted(idx, key=lambda i: ps[i])):
        running = max(running, min(1.0, (m - k) * ps[i]))
        out[i] = running
    return [round(p, 12) if p == p else p for p in out]


def detectable(diffs, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest true mean difference a two-sided paired test at level ``alpha`` detects with
    probability ``power`` at this n and spread: ``(t_{1-alpha/2, n-1} + t_{power, n-1}) * sd / sqrt(n)``.
    None where the exact sign-flip test cannot reach ``alpha`` at this n (``min_p(n) > alpha``: five
    seeds or fewer), so no difference of any size could have been declared.

    >>> round(detectable([0.1, 0.3, 0.2, 0.0, 0.4, 0.1, 0.2, 0.3]), 4)
    0.1509
    >>> detectable([0.1, 0.3, 0.2]) is None
    True
    """
    from scipy.stats import t

    d = _finite(diffs)
    n = len(d)
    if n < 2 or min_p(n) > alpha:
        return None
    return float((t.ppf(1 - alpha / 2, n - 1) + t.ppf(power, n - 1)) * sd(d) / math.sqrt(n))


def contrast(diffs) -> dict:
    """A paired difference's summary: mean, t interval, exact p, the detectable difference, pairs."""
    d = _finite(diffs)
    return {"diff": mean(d), "diff_ci95": t_interval(d), "p": sign_flip_p(d), "detectable": detectable(d),
            "pairs": len(d)}


def verdict(c: dict, *, digits: int = 2) -> str:
    """How a sentence may state a contrast with ``p_holm`` set: "differs" only where ``p_holm < 0.05``;
    otherwise "not detected" with how large the difference could be (its interval).

    >>> verdict({"diff": -0.2, "diff_ci95": [-0.3, -0.1], "p_holm": 0.01, "pairs": 8})
    'lower by 0.20 [-0.30, -0.10], p_holm 0.010'
    >>> verdict({"diff": 0.05, "diff_ci95": [-0.1, 0.2], "p_holm": 0.4, "pairs": 8})
    'not detected (+0.05 [-0.10, +0.20], p_holm 0.400)'
    """
    lo, hi = c["diff_ci95"]
    ci = f"[{lo:+.{digits}f}, {hi:+.{digits}f}]"
    if c.get("p_holm") is not None and c["p_holm"] == c["p_holm"] and c["p_holm"] < ALPHA:
        word = "higher" if c["diff"] > 0 else "lower"
        return f"{word} by {abs(c['diff']):.{digits}f} {ci}, p_holm {c['p_holm']:.3f}"
    return f"not detected ({c['diff']:+.{digits}f} {ci}, p_holm {c['p_holm']:.3f})"
