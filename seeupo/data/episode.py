"""Episodes as the learner sees them: the exact token ids (sampled ones and the template/observation
ids around them), which tokens were generated, by which turn, and their sampling log-probs.

Row views for the learner:

- trajectory rows: one row per episode, the whole token stream, loss on every generated token.
- turn rows (turn pools): one row per (episode, turn), the stream cut at the end of that turn's
  response, loss on that turn's tokens only. Episodes that never reached turn ``t`` have no row.

With bounded turn contexts (``rollout.history=last:K``) a turn's prompt is rendered afresh (system
message, task, the last K exchanges, the current observation), so it is not a prefix of the next
turn's: the stream then holds one segment per turn, ``ids[turn_starts[t]:turn_ends[t]]`` (that
turn's prompt, then its response), a turn row is its segment, and there are no trajectory rows.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace

import torch

# end reasons that are not the policy's doing: the environment (or an agent program, seeupo.rollout.agent)
# raised or timed out, the agent made no model call, or the server refused one of its calls
FAULTS = ("error", "timeout", "no_call", "refused")


def anchor_key(messages: list[dict]) -> int:
    """A 63-bit key of an observation (its messages' roles and contents): equal observations, equal keys.

    >>> anchor_key([{"role": "user", "content": "room A"}]) == anchor_key([{"role": "user", "content": "room A"}])
    True
    >>> anchor_key([{"role": "user", "content": "room A"}]) == anchor_key([{"role": "tool", "content": "room A"}])
    False
    """
    text = json.dumps([[m.get("role"), m.get("content")] for m in messages], ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def derive_seed(*parts) -> int:
    """A stable 63-bit seed from any parts (run seed, iteration, task, sample...)."""
    h = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


@dataclass
class Episode:
    episode_id: int
    task_id: str
    group: int  # episodes of one task in one iteration share a group
    sample: int
    seed: int
    ids: list[int] = field(default_factory=list)
    gen_mask: list[int] = field(default_factory=list)  # 1 for sampled tokens
    turn_of: list[int] = field(default_factory=list)  # turn index of sampled tokens, -1 elsewhere
    logp: list[float] = field(default_factory=list)  # sampling log-prob of sampled tokens, 0 elsewhere
    turn_ends: list[int] = field(default_factory=list)  # position after each turn's last sampled token
    # where each turn's row starts in ``ids``: empty (every turn's row starts at 0: one growing stream),
    # or one start per turn (history=last:K: each turn's prompt is its own segment)
    turn_starts: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # decoded responses, one per turn
    step_rewards: list[float] = field(default_factory=list)
    score: float = 0.0
    end_reason: str = ""
    tool_errors: int = 0
    truncated_turns: int = 0  # responses cut by the per-turn token limit
    prefix_mismatches: int = 0
    error: str = ""  # the exception text when an environment call failed or timed out
    extra_calls: int = 0  # tool calls beyond the one a turn acts on (envs report info["extra_calls"])
    counts: dict = field(default_factory=dict)  # an environment's own counters (info["count/NAME"])
    # per turn, the anchor state it started from (GiGPO's step groups): ``anchor_key`` of the
    # environment's messages before the turn (the reset's for turn 0, the previous step's observation after)
    anchors: list[int] = field(default_factory=list)

    @property
    def faulted(self) -> bool:
        """Ended by the environment or the agent program (a crash, a timeout, no call, a refused
        call), not by the policy: such episodes are counted and left out of the loss and the group
        baselines."""
        return self.end_reason in FAULTS

    @property
    def n_turns(self) -> int:
        return len(self.turn_ends)

    def row_start(self, t: int) -> int:
        """Where turn ``t``'s row (its prompt, then its response) starts in ``ids``."""
        return self.turn_starts[t] if self.turn_starts else 0

    @property
    def segmented(self) -> bool:
        """A turn's prompt is not a prefix of the next turn's (``rollout.history=last:K``)."""
        return any(self.turn_starts)

    @property
    def reward(self) -> float:
        return float(sum(self.step_rewards))

    def first_turns(self, n: int) -> "Episode":
        """This episode cut after its first ``n`` turns, as if it had ended there (a copy)."""
        if not 1 <= n <= self.n_turns:
            raise ValueError(f"first_turns({n}): the episode has {self.n_turns} turns")
        end = self.turn_ends[n - 1]
        return replace(self, ids=self.ids[:end], gen_mask=self.gen_mask[:end], turn_of=self.turn_of[:end],
                       logp=self.logp[:end], turn_ends=self.turn_ends[:n], turn_starts=self.turn_starts[:n],
                       texts=self.texts[:n], anchors=self.anchors[:n],
                       step_rewards=self.step_rewards[:n])

    def append(self, ids: list[int], *, turn: int = -1, logp: list[float] | None = None) -> None:
        self.ids += ids
        gen = turn >= 0
        self.gen_mask += [int(gen)] * len(ids)
        self.turn_of += [turn if gen else -1] * len(ids)
        self.logp += (logp if gen else None) or [0.0] * len(ids)


@dataclass
class Rows:
    """A padded batch of rows (right padding)."""

    input_ids: torch.Tensor  # [R, L]
    attention_mask: torch.Tensor  # [R, L]
    loss_mask: torch.Tensor  # [R, L] tokens trained on in this row
    old_logp: torch.Tensor  # [R, L] sampling log-probs
    episode: torch.Tensor  # [R] index of the episode in the batch
    turn: torch.Tensor  # [R] turn index (-1 for trajectory rows)
    token_turn: torch.Tensor | None = None  # [R, L] turn of each sampled token, -1 elsewhere
    placeholder: torch.Tensor | None = None  # [R] bool: the authors' placeholder rows (turn_rows(placeholders_to=))

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx) -> "Rows":
        idx = torch.as_tensor(idx, dtype=torch.long)
        sub = Rows(*(getattr(self, f)[idx] for f in ("input_ids", "attention_mask", "loss_mask",
                                                     "old_logp", "episode", "turn")),
                   token_turn=None if self.token_turn is None else self.token_turn[idx],
                   placeholder=None if self.placeholder is None else self.placeholder[idx])
        width = int(sub.attention_mask.sum(-1).max()) if len(sub) else 0
        return sub.trim(width)

    def to(self, device) -> "Rows":
        """The rows on ``device`` (the same object's tensors where they are there already)."""
        return Rows(*(getattr(self, f).to(device) for f in ("input_ids", "attention_mask", "loss_mask", "old_logp",
                                                             "episode", "turn")),
                    token_turn=None if self.token_turn is None else self.token_turn.to(device),
                    placeholder=None if self.placeholder is None else self.placeholder.to(device))

    def trim(self, width: int) -> "Rows":
        return Rows(self.input_ids[:, :width], self.attention_mask[:, :width], self.loss_mask[:, :width],
                    self.old_logp[:, :width], self.episode, self.turn,
                    None if self.token_turn is None else self.token_turn[:, :width], self.placeholder)


