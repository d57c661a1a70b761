"""Learner invariances and the SeeUPO schedule on a tiny random model."""

import copy

import pytest
import torch

from seeupo.core.losses import POLICY_LOSSES
from seeupo.core.schedule import SeeUPOOptions
from seeupo.data.episode import derive_seed, trajectory_rows, turn_rows
from seeupo.envs import make_family
from seeupo.rollout.runner import RolloutLimits, run_episodes
from seeupo.rollout.sampler import HFSampler
from seeupo.models.policy import Continuation, SharedPrefix, pack_lanes, token_logprobs
from seeupo.train.learner import LossSpec, StepInputs, micro_batches, optimizer_step, score
from seeupo.train.update import UpdateContext, joint_update, sequential_update


@pytest.fixture(scope="module")
def episodes(tiny, chat):
    fam = make_family("lookup", {"hops_min": 1, "hops_max": 2})
    tasks = fam.tasks("train")[:3]
    sampler = HFSampler(tiny.model, pad_id=tiny.tokenizer.pad_token_id, eos_ids=[chat.eos_id], temperature=1.0)
    jobs = [(t, i, g, derive_seed(3, i, g)) for i, t in enumerate(tasks) for g in range(3)]
    return run_episodes(sampler, chat, fam, jobs, RolloutLimits(max_turns=3, max_new_tokens=10))


def grads_after_step(model, inp, spec, budget, pack=False, share=False):
    m = copy.deepcopy(model)
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1.0)
    before = [p.detach().clone() for p in params]
    optimizer_step(m, opt, params, inp, spec, budget_tokens=budget, grad_clip=None, pack=pack, share=share)
    return [b - p.detach() for b, p in zip(before, params)]


@pytest.mark.parametrize("loss", sorted(POLICY_LOSSES))
def test_loss_does_not_depend_on_micro_batch_size(tiny, episodes, loss):
    rows = trajectory_rows(episodes, tiny.tokenizer.pad_token_id)
    adv = torch.linspace(-1, 1, len(rows))
    inp = StepInputs(rows=rows, adv=adv)
    spec = LossSpec(loss)
    a = grads_after_step(tiny.model, inp, spec, budget=100_000)  # one micro-batch
    b = grads_after_step(tiny.model, inp, spec, budget=1)  # one row per micro-batch
    assert all(torch.allclose(x, y, atol=1e-6, rtol=1e-4) for x, y in zip(a, b))
    assert any(x.abs().max() > 0 for x in a)


@pytest.mark.parametrize("pack", [False, True])
def test_pad_ids_and_non_trained_positions_do_not_change_the_loss(tiny, episodes, pack):
    rows = turn_rows(episodes, tiny.tokenizer.pad_token_id) if pack else trajectory_rows(episodes, tiny.tokenizer.pad_token_id)
    adv = torch.linspace(-1, 1, len(rows))
    spec = LossSpec("clip_token")
    pack = 2 * rows.input_ids.shape[1] if pack else 0
    a = grads_after_step(tiny.model, StepInputs(rows=rows, adv=adv), spec, 100_000, pack)
    noisy = copy.copy(rows)
    pad = rows.attention_mask == 0
    noisy.input_ids = torch.where(pad, torch.full_like(rows.input_ids, 123), rows.input_ids)
    # garbage sampling log-probs outside the loss mask (observation and template tokens)
    noisy.old_logp = torch.where(rows.loss_mask.bool(), rows.old_logp, torch.full_like(rows.old_logp, -55.0))
    b = grads_after_step(tiny.model, StepInputs(rows=noisy, adv=adv), spec, 100_000, pack)
    assert all(torch.allclose(x, y, atol=1e-7) for x, y in zip(a, b))


