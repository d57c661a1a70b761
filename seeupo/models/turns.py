"""Turn-specific parameters (issue 16): a LoRA adapter per turn index or per bucket of turns.

HAML, the theory behind SeeUPO, gives every turn (every virtual agent) its own policy; an LLM
shares one set of parameters across turns. ``model.turn_adapters`` narrows that gap:

- ``shared``: one adapter for every turn (the default; nothing here is used);
- ``per_turn``: adapter ``t`` for turn ``t`` (``rollout.max_turns`` adapters);
- ``buckets:B``: ``B`` adapters over consecutive runs of turn indices (turn ``t`` of ``T =
  rollout.max_turns`` uses adapter ``t * B // T``).

Turn ``t``'s policy is the base model plus adapter ``a(t)`` applied to the **whole** context it reads
(the agent's parameters process its own observation), so a turn's tokens get gradients only in its
own adapter; a row holds one turn's loss and runs under that turn's adapter (the learner splits rows
by adapter), generation sets the adapter of the turn being generated, and a turn's prompt is pre-filled
under its own adapter (no key/value cache carried over from a turn run under another adapter).

``model.turn_embedding`` adds a learned vector per turn index (zero at the start) to the input
embeddings of that turn's forward, its whole context, in the same way: rows are then split by turn
index, and each turn's generation and rows run with its own vector.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from seeupo.core.schedule import positive_suffix

SPECS = ("shared", "per_turn", "buckets:B")


def adapter_count(spec: str, max_turns: int) -> int:
    """Adapters of a spec (1 for ``shared``); ``ValueError`` naming the valid specs otherwise."""
    if spec == "shared":
        return 1
    if spec == "per_turn":
        return max_turns
    if spec.startswith("buckets:"):
        return min(positive_suffix(spec, f"model.turn_adapters={spec!r}: the bucket count"), max_turns)
    raise ValueError(f"model.turn_adapters={spec!r}; valid: {', '.join(SPECS)}")


class TurnAdapters:
    """The adapters of one PEFT model and which one each turn uses.

    Example:
        >>> TurnAdapters.index_of(5, n=2, max_turns=6), TurnAdapters.index_of(2, n=2, max_turns=6)
        (1, 0)
    """

    def __init__(self, model: nn.Module, spec: str, max_turns: int, embedding: nn.Parameter | None = None):
        self.model, self.spec, self.max_turns = model, spec, max_turns
        self.n_adapters = adapter_count(spec, max_turns)
        self.embedding = embedding  # [max_turns, hidden] or None
        # a slot is what one micro-batch runs under: an adapter, or with the embedding a turn index
        self.n = max_turns if embedding is not None else self.n_adapters
        self.names = [self.name(i) for i in range(self.n_adapters)]
        self._layers = [m for m in model.modules() if hasattr(m, "_active_adapter") and hasattr(m, "lora_A")]
        self.active: int | None = None
        if embedding is not None:
            model.get_input_embeddings().register_forward_hook(self._add_turn_vector)

    def _add_turn_vector(self, module, args, out):
        return out if self.active is None else out + self.embedding[self.active].to(out.dtype)

    @staticmethod
    def name(i: int) -> str:
        return "default" if i == 0 else f"turn{i}"  # adapter 0 keeps PEFT's name (shared checkpoints alike)

    @staticmethod
    def index_of(turn: int, *, n: int, max_turns: int) -> int:
        return min(max(int(turn), 0) * n // max_turns, n - 1)

    def of(self, turn: int) -> int:
        """The slot of turn ``turn``: its adapter, or with the embedding its index (turns past
        ``max_turns - 1`` use the last)."""
        return self.index_of(turn, n=self.n, max_turns=self.max_turns)

    def of_rows(self, turns: torch.Tensor) -> torch.Tensor:
        """Adapters of turn rows ``[R]`` (a trajectory row, turn -1, has none: ``ValueError``)."""
        if bool((turns < 0).any()):
            raise ValueError("turn adapters need one row per turn (a trajectory row spans turns run by different "
                             "adapters): use turn rows")
        return torch.tensor([self.of(int(t)) for t in turns.tolist()], dtype=torch.long)

    def activate(self, i: int) -> None:
        """Make adapter ``i`` the one every LoRA layer applies, without touching ``requires_grad``
        (PEFT's ``set_adapter`` freezes the others, which would drop them from the optimizer)."""
        if self.active == i:
            return
        a = i if self.embedding is None else self.index_of(i, n=self.n_adapters, max_turns=self.max_turns)
        for m in self._layers:
            m._active_adapter = [self.names[a]]
        self.active = i

    @contextmanager
    def using(self, i: int):
        prev = self.active
        self.activate(i)
        try:
            yield
        finally:
            if prev is not None:
                self.activate(prev)


def add_turn_adapters(model: nn.Module, spec: str, max_turns: int, *, seed: int = 0,
                      embedding: bool = False) -> TurnAdapters | None:
    """Give a model the adapters of ``spec`` beyond its first (a PEFT model's; copies of its
    configuration, each initialised from its own seed; LoRA's zero-initialised B makes every turn
    start as the shared policy), all trainable, and with ``embedding`` a zero-initialised vector per
    turn index (``model.seeupo_turn_embedding``, trainable); None when there is neither."""
    if spec == "shared" and not embedding:
        return None
    n = adapter_count(spec, max_turns)
    if n > 1:
        config = model.peft_config["default"]
        for i in range(1, n):
            with torch.random.fork_rng():
                torch.manual_seed(seed * 1000 + i)
                model.add_adapter(TurnAdapters.name(i), config)
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.requires_grad_(True)
    vec = None
    if embedding:
        w = model.get_input_embeddings().weight
        vec = nn.Parameter(torch.zeros(max_turns, w.shape[1], dtype=w.dtype, device=w.device))
        model.seeupo_turn_embedding = vec  # registered: trained, checkpointed, swapped for the KL reference
    ta = TurnAdapters(model, spec, max_turns, embedding=vec)
    ta.activate(0)
    return ta
