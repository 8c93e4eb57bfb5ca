"""Where square Stiefel's closed form spends its time (issue 19, item 2: at most 1.5x a Muon step): each part of
the step timed against a whole Muon step (``solver_table.muon_fp32``: float32 Newton-Schulz 5, momentum 0) in
interleaved rounds (``common.interleaved``), on the table's start point and stationary stream
(``solver_table.start_point``, ``timing_stream``), one CPU thread. The parts, each timed alone:

* ``optimizer_step``: ``ManifoldMuon(inner="lean").step()`` on the weight, what ``solver_table`` times;
* ``closed_form``: the step's arithmetic alone (``_square_stiefel_paired``), without the optimizer's bookkeeping
  (momentum, the non-finite check, state), which Muon's step has too;
* ``eigh``: the float64 eigendecomposition of S^T S alone;
* ``products``: the closed form's matrix products alone, at its shapes and precisions (four n x n in the weights'
  float32: W^T G, W^T W, the factor F and W F; S^T S and the half-product S V_lo in float64).

From their medians, ``elementwise`` = closed_form - eigh - products (the rest of the closed form: its element-wise
operations and their dispatch), and ``floor`` = optimizer_step - elementwise: the ratio the step would have if all
of those were free. A benchmark: it measures and reports, it asserts nothing about speed.

    python -m manifold_muon_book.bench.square_cost      # 128 x 128 and 768 x 768, into runs/bench/square_cost.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from manifold_muon.optim import ManifoldMuon
from manifold_muon.optim.manifold_muon import _square_stiefel_paired
from .common import device, interleaved, one_cpu_thread, ratio_summary, square_shapes, write_result

SHAPES = ((128, 128), (768, 768))
QUICK_SHAPES = ((16, 16),)
PARTS = ("optimizer_step", "closed_form", "eigh", "products")


def _parts(W0: torch.Tensor, grads, lr: float) -> dict:
    """Per part, (the timed callable, its untimed preparation), each of the round index i (the momentum of round i
    where the part reads one)."""
    n = W0.size(-1)
    W = torch.nn.Parameter(W0.clone())
    opt = ManifoldMuon([W], lr=lr, momentum=0.0, nesterov=False, inner="lean")
    W32 = W0[None]
    S64 = []
    for G in grads:
        K = W32.mT @ G[None]
        S64.append((K - K.mT).double())
    A64 = [S.mT @ S for S in S64]
    V64 = torch.linalg.eigh(A64[0])[1]
    G32 = grads[0][None]

    def set_grad(i):  # untimed, as Muon's
        W.grad = grads[i].clone()

    def products(i):
        W32.mT @ G32, W32.mT @ W32, G32 @ W32.mT, W32 @ G32  # the four float32 ones
        S64[i].mT @ S64[i], S64[i] @ V64[..., n % 2::2]        # S^T S and the half-product, float64

    none = lambda i: None  # noqa: E731
    return dict(optimizer_step=(lambda i: opt.step(), set_grad),
                closed_form=(lambda i: _square_stiefel_paired(W32, grads[i][None], lr), none),
                eigh=(lambda i: torch.linalg.eigh(A64[i]), none), products=(products, none))


def measure(shape, rounds: int, warmup: int = 3, seed: int = 0, lr: float = 0.02) -> list[dict]:
    from . import solver_table

    W0 = solver_table.start_point(shape, "stiefel", seed).float().to(device())
    grads = solver_table.timing_stream(shape, seed, warmup + rounds)
    rows = []
    for part, (fn, prepare) in _parts(W0, grads, lr).items():
        Wm = torch.nn.Parameter(W0.clone())
        muon = solver_table.muon_fp32([Wm])
        muon.param_groups[0]["lr"] = 0.0

        def set_grad(i, Wm=Wm):
            Wm.grad = grads[i].clone()

        t_muon, t_part = interleaved(lambda i, muon=muon: muon.step(), fn, rounds, warmup=warmup,
                                     cuda=device().type == "cuda", prepare=(set_grad, prepare))
        rows.append(dict(shape=list(shape), part=part, **ratio_summary(t_part, t_muon), seconds=statistics.median(t_part),
                         muon_fp32_s=statistics.median(t_muon), rounds=rounds))
    ratio = {r["part"]: r["ratio"] for r in rows}
    rest = ratio["closed_form"] - ratio["eigh"] - ratio["products"]
    rows.append(dict(shape=list(shape), part="elementwise", ratio=rest, derived=True))
    rows.append(dict(shape=list(shape), part="floor", ratio=ratio["optimizer_step"] - rest, derived=True))
    return rows


def main(out_dir: Path, quick: bool = False, shapes=None, rounds: int | None = None,
         name: str = "square_cost") -> dict:
    shapes = square_shapes(shapes, QUICK_SHAPES if quick else SHAPES, "square_cost")
    rounds = rounds or (3 if quick else 41)
    t0 = time.perf_counter()
    with one_cpu_thread():
        rows = [r for s in shapes for r in measure(s, rounds)]
    for r in rows:
        spread = "" if r.get("derived") else f"  (quartiles {r['ratio_q1']:.2f}-{r['ratio_q3']:.2f})"
        print(f"{str(tuple(r['shape'])):11s} {r['part']:15s} {r['ratio']:5.2f}x a Muon step{spread}", flush=True)
    params = dict(shapes=[list(s) for s in shapes], rounds=rounds, quick=quick, parts=list(PARTS))
    return write_result(out_dir, name, dict(rows=rows), params, time.perf_counter() - t0)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench"))
