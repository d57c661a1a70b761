"""``trap``: a two-decision tool task where turn-level credit matters.

Each task lists a few keys and asks for the number behind one of them. Two ways to get it:

- ``{"tool": "guess", "key": K}`` answers at once, and is right half the time (a coin per episode):
  the **trap**, worth at most ``guess_p`` (0.5) and easy to find;
- ``{"tool": "vault", "key": K}`` returns the key's sealed code; ``{"tool": "open", "code": C}`` with
  that code reveals the number: worth 1.0, but only through a correct *second* call.

Under a policy that has not learned to copy the code yet, opening fails, so the vault looks worse
than the guess at the first decision although it is the only way to the optimum: an early action
that looks better under the untrained later-turn policy forecloses the best outcome (the lab's trap
instances, in tool form). The oracle (vault the asked key, open its code) scores 1.0; the trap value
is ``guess_p``. Warm-up demonstrations are answer-blind: a random tool on a random listed key, and an
``open`` with a random code from the prompt's code list.

Per step ``info["count/guess"]`` / ``info["count/vault"]`` say which way an episode went, and
``info["count/deep"]`` that it succeeded through the vault (the trainer reports their means as
``env/guess``, ``env/vault`` and ``env/deep``, for training rollouts and for the before/after
evaluations); a run whose final iterations mostly guess has ended in the trap.

Knobs that break the bandit assumption (each 0 by default, as in ``lookup``; issue 16's robustness sweep):

- ``intermediate_reward``: reward ``w`` when the first call vaults the asked key (shaping: a per-turn
  reward on the path to the optimum);
- ``observation_noise``: probability that the vault's answer carries a distractor line naming another
  code (the sealed code is still given);
- ``tool_failure``: probability that a vault call fails with "busy, try again" (a stochastic tool; the
  episode then gets one more turn, ``max_turns`` 3).
"""

from __future__ import annotations

import json
import random
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from seeupo.envs.base import Env, EnvFamily, Message, StepResult, Task, register
from seeupo.envs.toolcall import ToolCall, extra_calls, get_parser

KEYS = ("red", "blue", "green", "gold", "pink", "gray", "cat", "dog", "fox", "owl", "bee", "cow")
CODES = ("amber", "coral", "ivory", "jade", "onyx", "pearl", "ruby", "topaz")


class TrapOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n_keys: int = Field(3, ge=2, le=len(KEYS), description="keys listed in each task")
    n_codes: int = Field(3, ge=2, le=len(CODES), description="codes listed in the prompt (the vault's code is one)")
    # small pools by default: the tiny model after its warm-up starts at 0.20 (docs/envs.md); with
    # all 12 / 8 words (key_pool: null, code_pool: null) it stays at 0.02 with a broken call format
    key_pool: Optional[list[str]] = Field(["red", "blue", "green"], description="words keys are drawn from "
                                          "(null: 12 built-in words)")
    code_pool: Optional[list[str]] = Field(["amber", "coral", "ivory"], description="words codes are drawn from "
                                           "(null: 8 built-in words)")
    guess_p: float = Field(0.5, ge=0.0, le=1.0, description="P(a guess on the asked key is right): the trap value")
    intermediate_reward: float = Field(0.0, ge=0.0, le=1.0, description="reward for vaulting the asked key (shaping)")
    observation_noise: float = Field(0.0, ge=0.0, le=1.0, description="P(a distractor code line in the vault's answer)")
    tool_failure: float = Field(0.0, ge=0.0, le=1.0, description="P(a vault call fails with 'busy, try again')")
    train_tasks: int = Field(256, ge=1, description="tasks in the train split")
    test_tasks: int = Field(64, ge=1, description="tasks in the held-out test split")
    parser: str = Field("json", description="tool-call parser name")
    seed: int = Field(0, description="seed of the task sets")

    def model_post_init(self, _):
        for name, pool, n in (("key_pool", self.key_pool, self.n_keys), ("code_pool", self.code_pool, self.n_codes)):
            if pool is not None and len(set(pool)) < n:
                raise ValueError(f"{name} has {len(set(pool))} distinct words, fewer than {n} (n_keys / n_codes)")


def make_task(opts: TrapOptions, split: str, index: int) -> Task:
    rng = random.Random(f"trap|{opts.seed}|{split}|{index}")
    keys = rng.sample(sorted(set(opts.key_pool or KEYS)), opts.n_keys)
    codes = rng.sample(sorted(set(opts.code_pool or CODES)), opts.n_codes)
    numbers = {k: str(rng.randint(10, 99)) for k in keys}
    sealed = {k: rng.choice(codes) for k in keys}
    return Task(id=f"trap-{split}-{index}", split=split,
                data={"keys": keys, "codes": codes, "ask": rng.choice(keys), "numbers": numbers, "sealed": sealed})


