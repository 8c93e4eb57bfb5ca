"""Sweeps: independent training runs, ``workers`` at a time.

    from manifold_muon_lab.sweep import sweep
    results = sweep([cfg_a, cfg_b, cfg_c], workers=2)               # two processes at a time
    results = sweep(cfgs, workers=4, optimizers={"muon": NoisyMuon})  # every "muon" rule builds a NoisyMuon

What fails how. Every config is checked (``train.preflight``, its memory estimate for ``workers`` runs at
once) before the first run starts, so a typo in the fifth does not cost the first four. A diverged run is
recorded as such. A run that fails for a reason the user can fix (``RUN_FAILURES``: ``RunError``,
``FloatingPointError``, torch's out-of-memory), or whose process dies, is recorded as
``{"status": "failed: ..."}`` and the others go on. Any other exception is a bug (a ``TypeError``, a torch
``RuntimeError``...): its traceback is printed at once, no further run starts, and once the runs in flight
have ended the sweep raises it (a worker's exception carries the worker's traceback as its cause).

Processes. With ``workers=1`` the runs go one after the other in this process. With k > 1 each of k workers
is a ``concurrent.futures.ProcessPoolExecutor`` of one process started by ``spawn`` (a fresh interpreter, one
torch thread unless the config sets ``threads``), which trains one run after another. One executor per
worker, not one pool of k: a process that dies breaks its executor, and a broken pool terminates all its
processes, which would lose every run in flight instead of the one.

Spawn and ``__main__``: a spawned process imports the parent's ``__main__`` again when it is a file
(``python script.py``, ``python -m module``), as ``__mp_main__``: everything but the code under
``if __name__ == "__main__":`` runs again. A parallel sweep called outside that guard in such a file would
start itself anew in every worker; it is refused (``RunError``) before any run starts. From ``python -c``, a
notebook (Jupyter, papermill) or the interactive interpreter nothing is re-imported. The ``optimizers``
classes reach a worker by reference (module and name): a class defined in a notebook or ``__main__`` is
refused for k > 1.

Signals. Workers ignore SIGINT (a terminal's Ctrl-C reaches the whole process group): on SIGINT or SIGTERM
the sweep sends SIGTERM to every run in flight, which stops at its next step boundary with a checkpoint, starts
no further run and raises ``Interrupted`` (``results``: what finished); sweeping again resumes. A second
signal sends a second SIGTERM: the runs stop at once.
"""

from __future__ import annotations

import ast
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import torch

from .config import RunError, TrainConfig
from .data import Batches
from .train import Interrupted, _device, _train_checked, check_optimizer_classes, preflight

__all__ = ["sweep", "RUN_FAILURES"]

# How a run may fail without stopping a sweep: recorded as "failed: ...", the next run starts.
RUN_FAILURES = (RunError, FloatingPointError, torch.OutOfMemoryError)


def sweep(cfgs, resume: bool = True, progress: bool = True, workers: int | None = 1,
          optimizers: dict | None = None) -> list[dict]:
    """Train independent configs, ``workers`` at a time (None: one per available core); returns their
    summaries in the order of ``cfgs`` (see the module's docstring for failures, processes and signals).
    ``optimizers`` ({registry name: optimizer class}, as ``train``'s) is used by every run of the sweep."""
    cfgs = [TrainConfig.from_dict(c) if isinstance(c, dict) else c for c in cfgs]
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers={workers!r} must be a positive int (or None: one per core)")
    workers = min(workers, max(1, len(cfgs)))
    optimizers = check_optimizer_classes(optimizers)
    if workers > 1:
        _check_spawnable(optimizers)
    for c in cfgs:  # every config is checked before the first run starts
        preflight(c, device="cuda:0" if c.device != "cpu" and torch.cuda.is_available() else "cpu",
                  concurrent=workers, optimizers=optimizers)
    if workers == 1:
        return _sequential(cfgs, resume, progress, optimizers)
    return _parallel(cfgs, resume, progress, workers, optimizers)


def _failure(cfg: TrainConfig, e: BaseException) -> dict:
    """The record of a run that failed (the sweep goes on). ``train`` itself wrote it to status.json if the
    run had started; a run refused before (a locked out_dir, another config's checkpoint) leaves that folder alone."""
    return {"status": f"failed: {type(e).__name__}: {e}", "out_dir": cfg.out_dir}


