"""The trainer end to end on the tiny preset, shrunk: every algorithm, resume, summary contract."""

import json

import pytest
import torch

from seeupo.core.algorithms import ALGORITHMS
from seeupo.train.config import load_config
from seeupo.train.trainer import Trainer

SMALL = ["warmup.episodes=16", "warmup.epochs=1", "eval.tasks=2", "eval.k=2", "rollout.tasks_per_iteration=2",
         "rollout.group_size=2", "run.loggers=[jsonl]"]


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_runs_two_iterations(tmp_path, algo):
    cfg = load_config("tiny", [*SMALL, f"algo.name={algo}", "run.iterations=2", f"run.out={tmp_path}"])
    summary = Trainer(cfg).run()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if "reward_mean" in r]
    assert [r["iteration"] for r in train] == [0, 1]
    assert all(r["optimizer_steps"] >= 1 and "turn" in r for r in train)
    assert summary["iterations"] == 2 and (tmp_path / "curves.png").exists()
    for key in ("eval_before", "eval_after"):
        assert {"avg@k", "pass@k", "k", "tasks"} <= set(summary[key])
    assert summary["trainable_param_l2"] > 0


@pytest.mark.parametrize("algo,history", [("seeupo", "last:1"), ("seeupo", "last:0"), ("grpo", "last:1"),
                                          ("ppo", "last:0")])
def test_bounded_turn_contexts_train(tmp_path, algo, history):
    """rollout.history=last:K end to end (warm-up, evaluation, updates on turn rows), GRPO on turn rows,
    PPO with GAE over each episode's turn rows.
    With last:0 no turn's row is a prefix of the next one's: SeeUPO's factor by its own scoring pass
    (with last:1 on these 2-turn tasks turn 1's prompt still holds all of turn 0, and the fused pass
    applies where it is exact)."""
    cfg = load_config("tiny", [*SMALL, f"algo.name={algo}", f"rollout.history={history}", "run.iterations=2",
                               f"run.out={tmp_path}", *(["algo.rows=turn"] if algo == "grpo" else [])])
    summary = Trainer(cfg).run()
    train = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if "reward_mean" in r]
    assert summary["iterations"] == 2 and summary["trainable_param_l2"] > 0
    assert any(r["episode/turns"] > 1 for r in train)  # several turns, so several segments per episode
    if history == "last:0":
        assert not any(d.get("fused") for r in train for d in r["turn"].values())


def test_resume_reproduces_the_uninterrupted_run(tmp_path, one_thread, monkeypatch):
    import importlib.metadata as md

    from seeupo.train import trainer

    base = [*SMALL, "run.checkpoint_every=1", "algo.name=seeupo"]
    full = load_config("tiny", [*base, "run.iterations=3", f"run.out={tmp_path / 'full'}"])
    Trainer(full).run()
    part = load_config("tiny", [*base, "run.iterations=2", f"run.out={tmp_path / 'part'}"])
    Trainer(part).run()
    cont = load_config(str(tmp_path / "part" / "config.yaml"), ["run.iterations=3"])
    here = trainer.platform_info()
    monkeypatch.setattr(trainer, "platform_info", lambda: {**here, "cpu_capability": "ELSEWHERE"})
    s = Trainer(cont, resume=True).run()
    # where it ran: the platform it started on, then the one it was resumed on (the summary's last)
    assert here["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and here["threads"] == 1
    assert here["transformers"] == md.version("transformers") and here["torch"] == md.version("torch")
    assert s["platforms"] == [here, {**here, "cpu_capability": "ELSEWHERE"}]

    def train_lines(folder):
        return {r["iteration"]: r for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
                if "reward_mean" in r}

    a, b = train_lines(tmp_path / "full"), train_lines(tmp_path / "part")
    assert sorted(b) == [0, 1, 2]
    for key in ("reward_mean", "loss", "entropy", "episode/tokens", "grad_norm"):
        assert a[2][key] == pytest.approx(b[2][key], rel=1e-5, abs=1e-7), key
    full_summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert full_summary["platforms"] == [here]
    assert s["trainable_param_l2"] == pytest.approx(full_summary["trainable_param_l2"], rel=1e-6)


def test_cli_train_tiny_writes_summary(tmp_path):
    from typer.testing import CliRunner

    from seeupo.cli import app

    res = CliRunner().invoke(app, ["train", "--preset", "tiny", "--out", str(tmp_path), "--steps", "1", *SMALL])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["iterations"] == 1 and "wall_seconds" in s
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "checkpoints" / "latest").exists()
    assert (tmp_path / "tensorboard").exists() is False  # loggers=[jsonl]
    # not a terminal: long stages print plain progress lines (a CI log is never silent)
    assert "[progress] warm-up (supervised steps)" in res.output and "done" in res.output
    # progress lines in the order the stages run: RL's only once RL starts (issue 36)
    assert res.output.index("eval before RL") < res.output.index("[progress] RL")
    bad = CliRunner().invoke(app, ["train", "--preset", "tiny", "algo.nmae=x"])
    assert bad.exit_code == 2 and "Extra inputs" in bad.output