def _pad(rows: list[tuple[list[int], list[int], list[float], int, int, list[int]]], pad_id: int) -> Rows:
    width = max((len(r[0]) for r in rows), default=0)
    n = len(rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    att = torch.zeros(n, width, dtype=torch.long)
    lm = torch.zeros(n, width, dtype=torch.long)
    lp = torch.zeros(n, width, dtype=torch.float32)
    tt = torch.full((n, width), -1, dtype=torch.long)
    for i, (r_ids, r_mask, r_logp, _, _, r_turn) in enumerate(rows):
        k = len(r_ids)
        ids[i, :k] = torch.tensor(r_ids)
        att[i, :k] = 1
        lm[i, :k] = torch.tensor(r_mask)
        lp[i, :k] = torch.tensor(r_logp)
        tt[i, :k] = torch.tensor(r_turn)
    return Rows(ids, att, lm, lp, torch.tensor([r[3] for r in rows], dtype=torch.long),
                torch.tensor([r[4] for r in rows], dtype=torch.long), tt)


def trajectory_rows(episodes: list[Episode], pad_id: int) -> Rows:
    if any(e.segmented for e in episodes):
        raise ValueError("episodes with bounded turn contexts (rollout.history=last:K) have no trajectory rows: "
                         "a turn's tokens never saw the earlier turns' prompts; train on turn rows (algo.rows=turn)")
    return _pad([(e.ids, e.gen_mask, e.logp, i, -1, e.turn_of) for i, e in enumerate(episodes)], pad_id)


def turn_rows(episodes: list[Episode], pad_id: int, *, turns=None, alignment: str = "from_start",
              placeholders_to: int | None = None) -> Rows:
    """One row per (episode, turn) for the turns asked (all by default). ``alignment="from_end"``
    numbers turns back from each episode's last turn (0 = last), an experiment of SPEC §3.

    ``placeholders_to=T`` reproduces the authors' code (SPEC §3): every episode also gets a row for
    each turn index it did not reach below ``T``, a copy of its last turn's row (its tokens and mask),
    flagged in ``Rows.placeholder``. The drivers give such rows advantage 0 (no policy loss) but,
    as the authors' code does, count them in the row mean, apply the KL penalty to their tokens and
    multiply the copied turn's ratio into the factor."""
    out, flags = [], []
    for i, e in enumerate(episodes):
        for t, end in enumerate(e.turn_ends):
            label = t if alignment == "from_start" else e.n_turns - 1 - t
            if turns is not None and label not in turns:
                continue
            a = e.row_start(t)
            mask = [int(m and k == t) for m, k in zip(e.gen_mask[a:end], e.turn_of[a:end])]
            out.append((e.ids[a:end], mask, e.logp[a:end], i, label, e.turn_of[a:end]))
            flags.append(False)
        if placeholders_to and e.turn_ends:
            end, last = e.turn_ends[-1], e.n_turns - 1
            a = e.row_start(last)
            mask = [int(m and k == last) for m, k in zip(e.gen_mask[a:end], e.turn_of[a:end])]
            for t in range(e.n_turns, placeholders_to):
                out.append((e.ids[a:end], mask, e.logp[a:end], i, t, [-1] * (end - a)))
                flags.append(True)
    rows = _pad(out, pad_id)
    if placeholders_to:
        rows.placeholder = torch.tensor(flags, dtype=torch.bool)
    return rows
