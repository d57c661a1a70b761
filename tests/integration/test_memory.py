"""Memory (issue 36): the saved-activation counter, the micro-batch planner, the start-up error."""

from __future__ import annotations

import pytest
import torch

from seeupo.train import memory


def test_the_counter_sees_what_autograd_saves_once_per_storage():
    x = torch.randn(1000, requires_grad=True)
    counter = memory.SavedActivations()
    with counter.counting():
        y = x.exp()  # saves its result: 4000 bytes
        z = (y * y).sum()  # saves y twice: the same storage, counted once
    assert counter.peak == 4000 and counter.now == 4000 and counter.largest == 4000
    w = torch.randn(1000, requires_grad=True)
    with counter.counting():
        v = (w * 2.0).sin()  # sin saves its input (w * 2.0): a new storage of 4000 bytes
    assert counter.peak == 8000
    del y, z, v
    assert counter.now == 0  # the graphs are gone: nothing is held for backward any more


def test_the_planner_halves_the_budget_until_the_run_fits(monkeypatch):
    """Hand computation: 1 GB resident, 1 MB of trainable tensors (x4: two Adam moments, the KL
    reference, the gradients), 1 MB/token saved (x1.5 for backward), 0.25 GB of working set."""
    monkeypatch.setattr(memory, "rss_gb", lambda: 1.0)
    monkeypatch.setattr(memory, "activation_bytes_per_token", lambda model: 2 ** 20)
    fixed = 1.0 + 4 * 2 ** 20 / 2 ** 30
    need = {t: fixed + 0.25 + t * 1.5 / 1024 for t in (256, 512, 1024, 2048, 4096)}
    kw = dict(trainable_bytes=2 ** 20, kl_reference=True, micro_batch_tokens=4096)
    p = memory.plan(need[4096] + 0.01, None, **kw)
    assert (p.micro_batch_tokens, p.lowered_from) == (4096, None)
    p = memory.plan((need[1024] + need[2048]) / 2, None, **kw)
    assert (p.micro_batch_tokens, p.lowered_from) == (1024, 4096)
    assert p.need_gb() == pytest.approx(need[1024])
    p = memory.plan(need[256] + 0.001, None, **{**kw, "micro_batch_tokens": 3000})  # not a power of two
    assert p.micro_batch_tokens == 256
    with pytest.raises(memory.DoesNotFit, match=r"micro-batch of 256 tokens 0\.38 GB"):
        memory.plan(need[256] - 0.01, None, **kw)


def test_measuring_activations_leaves_the_model_and_the_random_state_alone():
    from seeupo.models.loading import load_model

    model = load_model("tiny-random:2x32", seed=0).model
    model.eval()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rng = torch.get_rng_state()
    per_token = memory.activation_bytes_per_token(model)
    assert per_token > 0
    assert torch.equal(torch.get_rng_state(), rng) and not model.training
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters())


def test_a_run_that_cannot_fit_exits_2_at_start_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from seeupo.cli import app

    res = CliRunner().invoke(app, ["train", "--preset", "tiny", "--out", str(tmp_path), "run.max_memory_gb=0.2"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if "does not fit" in ln]
    assert len(lines) == 1 and "run.max_memory_gb=0.2" in lines[0] and "GB in all" in lines[0]
    assert not (tmp_path / "config.yaml").exists()  # refused before anything was written


def test_a_lowered_micro_batch_is_the_stacks_own_and_the_config_stays_as_loaded(tmp_path, monkeypatch, capsys):
    """Issue 61: the config is not changed at run time. The planner's lower micro-batch is the policy
    stack's own budget (the learner uses it; the console line and summary.json say it); the config
    object and the config.yaml the run saves stay as loaded: its resolved dump is the same after a run."""
    import copy

    import yaml
    from rich.console import Console

    from seeupo.train.config import load_config, resolved_dump
    from seeupo.train.trainer import Trainer

    monkeypatch.setattr(memory, "rss_gb", lambda: 1.0)
    monkeypatch.setattr(memory, "activation_bytes_per_token", lambda model: 2 ** 20)  # 1.5 MB/token with backward
    cfg = load_config("tiny", ["warmup.enabled=off", "eval.tasks=2", "eval.k=1", "rollout.tasks_per_iteration=2",
                               "rollout.group_size=2", "run.loggers=[jsonl]", "run.iterations=1",
                               "optim.micro_batch_tokens=4096", "run.max_memory_gb=1.8", f"run.out={tmp_path}"])
    before = copy.deepcopy(resolved_dump(cfg))
    tr = Trainer(cfg, console=Console(width=400))
    summary = tr.run()
    assert tr.stack.micro_batch_tokens == 256 and summary["micro_batch_tokens"] == 256  # 512 would need 2.0 GB
    assert "(optim.micro_batch_tokens lowered from 4096 to fit)" in capsys.readouterr().out
    assert resolved_dump(cfg) == before and cfg.optim.micro_batch_tokens == 4096
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == before
