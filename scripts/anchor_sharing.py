"""How often TextWorld's turns share an anchor state with another turn of their group, under the two
anchor keys (``env.options.anchor: observation | state``): the share of turns GiGPO's step part and
HGPO's level-1 groups act on.

    python scripts/anchor_sharing.py --out results/anchors/textworld.json   # about a minute

Model-free: each group is 8 episodes of one game of the textworld preset's training split, played by a
random policy that sends an admissible command, or with probability ``--wrong`` (0.2) a command the
game does not accept (the mistakes a model makes); anchors are computed as the runner computes them
(the observation's messages, or the game's facts). The shares a training run sees are in its
``metrics.jsonl`` (``anchors/shared_fraction``)."""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from seeupo.core.advantages import shared_anchor_fraction
from seeupo.data.episode import anchor_key
from seeupo.envs.base import make_family
from seeupo.train.config import load_config


def play(env, rng: random.Random, max_turns: int, wrong: float) -> list[int]:
    obs = env.reset()
    keys = []
    for _ in range(max_turns):
        own = env.anchor_state()
        keys.append(anchor_key(obs) if own is None else own)
        cmd = "xyzzy" if rng.random() < wrong else env.demo_action(rng)
        res = env.step(cmd)
        if res.done:
            break
        obs = res.observation
    env.score()  # closes the game
    return keys


def measure(anchor: str, games: int, group: int, wrong: float, seed: int) -> dict:
    opts = dict(load_config("textworld").env.options)
    fam = make_family("textworld", {**opts, "anchor": anchor})
    rng = random.Random(seed)
    keys, groups = [], []
    for g, task in enumerate(fam.tasks("train")[:games]):
        for i in range(group):
            keys.append(play(fam.make(task, seed=i), rng, fam.opts.max_steps, wrong))
            groups.append(g)
    width = max(len(k) for k in keys)
    k_NT = torch.zeros(len(keys), width, dtype=torch.long)
    m_NT = torch.zeros(len(keys), width, dtype=torch.long)
    for i, k in enumerate(keys):
        k_NT[i, :len(k)] = torch.tensor([x % 2**62 for x in k])
        m_NT[i, :len(k)] = 1
    return {"anchor": anchor, "shared_fraction": round(shared_anchor_fraction(torch.tensor(groups), k_NT, m_NT), 4),
            "turns": int(m_NT.sum()), "distinct_anchors_per_group": round(
                sum(len({(k_NT[i, t].item()) for i in range(len(keys)) for t in range(width) if m_NT[i, t] and groups[i] == g})
                    for g in set(groups)) / len(set(groups)), 2)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--games", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--wrong", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rec = {"command": "python scripts/anchor_sharing.py " + " ".join(argv or sys.argv[1:]),
           "games": a.games, "group": a.group, "wrong": a.wrong, "seed": a.seed,
           "rows": [measure(k, a.games, a.group, a.wrong, a.seed) for k in ("observation", "state")]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rec, indent=1) + "\n")
    for r in rec["rows"]:
        print(f"anchor {r['anchor']:11s}: {r['shared_fraction']:.3f} of {r['turns']} turns share an anchor state; "
              f"{r['distinct_anchors_per_group']} distinct per group")


if __name__ == "__main__":
    main()