def test_resume_uses_the_new_learning_rate(tmp_path):
    cfg = load_config("tiny", [*SMALL, "run.iterations=1", f"run.out={tmp_path}", "optim.lr=1e-3"])
    Trainer(cfg).run()
    cont = load_config(str(tmp_path / "config.yaml"), ["run.iterations=2", "optim.lr=1e-5"])
    tr = Trainer(cont, resume=True)
    tr.run()
    from seeupo.train.iteration import scheduled_lr

    want = scheduled_lr(1e-5, cont.optim.lr_warmup_iterations, 1)  # the config's lr, on the same ramp
    assert all(abs(g["lr"] - want) < 1e-15 for g in tr.updater.optimizer.param_groups)


@pytest.mark.parametrize("lora", [True, False])
def test_kl_reference_is_the_policy_after_warmup(tmp_path, lora):
    overrides = [*SMALL, "run.iterations=1", f"run.out={tmp_path}", "algo.kl_coef=0.1",
                 f"model.lora={str(lora).lower()}", "algo.name=grpo", "algo.epochs=1", "algo.kl_estimator=k2"]
    tr = Trainer(load_config("tiny", overrides))
    before_warmup = {n: p.detach().clone() for n, p in tr.stack.named_params}
    tr.run()
    lines = map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
    train = [r for r in lines if "reward_mean" in r]
    assert train[0]["kl"] == 0.0  # RL starts at the reference
    ref = tr.updater.reference_state
    assert any(not torch.equal(ref[n], before_warmup[n]) for n in ref)  # the warm-up is in the reference
    assert (tmp_path / "checkpoints" / "iter-000001" / "reference.safetensors").exists()