def test_packing_lays_rows_end_to_end_without_changing_scores(tiny, episodes):
    rows = turn_rows(episodes, tiny.tokenizer.pad_token_id)  # every turn of every episode: mixed lengths
    lens = rows.attention_mask.sum(-1).tolist()
    W = 2 * rows.input_ids.shape[1]  # lanes twice the longest row
    lanes = pack_lanes(lens, W)
    assert sorted(i for lane in lanes for i in lane) == list(range(len(lens)))
    assert all(sum(lens[i] for i in lane) <= W for lane in lanes)
    assert len(lanes) * W < rows.input_ids.numel(), lens  # fewer tokens than the padded rows
    m = tiny.model.eval()
    with torch.no_grad():
        a = token_logprobs(m, rows.input_ids, rows.attention_mask, rows.loss_mask)
        b = token_logprobs(m, rows.input_ids, rows.attention_mask, rows.loss_mask, pack=W)
    assert torch.allclose(a.logp, b.logp, atol=1e-5) and torch.allclose(a.entropy, b.entropy, atol=1e-5)
    assert (a.logp != 0).sum() == rows.loss_mask[:, 1:].sum()  # every trained token scored
    # the budget counts packed tokens: each micro-batch within it, all rows once, fewer tokens in all
    budget = 2 * W
    packed = micro_batches(rows, budget, pack=W)
    sizes = [len(pack_lanes([lens[i] for i in g.tolist()], W)) * W for g in packed]
    assert max(sizes) <= budget and sum(sizes) < rows.input_ids.numel()
    assert sorted(torch.cat(packed).tolist()) == list(range(len(lens)))


@pytest.mark.parametrize("loss", ["clip_token", "clip_sequence"])
def test_packed_step_equals_the_padded_step(tiny, episodes, loss):
    rows = turn_rows(episodes, tiny.tokenizer.pad_token_id)
    inp = StepInputs(rows=rows, adv=torch.linspace(-1, 1, len(rows)))
    a = grads_after_step(tiny.model, inp, LossSpec(loss), 100_000)
    W = 2 * rows.input_ids.shape[1]
    for budget in (100_000, 2 * W):
        b = grads_after_step(tiny.model, inp, LossSpec(loss), budget, pack=W)
        assert all(torch.allclose(x, y, atol=1e-6, rtol=1e-4) for x, y in zip(a, b)), budget


def _rows(lists):
    L = max(map(len, lists))
    ids, att = torch.zeros(len(lists), L, dtype=torch.long), torch.zeros(len(lists), L, dtype=torch.long)
    for b, r in enumerate(lists):
        ids[b, : len(r)], att[b, : len(r)] = torch.tensor(r), 1
    return ids, att


def _grads_of(model, fn):
    model.zero_grad(set_to_none=True)
    out = fn()
    (out.logp.sum() + out.cont_logp.sum() * 0).backward()
    return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("common", [30, 0])
def test_shared_prefix_scores_and_gradients_equal_the_unshared_pass(tiny, common):
    """Rows sharing a prefix, three clusters sharing more (a task's prompt), a row alone, mixed
    lengths; with and without a prefix common to all rows. Compared with each row's own forward."""
    g = torch.Generator().manual_seed(1)
    rnd = lambda n: torch.randint(5, 400, (n,), generator=g).tolist()  # noqa: E731
    head, tasks = rnd(common), [rnd(20) for _ in range(3)]
    lists = [head + tasks[b % 3] + rnd(3 + 2 * b) for b in range(6)] + [head + rnd(25)]
    ids, att = _rows(lists)
    plan = SharedPrefix.of(ids, att)
    assert plan is not None and plan.p0 == common
    assert plan.seg_ids.shape[0] == 4 and plan.tokens < 0.8 * ids.numel()  # 3 clusters + the row alone
    score_mask = att.clone()
    score_mask[:, : common + 5] = 0  # scored tokens inside the clusters' shared segments too
    E = 5
    cont = Continuation(torch.randint(5, 400, (7, E), generator=g), torch.ones(7, E, dtype=torch.long),
                        torch.ones(7, E, dtype=torch.long))
    cont.attention_mask[2, 3:] = cont.score_mask[2, 3:] = 0
    cont.attention_mask[4] = cont.score_mask[4] = 0  # a row that does not continue
    m = copy.deepcopy(tiny.model).train()
    a, ga = _grads_of(m, lambda: token_logprobs(m, ids, att, score_mask, continuation=cont))
    b, gb = _grads_of(m, lambda: token_logprobs(m, ids, att, score_mask, continuation=cont, share=True))
    assert (a.logp != 0).sum() == score_mask[:, 1:].sum()
    assert torch.allclose(a.logp, b.logp, atol=1e-5) and torch.allclose(a.entropy, b.entropy, atol=1e-5)
    assert torch.allclose(a.cont_logp, b.cont_logp, atol=1e-5) and (a.cont_logp != 0).sum() == 6 * E - 2
    assert all(torch.allclose(x, y, atol=1e-6, rtol=1e-4) for x, y in zip(ga, gb))
    # rows with nothing in common run unshared
    ids, att = _rows([rnd(12), rnd(9), rnd(14)])
    assert SharedPrefix.of(ids, att) is None


