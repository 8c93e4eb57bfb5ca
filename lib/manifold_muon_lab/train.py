"""The training loop: one run of one config, recording why it behaves as it does.

    from manifold_muon_lab.config import load_preset
    from manifold_muon_lab.train import train, sweep
    summary = train(load_preset("cpu", "runs/presets/training", assignment="hetero", out_dir="runs/_train/hetero"))
    results = sweep([cfg_a, cfg_b, cfg_c], workers=2)    # independent runs, two processes at a time

    python -m manifold_muon_lab.train --preset cpu --assignment hetero [--set key=value ...]
    torchrun --nproc_per_node 2 -m manifold_muon_lab.train --preset cpu-tiny     # data parallel

What a run leaves in ``out_dir``: ``metrics.jsonl`` (see ``metrics.Recorder``), ``status.json``
("completed", "diverged at step k" or "interrupted at step k"; final losses only for a completed run),
``provenance.json`` and ``checkpoint.pt`` (see ``checkpoint``: a killed run restarted with the same config
resumes bit-identically). While it runs it holds ``train.lock`` (see ``checkpoint.OutDirLock``): a second
run on the same ``out_dir`` is refused.

How a run fails. Before any work (no file written): the config (``config.validate``), the keys of
``optimizer={...}`` (the assignment's optimizers are built on a meta-device model), the data (a ``data_dir``
given explicitly must hold the prepared data set unless ``prepare_data=True`` / ``--prepare-data``; the
default folder is prepared on first use; ``block_size`` against its length), and memory (``config.check_memory``:
the estimate against what the OS says is available). On SIGINT (Ctrl-C) or SIGTERM the run stops at the next
step boundary, writes a checkpoint there and ``status.json`` "interrupted at step N", and ``train`` raises
``Interrupted`` (the command line exits 130 or 143); a second signal stops it at once. The command line
prints every error as one sentence (exit code 2) and the traceback only with ``--debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
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

__all__ = ["train", "sweep", "preflight", "Interrupted", "lr_ratio", "WarmupCosine", "model_fields", "main"]

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
    checkpoint written there: run the same config again to resume. ``exit_code`` is 130 or 143."""

    def __init__(self, signum: int, message: str, summary: dict | None = None, results: list | None = None):
        super().__init__(message)
        self.signum, self.summary, self.results = signum, summary, results
        self.exit_code = 128 + signum


class _StopOnSignal:
    """While active, SIGINT and SIGTERM only set ``signum`` (the loop stops at the next step boundary); a
    second signal restores the previous handler and delivers itself, stopping the process at once. A signal
    the process ignores (SIG_IGN, as a background job ignores SIGINT) stays ignored. Outside the main
    thread nothing is installed (Python allows handlers only there)."""

    def __init__(self):
        self.signum, self._old = None, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is None:
            self.signum = signum
            return
        old = self._old.pop(signum, signal.SIG_DFL)
        signal.signal(signum, old)
        if callable(old):
            old(signum, frame)
        else:
            os.kill(os.getpid(), signum)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
        return False


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
              memory: bool = True, concurrent: int = 1) -> dict:
    """Every check that needs no work and writes nothing, in the order a run meets them: the config, the
    out_dir, the data (prepared, or preparable here; ``block_size`` against its length), the keys of
    ``optimizer={...}``, and (``memory``) the memory estimate against what is available. Returns the estimate."""
    validate(cfg, world_size=world_size)
    if cfg.out_dir is None:
        raise ValueError("out_dir is not set; give out_dir (or --out-dir) for the metrics and checkpoints")
    _check_out_dir(Path(cfg.out_dir))
    vocab = cfg.vocab_size
    if cfg.data != "synthetic":
        meta = prepared_meta(cfg.data, cfg.data_dir)
        where = cfg.data_dir if cfg.data_dir is not None else default_data_dir(cfg.data)
        if meta is None:
            if cfg.data_dir is not None and not prepare_data:
                raise RunError(f"data_dir={cfg.data_dir} holds no prepared {cfg.data} data set; pass --prepare-data "
                               f"(prepare_data=True) to prepare it there, or leave data_dir unset to use "
                               f"{default_data_dir(cfg.data)}")
            problem = preparation_problem(cfg.data)
            if problem:
                raise RunError(f"data={cfg.data} is not prepared in {where}, and {problem}")
        else:
            validate(cfg, data_len=min(meta["train_tokens"], meta["val_tokens"]), world_size=world_size)
        vocab = vocab or (meta["vocab_size"] if meta else VOCAB_SIZES[cfg.data])
    check_optimizer_options(cfg, vocab)
    if not memory:
        return estimate_memory(cfg, vocab, world_size, str(device).startswith("cuda"))
    return check_memory(cfg, vocab, world_size, device, concurrent=concurrent)


