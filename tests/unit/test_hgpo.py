"""HGPO (issue 59) against a plain-Python loop written from the authors' description of their code
(verl-agent recipe/hgpo/core_hgpo.py: history-suffix groups at levels 1..K+1, singleton groups
skipped, population std, zero advantages dropped, weights (k+1)^alpha normalised with eps), and
against three cases the authors' own function was run on (its printed values)."""

import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seeupo.core.advantages import hgpo
from seeupo.core.estimators import Turns, estimate

EPS = 1e-6


def loop_hgpo(groups, rewards, anchors, lengths, *, K, alpha, gamma, mode, base_group=False):
    n = len(groups)
    ret = []
    for i in range(n):
        run, r_i = 0.0, [0.0] * lengths[i]
        for t in reversed(range(lengths[i])):
            run = rewards[i][t] + gamma * run
            r_i[t] = run
        ret.append(r_i)
    items = {(i, t): [] for i in range(n) for t in range(lengths[i])}
    clusters = {}
    for i in range(n):
        for t in range(lengths[i]):
            for k in range(1, min(K + 1, t + 1) + 1):
                key = (groups[i], k, tuple(anchors[i][t - k + 1: t + 1]))
                clusters.setdefault(key, []).append((i, t))
    for (_, k, _), members in clusters.items():
        if len(members) <= 1:
            continue
        vals = [ret[i][t] for i, t in members]
        mean = sum(vals) / len(vals)
        std = statistics.pstdev(vals)
        for (i, t), v in zip(members, vals):
            items[(i, t)].append((k, (v - mean) / (std + EPS) if mode == "group" else v - mean))
    if base_group:
        for g in set(groups):
            rows = [sum(rewards[i][: lengths[i]]) for i in range(n) if groups[i] == g for _ in range(lengths[i])]
            mean, std = (sum(rows) / len(rows), statistics.stdev(rows)) if len(rows) > 1 else (0.0, 1.0)
            for i in range(n):
                if groups[i] == g:
                    b = sum(rewards[i][: lengths[i]]) - mean
                    b = b / (std + EPS) if mode == "group" else b
                    for t in range(lengths[i]):
                        items[(i, t)].append((0, b))
    out = [[0.0] * max(lengths) for _ in range(n)]
    for (i, t), its in items.items():
        its = [(k, a) for k, a in its if a != 0]
        if not its:
            continue
        w = [(k + 1) ** alpha for k, _ in its]
        s = sum(w)
        out[i][t] = sum(wk / (s + EPS) * a for wk, (_, a) in zip(w, its))
    return out


def _tensors(groups, rewards, anchors, lengths):
    T = max(lengths)
    mask = torch.tensor([[1 if t < n else 0 for t in range(T)] for n in lengths])
    r = torch.tensor([[rewards[i][t] if t < lengths[i] else 0.0 for t in range(T)] for i in range(len(groups))],
                     dtype=torch.float64)
    a = torch.tensor([[anchors[i][t] if t < lengths[i] else 0 for t in range(T)] for i in range(len(groups))])
    return torch.tensor(groups), r, a, mask


cases = st.tuples(st.integers(2, 8), st.integers(1, 5), st.integers(0, 3), st.floats(0.0, 2.0), st.sampled_from([1.0, 0.95, 0.5]),
                  st.sampled_from(["none", "group"]), st.booleans(), st.integers(0, 10**6))


