"""Shared by the benchmark scripts."""

import json
import sys
from pathlib import Path


def finish(out: dict, script: str, argv, json_path) -> dict:
    """Record the command that produced ``out`` and write it to ``json_path`` (if given)."""
    out["command"] = " ".join(["python", f"benchmarks/{script}", *(argv if argv is not None else sys.argv[1:])])
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(out, indent=1))
    return out


def synthetic_episodes(n_turns: list[int], *, vocab: int, obs_tokens: int = 24, gen_tokens: int = 16,
                       prompt_tokens: int = 64, group_size: int = 4, seed: int = 0):
    """Episodes with the given turn counts and fixed-size turns (random ids, random 0/1 rewards,
    sampling log-probs to be filled in by scoring): for timing the learner, not for learning."""
    import random

    from seeupo.data.episode import Episode

    rng = random.Random(seed)
    out = []
    for i, T in enumerate(n_turns):
        e = Episode(episode_id=i, task_id=f"t{i // group_size}", group=i // group_size, sample=i % group_size, seed=i)
        e.append([rng.randrange(vocab) for _ in range(prompt_tokens)])
        for t in range(T):
            if t:
                e.append([rng.randrange(vocab) for _ in range(obs_tokens)])
            e.append([rng.randrange(vocab) for _ in range(gen_tokens)], turn=t, logp=[0.0] * gen_tokens)
            e.turn_ends.append(len(e.ids))
            e.step_rewards.append(0.0)
        e.step_rewards[-1] = float(rng.random() < 0.5)
        e.end_reason = "done"
        out.append(e)
    return out


def score_sampling_logp(model, episodes, pad_id: int) -> None:
    """Fill each episode's sampling log-probs with the model's own (as if it had sampled them)."""
    from seeupo.data.episode import trajectory_rows
    from seeupo.train.learner import score

    rows = trajectory_rows(episodes, pad_id)
    logp, _ = score(model, rows, temperature=1.0, budget_tokens=4096)
    for i, e in enumerate(episodes):
        e.logp = [float(x) if m else 0.0 for x, m in zip(logp[i, : len(e.ids)].tolist(), e.gen_mask)]


def reset(trainer, init: dict) -> None:
    """Back to the initial parameters, a fresh optimizer state and the initial policy as KL reference."""
    import torch

    with torch.no_grad():
        for n, p in trainer.stack.named_params:
            p.copy_(init[n])
    trainer.updater.optimizer.state.clear()
    trainer.updater.reference_state = {n: v.clone() for n, v in init.items()} if trainer.cfg.algo.kl_coef > 0 else None


def loglog_slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of log y against log x (1: proportional, 2: quadratic)."""
    import math

    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)
