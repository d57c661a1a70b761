"""``lookup``: the built-in multi-turn tool-use family, with a known optimum.

Each task hides a pointer table over a few keys. The model starts at a named key, calls
``{"tool": "lookup", "key": K}`` to follow pointers (one call per turn) until it reaches a number,
then calls ``{"tool": "answer", "value": V}``. ``hops`` lookups plus one answer: 2-4 turns. The
optimal policy succeeds on every task (score 1). The reward is the outcome (1 for the right number)
plus optional shaping.

Knobs that break the bandit assumption (each 0 by default, see SPEC §7):

- ``intermediate_reward``: reward ``w / hops`` for each lookup that follows the chain (shaping).
- ``observation_noise``: probability that an observation carries a distractor line.
- ``tool_failure``: probability that a lookup fails with a "busy, try again" error (stochastic tool).

Every step's info has ``tool_error`` (1 when the reply's call is malformed or names an unknown tool
or key, else 0) and ``extra_calls``: the tool calls in the reply beyond the first one, which is the
only one acted on (``toolcall.extra_calls``: JSON objects with a ``"tool"`` key for the ``json``
parser, ``<tool_call>`` blocks for ``hermes``).
"""

from __future__ import annotations

import json
import random
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from seeupo.envs.base import Env, EnvFamily, Message, StepResult, Task, register
from seeupo.envs.toolcall import ToolCall, extra_calls, get_parser

WORDS = ("red", "blue", "green", "gold", "pink", "gray", "cat", "dog", "fox", "owl", "bee", "cow",
         "sun", "moon", "star", "tree", "lake", "rock", "box", "cup", "pen", "key", "hat", "map")


class LookupOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hops_min: int = Field(1, ge=1, le=3, description="fewest lookups a task needs")
    hops_max: int = Field(2, ge=1, le=3, description="most lookups a task needs")
    n_keys: int = Field(4, ge=2, le=12, description="keys listed in each task")
    train_tasks: int = Field(256, ge=1, description="tasks in the train split")
    test_tasks: int = Field(64, ge=1, description="tasks in the held-out test split")
    slack_turns: int = Field(1, ge=0, le=4, description="turns allowed beyond hops + 1")
    intermediate_reward: float = Field(0.0, ge=0.0, le=1.0, description="shaping weight for chain lookups")
    observation_noise: float = Field(0.0, ge=0.0, le=1.0, description="P(distractor line in an observation)")
    tool_failure: float = Field(0.0, ge=0.0, le=1.0, description="P(a lookup fails with 'busy, try again')")
    parser: str = Field("json", description="tool-call parser name")
    key_pool: Optional[list[str]] = Field(None, description="words keys are drawn from (default: 24 built-in words)")
    distinct_tasks: Optional[int] = Field(None, ge=1, description="cycle through this many task layouts (easy variants)")
    answer_required: bool = Field(True, description="False: success when the last lookup reveals the number")
    seed: int = Field(0, description="seed of the task sets")

    def model_post_init(self, _):
        if self.hops_min > self.hops_max:
            raise ValueError(f"hops_min={self.hops_min} > hops_max={self.hops_max}; set hops_min <= hops_max")
        pool = self.key_pool or WORDS
        if len(set(pool)) < self.n_keys:
            raise ValueError(f"key_pool has {len(set(pool))} distinct words, fewer than n_keys={self.n_keys}")


def make_task(opts: LookupOptions, split: str, index: int) -> Task:
    layout = index if opts.distinct_tasks is None else index % opts.distinct_tasks
    rng = random.Random(f"lookup|{opts.seed}|{split if opts.distinct_tasks is None else 'all'}|{layout}")
    hops = rng.randint(opts.hops_min, opts.hops_max)
    keys = rng.sample(sorted(set(opts.key_pool or WORDS)), opts.n_keys)
    chain = keys[: hops]  # chain[0] is the start; chain[i] -> chain[i+1]; chain[-1] -> number
    answer = str(rng.randint(10, 99))
    table = {}
    for i, k in enumerate(chain):
        table[k] = chain[i + 1] if i + 1 < len(chain) else answer
    for k in keys[hops:]:  # the other keys point somewhere plausible but wrong
        table[k] = rng.choice([x for x in keys if x != k] + [str(rng.randint(10, 99))])
    shown = keys[:]
    rng.shuffle(shown)
    return Task(id=f"lookup-{split}-{index}", split=split,
                data={"start": chain[0], "hops": hops, "answer": answer, "table": table, "keys": shown,
                      "answer_required": opts.answer_required})


def render_prompt(task: Task) -> list[Message]:
    d = task.data
    steps = "one lookup" if d["hops"] == 1 else f"{d['hops']} lookups"
    if not d.get("answer_required", True):
        return [{"role": "user", "content": (
            'Write exactly one tool call per message, as JSON: {"tool": "lookup", "key": "<key>"} shows what '
            f"the key points to.\nKeys: {', '.join(d['keys'])}.\nTask: start at the key {d['start']} and follow "
            f"what each key points to until you reach a number ({steps}).")}]
    text = (
        "You can use two tools. Write exactly one tool call per message, as JSON:\n"
        '{"tool": "lookup", "key": "<key>"} shows what the key points to.\n'
        '{"tool": "answer", "value": "<number>"} gives your final answer.\n'
        f"Keys: {', '.join(d['keys'])}.\n"
        f"Task: start at the key {d['start']} and follow what each key points to until you reach a "
        f"number ({steps}). Then answer with that number."
    )
    return [{"role": "user", "content": text}]


