"""msign accuracy and speed: SVD vs Newton-Schulz vs Polar Express, float32 and bfloat16.

For Gaussian G of each shape: max_i |sigma_i(O) - 1| (how far from orthogonal), the relative distance
||O - msign_svd(G)||_F / ||msign_svd(G)||_F, and the time per call as a ratio to an float32 SVD-based
msign (U V^T from torch.linalg.svd) timed in the same run. Measures; asserts nothing about speed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from manifold_muon.msign import msign, msign_svd, singular_value_error
from .common import device, per_shape, time_call

def svd_msign_fp32(G):
    U, _, Vh = torch.linalg.svd(G.float(), full_matrices=False)
    return U @ Vh


def measure(shape, repeats: int, steps: int = 5, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(shape, generator=g).to(device())
    ref = msign_svd(G).double()
    t_svd = time_call(lambda: svd_msign_fp32(G), repeats)
    rows = [dict(shape=list(shape), method="svd", dtype="float32", steps=None, seconds=t_svd, time_ratio_to_svd=1.0,
                 sigma_error=singular_value_error(svd_msign_fp32(G)).item(), rel_dist_to_svd=0.0)]
    for method in ("newton_schulz", "polar_express"):
        for dtype in (torch.float32, torch.bfloat16):
            O = msign(G, method, steps=steps, dtype=dtype)
            t = time_call(lambda: msign(G, method, steps=steps, dtype=dtype), repeats)
            rows.append(dict(shape=list(shape), method=method, dtype=str(dtype).removeprefix("torch."), steps=steps,
                             seconds=t, time_ratio_to_svd=t / t_svd, sigma_error=singular_value_error(O).item(),
                             rel_dist_to_svd=((O.double() - ref).norm() / ref.norm()).item()))
    return rows


def main(out_dir: Path, quick: bool = False) -> dict:
    result, rows = per_shape("msign", measure, out_dir, quick, dict(steps=5))
    for r in rows:
        print(f"{str(tuple(r['shape'])):>12} {r['method']:>14} {r['dtype']:>9}  sigma_err {r['sigma_error']:.3f}  "
              f"dist {r['rel_dist_to_svd']:.3f}  time/svd {r['time_ratio_to_svd']:.2f}")
    return result
