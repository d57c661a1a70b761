import doctest

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import seeupo.core.schedule as sched_mod
from seeupo.core.schedule import turn_order, update_factor


def test_docstring_examples():
    assert doctest.testmod(sched_mod).failed == 0


def test_turn_order_hand_cases():
    assert turn_order([1, 2, 3], "reverse") == [[3], [2], [1]]
    assert turn_order([3, 1, 2], "natural") == [[1], [2], [3]]
    assert turn_order([2, 0], "joint") == [[0, 2]]
    assert turn_order([0, 1, 2, 3, 4], "window:2") == [[4], [3], [0, 1, 2]]
    assert turn_order([0, 1], "window:5") == [[1], [0]]
    assert turn_order([0, 1, 2], [1, 0, 2]) == [[1], [0], [2]]
    assert turn_order([], "reverse") == []


@settings(max_examples=30, deadline=None)
@given(st.sets(st.integers(0, 20), min_size=1, max_size=8), st.integers(0, 1000))
def test_random_order_is_a_reproducible_permutation(turns, seed):
    a = turn_order(turns, "random", rng=torch.Generator().manual_seed(seed))
    b = turn_order(turns, "random", rng=seed)
    assert a == b
    assert all(len(p) == 1 for p in a) and sorted(p[0] for p in a) == sorted(turns)


def test_turn_order_bad_input():
    with pytest.raises(ValueError, match="permutation"):
        turn_order([0, 1, 2], [0, 1])
    with pytest.raises(ValueError, match="window"):
        turn_order([0, 1], "window:0")
    with pytest.raises(ValueError, match="unknown turn order"):
        turn_order([0, 1], "backwards")
    with pytest.raises(ValueError, match="unique"):
        turn_order([0, 0, 1], "reverse")


def update_factor_loop(factor, idx, slr, clip):
    out = factor.clone()
    for e, s in zip(idx.tolist(), slr.tolist()):
        ratio = torch.exp(torch.tensor(s, dtype=factor.dtype))
        if clip:
            ratio = ratio.clamp(*clip)
        p = factor[e] * ratio
        out[e] = p.clamp(*clip) if clip else p
    return out


def test_update_factor_hand_and_clip():
    f = torch.tensor([1.0, 1.1, 0.9], dtype=torch.float64)
    got = update_factor(f, torch.tensor([0, 1]), torch.log(torch.tensor([2.0, 0.5], dtype=torch.float64)),
                        clip=(0.8, 1.2))
    # row 0: ratio 2 -> 1.2, product 1.2 -> 1.2 ; row 1: ratio .5 -> .8, product .88 ; ep 2 unchanged
    assert torch.allclose(got, torch.tensor([1.2, 0.88, 0.9], dtype=torch.float64))
    assert torch.equal(f, torch.tensor([1.0, 1.1, 0.9], dtype=torch.float64))  # not modified in place


@settings(max_examples=40, deadline=None)
@given(e=st.integers(1, 10), seed=st.integers(0, 999), clip=st.booleans())
def test_update_factor_matches_loop_and_ignores_row_order(e, seed, clip):
    g = torch.Generator().manual_seed(seed)
    f = torch.rand(e, generator=g, dtype=torch.float64) + 0.5
    n_rows = int(torch.randint(0, e + 1, (), generator=g))
    idx = torch.randperm(e, generator=g)[:n_rows]
    slr = torch.randn(n_rows, generator=g, dtype=torch.float64) * 0.3
    c = (0.8, 1.2) if clip else None
    got = update_factor(f, idx, slr, clip=c)
    assert torch.allclose(got, update_factor_loop(f, idx, slr, c))
    perm = torch.randperm(n_rows, generator=g)
    assert torch.equal(update_factor(f, idx[perm], slr[perm], clip=c), got)


def test_update_factor_identity_zero_log_ratio():
    f = torch.rand(5, dtype=torch.float64)
    assert torch.equal(update_factor(f, torch.arange(5), torch.zeros(5, dtype=torch.float64)), f)


def test_update_factor_bad_input():
    with pytest.raises(ValueError, match="more than one row"):
        update_factor(torch.ones(3), torch.tensor([1, 1]), torch.zeros(2))
    with pytest.raises(ValueError, match="out of range"):
        update_factor(torch.ones(3), torch.tensor([3]), torch.zeros(1))
