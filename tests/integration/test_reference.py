"""One SeeUPO iteration against an independent reference.

The reference below is written from SPEC §3 alone: its own loop over phases, rows and tokens, one
unbatched forward per row with the full ``[L, vocab]`` logits, its own clipped surrogate and its own
factor. It calls nothing of the library's learner, losses or schedule, so a wrong loss, ratio,
denominator, factor, order or micro-batching in ``sequential_update`` shows up as a parameter gap.
"""

import copy
import math

import pytest
import torch

from seeupo.data.episode import derive_seed, turn_rows
from seeupo.envs import make_family
from seeupo.rollout.runner import RolloutLimits, run_episodes
from seeupo.rollout.sampler import HFSampler
from seeupo.core.schedule import SeeUPOOptions
from seeupo.train.learner import LossSpec
from seeupo.train.update import UpdateContext, sequential_update

LR, EPOCHS, EPS = 0.01, 2, 0.2  # a step small enough that the full weights stay within float32 reach




def _episodes(tiny, chat, history=None):
    """Episodes of 3, 2 and 1 turns (mixed lengths: later pools have fewer rows)."""
    fam = make_family("lookup", {"hops_min": 2, "hops_max": 2})
    tasks = fam.tasks("train")[:3]
    sampler = HFSampler(tiny.model, pad_id=tiny.tokenizer.pad_token_id, eos_ids=[chat.eos_id], temperature=1.0)
    jobs = [(t, i, g, derive_seed(11, i, g)) for i, t in enumerate(tasks) for g in range(3)]
    eps = run_episodes(sampler, chat, fam, jobs, RolloutLimits(max_turns=3, max_new_tokens=8, history=history))
    cut = [e if i % 3 == 0 else e.first_turns(max(1, min(e.n_turns, 3 - i % 3))) for i, e in enumerate(eps)]
    assert sorted({e.n_turns for e in cut}) == [1, 2, 3], [e.n_turns for e in cut]
    return cut


@pytest.fixture(scope="module")
def episodes(tiny, chat):
    return _episodes(tiny, chat)


@pytest.fixture(scope="module")
def episodes_last1(tiny, chat):
    """The same jobs with bounded turn contexts (rollout.history=last:1): each turn's prompt is the
    task and the last exchange, rendered afresh, so no turn's row is a prefix of the next one's."""
    cut = _episodes(tiny, chat, history=1)
    three = next(e for e in cut if e.n_turns == 3)
    rows = [three.ids[start(three, t):three.turn_ends[t]] for t in range(3)]
    assert rows[2][: len(rows[1])] != rows[1]  # not a prefix: the fused factor pass cannot apply
    return cut


def start(e, t: int) -> int:
    """Where turn ``t``'s context starts in the episode's ids (0: one growing stream)."""
    return e.turn_starts[t] if e.turn_starts else 0


def turn_logp(model, e, t: int) -> torch.Tensor:
    """Log-probs of turn ``t``'s generated tokens, from one forward over the turn's context (the
    episode up to the end of that turn, or with bounded contexts that turn's own prompt and reply):
    the decoder's last hidden states, then the full ``[vocab]`` logits and log-softmax at each
    position that predicts one of the turn's tokens."""
    a, end = start(e, t), e.turn_ends[t]
    ids = torch.tensor(e.ids[a:end]).unsqueeze(0)
    hidden = model.model(input_ids=ids).last_hidden_state[0]
    out = []
    for j in range(a + 1, end):
        if e.gen_mask[j] and e.turn_of[j] == t:
            logits = model.lm_head(hidden[j - 1 - a]).float()
            out.append(torch.log_softmax(logits, -1)[e.ids[j]])
    return torch.stack(out)


def sampling_logp(e, t: int) -> torch.Tensor:
    return torch.tensor([lp for j, lp in enumerate(e.logp[: e.turn_ends[t]]) if e.gen_mask[j] and e.turn_of[j] == t])