def render_prompt(task: Task) -> list[Message]:
    d = task.data
    return [{"role": "user", "content": (
        "Write exactly one tool call per message, as JSON.\n"
        '{"tool": "guess", "key": "<key>"} answers at once (sometimes wrong).\n'
        '{"tool": "vault", "key": "<key>"} gives the key\'s sealed code; then '
        '{"tool": "open", "code": "<code>"} opens it and answers.\n'
        f"Keys: {', '.join(d['keys'])}. Codes: {', '.join(d['codes'])}.\n"
        f"Task: find the number of the key {d['ask']}.")}]


class TrapEnv(Env):

    def __init__(self, task: Task, opts: TrapOptions, seed: int):
        self.task, self.opts = task, opts
        self.parse = get_parser(opts.parser)
        rng = random.Random(seed)
        self.coin = rng.random() < opts.guess_p  # this episode's guess is right
        self.rng = rng  # the knobs' draws come after the coin: with every knob at 0 episodes are as before
        self.max_turns = 3 if opts.tool_failure else 2
        self.vaulted: str | None = None  # the key whose code was shown
        self.success = 0.0

    def reset(self) -> list[Message]:
        return render_prompt(self.task)

    def step(self, assistant_text: str) -> StepResult:
        res = self._step(assistant_text)
        res.info["extra_calls"] = extra_calls(assistant_text, self.opts.parser)
        return res

    def _end(self, success: bool, info: dict) -> StepResult:
        self.success = float(success)
        return StepResult([], self.success, True, {"tool_error": 0, **info})  # the score; shaping came before

    def _step(self, text: str) -> StepResult:
        d = self.task.data
        call = self.parse(text)
        if not isinstance(call, ToolCall):
            return StepResult([{"role": "user", "content": f"error: {call.message}. Write one JSON tool call."}],
                              0.0, False, {"tool_error": 1, "error": "parse"})
        if self.vaulted is None:
            key = call.args.get("key")
            if call.name not in ("guess", "vault") or not isinstance(key, str) or key.strip() not in d["numbers"]:
                return StepResult([{"role": "user", "content": "error: use guess or vault with a listed key."}],
                                  0.0, False, {"tool_error": 1, "error": "bad_call"})
            key = key.strip()
            if call.name == "guess":
                return self._end(key == d["ask"] and self.coin, {"count/guess": 1})
            if self.opts.tool_failure and self.rng.random() < self.opts.tool_failure:
                return StepResult([{"role": "user", "content": "error: vault service busy, try again"}], 0.0, False,
                                  {"tool_error": 0, "tool_failure": 1})
            self.vaulted = key
            text = f"{key} is sealed with code: {d['sealed'][key]}"
            if self.opts.observation_noise and self.rng.random() < self.opts.observation_noise:
                text += f"\n(note: {self.rng.choice(d['keys'])} used code {self.rng.choice(d['codes'])} yesterday)"
            shaping = self.opts.intermediate_reward if key == d["ask"] else 0.0
            return StepResult([{"role": "user", "content": text}], shaping, False, {"tool_error": 0, "count/vault": 1})
        code = call.args.get("code")
        if call.name != "open" or not isinstance(code, str):
            return self._end(False, {"tool_error": 1, "error": "bad_call"})
        deep = self.vaulted == d["ask"] and code.strip() == d["sealed"][self.vaulted]
        return self._end(deep, {"count/deep": int(deep)})

    def score(self) -> float:
        return self.success

    def demo_action(self, rng: random.Random) -> str:
        d = self.task.data
        if self.vaulted is None:
            return json.dumps({"tool": rng.choice(["guess", "vault"]), "key": rng.choice(d["keys"])})
        return json.dumps({"tool": "open", "code": rng.choice(d["codes"])})

    def oracle_action(self) -> str:
        d = self.task.data
        if self.vaulted is None:
            return json.dumps({"tool": "vault", "key": d["ask"]})
        return json.dumps({"tool": "open", "code": d["sealed"][self.vaulted]})


@register("trap")
class TrapFamily(EnvFamily):
    name = "trap"
    counters = ("guess", "vault", "deep")  # always reported (env/guess, ...), 0 when no episode took it

    def __init__(self, **options):
        self.opts = TrapOptions(**options)

    def tasks(self, split: str) -> list[Task]:
        return self._sized_split(split, {"train": self.opts.train_tasks, "test": self.opts.test_tasks},
                                 lambda sp, i: make_task(self.opts, sp, i))

    def make(self, task: Task, *, seed: int) -> TrapEnv:
        return TrapEnv(task, self.opts, seed)