def test_a_cached_warmup_is_shared_across_algorithms_and_leaves_the_run_unchanged(tmp_path, capsys, one_thread):
    from rich.console import Console

    cache = tmp_path / "cache"

    def run(name, *over):
        cfg = load_config("tiny", [*SMALL, "run.iterations=2", f"run.out={tmp_path / name}", *over])
        Trainer(cfg, console=Console(width=400)).run()
        lines = [{k: v for k, v in json.loads(x).items() if not k.startswith("time/")}
                 for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return lines, json.loads((tmp_path / name / "summary.json").read_text())["trainable_param_l2"]

    run("seeupo", "algo.name=seeupo", f"warmup.cache={cache}")  # trains the warm-up and stores it
    assert len(list(cache.glob("*.pt"))) == 1 and "reused" not in capsys.readouterr().out
    cached = run("grpo-cached", "algo.name=grpo", f"warmup.cache={cache}")
    assert "warm-up: reused" in capsys.readouterr().out
    assert cached == run("grpo", "algo.name=grpo")  # the same run as without the cache, to the bit
    run("seed1", "algo.name=grpo", "run.seed=1", f"warmup.cache={cache}")  # another seed: its own
    assert len(list(cache.glob("*.pt"))) == 2
    run("alpha", "algo.name=grpo", "model.lora_alpha=64", f"warmup.cache={cache}")  # another model config
    assert len(list(cache.glob("*.pt"))) == 3
    # the reused file is what the run starts from: tampered with, the run changes
    f = min(cache.glob("*.pt"), key=lambda p: p.stat().st_mtime)  # seed 0's
    blob = torch.load(f, weights_only=False)
    blob["params"][0] += 0.5
    torch.save(blob, f)
    assert run("tampered", "algo.name=grpo", f"warmup.cache={cache}")[1] != pytest.approx(cached[1], rel=1e-3)
    f.write_bytes(b"not a checkpoint")  # damaged: warned, trained again, the same run
    assert run("damaged", "algo.name=grpo", f"warmup.cache={cache}") == cached
    assert "unreadable" in capsys.readouterr().out


def test_a_cached_warmup_leaves_the_random_states_where_training_it_would(tmp_path):
    # a warm-up that draws from the global generators (dropout would; here a hook on the model's forward):
    # a hit must leave them where the trained warm-up left them, or the RL after it samples other episodes
    import random

    from seeupo.train.warmup import warmup

    t = Trainer(load_config("tiny", [*SMALL, f"run.out={tmp_path / 'run'}"]))
    start = [p.detach().clone() for p in t.stack.params]
    emb = next(m for m in t.stack.learner_model.modules() if isinstance(m, torch.nn.Embedding))
    emb.register_forward_pre_hook(lambda *a: (torch.rand(1), random.random()) and None)

    def once():
        with torch.no_grad():
            for p, v in zip(t.stack.params, start):
                p.copy_(v)
        torch.manual_seed(7)
        random.seed(7)
        warmup(t.stack.learner_model, t.stack.params, t.stack.chat, t.stack.family, t.stack.limits, t.cfg.warmup, seed=0, budget_tokens=4096,
               cache=str(tmp_path / "cache"))
        return torch.rand(3).tolist(), random.random(), [p.detach().clone() for p in t.stack.params]

    trained, reused = once(), once()
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 1  # the second was a hit
    assert trained[:2] == reused[:2]
    assert all(torch.equal(a, b) for a, b in zip(trained[2], reused[2]))


def test_the_evaluations_carry_the_environment_counters(tmp_path):
    """On trap the before/after evaluations record env counters per episode (guess, vault, deep: the
    vault's share of the successes), as training iterations do; deep counts only vault successes, so it
    is at most the success rate and at most the vault rate."""
    cfg = load_config("tiny", [*SMALL, "env.name=trap", "eval.tasks=8", "run.iterations=1", f"run.out={tmp_path}"])
    summary = Trainer(cfg).run()
    for key in ("eval_before", "eval_after"):
        ev = summary[key]
        assert set(ev["env"]) == {"guess", "vault", "deep"}
        assert ev["env"]["guess"] + ev["env"]["vault"] <= 1.0
        assert ev["env"]["deep"] <= min(ev["env"]["vault"], ev["reward_mean"]) + 1e-9
    train = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first = [r for r in train if "reward_mean" in r][0]
    assert "env/deep" in first
    # GiGPO's diagnostic: every episode of a group starts from the task's prompt, so turn 0 always
    # shares its anchor (a group of 2 here); its value lies between turn 0's share and 1
    turns0 = first["turn"]["0"]["rows"]
    all_turns = sum(d["rows"] for d in first["turn"].values())
    assert turns0 / all_turns - 1e-9 <= first["anchors/shared_fraction"] <= 1.0


def test_building_a_lora_run_raises_no_library_warning(tmp_path):
    """The default run's console carries no library deprecation warning (issue 36): building a LoRA
    policy once printed transformers' ``is_gradient_checkpointing`` FutureWarning on every run."""
    import warnings

    cfg = load_config("tiny", [f"run.out={tmp_path}", "model.lora=true"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(cfg)
    shown = [f"{w.category.__name__}: {w.message}" for w in caught
             if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    assert shown == []


@pytest.mark.slow  # the real default model, converted from its GGUF (about 45 s)
def test_converting_the_default_model_shows_no_library_bars(tmp_path, capfd):
    """A fresh machine's first run converts SmolLM2's GGUF once: transformers' own bars (de-quantising,
    loading, writing shards) stay off it, under the run's progress line (issue 36)."""
    from seeupo.models import loading

    target = tmp_path / "smollm2"
    loading._convert_smollm2(target)
    err = capfd.readouterr().err
    assert (target / "model.safetensors").exists()
    assert not any(s in err for s in ("GGUF", "Loading weights", "Writing model shards")), err[-500:]
