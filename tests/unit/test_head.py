"""The LM head's log-probs in chunks of rows: the values and gradients of one pass."""

import pytest
import torch

from seeupo.models.policy import head_logprobs


def one_pass(head, h, targets, temperature):
    lp = torch.log_softmax(head(h).float() / temperature, -1)
    return lp.gather(-1, targets[:, None]).squeeze(-1), -(lp.exp() * lp).sum(-1)


@pytest.mark.parametrize("K,chunk_elements,temperature", [(37, 64 * 10, 1.0), (37, 64 * 10, 0.7), (5, 1 << 30, 1.0),
                                                         (0, 64 * 10, 1.0)])
def test_chunked_head_matches_one_pass(K, chunk_elements, temperature):
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 64, bias=False)
    h = torch.randn(K, 8, requires_grad=True)
    targets = torch.randint(64, (K,))
    g = torch.randn(K)
    ref_lp, ref_ent = one_pass(head, h, targets, temperature)
    (ref_lp * g).sum().backward()
    ref_gh, ref_gw = h.grad.clone(), head.weight.grad.clone()
    h.grad = head.weight.grad = None
    lp, ent = head_logprobs(head, h, targets, temperature, with_entropy=True, chunk_elements=chunk_elements)
    assert lp.shape == ent.shape == (K,)
    assert torch.allclose(lp, ref_lp, atol=1e-6) and torch.allclose(ent, ref_ent, atol=1e-5)
    assert not ent.requires_grad
    if K:
        (lp * g).sum().backward()
        assert torch.allclose(h.grad, ref_gh, atol=1e-6) and torch.allclose(head.weight.grad, ref_gw, atol=1e-6)
    with torch.no_grad():
        lp2, none = head_logprobs(head, h, targets, temperature, chunk_elements=chunk_elements)
    assert none is None and torch.equal(lp2, lp.detach())


def test_chunks_are_sized_by_the_vocabulary():
    calls = []
    head = torch.nn.Linear(4, 100, bias=False)
    head.register_forward_hook(lambda m, i, o: calls.append(o.shape[0]))
    head_logprobs(head, torch.randn(50, 4), torch.zeros(50, dtype=torch.long), chunk_elements=100 * 16)
    assert calls == [16, 16, 16, 2]
