import doctest

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import seeupo.core.advantages as adv_mod
from seeupo.core.advantages import gae, grae


def test_docstring_examples():
    assert doctest.testmod(adv_mod).failed == 0


def grae_loop(rewards, groups, norm, loo, eps=1e-6):
    """Obviously-correct reference: python loops, statistics module semantics."""
    r = [float(x) for x in rewards]
    g = [int(x) for x in groups]
    centred = []
    for i in range(len(r)):
        members = [j for j in range(len(r)) if g[j] == g[i]]
        if len(members) == 1:
            centred.append(0.0)
            continue
        others = [r[j] for j in members if (j != i or not loo)]
        centred.append(r[i] - sum(others) / len(others))
    if norm == "none":
        return centred
    if norm == "group":
        out = []
        for i in range(len(r)):
            members = [r[j] for j in range(len(r)) if g[j] == g[i]]
            if len(members) == 1:
                out.append(0.0)
                continue
            m = sum(members) / len(members)
            std = (sum((x - m) ** 2 for x in members) / (len(members) - 1)) ** 0.5
            out.append(centred[i] / (std + eps))
        return out
    m = sum(centred) / len(centred)
    std = (sum((x - m) ** 2 for x in centred) / (len(centred) - 1)) ** 0.5 if len(centred) > 1 else 0.0
    return [(c - m) / (std + eps) for c in centred]


def test_grae_hand_computed():
    r = torch.tensor([1.0, 0.0, 3.0, 5.0], dtype=torch.float64)
    g = torch.tensor([7, 7, 2, 2])
    assert torch.allclose(grae(r, g, norm="none"), torch.tensor([0.5, -0.5, -1.0, 1.0], dtype=torch.float64))
    # group std (unbiased): group 7 -> std(1,0)=0.7071; group 2 -> std(3,5)=1.4142
    expect = torch.tensor([0.5 / 0.70710678, -0.5 / 0.70710678, -1 / 1.41421356, 1 / 1.41421356],
                          dtype=torch.float64)
    assert torch.allclose(grae(r, g, norm="group", eps=0.0), expect, atol=1e-6)
    # leave-one-out: 1 - 0 = 1, 0 - 1 = -1, 3 - 5 = -2, 5 - 3 = 2
    assert torch.allclose(grae(r, g, norm="none", leave_one_out=True),
                          torch.tensor([1.0, -1.0, -2.0, 2.0], dtype=torch.float64))
    # batch: centred = [.5,-.5,-1,1], mean 0, unbiased std = sqrt(2.5/3)
    b = grae(r, g, norm="batch", eps=0.0)
    assert torch.allclose(b, torch.tensor([0.5, -0.5, -1.0, 1.0], dtype=torch.float64) / (2.5 / 3) ** 0.5)


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.floats(-5, 5, allow_nan=False), st.integers(0, 3)), min_size=1, max_size=12
    ),
    norm=st.sampled_from(["none", "group", "batch"]),
    loo=st.booleans(),
)
def test_grae_matches_loop_reference(data, norm, loo):
    r = torch.tensor([d[0] for d in data], dtype=torch.float64)
    g = torch.tensor([d[1] for d in data])
    got = grae(r, g, norm=norm, leave_one_out=loo)
    ref = torch.tensor(grae_loop(r, g, norm, loo), dtype=torch.float64)
    assert torch.allclose(got, ref, atol=1e-6, rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3, allow_nan=False), st.integers(0, 4)), min_size=1, max_size=15))
def test_rloo_sums_to_zero_per_group(data):
    r = torch.tensor([d[0] for d in data], dtype=torch.float64)
    g = torch.tensor([d[1] for d in data])
    a = grae(r, g, norm="none", leave_one_out=True)
    for gid in g.unique():
        assert abs(a[g == gid].sum().item()) < 1e-9


def test_group_of_one_gets_zero_and_no_nan():
    r = torch.tensor([3.0, 1.0, 2.0])
    g = torch.tensor([0, 1, 1])
    for norm in ("none", "group"):
        a = grae(r, g, norm=norm)
        assert a[0] == 0 and torch.isfinite(a).all()
    assert torch.isfinite(grae(torch.tensor([2.0]), torch.tensor([0]), norm="batch")).all()


def test_grae_batch_identity_constant_shift_and_scale():
    # Batch normalisation is invariant to an affine map of rewards with positive scale.
    r = torch.randn(20, dtype=torch.float64)
    g = torch.arange(20) // 4
    assert torch.allclose(grae(r, g), grae(3 * r + 7, g), atol=1e-6)


def test_grae_weights_equal_repeated_samples():
    # Integer weights = repeated episodes (population statistics).
    r = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 0])
    w = torch.tensor([2.0, 1.0, 1.0], dtype=torch.float64)
    a = grae(r, g, norm="none", weights_N=w)
    assert torch.allclose(a, r - 1.0)
    a = grae(r, g, norm="group", weights_N=w, eps=0.0)
    std = ((2 * 0 + 1 * 1 + 1 * 1) / 4) ** 0.5
    assert torch.allclose(a, (r - 1.0) / std)


def test_grae_bad_input():
    with pytest.raises(ValueError, match="valid names: none, group, batch"):
        grae(torch.zeros(2), torch.zeros(2), norm="std")
    with pytest.raises(ValueError, match="1-D"):
        grae(torch.zeros(2, 2), torch.zeros(2, 2))


