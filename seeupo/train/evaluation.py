"""Scoring a policy on a task split: avg@k and pass@k (per category too), the environment's
counters, and the episode statistics a run logs (``episode_stats``). Needs only a ``PolicyStack``:
``seeupo eval`` scores a checkpoint without building an optimizer or a training run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from seeupo.core.metrics import avg_at_k, pass_at_k
from seeupo.data.episode import Episode, derive_seed
from seeupo.rollout.runner import Chat, run_episodes
from seeupo.rollout.sampler import ScriptedPolicy
from seeupo.train import parallel


@dataclass
class EvalResult:
    avg: float
    passk: float
    k: int
    tasks: int
    reward_mean: float
    by_category: dict = field(default_factory=dict)  # category -> {"avg@k", "pass@k", "tasks"}
    stats: dict = field(default_factory=dict)  # episode_stats of the evaluation episodes
    env: dict = field(default_factory=dict)  # the environment's counters, mean per episode (trap: guess, vault, deep)

    per_task: dict = field(default_factory=dict)  # task id -> its k samples' successes, e.g. "0110"

    def as_dict(self) -> dict:
        out = {"avg@k": self.avg, "pass@k": self.passk, "k": self.k, "tasks": self.tasks,
               "reward_mean": self.reward_mean}
        if self.per_task:
            out["per_task"] = self.per_task
        if self.env:
            out["env"] = self.env
        if len(self.by_category) > 1 or self.stats:
            out["by_category"] = self.by_category
        if self.stats:
            out["episodes"] = self.stats
        return out

def episode_stats(episodes: list[Episode], threshold: float, counters=()) -> dict:
    """Per-episode means and per-turn rates (``tool/error_rate``: turns with a tool-call error per
    turn, at most 1; ``tool/extra_calls``: calls beyond the one a turn acts on, per turn)."""
    n = max(len(episodes), 1)
    turns = sum(e.n_turns for e in episodes)
    m = {
        "reward_mean": sum(e.reward for e in episodes) / n,
        "reward_std": float(torch.tensor([e.reward for e in episodes]).std()) if len(episodes) > 1 else 0.0,
        "success_rate": sum(e.score >= threshold for e in episodes) / n,
        "episode/turns": turns / n,
        "episode/tokens": sum(len(e.ids) for e in episodes) / n,
        "episode/generated_tokens": sum(sum(e.gen_mask) for e in episodes) / n,
        "tool/error_rate": sum(e.tool_errors for e in episodes) / max(turns, 1),
        "tool/extra_calls": sum(e.extra_calls for e in episodes) / max(turns, 1),
        "rollout/truncated_turns": sum(e.truncated_turns for e in episodes),
        "rollout/prefix_mismatches": sum(e.prefix_mismatches for e in episodes),
    }
    for name in sorted({*counters, *(k for e in episodes for k in e.counts)}):  # environment counters, per episode
        m[f"env/{name}"] = sum(e.counts.get(name, 0) for e in episodes) / n
    for reason in ("done", "max_turns", "context", "error", "timeout"):
        m[f"episode/end_{reason}"] = sum(e.end_reason == reason for e in episodes) / n
    for reason in ("no_call", "refused"):  # agent programs' own (seeupo.rollout.agent): only when seen
        if any(e.end_reason == reason for e in episodes):
            m[f"episode/end_{reason}"] = sum(e.end_reason == reason for e in episodes) / n
    return m

def stage(bar, description: str, total: int, stop=None):
    """A progress callback ``(done, total)`` for a long stage on the rich ``Progress`` ``bar`` (None: no
    bar; the callback still calls ``stop``, which may raise at a safe point), and a function that
    closes it."""
    if bar is None:
        return (lambda *a: stop()) if stop else None, lambda: None
    task = bar.add_task(description, total=total)

    def tick(done, tot=None):
        bar.update(task, completed=done)
        if stop:
            stop()
    return tick, (lambda: bar.remove_task(task))


def evaluate(stack, *, policy=None, tag: str = "eval", detailed: bool = False, stop=None, bar=None) -> EvalResult:
    """avg@k and pass@k of ``stack``'s policy (or the scripted ``policy``) on the config's held-out
    split (``eval.split``, its first ``eval.tasks`` tasks, ``eval.k`` samples each at
    ``eval.temperature``), per category too; ``detailed`` adds the episode statistics (tool errors, end
    reasons) of the evaluation episodes. ``stop()`` is called after every turn (it may raise to
    abandon the evaluation); ``bar``: a rich ``Progress`` to show it on."""
    cfg = stack.cfg
    sampler = stack.sampler
    tasks = stack.family.tasks(cfg.eval.split)[: cfg.eval.tasks]
    jobs = [(t, i, s, derive_seed(cfg.run.seed, tag, t.id, s)) for i, t in enumerate(tasks) for s in range(cfg.eval.k)]
    if policy is None:
        policy = sampler
        old_t = sampler.temperature
        sampler.temperature = cfg.eval.temperature or cfg.rollout.temperature
    mine = parallel.mine(jobs)
    if policy is sampler:
        stack.sync_sampler()
    tick, close = stage(bar, f"{tag} ({len(tasks)} tasks x {cfg.eval.k})", len(mine), stop)
    size = cfg.eval.batch_episodes or len(mine) or 1
    try:
        episodes = []
        with torch.no_grad(), parallel.gathered(stack.scorer):
            for start in range(0, len(mine), size):  # at most batch_episodes live at once (memory, speed)
                chunk = mine[start:start + size]
                on = (lambda done, *a, _s=start: tick(_s + done)) if tick else None
                if policy is sampler:
                    episodes += stack.rollout(chunk, on_progress=on)
                else:
                    episodes += run_episodes(policy, stack.chat, stack.family, chunk, stack.limits, on_progress=on)
        episodes = parallel.gather_ordered(episodes, len(jobs))
    finally:
        close()
        if policy is sampler:
            sampler.temperature = old_t
    success = torch.tensor([e.score >= cfg.eval.threshold for e in episodes], dtype=torch.float32)
    success = success.view(len(tasks), cfg.eval.k)
    categories: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        categories.setdefault(str(t.data.get("category", cfg.env.name)), []).append(i)
    by_category = {c: {"avg@k": avg_at_k(success[idx]), "pass@k": pass_at_k(success[idx]), "tasks": len(idx)}
                   for c, idx in categories.items()}
    counters = getattr(stack.family, "counters", ())
    env = {name: sum(e.counts.get(name, 0) for e in episodes) / max(len(episodes), 1)
           for name in sorted({*counters, *(k for e in episodes for k in e.counts)})}
    per_task = {t.id: "".join(str(int(v)) for v in success[i].tolist()) for i, t in enumerate(tasks)}
    return EvalResult(avg_at_k(success), pass_at_k(success), cfg.eval.k, len(tasks),
                      sum(e.reward for e in episodes) / max(len(episodes), 1), by_category,
                      episode_stats(episodes, cfg.eval.threshold, counters) if detailed else {}, env, per_task)


def cache_key(stack) -> str:
    """A hash of everything an evaluation of ``stack``'s policy depends on: the model's every tensor and
    the packages that compute with it (``warmup.hash_model``), the settings of the environment, the
    evaluation, the sampler and the run's seed, the CPU's kernel level and thread count, and the source
    of the code that samples, scores and runs the environment. Two arms of a sweep whose warm-ups left
    the same model share their evaluation before RL (``eval.cache``)."""
    import hashlib
    import inspect
    import json
    import sys

    from seeupo.models import policy
    from seeupo.rollout import runner, sampler
    from seeupo.train.warmup import hash_add, hash_model

    cfg = stack.cfg
    h = hashlib.sha256()
    hash_model(h, stack.model, stack.params)
    settings = {"model": cfg.model.model_dump(mode="json"), "env": cfg.env.model_dump(mode="json"),
                "eval": cfg.eval.model_dump(mode="json", exclude={"cache", "every"}),
                "rollout": cfg.rollout.model_dump(mode="json"), "seed": cfg.run.seed, "device": cfg.run.device}
    hash_add(h, json.dumps(settings, sort_keys=True, default=repr))
    hash_add(h, (torch.backends.cpu.get_cpu_capability(), torch.get_num_threads()))
    for mod in (sys.modules[__name__], policy, runner, sampler, sys.modules[type(stack.family).__module__]):
        hash_add(h, inspect.getsource(mod))
    return h.hexdigest()[:32]


def load_cached(path, say=None) -> dict | None:
    """A cached evaluation (``EvalResult.as_dict``) at ``path``, or None when there is none or it cannot
    be read (then the evaluation runs and writes it again)."""
    import json
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not {"avg@k", "pass@k", "k", "tasks"} <= set(data):
            raise ValueError("not an evaluation's record")
        return data
    except (OSError, ValueError) as e:  # a damaged cache file costs an evaluation, never the run
        if say:
            say(f"[yellow]evaluation cache {path} unreadable ({type(e).__name__}: {e}); evaluating again[/]")
        return None


def oracle_policy(chat: Chat) -> ScriptedPolicy:
    """The environment's reference answers (``env.oracle_action()``), for validating adapters."""
    return ScriptedPolicy(lambda env, rng: env.oracle_action(), chat.encode, chat.eos_id)


