"""The run configuration: one typed, validated tree (pydantic), loaded from a YAML preset plus dotted
command-line overrides (``algo.name=grpo``). Unknown keys and impossible combinations fail at load
time with the fix in the message. The resolved config is saved in every run folder and checkpoint.
"""

from __future__ import annotations

import re
from pathlib import Path
from dataclasses import replace
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from seeupo.core.algorithms import ALGORITHMS, TURNS, Schedule, carries_factor
from seeupo.core.estimators import get_estimator, names, params_of, readers, refusal
from seeupo.core.losses import KL_ESTIMATORS
from seeupo.core.schedule import SeeUPOOptions, is_segmented, kept_turn, turn_order
from seeupo.models.turns import adapter_count

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Strict):
    name: str = Field("smollm2-135m-instruct", description="short name, local folder, HF name, or tiny-random[:LxH]")
    lora: bool = Field(True, description="train LoRA adapters (False: full fine-tuning)")
    lora_r: int = Field(16, ge=1, description="LoRA rank")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="parameter dtype")
    turn_adapters: str = Field("shared", description="shared (one policy for every turn), per_turn (a LoRA adapter "
                               "per turn index) or buckets:B (B adapters over consecutive turn indices); each turn "
                               "runs its adapter over its whole context (docs/train.md, 'Turn adapters'). With "
                               "model.lora=false the base is fine-tuned too, shared by every turn")

    turn_embedding: bool = Field(False, description="a learned vector per turn index (zero at the start) added to "
                                 "the input embeddings of that turn's forward, its whole context (docs/train.md)")

    @field_validator("turn_adapters")
    @classmethod
    def _turn_adapters(cls, v):
        adapter_count(v, 1)  # raises with the valid names
        return v


class EnvConfig(Strict):
    name: str = Field("lookup", description="environment name (built in: lookup, trap; bfcl and textworld after "
                      "`seeupo setup NAME`; appworld in its own environment, docs/envs.md)")
    options: dict[str, Any] = Field(default_factory=dict, description="environment options, validated by the environment")
    timeout_s: Optional[float] = Field(60.0, gt=0, description="seconds one environment call (reset, step, score) "
                                       "may take; a call past it ends only its episode (end_reason 'timeout', "
                                       "excluded from the loss). None: no limit")


class RolloutConfig(Strict):
    tasks_per_iteration: int = Field(8, ge=1, description="B: tasks per iteration")
    group_size: int = Field(4, ge=1, description="G: episodes per task")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (the learner uses the same)")
    max_turns: int = Field(4, ge=1, description="most model calls per episode")
    max_new_tokens: int = Field(40, ge=1, description="most tokens per model call")
    max_context: int = Field(1024, ge=16, description="most tokens in an episode's stream")
    backend: Literal["hf", "vllm"] = Field("hf", description="generation backend: hf (transformers) or vllm "
                                           "(a vLLM engine in a worker process; docs/performance.md)")
    vllm_python: Optional[str] = Field(None, description="rollout.backend=vllm: the Python of an environment with "
                                       "vLLM (default: $SEEUPO_VLLM_PYTHON, else this Python)")
    vllm_memory_utilization: float = Field(0.3, gt=0, le=1, description="rollout.backend=vllm: share of the GPU's "
                                           "memory (on CPUs: of the machine's) the engine reserves")
    batch_size: int = Field(64, ge=1, description="most episodes generated together")
    prefix_cache: bool = Field(True, description="hf backend: keep each episode's KV cache from one turn to the next "
                               "(a turn pre-fills only its new tokens)")
    agent: Optional[str] = Field(None, description="an agent program as the rollout source (FILE.py:FUNCTION or "
                                 "module:function; `seeupo train --agent`): async def f(task, client) -> reward, its "
                                 "client an openai.AsyncOpenAI on the run's endpoint; each model call is a turn "
                                 "(docs/agents.md). Needs turn rows like rollout.history=last:K")
    history: str = Field("full", description="a turn's prompt: full (the whole transcript so far, one growing "
                         "stream) or last:K (the environment's first messages, i.e. system prompt and task, then the "
                         "last K exchanges, each a reply and the observation after it; last:0: the current observation "
                         "alone): bounded contexts, one short row per turn; needs turn rows (algo.rows=turn for joint "
                         "critic-free algorithms; PPO's GAE runs over each episode's turn rows; not buckets:B)")

    @field_validator("history")
    @classmethod
    def _history(cls, v: str) -> str:
        if v != "full" and not re.fullmatch(r"last:\d+", v):
            raise ValueError(f"rollout.history={v!r}: full or last:K with K >= 0 (e.g. last:2)")
        return v

    def history_k(self) -> Optional[int]:
        """None for the whole transcript, else K (the exchanges a turn's prompt keeps)."""
        return None if self.history == "full" else int(self.history.split(":")[1])


