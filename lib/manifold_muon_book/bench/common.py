"""What every benchmark shares: the device, one-thread timing on CPU, the matrix shapes, and the
writing of ``<out_dir>/<name>.json`` with provenance."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from manifold_muon_lab.provenance import provenance, write_json_atomic

GPT2_SHAPES = [(768, 768), (768, 2304), (768, 3072), (3072, 768)]
CPU_SHAPES = [(128, 128), (128, 512), (512, 128)]
QUICK_SHAPES = [(32, 32), (32, 96)]


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextlib.contextmanager
def one_cpu_thread():
    """On CPU, time with one thread: on a shared machine more threads than free cores make timings
    meaningless (spin-waiting threads). The thread count is recorded in the provenance."""
    old = torch.get_num_threads()
    if device().type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def time_call(fn, repeats: int) -> float:
    """Fastest wall time of fn() in seconds over ``repeats`` calls, after one warm-up call (the minimum is the
    estimate least disturbed by other processes on a shared machine)."""
    fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)


def write_result(out_dir, name: str, payload: dict, params: dict, wall_time_s: float) -> dict:
    """``payload`` + provenance (with ``params`` and the device) + wall time, written to ``out_dir/name.json``."""
    result = dict(**payload, **provenance({**params, "device": str(device())}), wall_time_s=round(wall_time_s, 3))
    write_json_atomic(Path(out_dir) / f"{name}.json", result)
    return result


def per_shape(name: str, measure, out_dir, quick: bool, params: dict, repeats: int = 5) -> tuple[dict, list]:
    """The benchmarks that time one thing per matrix shape: ``measure(shape, repeats)`` -> rows, over the
    quick or the full shapes, on one CPU thread; written to ``out_dir/name.json``. Returns (result, rows)."""
    shapes = QUICK_SHAPES if quick else CPU_SHAPES + GPT2_SHAPES
    with one_cpu_thread():
        t0 = time.perf_counter()
        rows = [r for s in shapes for r in measure(s, repeats)]
        seconds = time.perf_counter() - t0
    result = write_result(out_dir, name, dict(rows=rows), dict(shapes=shapes, repeats=repeats, quick=quick, **params), seconds)
    return result, rows
