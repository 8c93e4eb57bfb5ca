"""A prototype, not the library's step (issue 19): would a Newton step on the dual, tracked across optimizer steps,
make the lean step accurate enough? ``python -m manifold_muon_book.bench.lean_newton 384x128 stiefel 24`` prints
e_W at lr 0.02 after a stream of ``steps`` training-like momenta (``momenta.rotating_stream``: a fixed
i^-1.3 spectrum whose singular vectors turn at correlation 0.95 a step), against a certified reference
(``exact_solve``, gap <= 1e-7 asked), as a multiple of Muon's own e_W, for:

* ``newton-cg<k>``: per optimizer step one eigendecomposition of N = Z^T Z at the carried multiplier (it gives the
  gradient, the Hessian's eigenbasis and the first candidate), ``k`` conjugate-gradient steps of the Newton system
  (``_newton_direction`` below: five n x n products each), the step taken with a per-matrix damping t,
  and the certificate at the new multiplier (the second eigendecomposition). Without a host synchronisation:
  the better of the two candidates is kept by ``torch.where``; t doubles (to 1) where the dual value fell and
  halves where it rose, and a rise keeps the old multiplier.
* ``lean (ADMM-1)``: the library's lean solve (``inner_solvers.lean_solve``), the same stream.
* ``lean_cold``: the lean solve with no iteration and no warm start (the tangent projection's msign, scaled into
  the unit ball) on the last momentum: what ``solver_table`` calls ``lean_cold``.

Measured on this 2-core machine (2026-12-03, 384 x 128, 24 steps of the stationary stream; Muon's e_W 0.35% on
Stiefel and Oblique, 0.26% on DGram): newton-cg3/5/10 gave 1.85/1.94/1.73x Muon's e_W on Stiefel and
2.64/2.01/1.73x on DGram, against 3.20x / 3.35x for ADMM-1 (and 1.87x / 3.6x for the cold zero-iteration step);
on Oblique every newton-cg<k> reached the certified optimum (e_W below 1e-5, gap 0.000) where ADMM-1 settles at
1.46x. Its price, timed under load (one thread, best of 3): newton-cg3 4.9x a Muon fp32 step at 768 x 2304
Oblique against 3.0x for ADMM-1, 7.3x against 4.7x at 384 x 128. A Newton step from the cold start instead of
the carried multiplier does not move at all (the full step raises the dual and is rejected). So: on Oblique
(n multipliers, a diagonal constraint) tracking by Newton is exact for about 1.6x the lean step's price; on
Stiefel and DGram no k tried clears the 2/3-of-Muon bar. An earlier measurement on the chain of ``correlated``
mixtures (whose spectrum flattens; chapter 04) had cg5 at 0.65x on Stiefel: that stream was easier.

At GPT-2 small's shapes (2026-12-03, same stream): on Oblique 768 x 2304 newton-cg3 again reached the optimum
(e_W below 1e-5; ADMM-1 0.35x Muon's 1.47%). On rectangular Stiefel the cold zero-iteration step (``lean_cold``)
gives e_W 0.66% at 768 x 2304, 768 x 3072 and 3072 x 768, 0.45x Muon's 1.47% and inside the 2/3 bar, where the
tracked lean step settles at 1.15-1.19% (chapter 04); on DGram 768 x 2304 it gives 1.10%, 0.99x Muon's 1.11%
(tracked: 0.85x). So the per-manifold default these measurements argue for is cold on rectangular Stiefel and
tracked on Oblique (by ADMM as now, or by Newton at about 1.6x the price for the exact answer).

Since 2026-12-04 the library has the tracker (``inner_solvers.newton_track``, ``ManifoldMuon(tracker="newton")``,
DGram's lean default) with two changes measured against this prototype on the same stream: a Jacobi
preconditioner (the diagonal of the Hessian's first term, 2 P(D x N^{-1/2} + N^{-1/2} x D)), with which one CG
step settled at 0.54-0.61x Muon's e_W on GPT-2 small's three rectangular DGram shapes (cg3 here: 0.60-0.62x; at
384 x 1536, 0.56x against 0.76x unpreconditioned), and CG in float32 (four n x n products a step), the
eigendecomposition kept in float64 (in float32: 0.69x at 768 x 2304, and on a fixed gradient the gap stalls at
~3e-4). Two variants with one eigendecomposition a step did worse: the direction certified at the carried
multiplier with an undamped Newton step for the next one diverged (gap 1.0 within eight steps at 384 x 1536),
and a certificate at the new multiplier read in the old eigenbasis (a Peierls bound on the dual, a Ritz
candidate) settled at 0.64x at 768 x 2304 with its gap still falling after 64 steps.

Later on 2026-12-04 the library's tracker on Stiefel took its CG step in N's eigenbasis, preconditioned by the exact
inverse of the Hessian's first term (diagonal there because W^T W = I and Stiefel's projector is the identity):
along the benchmark's stream it settles at 0.21-0.37x Muon's e_W at GPT-2 small's rectangular Stiefel shapes and
0.61-1.04x at the CPU presets' widths (chapter 04, rows ``lean_newton`` of ``solver_table``), where the Jacobi one
stalled near a gap of 0.1 even on a fixed momentum. So on Stiefel a Newton step does clear the 2/3 bar where the
preconditioner fits the Hessian; what it costs is the second eigendecomposition.
"""

