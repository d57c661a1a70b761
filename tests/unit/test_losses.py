import doctest
import inspect
import math

import pytest
import torch

import seeupo.core.losses as losses_mod
from seeupo.core.losses import (
    KL_ESTIMATORS, POLICY_LOSSES, clip_sequence, clip_token, get_kl, get_policy_loss, reinforce,
    sequence_log_ratio,
)


def test_docstring_examples():
    assert doctest.testmod(losses_mod).failed == 0


def test_registries_share_one_signature_and_reject_unknown_names():
    sigs = {str(inspect.signature(f)) for f in POLICY_LOSSES.values()}
    assert len(sigs) == 1
    assert {tuple(inspect.signature(f).parameters) for f in KL_ESTIMATORS.values()} == {
        ("logp_NL", "logp_ref_NL")}
    with pytest.raises(ValueError, match="valid names: clip_sequence, clip_token, reinforce"):
        get_policy_loss("ppo")
    with pytest.raises(ValueError, match="k1, k2, k3"):
        get_kl("k4")


def test_sequence_log_ratio_hand_loop_and_empty_row():
    new = torch.tensor([[0.0, -1.0, 5.0], [1.0, 2.0, 3.0]])
    old = torch.tensor([[-1.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    got = sequence_log_ratio(new, old, mask)
    ref = []
    for i in range(2):
        d = [new[i, j] - old[i, j] for j in range(3) if mask[i, j]]
        ref.append(sum(d) / len(d) if d else 0.0)
    assert torch.allclose(got, torch.tensor(ref))
    assert got[1] == 0.0


def test_clip_token_hand_computed():
    # two tokens: ratio 1.5 (A=1 -> clipped to 1.2), ratio 0.5 (A=1 -> 0.5 unclipped)
    new = torch.log(torch.tensor([[1.5, 0.5]]))
    old = torch.zeros(1, 2)
    loss, m = clip_token(new, old, torch.tensor([1.0]), torch.ones(1, 2), clip_eps=0.2)
    assert math.isclose(loss.item(), -(1.2 + 0.5) / 2, rel_tol=1e-6)
    assert math.isclose(m["clipfrac"].item(), 0.5)
    # negative advantage: ratio 0.5 -> max(-0.5, -0.8) = -0.5 -> clipped branch (-0.8 is min)
    loss, m = clip_token(new, old, torch.tensor([-1.0]), torch.ones(1, 2), clip_eps=0.2)
    assert math.isclose(loss.item(), (1.5 + 0.8) / 2, rel_tol=1e-6)
    assert math.isclose(m["clipfrac"].item(), 0.5)


def clip_token_loop(new, old, adv, mask, eps):
    tot, cnt = 0.0, 0
    for i in range(new.shape[0]):
        for j in range(new.shape[1]):
            if mask[i, j]:
                rho = math.exp(new[i, j] - old[i, j])
                a = adv[i]
                tot += -min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a)
                cnt += 1
    return tot / cnt


def clip_sequence_loop(new, old, adv, mask, eps, factor):
    tot, cnt = 0.0, 0
    for i in range(new.shape[0]):
        d = [new[i, j] - old[i, j] for j in range(new.shape[1]) if mask[i, j]]
        if not d:
            continue
        rho = math.exp(sum(d) / len(d))
        a = adv[i] * factor[i]
        tot += -min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a)
        cnt += 1
    return tot / cnt


@pytest.mark.parametrize("seed", range(5))
def test_losses_match_loop_references(seed):
    g = torch.Generator().manual_seed(seed)
    new = torch.randn(6, 5, generator=g, dtype=torch.float64) * 0.3 - 1
    old = torch.randn(6, 5, generator=g, dtype=torch.float64) * 0.3 - 1
    mask = (torch.rand(6, 5, generator=g) > 0.3).long()
    mask[0] = 0  # an empty row
    mask[1, 0] = 1
    adv = torch.randn(6, generator=g, dtype=torch.float64)
    factor = torch.rand(6, generator=g, dtype=torch.float64) + 0.5
    lt, _ = clip_token(new, old, adv, mask, clip_eps=0.2)
    assert math.isclose(lt.item(), clip_token_loop(new, old, adv, mask, 0.2), rel_tol=1e-9)
    ls, _ = clip_sequence(new, old, adv, mask, clip_eps=0.2, factor_N=factor)
    assert math.isclose(ls.item(), clip_sequence_loop(new, old, adv, mask, 0.2, factor), rel_tol=1e-9)


def test_reinforce_gradient_is_policy_gradient():
    logits = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    tokens = torch.tensor([[0, 1], [2, 3], [1, 1]])
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)

    def logp_fn():
        lp = torch.log_softmax(logits, -1)
        return torch.stack([lp[i, tokens[i]] for i in range(3)])  # [3, 2]

    logp = logp_fn()
    loss, _ = reinforce(logp, logp.detach(), adv, torch.ones(3, 2))
    (g1,) = torch.autograd.grad(loss, logits)
    ref = -(adv.unsqueeze(-1) * logp_fn()).sum(-1).mean()
    (g2,) = torch.autograd.grad(ref, logits)
    assert torch.allclose(g1, g2)


