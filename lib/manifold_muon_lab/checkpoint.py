"""Checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint holds model, optimizers, schedulers, RNG states, the step and how many bytes of
``metrics.jsonl`` were written then; it is written by tmp + ``os.replace``, so a killed run never leaves
half a file. A run restarted with the same config resumes from it and ends on the same weights as a run
never killed (bit-identical on CPU); ``metrics.jsonl`` is cut back to what the checkpoint saw. Under
``torchrun`` each rank also writes its optimizer state (it holds only the state of the weights it steps).

``OutDirLock`` keeps two runs out of one ``out_dir``: the second is refused with the pid and command of the
first while that one lives.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .config import RunError

__all__ = ["CHECKPOINT", "LOCK", "RESUME_SAFE_KEYS", "Checkpointer", "OutDirLock", "save_atomic"]

CHECKPOINT = "checkpoint.pt"
LOCK = "train.lock"
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
            why = (str(e).strip().splitlines() or [""])[0].split(". ")[0].rstrip(".")  # torch's first sentence
            raise RunError(f"checkpoint {self.path} is unreadable, truncated or corrupt ({type(e).__name__}: {why}); "
                           "delete it to start over, or pass resume=False (--no-resume)") from None
        if not isinstance(ckpt, dict) or "config" not in ckpt or "step" not in ckpt:
            raise RunError(f"{self.path} is not a checkpoint of manifold_muon_lab.train; delete it or pass "
                           "resume=False (--no-resume)")
        old, new = ckpt["config"], self.cfg.to_dict()
        diff = sorted(k for k in set(old) | set(new) if k not in RESUME_SAFE_KEYS and old.get(k) != new.get(k))
        if diff:
            changes = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff)
            raise RunError(f"checkpoint {self.path} was written by another config ({changes}); use another "
                           "out_dir, restore those values, or pass resume=False (--no-resume) to start over")
        if ckpt.get("world_size", 1) != self.world:
            raise RunError(f"checkpoint {self.path} was written by {ckpt.get('world_size', 1)} processes, this run "
                           f"has {self.world}; resume with the same number of processes")
        return ckpt

    def restore(self, ckpt: dict, model, optimizers, schedulers, generator, cuda: bool) -> None:
        model.load_state_dict(ckpt["model"])
        opt_states = ckpt["optimizers"] if self.world == 1 else torch.load(
            self._shard(ckpt["step"], self.rank), map_location="cpu", weights_only=False)
        for opt, s in zip(optimizers, opt_states):
            opt.load_state_dict(s)   # the library's optimizers keep their state's dtypes (base.py)
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
             cuda: bool, wall_time_s: float = 0.0) -> None:
        """Everything to continue after ``step`` steps; ``wall_time_s``: the run's seconds so far, all sessions."""
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
                "rng_data": generator.get_state(), "metrics_bytes": metrics_bytes, "wall_time_s": wall_time_s,
            }, self.path)
            for old in self.dir.glob("optim_rank*_step*.pt"):
                if not old.name.endswith(f"_step{step}.pt"):
                    old.unlink(missing_ok=True)
        if self.world > 1:
            dist.barrier()


def _command_line() -> str:
    try:  # the command as typed (``python -m manifold_muon_lab.train ...``), not sys.argv's resolved path
        return " ".join(open("/proc/self/cmdline", "rb").read().decode(errors="replace").rstrip("\0").split("\0"))
    except OSError:
        return " ".join([sys.executable, *sys.argv])


class OutDirLock:
    """An exclusive lock on a run's ``out_dir`` for as long as the run lives.

    ``flock`` on ``out_dir/train.lock``, which holds the owner's pid, host, command and start time: a second
    run is refused with those. The kernel drops the flock when its process dies however it dies (kill -9
    included), so a lock file that is still there but not locked was left by a dead run: it is taken over
    with a note on stderr. Released (and the file removed) on ``release`` or at the end of a ``with``.
    """

    def __init__(self, out_dir):
        self.path, self._fd = Path(out_dir) / LOCK, None

    def acquire(self) -> "OutDirLock":
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = self._describe(os.read(fd, 65536))
                os.close(fd)
                raise RunError(f"{self.path.parent} is in use by another run ({owner}); wait for it to finish, stop "
                               "it, or give this run another out_dir (--out-dir)") from None
            try:  # the previous owner may have removed the file between our open and flock: lock the new one
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        old = os.read(fd, 65536)
        if old.strip():
            print(f"[train] note: taking over the lock of {self.path.parent} from a run that is no longer running "
                  f"({self._describe(old)})", file=sys.stderr, flush=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "command": _command_line(),
              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        self._fd = fd
        return self

    @staticmethod
    def _describe(raw: bytes) -> str:
        try:
            o = json.loads(raw.decode())
            return f"pid {o['pid']} on {o['host']}, started {o['started_utc']}: {o['command']}"
        except (ValueError, KeyError, TypeError):
            return "owner unknown: the lock file is unreadable"

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # while still locked: a waiting run re-checks the inode
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False
