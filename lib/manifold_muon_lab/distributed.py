"""Data parallelism under ``torchrun``: the process group, gradient averaging, and the sharded optimizer step.

Every rank computes the gradient of its share of the batch; gradients are averaged over ranks; then each
matrix parameter is stepped by one rank only and broadcast (the msign work is spread over ranks, as in
Jordan's distributed Muon). Embeddings and gains (AdamW) step everywhere on the same averaged gradient.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from manifold_muon import MatrixOptimizer

__all__ = ["setup", "all_reduce_mean_", "ShardedStep"]


def setup() -> tuple[int, int, int]:
    """(rank, local_rank, world_size); starts the process group under torchrun (nccl on GPUs, else gloo)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if dist.is_initialized():
        return dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0")), dist.get_world_size()
    return 0, 0, 1


def all_reduce_mean_(tensors, world: int) -> None:
    """Average each tensor over the ranks, in place."""
    if world == 1:
        return
    handles = [dist.all_reduce(t, async_op=True) for t in tensors]
    for h, t in zip(handles, tensors):
        h.wait()
        t.div_(world)


class ShardedStep:
    """Step a list of optimizers with the matrix work spread over ranks.

    Every parameter of a ``MatrixOptimizer`` is owned by one rank (largest first, each to the least loaded
    rank); a rank steps only the parameters it owns (the others' gradients are set to None, which every
    optimizer skips) and then each owner broadcasts its updated weights. With one process it is a plain
    loop over ``optimizer.step()``.
    """

    def __init__(self, optimizers, rank: int = 0, world: int = 1):
        self.optimizers, self.rank, self.world = list(optimizers), rank, world
        sharded = [p for opt in self.optimizers if isinstance(opt, MatrixOptimizer)
                   for g in opt.param_groups for p in g["params"]]
        load = [0] * world
        self.owner = {}
        for p in sorted(sharded, key=lambda p: -p.numel()):  # stable sort: ties keep model order
            r = min(range(world), key=lambda i: load[i])
            self.owner[p] = r
            load[r] += p.numel()

    def step(self) -> None:
        if self.world == 1:
            for opt in self.optimizers:
                opt.step()
            return
        for p, r in self.owner.items():
            if r != self.rank:
                p.grad = None
        error = None
        try:
            for opt in self.optimizers:
                opt.step()
        except FloatingPointError as e:  # every rank must learn of it, or the others wait forever
            error = e
        device = self.optimizers[0].param_groups[0]["params"][0].device
        failed = torch.tensor([float(error is not None)], device=device)
        dist.all_reduce(failed)
        if failed.item() > 0:
            raise error or FloatingPointError("another rank's optimizer refused a non-finite gradient")
        for p, r in self.owner.items():
            dist.broadcast(p.data, src=r)
