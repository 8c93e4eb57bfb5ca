"""The lean step under ``torch.compile`` against Muon under it too (issue 19: the step's cost; what compiling buys).

The lean step (``ManifoldMuon(inner="lean")``) traces as one graph up to the step's one host read
(``tests/test_optim_conformance.py::test_lean_step_traces_to_one_graph``), so ``torch.compile(opt.step)`` fuses its
elementwise work, which on the table's width-128 weights is a large part of the eager step (at 384 x 128 DGram,
torch.profiler, 2026-12-05: about 300 small operations besides two float64 eigendecompositions and 26 products).
Does that close the gap to issue 19's ratios? The ratio is against Muon, whose step compiles too, so both are timed both ways. Four arms per
weight, each its own optimizer on its own copy of the table's start point (``solver_table.start_point``), stepped at
lr 0 on the table's stationary timing stream (``solver_table.timing_stream``; the solver's carried state follows
the stream): the lean step eager and compiled, Muon fp32 (``solver_table.muon_fp32``) eager and compiled. Each round
times all four on the same momentum, in an order that rotates from round to round; ``warmup`` rounds (the compiles
among them: a first step without carried state and a tracked one trace separately) are not kept.

Per weight: each arm's median time; the ratios lean / Muon eager (the table's protocol), compiled lean / eager
Muon, and compiled lean / compiled Muon (like for like), each the median of the rounds' ratios with quartiles; the
seconds the warm-up rounds took (mostly compiling); and, as a check that the compiled step is the same solve, how
far apart the two lean arms' weights land after one step at lr 0.02 from their states at the end of the stream,
relative to the step's own size (``step_rel_diff``). A benchmark: it measures and
reports, it asserts nothing about speed. On one CPU thread (or the GPU, where there is one: ``runs/gpu_check.sh``).

    python -m manifold_muon_book.bench.compiled_step       # the table's width-128 misses, into runs/bench/compiled_step.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from manifold_muon.optim import ManifoldMuon
from .common import device, one_cpu_thread, ratio_summary, write_result

# the table's weights whose lean step misses issue 19's ratio (runs/bench/solver_table.json, 2026-12-05)
WEIGHTS = (((128, 128), "stiefel"), ((128, 128), "dgram"), ((128, 512), "dgram"), ((512, 128), "dgram"),
           ((384, 128), "dgram"))
QUICK_WEIGHTS = (((24, 8), "dgram"),)
ARMS = ("lean", "lean_compiled", "muon", "muon_compiled")


def _arms(shape, manifold: str, backend: str):
    from .solver_table import at_lr0, muon_fp32, start_point

    W0 = start_point(shape, manifold).float().to(device())
    lean = lambda p: ManifoldMuon(p, momentum=0.0, nesterov=False, manifold=manifold, inner="lean")  # noqa: E731
    arms = {}
    for name in ARMS:
        W, opt = at_lr0(lean if name.startswith("lean") else muon_fp32, W0)
        arms[name] = (W, opt, torch.compile(opt.step, backend=backend) if name.endswith("compiled") else opt.step)
    return arms


def measure(shape, manifold: str, rounds: int, warmup: int = 4, seed: int = 0, backend: str = "inductor") -> dict:
    from .solver_table import timing_stream

    torch._dynamo.reset()  # each weight compiles from nothing: its warm-up time is its own
    arms = _arms(shape, manifold, backend)
    grads = timing_stream(shape, seed, warmup + rounds + 1)  # the last one for the check below
    cuda = device().type == "cuda"
    times = {name: [] for name in ARMS}
    t0 = time.perf_counter()
    warm_s = None
    for i, G in enumerate(grads[:-1]):
        if i == warmup:
            warm_s = time.perf_counter() - t0
        order = ARMS[i % 4:] + ARMS[:i % 4]
        for name in order:
            W, _, step = arms[name]
            W.grad = G.clone()
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            if i >= warmup:
                times[name].append(time.perf_counter() - t)
    # the check: one step at lr 0.02 of both lean arms from their states, on the stream's next momentum
    G = grads[-1]
    new = []
    for name in ("lean", "lean_compiled"):
        W, opt, step = arms[name]
        W0 = W.detach().clone()
        opt.param_groups[0]["lr"] = 0.02
        W.grad = G.clone()
        step()
        new.append((W.detach().double(), W0.double()))
    (W_e, W0), (W_c, _) = new
    diff = float((W_c - W_e).norm() / (W_e - W0).norm().clamp_min(1e-300))

    def ratio(key, a, b):
        return {f"{key}{k[5:]}": v for k, v in ratio_summary(times[a], times[b]).items()}

    return dict(shape=list(shape), manifold=manifold, rounds=rounds, warmup_s=warm_s,
                **{f"{name}_s": statistics.median(times[name]) for name in ARMS},
                **ratio("ratio_eager", "lean", "muon"), **ratio("ratio_compiled_vs_eager", "lean_compiled", "muon"),
                **ratio("ratio_compiled", "lean_compiled", "muon_compiled"), step_rel_diff=diff)


def main(out_dir: Path, quick: bool = False, weights=None, rounds: int | None = None,
         name: str = "compiled_step", backend: str = "inductor") -> dict:
    """``weights``: ((m, n), manifold) pairs (default ``WEIGHTS``), refused before any work unless each names a
    Gram manifold and m, n >= 2. ``backend``: torch.compile's ("inductor", the default and the one that fuses;
    "eager" traces only, for the tests)."""
    from .solver_table import MANIFOLDS

    weights = [(tuple(s), m) for s, m in (weights or (QUICK_WEIGHTS if quick else WEIGHTS))]
    bad = [(s, m) for s, m in weights if len(s) != 2 or min(s) < 2 or m not in MANIFOLDS]
    if bad:
        raise ValueError(f"compiled_step: weights are ((m, n), manifold) with m, n >= 2 and a manifold of "
                         f"{', '.join(MANIFOLDS)}; got {bad}")
    rounds = rounds or (3 if quick else 30)
    t0 = time.perf_counter()
    with one_cpu_thread():
        rows = []
        for s, m in weights:
            r = measure(s, m, rounds, backend=backend)
            rows.append(r)
            print(f"{str(s):12s} {m:8s} lean {r['ratio_eager']:.2f}x Muon eager; compiled: "
                  f"{r['ratio_compiled_vs_eager']:.2f}x eager Muon, {r['ratio_compiled']:.2f}x compiled Muon "
                  f"(quartiles {r['ratio_compiled_q1']:.2f}-{r['ratio_compiled_q3']:.2f}); warm-up "
                  f"{r['warmup_s']:.0f} s; steps apart {r['step_rel_diff']:.1e}", flush=True)
    params = dict(weights=[[list(s), m] for s, m in weights], rounds=rounds, quick=quick, backend=backend,
                  torch_compile_mode="default")
    return write_result(out_dir, name, dict(rows=rows), params, time.perf_counter() - t0)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench"))
