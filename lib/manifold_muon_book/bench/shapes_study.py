"""The post's dual-ascent studies (its Tables 1 and 2) on one recorded weight and momentum: the work of
``runs/dual_ascent_shapes.md`` for one shape, as a function of plain data, so that the run can give each
shape its own process (``study_shapes(..., workers=k)``).

Every shape is independent of the others and each process runs torch on one thread, so the numbers do
not depend on ``workers``: the run gives the same metrics with one process or four.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.optim.inner_solvers import Span, dual_ascent, gram_solve, rms, tangent_init
from manifold_muon.optim.manifold_muon import post_msign

CONFIGS = {"post (raw G, alpha 0.1)": (0.1, False), "alpha 0.1 on unit-RMS G": (0.1, True)}


def _final_violation(p: dict, alpha: float, T: int):
    P = get_manifold(p["manifold"]).gram_projector
    _, _, hist = dual_ascent(p["W"], p["G"], P, steps=T, alpha=alpha, msign_fn=post_msign)
    return float(hist[-1]), [float(h) for h in hist]


def step_size_sweep(p: dict, alphas, max_widen: int, T: int) -> dict:
    """The post's Table 1 on one problem: final tangent violation after ``T`` steps over a grid of ``alpha``
    (unit-RMS units), widened by sqrt(10) at the end where the best lies, up to ``max_widen`` times, until
    the best is interior; and the post's literal ``alpha = 0.1`` on the raw momentum."""
    grid = sorted(float(a) for a in alphas)
    results = {}
    for _ in range(int(max_widen) + 1):
        for a in grid:
            if a not in results:
                results[a] = _final_violation(p, a, T)
        best = min(results, key=lambda a: results[a][0])
        grid = sorted(results)
        if best == grid[0]:
            grid = [grid[0] / math.sqrt(10)] + grid
        elif best == grid[-1]:
            grid = grid + [grid[-1] * math.sqrt(10)]
        else:
            break
    alphas = sorted(results)
    best = min(results, key=lambda a: results[a][0])
    post_alpha = 0.1 / float(rms(p["G"]))
    post_final, post_hist = _final_violation(p, post_alpha, T)
    return dict(alphas=alphas, final=[results[a][0] for a in alphas], best_alpha=best,
                best_interior=alphas[0] < best < alphas[-1], best_final=results[best][0],
                post_alpha_unit=post_alpha, post_final=post_final,
                histories={f"{a:.4g}": results[a][1] for a in alphas}, post_history=post_hist)


def post_snapshots(p: dict, alpha: float, normalize: bool, snapshots, T_ref: int) -> dict:
    """The post's loop (its linear schedule over ``T_ref`` steps), keeping ``A_T = msign(G + 2 W Lambda_T)``
    at the ``snapshots`` and at ``T_ref``."""
    W, G = p["W"], p["G"]
    P = get_manifold(p["manifold"]).gram_projector
    wide = W.size(0) < W.size(1)
    Wt, Gt = (W.mT, G.mT) if wide else (W, G)
    if normalize:
        Gt = Gt / rms(Gt)
    Lambda = tangent_init(Wt, Gt, P)
    out = {}
    for s in range(T_ref + 1):
        A = post_msign(Gt + 2 * Wt @ Lambda)
        if s in snapshots or s == T_ref:
            out[s] = A.mT if wide else A
        if s == T_ref:
            break
        H = P(Wt.mT @ A + A.mT @ Wt)
        Lambda = Lambda - alpha * (1 - s / T_ref) * H
    return out


def early_stopping(p: dict, snapshots, T_ref: int, lrs, ref_steps: int, ref_tol: float) -> dict:
    """The post's Table 2 on one problem: ``e_A`` and ``e_W`` of the snapshots against the post's reference
    ``A_{T_ref}`` and against a certified float64 solution, for both ``CONFIGS``, at each learning rate; and
    the library's default solve (warm-started from the recorded step before, as in training) beside them."""
    t0 = time.perf_counter()
    M = get_manifold(p["manifold"])
    P = M.gram_projector
    W, G = p["W"], p["G"]
    W64 = W.double()
    prev = gram_solve(p["W_prev"], p["G_prev"], P)
    default = gram_solve(W, G, P, warm=(prev.Lambda, prev.U))
    ref = gram_solve(W64, G.double(), P, steps=int(ref_steps), tol=float(ref_tol),
                     warm=(default.Lambda.double(), Span(default.U.a.double(), default.U.b.double())))
    A_star = ref.matrix()
    W_star = {lr: M.retract(W64 - lr * A_star) for lr in lrs}     # the certified retracted weight, once per lr

    def rel(X, Y):
        return float((X - Y).norm() / Y.norm())

    rows = []
    for label, (alpha, normalize) in CONFIGS.items():
        snaps = post_snapshots(p, alpha, normalize, snapshots, T_ref)
        A_post_ref = snaps[T_ref].double()
        W_post_ref = {lr: M.retract(W64 - lr * A_post_ref) for lr in lrs}
        for t in snapshots:
            A = snaps[t].double()
            row = dict(config=label, T=t, e_A_vs_post_ref=rel(A, A_post_ref), e_A_vs_certified=rel(A, A_star))
            for lr in lrs:
                W_T = M.retract(W64 - lr * A)
                row[f"e_W_vs_post_ref_lr{lr}"] = rel(W_T, W_post_ref[lr])
                row[f"e_W_vs_certified_lr{lr}"] = rel(W_T, W_star[lr])
            rows.append(row)
    A_def = default.matrix().double()
    drow = dict(config="library default", T=int(default.iterations), gap=float(default.gap),
                e_A_vs_certified=rel(A_def, A_star))
    for lr in lrs:
        drow[f"e_W_vs_certified_lr{lr}"] = rel(M.retract(W64 - lr * A_def), W_star[lr])
    rows.append(drow)
    return dict(rows=rows, ref_gap=float(ref.gap), ref_iterations=int(ref.iterations),
                seconds=time.perf_counter() - t0)


def study_shape(p: dict, preset: dict) -> dict:
    """Both studies on one problem ``p`` (``W``, ``G``, ``W_prev``, ``G_prev``, ``manifold``) with the run's
    ``preset``; torch on one thread."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    sweep = step_size_sweep(p, preset["alphas"], int(preset["max_widen"]), int(preset["T"]))
    retraction = early_stopping(p, sorted(int(t) for t in preset["snapshots"]), int(preset["T_ref"]),
                                [float(x) for x in preset["lrs"]], int(preset["ref_steps"]), float(preset["ref_tol"]))
    return dict(sweep=sweep, retraction=retraction, seconds=time.perf_counter() - t0, pid=os.getpid())


def study_shapes(problems: dict, preset: dict, workers: int = 1) -> dict:
    """``study_shape`` for every problem, ``workers`` processes at a time (largest first, so that the
    longest shapes start first); ``workers=1`` runs them in this process. Returns ``{role: result}`` in the
    order of ``problems``."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} must be a positive int")
    order = sorted(problems, key=lambda r: -problems[r]["W"].numel())
    if workers == 1:
        done = {role: study_shape(problems[role], preset) for role in order}
    else:
        with ProcessPoolExecutor(max_workers=min(workers, len(order)), mp_context=get_context("spawn")) as pool:
            futures = {role: pool.submit(study_shape, problems[role], preset) for role in order}
            done = {role: f.result() for role, f in futures.items()}
    return {role: done[role] for role in problems}
