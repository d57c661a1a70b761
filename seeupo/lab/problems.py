"""Tabular problems for the convergence lab.

A problem has ``n_tasks`` tasks and ``T`` turns. A turn's response is ``L`` tokens from a vocabulary
of ``V``, generated one token at a time, so token-level and sequence-level ratios differ as they do
for LLMs. Turn ``t`` observes the task and every earlier token (a tree), and the episode ends with an
outcome reward ``R(task, tokens)``. All ``V**(T*L)`` trajectories are enumerated, so expectations
can be computed exactly.

Two parameterisations index the logits of the token at position ``j`` of trajectory ``tau``:

- ``per_turn``: one logit vector per node of the token tree (its whole prefix): each turn has its
  own parameters, as the theory assumes.
- ``shared``: one logit vector per (previous turn's response, prefix within the current turn). Turns
  2..T with the same previous response share parameters, as an LLM shares weights across turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

POLICIES = ("per_turn", "shared")


@dataclass(frozen=True)
class TreeShape:
    turns: int  # T
    tokens_per_turn: int  # L
    vocab: int  # V

    @property
    def horizon(self) -> int:
        return self.turns * self.tokens_per_turn

    @property
    def n_traj(self) -> int:
        return self.vocab**self.horizon

    @cached_property
    def tokens(self) -> torch.Tensor:
        """``[n_traj, H]`` every token sequence, trajectory ``k`` = ``k`` written in base ``V``."""
        k = torch.arange(self.n_traj)
        powers = self.vocab ** torch.arange(self.horizon - 1, -1, -1)
        return (k.unsqueeze(-1) // powers) % self.vocab

    def _code(self, cols: slice) -> torch.Tensor:
        """Integer code (base V) of ``tokens[:, cols]``; 0 for an empty slice."""
        part = self.tokens[:, cols]
        if part.shape[1] == 0:
            return torch.zeros(self.n_traj, dtype=torch.long)
        powers = self.vocab ** torch.arange(part.shape[1] - 1, -1, -1)
        return (part * powers).sum(-1)

    @cached_property
    def tree_node(self) -> torch.Tensor:
        """``[n_traj, H]`` index of the tree node (full prefix) at which each token is chosen."""
        cols, offset = [], 0
        for j in range(self.horizon):
            cols.append(offset + self._code(slice(0, j)))
            offset += self.vocab**j
        return torch.stack(cols, -1)

    @property
    def n_tree_nodes(self) -> int:
        return sum(self.vocab**j for j in range(self.horizon))

    @cached_property
    def shared_key(self) -> torch.Tensor:
        """``[n_traj, H]`` index of the shared (turn-agnostic) parameter row of each token."""
        L, V = self.tokens_per_turn, self.vocab
        n_prev = V**L + 1  # every previous response, plus "none" for the first turn
        offsets = [sum(n_prev * V**q for q in range(p)) for p in range(L)]
        cols = []
        for j in range(self.horizon):
            t, p = divmod(j, L)
            prev = self._code(slice((t - 1) * L, t * L)) if t > 0 else torch.full((self.n_traj,), V**L)
            within = self._code(slice(t * L, t * L + p))
            cols.append(offsets[p] + prev * V**p + within)
        return torch.stack(cols, -1)

    @property
    def n_shared_keys(self) -> int:
        return (self.vocab**self.tokens_per_turn + 1) * sum(
            self.vocab**q for q in range(self.tokens_per_turn))

    def keys(self, policy: str) -> tuple[torch.Tensor, int]:
        if policy == "per_turn":
            return self.tree_node, self.n_tree_nodes
        if policy == "shared":
            return self.shared_key, self.n_shared_keys
        raise ValueError(f"unknown lab policy {policy!r}; valid names: {', '.join(POLICIES)}")

    def turn_code(self, t: int) -> torch.Tensor:
        """``[n_traj]`` index (base V) of each trajectory's response at turn ``t``."""
        L = self.tokens_per_turn
        return self._code(slice(t * L, (t + 1) * L))


@dataclass
class Problem:
    """A batch of independent problem instances of one shape, one per seed."""

    name: str
    shape: TreeShape
    rewards: torch.Tensor  # [S, n_tasks, n_traj] float64 in [0, 1]

    @property
    def n_seeds(self) -> int:
        return self.rewards.shape[0]

    @property
    def n_tasks(self) -> int:
        return self.rewards.shape[1]

    @property
    def optimum(self) -> torch.Tensor:
        """``[S]`` best expected return: mean over tasks of the best trajectory's reward."""
        return self.rewards.max(-1).values.mean(-1)

    @property
    def reward_range(self) -> torch.Tensor:
        """``[S]`` max minus min reward over the instance."""
        flat = self.rewards.flatten(1)
        return flat.max(-1).values - flat.min(-1).values


