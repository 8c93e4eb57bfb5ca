"""The Gram picture's solve D K0 = W^T G on Stiefel and DGram weights (issue 19: the step's cost), two ways timed
against each other in interleaved rounds (``common.interleaved``), one CPU thread (or the GPU, where there is one: ``runs/gpu_check.sh``), on the table's start point and
stationary stream (``solver_table.start_point``, ``timing_stream``), as ``gram_picture`` runs it in the lean step
(W^T W and W^T G in float32):

* ``cholesky``: ``inner_solvers._factored_solve``, the factorisation of D + ridge I and its two triangular solves,
  float64 (the only path until 2026-12-05, and still the path where D is not diagonal, Oblique);
* ``neumann``: ``inner_solvers._diagonal_solve``, the first two terms of the Neumann series about diag(D), one n x n
  product in float32 (the path where the caller says D is diagonal to rounding).

Per weight: the median time of each and the ratio neumann / cholesky with its quartiles; how far the two K0 lie
apart (relative, max-abs); and what the solve is for, C = G - W K0 normal to W's range, as ||W^T C|| / ||W^T G||
(max-abs) for each. A benchmark: it measures and reports, it asserts nothing about speed. Its effect on the whole
step is in the table's parts ``solver_table_diagonal_solve*`` (``solver_table.retime``).

    python -m manifold_muon_book.bench.diagonal_solve      # 512 x 128 and 2304 x 768, into runs/bench/diagonal_solve.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from manifold_muon.optim.inner_solvers import _diagonal_solve, _factored_solve, _sym, _tall_unit
from .common import device, interleaved, one_cpu_thread, ratio_summary, write_result

SHAPES = ((512, 128), (2304, 768))  # tall forms of the CPU presets' 128 x 512 and GPT-2 small's c_attn
QUICK_SHAPES = ((24, 8),)
MANIFOLDS = ("stiefel", "dgram")


def _systems(W, G):
    """(D, ridge, W^T G) as ``gram_picture`` forms them for a float32 (W, G)."""
    D = _sym(W.mT @ W)
    return D, torch.finfo(W.dtype).eps * D.diagonal(dim1=-2, dim2=-1).amax(-1).clamp_min(1e-30), W.mT @ G


def _max_rel(X, Y):
    return float((X - Y).abs().max() / Y.abs().max().clamp_min(torch.finfo(Y.dtype).tiny))


def measure(shape, manifold: str, rounds: int, warmup: int = 3, seed: int = 0) -> dict:
    from . import solver_table

    W0 = solver_table.start_point(shape, manifold, seed).float()[None].to(device())
    grads = solver_table.timing_stream(shape, seed, warmup + rounds)
    systems = []
    for G in grads:
        W, Gt, _ = _tall_unit(W0, G.float()[None].to(W0.device))
        systems.append((W, Gt, _systems(W, Gt)))
    t_chol, t_neu = interleaved(lambda i: _factored_solve(*systems[i][2]), lambda i: _diagonal_solve(*systems[i][2]),
                                rounds, warmup=warmup, cuda=W0.device.type == "cuda")
    W, Gt, (D, ridge, B) = systems[-1]
    K_chol, K_neu = _factored_solve(D, ridge, B), _diagonal_solve(D, ridge, B)
    residual = lambda K: float((W.mT @ (Gt - W @ K)).abs().max() / B.abs().max())  # noqa: E731
    return dict(shape=list(shape), manifold=manifold, **ratio_summary(t_neu, t_chol),
                neumann_s=statistics.median(t_neu), cholesky_s=statistics.median(t_chol), rounds=rounds,
                k0_rel_diff=_max_rel(K_neu, K_chol), residual_neumann=residual(K_neu), residual_cholesky=residual(K_chol))


def main(out_dir: Path, quick: bool = False, shapes=None, rounds: int | None = None,
         name: str = "diagonal_solve") -> dict:
    shapes = [tuple(s) for s in (shapes or (QUICK_SHAPES if quick else SHAPES))]
    bad = [s for s in shapes if len(s) != 2 or min(s) < 2]
    if bad:
        raise ValueError(f"diagonal_solve: shapes are (m, n) with m, n >= 2, got {bad}")
    rounds = rounds or (3 if quick else 21)
    t0 = time.perf_counter()
    with one_cpu_thread():
        rows = [measure(s, m, rounds) for s in shapes for m in MANIFOLDS]
    for r in rows:
        print(f"{str(tuple(r['shape'])):12s} {r['manifold']:8s} neumann {r['ratio']:.2f}x the Cholesky solve "
              f"(quartiles {r['ratio_q1']:.2f}-{r['ratio_q3']:.2f}); K0 apart {r['k0_rel_diff']:.1e}; "
              f"W^T C {r['residual_neumann']:.1e} vs {r['residual_cholesky']:.1e}", flush=True)
    params = dict(shapes=[list(s) for s in shapes], manifolds=list(MANIFOLDS), rounds=rounds, quick=quick)
    return write_result(out_dir, name, dict(rows=rows), params, time.perf_counter() - t0)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench"))