class _Tally:
    """One line per finished run, whatever ``progress`` says (that switch is for the per-step lines): which
    run, how it ended, and an estimate of the time left, so that a sweep inside a notebook is something to watch."""

    def __init__(self, total: int, workers: int):
        self.total, self.workers, self.done, self.t0 = total, workers, 0, time.perf_counter()

    def __call__(self, cfg, result: dict | None) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.t0
        left = elapsed / self.done * (self.total - self.done)
        status = str((result or {}).get("status", "?"))
        loss = (result or {}).get("last_loss")
        what = status + (f", last loss {loss:.4g}" if isinstance(loss, float) else "")
        print(f"[sweep] {self.done} of {self.total} runs done ({_short(cfg.out_dir)}: {what}); "
              f"{elapsed / 60:.1f} min so far, about {left / 60:.1f} min left", flush=True)


def _short(out_dir) -> str:
    """The last three parts of a run's folder (study / assignment / seed), enough to tell runs apart."""
    parts = Path(str(out_dir)).parts
    return "/".join(parts[-3:]) if parts else str(out_dir)


def _sequential(cfgs: list, resume: bool, progress: bool, optimizers: dict) -> list[dict]:
    results, tally = [], _Tally(len(cfgs), 1)
    for c in cfgs:
        try:
            results.append(_train_checked(c, resume, progress, None, optimizers, device=_device(c, 0)))
        except RUN_FAILURES as e:
            results.append(_failure(c, e))
        except Interrupted as e:
            e.results = results
            raise
        tally(c, results[-1])
    return results


# ----------------------------------------------------------------------------- worker processes

def _init_worker(threads: int | None, pid) -> None:
    """In a fresh worker: SIGINT ignored (the sweep forwards SIGTERM), one torch thread unless ``threads``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not threads:
        os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        torch.set_num_threads(1)
    pid.value = os.getpid()


def _run_job(cfg: dict, resume: bool, progress: bool, optimizers: dict) -> tuple[str, dict, int | None]:
    """One run in a worker: ("done", summary or failure record, None) or ("interrupted", summary, signum).
    Any other exception (a bug) reaches the sweep with this process's traceback."""
    cfg = TrainConfig.from_dict(cfg)
    torch.set_num_threads(cfg.threads or 1)
    try:  # the data were prepared by the sweep, or refused by preflight
        return "done", _train_checked(cfg, resume, progress, False, optimizers, device=_device(cfg, 0)), None
    except Interrupted as e:
        return "interrupted", e.summary, e.signum
    except RUN_FAILURES as e:
        return "done", _failure(cfg, e), None


class _Worker:
    """One worker: a one-process executor (spawn), the pid of its process once it has started, its run."""

    def __init__(self, context, threads: int | None):
        self.pid = context.RawValue("i", 0)
        self.pool = ProcessPoolExecutor(1, mp_context=context, initializer=_init_worker, initargs=(threads, self.pid))
        self.index, self.future, self.signalled = None, None, False

    def submit(self, index: int, *args) -> None:
        self.index, self.signalled = index, False
        self.future = self.pool.submit(_run_job, *args)

    def terminate_run(self) -> None:
        """SIGTERM to the run in flight: it stops at its next step boundary (a second one: at once)."""
        if self.future is not None and self.pid.value:
            try:
                os.kill(self.pid.value, signal.SIGTERM)
                self.signalled = True
            except ProcessLookupError:
                pass


