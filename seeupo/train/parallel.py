"""Several processes, one result: the collective operations of data-parallel and sharded training.

Launched by ``torchrun`` or ``accelerate launch`` (both set ``RANK``/``WORLD_SIZE``), ``init``
sets up the process group through ``accelerate`` (gloo on CPU, nccl on GPUs). Everything else reads
the global ``torch.distributed`` state, so a single process needs no set-up and pays nothing.

The scheme (docs/scale.md):

- every process holds every episode of an iteration: rollouts are split by job index and gathered
  back in job order, so the episodes, advantages, turn pools and SeeUPO factors are the global ones;
- each optimizer step's micro-batches are computed from all its rows and dealt out by index; every
  micro-batch contributes with the step's global denominator, so summing the gradients over
  processes gives the single-process gradient (``reduce_grads``, one all-reduce per step);
- gradients are accumulated in float64 (``GradAccumulator``): a sum of a few float32 terms is exact
  in float64, so the gradient rounded back to float32 does not depend on how the micro-batches were
  split between processes (1 process and 2 processes give the same bits when their micro-batch
  gradients agree).
"""

from __future__ import annotations

import atexit
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist

_STRATEGY = "ddp"


def init(strategy: str = "ddp") -> None:
    """Join the process group when launched with several processes (``WORLD_SIZE`` > 1)."""
    global _STRATEGY
    _STRATEGY = strategy
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return
    from accelerate import PartialState

    # gloo for CPU tensors (gathered episodes, per-row log-probs), nccl for GPU tensors (gradients)
    PartialState(backend="cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    if not dist.is_initialized():  # accelerate decided this is not a distributed launch
        raise RuntimeError("WORLD_SIZE > 1 but no process group was set up: launch with torchrun or "
                           "accelerate launch (they set RANK, MASTER_ADDR and MASTER_PORT)")
    atexit.register(shutdown)


def shutdown() -> None:
    """Destroy the process group while the interpreter is whole (registered at exit by ``init``).
    Left to interpreter finalization, gloo's worker threads can be torn down still joinable and the
    process aborts (SIGABRT, "terminate called without an active exception") after its work is done."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 (exiting anyway; a peer that is already gone is no error here)
            pass


def device(choice: str = "auto") -> torch.device:
    """``auto``: this process's GPU (``LOCAL_RANK``) when CUDA is available, else the CPU."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("run.device=cuda but torch sees no GPU (torch.cuda.is_available() is False)")
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
        return dev
    return torch.device(choice)


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if world() > 1:
        dist.barrier()


def mine(items: list) -> list:
    """This process's share of ``items`` (every ``world``-th one, starting at its rank)."""
    return items[rank()::world()]


def sharded() -> bool:
    """Parameters sharded with FSDP2 (every process must then run the same number of passes)."""
    return _STRATEGY == "fsdp2" and world() > 1


def mine_padded(items: list) -> list[tuple[object, bool]]:
    """``mine`` as ``(item, real)`` pairs. With sharded parameters every forward and backward is a
    collective, so processes with fewer items get extra ``(items[0], False)`` entries: run them
    and discard the result (a zero loss still takes part in the gradient reduction)."""
    share = [(x, True) for x in mine(items)]
    if sharded() and items:
        share += [(items[0], False)] * (-(-len(items) // world()) - len(share))
    return share


def gather_ordered(local: list, n: int) -> list:
    """Inverse of ``mine``: the lists of every process merged back into the original order."""
    if world() == 1:
        return list(local)
    parts: list = [None] * world()
    dist.all_gather_object(parts, local)
    out = [None] * n
    for r, part in enumerate(parts):
        out[r::world()] = part
    return out


def sum_(t: torch.Tensor) -> torch.Tensor:
    """In-place sum over processes (a tensor each process filled in its own places, zeros elsewhere)."""
    if world() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def reduce_scalars(sums: dict, maxima: tuple[str, ...] = ()) -> dict:
    """Sum the float entries of ``sums`` over processes (the keys in ``maxima``: their maximum)."""
    if world() == 1:
        return sums
    keys = sorted(k for k, v in sums.items() if isinstance(v, float) and k not in maxima)
    mkeys = sorted(k for k in maxima if k in sums)
    if keys:
        t = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        sums.update(zip(keys, t.tolist()))
    if mkeys:
        t = torch.tensor([sums[k] for k in mkeys], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        sums.update(zip(mkeys, t.tolist()))
    return sums


def any_true(flag: bool) -> bool:
    """Whether ``flag`` is true on any process (every process must call it)."""
    if world() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a collective for a sharded one: every process must call it)."""
    return t.full_tensor() if is_dtensor(t) else t


def like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A whole tensor laid out like ``param`` (this process's shard of it when ``param`` is sharded)."""
    from torch.distributed.tensor import distribute_tensor

    value = value.to(device=param.device, dtype=param.dtype)
    if not is_dtensor(param):
        return value
    return distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """``optimizer.state_dict()`` with whole tensors (collective with sharded parameters)."""
    sd = optimizer.state_dict()
    sd["state"] = {i: {k: full(v).cpu() if torch.is_tensor(v) else v for k, v in st.items()}
                   for i, st in sd["state"].items()}
    return sd


def shard_optimizer_state(sd: dict, optimizer: torch.optim.Optimizer) -> dict:
    """A whole-tensor optimizer state laid out like this process's parameters (for any process count)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    sd["state"] = {i: {k: like(v, params[int(i)]) if torch.is_tensor(v) and v.shape == params[int(i)].shape else v
                       for k, v in st.items()} for i, st in sd["state"].items()}
    return sd


def shard(scorer: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: each decoder layer its own unit, the ``Scorer`` (embeddings, LM head, norm, value
    head) the root. Gradients are summed, not averaged, over processes: the loss already carries
    the global denominator."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from seeupo.models.policy import decoder_parts

    for layer in decoder_parts(scorer.model)[0].layers:
        fully_shard(layer)
    fully_shard(scorer)
    units = [m for m in scorer.modules() if isinstance(m, FSDPModule)]
    for m in units:
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no pre-multiplied sum)
    with torch.no_grad():  # a first pass through the root, so that it (not a layer) is FSDP's root
        ids = torch.zeros(1, 2, dtype=torch.long, device=next(scorer.parameters()).device)
        scorer(ids, torch.ones_like(ids), torch.ones_like(ids), with_entropy=False)
    scorer.set_reshard_after_forward(True, recurse=False)  # no stale gathered weights between passes
    scorer.reshard()
    return scorer


@contextmanager
def gathered(scorer: torch.nn.Module | None):
    """Whole parameters on every process for generation (Hugging Face ``generate`` calls the model
    directly, a different number of times on each process): gathered once, kept through every
    forward, resharded at the end."""
    if scorer is None:
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in scorer.modules() if isinstance(m, FSDPModule)]
    for m in units:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in units:
            m.set_reshard_after_forward(True, recurse=False)
            m.reshard()


class GradAccumulator:
    """Gradients of one optimizer step, accumulated in float64 over micro-batches and processes.

    Call ``add()`` after each micro-batch's ``backward``; ``finish()`` sums over processes and puts
    the float32 result into ``p.grad``. Without it the float32 sum's rounding would depend on which
    micro-batches share a process.
    """

    def __init__(self, params: list[torch.nn.Parameter]):
        # frozen parameters (embeddings during RL) get no gradient, even where FSDP2 computed one
        self.frozen = [p for p in params if not p.requires_grad]
        self.params = [p for p in params if p.requires_grad]
        self.acc: list[torch.Tensor | None] = [None] * len(self.params)

    def add(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad.detach()
            if self.acc[i] is None:  # the first term stays as it is (exact either way)
                self.acc[i] = g
            else:
                if self.acc[i].dtype != torch.float64:
                    self.acc[i] = self.acc[i].to(torch.float64)
                self.acc[i].add_(g)  # promoted to float64 inside the add (exact), no float64 copy of g
            p.grad = None

    def finish(self) -> None:
        self.add()
        for p in self.frozen:
            p.grad = None
        # replicated parameters: sum over processes here (sharded ones: FSDP2 reduce-scattered them)
        rep = [i for i, p in enumerate(self.params) if not is_dtensor(p)]
        if world() > 1 and rep:
            # which parameters got a gradient anywhere (None stays None: Adam skips those, as alone)
            dev = self.params[rep[0]].device
            has = torch.tensor([self.acc[i] is not None for i in rep], dtype=torch.float64, device=dev)
            flat = torch.cat([has] + [(self.acc[i].to(torch.float64) if self.acc[i] is not None
                                       else torch.zeros(self.params[i].numel(), dtype=torch.float64, device=dev)).reshape(-1)
                                      for i in rep])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            has, *parts = torch.split(flat, [len(rep)] + [self.params[i].numel() for i in rep])
            for i, a, h in zip(rep, parts, has.tolist()):
                self.acc[i] = a if h > 0 else None
        for a, p in zip(self.acc, self.params):
            p.grad = None if a is None else a.reshape(p.shape).to(p.dtype)
        self.acc = [None] * len(self.params)


def clip_grad_norm_(params: list[torch.Tensor], max_norm: float | None) -> float:
    """The gradient norm (and clipping to ``max_norm``) exactly as ``torch.nn.utils.clip_grad_norm_``
    computes it for one process. Sharded gradients are gathered whole for the norm (one extra
    all-gather of the gradient per step): a norm from per-shard partial sums would round differently,
    and with Adam that small difference grows into a different run."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if not any(is_dtensor(g) for g in grads):
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf")))
    total = torch.nn.utils.get_total_norm([full(g) for g in grads], 2.0)
    if max_norm:
        coef = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))  # float32, as torch's
        with torch.no_grad():
            for g in grads:
                g.mul_(coef)
    return float(total)