def train(cfg: TrainConfig | dict, resume: bool = True, progress: bool = True, *, prepare_data: bool | None = None,
          memory_check: bool = True) -> dict:
    """Run ``cfg`` to ``max_steps`` or divergence; returns a summary (also in ``out_dir/status.json``).

    ``prepare_data``: None prepares the data set in its default folder only (data_dir unset), True also in
    an explicit ``data_dir``, False never. ``memory_check=False`` skips the memory estimate. Raises
    ``Interrupted`` after SIGINT/SIGTERM (checkpoint written), ``RunError`` / ``ValueError`` for what the
    user can fix (the message says how).
    """
    t_start = time.perf_counter()
    cfg = TrainConfig.from_dict(cfg) if isinstance(cfg, dict) else cfg
    rank, local_rank, world = distributed.setup()
    device = _device(cfg, local_rank)
    preflight(cfg, world, device, prepare_data, memory_check)
    out_dir, main_rank = Path(cfg.out_dir), rank == 0
    with contextlib.ExitStack() as stack:
        if main_rank:
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
                stack.enter_context(OutDirLock(out_dir))
            except OSError as e:
                raise RunError(f"cannot write in out_dir {out_dir} ({e.strerror or e}); give a writable --out-dir") \
                    from None
        signals = stack.enter_context(_StopOnSignal())
        return _train(cfg, resume, progress, prepare_data, t_start, rank, local_rank, world, device, signals)