def reference_iteration(model, episodes, adv, *, order, ratio_reference, factor_ratio, factor_clip,
                        stop_after_phases=None):
    """SPEC §3, one iteration: phases over turn indices, ``EPOCHS`` full-batch SGD steps each on
    ``-mean_rows min(rho A M, clip(rho) A M)``, then ``M *= w_t`` under the updated parameters.
    Returns the model and the factor ``M`` per episode."""
    m = copy.deepcopy(model)
    params = [p for p in m.parameters() if p.requires_grad]
    T = max(e.n_turns for e in episodes)
    if isinstance(order, list):  # phases given as lists of turns: each a segment (buckets:B)
        phases = order
    else:
        phases = [[t] for t in (list(range(T))[::-1] if order == "reverse" else list(range(T)))]
    M = [1.0] * len(episodes)

    def logp_of(i, phase):  # the episode's log-probs on the phase's turns it reached, in order
        return torch.cat([turn_logp(m, episodes[i], t) for t in phase if episodes[i].n_turns > t])

    for k, phase in enumerate(phases[:stop_after_phases]):
        rows = [i for i, e in enumerate(episodes) if e.n_turns > min(phase)]
        with torch.no_grad():
            old = {i: (torch.cat([sampling_logp(episodes[i], t) for t in phase if episodes[i].n_turns > t])
                       if ratio_reference == "sampling" else logp_of(i, phase)) for i in rows}
        for _ in range(EPOCHS):
            total = 0.0
            for i in rows:
                d = logp_of(i, phase) - old[i]
                rho = torch.exp(d.mean())
                a = float(adv[i] if adv.dim() == 1 else adv[i, phase[0]]) * M[i]  # [E] or per turn [E, T]
                total = total - torch.minimum(rho * a, torch.clamp(rho, 1 - EPS, 1 + EPS) * a)
            loss = total / len(rows)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    if g is not None:
                        p -= LR * g
        if k + 1 < len(phases):
            with torch.no_grad():
                for i in rows:
                    d = logp_of(i, phase) - old[i]
                    w = {"full": math.exp(float(d.sum())), "geometric": math.exp(float(d.mean())),
                         "off": 1.0}[factor_ratio]
                    if factor_clip:
                        w = min(max(w, factor_clip[0]), factor_clip[1])
                    M[i] *= w
                    if factor_clip:
                        M[i] = min(max(M[i], factor_clip[0]), factor_clip[1])
    return m, M


def library_iteration(model, episodes, adv, pad, *, budget=4096, share=True, **kw):
    m = copy.deepcopy(model)
    params = [p for p in m.parameters() if p.requires_grad]
    ctx = UpdateContext(m, torch.optim.SGD(params, lr=LR), params, LossSpec("clip_sequence", clip_eps=EPS), budget,
                        None, EPOCHS, 1, torch.Generator().manual_seed(0), share=share)
    metrics, per_turn = sequential_update(ctx, turn_rows(episodes, pad), adv, SeeUPOOptions(**kw))
    return m, metrics, per_turn


def max_gap(a, b) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


ADV = torch.tensor([1.5, -1.0, 0.5, -0.2, 1.0, -1.5, 0.8, -0.6, 0.3])


