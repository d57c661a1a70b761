"""Resident memory of a run (issue 36): reading it, giving freed pages back, and fitting the update's
micro-batch into a limit.

A training run's resident memory is the weights and training state (optimizer moments, the KL
reference) plus whatever the phase at hand holds: the sampler's KV caches during a rollout, the
activations saved for backward during an update or the warm-up. glibc keeps the pages a phase freed
(`trim` hands them back), and the activations grow with the micro-batch's token budget, which
`plan` lowers until the run fits ``run.max_memory_gb``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

GB = 1024 ** 3
MARGIN_GB = 1.0  # left to the system and other programs when run.max_memory_gb is not set
BASE_GB = 0.25  # a phase's own working set beyond activations (rollout batches, log-prob buffers)
BACKWARD = 1.5  # backward holds the saved activations and their gradients as it walks back
MIN_TOKENS = 256  # the smallest micro-batch budget the planner goes down to


def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def trim() -> bool:
    """Return the pages glibc's allocator keeps after a phase freed them to the system
    (``malloc_trim(0)``); False where there is no glibc."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    return bool(libc.malloc_trim(0))


def _status(key: str) -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    return float("nan")


def rss_gb() -> float:
    """This process's resident memory now (GB; NaN off Linux)."""
    return _status("VmRSS")


def peak_rss_gb() -> float:
    """This process's peak resident memory since it started or since ``reset_peak`` (GB)."""
    return _status("VmHWM")


def reset_peak() -> bool:
    """Start a new peak (Linux: ``/proc/self/clear_refs`` 5); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def machine_gb() -> float:
    """The memory this process may use: the machine's, or its cgroup's limit where lower (GB)."""
    total = float("inf")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            v = Path(f).read_text().strip()
        except OSError:
            continue
        if v.isdigit() and int(v) < 1 << 60:
            total = min(total, int(v) / GB)
    if total == float("inf"):
        total = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / GB
    return total


class SavedActivations:
    """The tensors autograd saves for backward while this is entered, counted by storage: ``peak``
    is the most bytes alive at once, ``largest`` the largest single storage (e.g. the logits)."""

    def __init__(self):
        self.live: dict[int, list] = {}
        self.now = self.peak = self.largest = 0

    def _pack(self, t: torch.Tensor):
        st = t.untyped_storage()
        key, n = st.data_ptr(), st.nbytes()
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = entry = [n, 0]
            self.now += n
            self.peak = max(self.peak, self.now)
            self.largest = max(self.largest, n)
        entry[1] += 1
        return _Held(t.detach(), key, self)  # detached: a saved output would otherwise hold its own node

    @staticmethod
    def _unpack(h: "_Held") -> torch.Tensor:
        return h.t

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[key]

    @contextlib.contextmanager
    def counting(self):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self


class _Held:
    __slots__ = ("t", "key", "owner")

    def __init__(self, t, key, owner):
        self.t, self.key, self.owner = t, key, owner

    def __del__(self):
        self.owner._release(self.key)


def tensor_gb(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / GB


def activation_bytes_per_token(model, *, rows: int = 2, tokens: int = 256, seed: int = 0) -> float:
    """Bytes autograd saves per token in one forward of the learner's scoring function (random ids
    from a generator of its own, a quarter of the tokens scored), measured by counting the saved
    tensors; the model's weights, mode and the global random state are left as they were."""
    from seeupo.models.policy import token_logprobs
    from seeupo.train.learner import model_device

    g = torch.Generator().manual_seed(seed)
    dev = model_device(model)
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (rows, tokens), generator=g).to(dev)
    att = torch.ones_like(ids)
    mask = torch.zeros(rows, tokens, dtype=torch.float32, device=dev)
    mask[:, -tokens // 4:] = 1.0
    was = model.training
    counter = SavedActivations()
    with torch.random.fork_rng(), torch.enable_grad(), counter.counting():
        model.train()
        out = token_logprobs(model, ids, att, mask, temperature=1.0, with_entropy=True)
        del out
    model.train(was)
    return counter.peak / (rows * tokens)


class DoesNotFit(ValueError):
    pass


@dataclass
class Plan:
    limit_gb: float
    fixed_gb: float  # the process now, plus the optimizer's moments and the KL reference to come
    per_token_mb: float  # measured activation bytes per token, times BACKWARD
    micro_batch_tokens: int
    lowered_from: int | None  # the configured budget where the planner lowered it

    def need_gb(self, tokens: int | None = None) -> float:
        t = self.micro_batch_tokens if tokens is None else tokens
        return self.fixed_gb + BASE_GB + t * self.per_token_mb / 1024

    def line(self) -> str:
        s = (f"memory: limit {self.limit_gb:.1f} GB; weights and training state {self.fixed_gb:.2f} GB, "
             f"micro-batch of {self.micro_batch_tokens} tokens about {self.micro_batch_tokens * self.per_token_mb / 1024:.2f} GB")
        if self.lowered_from:
            s += f" (optim.micro_batch_tokens lowered from {self.lowered_from} to fit)"
        return s


def plan(limit_gb: float | None, model, *, trainable_bytes: int, kl_reference: bool,
         micro_batch_tokens: int) -> Plan:
    """The micro-batch budget that fits ``limit_gb`` (None: the machine's memory less ``MARGIN_GB``):
    the configured one, else the largest power of two below it down to ``MIN_TOKENS``; raises
    ``DoesNotFit`` (one line: what does not fit) when even that does not."""
    limit = machine_gb() - MARGIN_GB if limit_gb is None else float(limit_gb)
    state = trainable_bytes * (2 + (1 if kl_reference else 0) + 1)  # Adam's two moments, the reference, grads
    fixed = rss_gb() + state / GB
    per_token_mb = activation_bytes_per_token(model) * BACKWARD / 2 ** 20
    p = Plan(limit, fixed, per_token_mb, micro_batch_tokens, None)
    if p.need_gb() <= limit:
        return p
    t = 1 << (micro_batch_tokens.bit_length() - 1)
    while t > MIN_TOKENS and p.need_gb(t) > limit:
        t //= 2
    t = max(t, MIN_TOKENS)
    if p.need_gb(t) > limit:
        act = t * per_token_mb / 1024
        raise DoesNotFit(
            f"run.max_memory_gb={limit:g} does not fit this run: the model and its training state take "
            f"{fixed:.2f} GB, a micro-batch of {t} tokens {act:.2f} GB more and a phase's working set "
            f"{BASE_GB:.2f} GB ({p.need_gb(t):.2f} GB in all); raise run.max_memory_gb or choose a smaller model")
    return Plan(limit, fixed, per_token_mb, t, micro_batch_tokens)
