"""From a command line's flags to a config and the objects a command needs: the preset and its
overrides, a run folder's own config (``--resume``, ``--checkpoint``), the checks that need no model,
and the trainer or the policy stack. Every refusal is a ``UsageError``, ``ConfigError`` or
``InputError`` whose message names the fix."""

from __future__ import annotations

from pathlib import Path

from seeupo.errors import UsageError


def build_config(preset: str, overrides=None, *, algo=None, model=None, env=None, out=None, steps=None, seed=None,
                 resume: bool = False, agent=None):
    """The preset (a name or a YAML path) with the flags and the ``key=value`` overrides applied; with
    ``resume``, the config saved in ``out`` instead of the preset."""
    from seeupo.train.config import load_config

    flags = {"algo.name": algo, "model.name": model, "env.name": env, "run.out": out, "run.iterations": steps,
             "run.seed": seed, "rollout.agent": agent}
    if resume:
        if out is None:
            raise UsageError("--resume needs --out DIR (the folder of the run to continue)")
        saved = Path(out) / "config.yaml"
        if not saved.exists():
            raise UsageError(f"--resume: {out} holds no run (no config.yaml); start one there without --resume")
        preset = str(saved)
    return load_config(preset, [*(f"{k}={v}" for k, v in flags.items() if v is not None), *(overrides or [])])


def run_config(folder: str | Path, overrides=None):
    """The config of the run in ``folder`` (its config.yaml), with ``run.out`` pointing at that folder
    wherever the command runs."""
    saved = Path(folder) / "config.yaml"
    if not saved.exists():
        raise UsageError(f"{folder} is not a run folder (no config.yaml); give the --out folder of a `seeupo train` run")
    return build_config(str(saved), [*(overrides or []), f"run.out={folder}"])


def latest_checkpoint(folder: str | Path) -> Path:
    """The run's latest checkpoint; refused when the run stopped before its first one."""
    from seeupo.train import checkpoint as ckpt

    path = ckpt.latest(Path(folder))
    if path is None:
        raise UsageError(f"no checkpoint under {folder}/checkpoints (the run stopped before its first one); "
                         "use a finished run, or resume this one first")
    return path


def preflight(cfg) -> None:
    """The checks that need no model: the environment and its options, the device, whether the model can
    be found offline (``InputError``)."""
    from seeupo.train.stack import check_inputs

    check_inputs(cfg)


def policy(cfg, checkpoint: str | Path | None = None, say=print):
    """The policy stack alone (what scoring, serving or sampling a model needs), with a run's latest
    checkpoint loaded when ``checkpoint`` names its folder."""
    from seeupo.train import checkpoint as ckpt
    from seeupo.train.stack import PolicyStack

    path = latest_checkpoint(checkpoint) if checkpoint else None
    preflight(cfg)
    stack = PolicyStack(cfg)
    if path is not None:
        ckpt.load(path, stack.named_params, None)
        say(f"loaded {path}")
    return stack


def evaluate_run(cfg, checkpoint: str | Path | None, policy_name: str, bar, say=print, out=None) -> tuple:
    """``seeupo eval``: the model (or a run's latest checkpoint, or a scripted policy) on the config's
    split, written to ``out/eval.json`` when ``out`` is given; returns the result and the seconds the
    evaluation took (loading not counted)."""
    import json
    import time

    from seeupo.train.evaluation import SCRIPTED_POLICIES, evaluate

    stack = policy(cfg, checkpoint, say=say)
    try:
        scripted = SCRIPTED_POLICIES[policy_name](stack.chat) if policy_name != "model" else None
        start = time.perf_counter()
        res = evaluate(stack, policy=scripted, tag="eval-cli", detailed=True, bar=bar)
        seconds = time.perf_counter() - start
    finally:
        stack.close()
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        data = {**res.as_dict(), "split": cfg.eval.split, "env": cfg.env.name, "policy": policy_name,
                "model": cfg.model.name, "seconds": seconds}
        (Path(out) / "eval.json").write_text(json.dumps(data, indent=1))
    return res, seconds


def sample_responses(cfg, checkpoint: str | Path, n: int, task_index: int, split: str):
    """``seeupo sample``: ``n`` episodes of one task from a run's latest checkpoint; returns the
    checkpoint, the task, the success rate and a ``Counter`` of the turn-by-turn response sequences."""
    import collections

    import torch

    from seeupo.data.episode import derive_seed
    from seeupo.rollout.runner import run_episodes

    path = latest_checkpoint(checkpoint)
    stack = policy(cfg, checkpoint, say=lambda _: None)
    task = stack.family.tasks(split)[task_index]
    jobs = [(task, 0, s, derive_seed(cfg.run.seed, "sample", s)) for s in range(n)]
    with torch.no_grad():
        eps = run_episodes(stack.sampler, stack.chat, stack.family, jobs, stack.limits)
    success = sum(e.score >= cfg.eval.threshold for e in eps) / n
    return path, task, success, collections.Counter(tuple(e.texts) for e in eps)


def done_line(summary: dict, out) -> str:
    """The line ``seeupo train`` ends with: time, held-out avg@k and pass@k before -> after, files."""
    b, a = summary["eval_before"], summary["eval_after"]
    return (f"done in {summary['wall_seconds']:.0f} s: avg@{a['k']} {b['avg@k']:.3f} -> {a['avg@k']:.3f}, "
            f"pass@{a['k']} {b['pass@k']:.3f} -> {a['pass@k']:.3f} on {a['tasks']} held-out tasks; wrote "
            f"{out}/summary.json, metrics.jsonl, curves.png")