def _train(cfg, resume, progress, prepare_data, t_start, rank, local_rank, world, device, signals) -> dict:
    out_dir, main_rank = Path(cfg.out_dir), rank == 0
    cuda = device.startswith("cuda")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if cuda and cfg.dtype == "bfloat16" else contextlib.nullcontext()
    prepare = prepare_data if prepare_data is not None else cfg.data_dir is None
    data = Batches(cfg.data, cfg.block_size, device, cfg.data_dir, cfg.vocab_size, prepare=prepare)
    validate(cfg, data_len=data.min_split_len, world_size=world)  # block_size vs the data

    torch.manual_seed(cfg.seed)
    model = build_model(cfg.family, **model_fields(cfg, data.vocab_size)).to(device)
    forward = torch.compile(model) if cfg.compile else model  # same parameters; names and state from `model`
    optimizers = build_optimizers(model, cfg.assignment, lr=cfg.lr, adamw_lr=cfg.adamw_lr, **cfg.optimizer)
    retract_parameters(optimizers)  # constrained weights start on their manifolds
    schedule = WarmupCosine(cfg.warmup, cfg.max_steps, cfg.min_lr_ratio)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(opt, schedule) for opt in optimizers]
    stepper = distributed.ShardedStep(optimizers, rank, world)
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(cfg.seed + 1)  # the training batches
    accum = cfg.gradient_accumulation_steps
    micro, eval_bs = cfg.batch_size // (world * accum), cfg.batch_size // accum

    # resume where a checkpoint of this config left off, or start fresh
    ckpt = Checkpointer(out_dir, cfg, rank, world)
    start, done, metrics_bytes, earlier_s = 0, False, 0, 0.0
    if resume and ckpt.exists():
        saved = ckpt.read()
        ckpt.restore(saved, model, optimizers, schedulers, gen, cuda)
        start, done, metrics_bytes = saved["step"], saved.get("done", False), saved["metrics_bytes"]
        earlier_s = saved.get("wall_time_s", 0.0)  # the seconds of the sessions before this one
    rec = Recorder(out_dir, cfg, model, optimizers, data, main=main_rank)
    if main_rank:
        if start == 0 and not done:  # nothing of an earlier run may be resumed or read
            ckpt.clear()
            for stale in ("status.json", "provenance.json"):
                (out_dir / stale).unlink(missing_ok=True)
        rec.open(metrics_bytes)
    if world > 1:
        dist.barrier()

    def wall() -> float:
        return earlier_s + time.perf_counter() - t_start

    def save(step: int, finished: bool) -> None:
        ckpt.save(step, finished, model, optimizers, schedulers, gen, rec.tell(), cuda, wall_time_s=wall())

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    status, last_loss, last_eval = "completed", float("nan"), {}
    progress_every, last_line = max(1, cfg.max_steps // 20), time.monotonic()
    stop_flag = torch.zeros((), device=device)  # > 0 on every rank once any rank was signalled
    step = start
    try:
        for step in range(start, start if done else cfg.max_steps):
            at_eval = step % cfg.eval_every == 0 and main_rank
            if at_eval:
                last_eval = rec.evaluate(step, forward, ctx, eval_bs, spectra=cfg.spectrum_every > 0
                                         and step % cfg.spectrum_every == 0,
                                         probe=cfg.probe_every > 0 and step % cfg.probe_every == 0)

            # forward-backward over the micro-batches of this rank's share of the global batch
            sync()
            t0 = time.perf_counter()
            X, Y = data.batch("train", cfg.batch_size, gen)
            X, Y = X[rank * micro * accum:], Y[rank * micro * accum:]
            loss_sum = torch.zeros((), device=device)
            for k in range(accum):
                with ctx:
                    _, loss = forward(X[k * micro:(k + 1) * micro], Y[k * micro:(k + 1) * micro])
                (loss / accum).backward()
                loss_sum += loss.detach().float() / accum
            stop_flag.fill_(float(signals.signum is not None))
            distributed.all_reduce_mean_([p.grad for p in params if p.grad is not None] + [loss_sum, stop_flag],
                                         world)
            sync()
            t1 = time.perf_counter()
            last_loss = loss_sum.item()
            if is_diverged(last_loss, cfg.divergence_loss_threshold):
                rec.emit({"kind": "step", "step": step, "loss": last_loss})
                status = f"diverged at step {step}"
                break

            # the optimizer step (W_t kept at an evaluation step, to measure the update)
            before = rec.snapshot() if at_eval else None
            gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            lrs = {type(opt).__name__: opt.param_groups[0]["lr"] for opt in optimizers}  # what this step uses
            try:
                stepper.step()
            except FloatingPointError as e:  # a non-finite gradient the optimizer refused
                rec.emit({"kind": "step", "step": step, "loss": last_loss, "error": str(e)})
                status = f"diverged at step {step}"
                break
            sync()
            t2 = time.perf_counter()
            if before is not None:
                rec.update(step, before)
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            for sch in schedulers:
                sch.step()
            rec.emit({"kind": "step", "step": step, "loss": last_loss, "lr": lrs, "lr_ratio": schedule(step),
                      "grad_norm": gnorm.item(), "time_fb_s": t1 - t0, "time_opt_s": t2 - t1,
                      "tokens_per_s": cfg.batch_size * cfg.block_size / (t2 - t0)})
            if progress and main_rank and ((step + 1) % progress_every == 0 or step + 1 == cfg.max_steps
                                           or time.monotonic() - last_line >= PROGRESS_SECONDS):
                val = f" val {last_eval['val_loss']:.4f}" if last_eval else ""
                print(f"[train {out_dir.name}] step {step + 1}/{cfg.max_steps} loss {last_loss:.4f}{val} "
                      f"({wall():.0f} s)", file=sys.stderr, flush=True)
                last_line = time.monotonic()
            stop = signals.signum is not None if world == 1 else stop_flag.item() > 0
            if stop and step + 1 < cfg.max_steps:  # a signal: stop here, resumable from this boundary
                step += 1
                if cfg.checkpoint_every >= 0:
                    save(step, finished=False)
                status = f"interrupted at step {step}"
                break
            if cfg.checkpoint_every > 0 and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.max_steps:
                save(step + 1, finished=False)
        else:
            step = cfg.max_steps
            if not done:
                if main_rank:
                    last_eval = rec.evaluate(step, forward, ctx, eval_bs, spectra=cfg.spectrum_every > 0,
                                             probe=cfg.probe_every > 0)
                if cfg.checkpoint_every >= 0:
                    save(step, finished=True)
    except (RuntimeError, FloatingPointError) as e:  # the run had started: its status says how it ended
        if main_rank:
            _write_status(out_dir, f"failed: {type(e).__name__}: {e}", step=step, wall_time_s=wall())
        raise
    finally:
        rec.close()

    summary = {"status": status, "step": step, "last_loss": last_loss,
               **({f"final_{k}": v for k, v in last_eval.items()} if status == "completed" else {}),
               "wall_time_s": wall(), "out_dir": str(out_dir)}
    if main_rank:
        old = json.loads((out_dir / "status.json").read_text()) if done and (out_dir / "status.json").exists() else None
        if old is not None:  # a finished run, resumed: it keeps what it recorded, wall time included
            summary = {**summary, **{k: v for k, v in old.items() if k != "out_dir"}}
        else:
            _write_status(out_dir, status, **{k: v for k, v in summary.items() if k != "status"})
            write_json_atomic(out_dir / "provenance.json", provenance(
                parameters={**cfg.to_dict(), "world_size": world}, wall_time_s=summary["wall_time_s"]))
    if status.startswith("interrupted"):
        signum = signals.signum or signal.SIGTERM  # a rank told by another rank's flag
        how = "a checkpoint was written there" if cfg.checkpoint_every >= 0 else "no checkpoint (checkpoint_every=-1)"
        raise Interrupted(signum, f"{signal.Signals(signum).name}: {out_dir} {status}, {how}; run the same "
                          "command again to resume", summary=summary)
    return summary


# ----------------------------------------------------------------------------- sweeps

def _failure(cfg: TrainConfig, e: BaseException) -> dict:
    """The record of a run that failed (the sweep goes on). ``train`` itself wrote it to status.json if the
    run had started; a run refused before (a locked out_dir, another config's checkpoint) leaves that folder alone."""
    return {"status": f"failed: {type(e).__name__}: {e}", "out_dir": cfg.out_dir}


def _context(name: str | None):
    """The context manager named ``"module:function"`` (``sweep``'s ``context``), or a null context."""
    if name is None:
        return contextlib.nullcontext()
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)()