def empty_policy(chat: Chat) -> ScriptedPolicy:
    """Replies with nothing: the floor every environment's checker must score 0."""
    return ScriptedPolicy(lambda env, rng: "", chat.encode, chat.eos_id)


SCRIPTED_POLICIES = {"oracle": oracle_policy, "empty": empty_policy}


def result_table(res, title: str):
    """An evaluation's avg@k and pass@k per task category (and over all, with several) as a terminal table."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("category", "tasks", f"avg@{res.k}", f"pass@{res.k}"):
        t.add_column(col)
    rows = list(res.by_category.items())
    if len(rows) > 1:
        rows.append(("all", {"tasks": res.tasks, "avg@k": res.avg, "pass@k": res.passk}))
    for name, r in rows:
        t.add_row(name, str(r["tasks"]), f"{r['avg@k']:.3f}", f"{r['pass@k']:.3f}")
    return t


def summary_line(res, seconds: float) -> str:
    """avg@k, pass@k and the per-episode counts of an evaluation, on one line."""
    st, k = res.stats, res.k
    return (f"avg@{k} {res.avg:.3f}  pass@{k} {res.passk:.3f}  ({res.tasks} tasks x {k}, {seconds:.0f} s); per "
            f"episode: {st['episode/turns']:.1f} model calls, tool-call error rate {st['tool/error_rate']:.2f}, ended "
            f"by context {st['episode/end_context']:.2f}, by max_turns {st['episode/end_max_turns']:.2f}")