def separated_problem(shape: TreeShape, n_tasks: int, seeds: list[int], *, bonus: float = 0.7) -> Problem:
    """Random instances whose optimum is clearly separated.

    Each task hides a target response per turn. ``R = bonus * m / T + (1 - bonus) * u`` where ``m`` is
    the number of leading turns that match the target and ``u ~ U(0, 1)`` per trajectory, except
    that the target trajectory gets ``u = 1``, i.e. ``R = 1``. Every other trajectory has
    ``R <= bonus * (T - 1) / T + 1 - bonus``, so the optimum is unique and separated (by 0.23 for
    T=3, by 0.7 for T=1 with the default bonus).
    """
    out = []
    n_resp = shape.vocab**shape.tokens_per_turn
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        targets = torch.randint(0, n_resp, (n_tasks, shape.turns), generator=g)
        u = torch.rand(n_tasks, shape.n_traj, generator=g, dtype=torch.float64)
        match = torch.stack([shape.turn_code(t).unsqueeze(0) == targets[:, t:t + 1]
                             for t in range(shape.turns)], -1)  # [tasks, traj, T]
        leading = torch.cumprod(match.long(), -1).sum(-1)  # leading turns matched
        u = torch.where(leading == shape.turns, torch.ones_like(u), u)
        out.append(bonus * leading.double() / shape.turns + (1 - bonus) * u)
    return Problem("separated", shape, torch.stack(out))


def iid_problem(shape: TreeShape, n_tasks: int, seeds: list[int]) -> Problem:
    """Rewards drawn i.i.d. U(0, 1) per trajectory: many near-ties among the best trajectories."""
    rewards = [torch.rand(n_tasks, shape.n_traj, generator=torch.Generator().manual_seed(s),
                          dtype=torch.float64) for s in seeds]
    return Problem("iid", shape, torch.stack(rewards))


def trap_problem(seeds: list[int], tokens_per_turn: int = 2) -> Problem:
    """A family of two-turn instances where later states' values differ strongly from the task's;
    each seed draws its own reward tables (and, in the runner, its own initial policy).

    Shape: T=2, L=``tokens_per_turn`` (default 2), V=2 (4 responses a turn, 16 trajectories). Two
    tasks per instance, with the responses that matter drawn at random:

    - "needle": one first response ``a*`` leads to the global best (1.0, behind one second response
      ``b*``) inside a subtree whose other continuations give at most 0.1, so its state value under a
      uniform policy is about 0.3; every other first response gives a flat ``U(0.4, 0.6)`` whatever
      follows (state value about 0.5). A myopic turn-1 update moves away from ``a*``.
    - "mirage": one first response gives a flat ``U(0.6, 0.75)`` (state value far above the other
      subtrees' ~0.3); each other first response hides a high reward behind one second response, 0.0
      to 0.1 elsewhere; one of them hides the optimum 1.0, the others ``U(0.8, 0.9)``.

    The optimum (1.0 in each task) is unique and at least 0.1 above any other trajectory.
    """
    shape = TreeShape(turns=2, tokens_per_turn=tokens_per_turn, vocab=2)
    a1, a2 = shape.turn_code(0), shape.turn_code(1)
    n = shape.vocab**shape.tokens_per_turn
    out = []
    for seed in seeds:
        g = torch.Generator().manual_seed(7919 * seed + 11)

        def u(lo, hi, size=()):
            return lo + (hi - lo) * torch.rand(size, generator=g, dtype=torch.float64)

        def pick():
            return int(torch.randint(0, n, (), generator=g))

        low = u(0.0, 0.1, (shape.n_traj,))  # off-path noise, separate per task
        a_star, b_star = pick(), pick()
        flat = u(0.4, 0.6, (n,))
        needle = torch.where(a1 == a_star, torch.where(a2 == b_star, 1.0, low), flat[a1])
        low = u(0.0, 0.1, (shape.n_traj,))
        m_first = pick()
        hidden = torch.randint(0, n, (n,), generator=g)
        value = u(0.8, 0.9, (n,))
        others = [a for a in range(n) if a != m_first]
        value[others[int(torch.randint(0, len(others), (), generator=g))]] = 1.0
        behind = torch.where(a2 == hidden[a1], value[a1], low)
        mirage = torch.where(a1 == m_first, u(0.6, 0.75), behind)
        out.append(torch.stack([needle, mirage]))
    return Problem("trap", shape, torch.stack(out))