def _check_context(name: str | None) -> None:
    """Refuse a ``context`` that does not name an importable callable, before any run starts."""
    if name is None:
        return
    module, sep, attr = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not (sep and module and attr):
        raise ValueError(f"context={name!r} must be 'module:function' naming a context-manager factory, "
                         "e.g. 'manifold_muon_book.evidence:noisy_msign_muon'")
    try:
        found = callable(getattr(importlib.import_module(module), attr, None))
    except ImportError as e:
        raise ValueError(f"context={name!r}: cannot import {module!r} ({e}); every worker must import it") from e
    if not found:
        raise ValueError(f"context={name!r}: {module!r} has no callable {attr!r}")


def _run_job(job: dict) -> dict:
    cfg = TrainConfig.from_dict(job["cfg"])
    torch.set_num_threads(cfg.threads or 1)
    try:
        with _context(job.get("context")):
            return {"kind": "done", "result": train(cfg, resume=job["resume"], progress=job["progress"],
                                                    prepare_data=job["prepare_data"])}
    except Interrupted as e:
        return {"kind": "interrupted", "signum": e.signum, "result": e.summary}
    except (RuntimeError, FloatingPointError) as e:
        return {"kind": "done", "result": _failure(cfg, e)}
    except Exception as e:  # noqa: BLE001 - the parent raises it after the other runs end
        return {"kind": "error", "type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}


def _sweep_worker(fd_in: int, fd_out: int) -> None:
    """A worker of a parallel sweep (its own interpreter): one JSON job per line on ``fd_in``, one JSON
    result per line on ``fd_out``, until ``fd_in`` closes."""
    with os.fdopen(fd_in) as jobs, os.fdopen(fd_out, "w") as results:
        for line in jobs:
            results.write(json.dumps(jsonable(_run_job(json.loads(line)))) + "\n")
            results.flush()


class _Worker:
    """One worker process of a parallel sweep and the pipes to it. Started as a fresh interpreter (so no
    caller's ``__main__`` is re-imported, as multiprocessing's spawn would), in its own process group (a
    terminal's Ctrl-C reaches only the sweep, which forwards SIGTERM to the runs), single-threaded."""

    def __init__(self, threads: int):
        job_r, self.job_w = os.pipe()
        self.result_r, result_w = os.pipe()
        lib = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [lib, os.environ.get("PYTHONPATH")]))}
        if not threads:
            env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        code = ("import sys; from manifold_muon_lab.train import _sweep_worker; "
                "_sweep_worker(int(sys.argv[1]), int(sys.argv[2]))")
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(job_r), str(result_w)], env=env,
                                     pass_fds=(job_r, result_w), process_group=0)
        os.close(job_r)
        os.close(result_w)
        self.index, self._buf = None, b""

    def send(self, index: int, job: dict) -> None:
        self.index = index
        os.write(self.job_w, (json.dumps(job) + "\n").encode())

    def receive(self):
        """The result of the job in flight if it has come in full; "died" if the worker is gone; else None."""
        chunk = os.read(self.result_r, 1 << 16)
        if not chunk:
            return "died"
        self._buf += chunk
        if b"\n" not in self._buf:
            return None
        line, self._buf = self._buf.split(b"\n", 1)
        self.index_done, self.index = self.index, None
        return json.loads(line)

    def close(self) -> None:
        for fd in (self.job_w, self.result_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.proc.wait()


def _error_from_child(record: dict) -> BaseException:
    import builtins

    cls = {"RunError": RunError}.get(record["type"], getattr(builtins, record["type"], None))
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = RuntimeError
    try:
        return cls(record["message"])
    except Exception:  # noqa: BLE001 - a constructor that wants other arguments
        return RuntimeError(f"{record['type']}: {record['message']}")


def sweep(cfgs, resume: bool = True, progress: bool = True, workers: int | None = 1,
          context: str | None = None) -> list[dict]:
    """Train independent configs, ``workers`` at a time; returns their summaries in the order of ``cfgs``.

    Every config is validated (and its memory estimate checked, ``workers`` runs at once) before the first
    run starts, so a typo in the fifth does not cost the first four. A diverged run is recorded as such and
    a run that fails (``RuntimeError``, ``FloatingPointError``, or its process dies) as
    ``{"status": "failed: ..."}``; the others go on. Any other error stops the sweep (after the runs in
    flight end) and is raised. With ``workers=1`` the runs go one after the other in this process; with
    k > 1 each run has its own process (spawned, one torch thread unless its config sets ``threads``), k at
    once; ``workers=None`` means one per available core. SIGINT or SIGTERM stops every run at its next step
    boundary with a checkpoint and raises ``Interrupted``; sweeping again resumes.

    ``context``, ``"module:function"``, names a context-manager factory that every run is trained inside,
    in whichever process trains it (e.g. ``"manifold_muon_book.evidence:noisy_msign_muon"``, which swaps
    an optimizer in the registry): a patch made by the caller would not reach a worker's fresh interpreter.
    """
    cfgs = [TrainConfig.from_dict(c) if isinstance(c, dict) else c for c in cfgs]
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} must be a positive int (or None: one per core)")
    workers = min(workers, max(1, len(cfgs)))
    _check_context(context)
    with _context(context):  # the configs are checked as they will be trained
        for c in cfgs:
            validate(c)
        for c in cfgs:
            preflight(c, device="cuda:0" if c.device != "cpu" and torch.cuda.is_available() else "cpu",
                      concurrent=workers)
    if workers == 1:
        results = []
        for c in cfgs:
            try:
                with _context(context):
                    results.append(train(c, resume=resume, progress=progress))
            except (RuntimeError, FloatingPointError) as e:
                results.append(_failure(c, e))
            except Interrupted as e:
                e.results = results
                raise
        return results
    return _sweep_parallel(cfgs, resume, progress, workers, context)


