"""Inner solvers of Manifold Muon: time to a retracted weight within 1% of the converged one.

The post's measure (its Section 3): with eta = 0.1, e_W(T) = ||R(W - eta A_T) - R(W - eta A_ref)||_F /
||R(W - eta A_ref)||_F, where A_T is a solver's direction after T iterations, A_ref the converged one and R
the manifold's retraction. Random (W, G): W a random point of the manifold, G Gaussian (as in the post).

A_ref: ``exact_solution`` in float32 (ADMM with exact SVD thresholding; its multiplier, projected on the
tangent space: right also where msign(G + 2 W Lambda) is not, e.g. square DGram); its duality gap, relative
to the dual value, is recorded (ref_gap_rel).
Solvers (see SOLVERS: each with its msign, float32):
* dual_ascent_post: Bernstein's init Lambda0 = -P(W^T G + G^T W)/4, alpha = 0.1, linear decay, Newton-Schulz
                    msign (the post's setup); _pe8 the same with an 8-step Polar Express msign
* dual_ascent_pe*:  init at the tangent projection (``tangent_init``; equal to the post's on Stiefel);
                    T = 0 is the one-msign solver A = msign(tangent projection of G)
* dual_ascent_warm: started from the Lambda of the previous optimizer step's problem, simulated as G_prev
                    with correlation 0.95 to G (Muon momentum 0.95) and W unchanged
* admm:             Buchanan's ADMM, rho = 1/sqrt(n)
For each solver: e_W and wall time for each T; the fastest T reaching e_W <= 1% and the fastest reaching
e_W <= e_W of the post's 20-step dual ascent, as a time ratio to that 20-step run. Measures only.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.msign import msign
from manifold_muon.optim.inner_solvers import admm, dual_ascent, exact_solution, rms
from manifold_muon_lab.provenance import Stopwatch
from .common import CPU_SHAPES, GPT2_SHAPES, QUICK_SHAPES, device, one_cpu_thread, time_call, write_result

ETA = 0.1
# solver -> (msign method, msign steps, inner step counts T to try)
SOLVERS = {
    "dual_ascent_post": ("newton_schulz", 5, [5, 10, 20]),
    "dual_ascent_post_pe8": ("polar_express", 8, [5, 10, 20]),
    "dual_ascent_pe5": ("polar_express", 5, [0, 1, 2, 5]),
    "dual_ascent_pe8": ("polar_express", 8, [0, 1, 2, 5, 10]),
    "dual_ascent_warm_pe8": ("polar_express", 8, [0, 1, 2]),
    "admm_pe8": ("polar_express", 8, [1, 2, 3, 5]),
}


def measure(shape, name, seed=0, ref_steps=100, repeats=3, self_ref_steps=0):
    g = torch.Generator().manual_seed(seed)
    M = get_manifold(name)
    P = M.gram_projector
    W = M.random_point(shape, generator=g).to(device())
    G = torch.randn(shape, generator=g).to(device())
    G_prev = 0.95 * G + (1 - 0.95**2) ** 0.5 * torch.randn(shape, generator=g).to(device())
    A_ref, _, gap = exact_solution(W, G, P, steps=ref_steps, dtype=torch.float32)
    W_ref = M.retract(W - ETA * A_ref)
    wide = W.size(-2) < W.size(-1)
    Wt, Gt = (W.mT, G.mT) if wide else (W, G)
    Gn = Gt / rms(Gt)
    post_init = -0.25 * P(Wt.mT @ Gn + Gn.mT @ Wt)  # Bernstein's initial Lambda, with P
    Lambda_prev = dual_ascent(W, G_prev, P, steps=20, msign_fn=functools.partial(msign, method="polar_express", steps=8))[1]

    def solver_fn(solver, T):
        method, k, _ = SOLVERS[solver]
        ms = functools.partial(msign, method=method, steps=k, dtype=torch.float32)
        if solver.startswith("admm"):
            return admm(W, G, P, steps=T, msign_fn=ms)[0]
        init = post_init if solver.startswith("dual_ascent_post") else Lambda_prev if "warm" in solver else None
        return dual_ascent(W, G, P, steps=T, alpha=0.1, Lambda0=init, msign_fn=ms)[0]

    def e_W(A, W_ref=W_ref):
        return ((M.retract(W - ETA * A) - W_ref).norm() / W_ref.norm()).item()

    rows = []
    solver_fn("dual_ascent_pe8", 1)  # warm-up
    for solver, (method, k, steps) in SOLVERS.items():
        for T in steps:
            with Stopwatch() as sw:
                A = solver_fn(solver, T)
            seconds = sw.seconds if repeats <= 1 else time_call(lambda: solver_fn(solver, T), repeats)
            rows.append(dict(shape=list(shape), manifold=name, solver=solver, msign=f"{method}/{k}", steps=T,
                             e_W=e_W(A), e_A=((A - A_ref).norm() / A_ref.norm()).item(), seconds=seconds))
    base = next(r for r in rows if r["solver"] == "dual_ascent_post" and r["steps"] == 20)
    value = (G / rms(G) * A_ref).sum()  # <G, A_ref> in the solvers' unit-RMS units
    summary = dict(shape=list(shape), manifold=name, ref_gap_rel=(gap / (value + gap)).item(), post20_e_W=base["e_W"],
                   post20_seconds=base["seconds"])
    if self_ref_steps:  # the post's own measure: reference = the same solver (same msign) run longer
        A_self = solver_fn("dual_ascent_post", self_ref_steps)
        W_self = M.retract(W - ETA * A_self)
        summary["post_self_reference"] = dict(ref_steps=self_ref_steps, e_W={
            T: e_W(solver_fn("dual_ascent_post", T), W_self) for T in (5, 20)})
    for solver in SOLVERS:
        mine = [r for r in rows if r["solver"] == solver]
        for key, level in (("within_1pct", 0.01), ("at_post20_error", base["e_W"])):
            ok = [r for r in mine if r["e_W"] <= level]
            best = min(ok, key=lambda r: r["seconds"]) if ok else None
            summary[f"{solver}_{key}"] = None if best is None else dict(
                steps=best["steps"], e_W=best["e_W"], seconds=best["seconds"],
                speedup_vs_post20=base["seconds"] / best["seconds"])
    return rows, summary


def main(out_dir: Path, quick: bool = False) -> dict:
    shapes = QUICK_SHAPES if quick else CPU_SHAPES + GPT2_SHAPES
    with one_cpu_thread(), Stopwatch() as sw:
        rows, summaries = [], []
        for shape in shapes:
            for name in ("stiefel", "dgram"):
                big = shape[0] * shape[1] > 768 * 768
                r, s = measure(shape, name, ref_steps=30 if quick else 60, repeats=3 if quick else (1 if big else 3),
                               self_ref_steps=0 if big else 100)
                rows += r
                summaries.append(s)
                best = max((v["speedup_vs_post20"], k) for k, v in s.items()
                           if k.endswith("_at_post20_error") and isinstance(v, dict))
                print(f"{str(tuple(shape)):>12} {name:>8} post20 e_W {s['post20_e_W']:.4f} ({s['post20_seconds']:.3f}s)"
                      f"  best at equal e_W: {best[1].removesuffix('_at_post20_error')} x{best[0]:.1f}"
                      f"  (ref rel. gap {s['ref_gap_rel']:.1e})", flush=True)
    return write_result(out_dir, "inner_solvers", dict(rows=rows, summaries=summaries),
                        dict(shapes=shapes, eta=ETA, solvers=SOLVERS, quick=quick), sw.seconds)