def _update_cases():
    """Every combination under reverse order; under natural order one in the default run and the
    other seven in the slow set (-m slow): the order changes only which phase comes first, which
    natural order's remaining case and the per-turn and bounded-context references below check."""
    for order in ("reverse", "natural"):
        for ratio_reference in ("sampling", "incremental"):
            for factor_ratio in ("full", "geometric"):
                for i, factor_clip in enumerate([None, (0.9, 1.1)]):
                    case = (order, ratio_reference, factor_ratio, factor_clip)
                    ids = "-".join([*case[:3], "None" if factor_clip is None else f"factor_clip{i}"])
                    slow = order == "natural" and case[1:] != ("sampling", "full", None)
                    yield pytest.param(*case, id=ids, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("order,ratio_reference,factor_ratio,factor_clip", list(_update_cases()))
def test_sequential_update_matches_the_independent_reference(tiny, episodes, order, ratio_reference,
                                                             factor_ratio, factor_clip):
    pad = tiny.tokenizer.pad_token_id
    kw = dict(order=order, ratio_reference=ratio_reference, factor_ratio=factor_ratio, factor_clip=factor_clip)
    ref, M = reference_iteration(tiny.model, episodes, ADV, **kw)
    # the whole pool in one micro-batch, its shared prefixes run once (the trainer's default), and in
    # one case also unshared and one row at a time (fused factor pass on all)
    runs = ([(4096, True), (4096, False), (1, True)] if (order, ratio_reference, factor_clip) == ("reverse", "sampling", None)
            else [(4096, True)])
    for budget, share in runs:
        lib, metrics, per_turn = library_iteration(tiny.model, episodes, ADV, pad, budget=budget, share=share, **kw)
        assert max_gap(ref, lib) < 1e-6, (budget, share, max_gap(ref, lib))
    assert metrics["phase_order"] == ([[2], [1], [0]] if order == "reverse" else [[0], [1], [2]])
    assert metrics["optimizer_steps"] == 3 * EPOCHS
    moved = max_gap(ref, tiny.model)
    assert moved > 1e-3  # the iteration changes the parameters, so the comparison is not trivial
    if factor_clip is None and ratio_reference == "sampling":
        # the factor matters here: without it (M = 1 throughout) the reference ends elsewhere
        off, _ = reference_iteration(tiny.model, episodes, ADV, **{**kw, "factor_ratio": "off"})
        assert max_gap(ref, off) > 1e-5
    last_phase_turn = 0 if order == "reverse" else 2
    f = torch.tensor([M[i] for i, e in enumerate(episodes) if e.n_turns > last_phase_turn], dtype=torch.float64)
    d = per_turn[last_phase_turn]
    assert d["factor_min"] == pytest.approx(float(f.min()), rel=1e-5)
    assert d["factor_max"] == pytest.approx(float(f.max()), rel=1e-5)
    assert float(f.max() - f.min()) > 1e-3  # the factor differs between episodes at the last phase


@pytest.mark.parametrize("order", ["reverse", "natural"])
def test_per_turn_advantages_match_the_independent_reference(tiny, episodes, order):
    """SeeUPO fed a turn-level estimator (algo.estimator): phase t trains on each episode's turn-t
    advantage times the factor."""
    pad = tiny.tokenizer.pad_token_id
    adv_ET = torch.stack([ADV, -0.5 * ADV.flip(0), 0.7 - ADV], dim=1)  # columns differ in sign and size
    kw = dict(order=order, ratio_reference="sampling", factor_ratio="geometric", factor_clip=None)
    ref, _ = reference_iteration(tiny.model, episodes, adv_ET, **kw)
    lib, metrics, _ = library_iteration(tiny.model, episodes, adv_ET, pad, **kw)
    assert max_gap(ref, lib) < 1e-6
    assert metrics["optimizer_steps"] == 3 * EPOCHS
    one_column, _ = reference_iteration(tiny.model, episodes, adv_ET[:, 0], **kw)  # every turn turn 0's
    assert max_gap(ref, one_column) > 1e-5


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("order", ["reverse", "natural"])
def test_bounded_turn_contexts_match_the_independent_reference(tiny, episodes_last1, order, fuse):
    """rollout.history=last:1: each turn row is its own prompt and reply; the factor is scored by its
    own pass where the fused continuation cannot apply (fuse=True falls back), matching the
    reference to 1e-6 either way."""
    pad = tiny.tokenizer.pad_token_id
    kw = dict(order=order, ratio_reference="sampling", factor_ratio="geometric", factor_clip=None)
    ref, M = reference_iteration(tiny.model, episodes_last1, ADV, **kw)
    for budget, share in [(4096, True)] + ([(1, False)] if (order, fuse) == ("reverse", True) else []):
        lib, metrics, per_turn = library_iteration(tiny.model, episodes_last1, ADV, pad, budget=budget, share=share,
                                                   fuse=fuse, **kw)
        assert max_gap(ref, lib) < 1e-6, (budget, share, max_gap(ref, lib))
    assert not any(d.get("fused") for d in per_turn.values())
    assert max_gap(ref, tiny.model) > 1e-3
    off, _ = reference_iteration(tiny.model, episodes_last1, ADV, **{**kw, "factor_ratio": "off"})
    assert max_gap(ref, off) > 1e-5  # the factor matters on these rows too


@pytest.mark.parametrize("factor_ratio", ["full", "geometric"])
@pytest.mark.parametrize("buckets,phases", [(2, [[1, 2], [0]]), (1, [[0, 1, 2]])])
@pytest.mark.parametrize("fuse", [True, False])
def test_buckets_train_each_bucket_as_one_segment(tiny, episodes, buckets, phases, factor_ratio, fuse):
    """buckets:B: one row per episode per bucket, one sequence ratio over the bucket's turns, the
    factor carried per bucket (fused into the next bucket's first forward, or a separate pass)."""
    pad = tiny.tokenizer.pad_token_id
    ref, M = reference_iteration(tiny.model, episodes, ADV, order=phases, ratio_reference="sampling",
                                 factor_ratio=factor_ratio, factor_clip=None)
    lib, metrics, per_turn = library_iteration(tiny.model, episodes, ADV, pad, order=f"buckets:{buckets}",
                                               factor_ratio=factor_ratio, fuse=fuse)
    assert metrics["phase_order"] == phases
    assert metrics["optimizer_steps"] == len(phases) * EPOCHS
    assert max_gap(ref, lib) < 1e-6, max_gap(ref, lib)
    assert max_gap(ref, tiny.model) > 1e-3
    if len(phases) > 1:
        f = torch.tensor([M[i] for i, e in enumerate(episodes)], dtype=torch.float64)
        assert per_turn[0]["factor_min"] == pytest.approx(float(f.min()), rel=1e-5)
        assert per_turn[0]["factor_max"] == pytest.approx(float(f.max()), rel=1e-5)
        assert per_turn[0]["fused"] is fuse and per_turn[0]["rows"] == len(episodes)
        assert [per_turn[t]["rows"] for t in (1, 2)] == [sum(e.n_turns > t for e in episodes) for t in (1, 2)]
        # per-turn rows would be another update: each turn its own sequence ratio
        per_turn_ref, _ = reference_iteration(tiny.model, episodes, ADV, order=[[2], [1], [0]],
                                              ratio_reference="sampling", factor_ratio=factor_ratio, factor_clip=None)
        assert max_gap(ref, per_turn_ref) > 1e-5


def test_sampling_and_incremental_references_give_different_parameters(tiny, episodes):
    pad = tiny.tokenizer.pad_token_id
    a, _, _ = library_iteration(tiny.model, episodes, ADV, pad, order="reverse", ratio_reference="sampling")
    b, _, _ = library_iteration(tiny.model, episodes, ADV, pad, order="reverse", ratio_reference="incremental")
    # a thousand times the float noise of test_sequential_update_matches_the_independent_reference (~1e-8)
    assert max_gap(a, b) > 1e-5 and max_gap(a, b) > 1e-3 * max_gap(a, tiny.model)


def test_later_phase_factor_is_the_ratio_under_the_updated_parameters(tiny, episodes):
    """The factor seen by the second phase (turn 1, reverse order) is each episode's turn-2 weight under
    the parameters after the first phase, computed here by its own forward passes."""
    pad = tiny.tokenizer.pad_token_id
    for factor_ratio in ("full", "geometric"):
        after_first, _ = reference_iteration(tiny.model, episodes, ADV, order="reverse", ratio_reference="sampling",
                                             factor_ratio=factor_ratio, factor_clip=None, stop_after_phases=1)
        want = []
        with torch.no_grad():
            for e in episodes:
                if e.n_turns > 2:  # turn 2 exists: its weight multiplies the factor of turn 1's row
                    d = turn_logp(after_first, e, 2) - sampling_logp(e, 2)
                    want.append(math.exp(float(d.sum() if factor_ratio == "full" else d.mean())))
                elif e.n_turns > 1:
                    want.append(1.0)
        want = torch.tensor(want)
        assert float(want.max() - want.min()) > 1e-3
        _, _, per_turn = library_iteration(tiny.model, episodes, ADV, pad, order="reverse", ratio_reference="sampling",
                                           factor_ratio=factor_ratio)
        d = per_turn[1]
        assert d["rows"] == len(want)
        for key, value in (("factor_mean", want.mean()), ("factor_min", want.min()), ("factor_max", want.max())):
            assert d[key] == pytest.approx(float(value), rel=1e-5), (factor_ratio, key)
