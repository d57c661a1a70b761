"""The collapse detector on constructed metric streams, and the bootstrap CI against the exact
bootstrap distribution (every resample enumerated)."""

import itertools

import pytest

from seeupo.sweep.collapse import CollapseRule, detect_collapse, drawdown
from seeupo.sweep.report import bootstrap_ci


def stream(success, entropy=None, errors=None):
    n = len(success)
    entropy = entropy or [1.0] * n
    errors = errors or [0.0] * n
    return [{"iteration": i, "reward_mean": 0.0, "success_rate": s, "entropy": e, "tool/error_rate": t}
            for i, (s, e, t) in enumerate(zip(success, entropy, errors))]


def test_a_rising_run_is_healthy():
    assert detect_collapse(stream([i / 20 for i in range(20)])) is None


def test_success_that_falls_and_stays_down_is_a_collapse():
    c = detect_collapse(stream([0.6] * 10 + [0.05] * 10))
    assert c["reason"] == "success" and 10 <= c["iteration"] <= 12  # the smoothed curve crosses there


def test_a_dip_that_recovers_is_not_a_collapse():
    assert detect_collapse(stream([0.6] * 8 + [0.05] * 6 + [0.6] * 6)) is None


def test_a_short_fall_at_the_end_is_not_yet_a_collapse():
    assert detect_collapse(stream([0.6] * 16 + [0.0] * 3)) is None  # patience 5


def test_a_low_best_never_collapses():
    assert detect_collapse(stream([0.1] * 5 + [0.0] * 15)) is None  # best below min_best


def test_entropy_floor_and_format_collapse():
    c = detect_collapse(stream([0.5] * 12, entropy=[1.0] * 4 + [0.01] * 8))
    assert c == {"reason": "entropy", "iteration": 4}
    c = detect_collapse(stream([0.5] * 12, errors=[0.1] * 6 + [0.8] * 6))
    assert c == {"reason": "format", "iteration": 6}
    assert detect_collapse(stream([0.5] * 12, errors=[0.8, 0.1] * 6)) is None  # never 5 in a row
    assert detect_collapse(stream([0.5] * 12, errors=[0.1] * 6 + [0.8] * 6), CollapseRule(patience=7)) is None


def test_null_values_do_not_count_as_collapse():
    rs = stream([0.5] * 10)
    for r in rs:
        r["entropy"] = None  # a non-finite value written as null
    assert detect_collapse(rs) is None


def test_bootstrap_ci_hits_the_exact_percentiles():
    """[0, 0.25, 1]: 27 equally likely resamples; the mean is 0 and 1 with probability 1/27 each, so
    the exact 2.5% and 97.5% quantiles are 0 and 1 (at a 90% level they would move inwards)."""
    xs = [0.0, 0.25, 1.0]
    means = sorted(sum(c) / 3 for c in itertools.product(xs, repeat=3))

    def quantile(q):  # the smallest mean whose cumulative probability reaches q
        return next(m for i, m in enumerate(means) if (i + 1) / len(means) >= q)
    assert bootstrap_ci(xs, n=20000) == pytest.approx([quantile(0.025), quantile(0.975)])
    assert bootstrap_ci(xs, n=20000, level=0.9) == pytest.approx([quantile(0.05), quantile(0.95)])


@pytest.mark.parametrize("xs", [[0.0, 0.25, 1.0], [0.1, 0.5, 0.5, 0.9]])
def test_bootstrap_ci_matches_the_exact_bootstrap_distribution(xs):
    k = len(xs)
    means = sorted(sum(c) / k for c in itertools.product(xs, repeat=k))  # every resample, equally likely
    exact = [means[int(0.025 * len(means))], means[min(len(means) - 1, int(0.975 * len(means)))]]
    lo, hi = bootstrap_ci(xs, n=20000)
    step = (max(xs) - min(xs)) / k  # the resample means' grid
    assert abs(lo - exact[0]) <= step and abs(hi - exact[1]) <= step
    assert bootstrap_ci(xs) == bootstrap_ci(xs)  # seeded
    assert bootstrap_ci([0.4]) == [0.4, 0.4]


def test_a_run_ends_in_the_trap_when_its_last_iterations_mostly_guess():
    from seeupo.sweep.report import ended_in_trap

    def rs(guess):
        return [{"reward_mean": 0, "env/guess": g, "env/vault": 1 - g} for g in guess]
    assert ended_in_trap(rs([0.1] * 10 + [0.9] * 5))
    assert not ended_in_trap(rs([0.9] * 10 + [0.2] * 5))
    assert not ended_in_trap([{"reward_mean": 0}] * 5)  # not the trap family


def test_drawdown_is_the_largest_fall_of_the_smoothed_success_below_an_earlier_value():
    """Checked against a brute force over every pair (earlier, later) of the trailing 3-iteration mean."""
    import random

    rng = random.Random(0)
    for _ in range(50):
        xs = [rng.random() for _ in range(rng.randint(1, 30))]
        m = [sum(xs[max(0, i - 2): i + 1]) / len(xs[max(0, i - 2): i + 1]) for i in range(len(xs))]
        want = max([m[i] - m[j] for i in range(len(m)) for j in range(i, len(m))])
        assert drawdown(stream(xs)) == pytest.approx(want)
    assert drawdown(stream([i / 20 for i in range(20)])) == 0.0  # monotone: no fall
    assert drawdown(stream([0.2, 0.8, 0.8, 0.8, 0.2, 0.2, 0.2, 0.9])) == pytest.approx(0.6)
    assert drawdown([{"iteration": 0, "eval": {"avg@k": 0.5}}]) is None  # no training lines