def _sweep_parallel(cfgs: list, resume: bool, progress: bool, workers: int, context: str | None) -> list[dict]:
    import select

    for c in cfgs:  # prepare each data set once, here, not in k processes at the same time
        if c.data != "synthetic" and c.data_dir is None:
            Batches(c.data, c.block_size, "cpu", None, c.vocab_size)
    results: list = [None] * len(cfgs)
    todo, pool = list(range(len(cfgs))), []
    error, stopped, received = None, None, []
    main_thread = threading.current_thread() is threading.main_thread()

    def on_term(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt

    def busy():
        return [w for w in pool if w.index is not None]

    old_term = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    try:
        while True:
            try:
                for w in pool:  # hand out jobs to idle workers, starting workers as needed
                    if w.index is None and todo and error is None and stopped is None:
                        i = todo.pop(0)
                        w.send(i, {"cfg": cfgs[i].to_dict(), "resume": resume, "progress": progress,
                                   "prepare_data": False, "context": context})  # prepared above, or refused by preflight
                while todo and len(pool) < workers and error is None and stopped is None:
                    pool.append(_Worker(cfgs[todo[0]].threads))
                    i = todo.pop(0)
                    pool[-1].send(i, {"cfg": cfgs[i].to_dict(), "resume": resume, "progress": progress,
                                      "prepare_data": False, "context": context})
                if not busy():
                    break
                ready, _, _ = select.select([w.result_r for w in busy()], [], [])
            except KeyboardInterrupt:  # SIGINT, or SIGTERM (on_term): every run stops at its next step boundary
                stopped = stopped or (received[-1] if received else signal.SIGINT)
                for w in busy():
                    w.proc.send_signal(signal.SIGTERM)
                continue
            for w in busy():
                if w.result_r not in ready:
                    continue
                out = w.receive()
                if out is None:
                    continue
                if out == "died":
                    i = w.index
                    w.close()
                    pool.remove(w)
                    if stopped is None:
                        results[i] = _failure(cfgs[i], RuntimeError(f"its process died (exit code {w.proc.returncode})"))
                    continue
                i = w.index_done
                if out["kind"] == "done":
                    results[i] = out["result"]
                elif out["kind"] == "interrupted":
                    stopped = stopped or out["signum"]
                    results[i] = out["result"]
                else:
                    error = error or out
    finally:
        for w in busy():  # only when this loop itself failed: stop the runs at a boundary
            w.proc.send_signal(signal.SIGTERM)
        for w in pool:
            w.close()  # the worker sees its job pipe close and exits
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    if error is not None:
        raise _error_from_child(error) from RuntimeError(f"in a sweep run:\n{error['traceback']}")
    if stopped is not None:
        finished = sum(r is not None and not str(r.get("status", "")).startswith("interrupted") for r in results)
        raise Interrupted(stopped, f"sweep interrupted: {finished} of {len(cfgs)} runs finished, the others stopped "
                          "at a checkpoint or did not start; sweep again to resume", results=results)
    return results


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


# What the user can fix: the message says how. Anything else is a bug, reported as one too.
_USER_ERRORS = (RunError, ValueError, TypeError, OSError, ImportError, MemoryError)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m manifold_muon_lab.train", description=__doc__.split("\n\n")[0],
                                 epilog="Errors are one sentence (exit code 2); --debug shows the traceback. "
                                        "SIGINT/SIGTERM stop at the next step with a checkpoint (exit 130/143).")
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
    try:  # a bad preset or override is a usage error: say what is wrong, no traceback
        overrides = parse_overrides(args.overrides)
        if args.assignment is not None:
            overrides["assignment"] = args.assignment
        cfg = load_preset(args.preset, args.preset_dir, **overrides)
        if args.out_dir is not None:
            cfg.out_dir = args.out_dir
        if cfg.out_dir is None:
            tag = cfg.assignment if isinstance(cfg.assignment, str) else "custom"
            cfg.out_dir = str(Path("runs") / "_train" / Path(args.preset).stem / tag)
        validate(cfg, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    except (ValueError, TypeError, FileNotFoundError) as e:
        if args.debug:
            raise
        print(f"{ap.prog}: error: {_one_line(e)}", file=sys.stderr, flush=True)
        sys.exit(2)
    try:
        summary = train(cfg, resume=not args.no_resume, progress=not args.no_progress,
                        prepare_data=True if args.prepare_data else None, memory_check=not args.no_memory_check)
    except Interrupted as e:
        print(f"{ap.prog}: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 - every error ends in one sentence
        if args.debug:
            raise
        if isinstance(e, torch.OutOfMemoryError):
            msg = (f"out of memory on the GPU ({_one_line(e).split('. ')[0]}); lower batch_size or block_size, "
                   "or raise gradient_accumulation_steps")
        elif isinstance(e, _USER_ERRORS):
            msg = _one_line(e)
        else:
            msg = (f"unexpected {type(e).__name__}: {_one_line(e)} (this is a bug or an unhandled case: run again "
                   "with --debug for the traceback and report it)")
        print(f"{ap.prog}: error: {msg}", file=sys.stderr, flush=True)
        sys.exit(2 if isinstance(e, (*_USER_ERRORS, torch.OutOfMemoryError)) else 1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(jsonable(summary)))
    return summary


if __name__ == "__main__":
    main()
