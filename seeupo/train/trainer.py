"""The training loop: rollout -> rewards -> advantages (core) -> rows -> update in the schedule's
order -> metrics, evaluation, checkpoint. One process; written for ``accelerate`` later.

Determinism: every episode's seed is derived from (run seed, iteration, task, sample), task choice
and minibatch shuffles from (run seed, iteration), so a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import torch
import yaml

from seeupo.core.advantages import gae, gae_by_episode, grae, shared_anchor_fraction, turn_advantages, turn_gae
from seeupo.core.algorithms import CRITIC_ESTIMATORS, carries_factor, get_algorithm
from seeupo.core.metrics import avg_at_k, pass_at_k
from seeupo.core.schedule import kept_turn
from seeupo.data.episode import Episode, derive_seed, trajectory_rows, turn_rows
from seeupo.envs.base import make_family
from seeupo.models.loading import DEFAULT_MODEL, ModelNotAvailable, load_model
from seeupo.models.policy import Scorer, ValueHead, apply_lora
from seeupo.models.turns import add_turn_adapters
from seeupo.rollout.runner import Chat, RolloutLimits, run_episodes
from seeupo.rollout.sampler import HFSampler, ScriptedPolicy
from seeupo.train import checkpoint, memory, parallel
from seeupo.train.config import Config, resolved_dump, save_config
from seeupo.train.learner import LossSpec, adamw, score, swapped
from seeupo.train.runlog import NullLog, RunLog, dumps, platform_info, plot_curves, read_metrics
from seeupo.train.update import UpdateContext, joint_update, sequential_update
from seeupo.train.warmup import warmup


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

    def as_dict(self) -> dict:
        out = {"avg@k": self.avg, "pass@k": self.passk, "k": self.k, "tasks": self.tasks,
               "reward_mean": self.reward_mean}
        if self.env:
            out["env"] = self.env
        if len(self.by_category) > 1 or self.stats:
            out["by_category"] = self.by_category
        if self.stats:
            out["episodes"] = self.stats
        return out


def keep_turns(rows, *, n_turns: list[int], spec: str):
    """The rows as ``algo.update_turns`` trains them: turn rows of frozen turns dropped, and on
    trajectory rows (turn -1) the tokens of frozen turns out of the loss mask."""
    if spec == "all":
        return rows
    if bool((rows.turn >= 0).all()):
        idx = [i for i, (t, e) in enumerate(zip(rows.turn.tolist(), rows.episode.tolist()))
               if kept_turn(t, n_turns[e], spec)]
        return rows.select(torch.tensor(idx, dtype=torch.long))
    mask = torch.tensor([[kept_turn(t, n_turns[int(e)], spec) if t >= 0 else False for t in row]
                         for row, e in zip(rows.token_turn.tolist(), rows.episode)], dtype=rows.loss_mask.dtype)
    return replace(rows, loss_mask=rows.loss_mask * mask)


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


def _shared_anchors(episodes: list[Episode], groups: torch.Tensor) -> float:
    """The fraction of the iteration's turns whose anchor state another turn of the same group shares
    (GiGPO's step-group diagnostic, ``core.advantages.shared_anchor_fraction``)."""
    width = max((len(e.anchors) for e in episodes), default=0)
    if not width:  # episodes without anchor records (not from the runner): unknown, not "none shared"
        return float("nan")
    keys = torch.zeros(len(episodes), width, dtype=torch.long)
    mask = torch.zeros(len(episodes), width, dtype=torch.long)
    for i, e in enumerate(episodes):
        keys[i, :len(e.anchors)] = torch.tensor(e.anchors, dtype=torch.long)
        mask[i, :len(e.anchors)] = 1
    return shared_anchor_fraction(groups, keys, mask)


def _turn_tables(episodes: list[Episode]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[N, T]`` step rewards, anchor keys and reached mask of the episodes (T: the longest), from
    each episode's first turn."""
    width = max((e.n_turns for e in episodes), default=0)
    step = torch.zeros(len(episodes), width)
    anchors = torch.zeros(len(episodes), width, dtype=torch.long)
    mask = torch.zeros(len(episodes), width, dtype=torch.long)
    for i, e in enumerate(episodes):
        n = e.n_turns
        mask[i, :n] = 1
        r = e.step_rewards[:n]
        step[i, :len(r)] = torch.tensor(r, dtype=torch.float32)
        a = e.anchors[:n]
        if len(a) < n:  # episodes without anchor records (not from the runner): each turn its own state
            a = list(a) + [hash((i, t)) for t in range(len(a), n)]
        anchors[i, :n] = torch.tensor([int(x) % (2**62) for x in a], dtype=torch.long)
    return step, anchors, mask


def _aligned(adv_NT: torch.Tensor, episodes: list[Episode], alignment: str, width: int) -> torch.Tensor:
    """``[N, width]`` per-turn advantages indexed as the turn pools label turns (``from_end``: 0 is each
    episode's last turn); 0 beyond an episode's turns (the authors' placeholders train no policy loss)."""
    out = torch.zeros(adv_NT.shape[0], max(width, adv_NT.shape[1]), dtype=adv_NT.dtype)
    for i, e in enumerate(episodes):
        n = e.n_turns
        out[i, :n] = adv_NT[i, :n] if alignment == "from_start" else adv_NT[i, :n].flip(0)
    return out


def _advantage_sizes(adv: torch.Tensor) -> dict:
    return {"advantage_abs_mean": float(adv.abs().mean()) if adv.numel() else 0.0,
            "advantage_abs_max": float(adv.abs().max()) if adv.numel() else 0.0}


def _groups_with_signal(rewards: torch.Tensor, groups: torch.Tensor) -> float:
    """Share of groups whose episodes do not all have the same reward (only those carry a GRAE signal)."""
    ids = groups.unique()
    return sum(bool(rewards[groups == g].std() > 0) if (groups == g).sum() > 1 else False for g in ids) / max(len(ids), 1)


def schedule_line(sched) -> str:
    """One line stating an update schedule, printed at the start of every run."""
    d = sched.as_dict()
    mb = "one per turn index present (SeeUPO's phase count)" if d["minibatches"] == "turns" else d["minibatches"]
    return (f"{d['epochs']} epoch(s) x minibatches {mb} per phase, clip [1 - {d['clip_eps']:g}, "
            f"1 + {d['clip_eps_high']:g}]")


def _mean_steps(records: list[dict]) -> float | None:
    """Mean ``optimizer_steps`` over the iterations in ``metrics.jsonl`` (the measured schedule)."""
    steps = [r["optimizer_steps"] for r in records if "reward_mean" in r and "optimizer_steps" in r]
    return sum(steps) / len(steps) if steps else None


def scheduled_lr(lr: float, warmup_iterations: int, it: int) -> float:
    """``lr`` ramped linearly over the first ``warmup_iterations`` iterations: a function of the
    iteration only, so a resumed run continues the same schedule.

    >>> [scheduled_lr(1.0, 4, i) for i in range(5)]
    [0.25, 0.5, 0.75, 1.0, 1.0]
    """
    return lr * (min(1.0, (it + 1) / warmup_iterations) if warmup_iterations else 1.0)


def health_warnings(record: dict) -> list[str]:
    """Early signs of collapse (USERS.md #3), printed as they happen and kept in metrics.jsonl."""
    out = []
    if record.get("entropy", 1.0) < 0.02:
        out.append(f"entropy {record['entropy']:.4f}: the policy is close to deterministic")
    if record.get("tool/error_rate", 0.0) > 0.5:
        out.append(f"tool-call error rate {record['tool/error_rate']:.2f}: the call format is breaking down")
    if record.get("groups_with_signal", 1.0) == 0.0:
        out.append("no group has reward variance: this iteration carried no learning signal")
    return out


class InputError(ValueError):
    """A run's input that cannot work (environment, its options, device, model), with the fix."""


def build_family(cfg: Config):
    """The run's environment family; ``InputError`` (one line) for an unknown name or bad options.
    ``EnvUnavailable`` (a missing package, with install steps) passes through as an ``InputError``."""
    from pydantic import ValidationError

    from seeupo.envs.base import ENVS, EnvUnavailable

    try:
        return make_family(cfg.env.name, cfg.env.options)
    except ValidationError as e:
        detail = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}" for err in e.errors())
        raise InputError(f"env.options for {cfg.env.name}: {detail} (see docs/envs.md for its options)") from None
    except EnvUnavailable as e:
        raise InputError(str(e)) from None
    except (ValueError, TypeError) as e:
        if cfg.env.name not in ENVS:
            raise InputError(f"--env {cfg.env.name!r} is not an environment; available: {', '.join(sorted(ENVS))}") from None
        raise InputError(f"env {cfg.env.name} with options {cfg.env.options}: {e}") from None


def check_device(cfg: Config) -> None:
    if cfg.run.device == "cuda" and not torch.cuda.is_available():
        raise InputError("run.device=cuda but torch sees no GPU (torch.cuda.is_available() is False); "
                         "use run.device=auto or cpu")


def check_inputs(cfg: Config) -> None:
    """What a run needs that the config's types cannot check, before anything heavy loads: the
    environment and its options, the device, the model found offline. ``InputError`` with the fix."""
    from seeupo.models.loading import ModelNotAvailable, check_model

    build_family(cfg)
    if cfg.env.name == "jsonl" and not cfg.rollout.agent:
        raise InputError("env jsonl holds tasks only: run it with an agent program (--agent FILE.py:FUNCTION)")
    if cfg.env.name == "jsonl" and cfg.warmup.enabled == "on":
        raise InputError("env jsonl has no demonstrations for the warm-up: set warmup.enabled=off")
    check_device(cfg)
    try:
        check_model(cfg.model.name)
    except ModelNotAvailable as e:
        raise InputError(str(e)) from None


class Trainer:
    def __init__(self, cfg: Config, *, resume: bool = False, overwrite: bool = False, console=None, bar=None):
        """``bar``: a rich ``Progress`` for the long stages (warm-up, evaluation), or None.
        ``resume``: continue the run in ``run.out`` from its latest checkpoint; ``overwrite``: replace
        the run there (otherwise a folder holding a run is refused with ``checkpoint.RunExists``).
        Nothing is written until ``run()``."""
        parallel.init(cfg.parallel.strategy)
        main = parallel.is_main()  # only the main process prints, writes files and shows progress
        self.cfg, self.resume, self.overwrite = cfg, resume, overwrite
        self.console, self.bar = (console, bar) if main else (None, None)
        self.out = Path(cfg.run.out)
        self.algo = get_algorithm(cfg.algo.name)
        # cheap checks first: the environment (its options) and the device, then the model
        self.family = build_family(cfg)
        check_device(cfg)
        self.device = parallel.device(cfg.run.device)
        dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
        try:
            lm = load_model(cfg.model.name, seed=cfg.run.seed, dtype=dtype)
        except ModelNotAvailable as e:
            raise InputError(str(e)) from None
        self.tokenizer = lm.tokenizer
        model = lm.model.to(self.device)
        if cfg.model.lora or cfg.model.turn_adapters != "shared":
            model = apply_lora(model, r=cfg.model.lora_r, alpha=cfg.model.lora_alpha, seed=cfg.run.seed)
            if not cfg.model.lora:  # full fine-tuning of the shared base, turn adapters on top
                for p in model.get_base_model().parameters():
                    p.requires_grad_(True)
        self.turn_adapters = add_turn_adapters(model, cfg.model.turn_adapters, cfg.rollout.max_turns,
                                               seed=cfg.run.seed, embedding=cfg.model.turn_embedding)
        model.seeupo_turn_adapters = self.turn_adapters  # the learner splits rows by slot (learner.adapter)
        self.model = model
        # KL reference: the trainable tensors at the start of RL (after the warm-up), swapped in to score
        self.reference_state: dict[str, torch.Tensor] | None = None
        self.value_head = None
        if self.algo.estimator in CRITIC_ESTIMATORS:
            self.value_head = ValueHead(model.config.hidden_size).to(self.device)
        # the module the learner runs: the model itself, or with FSDP2 the sharded Scorer around it
        self.scorer = parallel.shard(Scorer(model, self.value_head)) if parallel.sharded() else None
        self.learner_model = self.scorer if self.scorer is not None else model
        self.named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if self.value_head is not None:
            self.named_params += [(f"value_head.{n}", p) for n, p in self.value_head.named_parameters()]
        self.params = [p for _, p in self.named_params]
        self._optimizer = None  # built on first use: scoring a checkpoint (seeupo eval, serve, sample) needs none
        self.chat = Chat(self.tokenizer)
        self.limits = RolloutLimits(cfg.rollout.max_turns, cfg.rollout.max_new_tokens, cfg.rollout.max_context,
                                    env_timeout_s=cfg.env.timeout_s, history=cfg.rollout.history_k())
        self._weights_version = 0  # bumped whenever the learner changes the weights (the vLLM engine follows)
        if cfg.rollout.backend == "vllm":
            self.sampler = self._vllm_sampler()
            self.sampler.turn_adapters = self.turn_adapters
        else:
            self.sampler = HFSampler(model, pad_id=self.tokenizer.pad_token_id, eos_ids=[self.chat.eos_id],
                                     temperature=cfg.rollout.temperature, batch_size=cfg.rollout.batch_size,
                                     prefix_cache=cfg.rollout.prefix_cache)
            self.sampler.turn_adapters = self.turn_adapters
        self.agent = self._agent_source() if cfg.rollout.agent else None
        self.memory = self._plan_memory()
        self.state: dict = {}
        self._signals = _Signals(self._say)  # replaced by the run's own (installed) one
        self._log = NullLog()

    def _plan_memory(self) -> memory.Plan | None:
        """Fit the micro-batch budget into ``run.max_memory_gb`` (a CPU run in one process: a GPU's
        memory and other processes' are not this process's resident memory)."""
        cfg = self.cfg
        if self.device.type != "cpu" or parallel.world() > 1:
            return None
        try:
            plan = memory.plan(cfg.run.max_memory_gb, self.model, micro_batch_tokens=cfg.optim.micro_batch_tokens,
                               trainable_bytes=sum(p.numel() * p.element_size() for p in self.params),
                               kl_reference=cfg.algo.kl_coef > 0)
        except memory.DoesNotFit as e:
            raise InputError(str(e)) from None
        if plan.lowered_from:
            cfg.optim.micro_batch_tokens = plan.micro_batch_tokens
            self._say(f"[yellow]{plan.line()}[/]")
        return plan

    def _vllm_sampler(self):
        from seeupo.models.loading import resolve
        from seeupo.rollout.vllm_backend import VLLMSampler

        cfg = self.cfg
        if parallel.world() > 1:
            raise ValueError("rollout.backend=vllm runs in one process for now (docs/scale.md); "
                             "use the hf backend with torchrun / accelerate launch")
        base = None
        if cfg.model.lora:  # the engine loads the base model itself and gets the adapters after each update
            base = resolve(cfg.model.name)
            if not Path(base).is_dir() and "/" in base:  # a hub name: its snapshot folder (the cache's, else fetched)
                try:
                    from huggingface_hub import snapshot_download

                    base = snapshot_download(base)
                except Exception:  # noqa: BLE001 (the error below says what is needed)
                    pass
            if not Path(base).is_dir():
                raise ValueError(f"rollout.backend=vllm with LoRA needs the base model in a local folder (or a hub "
                                 f"name it can download); {cfg.model.name!r} is neither (tiny models: model.lora=false)")
        return VLLMSampler(self.model, self.tokenizer, base_dir=base, workdir=self.out / "vllm",
                           eos_ids=[self.chat.eos_id], temperature=cfg.rollout.temperature,
                           max_model_len=cfg.rollout.max_context, python=cfg.rollout.vllm_python,
                           seed=cfg.run.seed, lora_rank=cfg.model.lora_r if cfg.model.lora else None,
                           memory_utilization=cfg.rollout.vllm_memory_utilization)

    @property
    def optimizer(self):
        """AdamW over the trainable parameters, built when the run first needs it (an update, a checkpoint
        written or resumed), so that a command that only scores a checkpoint allocates no optimizer state."""
        if self._optimizer is None:
            self._optimizer = adamw(self.params, self.cfg.optim.lr, self.cfg.optim.weight_decay)
        return self._optimizer

    def _agent_source(self):
        """``rollout.agent``: the agent program and the endpoint its client talks to (started on first use)."""
        from seeupo.rollout.agent import AgentError, AgentSource, load_agent
        from seeupo.serve.engine import ChatEngine

        cfg = self.cfg
        if parallel.world() > 1:
            raise InputError("rollout.agent runs in one process for now; launch without torchrun / accelerate")
        try:
            fn = load_agent(cfg.rollout.agent)
        except AgentError as e:
            raise InputError(str(e)) from None
        engine = ChatEngine(self.sampler, self.chat, model_name=cfg.model.name, parser=cfg.serve.parser,
                            tool_role=cfg.serve.tool_role, max_context=cfg.rollout.max_context,
                            max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                            max_calls=cfg.rollout.max_turns, max_wait_s=cfg.serve.max_wait_ms / 1000)
        return AgentSource(fn, engine, timeout_s=cfg.serve.agent_timeout_s, concurrency=cfg.rollout.batch_size)

    def _rollout(self, jobs, *, on_progress=None) -> list[Episode]:
        """Episodes of ``jobs`` from the rollout source: the agent program, or the built-in runner."""
        if self.agent is not None:
            self.agent.engine.temperature = self.sampler.temperature
            return self.agent.run(jobs, on_progress=on_progress)
        return run_episodes(self.sampler, self.chat, self.family, jobs, self.limits, on_progress=on_progress)

    def _weights_changed(self) -> None:
        self._weights_version += 1

    def _sync_sampler(self) -> None:
        if hasattr(self.sampler, "sync"):
            self.sampler.sync(self._weights_version)

    def close(self) -> None:
        if getattr(self, "agent", None) is not None:
            self.agent.close()
        if hasattr(self.sampler, "close"):
            self.sampler.close()

    # ----------------------------------------------------------------- helpers
    def _say(self, msg: str) -> None:
        if self.console:
            self.console.print(msg)

    def warmup_enabled(self) -> bool:
        w = self.cfg.warmup.enabled
        if self.cfg.env.name == "jsonl":  # tasks without an environment: nothing to demonstrate
            return False
        return w == "on" or (w == "auto" and self.cfg.model.name == DEFAULT_MODEL)

    def _stage(self, description: str, total: int, stop=None):
        """A progress callback ``(done, total)`` for a long stage (it also calls ``stop``, which may
        raise at a safe point), and a function that closes it."""
        if self.bar is None:
            return (lambda *a: stop()) if stop else None, lambda: None
        task = self.bar.add_task(description, total=total)

        def tick(done, tot=None):
            self.bar.update(task, completed=done)
            if stop:
                stop()
        return tick, (lambda: self.bar.remove_task(task))

    def evaluate(self, *, policy=None, tag: str = "eval", detailed: bool = False, stop=None) -> EvalResult:
        """avg@k and pass@k on the held-out split (per category too); ``detailed`` adds the
        episode statistics (tool errors, end reasons) of the evaluation episodes. ``stop()`` is
        called after every turn (it may raise to abandon the evaluation)."""
        cfg = self.cfg
        tasks = self.family.tasks(cfg.eval.split)[: cfg.eval.tasks]
        jobs = [(t, i, s, derive_seed(cfg.run.seed, tag, t.id, s)) for i, t in enumerate(tasks) for s in range(cfg.eval.k)]
        if policy is None:
            policy = self.sampler
            old_t = self.sampler.temperature
            self.sampler.temperature = cfg.eval.temperature or cfg.rollout.temperature
        mine = parallel.mine(jobs)
        if policy is self.sampler:
            self._sync_sampler()
        tick, close = self._stage(f"{tag} ({len(tasks)} tasks x {cfg.eval.k})", len(mine), stop)
        try:
            with torch.no_grad(), parallel.gathered(self.scorer):
                if policy is self.sampler:
                    episodes = self._rollout(mine, on_progress=tick)
                else:
                    episodes = run_episodes(policy, self.chat, self.family, mine, self.limits, on_progress=tick)
            episodes = parallel.gather_ordered(episodes, len(jobs))
        finally:
            close()
            if policy is self.sampler:
                self.sampler.temperature = old_t
        success = torch.tensor([e.score >= cfg.eval.threshold for e in episodes], dtype=torch.float32)
        success = success.view(len(tasks), cfg.eval.k)
        categories: dict[str, list[int]] = {}
        for i, t in enumerate(tasks):
            categories.setdefault(str(t.data.get("category", cfg.env.name)), []).append(i)
        by_category = {c: {"avg@k": avg_at_k(success[idx]), "pass@k": pass_at_k(success[idx]), "tasks": len(idx)}
                       for c, idx in categories.items()}
        counters = getattr(self.family, "counters", ())
        env = {name: sum(e.counts.get(name, 0) for e in episodes) / max(len(episodes), 1)
               for name in sorted({*counters, *(k for e in episodes for k in e.counts)})}
        return EvalResult(avg_at_k(success), pass_at_k(success), cfg.eval.k, len(tasks),
                          sum(e.reward for e in episodes) / max(len(episodes), 1), by_category,
                          episode_stats(episodes, cfg.eval.threshold, counters) if detailed else {}, env)

    def _episodes(self, iteration: int) -> list[Episode]:
        cfg = self.cfg
        pool = self.family.tasks("train")
        rng = random.Random(derive_seed(cfg.run.seed, "tasks", iteration))
        chosen = rng.sample(pool, min(cfg.rollout.tasks_per_iteration, len(pool)))
        jobs = [(t, b, g, derive_seed(cfg.run.seed, "episode", iteration, t.id, g))
                for b, t in enumerate(chosen) for g in range(cfg.rollout.group_size)]
        self._sync_sampler()
        with torch.no_grad(), parallel.gathered(self.scorer):  # each process runs its share; all get all
            local = self._rollout(parallel.mine(jobs), on_progress=self._stopper())  # a stop before the update loses nothing
        return parallel.gather_ordered(local, len(jobs))

    def _reference_logp(self, rows):
        with swapped(self.named_params, self.reference_state):
            logp, _ = score(self.learner_model, rows, temperature=self.cfg.rollout.temperature,
                            budget_tokens=self.cfg.optim.micro_batch_tokens, pack=self.cfg.optim.pack_width,
                            share=self.cfg.optim.share_prefix)
        return logp

    def _loss_spec(self) -> LossSpec:
        a, sched = self.cfg.algo, self.schedule
        return LossSpec(self.algo.loss, clip_eps=sched.clip_eps, clip_eps_high=sched.clip_eps_high, kl_coef=a.kl_coef,
                        kl_estimator=a.kl_estimator, vf_coef=a.vf_coef, temperature=self.cfg.rollout.temperature)

    @property
    def schedule(self):
        """The running algorithm's effective update schedule (``core.algorithms.Schedule``)."""
        return self.cfg.algo.schedule()

    # ----------------------------------------------------------------- one iteration
    def iteration(self, it: int) -> dict:
        t0 = time.perf_counter()
        episodes = self._episodes(it)
        memory.trim()  # the sampler's caches and batches, freed: their pages go back before the update
        t_roll = time.perf_counter() - t0
        lr = scheduled_lr(self.cfg.optim.lr, self.cfg.optim.lr_warmup_iterations, it)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        record = self.update(episodes, it)
        memory.trim()  # the update's activations
        self._weights_changed()
        record.update({"lr": lr, "time/rollout_s": t_roll, "time/update_s": time.perf_counter() - t0 - t_roll})
        return record

    def update(self, episodes: list[Episode], it: int) -> dict:
        """The learner's part of iteration ``it`` on ``episodes`` (advantages, the algorithm's
        phases and optimizer steps); returns the iteration's record without timings. Episodes that
        their environment ended (a crash or a timeout) are counted and left out of the loss and the
        group baselines: they say nothing about the policy."""
        stats = episode_stats(episodes, self.cfg.eval.threshold, getattr(self.family, "counters", ()))
        faulted = [e for e in episodes if e.faulted]
        for e in faulted[:3]:
            self._say(f"[yellow]iteration {it}: episode of task {e.task_id} ended by its environment "
                      f"({e.end_reason}: {e.error[:200]}); left out of the update[/]")
        episodes = [e for e in episodes if not e.faulted]
        if not episodes:
            self._say(f"[yellow]iteration {it}: every episode was ended by its environment; no update[/]")
            return {"iteration": it, **stats, "optimizer_steps": 0, "nonfinite_skips": 0,
                    "episodes_excluded": len(faulted), "turn": {}}
        record = self._update(episodes, it)
        record.update(stats)
        record["episodes_excluded"] = len(faulted)
        return record

    def _update(self, episodes: list[Episode], it: int) -> dict:
        cfg, algo, sched = self.cfg, self.algo, self.schedule
        rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float32)
        groups = torch.tensor([e.group for e in episodes])
        pad = self.tokenizer.pad_token_id
        # turn indices present (either alignment): SeeUPO's phase count, which minibatches="turns" matches;
        # with the authors' placeholders SeeUPO runs every index up to rollout.max_turns
        n_turns = cfg.rollout.max_turns if cfg.algo.placeholders else max((e.n_turns for e in episodes), default=0)
        ctx = UpdateContext(self.learner_model, self.optimizer, self.params, self._loss_spec(), cfg.optim.micro_batch_tokens,
                            cfg.optim.grad_clip, sched.epochs, sched.steps_per_pass(n_turns),
                            torch.Generator().manual_seed(derive_seed(cfg.run.seed, "update", it)), self.value_head,
                            self._reference_logp, pack=cfg.optim.pack_width, share=cfg.optim.share_prefix)
        self.model.train()
        per_turn: dict = {}
        keep = partial(keep_turns, n_turns=[e.n_turns for e in episodes], spec=cfg.algo.update_turns)
        est = cfg.algo.effective_estimator()
        gamma, lam = cfg.algo.estimator_param("gamma"), cfg.algo.estimator_param("lam")
        adv_NT = None  # [N, T] per-turn advantages (turn-level estimators), from each episode's first turn
        if est == "gae":
            # bounded turn contexts: one row per turn, GAE over each episode's action tokens across its rows
            segmented = any(e.segmented for e in episodes)
            rows = keep(turn_rows(episodes, pad) if segmented else trajectory_rows(episodes, pad))
            _, old_values = score(self.learner_model, rows, temperature=cfg.rollout.temperature,
                                  budget_tokens=cfg.optim.micro_batch_tokens, value_head=self.value_head,
                                  pack=cfg.optim.pack_width, share=cfg.optim.share_prefix)
            if segmented:  # each turn row's reward (on its last action token, by gae_by_episode)
                r_row = torch.tensor([episodes[e_i].step_rewards[t] if t < len(episodes[e_i].step_rewards) else 0.0
                                      for e_i, t in zip(rows.episode.tolist(), rows.turn.tolist())])
                adv_tok, returns = gae_by_episode(r_row, old_values, rows.loss_mask, rows.episode, rows.turn,
                                                  gamma=gamma, lam=lam)
            else:
                r_tok = torch.zeros(rows.input_ids.shape)
                for i, e in enumerate(episodes):
                    for t, end in enumerate(e.turn_ends):
                        if t < len(e.step_rewards):
                            r_tok[i, end - 1] += e.step_rewards[t]
                adv_tok, returns = gae(r_tok, old_values, rows.loss_mask, gamma=gamma, lam=lam)
            adv_E = grae(rewards, groups, norm="none")  # for diagnostics only
            metrics = joint_update(ctx, rows, adv_tok, returns=returns, old_values=old_values)
        elif est == "turn_gae":
            rows, adv_NT, metrics = self._turn_ppo(ctx, episodes, pad, gamma=gamma, lam=lam)
            adv_E = grae(rewards, groups, norm="none")  # for diagnostics only
        else:
            norm = cfg.algo.norm or algo.norm
            adv_E = grae(rewards, groups, norm=norm, leave_one_out=algo.leave_one_out)
            if est != "grae":
                step_NT, anchors_NT, mask_NT = _turn_tables(episodes)
                adv_NT = turn_advantages(est, rewards, groups, step_NT, mask_NT, anchor_keys_NT=anchors_NT, norm=norm,
                                         gamma=gamma, step_weight=cfg.algo.estimator_param("step_weight"))
            if cfg.algo.advantage_clip:
                adv_E = adv_E.clamp(-cfg.algo.advantage_clip, cfg.algo.advantage_clip)
                if adv_NT is not None:
                    adv_NT = adv_NT.clamp(-cfg.algo.advantage_clip, cfg.algo.advantage_clip)
            order = cfg.algo.effective_order()
            if algo.sequential or order != "joint":
                pools = keep(turn_rows(episodes, pad, alignment=cfg.algo.turn_alignment,
                                       placeholders_to=cfg.rollout.max_turns if cfg.algo.placeholders else None))
                adv = adv_E if adv_NT is None else _aligned(adv_NT, episodes, cfg.algo.turn_alignment,
                                                            int(pools.turn.max()) + 1 if len(pools) else 1)
                metrics, per_turn = sequential_update(ctx, pools, adv, order=order,
                                                      ratio_reference=cfg.algo.ratio_reference,
                                                      factor_clip=cfg.algo.factor_clip,
                                                      fuse=cfg.algo.fuse_factor and not cfg.algo.placeholders,
                                                      carry_factor=carries_factor(algo, cfg.algo.factor_ratio),
                                                      factor_ratio=cfg.algo.factor_ratio,
                                                      alignment=cfg.algo.turn_alignment)
            elif adv_NT is not None:  # one row per turn, each with its turn's advantage
                rows = keep(turn_rows(episodes, pad))
                metrics = joint_update(ctx, rows, adv_NT[rows.episode, rows.turn])
            else:
                rows = keep(trajectory_rows(episodes, pad) if cfg.algo.rows == "trajectory"
                            else turn_rows(episodes, pad, alignment=cfg.algo.turn_alignment))
                metrics = joint_update(ctx, rows, adv_E[rows.episode])
        if not per_turn:  # joint algorithms: rows and advantages by turn
            for e_i, e in enumerate(episodes):
                for t in range(e.n_turns):
                    d = per_turn.setdefault(t, {"rows": 0, "adv_x_factor_mean": 0.0})
                    d["rows"] += 1
                    d["adv_x_factor_mean"] += float(adv_E[e_i] if adv_NT is None else adv_NT[e_i, t])
            for d in per_turn.values():
                d["adv_x_factor_mean"] /= max(d["rows"], 1)
        for t, d in per_turn.items():
            eps_t = [e for e in episodes if e.n_turns > t]
            d["success"] = sum(e.score >= cfg.eval.threshold for e in eps_t) / max(len(eps_t), 1)
            d["reward"] = sum(e.step_rewards[t] for e in eps_t if len(e.step_rewards) > t) / max(len(eps_t), 1)
        record = {"iteration": it, **episode_stats(episodes, cfg.eval.threshold), **metrics,
                  **_advantage_sizes(adv_E if adv_NT is None else adv_NT[_turn_tables(episodes)[2].bool()]),
                  "groups_with_signal": _groups_with_signal(rewards, groups),
                  "anchors/shared_fraction": _shared_anchors(episodes, groups),
                  "turn": {str(t): d for t, d in sorted(per_turn.items())}}
        return record

    def _turn_ppo(self, ctx: UpdateContext, episodes: list[Episode], pad: int, *, gamma: float, lam: float):
        """Turn-PPO's update: one row per turn; the critic's value of each turn state is the value head
        at the row's first action token (the state after the turn's whole prompt); GAE over turns
        (``core.turn_gae``); the value loss at those positions only. Returns (rows, [N, T] advantages,
        metrics)."""
        cfg = self.cfg
        rows = turn_rows(episodes, pad)
        _, old_values = score(self.learner_model, rows, temperature=cfg.rollout.temperature,
                              budget_tokens=cfg.optim.micro_batch_tokens, value_head=self.value_head,
                              pack=cfg.optim.pack_width, share=cfg.optim.share_prefix)
        has = rows.loss_mask.sum(-1) > 0
        first = rows.loss_mask.argmax(-1)  # first action token of each row (0 for a row without one)
        step_NT, _, mask_NT = _turn_tables(episodes)
        values_NT = torch.zeros_like(step_NT)
        r_idx = torch.arange(len(rows))
        values_NT[rows.episode, rows.turn] = old_values[r_idx, first] * has
        adv_NT, ret_NT = turn_gae(step_NT, values_NT, mask_NT, gamma=gamma, lam=lam)
        returns = torch.zeros_like(old_values)
        returns[r_idx, first] = ret_NT[rows.episode, rows.turn]
        value_mask = torch.zeros_like(rows.loss_mask)
        value_mask[r_idx, first] = has.to(value_mask.dtype)
        metrics = joint_update(ctx, rows, adv_NT[rows.episode, rows.turn], returns=returns, old_values=old_values,
                               value_mask=value_mask)
        return rows, adv_NT, metrics

    # ----------------------------------------------------------------- the run
    def _wall(self) -> float:
        return self._wall_prior + time.perf_counter() - self._wall0

    def _save(self, iteration: int) -> Path | None:
        self.state["wall_seconds"] = self._wall()
        self.state["log_lines"] = self._log.lines
        # whole tensors (every process takes part in gathering sharded ones), written by the main process
        tensors = {n: parallel.full(p.detach()) for n, p in self.named_params}
        opt_state = parallel.full_optimizer_state(self.optimizer)
        ref = {n: parallel.full(v) for n, v in self.reference_state.items()} if self.reference_state else None
        if not parallel.is_main():
            parallel.barrier()
            return None
        path = checkpoint.save(self.out, iteration=iteration, tensors=tensors, optimizer_state=opt_state,
                               state=self.state, config_yaml=yaml.safe_dump(resolved_dump(self.cfg), sort_keys=False),
                               reference=ref)
        parallel.barrier()
        return path

    def _check_stop(self, *, collective: bool = True) -> None:
        """A safe point: raise ``_Stop`` when SIGTERM/SIGINT arrived (on any process, when
        ``collective``: every process must reach this call; otherwise only single-process runs stop
        here, as the processes would otherwise disagree)."""
        flag = self._signals.signum is not None
        if parallel.world() > 1:
            if not collective:
                return
            flag = parallel.any_true(flag)
        if flag:
            raise _Stop()

    def _stopper(self):
        """A rollout/evaluation progress callback that stops at the next turn boundary (one process)."""
        return lambda *a: self._check_stop(collective=False)

    def _resume_state(self) -> int:
        """Load the latest checkpoint; returns its iteration (None: there is none, start afresh)."""
        ck = checkpoint.latest(self.out)
        if ck is None:
            return None
        self.state = checkpoint.load(ck, self.named_params, self.optimizer)
        self._weights_changed()
        if self.cfg.algo.kl_coef > 0:
            ref = checkpoint.load_reference(ck)
            self.reference_state = ({n: parallel.like(ref[n], p) for n, p in self.named_params if n in ref}
                                    if ref else checkpoint.trainable_state(self.named_params))
        self._wall_prior = self.state.get("wall_seconds", 0.0)
        self._say(f"resumed from {ck} at iteration {self.state['iteration']}")
        return self.state["iteration"]

    def _warmup(self) -> None:
        cfg = self.cfg
        w = cfg.warmup
        kind = ("format-only demonstration episodes" if w.source == "demo" else "expert demonstration episodes"
                if w.oracle_prob == 1 else f"demonstration episodes ({w.oracle_prob:.0%} the expert's, the rest format-only)")
        self._say(f"warm-up: {w.episodes} {kind} of training tasks")
        steps = cfg.warmup.epochs * -(-cfg.warmup.episodes // cfg.warmup.batch_episodes)
        tick, close = self._stage("warm-up (supervised steps)", steps)
        done = iter(range(1, steps + 1))

        def progress(loss):
            if tick:
                tick(next(done))
            self._check_stop()  # every process takes every warm-up step

        # turn adapters on a fully fine-tuned base: the warm-up (a format lesson for every turn) trains
        # the shared base alone, the adapters stay at zero (LoRA at the warm-up's full-fine-tuning
        # learning rate breaks the format: the tiny preset's 1e-2 left a loss of 1.2-1.3, not 0.08)
        base_only = self.turn_adapters is not None and not cfg.model.lora
        params = ([p for n, p in self.named_params if "lora_" not in n and "seeupo_turn_embedding" not in n]
                  if base_only else self.params)
        if base_only:
            self.turn_adapters.activate(0)
        try:
            self.state["warmup"] = warmup(
                self.learner_model, params, self.chat, self.family, self.limits, cfg.warmup,
                seed=cfg.run.seed, budget_tokens=cfg.optim.micro_batch_tokens, pack=cfg.optim.pack_width,
                share=cfg.optim.share_prefix, by_adapter=not base_only, progress=progress,
                cache=cfg.warmup.cache, cache_key={"model": cfg.model.model_dump(mode="json"), "device": cfg.run.device},
                say=self._say if parallel.is_main() else None)
        finally:
            close()
        self._weights_changed()

    def _eval_due(self, done: int) -> bool:
        every = self.cfg.eval.every
        return bool(every) and done % every == 0 and 0 < done < self.cfg.run.iterations

    def _periodic_eval(self, done: int) -> None:
        ev = self.evaluate(stop=self._stopper())
        memory.trim()
        self._log.log({"iteration": done, "eval": ev.as_dict()})
        self.state["evaluated_at"] = done

    def run(self, progress=None) -> dict:
        """Warm-up, evaluation before RL, ``run.iterations`` RL iterations, evaluation after; returns
        the summary. SIGTERM/SIGINT stop it at the next safe point with a checkpoint (``RunInterrupted``);
        ``run.max_nonfinite`` skipped steps in a row stop it with ``NonFiniteStop``. ``progress(done,
        record)`` is called once with ``record`` None when RL starts, then after each iteration."""
        cfg = self.cfg
        self._wall0, self._wall_prior = time.perf_counter(), 0.0
        main = parallel.is_main()
        if main:
            self.out.mkdir(parents=True, exist_ok=True)
            if not self.resume:
                checkpoint.clear_run(self.out, overwrite=self.overwrite)
            save_config(cfg, self.out / "config.yaml")
        self._say(f"schedule of {cfg.algo.name}: {schedule_line(self.schedule)}")
        start = self._resume_state() if self.resume else None
        if self.resume and start is None:
            self._say(f"--resume: no checkpoint in {self.out} (the run stopped before its first one, during the "
                      "warm-up): starting it from the beginning")
        self._log = (RunLog(self.out, cfg.run.loggers, resume_lines=self.state.get("log_lines") if start is not None else None,
                            resume_from=start, config=cfg.model_dump(mode="json")) if main else NullLog())
        self._signals = _Signals(self._say)
        self._nonfinite_run = self.state.get("nonfinite_run", 0)
        here = platform_info()  # a resumed run may continue elsewhere: every platform it ran on is kept
        self.state["platforms"] = [*[p for p in self.state.get("platforms", []) if p != here], here]
        at = start or 0  # the iteration a stop would checkpoint
        saved_at = start  # the iteration of the newest checkpoint
        try:
            with self._signals:
                try:
                    if start is None:
                        if self.warmup_enabled():
                            self._warmup()
                            memory.trim()  # the warm-up's activations: the largest the run holds
                        if cfg.algo.kl_coef > 0:
                            self.reference_state = checkpoint.trainable_state(self.named_params)
                        self.state["run_id"] = checkpoint.new_run_id()
                        self._save(0)  # the warmed-up model, before the (long) evaluation
                        saved_at, start = 0, 0
                        self._check_stop()
                    if "eval_before" not in self.state:
                        ev = self.evaluate(stop=self._stopper())
                        memory.trim()  # the evaluation's KV caches
                        self.state["eval_before"] = ev.as_dict()
                        self._log.log({"iteration": 0, "eval": ev.as_dict(), **self.state.get("warmup", {})})
                        env = "".join(f", {k} {v:.3f}" for k, v in ev.env.items())
                        self._say(f"eval before RL: avg@{ev.k} {ev.avg:.3f}, pass@{ev.k} {ev.passk:.3f} on {ev.tasks} tasks"
                                  + (f" (per episode{env})" if env else ""))
                    if start >= cfg.run.iterations and "eval_before" in self.state and start > 0:
                        self._say(f"[yellow]checkpoint is at iteration {start}, run.iterations={cfg.run.iterations}: "
                                  "nothing to train; raise run.iterations to continue[/]")
                    self._freeze_embeddings()
                    if self._eval_due(start) and self.state.get("evaluated_at") != start:
                        self._periodic_eval(start)  # interrupted there before
                    if progress:
                        progress(start, None)  # RL starts now: ``record`` None, nothing trained yet
                    for it in range(start, cfg.run.iterations):
                        at = it
                        self._check_stop()
                        record = self.iteration(it)
                        self._nonfinite(record)
                        record["warnings"] = health_warnings(record)
                        for w in record["warnings"]:
                            self._say(f"[yellow]iteration {it}: {w}[/]")
                        self._log.log(record)
                        if progress:
                            progress(it + 1, record)
                        done = at = it + 1
                        self.state["nonfinite_run"] = self._nonfinite_run
                        if self._nonfinite_run >= cfg.run.max_nonfinite:
                            raise NonFiniteStop(self._nonfinite_message(it, saved_at))
                        self._check_stop()
                        if self._eval_due(done):
                            self._periodic_eval(done)
                        if (cfg.run.checkpoint_every and done % cfg.run.checkpoint_every == 0) or done == cfg.run.iterations:
                            self._save(done)
                            saved_at = done
                    at = max(cfg.run.iterations, start)
                    ev = self.evaluate(stop=self._stopper())
                    self._log.log({"iteration": at, "eval": ev.as_dict(), "final": True})
                except _Stop:
                    # the state at `at` is whole here (a stop never lands inside an update); the warm-up has no
                    # checkpoint to write yet
                    path = self._save(at) if saved_at is not None else None
                    raise RunInterrupted(self._signals.signum, at, path, self.out) from None
        finally:
            self._log.close()
            self.close()
        with torch.no_grad():
            full = [parallel.full(p.detach()) for p in self.params]
            l2 = float(torch.sqrt(sum((p.double() ** 2).sum() for p in full)))
            digest = hashlib.sha256()  # the trainable parameters to the bit (float32 bytes, in order)
            for p in full:
                digest.update(p.float().cpu().contiguous().numpy().tobytes())
        records = read_metrics(self.out) if main else []
        summary = {
            "algorithm": cfg.algo.name, "model": cfg.model.name, "env": cfg.env.name, "seed": cfg.run.seed,
            "eval_before": self.state["eval_before"], "eval_after": ev.as_dict(),
            "iterations": max(cfg.run.iterations, start),
            "wall_seconds": self._wall(),
            "trainable_param_l2": l2,
            "trainable_param_sha256": digest.hexdigest(),
            "warmup": self.state.get("warmup"),
            "platforms": self.state["platforms"],
            "nonfinite_skips": sum(r.get("nonfinite_skips", 0) for r in records if "reward_mean" in r),
            "episodes_excluded": sum(r.get("episodes_excluded", 0) for r in records if "reward_mean" in r),
            "schedule": {**self.schedule.as_dict(),
                         "optimizer_steps_per_iteration": _mean_steps(records) if main else None},
        }
        try:
            if main:
                checkpoint.write_atomic(self.out / "summary.json", dumps(summary, indent=1))
                plot_curves(self.out, records, f"{cfg.algo.name} on {cfg.env.name} ({cfg.model.name})")
        finally:
            parallel.barrier()  # every process leaves once the run's files are written (or failed to be)
        return summary

    def _freeze_embeddings(self) -> None:
        if not self.cfg.optim.train_embeddings:
            # Adam moves every vocabulary row by about lr per step (each gets a tiny softmax gradient,
            # normalised to unit size): with full fine-tuning that is noise on all embeddings.
            self.model.get_input_embeddings().weight.requires_grad_(False)
            self.model.get_output_embeddings().weight.requires_grad_(False)

    def _nonfinite(self, record: dict) -> None:
        """Skipped steps in a row (the guard in ``learner.optimizer_step``), across iterations."""
        flags = record.pop("_skips", [])
        for f in flags:
            self._nonfinite_run = self._nonfinite_run + 1 if f else 0
        if record.get("nonfinite_skips"):
            self._say(f"[yellow]iteration {record['iteration']}: {record['nonfinite_skips']} optimizer step(s) had a "
                      "non-finite loss or gradient and were skipped (not applied)[/]")

    def _nonfinite_message(self, it: int, saved_at) -> str:
        last = checkpoint.latest(self.out)
        return (f"stopped at iteration {it}: {self._nonfinite_run} optimizer steps in a row had a non-finite loss or "
                f"gradient (run.max_nonfinite={self.cfg.run.max_nonfinite}); none was applied. Last checkpoint: "
                f"{last or 'none'}. Usual causes: rollout.temperature far below 1 (log-probs overflow), a learning "
                "rate too high, a reward or advantage that is NaN/Inf (algo.advantage_clip bounds the latter)")


class _Stop(Exception):
    """Raised at a safe point after SIGTERM/SIGINT (caught in ``Trainer.run``)."""


class RunInterrupted(Exception):
    """SIGTERM or SIGINT stopped the run at a safe point; ``checkpoint`` holds it (None: the signal came
    during the warm-up, before the first checkpoint; ``--resume`` redoes the warm-up)."""

    def __init__(self, signum, iteration: int, checkpoint_path, out: Path):
        self.signum, self.iteration, self.checkpoint, self.out = signum, iteration, checkpoint_path, out
        name = signal.Signals(signum).name if signum else "a signal"
        where = (f"checkpoint {checkpoint_path} (iteration {iteration})" if checkpoint_path
                 else "no checkpoint yet (stopped during the warm-up; resuming redoes it)")
        super().__init__(f"{name}: stopped at a safe point; {where}. Continue with: seeupo train --resume --out {out}")

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or signal.SIGTERM)


