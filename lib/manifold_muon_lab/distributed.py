"""Data parallelism under ``torchrun``: the process group, gradient averaging, and the sharded optimizer step.

Every rank computes the gradient of its share of the batch; gradients are averaged over ranks; then each
matrix parameter is stepped by one rank only and broadcast (the msign work is spread over ranks, as in
Jordan's distributed Muon). Embeddings and gains (AdamW) step everywhere on the same averaged gradient.

Failing once, not once per rank: ``agree(fn)`` runs a check on every rank and fails on every rank if it failed
on any (the lowest failing rank is the one that reports it, ``reporter(e)``; the others raise ``PeerFailed``),
so a bad config or a busy out_dir ends every process with one message instead of one per rank, and no rank
is left waiting in a collective for one that gave up. ``is_peer_failure(e)``: an error that only says
another rank went away (gloo's "Connection closed by peer", NCCL's ``DistError``); that rank's own message,
or the launcher's (``manifold_muon_lab.launch``), says why.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from manifold_muon import MatrixOptimizer

from .config import RunError

__all__ = ["setup", "backend", "all_reduce_mean_", "ShardedStep", "agree", "PeerFailed", "reporter", "is_peer_failure"]


def backend(device: str = "auto") -> str:
    """The process group's backend for a run on ``device`` (a config's ``device``): nccl where the run trains on
    GPUs, gloo where it trains on the CPU, on a machine with CUDA too (nccl cannot reduce CPU tensors)."""
    return "nccl" if device != "cpu" and torch.cuda.is_available() else "gloo"


def setup(device: str = "auto") -> tuple[int, int, int]:
    """(rank, local_rank, world_size); starts the process group under torchrun (``backend(device)``: nccl on
    GPUs, gloo for a run on the CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        if backend(device) == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # before any collective (agree's)
        dist.init_process_group(backend(device))
    if dist.is_initialized():
        return dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0")), dist.get_world_size()
    return 0, 0, 1


class PeerFailed(RunError):
    """Raised by ``agree`` on the ranks where the check passed when it failed on another (``rank``);
    ``exit_code``: the one that rank exits with, so that every rank exits alike."""

    def __init__(self, rank: int, what: str, exit_code: int = 1):
        super().__init__(f"rank {rank} refused the run {what} (its message says why)")
        self.rank, self.exit_code = rank, exit_code


def reporter(e: BaseException) -> int | None:
    """The rank that reports ``e`` (set by ``agree``), or None when ``e`` did not pass through one."""
    return getattr(e, "_reported_by_rank", None)


def agree(fn, rank: int, world: int, what: str = "before any work", code_of=lambda e: 1):
    """``fn()`` on every rank; if it raised on any rank, raise on every rank: the rank's own exception where
    it raised, ``PeerFailed`` (with ``code_of`` of the first failure) elsewhere, each marked with the lowest
    failing rank (``reporter``). The all-reduce is also a barrier. One process: ``fn()``."""
    if world == 1 or not dist.is_initialized():
        return fn()
    error, result = None, None
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - every rank must learn of it, or the others wait in a collective
        error = e
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    codes = torch.zeros(world, device=device)
    codes[rank] = float(max(1, code_of(error))) if error is not None else 0.0
    dist.all_reduce(codes)
    failing = [(r, int(c)) for r, c in enumerate(codes.tolist()) if c > 0]
    if not failing:
        return result
    if error is None:
        error = PeerFailed(failing[0][0], what, failing[0][1])
    error._reported_by_rank = failing[0][0]
    raise error


def is_peer_failure(e: BaseException) -> bool:
    """True for an error that says only that another rank is gone (it failed, or was killed)."""
    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("Connection closed by peer" in text or "Connection reset by peer" in text
                                            or "remote worker crashing" in text)


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
