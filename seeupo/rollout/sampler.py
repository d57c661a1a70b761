"""Batched token sampling with a KV cache, one random generator per episode.

Each row samples from its own ``torch.Generator``, so an episode's tokens depend on its seed and
its own context only, not on which other episodes share the batch (up to float rounding). The
sampling log-prob of every token (at the sampling temperature) is returned with it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from seeupo.models.policy import cache_keyword


@dataclass
class Sample:
    ids: list[int]
    logp: list[float]
    finished: bool  # an end-of-turn token was sampled (it is the last id)


@dataclass
class Request:
    """What a policy gets for one live episode's next turn."""

    ids: list[int]  # the episode's token stream so far
    generator: torch.Generator  # the episode's own random stream
    max_new_tokens: int
    env: object  # the episode's environment (scripted policies read it; models do not)


class ScriptedPolicy:
    """A policy from a function ``script(env, rng) -> text`` (demonstrations, oracles, tests).

    The text is tokenised and closed with the end-of-turn token; log-probs are 0."""

    def __init__(self, script, encode, eos_id: int):
        self.script, self.encode, self.eos_id = script, encode, eos_id

    def act(self, requests: list[Request]) -> list[Sample]:
        out = []
        for r in requests:
            rng = random.Random(int(torch.randint(0, 2**62, (), generator=r.generator)))
            ids = self.encode(self.script(r.env, rng)) + [self.eos_id]
            finished = len(ids) <= r.max_new_tokens
            ids = ids[: r.max_new_tokens]
            out.append(Sample(ids, [0.0] * len(ids), finished))
        return out