SCHEDULE_KEYS = ("epochs", "minibatches", "clip_eps", "clip_eps_high")


class ScheduleConfig(Strict):
    """Fields of one algorithm's update schedule that a run sets; None keeps the declaration's
    (``seeupo.core.algorithms``)."""

    epochs: Optional[int] = Field(None, ge=1, description="passes over each phase's rows")
    minibatches: Optional[Union[int, Literal["turns"]]] = Field(
        None, description="optimizer steps per pass (rows split in random minibatches), or 'turns' (joint "
        "algorithms): one per turn index present, i.e. SeeUPO's number of phases on the same rollouts")
    clip_eps: Optional[float] = Field(None, gt=0, description="clip range, low side")
    clip_eps_high: Optional[float] = Field(None, gt=0, description="clip range, high side; unset: the same as "
                                           "clip_eps where clip_eps is set here, else the declaration's")

    @field_validator("minibatches", mode="before")
    @classmethod
    def _positive(cls, v):
        if isinstance(v, bool) or (isinstance(v, int) and v < 1):
            raise ValueError("minibatches must be an integer >= 1 or 'turns'")
        return v


NAMED_PARAMS = ("gamma", "lam", "step_weight", "episode_norm")  # estimator parameters with their own algo.* field


class AlgoConfig(Strict):
    name: str = Field("seeupo", description=f"one of: {', '.join(ALGORITHMS)}")
    schedules: dict[str, ScheduleConfig] = Field(
        default_factory=dict, description="per-algorithm schedule (epochs, minibatches, clip_eps, clip_eps_high); "
        "only the running algorithm's entry is used, so a value set for one never changes another's. "
        "Shorthand: algo.epochs=N on the command line sets the running algorithm's; in a preset file, that "
        "file's algo.name's")
    norm: Optional[Literal["none", "group", "batch"]] = Field(None, description="advantage normalisation (None: the algorithm's)")
    kl_coef: float = Field(0.0, ge=0, description="beta of the KL penalty to the reference policy")
    kl_estimator: str = Field("k3", description="k1 | k2 | k3")
    order: Optional[Union[str, list[int]]] = Field(
        None, description="turn order override: reverse|natural|random|joint|window:W|buckets:B or a list of turn "
        "indices (e.g. [1, 0]); buckets:B trains B buckets of consecutive turns, latest first, each as one "
        "segment per episode; a joint algorithm given an order runs phases without the factor")
    rows: Literal["trajectory", "turn"] = Field("trajectory", description="row view for joint algorithms")
    update_turns: str = Field("all", description="the turns trained: all, last:W (each episode's last W turns) or "
                              "skip:T (every turn but index T); the rest get no loss (issue 16's turns sweep)")
    ratio_reference: Literal["sampling", "incremental"] = Field("sampling", description="SeeUPO ratio denominator")
    factor_ratio: Literal["full", "geometric", "off"] = Field(
        "geometric", description="SeeUPO factor's turn weight: geometric (length-normalised, the authors' code), "
        "full (the whole response's ratio, the paper's Eq. 8) or off (no factor); docs/core.md has the "
        "measurement behind the default")
    fuse_factor: bool = Field(True, description="SeeUPO: fuse the factor's forward pass into the next turn's "
                              "(SPEC §6): a cached continuation over the later turn's tokens only")
    placeholders: bool = Field(False, description="the authors' placeholder rows for unreached turns up to "
                               "rollout.max_turns: no loss, full compute, counted in the row mean (authors_code)")
    factor_clip: Optional[tuple[float, float]] = Field(None, description="clamp of each factor and the product")
    advantage_clip: Optional[float] = Field(None, gt=0, description="clamp |advantage| (None: off)")
    turn_alignment: Literal["from_start", "from_end"] = Field(
        "from_start", description="turn indexing for pools: from_start (0 = first turn) or from_end (0 = each "
        "episode's last turn); named orders mean the same stages in both (reverse: latest first)")
    estimator: Optional[str] = Field(
        None, description="the advantage estimator of a critic-free algorithm (None: the algorithm's): one of "
        f"{', '.join(names('episode') + names('turn'))} (core.estimators; docs/core.md). On seeupo, phase t trains "
        "on the turn-t advantage times the factor")
    gamma: Optional[float] = Field(None, ge=0, le=1, description="discount of PPO's and Turn-PPO's GAE and of "
                                   "GiGPO's step return (None: the algorithm's: 1, Turn-PPO 0.99, GiGPO 0.95)")
    lam: Optional[float] = Field(None, ge=0, le=1, description="GAE lambda of PPO and Turn-PPO (None: the "
                                 "algorithm's: 1, Turn-PPO 0.9)")
    step_weight: Optional[float] = Field(None, ge=0, description="weight of the turn part: GiGPO's omega, "
                                         "MT-GRPO's lambda (None: the algorithm's, 1)")
    episode_norm: Optional[Literal["step", "episode"]] = Field(
        None, description="GiGPO's episode baseline (None: step): step, the mean (and std) over the group's "
        "step rows, each holding its episode's reward, as the authors' code computes it (a longer episode "
        "weighs more); episode, over the group's episodes, the paper's Eq. 3 (docs/core.md)")
    params: dict[str, Any] = Field(
        default_factory=dict, description="any other parameter of the estimator in force, by name (its entry in "
        "core.estimators lists them with their published defaults), e.g. algo.params.history=2 for hgpo")
    vf_coef: float = Field(0.5, ge=0, description="PPO value-loss weight")

    @field_validator("factor_ratio", mode="before")
    @classmethod
    def _yaml_off(cls, v):  # YAML reads a bare off as False
        return "off" if v is False else v

    @model_validator(mode="after")
    def _check(self):
        if self.name not in ALGORITHMS:
            raise ValueError(f"algo.name={self.name!r} is not known; use one of: {', '.join(ALGORITHMS)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"algo.kl_estimator={self.kl_estimator!r}; use one of: {', '.join(KL_ESTIMATORS)}")
        unknown = sorted(set(self.schedules) - set(ALGORITHMS))
        if unknown:
            raise ValueError(f"algo.schedules has unknown algorithms {unknown}; use: {', '.join(ALGORITHMS)}")
        kept_turn(0, 1, self.update_turns)  # raises with the valid forms
        if self.update_turns != "all" and self.turn_alignment != "from_start":
            raise ValueError(f"algo.update_turns={self.update_turns!r} counts turns from each episode's first; set "
                             "algo.turn_alignment=from_start")
        if isinstance(self.order, str):
            turn_order([0, 1, 2], self.order, rng=0)  # raises with the valid names
            if is_segmented(self.order) and self.turn_alignment != "from_start":
                raise ValueError(f"algo.order={self.order!r} needs algo.turn_alignment=from_start (a bucket is a run of "
                                 "consecutive turns from each episode's first)")
        est = self.effective_estimator()
        get_estimator(est)  # raises with the valid names
        algo = ALGORITHMS[self.name]
        why = refusal(est, algorithm=self.name, own=algo.estimator, order=self.effective_order(),
                      update_turns=self.update_turns, leave_one_out=algo.leave_one_out)
        if why:
            raise ValueError(why)
        given = self._given_params()
        for key in given:
            if key not in get_estimator(est).defaults:
                raise ValueError(f"algo.{key} has no effect on {self.name} with the {est} estimator; it applies to "
                                 f"the estimators {', '.join(readers(key)) or 'none'}")
        params_of(est, given)  # the estimator's own checks of the values
        if self.schedule().minibatches == TURNS and self.effective_order() != "joint":
            raise ValueError(f"algo.schedules.{self.name}.minibatches='turns' matches a joint update's steps to "
                             "SeeUPO's phases; an update in turn phases takes an integer (e.g. 1)")
        return self

    def schedule(self, name: str | None = None) -> Schedule:
        """The effective schedule of algorithm ``name`` (default: this run's): its declaration with
        the fields this config sets."""
        name = name or self.name
        base = ALGORITHMS[name].schedule
        over = self.schedules.get(name)
        if over is None:
            return base
        fields = {k: v for k, v in over.model_dump().items() if v is not None}
        if over.clip_eps is not None and over.clip_eps_high is None:
            fields["clip_eps_high"] = None  # a range set by its low side alone is symmetric
        return replace(base, **fields)

    def effective_estimator(self) -> str:
        """The advantage estimator in force: ``algo.estimator`` or the algorithm's."""
        return self.estimator or ALGORITHMS[self.name].estimator

    def _given_params(self) -> dict:
        """The estimator parameters this config sets: the named fields and ``params``."""
        named = {k: getattr(self, k) for k in NAMED_PARAMS if getattr(self, k) is not None}
        both = sorted(set(named) & set(self.params))
        if both:
            raise ValueError(f"algo.{both[0]} and algo.params.{both[0]} are both set; keep one")
        return {**named, **self.params}

    def estimator_param(self, key: str):
        """A parameter of the estimator in force: this config's value, else the estimator's published
        default (``core.estimators``): SeeUPO fed GiGPO's advantages discounts with GiGPO's 0.95."""
        return self.resolved_params()[key]

    def resolved_params(self) -> dict:
        """Every parameter of the estimator in force, as this run uses them."""
        return params_of(self.effective_estimator(), self._given_params())

    def estimator_params(self) -> dict:
        """The estimator in force and the values of its parameters this run uses (the summary records
        them)."""
        return {"name": self.effective_estimator(), **self.resolved_params()}

    def seeupo_options(self) -> SeeUPOOptions:
        """How the turn phases run (``train.update.sequential_update``)."""
        return SeeUPOOptions(order=self.effective_order(), alignment=self.turn_alignment,
                             ratio_reference=self.ratio_reference, factor_ratio=self.factor_ratio,
                             factor_clip=self.factor_clip, carry_factor=carries_factor(ALGORITHMS[self.name], self.factor_ratio),
                             fuse=self.fuse_factor and not self.placeholders)

    def effective_order(self):
        return self.order if self.order is not None else ALGORITHMS[self.name].order


class OptimConfig(Strict):
    lr: float = Field(2e-4, gt=0, description="learning rate (AdamW)")
    lr_warmup_iterations: int = Field(0, ge=0, description="ramp the RL learning rate linearly over the first N iterations")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    grad_clip: Optional[float] = Field(1.0, gt=0, description="max gradient norm (None: off)")
    micro_batch_tokens: int = Field(4096, ge=64, description="padded tokens per forward pass")
    pack_width: int = Field(0, ge=0, description="0: off; N: pack rows end to end into lanes of max(N, longest "
                            "row) tokens in each forward pass (fewer padded tokens, block-diagonal attention; "
                            "not in SeeUPO's fused passes, which continue each row's own cache)")
    share_prefix: bool = Field(True, description="run the prefix rows share (system prompt, a task's prompt, a "
                               "group's identical replies) once per micro-batch instead of once per row; same "
                               "results up to rounding (docs/performance.md)")
    train_embeddings: bool = Field(True, description="False: token embeddings stay fixed during RL (full fine-tuning)")


class WarmupConfig(Strict):
    enabled: Literal["auto", "on", "off"] = Field("auto", description="auto: on for the default model")
    source: Literal["demo", "oracle"] = Field(
        "demo", description="demo: format-only demonstrations (the environment's demo_action: calls chosen "
        "without the answer); oracle: the environment's own expert (oracle_action: lookup's and trap's answer "
        "path, TextWorld's winning policy from the current state, BFCL's ground-truth calls), on training tasks only")
    oracle_prob: float = Field(1.0, ge=0, le=1, description="source=oracle: the share of demonstration episodes "
                               "that are the expert's (drawn per episode; the others format-only throughout): how "
                               "much success the warm-up leaves the model with")
    episodes: int = Field(256, ge=1, description="demonstration episodes")
    epochs: int = Field(1, ge=1, description="passes over the demonstrations")
    batch_episodes: int = Field(16, ge=1, description="episodes per optimizer step")
    lr: float = Field(5e-4, gt=0, description="warm-up learning rate")
    lr_schedule: Literal["constant", "linear"] = Field(
        "constant", description="constant, or linear decay from lr to 0 over the warm-up's steps")
    cache: Optional[str] = Field(
        None, description="a folder of finished warm-ups to reuse: one is reused only when the model, its "
        "initial weights, the demonstrations, these settings, the seed and random states, the thread count "
        "and the training code are all the same (a hash of them names the file), so the run is unchanged; "
        "`seeupo sweep` sets DIR/warmup-cache (arms that share a seed share one warm-up)")

    @field_validator("enabled", mode="before")
    @classmethod
    def _yaml_bools(cls, v):  # YAML reads on/off/yes/no as booleans
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _oracle_only(self):
        if self.source == "demo" and self.oracle_prob != 1.0:
            raise ValueError("warmup.oracle_prob is the share of expert episodes: it needs warmup.source=oracle")
        return self


class EvalConfig(Strict):
    every: int = Field(0, ge=0, description="evaluate every N iterations (0: before and after only)")
    k: int = Field(4, ge=1, description="samples per task for avg@k / pass@k")
    tasks: int = Field(32, ge=1, description="held-out tasks evaluated")
    split: str = Field("test", description="task split for evaluation")
    temperature: Optional[float] = Field(None, gt=0, description="None: the rollout temperature")
    threshold: float = Field(1.0, description="success = score >= threshold")
    batch_episodes: Optional[int] = Field(
        32, ge=1, description="episodes sampled together: the evaluation runs its tasks x k episodes in batches of "
        "this many (each batch's episodes generate their turns together); bounds the KV caches an evaluation "
        "holds. None: all at once")
    cache: Optional[str] = Field(
        None, description="a folder of evaluations before RL keyed by everything they depend on (the model's "
        "every tensor after the warm-up, the environment, evaluation and sampler settings, the seed, the CPU "
        "kernel level, the code): a run whose warmed-up model another run already scored reuses that score. "
        "`seeupo sweep` sets DIR/eval-cache (arms that share a seed share one evaluation before RL)")


class RunConfig(Strict):
    seed: int = Field(0, description="run seed (episodes, tasks, initialisation)")
    iterations: int = Field(20, ge=0, description="RL iterations")
    out: str = Field("runs/train", description="run folder")
    checkpoint_every: int = Field(5, ge=0, description="checkpoint every N iterations (0: only at the end)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: this process's GPU when CUDA is available, else the CPU")
    loggers: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(["jsonl", "tensorboard"], description="metric sinks")
    max_nonfinite: int = Field(4, ge=1, description="stop the run (exit 1) after this many optimizer steps in a row "
                               "skipped for a non-finite loss or gradient (skipped steps are never applied)")
    max_memory_gb: Optional[float] = Field(
        None, gt=0, description="resident memory the run may use (GB; default: the machine's, or its cgroup's "
        "limit, less 1 GB). At start the activations per token are measured and the run's micro-batch is "
        "lowered from optim.micro_batch_tokens (by halves, down to 256) until the run fits (the config keeps its "
        "value; summary.json's micro_batch_tokens is the one used); a run that cannot fit exits 2 saying what "
        "does not (CPU runs in one process; docs/performance.md, Memory)")


class ServeConfig(Strict):
    """The OpenAI-compatible endpoint (`seeupo serve`, and the one a run with rollout.agent starts)."""

    parser: str = Field("json", description="tool-call syntax of the model's replies, parsed into OpenAI tool_calls "
                        "and used to render assistant tool_calls back: json ({\"tool\": NAME, ...}) or hermes "
                        "(<tool_call>...</tool_call>)")
    tool_role: Literal["user", "tool"] = Field("user", description="the role a `tool` message is rendered with (user: "
                                               "for chat templates without a tool role, as the built-in "
                                               "environments send observations)")
    max_wait_ms: float = Field(100.0, ge=0, description="how long a batch waits after its latest request for more "
                               "(at most 10 windows; a run's agents: until every unfinished one has a call waiting)")
    transport: Literal["local", "http"] = Field("local", description="how a run's agents reach the endpoint: local "
                                                "(its ASGI app called in the run's process, no socket; the "
                                                "client's base_url is http://seeupo.local/ep/<id>/v1 and only "
                                                "the client handed to the agent reaches it) or http (a server "
                                                "on a free 127.0.0.1 port, for agents that pass the URL on to "
                                                "other clients or processes)")
    agent_timeout_s: Optional[float] = Field(600.0, gt=0, description="seconds one agent episode may take, its model "
                                             "calls included; past it the episode ends as 'timeout' (excluded "
                                             "from the loss). None: no limit")


class ParallelConfig(Strict):
    strategy: Literal["ddp", "fsdp2"] = Field("ddp", description="several processes (torchrun / accelerate "
                                              "launch): ddp replicates parameters, fsdp2 shards them (fully_shard)")


class Config(Strict):
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)

    @model_validator(mode="after")
    def _combinations(self):
        algo = ALGORITHMS[self.algo.name]
        if get_estimator(self.algo.effective_estimator()).kind != "critic" and self.rollout.group_size < 2:
            raise ValueError(f"{self.algo.name} compares episodes of one task: set rollout.group_size >= 2")
        if self.algo.placeholders and self.algo.turn_alignment == "from_end":
            raise ValueError("algo.placeholders counts unreached turn indices from the start; it cannot be combined "
                             "with algo.turn_alignment=from_end")
        if self.model.turn_adapters != "shared" or self.model.turn_embedding:
            ta = (f"model.turn_adapters={self.model.turn_adapters}" if self.model.turn_adapters != "shared"
                  else "model.turn_embedding=true")
            if self.rollout.backend != "hf" and (self.model.turn_embedding or not self.model.lora):
                raise ValueError(f"{ta} on rollout.backend=vllm needs LoRA turn adapters (model.lora=true, "
                                 "no model.turn_embedding): vLLM serves LoRA adapters, not a fine-tuned base or "
                                 "a turn vector; use rollout.backend=hf")
            if self.parallel.strategy == "fsdp2":
                raise ValueError(f"{ta} is not supported with parallel.strategy=fsdp2; use ddp")
            if self.rollout.agent:
                raise ValueError(f"{ta} cannot be combined with rollout.agent yet (the endpoint samples every call "
                                 "with one set of parameters)")
            if self.algo.effective_estimator() == "gae":
                raise ValueError(f"{ta}: PPO's GAE update trains trajectory rows, which span turns run by different "
                                 "adapters; use a critic-free algorithm")
            if (not algo.sequential and self.algo.effective_estimator() == "grae" and self.algo.effective_order() == "joint"
                    and self.algo.rows != "turn"):
                raise ValueError(f"{ta}: {self.algo.name} on trajectory rows mixes turns run by different adapters; "
                                 "set algo.rows=turn")
            if is_segmented(self.algo.effective_order()):
                raise ValueError(f"{ta} cannot be combined with algo.order={self.algo.order} (a bucket's segment row "
                                 "spans turns run by different adapters)")
            if self.algo.turn_alignment != "from_start" or self.algo.placeholders:
                raise ValueError(f"{ta} needs algo.turn_alignment=from_start and no algo.placeholders (a row's turn "
                                 "index names its adapter)")
        if self.rollout.history != "full" or self.rollout.agent:
            h = f"rollout.history={self.rollout.history}" if self.rollout.history != "full" else "rollout.agent"
            if not algo.sequential and self.algo.effective_estimator() == "grae" and self.algo.effective_order() == "joint" and self.algo.rows != "turn":
                raise ValueError(f"{h}: {self.algo.name} on trajectory rows needs one stream per episode; set "
                                 "algo.rows=turn (one row per turn, each its own prompt and reply)")
            if is_segmented(self.algo.effective_order()):
                raise ValueError(f"{h} cannot be combined with algo.order={self.algo.order} (a bucket's segment row "
                                 "is one stream over several turns)")
        order = self.algo.order
        if isinstance(order, list) and sorted(order) != list(range(self.rollout.max_turns)):
            raise ValueError(f"algo.order={order} must list every turn index 0..{self.rollout.max_turns - 1} once "
                             f"(rollout.max_turns={self.rollout.max_turns}); indices absent from an iteration are skipped")
        return self