def _shown(value) -> str:
    """A short rendering of a model-given argument for an error message (never raises)."""
    if isinstance(value, str):
        return json.dumps(value[:40] + ("..." if len(value) > 40 else ""))
    return f"of type {type(value).__name__}" if isinstance(value, (list, dict)) else json.dumps(value)


class LookupEnv(Env):
    def __init__(self, task: Task, opts: LookupOptions, seed: int):
        self.task, self.opts = task, opts
        self.rng = random.Random(seed)
        self.parse = get_parser(opts.parser)
        d = task.data
        self.max_turns = d["hops"] + int(opts.answer_required) + opts.slack_turns
        self.position = d["start"]  # next key on the chain
        self.chain_progress = 0
        self.answered = None
        self.seen_values: list[str] = []

    def reset(self) -> list[Message]:
        return render_prompt(self.task)

    def _obs(self, text: str) -> list[Message]:
        if self.opts.observation_noise and self.rng.random() < self.opts.observation_noise:
            k = self.rng.choice(self.task.data["keys"])
            text += f"\n(note: {k} -> {self.rng.randint(10, 99)} was true yesterday)"
        return [{"role": "user", "content": text}]

    def step(self, assistant_text: str) -> StepResult:
        res = self._step(assistant_text)
        res.info["extra_calls"] = extra_calls(assistant_text, self.opts.parser)
        return res

    def _step(self, assistant_text: str) -> StepResult:
        d = self.task.data
        call = self.parse(assistant_text)
        if not isinstance(call, ToolCall):
            return StepResult(self._obs(f"error: {call.message}. Write one JSON tool call, e.g. "
                                        f'{{"tool": "lookup", "key": "{d["keys"][0]}"}}'), 0.0, False,
                              {"tool_error": 1, "error": "parse"})
        if call.name == "answer":
            value = call.args.get("value", "")
            # a list or object is never the number (and str() of a deeply nested one could raise)
            value = str(value).strip() if isinstance(value, (str, int, float)) else ""
            self.answered = value
            return StepResult([], float(value == d["answer"]), True, {"tool_error": 0})
        if call.name != "lookup":
            return StepResult(self._obs(f"error: unknown tool {_shown(call.name)}; use lookup or answer"), 0.0,
                              False, {"tool_error": 1, "error": "unknown_tool"})
        key = call.args.get("key")
        if not isinstance(key, str) or key.strip() not in d["table"]:
            return StepResult(self._obs(f"error: unknown key {_shown(key)}. Keys: {', '.join(d['keys'])}"),
                              0.0, False, {"tool_error": 1, "error": "bad_argument"})
        key = key.strip()
        if self.opts.tool_failure and self.rng.random() < self.opts.tool_failure:
            return StepResult(self._obs("error: lookup service busy, try again"), 0.0, False,
                              {"tool_error": 0, "tool_failure": 1})
        reward = 0.0
        if key == self.position and self.chain_progress < d["hops"]:
            self.chain_progress += 1
            self.position = d["table"][key]
            reward = self.opts.intermediate_reward / d["hops"]
        target = d["table"][key]
        self.seen_values.append(target)
        if not self.opts.answer_required and self.chain_progress == d["hops"]:
            self.answered = target  # the number is revealed: the task is done
            return StepResult([], reward + 1.0, True, {"tool_error": 0})
        return StepResult(self._obs(f"{key} -> {target}"), reward, False, {"tool_error": 0})

    def score(self) -> float:
        return float(self.answered == self.task.data["answer"])

    def demo_action(self, rng: random.Random) -> str:
        """Format-correct, answer-blind: look up random listed keys, then answer with a value seen
        (or a random number); the number of lookups is random too."""
        d = self.task.data
        if d.get("answer_required", True) and self.seen_values and (
                rng.random() < 0.5 or len(self.seen_values) >= d["hops"]):
            value = rng.choice(self.seen_values + [str(rng.randint(10, 99))])
            return json.dumps({"tool": "answer", "value": value})
        return json.dumps({"tool": "lookup", "key": rng.choice(d["keys"])})

    def oracle_action(self) -> str:
        if self.chain_progress < self.task.data["hops"]:
            return json.dumps({"tool": "lookup", "key": self.position})
        return json.dumps({"tool": "answer", "value": self.position})


@register("lookup")
class LookupFamily(EnvFamily):
    name = "lookup"

    def __init__(self, **options):
        self.opts = LookupOptions(**options)

    def tasks(self, split: str) -> list[Task]:
        return self._sized_split(split, {"train": self.opts.train_tasks, "test": self.opts.test_tasks},
                                 lambda sp, i: make_task(self.opts, sp, i))

    def make(self, task: Task, *, seed: int) -> LookupEnv:
        return LookupEnv(task, self.opts, seed)