def test_gspo_on_one_token_rows_equals_token_ppo():
    g = torch.Generator().manual_seed(0)
    new = torch.randn(8, 1, generator=g, dtype=torch.float64, requires_grad=True)
    old = new.detach() + 0.3 * torch.randn(8, 1, generator=g, dtype=torch.float64)
    adv = torch.randn(8, generator=g, dtype=torch.float64)
    mask = torch.ones(8, 1)
    a, _ = clip_sequence(new, old, adv, mask)
    b, _ = clip_token(new, old, adv, mask)
    assert torch.allclose(a, b)
    assert torch.allclose(*[torch.autograd.grad(x, new)[0] for x in (a, b)])


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_loss_ignores_masked_tokens_and_sums_over_microbatches(name):
    g = torch.Generator().manual_seed(1)
    new = torch.randn(6, 5, generator=g, dtype=torch.float64)
    old = new + 0.1 * torch.randn(6, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(6, 5, generator=g) > 0.3).long()
    adv = torch.randn(6, generator=g, dtype=torch.float64)
    fn = POLICY_LOSSES[name]
    full, _ = fn(new, old, adv, mask)
    # garbage on masked positions changes nothing
    noisy_new = torch.where(mask.bool(), new, torch.full_like(new, 123.0))
    noisy_old = torch.where(mask.bool(), old, torch.full_like(old, -77.0))
    assert torch.allclose(fn(noisy_new, noisy_old, adv, mask)[0], full)
    # micro-batches with the global denominator add up to the full loss
    agg = "seq_mean" if name == "clip_sequence" else ("seq_sum" if name == "reinforce" else "token_mean")
    if agg == "token_mean":
        denom = mask.sum()
    else:
        denom = (mask.sum(-1) > 0).sum()
    parts = sum(fn(new[s], old[s], adv[s], mask[s], agg=agg, denom=denom)[0]
                for s in (slice(0, 2), slice(2, 3), slice(3, 6)))
    assert torch.allclose(parts, full)


def test_kl_estimators_hand_computed():
    lp = torch.log(torch.tensor([0.5]))
    lr = torch.log(torch.tensor([0.25]))
    assert torch.allclose(get_kl("k1")(lp, lr), torch.tensor([math.log(2)]))
    assert torch.allclose(get_kl("k2")(lp, lr), torch.tensor([0.5 * math.log(2) ** 2]))
    assert torch.allclose(get_kl("k3")(lp, lr), torch.tensor([0.5 - math.log(0.5) - 1]))
    assert get_kl("k3")(lp, lp).item() == 0.0


def test_kl_estimators_unbiased_k1_k3_by_enumeration():
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    q = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    exact = (p * (p / q).log()).sum()
    for name in ("k1", "k3"):
        est = (p * get_kl(name)(p.log(), q.log())).sum()
        assert torch.allclose(est, exact)


def test_bad_shapes_fail_clearly():
    with pytest.raises(ValueError, match="share one"):
        clip_token(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="agg"):
        clip_sequence(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), agg="token_mean")
    with pytest.raises(ValueError, match="valid names"):
        clip_token(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), agg="mean")
