"""Retraction cost: DGram variants against the Stiefel retraction, as time ratios in the same run.

X = W - 0.1 A for a random point W of each manifold and a random unit-op-norm direction A (what the
optimizer retracts). Variants:
* stiefel/polar_express  msign by Polar Express (8 steps) + one Newton-Schulz polish (the default)
* stiefel/svd            U V^T from an SVD
* dgram/msign            one msign (as Stiefel's) + column scaling by diag(Q^T X) (the default)
* dgram/svd_post         the post's U V^T diag(Sigma) (an SVD; not a retraction, see gram.DGram)
* gram_oblique           column normalisation
Also the residual after retraction, so that a fast-but-wrong variant shows. Measures only.
"""

from __future__ import annotations

from pathlib import Path

import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.msign import msign
from .common import device, per_shape, time_call

VARIANTS = {
    "stiefel/polar_express": ("stiefel", dict(msign="polar_express")),
    "stiefel/svd": ("stiefel", dict(msign="svd")),
    "dgram/msign": ("dgram", dict(retraction="msign", msign="polar_express")),
    "dgram/svd_post": ("dgram", dict(retraction="svd_post")),
    "gram_oblique": ("gram_oblique", dict()),
}


def measure(shape, repeats, seed=0):
    rows = []
    for variant, (name, kw) in VARIANTS.items():
        g = torch.Generator().manual_seed(seed)
        M = get_manifold(name, **kw)
        W = M.random_point(shape, generator=g).to(device())
        X = W - 0.1 * msign(torch.randn(shape, generator=g).to(device()), "svd")
        R = M.retract(X)
        rows.append(dict(shape=list(shape), variant=variant, seconds=time_call(lambda: M.retract(X), repeats),
                         residual=M.residual(R).item(), moved=((R - X).norm() / X.norm()).item()))
    base = next(r["seconds"] for r in rows if r["variant"] == "stiefel/polar_express")
    for r in rows:
        r["time_ratio_to_stiefel"] = r["seconds"] / base
    return rows


def main(out_dir: Path, quick: bool = False) -> dict:
    result, rows = per_shape("retractions", measure, out_dir, quick, dict(variants=list(VARIANTS)))
    for r in rows:
        print(f"{str(tuple(r['shape'])):>12} {r['variant']:>22}  time/stiefel {r['time_ratio_to_stiefel']:.2f}"
              f"  residual {r['residual']:.1e}")
    return result