def _parallel(cfgs: list, resume: bool, progress: bool, workers: int, optimizers: dict) -> list[dict]:
    for c in cfgs:  # prepare each data set once, here, not in k processes at the same time
        if c.data != "synthetic" and c.data_dir is None:
            Batches(c.data, c.block_size, "cpu", None, c.vocab_size, progress=progress)
    context = multiprocessing.get_context("spawn")
    results: list = [None] * len(cfgs)
    todo, pool = list(range(len(cfgs))), []
    bug, stopped, received = None, None, []
    tally = _Tally(len(cfgs), workers)

    def on_term(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt

    def busy() -> list:
        return [w for w in pool if w.future is not None]

    def start(w: _Worker) -> None:
        i = todo.pop(0)
        w.submit(i, cfgs[i].to_dict(), resume, progress, optimizers)

    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    try:
        while True:
            try:
                if bug is None and stopped is None:
                    for w in pool:  # hand out runs to idle workers, starting workers as needed
                        if w.future is None and todo:
                            start(w)
                    while todo and len(pool) < workers:
                        pool.append(_Worker(context, cfgs[todo[0]].threads))
                        start(pool[-1])
                if not busy():
                    break
                wait([w.future for w in busy()], timeout=None if stopped is None else 0.2, return_when=FIRST_COMPLETED)
            except KeyboardInterrupt:  # SIGINT, or SIGTERM (on_term): every run stops at its next step boundary
                stopped = stopped or (received[-1] if received else signal.SIGINT)
                for w in busy():
                    w.terminate_run()
                continue
            for w in busy():
                if stopped is not None and not w.signalled:  # a worker that had not started when the signal came
                    w.terminate_run()
                if not w.future.done():
                    continue
                i, future = w.index, w.future
                w.index = w.future = None
                try:
                    kind, result, signum = future.result()
                except BrokenProcessPool as e:  # its process died: the run failed, the others go on
                    w.pool.shutdown(wait=True)
                    pool.remove(w)
                    if stopped is None:
                        why = f" ({e.__cause__})".replace("\n", " ") if e.__cause__ else ""
                        results[i] = _failure(cfgs[i], RunError(f"its process died{why}"))
                    continue
                except Exception as e:  # noqa: BLE001 - a bug: raised once the runs in flight end
                    print(f"[sweep] run {cfgs[i].out_dir} raised {type(e).__name__}, a bug, not a run failure; no "
                          "further run starts, the sweep raises it once the runs in flight end:", file=sys.stderr)
                    traceback.print_exception(e, file=sys.stderr)
                    bug = bug or e
                    continue
                results[i] = result
                if kind == "interrupted":
                    stopped = stopped or signum
                elif stopped is None:
                    tally(cfgs[i], result)
    finally:
        for w in busy():  # only when this loop itself failed: stop the runs at a boundary
            w.terminate_run()
        for w in pool:
            w.pool.shutdown(wait=True)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    if bug is not None:
        raise bug
    if stopped is not None:
        finished = sum(r is not None and not str(r.get("status", "")).startswith("interrupted") for r in results)
        raise Interrupted(stopped, f"sweep interrupted: {finished} of {len(cfgs)} runs finished, the others stopped "
                          "at a checkpoint or did not start; sweep again to resume", results=results)
    return results


# ----------------------------------------------------------------------------- what spawn needs

def _check_spawnable(optimizers: dict) -> None:
    """Refuse, before any run, what a spawned worker could not do: import an ``optimizers`` class, or import
    the caller's ``__main__`` file without starting this sweep again."""
    for name, cls in optimizers.items():
        found = None
        if cls.__module__ != "__main__" and "<locals>" not in cls.__qualname__:
            try:
                found = importlib.import_module(cls.__module__)
                for part in cls.__qualname__.split("."):
                    found = getattr(found, part)
            except (ImportError, AttributeError):
                found = None
        if found is not cls:
            raise ValueError(f"optimizers[{name!r}]={cls.__module__}.{cls.__qualname__} cannot be imported by a worker "
                             "process (defined in a notebook, __main__ or a function); define it in a module, or "
                             "use workers=1")
    script = _unguarded_call_site()
    if script:
        raise RunError(f"sweep(workers>1) is called in {script} outside `if __name__ == \"__main__\":`; every "
                       "worker process (spawned) imports that file again and would start the sweep anew: put the "
                       "call under that guard, or use workers=1")


def _unguarded_call_site() -> str | None:
    """``file:line`` when this call comes from the top level of the ``__main__`` file outside its
    ``if __name__ == "__main__":`` block (code a spawned process runs again), else None."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if not path or spec_name == "__main__" or spec_name.endswith(".__main__"):  # what spawn skips
        return None
    path = os.path.realpath(path)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and os.path.realpath(frame.f_code.co_filename) == path:
            break
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_guard(node.test) and node.lineno <= line <= node.end_lineno:
            return None
    return f"{path}:{line}"


def _is_main_guard(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))