def test_shared_micro_batches_hold_every_row_once_within_the_budget(tiny, episodes):
    rows = turn_rows(episodes, tiny.tokenizer.pad_token_id)
    lens = rows.attention_mask.sum(-1).tolist()
    for budget in (1, 300, 600, 100_000):
        groups = micro_batches(rows, budget, share=True)
        assert sorted(torch.cat(groups).tolist()) == list(range(len(lens)))
        for grp in groups:
            sub = [rows.input_ids[i, : lens[i]].tolist() for i in grp.tolist()]
            order, adj = SharedPrefix.sort(sub)
            cost = SharedPrefix.cost([len(sub[k]) for k in order], adj)
            assert len(grp) == 1 or cost <= budget, (budget, cost)
    one = micro_batches(rows, 100_000, share=True)
    assert len(one) == 1
    plan = SharedPrefix.of(rows.input_ids, rows.attention_mask)
    assert plan is not None and plan.p0 > 40 and plan.tokens < 0.6 * rows.input_ids.numel()


@pytest.mark.parametrize("loss", ["clip_token", "clip_sequence"])
def test_shared_step_equals_the_padded_step(tiny, episodes, loss):
    rows = turn_rows(episodes, tiny.tokenizer.pad_token_id)
    inp = StepInputs(rows=rows, adv=torch.linspace(-1, 1, len(rows)))
    a = grads_after_step(tiny.model, inp, LossSpec(loss), 100_000)
    for budget in (100_000, 600):
        b = grads_after_step(tiny.model, inp, LossSpec(loss), budget, share=True)
        assert all(torch.allclose(x, y, atol=1e-6, rtol=1e-4) for x, y in zip(a, b)), budget


def ctx_for(model, lr, epochs=2):
    m = copy.deepcopy(model)
    params = [p for p in m.parameters() if p.requires_grad]
    return UpdateContext(m, torch.optim.SGD(params, lr=lr), params, LossSpec("clip_sequence"), 4096, None,
                         epochs, 1, torch.Generator().manual_seed(0))


def test_factor_is_one_with_zero_learning_rate(tiny, episodes):
    """An identity (STYLE.md): with lr 0 nothing moves, so every weight is 1 (exactly, with the
    incremental reference). It cannot tell the references apart; test_reference.py does."""
    pools = turn_rows(episodes, tiny.tokenizer.pad_token_id)
    adv = torch.linspace(-1, 1, len(episodes))
    _, per_turn = sequential_update(ctx_for(tiny.model, 0.0), pools, adv,
                                    SeeUPOOptions(order="reverse", ratio_reference="incremental"))
    assert len(per_turn) >= 2
    for t, d in per_turn.items():
        assert d["factor_min"] == 1.0 and d["factor_max"] == 1.0, (t, d)
        if "ratio_mean" in d:
            assert d["ratio_mean"] == 1.0
    # with the sampler's log-probs as reference the factor is 1 up to the sampler/learner gap
    _, per_turn = sequential_update(ctx_for(tiny.model, 0.0), pools, adv, SeeUPOOptions(order="reverse"))
    assert all(abs(d["factor_min"] - 1) < 1e-5 and abs(d["factor_max"] - 1) < 1e-5 for d in per_turn.values())


def test_factor_moves_and_reverse_updates_last_turn_first(tiny, episodes):
    pools = turn_rows(episodes, tiny.tokenizer.pad_token_id)
    adv = torch.linspace(-1, 1, len(episodes))
    _, per_turn = sequential_update(ctx_for(tiny.model, 1.0), pools, adv, SeeUPOOptions(order="reverse"))
    last = max(per_turn)
    assert per_turn[last]["phase"] == 0 and per_turn[0]["phase"] == len(per_turn) - 1
    assert per_turn[last]["factor_max"] == 1.0  # the first phase has no updated turns behind it
    assert per_turn[0]["factor_min"] < 1.0 or per_turn[0]["factor_max"] > 1.0
    # only episodes that reached a turn have rows in its pool
    for t, d in per_turn.items():
        assert d["rows"] == sum(e.n_turns > t for e in episodes)