class ConfigError(ValueError):
    pass


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {key!r}: {p!r} is not a section")
    node[parts[-1]] = value


def presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_config(preset: str | None = "default", overrides: list[str] | None = None,
                extra: dict | None = None) -> Config:
    """Preset (a name in ``seeupo/configs`` or a YAML path), then ``extra`` (a nested dict), then
    ``key=value`` overrides (values parsed as YAML)."""
    tree = _preset_tree(preset) if preset else {}
    pairs = list(_flatten(extra or {}))
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value, e.g. algo.name=grpo")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: the value is not valid YAML (lists look like [0.9, 1.1]; "
                              "quote the whole argument in the shell)") from None
        pairs.append((key.strip(), value))
    name = dict(pairs).get("algo.name", tree.get("algo", {}).get("name", AlgoConfig().name))
    pairs = _symmetric_clip([(_schedule_key(k, name), v) for k, v in pairs])
    env = dict(pairs).get("env.name")
    if env is not None and env != tree.get("env", {}).get("name", EnvConfig().name):
        _apply_env_overlay(tree, str(env))
    for key, value in pairs:
        _set_dotted(tree, key, value)
    try:
        return Config(**tree)
    except ValidationError as e:
        lines = [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise ConfigError("invalid config: " + "; ".join(lines)) from None


def _apply_env_overlay(tree: dict, env: str) -> None:
    """Switching environment: drop the preset's environment options (they belong to its
    environment) and apply ``configs/envs/NAME.yaml`` if there is one (limits suited to it)."""
    tree.setdefault("env", {})["options"] = {}
    path = PRESET_DIR / "envs" / f"{env}.yaml"
    if path.exists():
        for key, value in _flatten(yaml.safe_load(path.read_text()) or {}):
            _set_dotted(tree, key, value)


def _preset_tree(preset: str, seen: tuple = ()) -> dict:
    """A preset's YAML tree; ``base: NAME`` inherits another preset (deep merge, this one wins)."""
    path = Path(preset)
    if not path.suffix:
        path = PRESET_DIR / f"{preset}.yaml"
    if not path.exists():
        raise ConfigError(f"no preset {preset!r}; available: {', '.join(presets())} (or a .yaml path)")
    if str(path) in seen:
        raise ConfigError(f"preset {preset!r} inherits itself (base: ...)")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"preset {path}: not valid YAML at{where}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"preset {path}: the top level must be a mapping of sections (model:, algo:, ...), "
                          f"not a {type(tree).__name__}")
    base = tree.pop("base", None)
    merged = _preset_tree(base, seen + (str(path),)) if base else {}
    # schedule shorthand in a preset file (algo.epochs: 2) belongs to that file's algorithm
    name = (tree.get("algo") or {}).get("name") or (merged.get("algo") or {}).get("name") or AlgoConfig().name
    for key, value in _symmetric_clip([(_schedule_key(k, str(name)), v) for k, v in _flatten(tree)]):
        _set_dotted(merged, key, value)
    return merged


