"""A prototype, not the library's step (issue 19, item 4): square Stiefel's msign(S) by matrix products alone.

The lean step's closed form on square Stiefel (``square_stiefel_step``) takes B = msign(S), S = 2 skew(W^T G), from
one float64 eigendecomposition of S^T S. PyTorch reads every eigendecomposition's LAPACK / cuSOLVER status on the
host (``manifold_muon.opcount``), so on a GPU that step waits for the device once per weight shape, and the
issue asks for one wait per optimizer step at most. A path with no eigendecomposition has no such read:

* ``matmul_msign``: the Polar Express (``manifold_muon.msign.polar_express_coefficients``: ``steps`` minimax
  quintics in float32, tuned for singular values in [``l0``, 1] after Frobenius scaling), then ``polish`` cubic
  Newton-Schulz steps X <- 1.5 X - 0.5 X X^T X in float64, then the skew part (tangent by construction). Three
  n x n products per quintic, two per polish; no decomposition, no host read.
* ``eigh_msign``: the closed form's own B (one float64 eigendecomposition, its vectors paired, the numerical range
  s > 1e-6 s_max: ``manifold_muon.optim.manifold_muon.skew_msign``).

``measure`` takes S from the benchmark's stationary stream (``solver_table.steady_stream``, its last momentum, the
start point of ``solver_table``) and reports, per configuration: the relative duality gap against S's nuclear norm,
with B scaled into the unit ball (both from a float64 SVD: a measurement, not a certificate the step could afford),
how far ||B||_op is above 1, the relative distance to the eigendecomposition's B, the operations (``OpCounter``) and
the share of that distance in the directions whose singular values are below ``l0`` of the largest
(``difference_in_small``, with their number), the time against ``eigh_msign`` in interleaved rounds (one CPU thread, or the GPU where there is one: the comparison
this prototype is for; ``runs/gpu_check.sh`` runs it). What it leaves out: a certificate without a decomposition
(the lean step records a certified gap) and the retraction (B^T B is a projector only up to the iteration's error,
so the closed form's exact retraction would become a series in lr^2 B^T B, as on rectangular Stiefel).

    python -m manifold_muon_book.bench.sync_free_msign            # 128 x 128 and 768 x 768, runs/bench/
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from manifold_muon.msign import polar_express_coefficients
from manifold_muon.opcount import OpCounter
from manifold_muon.optim.manifold_muon import skew_msign
from .common import device, interleaved, one_cpu_thread, ratio_summary, square_shapes, write_result

# (Polar Express steps in float32, its l0, float64 polishes)
CONFIGS = ((5, 1e-3, 0), (5, 1e-3, 1), (8, 1e-4, 1), (10, 1e-5, 0), (10, 1e-5, 1))
SHAPES = ((128, 128), (768, 768))
QUICK_SHAPES = ((24, 24), (25, 25))


def matmul_msign(S: torch.Tensor, steps: int, l0: float, polish: int) -> torch.Tensor:
    """msign of the skew ``S`` (n x n) by ``steps`` float32 Polar Express quintics and ``polish`` float64 cubic
    Newton-Schulz steps; the skew part of the result, in float64."""
    X = S.float()
    X = X / (torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True) * 1.01).clamp_min(1e-30)
    for a, b, c in polar_express_coefficients(steps, l0):
        A = X @ X.mT
        X = a * X + (b * A + c * (A @ A)) @ X
    X = X.double()
    for _ in range(polish):
        X = 1.5 * X - 0.5 * X @ (X.mT @ X)
    return 0.5 * (X - X.mT)


def eigh_msign(S: torch.Tensor) -> torch.Tensor:
    """The closed form's B on the numerical range s > 1e-6 s_max, as ``square_stiefel_step`` reads it off one
    float64 eigendecomposition (``manifold_muon.optim.manifold_muon.skew_msign``)."""
    return skew_msign(S)[0]


def skew_momentum(shape, seed: int = 0, steps: int = 64) -> torch.Tensor:
    """S = W^T G - G^T W (float64 from float32 products, as the step forms it) at ``solver_table``'s start point and
    the last momentum of its stationary stream."""
    from . import solver_table

    W = solver_table.start_point(shape, "stiefel", seed).float()
    G = solver_table.steady_stream(shape, steps, seed + 2)[-1].float()
    K = W.mT @ G
    return (K - K.mT).double()


def _ops(fn, S) -> dict:
    with OpCounter(big=S.size(-1)) as ops:
        fn(S)
    return dict(ops.counts)


def _paired_ratio(fast, base, rounds: int) -> dict:
    """``fast``'s time over ``base``'s in interleaved rounds (``common.interleaved``) after one warm-up call of each."""
    fast(), base()
    t_fast, t_base = interleaved(lambda i: fast(), lambda i: base(), rounds, cuda=device().type == "cuda")
    return dict(**ratio_summary(t_fast, t_base), rounds=rounds, seconds=statistics.median(t_fast),
                eigh_seconds=statistics.median(t_base))


def measure(shape, configs=CONFIGS, rounds: int = 7, seed: int = 0) -> list[dict]:
    S = skew_momentum(shape, seed).to(device())
    _, s, Vh = torch.linalg.svd(S.cpu())
    nuc = float(s.sum())
    B_eigh = eigh_msign(S)
    rows = [dict(shape=list(shape), path="eigh", ops=_ops(eigh_msign, S), smallest_singular_value=float(s[-1] / s[0]))]
    rows[0].update(_judge(S, B_eigh, B_eigh, nuc))
    for steps, l0, polish in configs:
        fn = lambda X, k=steps, lo=l0, p=polish: matmul_msign(X, k, lo, p)  # noqa: E731
        B = fn(S)
        # where B differs from the eigendecomposition's: the share of the difference (squared) in the directions of
        # S whose singular values are below l0 of the largest
        small = s < l0 * s[0]
        D = (B - B_eigh).cpu() @ Vh.mT
        share = float(D[:, small].pow(2).sum() / D.pow(2).sum().clamp_min(1e-300))
        row = dict(shape=list(shape), path="matmul", steps=steps, l0=l0, polish=polish, ops=_ops(fn, S),
                   small_directions=int(small.sum()), difference_in_small=share,
                   **_judge(S, B, B_eigh, nuc), **_paired_ratio(lambda: fn(S), lambda: eigh_msign(S), rounds))
        rows.append(row)
    return rows


def _judge(S, B, B_eigh, nuc: float) -> dict:
    op = float(torch.linalg.matrix_norm(B.cpu(), ord=2))
    value = float((S * B).sum()) / max(op, 1.0)
    return dict(gap=(nuc - value) / nuc, op_excess=op - 1.0,
                from_eigh=float(torch.linalg.vector_norm(B - B_eigh) / torch.linalg.vector_norm(B_eigh)))


def main(out_dir: Path, quick: bool = False, shapes=None, configs=CONFIGS, rounds: int | None = None,
         name: str = "sync_free_msign") -> dict:
    """Writes ``out_dir/<name>.json`` (``runs/gpu_check.sh`` names its GPU run ``sync_free_msign_gpu``)."""
    shapes = square_shapes(shapes, QUICK_SHAPES if quick else SHAPES, "sync_free_msign")
    rounds = rounds or (3 if quick else 7)
    t0 = time.perf_counter()
    with one_cpu_thread():
        rows = [r for s in shapes for r in measure(s, configs, rounds)]
    for r in rows:
        ops = r["ops"]
        what = "eigh closed form" if r["path"] == "eigh" else f"PE{r['steps']} (l0 {r['l0']:g}) + {r['polish']} polish"
        timing = "" if r["path"] == "eigh" else f"  {r['ratio']:.2f}x the eigh path's time"
        print(f"{str(tuple(r['shape'])):11s} {what:28s} gap {r['gap']:8.1e}  ||B||-1 {r['op_excess']:8.1e}  "
              f"from eigh {r['from_eigh']:.1e}  [{ops.get('matmul_full', 0)} products, {ops.get('eigh', 0)} eigh, "
              f"{ops.get('sync', 0)} sync]{timing}", flush=True)
    params = dict(shapes=[list(s) for s in shapes], configs=[list(c) for c in configs], rounds=rounds, quick=quick)
    return write_result(out_dir, name, dict(rows=rows), params, time.perf_counter() - t0)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench"))