def gae_loop(rewards, values, mask, gamma, lam):
    out = []
    for r_row, v_row, m_row in zip(rewards.tolist(), values.tolist(), mask.tolist()):
        acts = [j for j, m in enumerate(m_row) if m]
        adv = [0.0] * len(r_row)
        for k, j in enumerate(acts):
            total, disc = 0.0, 1.0
            for kk in range(k, len(acts)):
                jj = acts[kk]
                v_next = v_row[acts[kk + 1]] if kk + 1 < len(acts) else 0.0
                delta = r_row[jj] + gamma * v_next - v_row[jj]
                total += disc * delta
                disc *= gamma * lam
            adv[j] = total
        out.append(adv)
    return torch.tensor(out, dtype=rewards.dtype)


def test_gae_hand_computed_and_lambda_one_is_monte_carlo():
    r = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[0.2, 0.5, 0.7]], dtype=torch.float64)
    m = torch.ones(1, 3)
    adv, ret = gae(r, v, m, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, 1.0 - v)  # lambda=1: return minus value
    assert torch.allclose(ret, torch.ones(1, 3, dtype=torch.float64))
    adv0, _ = gae(r, v, m, gamma=1.0, lam=0.0)  # lambda=0: one-step TD error
    assert torch.allclose(adv0, torch.tensor([[0.3, 0.2, 0.3]], dtype=torch.float64))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 3), length=st.integers(1, 7), gamma=st.floats(0.5, 1.0), lam=st.floats(0.0, 1.0),
    seed=st.integers(0, 10_000),
)
def test_gae_matches_loop_reference_with_masks(n, length, gamma, lam, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, length, generator=gen) > 0.3).double()
    r = torch.randn(n, length, generator=gen, dtype=torch.float64) * mask
    v = torch.randn(n, length, generator=gen, dtype=torch.float64)
    adv, _ = gae(r, v, mask, gamma=gamma, lam=lam)
    assert torch.allclose(adv, gae_loop(r, v, mask, gamma, lam), atol=1e-9)


def test_gae_observation_tokens_do_not_matter():
    # Inserting masked observation positions between actions leaves action advantages unchanged.
    r = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[0.2, 0.5, 0.7]], dtype=torch.float64)
    a, _ = gae(r, v, torch.ones(1, 3), gamma=0.9, lam=0.8)
    r2 = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    v2 = torch.tensor([[0.2, 9.0, 0.5, -4.0, 0.7]], dtype=torch.float64)
    m2 = torch.tensor([[1, 0, 1, 0, 1]])
    a2, _ = gae(r2, v2, m2, gamma=0.9, lam=0.8)
    assert torch.allclose(a2[:, [0, 2, 4]], a) and (a2[:, [1, 3]] == 0).all()


def test_gae_rejects_reward_on_masked_token():
    with pytest.raises(ValueError, match="masked"):
        gae(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), torch.tensor([[0, 1]]))


def test_gae_by_episode_over_turn_rows_equals_gae_over_the_whole_stream():
    """An episode's stream cut into turn rows (row t: the stream up to the end of turn t, loss on turn
    t's tokens), rows shuffled: GAE over the rows, episode by episode in turn order, gives at each
    action token what GAE over the whole stream gives there (an independent layout of the same steps)."""
    from seeupo.core.advantages import gae, gae_by_episode

    g = torch.Generator().manual_seed(0)
    L = 12
    turn_of = torch.tensor([-1, 0, 0, -1, -1, 1, 1, 1, -1, 2, 2, -1])  # -1: prompt and observation tokens
    streams = []
    for _ in range(2):  # two episodes
        v = torch.randn(L, generator=g)
        r = torch.zeros(L)
        for t in range(3):
            r[int(torch.nonzero(turn_of == t).max())] = float(torch.randn((), generator=g))
        streams.append((r, v))
    whole_r = torch.stack([r for r, _ in streams])
    whole_v = torch.stack([v for _, v in streams])
    mask = (turn_of >= 0).long().expand(2, L)
    adv, ret = gae(whole_r, whole_v, mask, gamma=0.9, lam=0.8)
    rows, ep, tn = [], [], []
    for e, (r, v) in enumerate(streams):
        for t in range(3):
            end = int(torch.nonzero(turn_of == t).max()) + 1
            m = torch.zeros(L, dtype=torch.long)
            m[:end] = (turn_of[:end] == t).long()
            rows.append((r[end - 1], v.clone(), m))
            ep.append(e)
            tn.append(t)
    perm = torch.randperm(len(rows), generator=g)
    R = torch.stack([rows[i][0] for i in perm])
    V = torch.stack([rows[i][1] for i in perm])
    M = torch.stack([rows[i][2] for i in perm])
    a2, r2 = gae_by_episode(R, V, M, torch.tensor(ep)[perm], torch.tensor(tn)[perm], gamma=0.9, lam=0.8)
    for k, i in enumerate(perm.tolist()):
        e, t = ep[i], tn[i]
        pos = turn_of == t
        assert torch.allclose(a2[k][pos], adv[e][pos], atol=1e-6)
        assert torch.allclose(r2[k][pos], ret[e][pos], atol=1e-6)
        assert bool((a2[k][~pos] == 0).all())