def _symmetric_clip(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Where one source of values (a preset file, the command line) sets a schedule's ``clip_eps``
    but not its ``clip_eps_high``, the range it means is symmetric: the high side is reset too, so
    an inherited or declared high side (GSPO's 4e-4) does not survive a new low side."""
    keys = {k for k, _ in pairs}
    out = list(pairs)
    for key, _ in pairs:
        if key.startswith("algo.schedules.") and key.endswith(".clip_eps") and key + "_high" not in keys:
            out.append((key + "_high", None))
    return out


def _schedule_key(key: str, algo_name: str) -> str:
    """``algo.epochs`` -> ``algo.schedules.<algo_name>.epochs`` (the same for the other schedule
    fields); any other key unchanged."""
    parts = key.split(".")
    if len(parts) == 2 and parts[0] == "algo" and parts[1] in SCHEDULE_KEYS:
        return f"algo.schedules.{algo_name}.{parts[1]}"
    return key


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict) and k != "options":
            yield from _flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def resolved_dump(cfg: Config) -> dict:
    """The config as saved with a run: the running algorithm's schedule written out in full, so the
    file states the effective schedule and a resumed run keeps it whatever the defaults become."""
    tree = cfg.model_dump(mode="json")
    tree["algo"]["schedules"][cfg.algo.name] = cfg.algo.schedule().as_dict()
    return tree


def save_config(cfg: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(resolved_dump(cfg), sort_keys=False))
