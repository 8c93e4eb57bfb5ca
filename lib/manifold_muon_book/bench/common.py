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


def square_shapes(shapes, default, who: str) -> list[tuple]:
    """``shapes`` (or ``default``) as tuples, refused before any work unless each is square of side >= 2 (the
    benchmarks of square Stiefel's closed form)."""
    shapes = [tuple(s) for s in (shapes or default)]
    bad = [s for s in shapes if len(s) != 2 or s[0] != s[1] or s[0] < 2]
    if bad:
        raise ValueError(f"{who}: square shapes of side >= 2 only (square Stiefel's closed form), got {bad}")
    return shapes


def interleaved(first, second, rounds: int, warmup: int = 0, min_rounds: int | None = None, budget_s: float = 0.0,
                cuda: bool = False, prepare=None) -> tuple[list, list]:
    """Wall times of ``first(i)`` and ``second(i)`` in interleaved rounds i = 0, 1, ...: ``first`` runs first in
    even rounds and ``second`` in odd ones (a slowdown shared by both calls of a round cancels in their ratio);
    ``warmup`` rounds are not kept, then rounds until ``min_rounds`` (default: all) are kept and ``budget_s``
    seconds spent, at most ``rounds``. ``prepare``: a pair of callables, the k-th called with i before the k-th
    call, untimed (e.g. setting a gradient). ``cuda``: synchronise the device before and after each timed call.
    Returns the kept times of each, in seconds."""
    min_rounds = rounds if min_rounds is None else min_rounds
    fns, kept, spent = (first, second), ([], []), 0.0
    for i in range(warmup + rounds):
        if i >= warmup and len(kept[0]) >= min_rounds and spent >= budget_s:
            break
        times = [0.0, 0.0]
        for k in ((0, 1) if i % 2 == 0 else (1, 0)):
            if prepare is not None:
                prepare[k](i)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fns[k](i)
            if cuda:
                torch.cuda.synchronize()
            times[k] = time.perf_counter() - t0
        if i >= warmup:
            for acc, t in zip(kept, times):
                acc.append(t)
            spent += sum(times)
    return kept


def ratio_summary(times, base_times) -> dict:
    """The median of the rounds' ratios ``times / base_times`` with its quartiles (``interleaved``'s rounds)."""
    import statistics

    ratios = [t / b for t, b in zip(times, base_times)]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return dict(ratio=statistics.median(ratios), ratio_q1=q[0], ratio_q3=q[2])


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