def test_seeupo_on_one_turn_takes_the_gspo_step(tiny, chat):
    fam = make_family("lookup", {"hops_min": 1, "hops_max": 1, "answer_required": False, "slack_turns": 0})
    tasks = fam.tasks("train")[:3]
    sampler = HFSampler(tiny.model, pad_id=tiny.tokenizer.pad_token_id, eos_ids=[chat.eos_id], temperature=1.0)
    eps = run_episodes(sampler, chat, fam, [(t, i, g, derive_seed(5, i, g)) for i, t in enumerate(tasks)
                                             for g in range(2)], RolloutLimits(max_turns=1, max_new_tokens=8))
    assert all(e.n_turns == 1 for e in eps)
    adv = torch.linspace(-1, 1, len(eps))
    a = ctx_for(tiny.model, 0.5)
    sequential_update(a, turn_rows(eps, tiny.tokenizer.pad_token_id), adv, SeeUPOOptions(order="reverse"))
    b = ctx_for(tiny.model, 0.5)
    rows = trajectory_rows(eps, tiny.tokenizer.pad_token_id)
    joint_update(b, rows, adv[rows.episode])
    for p, q in zip(a.params, b.params):
        assert torch.allclose(p, q, atol=1e-6)
    assert any(not torch.equal(p, q) for p, q in zip(a.params, tiny.model.parameters()))




@pytest.mark.parametrize("epochs,kl,budget", [(1, 0.0, 4096), (2, 0.0, 4096), (1, 0.5, 4096), (1, 0.0, 1)])
def test_fused_factor_pass_takes_the_same_steps_with_fewer_forwards(tiny, episodes, epochs, kl, budget, monkeypatch):
    """SPEC §6: the factor's forward pass fused into the next turn's pass changes no number (also
    with one row per micro-batch, where rows of episodes that ended early continue with nothing)."""
    import seeupo.train.update as upd

    episodes = [e if i % 2 else e.first_turns(2) for i, e in enumerate(episodes)]
    assert len({e.n_turns for e in episodes}) > 1  # some rows have no later turn to continue with
    pools = turn_rows(episodes, tiny.tokenizer.pad_token_id)
    assert len(set(pools.turn.tolist())) >= 3
    adv = torch.linspace(-1, 1, len(episodes))
    calls = {"score": 0}
    real_score = upd.score

    def counting(*a, **k):
        calls["score"] += 1
        return real_score(*a, **k)

    monkeypatch.setattr(upd, "score", counting)
    out = {}
    for fuse in (False, True):
        ctx = ctx_for(tiny.model, 0.5, epochs=epochs)
        ctx.budget_tokens = budget
        if kl:
            ctx.spec = LossSpec("clip_sequence", kl_coef=kl)
            ref_model = copy.deepcopy(tiny.model)
            ctx.reference_logp = lambda rows: real_score(ref_model, rows, temperature=1.0, budget_tokens=4096)[0]
        calls["score"] = 0
        _, per_turn = sequential_update(ctx, pools, adv, SeeUPOOptions(order="reverse", factor_clip=(0.5, 2.0), fuse=fuse))
        out[fuse] = (ctx.params, per_turn, calls["score"])
    (pa, ta, na), (pb, tb, nb) = out[False], out[True]
    for p, q in zip(pa, pb):
        assert torch.allclose(p, q, atol=1e-5, rtol=1e-4)
    for t in ta:
        for key in ("factor_mean", "factor_min", "factor_max", "adv_x_factor_mean"):
            assert ta[t][key] == pytest.approx(tb[t][key], rel=1e-5, abs=1e-4), (t, key)
        if "ratio_mean" in ta[t]:
            assert ta[t]["ratio_mean"] == pytest.approx(tb[t]["ratio_mean"], rel=1e-5, abs=1e-4)
    assert na == len(ta) - 1 and nb == 0  # one scoring pass per owed factor, none when fused
    assert any(d["fused"] for d in tb.values()) and not any(d["fused"] for d in ta.values())


