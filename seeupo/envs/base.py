"""The environment protocol every environment follows, and the registry of environments by name.

A family (``EnvFamily``) owns the task sets and builds one ``Env`` per episode, so parallel episodes
never share state. An ``Env``:

- ``reset() -> list of messages``: the initial chat (system prompt, tool docs, first user message).
- ``step(assistant_text) -> StepResult``: the observation messages, a reward, ``done`` and an info
  dict: ``info["tool_error"]`` is 1 when the turn had a malformed or failed call, else 0 (never an
  exception); ``info["extra_calls"]`` counts calls beyond the one the environment acted on (0 where
  a reply may hold several calls, as in BFCL). The runner bounds every call by ``env.timeout_s``.
- ``score() -> float``: the outcome score in [0, 1] by the environment's own checker.
- ``demo_action(rng) -> str``: a format-correct action chosen *without* the answer (warm-up data).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

from seeupo.core.registry import pick

Message = dict  # {"role": ..., "content": ...}


class EnvUnavailable(RuntimeError):
    """An environment's package or data is missing; the message says how to install it."""


@dataclass(frozen=True)
class Task:
    id: str
    split: str
    data: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass
class StepResult:
    observation: list[Message]
    reward: float
    done: bool
    info: dict = field(default_factory=dict)


class Env(ABC):
    max_turns: int = 4

    @abstractmethod
    def reset(self) -> list[Message]: ...

    @abstractmethod
    def step(self, assistant_text: str) -> StepResult: ...

    @abstractmethod
    def score(self) -> float: ...

    def anchor_state(self) -> int | None:
        """A key of the state the next turn starts from, for the step groups of GiGPO and HGPO, where
        the environment keys on its own state; None (the default): the runner keys on the messages
        of the latest observation (``data.episode.anchor_key``)."""
        return None

    def demo_action(self, rng: random.Random) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no demonstration policy for the warm-up")


class EnvFamily(ABC):
    name: str = ""

    @abstractmethod
    def tasks(self, split: str) -> list[Task]: ...

    def _sized_split(self, split: str, sizes: dict[str, int], make: Callable[[str, int], Task]) -> list[Task]:
        """The tasks of ``split`` (``make(split, i)`` for ``i < sizes[split]``), built once and cached."""
        if split not in sizes:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(sizes)}")
        cache = self.__dict__.setdefault("_split_cache", {})
        if split not in cache:
            cache[split] = [make(split, i) for i in range(sizes[split])]
        return cache[split]

    @abstractmethod
    def make(self, task: Task, *, seed: int) -> Env: ...


ENVS: dict[str, Callable[..., EnvFamily]] = {}


def register(name: str):
    def deco(factory):
        ENVS[name] = factory
        return factory
    return deco


def make_family(name: str, options: dict[str, Any] | None = None) -> EnvFamily:
    """Build the environment family called ``name`` with its options (validated by the family)."""
    import seeupo.envs  # noqa: F401  (registers the built-in environments)

    return pick(ENVS, name, "environment")(**(options or {}))
