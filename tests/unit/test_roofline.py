"""benchmarks/roofline.py's analytic FLOP count against torch's FlopCounterMode (an independent count
of the matmuls the kernels ran) on a tiny random Llama: a padded forward, a decode step from a KV
cache, a LoRA forward and backward, a full fine-tuning backward."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-3  # FlopCounterMode counts the matmuls only, as the formula does; rounding aside they agree


@pytest.fixture(scope="module")
def roofline():
    spec = importlib.util.spec_from_file_location("roofline", ROOT / "benchmarks" / "roofline.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


def _model(lora_r: int = 0):
    from transformers import AutoModelForCausalLM

    from seeupo.models.loading import tiny_config
    from seeupo.models.policy import apply_lora

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("tiny-random:2x64", 96))  # GQA: 4 heads, 2 kv heads
    return apply_lora(model, r=lora_r, seed=0) if lora_r else model


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as c:
        fn()
    return c.get_total_flops()


def _batch(B=3, L=12):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (B, L), generator=g)
    att = torch.ones(B, L, dtype=torch.long)
    att[0, 8:] = 0  # padding: the kernels still run it
    return ids, att


def test_forward_matches_flop_counter(roofline):
    model = _model()
    dims = roofline.Dims.of(model.config)
    ids, att = _batch()
    B, L = ids.shape
    with torch.no_grad():
        got = _counted(lambda: model(input_ids=ids, attention_mask=att))
    want = roofline.forward_flops(dims, positions=B * L, pairs=B * L * L, head_rows=B * L)
    assert got == pytest.approx(want, rel=TOL)


def test_decode_step_from_cache_matches_flop_counter(roofline):
    """One new position per row attending to the cached keys: the recorded shapes give the count."""
    from seeupo.models.policy import cache_keyword

    model = _model()
    dims = roofline.Dims.of(model.config)
    ids, att = _batch()
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=att, use_cache=True).past_key_values
        nxt = torch.randint(0, 96, (ids.shape[0], 1))
        att2 = torch.cat([att, torch.ones(ids.shape[0], 1, dtype=torch.long)], 1)
        with roofline.Count(model, dims) as c:
            model(input_ids=nxt, attention_mask=att2, use_cache=True, logits_to_keep=1, **{cache_keyword(model): cache})
    assert c.calls == [(3, 1, 13, 3, False)] and c.heads == [(3, False)]
    assert c.counted == pytest.approx(roofline.forward_flops(dims, positions=3, pairs=3 * 13, head_rows=3), rel=TOL)
    assert c.counted == pytest.approx(c.analytic()["total"], rel=TOL)


@pytest.mark.parametrize("lora_r", [4, 0])
def test_forward_and_backward_match_flop_counter(roofline, lora_r):
    """LoRA (base frozen: input gradients only, none into the first layer's q, k, v) and full
    fine-tuning (every weight's gradient too)."""
    model = _model(lora_r)
    base = model.get_base_model() if lora_r else model
    targets = [n for n in roofline.Dims.of(base.config).projections()]
    dims = roofline.Dims.of(base.config, lora_r, targets)
    ids, att = _batch()
    B, L = ids.shape

    def step():
        model(input_ids=ids, attention_mask=att).logits.float().square().mean().backward()

    got = _counted(step)
    want = (roofline.forward_flops(dims, B * L, B * L * L, B * L)
            + roofline.backward_flops(dims, B * L, B * L * L, B * L, base_trained=not lora_r,
                                      first_input_grad=not lora_r, head_trained=not lora_r))
    assert got == pytest.approx(want, rel=TOL)
    with roofline.Count(model, dims) as c:  # the flags read off the model give the same count
        step()
    assert c.flags == {"base_trained": not lora_r, "first_input_grad": not lora_r, "head_trained": not lora_r}
    assert c.analytic()["total"] == want


def test_worked_examples(roofline):
    import doctest

    assert doctest.testmod(roofline).failed == 0


def test_decode_bound_by_hand(roofline):
    """One decode step of 2 rows over 5 keys (the pre-fill call does not count): 1000 parameter bytes
    and 2 x 5 x 16 bytes of keys and values = 1160 bytes; 896 FLOPs (2 x 2 x 144 projections, 4 x 10 x 4
    attention, 2 x 2 x 40 LM head)."""
    dims = roofline.Dims(1, 4, 8, 2, 1, 2, 10)
    calls = [(2, 3, 3, 6, False), (2, 1, 5, 2, False)]
    fast = roofline.decode_bound(calls, dims, 1000, 4, gbps=1160e-9, peak_gflops=896e-9)  # both 1 s
    assert fast["decode_steps"] == 1 and fast["bytes_per_step_mean"] == 1160
    assert fast["memory_bound_tok_per_s"] == pytest.approx(2.0) and fast["roofline_bound_tok_per_s"] == pytest.approx(2.0)
    slow = roofline.decode_bound(calls, dims, 1000, 4, gbps=1160e-9, peak_gflops=448e-9)  # compute: 2 s
    assert slow["memory_bound_tok_per_s"] == pytest.approx(2.0) and slow["roofline_bound_tok_per_s"] == pytest.approx(1.0)


def test_the_docs_roofline_table_and_figures_are_the_records(roofline):
    """docs/performance.md's roofline table is ``markdown`` of results/roofline/ (in the order the doc
    gives them), and the figures its readings quote are those records'."""
    import json
    import re

    root = Path(__file__).resolve().parents[2]
    names = ("default-avx512", "default-avx2-capped", "textworld-avx512")
    recs = {n: json.loads((root / "results" / "roofline" / f"{n}.json").read_text()) for n in names}
    doc = (root / "docs" / "performance.md").read_text()
    block = re.search(r"<!-- roofline -->\n(.*?)\n<!-- /roofline -->", doc, re.S).group(1)
    assert block == roofline.markdown([recs[n] for n in names])
    text = " ".join(doc.split())
    real = {n: next(p for p in recs[n]["phases"] if p["phase"].startswith("reference"))
            for n in ("default-avx512", "textworld-avx512")}
    share = {n: round(100 * p["real_positions"] / p["positions"]) for n, p in real.items()}
    assert f"({share['default-avx512']}% default, {share['textworld-avx512']}% textworld)" in text
    d = recs["default-avx512"]["decode"]
    assert f"({round(d['achieved_tok_per_s'])}, pre-fills" in text and f"memory bound ({round(d['memory_bound_tok_per_s'])})" in text
    peaks = [round(recs[n]["peak_gflops"]) for n in ("default-avx2-capped", "default-avx512")]
    assert f"({peaks[0]} against {peaks[1]} GFLOP/s)" in text
    walls = [f"{round(recs[n]['wall_s']) // 60} min {round(recs[n]['wall_s']) % 60} s" for n in names if "capped" not in n]
    assert f"# {walls[0]} (default), {walls[1]} (textworld) on a 2-core AVX512 EPYC" in text
    assert f"{d['bytes_per_step_mean'] / 2**20:.0f} MiB (the parameters and the rows' keys and values) for " \
           f"{d['rows_per_step_mean']:.0f} rows on average" in text
