"""The sampler's per-row inverse-CDF draw: the right distribution, and a row's token depends only on
its own generator."""

import torch

from seeupo.rollout.sampler import _sample_rows


def test_frequencies_match_the_distribution_and_zero_mass_is_never_drawn():
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    n = 20000
    toks = _sample_rows(p.log().expand(n, 4), [torch.Generator().manual_seed(i) for i in range(n)])
    freq = torch.bincount(toks, minlength=4).float() / n
    assert freq[1] == 0
    assert torch.allclose(freq, p, atol=0.015)


def test_a_rows_draw_does_not_depend_on_the_other_rows():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0)).log_softmax(-1)
    alone = [int(_sample_rows(logits[i:i + 1], [torch.Generator().manual_seed(10 + i)])[0]) for i in range(5)]
    together = _sample_rows(logits, [torch.Generator().manual_seed(10 + i) for i in range(5)]).tolist()
    assert alone == together
