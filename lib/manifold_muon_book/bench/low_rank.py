"""DGram's Newton trackers on a stream of rank-4 momenta (chapter 04, ``tests/test_lean_step.py``).

A low-rank momentum makes Z = G + 2 W Lambda have a few large singular values and many small ones, and a Newton step
on the multiplier fills directions that N = Z^T Z had near null. ``low_rank_gaps`` steps one DGram weight along such
a stream (fresh rank-4 momenta, no momentum averaging, so the directions stay rank 4) with the two-eigendecomposition
tracker (``"newton"``), the option ``"newton_dk"`` and the option's first version (``step_budget.first_version``: the
first-order candidate expanded about N's eigenvalues instead of diag(V^T N1 V)), and returns each one's median
certified gap over the stream after its first four steps. Seconds on one CPU thread.

    python -m manifold_muon_book.bench.low_rank      # prints the medians at 64 x 16 and 16 x 64
"""

from __future__ import annotations

import contextlib
import statistics

import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.optim import ManifoldMuon

TRACKERS = ("newton", "newton_dk", "first_version")


def rank_r_momentum(shape, g, r: int = 4, decay: float = 1.3) -> torch.Tensor:
    """A rank-``r`` momentum of ``shape``: random orthonormal singular vectors, singular values i^-decay."""
    m, n = shape
    U = torch.linalg.qr(torch.randn(m, r, generator=g, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(n, r, generator=g, dtype=torch.float64))[0]
    s = torch.arange(1, r + 1, dtype=torch.float64).pow(-decay)
    return ((U * s) @ V.mT).float()


def low_rank_gaps(shape, steps: int = 24, seed: int = 13, rank: int = 4, skip: int = 4) -> dict:
    """Median certified gap of each of ``TRACKERS`` over ``steps`` fresh rank-``rank`` momenta on one DGram weight of
    ``shape`` (lr 0.02, no momentum), the first ``skip`` steps left out."""
    from .step_budget import first_version

    if min(shape) < 2 or rank < 1 or steps <= skip:
        raise ValueError(f"low_rank_gaps: need a shape with both sides >= 2, rank >= 1 and steps > skip, got "
                         f"shape={shape!r}, rank={rank!r}, steps={steps!r}, skip={skip!r}")
    g = torch.Generator().manual_seed(seed)
    W0 = get_manifold("dgram").random_point(shape, generator=g)
    grads = [rank_r_momentum(shape, g, rank) for _ in range(steps)]
    out = {}
    for name in TRACKERS:
        W = torch.nn.Parameter(W0.clone())
        opt = ManifoldMuon([W], lr=0.02, momentum=0.0, nesterov=False, manifold="dgram", inner="lean",
                           tracker="newton_dk" if name == "newton_dk" else "newton")  # (the swap: tracker "newton")
        gaps = []
        with first_version() if name == "first_version" else contextlib.nullcontext():
            for G in grads:
                W.grad = G.clone()
                opt.step()
                gaps.append(float(opt.state[W]["duality_gap"]))
        out[name] = statistics.median(gaps[skip:])
    return out


if __name__ == "__main__":
    for shape in ((64, 16), (16, 64)):
        print(shape, {k: round(v, 3) for k, v in low_rank_gaps(shape).items()})