@given(cases)
@settings(max_examples=150, deadline=None)
def test_hgpo_matches_the_loop(case):
    n, T, K, alpha, gamma, mode, base, seed = case
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (n,), generator=g).tolist()
    groups = torch.randint(0, max(1, n // 3), (n,), generator=g).tolist()
    anchors = torch.randint(0, 3, (n, T), generator=g).tolist()  # three states: groups at every level
    rewards = (torch.randint(0, 3, (n, T), generator=g) * (torch.rand(n, T, generator=g) < 0.4)).double().tolist()
    want = loop_hgpo(groups, rewards, anchors, lengths, K=K, alpha=alpha, gamma=gamma, mode=mode, base_group=base)
    gr, r, a, mask = _tensors(groups, rewards, anchors, lengths)
    got = hgpo(gr, r, a, mask, history=K, alpha=alpha, gamma=gamma, norm=mode, base_group=base,
               episode_rewards_N=r.sum(-1))
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0), (got, want)


# the authors' function on three hand cases (states s0, s1, s2 as anchors 0, 1, 2; one task group;
# eps 1e-6, alpha 1); its printed values, 6 digits
AUTHORS = [
    dict(rewards=[[0, 0, 10], [0, 0, 0], [0, 0, 0]], anchors=[[0, 1, 2], [0, 2, 1], [0, 1, 2]], lengths=[3, 3, 3],
         K=1, gamma=1.0, mode="group",
         want=[[1.414213, 1.165685, 1.165685], [-0.707106, -0.707106, -0.707106], [-0.707106, -0.882842, -0.882842]]),
    dict(rewards=[[0, 0, 1], [0, 0, 0], [0, 0, 1], [0, 1, 0]], anchors=[[0, 1, 2], [0, 1, 2], [0, 2, 2], [0, 2, 0]],
         lengths=[3, 3, 3, 2], K=2, gamma=1.0, mode="none",
         want=[[0.25, 0.5, 0.433333], [-0.75, -0.5, -0.566667], [0.25, 0.2, 0.2], [0.25, 0.2, 0.0]]),
    dict(rewards=[[0, 1, 0], [0, 0, 1], [0, 0, 0]], anchors=[[0, 1, 0], [0, 1, 1], [0, 2, 0]], lengths=[2, 3, 2],
         K=1, gamma=0.5, mode="group",
         want=[[1.224738, 0.882839, 0.0], [0.0, -1.165680, 0.707103], [-1.224738, 0.0, 0.0]]),
]


@pytest.mark.parametrize("case", AUTHORS, ids=["mean_std_norm-K1", "mean_norm-K2", "discounted"])
def test_hgpo_gives_the_authors_values(case):
    gr, r, a, mask = _tensors([0] * len(case["lengths"]), case["rewards"], case["anchors"], case["lengths"])
    got = hgpo(gr, r, a, mask, history=case["K"], gamma=case["gamma"], norm=case["mode"])
    assert torch.allclose(got, torch.tensor(case["want"], dtype=torch.float64), atol=2e-6)


def test_hgpo_base_group_matches_the_authors():
    """The second case with base_group (their option, off in their scripts): A0 = (0.27273 + 2 * 0.25) / 3."""
    c = AUTHORS[1]
    gr, r, a, mask = _tensors([0] * 4, c["rewards"], c["anchors"], c["lengths"])
    got = hgpo(gr, r, a, mask, history=2, gamma=1.0, norm="none", base_group=True, episode_rewards_N=r.sum(-1))
    assert float(got[0, 0]) == pytest.approx((1 - 8 / 11 + 2 * 0.25) / 3, abs=1e-6)


def test_hgpo_through_the_registry_and_for_seeupo():
    c = AUTHORS[0]
    gr, r, a, mask = _tensors([0, 0, 0], c["rewards"], c["anchors"], c["lengths"])
    t = Turns(r.sum(-1), gr, r, mask, a)
    assert torch.allclose(estimate("hgpo", t, norm="group", params={"history": 1, "gamma": 1.0}),
                          torch.tensor(c["want"], dtype=torch.float64), atol=2e-6)
    raw = estimate("hgpo", t, norm="none")
    b = estimate("hgpo", t, norm="batch")  # SeeUPO's: standardised over the reached turns
    assert torch.allclose(b, (raw - raw.mean()) / (raw.flatten().std() + 1e-6))
    with pytest.raises(ValueError, match="history"):
        estimate("hgpo", t, norm="none", params={"history": 1.5})