class NonFiniteStop(RuntimeError):
    """``run.max_nonfinite`` optimizer steps in a row were skipped by the non-finite guard."""


class _Signals:
    """SIGTERM and SIGINT set a flag that the run checks at safe points; a second signal raises
    ``KeyboardInterrupt`` at once. Installed only in the main thread (signals go there)."""

    def __init__(self, say):
        self.say, self.signum, self.old = say, None, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(s) is not signal.SIG_IGN:  # an ignored signal stays ignored (background jobs)
                    self.old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        os.write(2, f"\n{signal.Signals(signum).name}: stopping at the next safe point with a checkpoint "
                    "(send it again to exit at once)\n".encode())

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)
        self.old = {}
        return False


def oracle_policy(chat: Chat) -> ScriptedPolicy:
    """The environment's reference answers (``env.oracle_action()``), for validating adapters."""
    return ScriptedPolicy(lambda env, rng: env.oracle_action(), chat.encode, chat.eos_id)


def empty_policy(chat: Chat) -> ScriptedPolicy:
    """Replies with nothing: the floor every environment's checker must score 0."""
    return ScriptedPolicy(lambda env, rng: "", chat.encode, chat.eos_id)


SCRIPTED_POLICIES = {"oracle": oracle_policy, "empty": empty_policy}
