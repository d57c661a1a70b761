"""The policy a run trains and scores: the model (LoRA, turn adapters, the value head), its chat
template, the rollout limits and sampler, and the rollout source (the built-in runner or an agent
program). Building it checks the run's inputs; nothing here trains. ``seeupo eval``, ``serve`` and
``sample`` build this alone; ``Trainer`` adds the update (``iteration.Updater``) and run control.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from seeupo.core.algorithms import get_algorithm
from seeupo.core.estimators import get_estimator
from seeupo.data.episode import Episode, derive_seed
from seeupo.envs.base import make_family
from seeupo.models.loading import DEFAULT_MODEL, ModelNotAvailable, load_model
from seeupo.models.policy import Scorer, ValueHead, apply_lora
from seeupo.models.turns import add_turn_adapters
from seeupo.rollout.runner import Chat, RolloutLimits, run_episodes
from seeupo.rollout.sampler import HFSampler
from seeupo.train import memory, parallel
from seeupo.train.config import Config


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


class PolicyStack:
    """The model and everything that samples from it, built from a config (``InputError`` with the fix
    when an input cannot work). Holds no optimizer and no run state; ``weights_changed()`` after the
    weights change (a separate engine such as vLLM follows at the next ``sync_sampler()``)."""

    def __init__(self, cfg: Config):
        parallel.init(cfg.parallel.strategy)
        self.cfg = cfg
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
        self.value_head = None
        if get_estimator(self.algo.estimator).kind == "critic":
            self.value_head = ValueHead(model.config.hidden_size).to(self.device)
        # the module the learner runs: the model itself, or with FSDP2 the sharded Scorer around it
        self.scorer = parallel.shard(Scorer(model, self.value_head)) if parallel.sharded() else None
        self.learner_model = self.scorer if self.scorer is not None else model
        self.named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if self.value_head is not None:
            self.named_params += [(f"value_head.{n}", p) for n, p in self.value_head.named_parameters()]
        self.params = [p for _, p in self.named_params]
        self.chat = Chat(self.tokenizer)
        self.limits = RolloutLimits(cfg.rollout.max_turns, cfg.rollout.max_new_tokens, cfg.rollout.max_context,
                                    env_timeout_s=cfg.env.timeout_s, history=cfg.rollout.history_k())
        # the padded tokens of one forward pass when the learner scores or trains: the configured budget,
        # or the lower one ``fit_memory`` chose (the config itself is never changed)
        self.micro_batch_tokens = cfg.optim.micro_batch_tokens
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

    def _agent_source(self, transport: str | None = None):
        """``rollout.agent``: the agent program and the endpoint its client talks to (started on first use);
        ``transport``: another than ``serve.transport``."""
        from seeupo.rollout.agent import AgentError, AgentSource, load_agent
        from seeupo.serve.engine import ChatEngine

        cfg = self.cfg
        if parallel.world() > 1:
            raise InputError("rollout.agent runs in one process for now; launch without torchrun / accelerate")
        try:
            fn = load_agent(cfg.rollout.agent)
        except AgentError as e:
            raise InputError(str(e)) from None
        engine = ChatEngine.from_config(self.sampler, self.chat, cfg, max_new_tokens=cfg.rollout.max_new_tokens,
                                        temperature=cfg.rollout.temperature, max_calls=cfg.rollout.max_turns)
        return AgentSource(fn, engine, timeout_s=cfg.serve.agent_timeout_s, concurrency=cfg.rollout.batch_size,
                           transport=transport or cfg.serve.transport)

    def rollout(self, jobs, *, on_progress=None) -> list[Episode]:
        """Episodes of ``jobs`` from the rollout source: the agent program, or the built-in runner."""
        if self.agent is not None:
            self.agent.engine.temperature = self.sampler.temperature
            return self.agent.run(jobs, on_progress=on_progress)
        return run_episodes(self.sampler, self.chat, self.family, jobs, self.limits, on_progress=on_progress)

    def weights_changed(self) -> None:
        self._weights_version += 1

    def sync_sampler(self) -> None:
        if hasattr(self.sampler, "sync"):
            self.sampler.sync(self._weights_version)

    def close(self) -> None:
        if getattr(self, "agent", None) is not None:
            self.agent.close()
        if hasattr(self.sampler, "close"):
            self.sampler.close()

    def fit_memory(self, limit_gb: float | None, *, kl_reference: bool) -> memory.Plan | None:
        """Fit the learner's micro-batch into ``limit_gb`` (``run.max_memory_gb``; ``memory.plan``):
        ``micro_batch_tokens`` becomes the budget that fits; returns the plan (None: not planned, a run
        on a GPU or in several processes, whose memory is not this process's resident memory).
        ``InputError`` when even the smallest micro-batch does not fit."""
        if self.device.type != "cpu" or parallel.world() > 1:
            return None
        try:
            plan = memory.plan(limit_gb, self.model, micro_batch_tokens=self.micro_batch_tokens,
                               trainable_bytes=sum(p.numel() * p.element_size() for p in self.params),
                               kl_reference=kl_reference)
        except memory.DoesNotFit as e:
            raise InputError(str(e)) from None
        self.micro_batch_tokens = plan.micro_batch_tokens
        return plan

    def prepare_warmup(self) -> tuple[list[torch.nn.Parameter], bool]:
        """Set the model up for the supervised warm-up; returns (the parameters it trains, whether it
        splits rows by turn adapter). Turn adapters on a fully fine-tuned base: the warm-up (a format
        lesson for every turn) trains the shared base alone with adapter 0 active, the adapters stay at
        zero (LoRA at the warm-up's full-fine-tuning learning rate breaks the format: the tiny preset's
        1e-2 left a loss of 1.2-1.3, not 0.08). Otherwise every trainable parameter, by adapter."""
        if self.turn_adapters is None or self.cfg.model.lora:
            return self.params, True
        self.turn_adapters.activate(0)
        return [p for n, p in self.named_params if "lora_" not in n and "seeupo_turn_embedding" not in n], False

    def freeze_embeddings(self) -> None:
        """Fix the input and output token embeddings (``optim.train_embeddings=false``): Adam moves every
        vocabulary row by about lr per step (each gets a tiny softmax gradient, normalised to unit
        size): with full fine-tuning that is noise on all embeddings."""
        self.model.get_input_embeddings().weight.requires_grad_(False)
        self.model.get_output_embeddings().weight.requires_grad_(False)

    def warmup_enabled(self) -> bool:
        w = self.cfg.warmup.enabled
        if self.cfg.env.name == "jsonl":  # tasks without an environment: nothing to demonstrate
            return False
        return w == "on" or (w == "auto" and self.cfg.model.name == DEFAULT_MODEL)

    def train_episodes(self, iteration: int, *, on_progress=None) -> list[Episode]:
        """Iteration ``iteration``'s episodes: ``rollout.tasks_per_iteration`` training tasks drawn from
        (run seed, iteration), ``rollout.group_size`` samples each, every episode's seed derived from
        (run seed, iteration, task, sample); each process rolls out its share and all get all."""
        cfg = self.cfg
        pool = self.family.tasks("train")
        rng = random.Random(derive_seed(cfg.run.seed, "tasks", iteration))
        chosen = rng.sample(pool, min(cfg.rollout.tasks_per_iteration, len(pool)))
        jobs = [(t, b, g, derive_seed(cfg.run.seed, "episode", iteration, t.id, g))
                for b, t in enumerate(chosen) for g in range(cfg.rollout.group_size)]
        self.sync_sampler()
        with torch.no_grad(), parallel.gathered(self.scorer):  # each process runs its share; all get all
            local = self.rollout(parallel.mine(jobs), on_progress=on_progress)
        return parallel.gather_ordered(local, len(jobs))
