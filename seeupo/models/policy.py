"""The policy as the learner sees it: a causal LM (optionally LoRA-wrapped), an optional value head,
and log-probabilities of chosen tokens computed only where they are needed.

``token_logprobs`` runs the decoder once and applies the LM head only at the positions whose next
token is scored (the generated tokens), so a long context with a short response does not pay for
a ``[B, L, vocab]`` logits tensor.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import dataclass

import torch
from torch import nn

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def apply_lora(model: nn.Module, *, r: int = 16, alpha: int = 32, dropout: float = 0.0,
               target_modules: tuple[str, ...] = LORA_TARGETS, seed: int = 0) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    targets = [t for t in target_modules if t in present]
    if not targets:
        raise ValueError(f"none of the LoRA target modules {list(target_modules)} exist in this model")
    with torch.random.fork_rng(), warnings.catch_warnings():
        # peft reads transformers' deprecated `is_gradient_checkpointing` (a FutureWarning on every run);
        # the value it reads is the same under the new name, so the warning tells the user nothing
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        torch.manual_seed(seed)
        return get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                                                target_modules=targets, bias="none"))


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def decoder_parts(model: nn.Module):
    base = model.get_base_model() if is_peft(model) else model
    return base.get_decoder(), base.get_output_embeddings()


class ValueHead(nn.Module):
    """A linear value head on the final hidden state, zero-initialised (PPO's critic)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h).squeeze(-1)


@dataclass
class TokenScores:
    logp: torch.Tensor  # [B, L] log-prob of input_ids[:, j] given the prefix; 0 where not scored
    entropy: torch.Tensor  # [B, L] entropy of that next-token distribution; 0 where not scored
    values: torch.Tensor | None  # [B, L] value of the state before token j (with a value head)
    cont_logp: torch.Tensor | None = None  # [B, E] log-probs of the continuation's scored tokens (no grad)


@dataclass
class Continuation:
    """Tokens that follow each (right-padded) row, scored without gradient from the rows' KV cache:
    row ``b`` continues at position ``attention_mask[b].sum()``. SeeUPO's fused factor pass uses it
    for the next turn's tokens, which cost a forward pass over themselves only."""

    input_ids: torch.Tensor  # [B, E] right padding
    attention_mask: torch.Tensor  # [B, E] 1 for real tokens
    score_mask: torch.Tensor  # [B, E] tokens whose log-probs are wanted

    def to(self, device) -> "Continuation":
        return Continuation(self.input_ids.to(device), self.attention_mask.to(device), self.score_mask.to(device))

    def select(self, idx) -> "Continuation":
        """Rows ``idx``, trimmed to their longest continuation (at least one position, masked when
        none of them continues: every micro-batch makes the same calls, as FSDP2 needs)."""
        att = self.attention_mask[idx]
        w = max(int(att.sum(-1).max()) if len(att) else 0, 1)
        return Continuation(self.input_ids[idx][:, :w], att[:, :w], self.score_mask[idx][:, :w])


def pack_lanes(lengths: list[int], width: int) -> list[list[int]]:
    """First-fit decreasing: row indices into lanes of ``width`` tokens (each lane's rows in order).
    Rows are taken longest first (ties by index), so the plan depends only on the lengths."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    lanes: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = lengths[i]
        for k, f in enumerate(free):
            if f >= n:
                lanes[k].append(i)
                free[k] -= n
                break
        else:
            lanes.append([i])
            free.append(width - n)
    return lanes


@dataclass
class Packing:
    """Right-padded rows ``[B, L]`` laid end to end in ``P`` lanes of width ``W >= L``: the positions
    restart at 0 for every row (and for each lane's padding tail), which transformers turns into a
    block-diagonal causal mask when no attention mask is given. ``flat[b, j]`` is where row ``b``'s
    position ``j`` sits in the flattened lanes (clamped for the row's own padding)."""

    input_ids: torch.Tensor  # [P, W]
    position_ids: torch.Tensor  # [P, W]
    flat: torch.Tensor  # [B, L] indices into the [P * W] flattened lanes

    @staticmethod
    def of(input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, width: int) -> "Packing | None":
        """The packing of these rows into lanes of ``max(width, L)`` tokens, or None when it would
        not run fewer tokens than the padded rows."""
        B, L = input_ids_BL.shape
        W = max(width, L)
        lens = attention_mask_BL.sum(-1).tolist()
        lanes = pack_lanes(lens, W)
        if len(lanes) * W >= B * L:
            return None
        ids = torch.zeros(len(lanes), W, dtype=input_ids_BL.dtype)
        pos = torch.zeros(len(lanes), W, dtype=torch.long)
        start = torch.zeros(B, dtype=torch.long)
        ar = torch.arange(W)
        for p, lane in enumerate(lanes):
            o = 0
            for b in lane:
                n = lens[b]
                ids[p, o:o + n] = input_ids_BL[b, :n].cpu()
                pos[p, o:o + n] = ar[:n]
                start[b] = p * W + o
                o += n
            pos[p, o:] = ar[: W - o]  # the tail is a segment of its own
        flat = start.unsqueeze(1) + torch.minimum(ar[:L].unsqueeze(0), (torch.tensor(lens) - 1).clamp_min(0).unsqueeze(1))
        dev = input_ids_BL.device
        return Packing(ids.to(dev), pos.to(dev), flat.to(dev))


def token_logprobs(
    model: nn.Module,
    input_ids_BL: torch.Tensor,
    attention_mask_BL: torch.Tensor,
    score_mask_BL: torch.Tensor,
    *,
    temperature: float = 1.0,
    value_head: ValueHead | None = None,
    with_entropy: bool = True,
    continuation: Continuation | None = None,
    pack: int = 0,
    share: bool = False,
) -> TokenScores:
    """Log-probs (at ``temperature``) of the tokens marked in ``score_mask_BL`` (position 0 is never
    scored). Shapes ``[B, L]``; right padding. ``model`` is a causal LM or a ``Scorer`` (which then
    brings its own value head). ``continuation``: also score tokens that follow each row, without
    gradient, from the rows' KV cache (``TokenScores.cont_logp``). ``pack`` (> 0): run the rows packed
    end to end in lanes of ``max(pack, L)`` tokens (fewer padded tokens; same results up to rounding; ignored with a
    continuation, which needs each row's own cache). ``share``: run the rows' common prefixes once
    (``SharedPrefix``; same results up to rounding; ignored when packing)."""
    if isinstance(model, Scorer):
        out = model(input_ids_BL, attention_mask_BL, score_mask_BL, temperature=temperature,
                    with_entropy=with_entropy, with_values=value_head is not None, continuation=continuation,
                    pack=pack, share=share)
    else:
        out = _score(model, value_head, input_ids_BL, attention_mask_BL, score_mask_BL, temperature, with_entropy,
                     continuation, pack, share)
    return TokenScores(*out)


class Scorer(nn.Module):
    """The learner's forward pass as one module: the causal LM (and value head) it holds, called
    through this module's ``forward``. FSDP2 shards it with this module as the root, so every
    parameter (also the LM head, tied to the embeddings) is gathered by the root's hooks."""

    def __init__(self, model: nn.Module, value_head: ValueHead | None = None):
        super().__init__()
        self.model = model
        self.value_head = value_head

    def forward(self, input_ids_BL, attention_mask_BL, score_mask_BL, *, temperature: float = 1.0,
                with_entropy: bool = True, with_values: bool = False, continuation: Continuation | None = None,
                pack: int = 0, share: bool = False):
        return _score(self.model, self.value_head if with_values else None, input_ids_BL, attention_mask_BL,
                      score_mask_BL, temperature, with_entropy, continuation, pack, share)


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class SharedPrefix:
    """Right-padded rows ``[B, L]`` run with their common prefixes computed once (``share``): the
    tokens every row begins with (the system prompt and tool list) in one row, then the tokens a
    *cluster* of rows shares beyond them (one task's prompt, a group's identical first reply) once
    per cluster, then each row's own rest, every level attending to the cached keys and values of
    the levels before it. Causal attention makes each token's hidden state the same as in the row's
    own forward (up to rounding); gradients flow back through the shared levels (the sum over the
    rows that share them, as in the unshared pass).

    ``index[b, j]`` is where row ``b``'s position ``j`` sits in the concatenated hidden states of the
    levels (clamped for padding). Positions: level 1 ``[0, p0)``; cluster ``c``: ``[p0, starts[c])``
    (right-padded to ``S``); row ``b``: ``[starts[cluster[b]], len_b)`` (right-padded to ``T``)."""

    p0: int
    seg_ids: torch.Tensor  # [C, S] cluster segments (S == 0: no cluster level)
    seg_att: torch.Tensor  # [C, S]
    cluster: torch.Tensor  # [B] each row's cluster
    starts: torch.Tensor  # [C] where each cluster's rows continue on their own
    suf_ids: torch.Tensor  # [B, T]
    suf_att: torch.Tensor  # [B, T]
    first_ids: torch.Tensor  # [1, p0] the common prefix
    index: torch.Tensor  # [B, L]
    tokens: int  # positions run: p0 + C * S + B * T

    MIN_SHARED = 16  # a cluster shares at least this many tokens beyond the common prefix

    @staticmethod
    def sort(token_lists: list[list[int]]) -> tuple[list[int], list[int]]:
        """Rows in lexicographic order (rows that share prefixes side by side) and the common prefix
        of each neighbouring pair, capped so that every row keeps one position of its own."""
        order = sorted(range(len(token_lists)), key=lambda b: token_lists[b])
        adj = [min(_lcp(token_lists[order[k]], token_lists[order[k + 1]]), len(token_lists[order[k]]) - 1,
                   len(token_lists[order[k + 1]]) - 1) for k in range(len(order) - 1)]
        return order, adj

    @staticmethod
    def plan(lens: list[int], adj: list[int], min_shared: int = MIN_SHARED) -> tuple[int, list[tuple[list[int], int]], int, int]:
        """``(p0, clusters, S, tokens)`` for rows in ``sort``'s order (``lens`` their lengths, ``adj``
        from ``sort``): ``clusters`` holds (positions in that order, where the cluster's rows part).
        Rows side by side in that order sharing ``min_shared`` tokens beyond the common prefix
        ``p0`` form a cluster."""
        B = len(lens)
        p0 = max(min(adj, default=0), 0)
        clusters, cur, part = [], [0], None
        for k in range(B - 1):
            if adj[k] >= p0 + min_shared:
                cur.append(k + 1)
                part = adj[k] if part is None else min(part, adj[k])
            else:
                clusters.append((cur, part))
                cur, part = [k + 1], None
        clusters.append((cur, part))
        S = max((part - p0 for _, part in clusters if part is not None), default=0)
        # a row alone in its cluster runs its next S tokens at the cluster level too (no padded slot)
        clusters = [(rows, part if part is not None else min(p0 + S, lens[rows[0]] - 1)) for rows, part in clusters]
        T = max(lens[b] - part for rows, part in clusters for b in rows)
        tokens = p0 + (len(clusters) * S if S else 0) + B * T
        return p0, clusters, S, tokens

    @staticmethod
    def cost(lens: list[int], adj: list[int], min_shared: int = MIN_SHARED, max_share: float = 0.9) -> int:
        """Positions a micro-batch of these rows (``sort``'s order) runs: shared when that pays
        (``of``'s rule), else padded."""
        padded = len(lens) * max(lens)
        if len(lens) < 2 or min(lens) < 2:
            return padded
        tokens = SharedPrefix.plan(lens, adj, min_shared)[3]
        return tokens if tokens <= max_share * padded else padded

    @staticmethod
    def of(input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, min_shared: int = MIN_SHARED,
           max_share: float = 0.9) -> "SharedPrefix | None":
        """The plan for these rows, or None when it would run more than ``max_share`` of the padded
        positions (nothing worth sharing)."""
        B, L = input_ids_BL.shape
        if B < 2:
            return None
        ids = input_ids_BL.cpu()
        lens = attention_mask_BL.sum(-1).tolist()
        if min(lens) < 2:
            return None
        order, adj = SharedPrefix.sort([ids[b, :lens[b]].tolist() for b in range(B)])
        p0, clusters, S, tokens = SharedPrefix.plan([lens[b] for b in order], adj, min_shared)
        if tokens > max_share * B * L:
            return None
        clusters = [([order[k] for k in rows], part) for rows, part in clusters]
        C = len(clusters) if S else 0
        T = (tokens - p0 - C * S) // B
        seg_ids = torch.zeros(C, S, dtype=ids.dtype)
        seg_att = torch.zeros(C, S, dtype=torch.long)
        cluster = torch.zeros(B, dtype=torch.long)
        starts = torch.full((max(C, 1),), p0, dtype=torch.long)
        suf_ids = torch.zeros(B, T, dtype=ids.dtype)
        suf_att = torch.zeros(B, T, dtype=torch.long)
        index = torch.zeros(B, L, dtype=torch.long)
        ar = torch.arange(L)
        for c, (rows, part) in enumerate(clusters):
            if C:
                seg_ids[c, : part - p0] = ids[rows[0], p0:part]
                seg_att[c, : part - p0] = 1
                starts[c] = part
            else:
                part = p0
            for b in rows:
                n = lens[b]
                cluster[b] = c if C else 0
                suf_ids[b, : n - part] = ids[b, part:n]
                suf_att[b, : n - part] = 1
                j = torch.minimum(ar, torch.tensor(max(n - 1, 0)))
                index[b] = torch.where(j < p0, j, torch.where(j < part, p0 + c * S + (j - p0),
                                                              p0 + C * S + b * T + (j - part)))
        dev = input_ids_BL.device
        return SharedPrefix(p0, seg_ids.to(dev), seg_att.to(dev), cluster.to(dev), starts.to(dev),
                            suf_ids.to(dev), suf_att.to(dev), input_ids_BL[:1, :p0], index.to(dev), tokens)

    def run(self, decoder, *, use_cache: bool) -> tuple[torch.Tensor, object, torch.Tensor]:
        """The levels' hidden states concatenated ``[p0 + C * S + B * T, H]``, and with ``use_cache``
        the rows' cache and its attention mask ``[B, len]`` (for a continuation)."""
        kw = cache_keyword(decoder)
        dev = self.suf_ids.device
        parts, cache, mask = [], None, None
        if self.p0:
            out = decoder(input_ids=self.first_ids, use_cache=True)
            parts.append(out.last_hidden_state[0])
            cache, mask = _cache_of(out), torch.ones(1, self.p0, dtype=torch.long, device=dev)
        C, S = self.seg_ids.shape
        if S:
            if cache is not None:
                select_batch(cache, torch.zeros(C, dtype=torch.long, device=dev))
                mask = mask.expand(C, -1)
            att = self.seg_att if mask is None else torch.cat([mask, self.seg_att], 1)
            pos = self.p0 + torch.arange(S, device=dev).expand(C, -1)
            out = decoder(input_ids=self.seg_ids, attention_mask=att, position_ids=pos, use_cache=True,
                          **({kw: cache} if cache is not None else {}))
            parts.append(out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1]))
            cache, mask = _cache_of(out), att
        B, T = self.suf_ids.shape
        if cache is not None:
            pick = self.cluster if S else torch.zeros(B, dtype=torch.long, device=dev)
            select_batch(cache, pick)
            mask = mask[pick]
        att = self.suf_att if mask is None else torch.cat([mask, self.suf_att], 1)
        pos = self.starts[self.cluster].unsqueeze(1) + torch.arange(T, device=dev)
        out = decoder(input_ids=self.suf_ids, attention_mask=att, position_ids=pos, use_cache=use_cache,
                      **({kw: cache} if cache is not None else {}))
        parts.append(out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1]))
        return torch.cat(parts), (_cache_of(out) if use_cache else None), att


