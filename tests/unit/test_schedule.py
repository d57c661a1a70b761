import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seeupo.core.algorithms import ALGORITHMS, Schedule, carries_factor
from seeupo.core.schedule import factor_log_ratio, turn_order, update_factor


def test_turn_order_hand_cases():
    assert turn_order([1, 2, 3], "reverse") == [[3], [2], [1]]
    assert turn_order([3, 1, 2], "natural") == [[1], [2], [3]]
    assert turn_order([2, 0], "joint") == [[0, 2]]
    assert turn_order([0, 1, 2, 3, 4], "window:2") == [[4], [3], [0, 1, 2]]
    assert turn_order([0, 1], "window:5") == [[1], [0]]
    assert turn_order([0, 1, 2], [1, 0, 2]) == [[1], [0], [2]]
    assert turn_order([0, 2], [2, 1, 0]) == [[2], [0]]  # listed but absent: skipped
    assert turn_order([], "reverse") == []


def test_named_orders_speak_of_time_in_either_alignment():
    # from_end: index 0 is each episode's last turn, the latest decision stage
    assert turn_order([0, 1, 2], "reverse", alignment="from_end") == [[0], [1], [2]]
    assert turn_order([0, 1, 2], "natural", alignment="from_end") == [[2], [1], [0]]
    assert turn_order([0, 1, 2, 3], "window:2", alignment="from_end") == [[0], [1], [2, 3]]
    assert turn_order([0, 1, 2], "joint", alignment="from_end") == [[0, 1, 2]]
    assert turn_order([0, 1, 2], [1, 2, 0], alignment="from_end") == [[1], [2], [0]]  # lists name indices
    with pytest.raises(ValueError, match="alignment"):
        turn_order([0, 1], "reverse", alignment="backwards")


@settings(max_examples=30, deadline=None)
@given(st.sets(st.integers(0, 20), min_size=1, max_size=8), st.integers(0, 1000))
def test_random_order_is_a_reproducible_permutation(turns, seed):
    a = turn_order(turns, "random", rng=torch.Generator().manual_seed(seed))
    b = turn_order(turns, "random", rng=seed)
    assert a == b
    assert all(len(p) == 1 for p in a) and sorted(p[0] for p in a) == sorted(turns)


def test_turn_order_bad_input():
    with pytest.raises(ValueError, match=r"does not list the turn indices \[2\]"):
        turn_order([0, 1, 2], [0, 1])
    with pytest.raises(ValueError, match="once"):
        turn_order([0, 1], [0, 1, 1])
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


def factor_log_ratio_loop(new, old, mask, kind):
    out = []
    for r in range(new.shape[0]):
        d = [float(new[r, j] - old[r, j]) for j in range(new.shape[1]) if mask[r, j]]
        if kind == "full":
            out.append(sum(d))
        elif kind == "geometric":
            out.append(sum(d) / len(d) if d else 0.0)
        else:
            out.append(0.0)
    return torch.tensor(out, dtype=torch.float64)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 999), kind=st.sampled_from(["full", "geometric", "off"]))
def test_factor_log_ratio_matches_a_loop(seed, kind):
    g = torch.Generator().manual_seed(seed)
    new, old = torch.randn(4, 6, generator=g, dtype=torch.float64), torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(4, 6, generator=g) < 0.6).long()
    mask[0] = 0  # an empty row: weight 1
    got = factor_log_ratio(new, old, mask, kind)
    assert torch.allclose(got, factor_log_ratio_loop(new, old, mask, kind))
    assert got[0] == 0


def test_full_weight_is_the_product_of_token_ratios_and_geometric_its_mean_root():
    new = torch.log(torch.tensor([[0.5, 0.2, 0.9]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.25, 0.4, 0.9]], dtype=torch.float64))
    full = math.exp(float(factor_log_ratio(new, old, torch.ones(1, 3), "full")))
    geo = math.exp(float(factor_log_ratio(new, old, torch.ones(1, 3), "geometric")))
    assert full == pytest.approx(2.0 * 0.5 * 1.0) and geo == pytest.approx(full ** (1 / 3))
    with pytest.raises(ValueError, match="full, geometric, off"):
        factor_log_ratio(new, old, torch.ones(1, 3), "arithmetic")


def test_schedules_declared_and_counted():
    assert Schedule(epochs=2, minibatches=3).optimizer_steps(n_turns=5, phases=4) == 24
    assert Schedule(minibatches="turns").steps_per_pass(n_turns=4) == 4
    gspo = ALGORITHMS["gspo"].schedule
    assert gspo.clip_eps <= 1e-3 and gspo.clip_eps_high <= 1e-3  # GSPO's own sequence-level range
    assert ALGORITHMS["reinforce"].schedule.optimizer_steps(n_turns=3, phases=1) == 1
    with pytest.raises(ValueError, match="minibatches"):
        Schedule(minibatches="some")
    with pytest.raises(ValueError, match="epochs"):
        Schedule(epochs=0)
    assert [n for n, a in ALGORITHMS.items() if carries_factor(a)] == ["seeupo", "seeupo-natural", "seeupo-random"]
    assert not carries_factor(ALGORITHMS["seeupo"], "off")
