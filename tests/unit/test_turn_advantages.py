"""Per-turn advantages (issue 34) against plain-Python loop references on random inputs; the hand
computations are the doctests of seeupo/core/advantages.py."""

import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seeupo.core.advantages import gigpo, grae_to_go, reward_to_go, turn_gae, turn_grae
from seeupo.core.estimators import Turns, estimate


def _episodes(draw_n, draw_t, seed):
    g = torch.Generator().manual_seed(seed)
    n, t = draw_n, draw_t
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    groups = torch.randint(0, max(1, n // 2), (n,), generator=g)
    rewards = torch.randint(0, 3, (n, t), generator=g).double() * mask
    anchors = torch.randint(0, 3, (n, t), generator=g)
    return groups, mask, rewards, anchors


def togo_loop(r, m, i, t, gamma):
    return sum(gamma ** (k - t) * float(r[i][k]) for k in range(t, len(r[i])) if m[i][k])


def centred_loop(value, members, norm, eps=1e-6):
    """value's centred (and with norm="group", scaled) advantage within ``members`` (a list of values
    holding it); a set of one gets 0."""
    if len(members) < 2:
        return 0.0
    c = value - sum(members) / len(members)
    return c / (statistics.stdev(members) + eps) if norm == "group" else c


cases = st.tuples(st.integers(1, 7), st.integers(1, 4), st.integers(0, 10_000))


def step_rows_loop(value, rows, norm, eps=1e-6):
    """The authors' code's episode part (verl-agent ``episode_norm_reward``, statistics across all
    rows): ``value`` centred on the mean of ``rows`` (its group's step rows, each holding its
    episode's reward), scaled by their unbiased std + eps with norm="group"; a single row: mean 0,
    std 1."""
    mean, std = (0.0, 1.0) if len(rows) == 1 else (sum(rows) / len(rows), statistics.stdev(rows))
    return (value - mean) / (std + eps) if norm == "group" else value - mean


@settings(max_examples=60, deadline=None)
@given(cases, st.sampled_from(["none", "group"]), st.sampled_from([1.0, 0.95, 0.5]), st.sampled_from([1.0, 0.3]),
       st.sampled_from(["step", "episode"]))
def test_gigpo_matches_a_loop(case, norm, gamma, omega, episode_norm):
    groups, mask, step_r, anchors = _episodes(*case)
    ep_r = step_r.sum(1) + torch.rand(len(groups), generator=torch.Generator().manual_seed(case[2])).double()
    got = gigpo(ep_r, groups, step_r, anchors, mask, omega=omega, gamma=gamma, norm=norm, episode_norm=episode_norm)
    n, t = mask.shape
    g, m, r, a = groups.tolist(), mask.tolist(), step_r.tolist(), anchors.tolist()
    for i in range(n):
        if episode_norm == "episode":
            a_e = centred_loop(float(ep_r[i]), [float(ep_r[j]) for j in range(n) if g[j] == g[i]], norm)
        else:
            a_e = step_rows_loop(float(ep_r[i]), [float(ep_r[j]) for j in range(n) for u in range(t)
                                                  if g[j] == g[i] and m[j][u]], norm)
        for s in range(t):
            if not m[i][s]:
                assert got[i, s] == 0
                continue
            step_group = [togo_loop(r, m, j, u, gamma) for j in range(n) for u in range(t)
                          if m[j][u] and g[j] == g[i] and a[j][u] == a[i][s]]
            a_s = centred_loop(togo_loop(r, m, i, s, gamma), step_group, norm)
            assert float(got[i, s]) == pytest.approx(a_e + omega * a_s, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(cases, st.sampled_from(["none", "group"]))
def test_grae_to_go_matches_a_loop(case, norm):
    groups, mask, r, _ = _episodes(*case)
    got = grae_to_go(r, groups, mask, norm=norm)
    n, t = mask.shape
    g, m, rr = groups.tolist(), mask.tolist(), r.tolist()
    for i in range(n):
        for s in range(t):
            want = 0.0 if not m[i][s] else centred_loop(
                togo_loop(rr, m, i, s, 1.0), [togo_loop(rr, m, j, s, 1.0) for j in range(n) if g[j] == g[i] and m[j][s]],
                norm)
            assert float(got[i, s]) == pytest.approx(want, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(cases, st.sampled_from(["none", "group"]), st.sampled_from([1.0, 0.5]))
def test_turn_grae_matches_a_loop(case, norm, lam):
    groups, mask, turn_r, _ = _episodes(*case)
    outcome = turn_r.sum(1) % 2
    got = turn_grae(outcome, groups, turn_r, mask, lam=lam, norm=norm)
    n, t = mask.shape
    g, m, tr = groups.tolist(), mask.tolist(), turn_r.tolist()
    for i in range(n):
        a_o = centred_loop(float(outcome[i]), [float(outcome[j]) for j in range(n) if g[j] == g[i]], norm)
        for s in range(t):
            want = 0.0 if not m[i][s] else a_o + lam * centred_loop(
                tr[i][s], [tr[j][s] for j in range(n) if g[j] == g[i] and m[j][s]], norm)
            assert float(got[i, s]) == pytest.approx(want, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(cases, st.sampled_from(["none", "group"]))
def test_mt_grpo_outcome_is_the_return_and_each_turn_its_own_reward(case, norm):
    """MT-GRPO as the trainer feeds it (issue 59): the outcome is the episode's return (not its last
    turn's reward, which with score deltas or progress rewards is one step's); turn t's term compares
    its own reward among the group's episodes that went on past t (an episode that ended at t takes
    the outcome's advantage alone there, as the authors' final turn does, instead of 0 minus the
    others' mean)."""
    groups, mask, r, _ = _episodes(*case)
    r = r * mask
    got = estimate("turn_grae", Turns(r.sum(-1), groups, r, mask), norm=norm)
    n, t = mask.shape
    g, m, rr = groups.tolist(), mask.tolist(), r.tolist()
    ret = [sum(rr[i]) for i in range(n)]
    last = [max(k for k in range(t) if m[i][k]) for i in range(n)]
    for i in range(n):
        a_o = centred_loop(ret[i], [ret[j] for j in range(n) if g[j] == g[i]], norm)
        for s in range(t):
            if not m[i][s]:
                want = 0.0
            elif s == last[i]:
                want = a_o
            else:
                want = a_o + centred_loop(rr[i][s], [rr[j][s] for j in range(n) if g[j] == g[i] and s < last[j]], norm)
            assert float(got[i, s]) == pytest.approx(want, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(cases, st.sampled_from([1.0, 0.9]), st.sampled_from([1.0, 0.95, 0.0]))
def test_turn_gae_matches_a_loop(case, gamma, lam):
    _, mask, r, _ = _episodes(*case)
    v = torch.rand(mask.shape, generator=torch.Generator().manual_seed(case[2] + 1)).double() * mask
    adv, ret = turn_gae(r, v, mask, gamma=gamma, lam=lam)
    n, t = mask.shape
    for i in range(n):
        last = int(mask[i].sum()) - 1
        a_next = 0.0
        for s in range(t - 1, -1, -1):
            if s > last:
                assert adv[i, s] == 0 and ret[i, s] == 0
                continue
            v_next = float(v[i, s + 1]) if s < last else 0.0
            delta = float(r[i, s]) + gamma * v_next - float(v[i, s])
            a_next = delta + gamma * lam * a_next
            assert float(adv[i, s]) == pytest.approx(a_next, abs=1e-9)
            assert float(ret[i, s]) == pytest.approx(a_next + float(v[i, s]), abs=1e-9)


def test_reward_to_go_skips_unreached_turns_and_shapes_are_checked():
    r = torch.tensor([[1., 2., 4.]])
    assert reward_to_go(r, torch.tensor([[1, 1, 0]])).tolist() == [[3.0, 2.0, 0.0]]
    # the formula over reached turns, also across a gap: G_0 = 1 + 0.5^2 * 4
    assert reward_to_go(r, torch.tensor([[1, 0, 1]]), gamma=0.5).tolist() == [[2.0, 0.0, 4.0]]
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        grae_to_go(torch.zeros(2, 3), torch.tensor([0, 0]), torch.ones(2, 2))
    with pytest.raises(ValueError, match="norm"):
        gigpo(torch.zeros(2), torch.tensor([0, 0]), torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2), norm="batch")


@settings(max_examples=60, deadline=None)
@given(cases)
def test_shared_anchor_fraction_matches_a_loop(case):
    from seeupo.core.advantages import shared_anchor_fraction

    groups, mask, _, anchors = _episodes(*case)
    g, m, a = groups.tolist(), mask.tolist(), anchors.tolist()
    n, t = mask.shape
    reached = [(i, s) for i in range(n) for s in range(t) if m[i][s]]
    shared = [sum(1 for j, u in reached if g[j] == g[i] and a[j][u] == a[i][s]) >= 2 for i, s in reached]
    assert shared_anchor_fraction(groups, anchors, mask) == pytest.approx(sum(shared) / len(shared))


@given(cases)
@settings(max_examples=40, deadline=None)
def test_batch_norm_matches_a_loop(case):
    """estimate's batch normalisation standardises the unnormalised estimator over reached turns."""
    groups, mask, rewards, anchors = _episodes(*case)
    m = mask.tolist()
    turns = Turns(rewards.sum(-1), groups, rewards, mask, anchors)
    for est in ("gigpo", "turn_grae", "grae_to_go"):
        raw = estimate(est, turns, norm="none")
        got = estimate(est, turns, norm="batch")
        xs = [float(raw[i, k]) for i in range(len(m)) for k in range(len(m[i])) if m[i][k]]
        mu = sum(xs) / len(xs)
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        for i in range(len(m)):
            for k in range(len(m[i])):
                want = (float(raw[i, k]) - mu) / (sd + 1e-6) if m[i][k] else 0.0
                assert float(got[i, k]) == pytest.approx(want, abs=1e-9)


def test_the_registry_dispatches_to_the_estimators():
    groups, mask, rewards, anchors = _episodes(6, 3, 7)
    R = rewards.sum(-1)
    turns = Turns(R, groups, rewards, mask, anchors)
    assert torch.equal(estimate("gigpo", turns, norm="none", params={"gamma": 0.9, "step_weight": 0.5}),
                       gigpo(R, groups, rewards, anchors, mask, omega=0.5, gamma=0.9))
    assert torch.equal(estimate("grae_to_go", turns, norm="group"), grae_to_go(rewards, groups, mask, norm="group"))
    with pytest.raises(ValueError, match="anchor"):
        estimate("gigpo", Turns(R, groups, rewards, mask), norm="none")
    with pytest.raises(ValueError, match="value head"):
        estimate("gae", turns, norm="none")
    with pytest.raises(ValueError, match="valid names"):
        estimate("nope", turns, norm="none")
    with pytest.raises(ValueError, match="no parameter lam"):
        estimate("gigpo", turns, norm="none", params={"lam": 0.5})
    with pytest.raises(ValueError, match="episode_norm"):
        estimate("gigpo", turns, norm="none", params={"episode_norm": "rows"})


def test_gigpo_episode_baseline_the_two_ways():
    """Rewards [1, 0] in one group with 1 and 4 reached turns (docs/core.md): over episodes the
    baseline is 0.5; over step rows (the authors' code) (1 + 4 * 0) / 5 = 0.2."""
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]])
    anchors = torch.arange(8).view(2, 4)  # every turn its own state: no step part
    r = torch.tensor([1.0, 0.0])
    steps = torch.zeros(2, 4)
    by_episode = gigpo(r, torch.tensor([0, 0]), steps, anchors, mask, episode_norm="episode")
    by_step = gigpo(r, torch.tensor([0, 0]), steps, anchors, mask)
    assert by_episode[:, 0].tolist() == pytest.approx([0.5, -0.5])
    assert by_step[:, 0].tolist() == pytest.approx([0.8, -0.2])
    with pytest.raises(ValueError, match="episode_norm"):
        gigpo(r, torch.tensor([0, 0]), steps, anchors, mask, episode_norm="rows")