def take_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x[idx]`` along dim 0 with a backward that sums repeated rows in index order at any thread
    count (``index_select``; advanced indexing's backward, ``index_put_`` with accumulate, does not on
    the CPU). ``benchmarks/default_update.py --gather`` times the two."""
    return x.index_select(0, idx)


def select_batch(cache, idx: torch.Tensor) -> None:
    """``cache.batch_select_indices(idx)`` with a backward that does not depend on thread scheduling:
    transformers' layers select with advanced indexing, whose backward accumulates a row picked
    several times (a shared prefix, copied to each of its rows) in a thread-dependent order on the
    CPU; ``index_select``'s accumulates in index order (the same bits as advanced indexing at one
    thread). Layers of other kinds (extra state of their own) keep their own method."""
    from transformers.cache_utils import DynamicLayer

    for layer in getattr(cache, "layers", None) or ():
        if type(layer).batch_select_indices is not DynamicLayer.batch_select_indices:
            layer.batch_select_indices(idx)
        elif getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = take_rows(layer.keys, idx)
            layer.values = take_rows(layer.values, idx)
    if getattr(cache, "layers", None) is None:
        cache.batch_select_indices(idx)


@functools.lru_cache(maxsize=None)
def _cache_kw_of(cls) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def cache_keyword(module: nn.Module) -> str:
    """The KV-cache argument of a model's ``forward``: ``cache`` in transformers >= 5.2x,
    ``past_key_values`` before (looked up once per class)."""
    return _cache_kw_of(type(module.get_base_model() if is_peft(module) else module))


def _cache_of(out):
    cache = getattr(out, "cache", None)  # transformers >= 5.2x; reading the old name there warns
    return cache if cache is not None else out.past_key_values


def _score(model, value_head, input_ids_BL, attention_mask_BL, score_mask_BL, temperature, with_entropy,
           continuation: Continuation | None = None, pack: int = 0, share: bool = False):
    decoder, lm_head = decoder_parts(model)
    sel = score_mask_BL[:, 1:].bool()
    packing = Packing.of(input_ids_BL, attention_mask_BL, pack) if pack and continuation is None else None
    plan = SharedPrefix.of(input_ids_BL, attention_mask_BL) if share and packing is None else None
    cache = cache_mask = None
    if packing is not None:
        hidden = decoder(input_ids=packing.input_ids, position_ids=packing.position_ids,
                         use_cache=False).last_hidden_state
        flat, index = hidden.reshape(-1, hidden.shape[-1]), packing.flat
    elif plan is not None:
        flat, cache, cache_mask = plan.run(decoder, use_cache=continuation is not None)
        index = plan.index
    else:
        dec_out = decoder(input_ids=input_ids_BL, attention_mask=attention_mask_BL,
                          use_cache=continuation is not None)
        hidden = dec_out.last_hidden_state
        flat = hidden.reshape(-1, hidden.shape[-1])
        B, L = input_ids_BL.shape
        index = torch.arange(B * L, device=hidden.device).reshape(B, L)
        if continuation is not None:
            cache, cache_mask = _cache_of(dec_out), attention_mask_BL
    # [K, H] states that predict the scored tokens. index_select, not flat[...]: with shared prefixes a
    # position is picked by many rows, and the backward of advanced indexing (index_put_ with
    # accumulate) sums those rows' gradients in an order that depends on thread scheduling on the CPU
    # (two runs of one seed at 2 threads differed); index_select's backward (index_add_) sums them in
    # index order at any thread count, and gives the same bits as advanced indexing at one thread.
    h = take_rows(flat, index[:, :-1][sel])
    targets = input_ids_BL[:, 1:][sel]
    logp_K, ent_K = head_logprobs(lm_head, h, targets, temperature, with_entropy=with_entropy)
    out = torch.zeros(input_ids_BL.shape, dtype=logp_K.dtype, device=logp_K.device)
    logp = out.clone()
    logp[:, 1:][sel] = logp_K
    entropy = out.clone()
    if with_entropy:
        entropy[:, 1:][sel] = ent_K
    values = None
    if value_head is not None:
        values = out.clone()
        values[:, 1:][sel] = value_head(h).float()
    cont_logp = None
    if continuation is not None:
        with torch.no_grad():
            lens = attention_mask_BL.sum(-1)
            rows = torch.arange(len(lens), device=lens.device)
            last = flat.detach()[index[rows, (lens - 1).clamp_min(0)]]  # [B, H] each row's last state
            cont_logp = _continue(decoder, lm_head, cache, cache_mask, lens, last, continuation, temperature)
    return logp, entropy, values, cont_logp


def _continue(decoder, lm_head, cache, cache_mask_BC, lens_B, last_BH, c: Continuation,
              temperature: float) -> torch.Tensor:
    """Log-probs of the continuation's scored tokens: one forward over the continuation alone,
    attending to the rows' cached keys and values (``cache_mask_BC`` marks the real ones; padding in
    between is masked; row ``b`` continues at position ``lens_B[b]`` from state ``last_BH[b]``). Only
    the rows that continue run (the cache is cut to them; at least one row runs, so every call is the
    same for FSDP2)."""
    B, E = c.input_ids.shape
    dev = c.input_ids.device
    runs = torch.nonzero(c.attention_mask.sum(-1) > 0).squeeze(-1)
    if len(runs) == 0:
        runs = torch.zeros(1, dtype=torch.long, device=dev)
    if len(runs) < B:
        cache.batch_select_indices(runs)
    am, ids, c_att, sel = cache_mask_BC[runs], c.input_ids[runs], c.attention_mask[runs], c.score_mask[runs].bool()
    pos = lens_B[runs].unsqueeze(1) + torch.arange(E, device=dev)
    h2 = decoder(input_ids=ids, attention_mask=torch.cat([am, c_att], 1),
                 position_ids=pos, use_cache=True, **{cache_keyword(decoder): cache}).last_hidden_state
    pred = torch.cat([last_BH[runs].unsqueeze(1), h2[:, :-1]], 1)  # the state before each continuation token
    out = torch.zeros(B, E, dtype=torch.float32, device=dev)
    sub = torch.zeros(len(runs), E, dtype=torch.float32, device=dev)
    sub[sel] = head_logprobs(lm_head, pred[sel], ids[sel], temperature)[0]
    out[runs] = sub
    return out


def head_logprobs(lm_head: nn.Module, h_KH: torch.Tensor, targets_K: torch.Tensor, temperature: float = 1.0,
                  *, with_entropy: bool = False, chunk_elements: int = 6 << 20) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax(lm_head(h) / temperature)[target]`` per row (with gradient when it is enabled),
    and the entropy of each row's distribution (no gradient; a metric), computed in chunks of rows
    whose ``[chunk, vocab]`` logits stay in cache (25 MB: 128 rows of a 49k vocabulary). The rows are independent, so the
    values are those of one pass; a chunk's ``[chunk, vocab]`` buffers are reused from cache instead of
    streaming ``[K, vocab]`` ones through memory (49k vocabulary, 1450 rows, hidden 128: forward and
    backward 490 ms instead of 760 ms; forward alone 1.4x faster; 2 threads here)."""
    K = h_KH.shape[0]
    vocab = getattr(getattr(lm_head, "weight", None), "shape", (0,))[0]
    step = max(16, chunk_elements // vocab) if vocab else max(K, 1)
    logps, ents = [], []
    for i in range(0, max(K, 1), step):  # K == 0 still makes one (empty) call: every rank the same calls
        logits = lm_head(h_KH[i:i + step]).float()
        if temperature != 1.0:  # a [chunk, vocab] division and its backward: skipped when it is a no-op
            logits = logits / temperature
        lp = torch.log_softmax(logits, -1)
        logps.append(lp.gather(-1, targets_K[i:i + step].unsqueeze(-1)).squeeze(-1))
        if with_entropy:
            with torch.no_grad():  # in place: one [chunk, vocab] buffer instead of two
                d = lp.detach()
                ents.append(-d.exp().mul_(d).sum(-1))
    logp = logps[0] if len(logps) == 1 else torch.cat(logps)
    ent = (ents[0] if len(ents) == 1 else torch.cat(ents)) if with_entropy else None
    return logp, ent
