"""The training loop: one run of one config, recording why it behaves as it does.

    from manifold_muon_lab.config import load_preset
    from manifold_muon_lab.train import train
    from manifold_muon_lab.sweep import sweep
    summary = train(load_preset("cpu", "runs/presets/training", assignment="hetero", out_dir="runs/_train/hetero"))
    results = sweep([cfg_a, cfg_b, cfg_c], workers=2)    # independent runs, two processes at a time

    python -m manifold_muon_lab.train --preset cpu --assignment hetero [--set key=value ...]
    python -m manifold_muon_lab.launch --nproc_per_node 2 -m manifold_muon_lab.train --preset cpu-tiny  # torchrun

``train`` = ``preflight`` (every check, once, before any work) + the out_dir lock and the signal handlers +
``Trainer`` (``setup``, ``step``, ``evaluate``, ``save``; ``run`` is the loop). Benchmarks and probes build a
``Trainer`` with ``hooks`` instead of copying its setup (``manifold_muon_book.bench.momenta``).

What a run leaves in ``out_dir``: ``metrics.jsonl`` (see ``metrics.Recorder``), ``status.json``
("completed", "diverged at step k" or "interrupted at step k"; final losses only for a completed run),
``provenance.json`` and ``checkpoint.pt`` (see ``checkpoint``: a killed run restarted with the same config
resumes bit-identically). While it runs it holds ``train.lock`` (see ``checkpoint.OutDirLock``): a second
run on the same ``out_dir`` is refused.

How a run fails. Before any work (no file written): the config (``config.validate``), the keys of
``optimizer={...}`` (the assignment's optimizers are built on a meta-device model), the data (a ``data_dir``
given explicitly must hold the prepared data set unless ``prepare_data=True`` / ``--prepare-data``; the
default folder is prepared on first use; ``block_size`` against its length), and memory (``config.check_memory``:
the estimate against what the OS says is available). What the user can fix raises ``RunError`` (a data, config,
checkpoint or out_dir problem; not a ``RuntimeError``) or ``ValueError``; anything else is a bug. On SIGINT
(Ctrl-C) or SIGTERM the run stops at the next step boundary, writes a checkpoint there and ``status.json``
"interrupted at step N", and ``train`` raises ``Interrupted`` (the command line exits 130 or 143); a second
signal stops it at once (``Interrupted`` again, ``at_once``: the last checkpoint written stays the one to
resume from), except while a checkpoint is being written: that write completes first and the run stops
there. The command line prints every error as one sentence (exit code 2) and the traceback only with
``--debug``; a signal while it starts (imports, checks) ends it with one sentence and 130/143, nothing written.

Under ``torchrun`` (better: ``python -m manifold_muon_lab.launch``, which turns the launcher's own failures
and signals into one sentence and the run's exit code) the ranks check the config together
(``distributed.agree``): a bad config, a busy out_dir or a failed setup is reported once, by the lowest rank
that failed, and every rank exits with the same code; an interrupted run is reported by rank 0.
"""

from __future__ import annotations

import os
import signal
import sys

_PROG = "python -m manifold_muon_lab.train"
# What a signal means before the run's own handler (``_StopOnSignal``) is in place: while the command starts
# (imports, parsing, the checks) nothing has been written; once the run has ended, its own message is out.
_AT_ONCE = {"note": "while starting: stopped before any work, nothing was written", "code": None}


def _exit_at_once(signum, frame):
    """SIGINT/SIGTERM outside the training loop of the command line: one sentence (rank 0 only, before the run
    started; none after it ended, which said how) and exit 128 + signum, never a KeyboardInterrupt traceback."""
    if _AT_ONCE["note"] and int(os.environ.get("RANK", "0")) == 0:
        os.write(2, f"{_PROG}: {signal.Signals(signum).name} {_AT_ONCE['note']}\n".encode())
    os._exit(_AT_ONCE["code"] or 128 + signum)


if __name__ == "__main__":  # from here on (torch's import takes seconds) a signal is one sentence, not a traceback
    for _sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(_sig) is not signal.SIG_IGN:
            signal.signal(_sig, _exit_at_once)

import argparse
import contextlib
import json
import math
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from manifold_muon import build_optimizers, retract_parameters

from . import distributed
from .checkpoint import Checkpointer, OutDirLock
from .config import (DEFAULT_PRESET_DIR, RunError, TrainConfig, check_memory, check_optimizer_options,
                     estimate_memory, load_preset, model_fields, parse_overrides, validate)
from .data import VOCAB_SIZES, Batches, default_data_dir, preparation_problem, prepared_meta
from .metrics import Recorder, is_diverged, jsonable
from .models import build_model
from .provenance import provenance, write_json_atomic