from __future__ import annotations

import sys

import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.msign import msign
from manifold_muon.optim.inner_solvers import (Span, _dk_denominator, _floored, _keep, _relative_gap, _sym,
                                               _tall_unit, certificate, exact_solve, feasible, gram_picture,
                                               inv_sqrt, lean_solve, multiplier)
from .momenta import rotating_stream


def _newton_direction(pic, a, V, s, grad, cg_steps: int):
    """This prototype's Newton direction: approximately solve Hess f [x] = -grad by ``cg_steps`` unpreconditioned
    conjugate-gradient steps, five n x n products each in the weights' basis (all matrices of the batch together; a
    matrix whose residual is below 1e-12 of its gradient stops moving). The library's exact mode used it before its
    preconditioned CG; it was moved here from ``inner_solvers`` unchanged on 2026-12-06, as nothing else calls it."""
    P = pic.P
    sc = _floored(s)
    L = 1.0 / _dk_denominator(sc)
    Nih = (V / sc.unsqueeze(-2)) @ V.mT
    Da = pic.dmul(a)
    DaV = Da @ V

    def hvp(x):
        da = 2 * x
        X = DaV.mT @ (da @ V)
        dNih = V @ (-(X + X.mT) * L) @ V.mT
        return 2 * P(_sym(pic.dmul(da) @ Nih + Da @ dNih))

    x = torch.zeros_like(grad)
    r = -grad
    p = r
    rs = (r * r).sum((-2, -1))
    stop = 1e-24 * rs.clamp_min(torch.finfo(rs.dtype).tiny)  # alpha = 0 below this (x stays put)
    for _ in range(cg_steps):
        Ap = hvp(p)
        curv = (p * Ap).sum((-2, -1))
        alpha = torch.where((curv > 0) & (rs > stop), rs / curv.clamp_min(torch.finfo(rs.dtype).tiny), 0)
        x = x + alpha[..., None, None] * p
        r = r - alpha[..., None, None] * Ap
        rs_new = (r * r).sum((-2, -1))
        p = r + (rs_new / rs.clamp_min(torch.finfo(rs.dtype).tiny))[..., None, None] * p
        rs = rs_new
        if not bool((rs > stop * 1e12).any()):  # every residual below 1e-12 of its gradient's norm squared
            break
    return x


