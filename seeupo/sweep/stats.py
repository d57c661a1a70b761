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
- ``detectable``: the t approximation of the smallest difference a single test at 5% detects with
  80% power; optimistic (it ignores Holm, the exact test's discreteness and zero differences), so
  the report no longer prints it: a primary's detectable difference is ``simulated_detectable``.
- Primary contrasts (issue 58, below): ``primary_verdicts`` (the exact test and TOST at the margin,
  Holm across the primaries, test-inverted intervals), ``simulate_family`` and ``plan_seeds`` (power
  simulated exactly on the metric's grid, ``grid_sign_flip_p``) and ``simulated_detectable``.
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


# ---------------------------------------------------------------------------------------------------
# Verdicts for declared primary contrasts (issue 58): the exact sign-flip test in both directions and
# at a margin (TOST), Holm across the primaries alone, intervals obtained by inverting the same test,
# and the power of the whole family simulated for planning.

VERDICTS = ("higher", "lower", "equivalent", "inconclusive")


def _signed_sums(x) -> tuple[int, "numpy.ndarray"]:  # noqa: F821 (numpy is imported where it is used)
    """The distribution of ``sum_i s_i x_i`` over all ``2^n`` sign vectors ``s`` for integer ``x``:
    ``(R, counts)`` with ``counts[v + R]`` the number of sign vectors whose sum is ``v`` (``R = sum |x|``).
    A dynamic program over the items (exact: the counts are integers below 2^53)."""
    import numpy as np

    a = [abs(int(v)) for v in x]
    r = sum(a)
    c = np.zeros(2 * r + 1)
    c[r] = 1.0
    for v in a:
        if v == 0:
            c = 2 * c
            continue
        new = np.zeros_like(c)
        new[v:] += c[:-v]
        new[:-v] += c[v:]
        c = new
    return r, c


def grid_sign_flip_p(x, alternative: str = "two-sided") -> float:
    """The exact sign-flip p-value of integer values ``x`` (the data in units of a grid): two-sided
    ``P(|S| >= |s|)``, ``greater`` ``P(S >= s)``, ``less`` ``P(S <= s)``, ``S`` the signed sum over all
    sign vectors and ``s = sum(x)``. Equals ``sign_flip_p`` (scipy's enumeration) on grid data; the
    power simulation uses it for speed.

    >>> grid_sign_flip_p([1, 2, 3])  # only +++ and --- reach |6|: 2 of 8
    0.25
    >>> grid_sign_flip_p([1, 2, 3], "greater"), grid_sign_flip_p([0, 0])
    (0.125, 1.0)
    """
    r, c = _signed_sums(x)
    s = int(sum(int(v) for v in x))
    total = c.sum()
    if alternative == "two-sided":
        hit = c[: max(r - abs(s), 0) + 1].sum() + c[r + abs(s):].sum() if s != 0 else total
    elif alternative == "greater":
        hit = c[s + r:].sum()
    elif alternative == "less":
        hit = c[: s + r + 1].sum()
    else:
        raise ValueError(f"alternative must be two-sided, greater or less, got {alternative!r}")
    return float(min(1.0, hit / total))


def one_sided_p(diffs, alternative: str) -> float:
    """Exact one-sided sign-flip p-value of ``mean(diffs) == 0`` against ``greater`` or ``less``
    (``scipy.stats.permutation_test`` over every sign vector; 100,000 seeded draws above
    ``EXACT_MAX_N`` pairs). nan without pairs.

    >>> one_sided_p([0.1, 0.2, 0.3], "greater"), one_sided_p([0.1, 0.2, 0.3], "less")
    (0.125, 1.0)
    >>> one_sided_p([0.1], "greater"), one_sided_p([0.1], "less")  # a sweep's first pair
    (0.5, 1.0)
    """
    import numpy as np
    from scipy.stats import permutation_test

    d = _finite(diffs)
    if not d:
        return float("nan")
    if all(x == 0 for x in d):
        return 1.0
    if len(d) == 1:  # two sign vectors (scipy refuses one observation): the observed one is the larger in its direction
        return 0.5 if (d[0] > 0) == (alternative == "greater") else 1.0
    exact = len(d) <= EXACT_MAX_N
    res = permutation_test((np.asarray(d),), np.mean, permutation_type="samples", vectorized=True,
                           n_resamples=np.inf if exact else 100_000, alternative=alternative,
                           rng=None if exact else np.random.default_rng(0))
    return float(min(1.0, res.pvalue))


def tost_p(diffs, margin: float) -> dict:
    """The two one-sided tests of equivalence within ``+-margin``: ``p_lower`` tests "the mean is at most
    -margin" (the sign-flip test of ``diffs + margin`` against greater), ``p_upper`` "at least +margin"
    (``diffs - margin`` against less); ``p`` the larger of the two. Equivalence is declared where ``p``
    (Holm-adjusted across the primaries) is below 0.05.

    >>> tost_p([0.01, -0.02, 0.0, 0.02, 0.01, -0.01], 0.1)["p"]  # every sign of d + 0.1 is +: 1 of 64
    0.015625
    """
    d = _finite(diffs)
    lo = one_sided_p([x + margin for x in d], "greater")
    hi = one_sided_p([x - margin for x in d], "less")
    return {"p_lower": lo, "p_upper": hi, "p": max(lo, hi)}


def inverted_interval(diffs, level: float) -> list[float]:
    """The set of shifts ``delta`` the exact two-sided sign-flip test does not reject at ``1 - level``
    (``sign_flip_p(diffs - delta) > 1 - level``), as an interval (its hull): the interval that agrees
    with the test by construction. ``[-inf, inf]`` where the test cannot reject at that level at this
    n (``min_p(n) > 1 - level``); [nan, nan] without two pairs. Found by bisection on each side of
    the mean (the p-value falls as delta moves away from it; within 1e-4 of the metric's units).

    >>> lo, hi = inverted_interval([0.1, 0.2, 0.3, 0.25, 0.15, 0.2, 0.3, 0.1], 0.95)
    >>> 0.1 < lo < 0.2 < hi < 0.3
    True
    """
    d = _finite(diffs)
    n = len(d)
    if n < 2:
        return [float("nan"), float("nan")]
    a = 1 - level
    if min_p(n) > a:
        return [float("-inf"), float("inf")]
    m = mean(d)
    span = max(abs(x - m) for x in d) + 1e-9
    def keeps(delta):
        return sign_flip_p([x - delta for x in d]) > a

    # beyond every value all signs agree: p = min_p(n) <= a, so m + span is rejected, m itself is not
    return [_bisect(m, m - span, keeps, steps=40, tol=1e-4), _bisect(m, m + span, keeps, steps=40, tol=1e-4)]


def _bisect(good: float, bad: float, ok, *, steps: int, tol: float = 0.0) -> float:
    """The boundary between ``good`` (where ``ok`` holds) and ``bad`` (where it fails), halving the gap
    ``steps`` times or until it is within ``tol``; returns the last point where ``ok`` held."""
    for _ in range(steps):
        if abs(bad - good) <= tol:
            break
        mid = (good + bad) / 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def primary_verdicts(diffs_by_name: dict, margin: float, alpha: float = ALPHA) -> dict:
    """Each declared primary contrast's verdict: the exact two-sided sign-flip ``p`` and, across the
    primaries alone, Holm's ``p_holm``; TOST at ``margin`` (``tost_p``) with its Holm-adjusted
    ``tost_p_holm``; ``verdict`` "higher" / "lower" where ``p_holm < alpha`` (with ``within_margin``
    where TOST also holds), else "equivalent" where ``tost_p_holm < alpha``, else "inconclusive".
    ``ci`` is the sign-flip test inverted at the level Holm used for the contrast: ``1 - alpha / (m -
    k)`` for the k-th smallest p when Holm rejected it, ``1 - alpha / m`` otherwise, so the interval
    excludes 0 exactly where the verdict is higher or lower.

    >>> v = primary_verdicts({"a": [0.2] * 8, "b": [0.01, -0.01] * 4}, margin=0.1)
    >>> v["a"]["verdict"], v["b"]["verdict"]
    ('higher', 'equivalent')
    """
    names = list(diffs_by_name)
    m = len(names)
    out = {}
    for name in names:
        d = _finite(diffs_by_name[name])
        t = tost_p(d, margin) if d else {"p": 1.0, "p_lower": 1.0, "p_upper": 1.0}
        # a declared primary with no pair yet still counts in the family's m (p = 1), never dropped
        out[name] = {"diff": mean(d), "pairs": len(d), "p": sign_flip_p(d) if d else 1.0, "tost_p": t["p"],
                     "tost_p_lower": t["p_lower"], "tost_p_upper": t["p_upper"]}
    for name, ph in zip(names, holm([out[n]["p"] for n in names])):
        out[name]["p_holm"] = ph
    for name, ph in zip(names, holm([out[n]["tost_p"] for n in names])):
        out[name]["tost_p_holm"] = ph
    ranked = sorted((n for n in names if out[n]["p"] == out[n]["p"]), key=lambda n: out[n]["p"])
    for k, name in enumerate(ranked):
        c = out[name]
        differs = c["p_holm"] < alpha
        equivalent = c["tost_p_holm"] == c["tost_p_holm"] and c["tost_p_holm"] < alpha
        c["verdict"] = (("higher" if c["diff"] > 0 else "lower") if differs else
                        "equivalent" if equivalent else "inconclusive")
        if differs:
            c["within_margin"] = bool(equivalent)
        c["ci_level"] = 1 - alpha / (m - k) if differs else 1 - alpha / m
        c["ci"] = inverted_interval(diffs_by_name[name], c["ci_level"])
    for name in names:
        out[name].setdefault("verdict", "inconclusive")
    return out


def simulate_family(sds, shifts, n: int, margin: float, *, granularity: float | None = None, draws: int = 500,
                    seed: int = 0, alpha: float = ALPHA, tost: bool = True) -> dict:
    """The power of a family of primaries at ``n`` paired seeds, simulated: each draw takes every
    primary's ``n`` differences from a normal with mean ``shifts[j]`` and sd ``sds[j]`` (independent
    across primaries), rounded to the metric's ``granularity`` (a difference of two avg@k scores on G
    tasks x k samples moves in steps of 1 / (G k); None: continuous), and applies what the report
    applies: the exact two-sided sign-flip test with Holm across the family, and TOST at ``margin``
    with Holm across the family. Returns per primary ``detect`` (the share of draws declaring the
    difference, in the direction of its shift; for a shift of 0, either direction: the error rate) and
    ``equivalent`` (the share declaring equivalence within the margin; all 0 with ``tost=False``, which
    skips those tests).

    >>> r = simulate_family([0.1], [0.0], 6, 0.1, draws=200)
    >>> r["detect"][0] < 0.1
    True
    """
    import numpy as np

    m = len(sds)
    unit = (granularity / 5) if granularity else margin / 100
    mu = round(margin / unit)
    rng = np.random.default_rng(seed)
    detect, equiv = np.zeros(m), np.zeros(m)
    for _ in range(draws):
        x = rng.normal(np.asarray(shifts, dtype=float)[:, None], np.asarray(sds, dtype=float)[:, None], (m, n))
        if granularity:
            x = np.round(x / granularity) * granularity
        xi = np.round(x / unit).astype(np.int64)
        p = [grid_sign_flip_p(xi[j]) for j in range(m)]
        tp = ([max(grid_sign_flip_p(xi[j] + mu, "greater"), grid_sign_flip_p(xi[j] - mu, "less")) for j in range(m)]
              if tost else [1.0] * m)
        ph, th = holm(p), holm(tp)
        for j in range(m):
            s = float(x[j].mean())
            right = shifts[j] == 0 or (s > 0) == (shifts[j] > 0)
            detect[j] += ph[j] < alpha and right
            equiv[j] += th[j] < alpha
    return {"n": n, "detect": (detect / draws).tolist(), "equivalent": (equiv / draws).tolist()}


def plan_seeds(sds, margin: float, *, granularity: float | None = None, power: float = POWER, cap: int = 20,
               draws: int = 500, seed: int = 0, alpha: float = ALPHA, which=None, equivalence: bool = True) -> list[dict]:
    """Seeds needed per primary (``simulate_family``): ``detect``, the smallest n at which the primary,
    shifted by ``margin`` while the others are 0, is declared with ``power``; ``equivalent``, the
    smallest n at which equivalence is declared with ``power`` when every primary is truly 0. n is
    searched up to ``cap`` (None where even ``cap`` is short of ``power``); each entry also gives the
    power reached at ``cap``. ``which``: the primaries to plan (default all; a family of equal spreads
    needs one); ``equivalence=False`` plans detection only (faster: no TOST)."""
    m = len(sds)
    cache: dict = {}

    def sim(n: int, shifted: int | None):
        key = (n, shifted)
        if key not in cache:
            shifts = [margin if j == shifted else 0.0 for j in range(m)]
            cache[key] = simulate_family(sds, shifts, n, margin, granularity=granularity, draws=draws, seed=seed,
                                         alpha=alpha, tost=equivalence)
        return cache[key]

    def smallest(ok) -> int | None:
        lo = 2
        while lo <= cap and min_p(lo) * m >= alpha:  # no outcome can be declared below this n
            lo += 1
        if lo > cap or not ok(cap):
            return None
        hi = cap
        while lo < hi:  # power rises with n (up to simulation noise): bisection
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    out = []
    for j in (range(m) if which is None else which):
        row = {"detect": smallest(lambda n: sim(n, j)["detect"][j] >= power), "detect_power_at_cap": sim(cap, j)["detect"][j]}
        if equivalence:
            row.update(equivalent=smallest(lambda n: sim(n, None)["equivalent"][j] >= power),
                       equivalent_power_at_cap=sim(cap, None)["equivalent"][j])
        out.append(row)
    return out


def simulated_detectable(sd_: float, n: int, m: int, *, power: float = POWER, draws: int = 400,
                         alpha: float = ALPHA) -> float | None:
    """The smallest true mean difference that one of ``m`` primaries at ``n`` seeds, with paired sd
    ``sd_``, is declared with ``power`` (exact test, Holm across the m, the others at 0), by
    bisection on ``simulate_family``; None where no outcome can be declared at this n and m
    (``min_p(n) * m >= alpha``) or the spread is unknown."""
    if n < 2 or min_p(n) * m >= alpha or not sd_ == sd_ or sd_ <= 0:
        return None
    sds = [sd_] * m
    def ok(eff):
        return simulate_family(sds, [eff] + [0.0] * (m - 1), n, sd_, draws=draws)["detect"][0] >= power
    lo, hi = 0.0, sd_
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > 64 * sd_:
            return None
    return _bisect(hi, lo, ok, steps=12)