__all__ = ["train", "Trainer", "sweep", "preflight", "Interrupted", "RunError", "lr_ratio", "WarmupCosine",
           "model_fields", "main"]

PROGRESS_SECONDS = 30.0  # a progress line at least this often (and every max_steps / 20 steps)


def lr_ratio(step: int, warmup: int, max_steps: int, min_lr_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay from 1 to ``min_lr_ratio`` at ``max_steps``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class WarmupCosine:
    """``lr_ratio`` as a picklable callable for ``LambdaLR`` (which multiplies each group's base lr)."""

    def __init__(self, warmup: int, max_steps: int, min_lr_ratio: float):
        self.warmup, self.max_steps, self.min_lr_ratio = warmup, max_steps, min_lr_ratio

    def __call__(self, step: int) -> float:
        return lr_ratio(step, self.warmup, self.max_steps, self.min_lr_ratio)


class Interrupted(KeyboardInterrupt):
    """Raised by ``train`` (and ``sweep``) after SIGINT or SIGTERM stopped a run at a step boundary, with a
    checkpoint written there: run the same config again to resume. ``exit_code`` is 130 or 143 (the first
    signal's). ``at_once``: a second signal stopped it mid-step; the last checkpoint written resumes it."""

    def __init__(self, signum: int, message: str, summary: dict | None = None, results: list | None = None,
                 at_once: bool = False):
        super().__init__(message)
        self.signum, self.summary, self.results, self.at_once = signum, summary, results, at_once
        self.exit_code = 128 + signum


class _StopOnSignal:
    """While active, SIGINT and SIGTERM only set ``signum`` (the loop stops at the next step boundary); a
    second signal (``again``) raises ``Interrupted(at_once=True)`` where the process is, except inside
    ``deferred()`` (a checkpoint being written): there it waits for the write to complete (a third signal
    does not wait: the write is atomic, the previous checkpoint stays). A signal the process ignores (SIG_IGN,
    as a background job ignores SIGINT) stays ignored. Outside the main thread nothing is installed (Python
    allows handlers only there). ``where``: what the at-once message names (the out_dir)."""

    def __init__(self, where: str = "the run"):
        self.signum, self.again, self.where, self._old, self._defer, self._count = None, None, where, {}, 0, 0

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self._count += 1
        if self.signum is None:
            self.signum = signum
            return
        self.again = self.again or signum
        if self._defer and self._count == 2:  # a checkpoint being written: it completes, then the run stops
            return
        raise Interrupted(self.signum, f"{signal.Signals(signum).name} again: {self.where} stopped at once; the "
                          "checkpoint it holds, if any, is intact: run the same command again", at_once=True)

    @contextlib.contextmanager
    def deferred(self):
        """A second signal inside waits until the block is done (see the class)."""
        self._defer += 1
        try:
            yield
        finally:
            self._defer -= 1

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
            if old is _exit_at_once:  # the command line, after the run: its own message says how it ended
                _AT_ONCE.update(note=None, code=128 + self.signum if self.signum else None)
        self._old = {}
        return False


def _deferring(signals: "_StopOnSignal | None"):
    return signals.deferred() if signals is not None else contextlib.nullcontext()


def _device(cfg: TrainConfig, local_rank: int) -> str:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RunError("device=cuda but torch sees no GPU; use device=cpu or auto")
    if cfg.device == "cpu" or not torch.cuda.is_available():
        return "cpu"
    torch.cuda.set_device(local_rank)
    return f"cuda:{local_rank}"


def _write_status(directory: Path, status: str, **extra) -> None:
    write_json_atomic(Path(directory) / "status.json", {"status": status, **jsonable(extra)})


def _check_out_dir(out_dir: Path) -> None:
    """Refuse an out_dir that is a file, or under one, or in a folder this process cannot write; writes nothing."""
    existing = next(q for q in (out_dir, *out_dir.parents) if q.exists() or q == q.parent)
    if not existing.is_dir():
        raise RunError(f"out_dir {out_dir} cannot be a folder: {existing} is a file; give another --out-dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunError(f"out_dir {out_dir} is not writable ({existing} is read-only or not ours); give a writable "
                       "--out-dir")


def preflight(cfg: TrainConfig, world_size: int = 1, device: str = "cpu", prepare_data: bool | None = None,
              memory: bool = True, concurrent: int = 1, optimizers: dict | None = None) -> dict:
    """Every check that needs no work and writes nothing, in the order a run meets them: the config (one
    ``validate``, with the length of the data if they are prepared), the out_dir, the data (prepared, or
    preparable here), the keys of ``optimizer={...}`` (built with ``optimizers``, see ``train``), and
    (``memory``) the memory estimate against what is available. Returns the estimate."""
    meta = _prepared_meta(cfg)
    validate(cfg, data_len=min(meta["train_tokens"], meta["val_tokens"]) if meta else None, world_size=world_size)
    if cfg.out_dir is None:
        raise ValueError("out_dir is not set; give out_dir (or --out-dir) for the metrics and checkpoints")
    _check_out_dir(Path(cfg.out_dir))
    vocab = cfg.vocab_size
    if cfg.data != "synthetic":
        where = cfg.data_dir if cfg.data_dir is not None else default_data_dir(cfg.data)
        if meta is None:
            if cfg.data_dir is not None and not prepare_data:
                raise RunError(f"data_dir={cfg.data_dir} holds no prepared {cfg.data} data set; pass --prepare-data "
                               f"(prepare_data=True) to prepare it there, or leave data_dir unset to use "
                               f"{default_data_dir(cfg.data)}")
            problem = preparation_problem(cfg.data)
            if problem:
                raise RunError(f"data={cfg.data} is not prepared in {where}, and {problem}")
        vocab = vocab or (meta["vocab_size"] if meta else VOCAB_SIZES[cfg.data])
    check_optimizer_options(cfg, vocab, check_optimizer_classes(optimizers))
    if not memory:
        return estimate_memory(cfg, vocab, world_size, str(device).startswith("cuda"))
    return check_memory(cfg, vocab, world_size, device, concurrent=concurrent)


def _prepared_meta(cfg: TrainConfig) -> dict | None:
    """The meta of the config's prepared data set, or None (not prepared, synthetic, or a mistyped field,
    which ``validate`` then names)."""
    if cfg.data == "synthetic" or not isinstance(cfg.data, str) or not isinstance(cfg.data_dir, (str, type(None))):
        return None
    return prepared_meta(cfg.data, cfg.data_dir)


def train(cfg: TrainConfig | dict, resume: bool = True, progress: bool = True, *, prepare_data: bool | None = None,
          memory_check: bool = True, optimizers: dict | None = None) -> dict:
    """Run ``cfg`` to ``max_steps`` or divergence; returns a summary (also in ``out_dir/status.json``).

    ``prepare_data``: None prepares the data set in its default folder only (data_dir unset), True also in
    an explicit ``data_dir``, False never. ``memory_check=False`` skips the memory estimate. ``optimizers``
    chooses the class behind a name of the optimizer registry (``{"muon": NoisyMuon}``: every rule of the
    assignment that names ``"muon"`` builds a ``NoisyMuon``). Raises ``Interrupted`` after SIGINT/SIGTERM
    (checkpoint written), ``RunError`` / ``ValueError`` for what the user can fix (the message says how).
    """
    t_start = time.perf_counter()
    cfg = TrainConfig.from_dict(cfg) if isinstance(cfg, dict) else cfg
    rank, local_rank, world = distributed.setup(cfg.device)

    def checks() -> str:
        device = _device(cfg, local_rank)
        preflight(cfg, world, device, prepare_data, memory_check, optimizers=optimizers)
        return device

    # every rank checks; a failure on any is reported once and ends every rank (distributed.agree)
    device = distributed.agree(checks, rank, world, code_of=exit_code_of)
    with contextlib.ExitStack() as stack:
        distributed.agree(lambda: rank == 0 and _lock_out_dir(Path(cfg.out_dir), stack), rank, world,
                          code_of=exit_code_of)
        return _train_checked(cfg, resume, progress, prepare_data, optimizers, rank, world, device, t_start,
                              locked=True)


def _lock_out_dir(out_dir: Path, stack: contextlib.ExitStack) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        stack.enter_context(OutDirLock(out_dir))
    except OSError as e:
        raise RunError(f"cannot write in out_dir {out_dir} ({e.strerror or e}); give a writable --out-dir") from None


def _train_checked(cfg: TrainConfig, resume: bool, progress: bool, prepare_data: bool | None,
                   optimizers: dict | None, rank: int = 0, world: int = 1, device: str = "cpu",
                   t_start: float | None = None, locked: bool = False) -> dict:
    """``train`` after its ``preflight`` (the sweep runs that once per config, in the parent process);
    ``locked``: the out_dir lock is held already (``train`` takes it)."""
    with contextlib.ExitStack() as stack:
        if rank == 0 and not locked:
            _lock_out_dir(Path(cfg.out_dir), stack)
        signals = stack.enter_context(_StopOnSignal(str(cfg.out_dir)))
        trainer = Trainer(cfg, device=device, rank=rank, world=world, optimizers=optimizers, t_start=t_start)
        return trainer.setup(resume=resume, prepare_data=prepare_data, progress=progress).run(signals=signals, progress=progress)


def check_optimizer_classes(optimizers: dict | None) -> dict:
    """Refuse an ``optimizers`` mapping (``train``'s and ``sweep``'s) that is not {registry name: optimizer
    class}, before any work; returns it (an empty dict for None)."""
    from manifold_muon.assignments import OPTIMIZERS

    if optimizers is None:
        return {}
    if not isinstance(optimizers, dict):
        raise ValueError(f"optimizers={optimizers!r} must be a dict {{registry name: optimizer class}}, "
                         "e.g. {'muon': NoisyMuon}")
    for name, cls in optimizers.items():
        if name not in OPTIMIZERS:
            raise ValueError(f"optimizers: {name!r} is not a name of the optimizer registry; choose one of "
                             f"{', '.join(OPTIMIZERS)}")
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            raise ValueError(f"optimizers[{name!r}]={cls!r} must be an optimizer class (a torch.optim.Optimizer)")
    return dict(optimizers)


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


HOOKS = ("before_update", "after_step")
DIVERGED_EXIT = 3  # the command line's exit code for a run that diverged (2: a usage error, 1: a bug)


class Trainer:
    """One run of ``cfg``: ``setup`` (data, model, optimizers, schedule, the checkpoint to resume from),
    ``step`` (one optimizer step), ``evaluate`` and ``save``; ``run`` is the loop over them (an evaluation
    every ``eval_every`` steps, progress lines, checkpoints, a stop at a signal, the final record).

        trainer = Trainer(cfg, hooks={"before_update": [probe]}).setup(resume=False)
        for _ in range(10):
            trainer.step()                  # or trainer.run() for the whole run, as ``train`` does

    ``hooks`` maps an event to callables: ``before_update(trainer, step)`` once the gradients are final
    (averaged over ranks and clipped) and the weights are W_t, just before the optimizer step;
    ``after_step(trainer, step, record)`` after the step's record is written. ``train`` checks the config
    (``preflight``) and holds the out_dir lock and the signal handlers; a Trainer used directly does neither.
    """

    def __init__(self, cfg: TrainConfig, *, device: str = "cpu", rank: int = 0, world: int = 1,
                 optimizers: dict | None = None, hooks: dict | None = None, t_start: float | None = None):
        unknown = set(hooks or {}) - set(HOOKS)
        if unknown:
            raise ValueError(f"Trainer: unknown hook {', '.join(sorted(unknown))}; hooks are {', '.join(HOOKS)}")
        self.cfg, self.device, self.rank, self.world = cfg, device, rank, world
        self.main, self.cuda, self.out_dir = rank == 0, str(device).startswith("cuda"), Path(cfg.out_dir)
        self.optimizer_classes = dict(optimizers or {})
        self.hooks = {event: list((hooks or {}).get(event, ())) for event in HOOKS}
        self.t_start = time.perf_counter() if t_start is None else t_start
        self.signals, self.status, self.last_loss, self.last_eval = None, "completed", float("nan"), {}

    def setup(self, resume: bool = True, prepare_data: bool | None = None, progress: bool = True) -> "Trainer":
        """Build everything a step needs; resume where a checkpoint of this config left off, or start fresh.
        Under torchrun the ranks end it together (``distributed.agree``: one failing rank fails them all)."""
        distributed.agree(lambda: self._setup(resume, prepare_data, progress), self.rank, self.world,
                          "while setting up", code_of=exit_code_of)
        return self

    def _setup(self, resume: bool, prepare_data: bool | None, progress: bool) -> None:
        cfg, device = self.cfg, self.device
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        # bfloat16: autocast on the run's device (CUDA; on the CPU too, as the gpu-dry presets run the GPU path)
        bf16 = cfg.dtype == "bfloat16"
        self.ctx = torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        prepare = prepare_data if prepare_data is not None else cfg.data_dir is None
        self.data = Batches(cfg.data, cfg.block_size, device, cfg.data_dir, cfg.vocab_size, prepare=prepare,
                            progress=progress)
        if cfg.block_size + 1 > self.data.min_split_len:  # data prepared after preflight: block_size against it
            raise ValueError(f"bad training config: block_size={cfg.block_size} needs at least {cfg.block_size + 1} "
                             f"tokens per split, the data has {self.data.min_split_len}; lower block_size")

        torch.manual_seed(cfg.seed)
        self.model = build_model(cfg.family, **model_fields(cfg, self.data.vocab_size)).to(device)
        self.forward = torch.compile(self.model) if cfg.compile else self.model  # same parameters, names, state
        self.optimizers = build_optimizers(self.model, cfg.assignment, lr=cfg.lr, adamw_lr=cfg.adamw_lr,
                                           classes=self.optimizer_classes, **cfg.optimizer)
        retract_parameters(self.optimizers)  # constrained weights start on their manifolds
        self.schedule = WarmupCosine(cfg.warmup, cfg.max_steps, cfg.min_lr_ratio)
        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(opt, self.schedule) for opt in self.optimizers]
        self.stepper = distributed.ShardedStep(self.optimizers, self.rank, self.world)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.gen = torch.Generator().manual_seed(cfg.seed + 1)  # the training batches
        self.accum = cfg.gradient_accumulation_steps
        self.micro, self.eval_bs = cfg.batch_size // (self.world * self.accum), cfg.batch_size // self.accum
        self.stop_flag = torch.zeros((), device=device)  # > 0 on every rank once any rank was signalled

        self.ckpt = Checkpointer(self.out_dir, cfg, self.rank, self.world)
        self.start, self.done, metrics_bytes, self.earlier_s, self.saved_step = 0, False, 0, 0.0, None
        if resume and self.ckpt.exists():
            saved = self.ckpt.read()
            self.ckpt.restore(saved, self.model, self.optimizers, self.schedulers, self.gen, self.cuda)
            self.start, self.done, metrics_bytes = saved["step"], saved.get("done", False), saved["metrics_bytes"]
            self.earlier_s = saved.get("wall_time_s", 0.0)  # the seconds of the sessions before this one
            self.saved_step = self.start  # the checkpoint a run stopped at once resumes from
        self.next_step = self.start
        self.rec = Recorder(self.out_dir, cfg, self.model, self.optimizers, self.data, main=self.main)
        if self.main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if self.start == 0 and not self.done:  # nothing of an earlier run may be resumed or read
                self.ckpt.clear()
                for stale in ("status.json", "provenance.json"):
                    (self.out_dir / stale).unlink(missing_ok=True)
            try:
                self.rec.open(metrics_bytes)
            except RuntimeError as e:  # metrics.jsonl shorter than the checkpoint says: the user's to fix
                raise RunError(str(e)) from None

    def step(self, measure_update: bool = False) -> dict:
        """Step ``next_step``: forward-backward over this rank's micro-batches, gradients averaged over ranks,
        a divergence check, clipping, the optimizer step, the schedule; returns the ``step`` record.
        ``measure_update``: also write the ``update`` record (W_t against W_{t+1}). A divergence sets
        ``status`` to "diverged at step k" (the record then has the loss only)."""
        cfg, step, accum, micro = self.cfg, self.next_step, self.accum, self.micro
        self._sync()
        t0 = time.perf_counter()
        X, Y = self.data.batch("train", cfg.batch_size, self.gen)
        X, Y = X[self.rank * micro * accum:], Y[self.rank * micro * accum:]
        loss_sum = torch.zeros((), device=self.device)
        for k in range(accum):
            with self.ctx:
                _, loss = self.forward(X[k * micro:(k + 1) * micro], Y[k * micro:(k + 1) * micro])
            (loss / accum).backward()
            loss_sum += loss.detach().float() / accum
        self.stop_flag.fill_(float(self.signals is not None and self.signals.signum is not None))
        grads = [p.grad for p in self.params if p.grad is not None]
        distributed.all_reduce_mean_(grads + [loss_sum, self.stop_flag], self.world)
        self._sync()
        t1 = time.perf_counter()
        self.last_loss = loss_sum.item()
        if is_diverged(self.last_loss, cfg.divergence_loss_threshold):
            return self._diverged({"kind": "step", "step": step, "loss": self.last_loss})

        before = self.rec.snapshot() if measure_update else None  # W_t, to measure the update
        gnorm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        lrs = {type(opt).__name__: opt.param_groups[0]["lr"] for opt in self.optimizers}  # what this step uses
        for hook in self.hooks["before_update"]:
            hook(self, step)
        try:
            self.stepper.step()
        except FloatingPointError as e:  # a non-finite gradient the optimizer refused
            return self._diverged({"kind": "step", "step": step, "loss": self.last_loss, "error": str(e)})
        self._sync()
        t2 = time.perf_counter()
        if before is not None:
            self.rec.update(step, before)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        for sch in self.schedulers:
            sch.step()
        record = {"kind": "step", "step": step, "loss": self.last_loss, "lr": lrs, "lr_ratio": self.schedule(step),
                  "grad_norm": gnorm.item(), "time_fb_s": t1 - t0, "time_opt_s": t2 - t1,
                  "tokens_per_s": cfg.batch_size * cfg.block_size / (t2 - t0)}
        self.rec.emit(record)
        self.next_step = step + 1
        for hook in self.hooks["after_step"]:
            hook(self, step, record)
        return record

    def evaluate(self, step: int, final: bool = False) -> dict:
        """Write the ``eval`` record of the weights before ``step`` (spectra and attention probe when due;
        both at the ``final`` evaluation); returns its train and val loss."""
        def due(every: int) -> bool:
            return every > 0 and (final or step % every == 0)

        self.last_eval_step = step
        self.last_eval = self.rec.evaluate(step, self.forward, self.ctx, self.eval_bs,
                                           spectra=due(self.cfg.spectrum_every), probe=due(self.cfg.probe_every))
        return self.last_eval

    def save(self, step: int, finished: bool) -> None:
        """A checkpoint to continue after ``step`` steps (every rank takes part); a second signal waits for it."""
        with _deferring(self.signals):
            self.ckpt.save(step, finished, self.model, self.optimizers, self.schedulers, self.gen, self.rec.tell(),
                           self.cuda, wall_time_s=self.wall())
        self.saved_step = step

    def _progress_line(self, done: int, rate_from: tuple) -> str:
        """``[train <run>] step k/N loss x (val y at step j) r steps/s, ETA t``: the validation loss says when it
        was measured; the rate and ETA count only this session's steps (a resumed run's earlier ones are not)."""
        cfg = self.cfg
        val = ""
        if self.last_eval:
            val = f" (val {self.last_eval['val_loss']:.4f} at step {self.last_eval_step})"
        dt, steps = time.monotonic() - rate_from[0], done - rate_from[1]
        rate = steps / dt if dt > 0 and steps > 0 else None
        eta = f", ETA {_duration((cfg.max_steps - done) / rate)}" if rate else ""
        speed = f" {rate:.2f} steps/s" if rate and rate >= 0.1 else (f" {1 / rate:.1f} s/step" if rate else "")
        return (f"[train {self.out_dir.name}] step {done}/{cfg.max_steps} loss {self.last_loss:.4f}{val}{speed}"
                f"{eta} ({self.wall():.0f} s)")

    def run(self, signals: "_StopOnSignal | None" = None, progress: bool = True) -> dict:
        """Step from where ``setup`` left off to ``max_steps``, a divergence or a signal; returns the summary
        (and writes ``status.json`` and ``provenance.json``); raises ``Interrupted`` after a signal."""
        cfg, self.signals = self.cfg, signals
        every, last_line = max(1, cfg.max_steps // 20), time.monotonic()
        step = self.start
        rate_from = (time.monotonic(), self.start)  # steps per second over this session's steps
        try:
            for step in range(self.start, self.start if self.done else cfg.max_steps):
                at_eval = step % cfg.eval_every == 0 and self.main
                if at_eval:
                    self.evaluate(step)
                self.step(measure_update=at_eval)
                if self.status != "completed":
                    break
                if progress and self.main and ((step + 1) % every == 0 or step + 1 == cfg.max_steps
                                               or time.monotonic() - last_line >= PROGRESS_SECONDS):
                    print(self._progress_line(step + 1, rate_from), file=sys.stderr, flush=True)
                    last_line = time.monotonic()
                if self._signalled() and step + 1 < cfg.max_steps:  # stop here, resumable from this boundary
                    step += 1
                    if cfg.checkpoint_every >= 0:
                        self.save(step, finished=False)
                    self.status = f"interrupted at step {step}"
                    break
                if cfg.checkpoint_every > 0 and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.max_steps:
                    self.save(step + 1, finished=False)
                    if self.signals is not None and self.signals.again is not None:  # came during the write
                        step += 1
                        self.status = f"interrupted at step {step}"
                        break
            else:
                step = cfg.max_steps
                if not self.done:
                    if self.main:
                        self.evaluate(step, final=True)
                    if cfg.checkpoint_every >= 0:
                        self.save(step, finished=True)
        except Interrupted as e:  # a second signal, mid-step
            raise self._stopped_at_once(step, e) from None
        except Exception as e:  # the run had started: its status says how it ended
            if self.signals is not None and self.signals.again is not None and distributed.is_peer_failure(e):
                raise self._stopped_at_once(step, e) from None  # the other rank stopped at once first
            if self.main:
                _write_status(self.out_dir, f"failed: {type(e).__name__}: {e}", step=step, wall_time_s=self.wall())
            raise
        finally:
            self.rec.close()
        with _deferring(self.signals):  # the records of a run that ended: a second signal waits for them
            return self._finish(step)

    def _stopped_at_once(self, step: int, e: BaseException) -> Interrupted:
        """The ``Interrupted`` of a run a second signal stopped during ``step`` (its status written)."""
        first, again = self.signals.signum, signal.Signals(self.signals.again).name
        resume = (f"its checkpoint of step {self.saved_step} is intact; run the same command again to resume from "
                  "there" if self.saved_step is not None else "no checkpoint was written; run the same command "
                  "again to start over")
        status = f"interrupted during step {step}, stopped at once by a second signal; {resume.split(';')[0]}"
        summary = {"status": status, "step": step, "last_loss": self.last_loss, "wall_time_s": self.wall(),
                   "out_dir": str(self.out_dir)}
        if self.main:
            with _deferring(self.signals):
                _write_status(self.out_dir, status, **{k: v for k, v in summary.items() if k != "status"})
        return Interrupted(first, f"{again} again: {self.out_dir} stopped at once during step {step}; {resume}",
                           summary=summary, at_once=True)

    def close(self) -> None:
        """Close the metrics file (``run`` does so itself; for a Trainer stepped by hand)."""
        self.rec.close()

    # ------------------------------------------------------------------------- helpers

    def wall(self) -> float:
        """The run's seconds so far, the sessions before this one included."""
        return self.earlier_s + time.perf_counter() - self.t_start

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _signalled(self) -> bool:
        if self.world > 1:
            return self.stop_flag.item() > 0
        return self.signals is not None and self.signals.signum is not None

    def _diverged(self, record: dict) -> dict:
        self.rec.emit(record)
        self.status = f"diverged at step {record['step']}"
        return record

    def _finish(self, step: int) -> dict:
        cfg, out_dir, status = self.cfg, self.out_dir, self.status
        summary = {"status": status, "step": step, "last_loss": self.last_loss,
                   **({f"final_{k}": v for k, v in self.last_eval.items()} if status == "completed" else {}),
                   "wall_time_s": self.wall(), "out_dir": str(out_dir)}
        if self.main:
            old = (json.loads((out_dir / "status.json").read_text())
                   if self.done and (out_dir / "status.json").exists() else None)
            if old is not None:  # a finished run, resumed: it keeps what it recorded, wall time included
                summary = {**summary, **{k: v for k, v in old.items() if k != "out_dir"}}
            else:
                _write_status(out_dir, status, **{k: v for k, v in summary.items() if k != "status"})
                classes = {k: f"{c.__module__}.{c.__qualname__}" for k, c in self.optimizer_classes.items()}
                write_json_atomic(out_dir / "provenance.json", provenance(
                    parameters={**cfg.to_dict(), "world_size": self.world,
                                **({"optimizer_classes": classes} if classes else {})},
                    wall_time_s=summary["wall_time_s"]))
        if status.startswith("interrupted"):
            signum = (self.signals.signum if self.signals else None) or signal.SIGTERM  # told by another rank
            how = "a checkpoint was written there" if cfg.checkpoint_every >= 0 else \
                "no checkpoint (checkpoint_every=-1)"
            raise Interrupted(signum, f"{signal.Signals(signum).name}: {out_dir} {status}, {how}; run the same "
                              "command again to resume", summary=summary)
        return summary


def sweep(cfgs, resume: bool = True, progress: bool = True, workers: int | None = 1,
          optimizers: dict | None = None) -> list[dict]:
    """``manifold_muon_lab.sweep.sweep``: independent configs, ``workers`` at a time (see there)."""
    from .sweep import sweep as _sweep

    return _sweep(cfgs, resume=resume, progress=progress, workers=workers, optimizers=optimizers)


# ----------------------------------------------------------------------------- the command line

def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


# What the user can fix: the message says how. Anything else is a bug, reported as one too.
_USER_ERRORS = (RunError, ValueError, TypeError, OSError, ImportError, MemoryError)


def exit_code_of(e: BaseException) -> int:
    """The command line's exit code for an error: 2 for what the user can fix (and out of memory), 1 for a bug."""
    if isinstance(e, distributed.PeerFailed):
        return e.exit_code
    return 2 if isinstance(e, (*_USER_ERRORS, torch.OutOfMemoryError)) else 1


def _error_sentence(e: BaseException) -> str:
    if isinstance(e, torch.OutOfMemoryError):
        return (f"out of memory on the GPU ({_one_line(e).split('. ')[0]}); lower batch_size or block_size, "
                "or raise gradient_accumulation_steps")
    if distributed.is_peer_failure(e):
        what = _one_line(e).split("] ", 1)[-1].split(". ")[0]  # without gloo's "[.../pair.cc:537] "
        return (f"another rank is gone, it failed or was killed (its own message, or the launcher's, says why): "
                f"{type(e).__name__}: {what}")
    if isinstance(e, _USER_ERRORS):
        return _one_line(e)
    return (f"unexpected {type(e).__name__}: {_one_line(e)} (this is a bug or an unhandled case: run again "
            "with --debug for the traceback and report it)")


def _reports(e: BaseException, rank: int) -> bool:
    """Whether this rank prints ``e``: the rank ``distributed.agree`` chose; rank 0 for a lost peer; else the
    rank it happened on (an error during the run is one rank's own)."""
    chosen = distributed.reporter(e)
    if chosen is not None:
        return rank == chosen
    return rank == 0 or not distributed.is_peer_failure(e)


LINGER_S = 60.0


def _outlive_rank_0(code: int) -> None:
    """A rank > 0 that found what rank 0 finds too (a bad preset, before any collective) waits for torchrun's
    SIGTERM, which comes once rank 0 has exited, and then exits ``code``: had it exited first, torchrun would
    have sent SIGTERM to a rank 0 still starting, which would end with 143 and no sentence (seen under load)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    _AT_ONCE.update(note="", code=code)  # the SIGTERM handler exits with code, silently
    deadline = time.monotonic() + LINGER_S
    while time.monotonic() < deadline:
        time.sleep(0.05)


def main(argv=None) -> dict:
    rank = int(os.environ.get("RANK", "0"))
    ap = argparse.ArgumentParser(prog=_PROG, description=__doc__.split("\n\n")[0],
                                 epilog="Errors are one sentence (exit code 2); --debug shows the traceback. "
                                        "SIGINT/SIGTERM stop at the next step with a checkpoint (exit 130/143), a second one at "
                                        "once; a run that diverges exits 3. Several processes: python -m "
                                        "manifold_muon_lab.launch --nproc_per_node N -m manifold_muon_lab.train ...")
    ap.add_argument("--preset", default="cpu", help="a preset name (a .yml file in --preset-dir) or a .yml path")
    ap.add_argument("--preset-dir", default=str(DEFAULT_PRESET_DIR), help="where preset names are looked up")
    ap.add_argument("--assignment", default=None, help="manifold assignment (overrides the preset's)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key (value read as YAML; 1e-3 is a float); repeatable")
    ap.add_argument("--out-dir", default=None, help="default: runs/_train/<preset>/<assignment>")
    ap.add_argument("--no-resume", action="store_true", help="start over even if a checkpoint exists")
    ap.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    ap.add_argument("--prepare-data", action="store_true",
                    help="prepare the data set in an explicit data_dir that does not hold it yet (the default "
                         "folder, data/<name> or $MANIFOLD_MUON_DATA_DIR/<name>, is always prepared on first use)")
    ap.add_argument("--no-memory-check", action="store_true", help="run even if the memory estimate exceeds what is free")
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = ap.parse_args(argv)
    try:  # a bad preset or override is a usage error: say what is wrong, no traceback (train validates the rest)
        overrides = parse_overrides(args.overrides)
        if args.assignment is not None:
            overrides["assignment"] = args.assignment
        cfg = load_preset(args.preset, args.preset_dir, **overrides)
        if args.out_dir is not None:
            if not args.out_dir.strip():
                raise ValueError("--out-dir '' names no folder (the run would write into the current directory); "
                                 "give a folder, or leave --out-dir out for runs/_train/<preset>/<assignment>")
            cfg.out_dir = args.out_dir
        if cfg.out_dir is None:
            tag = cfg.assignment if isinstance(cfg.assignment, str) else "custom"
            cfg.out_dir = str(Path("runs") / "_train" / Path(args.preset).stem / tag)
    except (ValueError, TypeError, FileNotFoundError) as e:
        if args.debug:
            raise
        if rank == 0:  # every rank reads the same preset: one says what is wrong
            print(f"{ap.prog}: error: {_one_line(e)}", file=sys.stderr, flush=True)
        else:
            _outlive_rank_0(2)
        sys.exit(2)
    try:
        summary = train(cfg, resume=not args.no_resume, progress=not args.no_progress,
                        prepare_data=True if args.prepare_data else None, memory_check=not args.no_memory_check)
    except Interrupted as e:
        if rank == 0:  # the ranks stop at the same step (or each at once): rank 0 says so
            print(f"{ap.prog}: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 - every error ends in one sentence
        if args.debug:
            raise
        if _reports(e, rank):
            who = f"rank {rank}: " if rank > 0 else ""
            print(f"{ap.prog}: error: {who}{_error_sentence(e)}", file=sys.stderr, flush=True)
        sys.exit(exit_code_of(e))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(jsonable(summary)), flush=True)
    if str(summary.get("status", "")).startswith("diverged"):
        if rank == 0:
            print(f"{ap.prog}: the run {summary['status']} (its record is in {cfg.out_dir}); lower lr, or raise "
                  "divergence_loss_threshold if the loss spike is expected", file=sys.stderr, flush=True)
        sys.exit(DIVERGED_EXIT)
    return summary


if __name__ == "__main__":
    main()