def test_placeholder_rows_behave_as_in_the_authors_code(tiny, episodes, monkeypatch):
    """The authors' placeholders (SPEC §3, authors_code): a copy of the episode's last turn for each
    unreached turn index: no policy loss (advantage 0), but they count in the row mean, get the KL
    penalty on the copied tokens and multiply the copied turn's (clamped) ratio into the factor."""
    import seeupo.train.update as upd

    pad = tiny.tokenizer.pad_token_id
    episodes = [e if i % 2 else e.first_turns(1) for i, e in enumerate(episodes)]
    T = max(e.n_turns for e in episodes) + 1
    pools = turn_rows(episodes, pad, placeholders_to=T)
    assert len(pools) == len(episodes) * T
    ph = pools.placeholder
    assert int(ph.sum()) == sum(T - e.n_turns for e in episodes)
    for r in torch.nonzero(ph).squeeze(-1).tolist():  # the copied turn's tokens are its loss tokens
        e = episodes[int(pools.episode[r])]
        last = (pools.episode == pools.episode[r]) & (pools.turn == e.n_turns - 1) & ~ph
        assert torch.equal(pools.loss_mask[r], pools.loss_mask[torch.nonzero(last).item()])
    seen = []
    real_step = upd.optimizer_step

    def spy(model, opt, params, inp, spec, **kw):
        seen.append(inp)
        return real_step(model, opt, params, inp, spec, **kw)

    monkeypatch.setattr(upd, "optimizer_step", spy)
    adv = torch.linspace(-1, 1, len(episodes)) + 0.05  # no episode with advantage 0
    ctx = ctx_for(tiny.model, 0.5, epochs=1)
    ctx.spec = LossSpec("clip_sequence", kl_coef=0.1)
    ref_model = copy.deepcopy(tiny.model)
    ctx.reference_logp = lambda rows: score(ref_model, rows, temperature=1.0, budget_tokens=4096)[0]
    metrics, per_turn = sequential_update(ctx, pools, adv, SeeUPOOptions(order="reverse", ratio_reference="incremental",
                                          factor_ratio="geometric", factor_clip=(0.8, 1.2)))
    assert metrics["phases"] == T and all(per_turn[t]["rows"] == len(episodes) for t in range(T))
    assert len(seen) == T
    for inp in seen:
        p = inp.rows.placeholder
        assert torch.all(inp.adv[p] == 0) and torch.all(inp.adv[~p] != 0)
        assert inp.ref_logp is not None and torch.all(inp.rows.loss_mask[p].sum(-1) > 0)  # KL on their tokens
    # the turn-0 phase: one-turn episodes carry the product of their placeholders' clamped ratios
    last = seen[-1]
    short = torch.tensor([episodes[int(e)].n_turns == 1 for e in last.rows.episode])
    f = last.factor[short]
    assert torch.all((f >= 0.8 - 1e-6) & (f <= 1.2 + 1e-6)) and torch.any((f - 1).abs() > 1e-4)


def test_placeholder_rows_count_in_the_row_mean_and_get_the_kl_penalty(tiny, episodes):
    """One step on a pool of real and placeholder rows against the same step on its real rows only:
    the policy loss is the real rows' sum over *all* rows (the placeholders dilute the mean), and the
    KL term covers the placeholders' copied tokens too."""
    pad = tiny.tokenizer.pad_token_id
    episodes = [e if i % 2 else e.first_turns(1) for i, e in enumerate(episodes)]
    T = max(e.n_turns for e in episodes)
    pools = turn_rows(episodes, pad, placeholders_to=T)
    pool = pools.select(torch.nonzero(pools.turn == T - 1).squeeze(-1))
    ph = pool.placeholder
    assert bool(ph.any()) and bool((~ph).any())
    ref_model = copy.deepcopy(tiny.model)
    with torch.no_grad():
        for p in ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a reference away from the policy: KL > 0 from the start
    adv = torch.where(ph, 0.0, torch.linspace(0.5, 1.5, len(pool)))
    spec = LossSpec("clip_sequence", kl_coef=0.1)

    def step(rows, a):
        ref = score(ref_model, rows, temperature=1.0, budget_tokens=4096)[0]
        m = copy.deepcopy(tiny.model)
        params = [p for p in m.parameters() if p.requires_grad]
        return optimizer_step(m, torch.optim.SGD(params, lr=0.0), params, StepInputs(rows=rows, adv=a, ref_logp=ref),
                              spec, budget_tokens=4096, grad_clip=None)

    both = step(pool, adv)
    real = torch.nonzero(~ph).squeeze(-1)
    alone = step(pool.select(real), adv[real])
    n_all, n_real = len(pool), len(real)
    assert both["policy_loss"] == pytest.approx(alone["policy_loss"] * n_real / n_all, rel=1e-5)
    tokens_all, tokens_real = float(pool.loss_mask.sum()), float(pool.loss_mask[real].sum())
    assert tokens_all > tokens_real
    assert both["kl"] * tokens_all != pytest.approx(alone["kl"] * tokens_real, rel=1e-3)  # the copies add KL