def _sample_rows(logp_RV: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row from ``exp(logp)``, each row by inverse CDF with one uniform draw from its
    own generator (so a row's sample depends only on its own seed, not on the batch). One
    vectorised pass instead of a ``torch.multinomial`` call per row (3 ms each over a 49k vocabulary)."""
    cdf = logp_RV.double().exp().cumsum(-1)
    u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
    tok = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return tok.clamp_max(logp_RV.shape[-1] - 1)


@dataclass
class _Prefix:
    """An episode's keys and values from its previous turn: ``ids`` (the tokens they cover) and one
    ``(keys, values)`` pair per layer, each ``[kv_heads, len(ids), head_dim]``."""

    ids: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]


class HFSampler:
    """Generation with a Hugging Face causal LM (the default backend).

    ``prefix_cache``: keep each episode's keys and values from one turn to the next (keyed by the
    episode's random generator, dropped for episodes that do not come back in the next call), so a
    turn pre-fills only the tokens added since (the observation), not the whole history again.
    Used only where the new prompt starts with exactly the cached tokens. ``retain``: None, or a
    function of an episode's generator saying whether its entry outlives a call it is not in (the
    endpoint's open episodes, whose next calls may come in a later batch than the others')."""

    def __init__(self, model, *, pad_id: int, eos_ids: list[int], temperature: float = 1.0,
                 batch_size: int = 64, prefix_cache: bool = True):
        self.model, self.pad_id, self.eos_ids = model, pad_id, set(eos_ids)
        self.temperature, self.batch_size = temperature, batch_size
        self._cache_kw = cache_keyword(model)
        self.prefix_cache = prefix_cache
        self._prefixes: dict[torch.Generator, _Prefix] = {}
        self.retain = None
        self.prefilled_tokens = 0  # tokens run through the model before the first sampled token (diagnostic)

    turn_adapters = None  # models.turns.TurnAdapters: generate turn t under its adapter

    def begin_turn(self, turn: int) -> None:
        """The episode runner is about to generate turn ``turn``: with turn adapters, switch to its
        adapter; a cached prefix computed under another adapter is dropped (the turn's policy reads
        its whole context with its own parameters)."""
        if self.turn_adapters is None:
            return
        a = self.turn_adapters.of(turn)
        if a != self.turn_adapters.active:
            self._prefixes = {}
            self.turn_adapters.activate(a)

    def act(self, requests: list[Request]) -> list[Sample]:
        return self.generate([r.ids for r in requests], [r.generator for r in requests],
                             [r.max_new_tokens for r in requests])

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], generators: list[torch.Generator],
                 max_new_tokens: list[int]) -> list[Sample]:
        out: list[Sample] = []
        old, new = self._prefixes, {}
        prefixes = [None] * len(prompts)
        if self.prefix_cache:
            for i, (p, g) in enumerate(zip(prompts, generators)):
                pre = old.get(g)
                if pre is not None and len(pre.ids) < len(p) and p[: len(pre.ids)] == pre.ids:
                    prefixes[i] = pre
        self._prefixes = {}  # the previous turn's entries are used once, then dropped
        for s in range(0, len(prompts), self.batch_size):
            sl = slice(s, s + self.batch_size)
            samples, kept = self._generate(prompts[sl], generators[sl], max_new_tokens[sl], prefixes[sl])
            out += samples
            new.update(kept)
        if self.prefix_cache:
            if self.retain is not None:
                asked = set(generators)
                new.update({g: pre for g, pre in old.items() if g not in asked and self.retain(g)})
            self._prefixes = new
        return out

    def reset(self) -> None:
        """Forget every cached prefix (the weights changed, or a new set of episodes starts)."""
        self._prefixes = {}

    def _generate(self, prompts, generators, max_new, prefixes=None):
        from transformers import DynamicCache

        was_training = self.model.training
        self.model.eval()
        n = len(prompts)
        prefixes = prefixes or [None] * n
        cached = [len(pre.ids) if pre is not None else 0 for pre in prefixes]
        C = max(cached)
        suffix = [p[c:] for p, c in zip(prompts, cached)]
        width = max(len(p) for p in suffix)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        att = torch.zeros(n, C + width, dtype=torch.long)
        pos = torch.zeros(n, width, dtype=torch.long)
        for i, p in enumerate(suffix):  # left padding; a cached prefix sits right-aligned before it
            m = len(p)
            ids[i, width - m:] = torch.tensor(p)
            att[i, C - cached[i]:C] = 1
            att[i, C + width - m:] = 1
            pos[i, width - m:] = torch.arange(cached[i], cached[i] + m)
        self.prefilled_tokens += sum(len(p) for p in suffix)
        dev = next(self.model.parameters()).device
        ids, att, pos = ids.to(dev), att.to(dev), pos.to(dev)
        if C:
            first = next(pre for pre in prefixes if pre is not None)
            data = []
            for layer, (k0, v0) in enumerate(first.kv):
                K = k0.new_zeros(n, k0.shape[0], C, k0.shape[-1])
                V = v0.new_zeros(n, v0.shape[0], C, v0.shape[-1])
                for i, pre in enumerate(prefixes):
                    if pre is not None:
                        K[i, :, C - cached[i]:] = pre.kv[layer][0]
                        V[i, :, C - cached[i]:] = pre.kv[layer][1]
                data.append((K.to(dev), V.to(dev)))
            cache = DynamicCache(data)
        else:
            cache = DynamicCache()
        samples = [Sample([], [], False) for _ in range(n)]
        live = [m > 0 for m in max_new]
        step_input, step_pos = ids, pos
        # rows with the same prompt and the same cached part (a group's samples on their first turn)
        # pre-fill once; the cache is then copied out to each of them before they sample apart
        keys = [(tuple(p), c) for p, c in zip(prompts, cached)]
        first_of = {k: i for i, k in reversed(list(enumerate(keys)))}
        uniq = sorted(set(first_of.values()))
        spread = None
        if len(uniq) < n:
            where = {i: j for j, i in enumerate(uniq)}
            spread = torch.tensor([where[first_of[k]] for k in keys], device=dev)
            u = torch.tensor(uniq, device=dev)
            if C:
                cache.batch_select_indices(u)
            step_input, step_pos, att0 = ids[u], pos[u], att[u]
            self.prefilled_tokens -= sum(len(suffix[i]) for i in range(n) if i not in where)
        for step in range(max(max_new, default=0)):
            if not any(live):
                break
            logits = self.model(input_ids=step_input, attention_mask=att0 if spread is not None else att,
                                position_ids=step_pos, use_cache=True, logits_to_keep=1,
                                **{self._cache_kw: cache}).logits[:, -1].float().cpu()
            if spread is not None:  # the pre-fill ran on the distinct prompts: back to every row
                cache.batch_select_indices(spread)
                logits, step_pos, spread = logits[spread.cpu()], step_pos[spread], None
            t = self.temperature if self.temperature > 0 else 1.0
            logp_all = torch.log_softmax(logits / t, -1)
            nxt = torch.full((n,), self.pad_id, dtype=torch.long)
            rows = [i for i in range(n) if live[i]]
            if self.temperature > 0:
                picked = _sample_rows(logp_all[rows], [generators[i] for i in rows])
            else:
                picked = logp_all[rows].argmax(-1)
            for i, tok in zip(rows, picked.tolist()):
                nxt[i] = tok
                smp = samples[i]
                smp.ids.append(tok)
                smp.logp.append(float(logp_all[i, tok]))
                if tok in self.eos_ids:
                    smp.finished, live[i] = True, False
                elif len(smp.ids) >= max_new[i]:
                    live[i] = False
            step_input = nxt.unsqueeze(-1).to(dev)
            step_pos = step_pos[:, -1:] + 1
            att = torch.cat([att, torch.ones(n, 1, dtype=torch.long, device=dev)], -1)
        self.model.train(was_training)
        kept = {}
        if self.prefix_cache:
            # row i's cached tokens: its prefix, its new prompt tokens, then every sampled token but
            # the last (sampled token j went through the model at column C + width + j)
            for i, smp in enumerate(samples):
                k = len(smp.ids)
                if k == 0:
                    continue
                cols = torch.cat([torch.arange(C - cached[i], C), torch.arange(C + width - len(suffix[i]), C + width),
                                  torch.arange(C + width, C + width + k - 1)]).to(dev)
                kv = [(keys[i][:, cols].cpu(), values[i][:, cols].cpu()) for keys, values, *_ in cache]
                kept[generators[i]] = _Prefix(list(prompts[i]) + smp.ids[:-1], kv)
        return samples, kept