def newton_step(W, G, P, Lam, t, cg: int, diagonal: bool):
    """One tracked Newton step (see the module docstring): (A as an m x n matrix, the next multiplier, the
    certified gap, the next damping)."""
    Wt, Gt, wide = _tall_unit(W.float(), G.float(), True)
    pic = gram_picture(Wt, Gt, P, torch.float64, products=torch.float32 if diagonal else torch.float64,
                       diagonal=diagonal)
    if Lam is None:
        S = pic.DK0
        Lam = -0.5 * multiplier(pic, S + S.mT)
    a = pic.K0 + 2 * Lam
    lam, V = torch.linalg.eigh(_sym(a.mT @ pic.dmul(a) + pic.R))
    s = lam.clamp_min(0).sqrt()
    Y = (V * inv_sqrt(s, 1e-7).unsqueeze(-2)) @ V.mT
    f0 = s.sum(-1)
    t = torch.ones_like(f0) if t is None else t
    x = _newton_direction(pic, a, V, s, 2 * P(_sym(pic.dmul(a) @ Y)), cg)
    Lam1 = Lam + t[..., None, None] * x
    A1, v1, b1 = certificate(pic, Lam1, None, 1e-7, fast=True)
    A0, v0 = feasible(pic, Span(a @ Y, Y), fast=True)
    A, v = _keep(v1 >= v0, (A1, v1), (A0, v0))
    fell = b1 < f0
    Am = A.matrix(pic)
    return (Am.mT if wide else Am, torch.where(fell[..., None, None], Lam1, Lam),
            _relative_gap(v, torch.minimum(f0, b1)), torch.where(fell, (2 * t).clamp_max(1), 0.5 * t))


def main(shape=(384, 128), manifold: str = "stiefel", steps: int = 24, lr: float = 0.02, cgs=(3, 5, 10)) -> dict:
    torch.set_num_threads(1)
    M = get_manifold(manifold)
    P = M.gram_projector
    W0 = M.random_point(shape, generator=torch.Generator().manual_seed(1))
    grads = [g.float() for g in rotating_stream(shape, steps, generator=torch.Generator().manual_seed(0))]
    Wd, G = W0.double(), grads[-1].double()
    ref = exact_solve(Wd, G, P, tol=1e-7, newton_steps=40, fallback_steps=400)
    W_star = M.retract(Wd - lr * ref.matrix())
    exact = msign(G, "svd")
    muon = float(lr * (msign(grads[-1], "newton_schulz", 5, torch.float32).double() - exact).norm()
                 / (Wd - lr * exact).norm())
    e_W = lambda A: float((M.retract(Wd - lr * A.double()) - W_star).norm() / W_star.norm())  # noqa: E731
    out = {}
    for cg in cgs:
        Lam = t = None
        for Gi in grads:
            A, Lam, gap, t = newton_step(W0, Gi, P, Lam, t, cg, M.diagonal_gram)
        out[f"newton-cg{cg}"] = (e_W(A), float(gap))
    warm = None
    for Gi in grads:
        sol = lean_solve(W0, Gi, P, warm=warm, steps=1, diagonal=M.diagonal_gram)
        warm = (sol.Lambda, sol.U)
    out["lean (ADMM-1)"] = (e_W(sol.matrix()), float(sol.gap))
    cold = lean_solve(W0, grads[-1], P, warm=None, steps=0, diagonal=M.diagonal_gram)  # no iteration, no warm start
    out["lean_cold"] = (e_W(cold.matrix()), float(cold.gap))
    print(f"{shape} {manifold}, {steps} stream steps, reference gap {float(ref.gap.max()):.0e}, Muon's e_W "
          f"{100 * muon:.3f}%")
    for name, (e, gap) in out.items():
        print(f"  {name:14s} e_W {100 * e:.3f}% ({e / muon:.2f}x Muon's), certified gap {gap:.3f}")
    return {"muon_e_W": muon, **{k: v[0] for k, v in out.items()}}


def _cli(args: list[str]) -> dict:
    """``[MxN [manifold [steps]]]``, checked before any work starts."""
    usage = "usage: python -m manifold_muon_book.bench.lean_newton [MxN [manifold [steps]]], e.g. 384x128 stiefel 24"
    shape = args[0].lower().split("x") if args else ["384", "128"]
    if len(shape) != 2 or not all(x.isdigit() and int(x) > 0 for x in shape):
        raise SystemExit(f"lean_newton: the shape must be two positive integers joined by x, got {args[0]!r}\n{usage}")
    if len(args) > 2 and not (args[2].isdigit() and int(args[2]) > 0):
        raise SystemExit(f"lean_newton: steps must be a positive integer, got {args[2]!r}\n{usage}")
    if len(args) > 3:
        raise SystemExit(f"lean_newton: at most three arguments\n{usage}")
    return main(tuple(int(x) for x in shape), *(args[1:2] or ["stiefel"]), *([int(args[2])] if len(args) > 2 else []))


if __name__ == "__main__":
    _cli(sys.argv[1:])
