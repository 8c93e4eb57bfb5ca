"""Checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint holds model, optimizers, schedulers, RNG states, the step and how many bytes of
``metrics.jsonl`` were written then; it is written by tmp + ``os.replace``, so a killed run never leaves
half a file. A run restarted with the same config resumes from it and ends on the same weights as a run
never killed (bit-identical on CPU); ``metrics.jsonl`` is cut back to what the checkpoint saw. Under
``torchrun`` each rank also writes its optimizer state (it holds only the state of the weights it steps).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["CHECKPOINT", "RESUME_SAFE_KEYS", "Checkpointer", "save_atomic"]

CHECKPOINT = "checkpoint.pt"
# Config keys that may change between a run and its resumption without changing what it computes.
RESUME_SAFE_KEYS = {"out_dir", "checkpoint_every", "device"}


def save_atomic(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class Checkpointer:
    """Save and restore one run's state in ``out_dir``; ``cfg`` is the run's TrainConfig."""

    def __init__(self, out_dir, cfg, rank: int = 0, world: int = 1):
        self.dir, self.cfg, self.rank, self.world = Path(out_dir), cfg, rank, world
        self.path = self.dir / CHECKPOINT

    def _shard(self, step: int, rank: int) -> Path:
        return self.dir / f"optim_rank{rank}_step{step}.pt"

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> dict:
        """The checkpoint, refused with advice when unreadable, of another config or of another world size."""
        try:  # our own file; it holds optimizer param groups and RNG states, so not weights-only
            ckpt = torch.load(self.path, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
            raise RuntimeError(f"checkpoint {self.path} is unreadable ({type(e).__name__}: {e}); delete it to start "
                               "over, or pass resume=False (--no-resume)") from None
        if not isinstance(ckpt, dict) or "config" not in ckpt or "step" not in ckpt:
            raise RuntimeError(f"{self.path} is not a checkpoint of manifold_muon_lab.train; delete it or pass "
                               "resume=False (--no-resume)")
        old, new = ckpt["config"], self.cfg.to_dict()
        diff = sorted(k for k in set(old) | set(new) if k not in RESUME_SAFE_KEYS and old.get(k) != new.get(k))
        if diff:
            changes = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff)
            raise RuntimeError(f"checkpoint {self.path} was written by another config ({changes}); use another "
                               "out_dir, restore those values, or pass resume=False (--no-resume) to start over")
        if ckpt.get("world_size", 1) != self.world:
            raise RuntimeError(f"checkpoint {self.path} was written by {ckpt.get('world_size', 1)} processes, this run "
                               f"has {self.world}; resume with the same number of processes")
        return ckpt

    def restore(self, ckpt: dict, model, optimizers, schedulers, generator, cuda: bool) -> None:
        model.load_state_dict(ckpt["model"])
        opt_states = ckpt["optimizers"] if self.world == 1 else torch.load(
            self._shard(ckpt["step"], self.rank), map_location="cpu", weights_only=False)
        for opt, s in zip(optimizers, opt_states):
            opt.load_state_dict(s)
        for sch, s in zip(schedulers, ckpt["schedulers"]):
            sch.load_state_dict(s)
        torch.set_rng_state(ckpt["rng_torch"])
        if cuda and ckpt.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng_cuda"])
        generator.set_state(ckpt["rng_data"])

    def clear(self) -> None:
        """Remove what an earlier run left that a fresh start must not resume from."""
        for f in (self.path, *self.dir.glob("optim_rank*_step*.pt")):
            f.unlink(missing_ok=True)

    def save(self, step: int, finished: bool, model, optimizers, schedulers, generator, metrics_bytes: int,
             cuda: bool) -> None:
        opt_states = [opt.state_dict() for opt in optimizers]
        if self.world > 1:
            save_atomic(opt_states, self._shard(step, self.rank))
            dist.barrier()
        if self.rank == 0:
            save_atomic({
                "config": self.cfg.to_dict(), "step": step, "done": finished, "world_size": self.world,
                "model": model.state_dict(), "optimizers": opt_states if self.world == 1 else None,
                "schedulers": [s.state_dict() for s in schedulers],
                "rng_torch": torch.get_rng_state(), "rng_cuda": torch.cuda.get_rng_state() if cuda else None,
                "rng_data": generator.get_state(), "metrics_bytes": metrics_bytes,
            }, self.path)
            for old in self.dir.glob("optim_rank*_step*.pt"):
                if not old.name.endswith(f"_step{step}.pt"):
                    old.unlink(missing_ok=True)
        if self.world > 1:
            dist.barrier()
