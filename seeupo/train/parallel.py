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

import os

import torch
import torch.distributed as dist


def init(strategy: str = "ddp") -> None:
    """Join the process group when launched with several processes (``WORLD_SIZE`` > 1)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return
    from accelerate import PartialState

    PartialState(backend="nccl" if torch.cuda.is_available() else "gloo")
    if not dist.is_initialized():  # accelerate decided this is not a distributed launch
        raise RuntimeError("WORLD_SIZE > 1 but no process group was set up: launch with torchrun or "
                           "accelerate launch (they set RANK, MASTER_ADDR and MASTER_PORT)")


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


def broadcast_object(obj):
    """Rank 0's ``obj`` on every process."""
    if world() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class GradAccumulator:
    """Gradients of one optimizer step, accumulated in float64 over micro-batches and processes.

    Call ``add()`` after each micro-batch's ``backward``; ``finish()`` sums over processes and puts
    the float32 result into ``p.grad``. Without it the float32 sum's rounding would depend on which
    micro-batches share a process.
    """

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = [p for p in params if p.requires_grad]
        self.acc: list[torch.Tensor | None] = [None] * len(self.params)

    def add(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad.detach().to(torch.float64)
            self.acc[i] = g if self.acc[i] is None else self.acc[i].add_(g)
            p.grad = None

    def finish(self) -> None:
        self.add()
        if world() > 1 and self.params:
            # which parameters got a gradient anywhere (None stays None: Adam skips those, as alone)
            has = torch.tensor([a is not None for a in self.acc], dtype=torch.float64)
            flat = torch.cat([has] + [(a if a is not None else torch.zeros(p.numel(), dtype=torch.float64)).reshape(-1)
                                      for a, p in zip(self.acc, self.params)])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            has, *parts = torch.split(flat, [len(self.params)] + [p.numel() for p in self.params])
            self.acc = [a if h > 0 else None for a, h in zip(parts, has.tolist())]
        for a, p in zip(self.acc, self.params):
            p.grad = None if a is None else a.reshape(p.shape).to(p.dtype)
        self.acc = [None] * len(self.params)
