"""The inner problem of Manifold Muon, generalised to a Gram-space projector P.

For a tall W (m >= n) on the manifold and a gradient (momentum) G, find the steepest tangent direction

    A* = argmax <G, A>  subject to  ||A||_op <= 1,  P(W^T A + A^T W) = 0.          (primal)

For symmetric Lambda = P(Lambda) and any tangent A, <2 W Lambda, A> = <Lambda, P(W^T A + A^T W)> = 0,
so <G, A> = <G + 2 W Lambda, A> <= ||G + 2 W Lambda||_* (the nuclear norm), with equality at
A = msign(G + 2 W Lambda). Hence the dual

    min_Lambda f(Lambda) = ||G + 2 W Lambda||_*,   Lambda = P(Lambda) symmetric,           (dual)

whose (sub)gradient is H = P(W^T A + A^T W) with A = msign(G + 2 W Lambda): the tangent violation
of the current candidate. Bernstein's "dual ascent" is gradient descent on f (ascent on -f):
Lambda <- Lambda - alpha_t H. Both solvers below work on that dual.

Conventions shared by the solvers:
* W, G are (batches of) matrices; a wide W is handled by transposing both (the transposition rule),
  and Lambda is then n x n with n = min(m, n).
* G is rescaled to unit RMS first: A* does not change under G -> c G (c > 0), and it makes alpha and
  rho mean the same thing for any gradient scale (the post tuned alpha = 0.1 on Gaussian G, RMS 1).
  A returned Lambda is in these rescaled units.
* ``msign_fn`` computes msign; pass an SVD-based one for reference solutions.
"""

from __future__ import annotations

import functools

import torch

from ..manifolds.gram import gram_multiplier
from ..msign import msign

__all__ = ["dual_ascent", "admm", "svt", "exact_solution", "tangent_init", "rms"]


def rms(X: torch.Tensor) -> torch.Tensor:
    """Root-mean-square of each matrix in a batch."""
    return X.pow(2).mean(dim=(-2, -1)).sqrt()


def _tall_unit(W, G):
    wide = W.size(-2) < W.size(-1)
    if wide:
        W, G = W.mT, G.mT
    scale = rms(G).clamp_min(torch.finfo(G.dtype).tiny)[..., None, None]
    return W, G / scale, wide


def tangent_init(W, G, P):
    """Lambda0 with G + 2 W Lambda0 = the orthogonal tangent projection of G (tall W, on the manifold).

    For Stiefel this is Bernstein's -(W^T G + G^T W) / 4."""
    return -0.5 * gram_multiplier(W, W.mT @ G + G.mT @ W, P)


def dual_ascent(W, G, P, steps=20, alpha=0.1, schedule="linear", tol=None, Lambda0=None, msign_fn=msign):
    """Bernstein's dual ascent with Gram projector P. Returns (A, Lambda, history of ||H||_RMS).

    alpha_t = alpha (1 - t/T) ('linear', Bernstein's) or alpha ('constant'). A matrix whose ||H||_RMS
    drops below ``tol`` stops moving (its Lambda is frozen); the loop ends when all have.
    Lambda0 defaults to ``tangent_init`` (so step 0 is msign of the projected gradient).
    """
    W, G, wide = _tall_unit(W, G)
    Lambda = tangent_init(W, G, P) if Lambda0 is None else Lambda0.to(W.dtype)
    history = []
    for t in range(steps):
        A = msign_fn(G + 2 * W @ Lambda)
        H = P(W.mT @ A + A.mT @ W)
        history.append(rms(H))
        moving = torch.ones_like(history[-1]) if tol is None else (history[-1] >= tol).to(W.dtype)
        if tol is not None and not moving.any():
            break
        alpha_t = alpha * (1 - t / steps) if schedule == "linear" else alpha
        Lambda = Lambda - alpha_t * moving[..., None, None] * H
    A = msign_fn(G + 2 * W @ Lambda)
    return (A.mT if wide else A), Lambda, history


def svt(Z, tau, msign_fn=msign):
    """Singular value soft-thresholding U (Sigma - tau)_+ V^T of a tall Z, with two msigns and no SVD.

    Z - tau msign(Z) = U (Sigma - tau) V^T; msign of the symmetric Z^T Z - tau^2 I is V sign(Sigma^2 - tau^2) V^T,
    so (I + that)/2 projects onto the right singular vectors with sigma > tau.
    """
    eye = torch.eye(Z.size(-1), dtype=Z.dtype, device=Z.device)
    keep = 0.5 * (eye + msign_fn(Z.mT @ Z - tau**2 * eye))
    return (Z - tau * msign_fn(Z)) @ keep


def admm(W, G, P, steps=10, rho=None, tol=None, Lambda0=None, msign_fn=msign, svt_fn=None):
    """Buchanan's ADMM on the dual, generalised to P. Returns (A, Lambda, history).

    Split f as ||X||_* subject to X = G + 2 W Lambda, scaled multiplier U, penalty rho:
        Lambda <- argmin ||G + 2 W Lambda - X + U||_F^2   (a least-squares solve: gram_multiplier)
        X      <- svt(G + 2 W Lambda + U, 1/rho)
        U      <- U + G + 2 W Lambda - X
    The Lambda step solves P(M Lambda + Lambda M) = P(sym(W^T R)), R = X - G - U, M = W^T W; it is
    exact when W is on a Stiefel, DGram or Oblique manifold (see ``gram_multiplier``) and only
    approximate for a W off its manifold, or for a projector P whose P(M Lambda + Lambda M) depends on
    off-diagonal entries of M that are not zero (no such P among ours).
    rho U is a subgradient of ||X||_* (op-norm <= 1) and tangent up to the dual residual; history
    records ||P(W^T rho U + rho U^T W)||_RMS, and ``tol`` stops on it. rho defaults to 1/sqrt(n)
    (n = the short side) for unit-RMS G. The returned A is msign(G + 2 W Lambda), as in dual ascent.
    """
    W, G, wide = _tall_unit(W, G)
    Lambda, _, history = _admm_iterations(W, G, P, steps, rho, tol, Lambda0, svt_fn or functools.partial(svt, msign_fn=msign_fn))
    A = msign_fn(G + 2 * W @ Lambda)
    return (A.mT if wide else A), Lambda, history


def _admm_iterations(W, G, P, steps, rho, tol, Lambda0, svt_fn):
    """The ADMM loop on tall W and unit-RMS G; returns (Lambda, rho U, history)."""
    rho = rho if rho is not None else W.size(-1) ** -0.5
    Lambda = tangent_init(W, G, P) if Lambda0 is None else Lambda0.to(W.dtype)
    X, U = G + 2 * W @ Lambda, torch.zeros_like(G)
    history = []
    for _ in range(steps):
        R = X - G - U
        Lambda = gram_multiplier(W, 0.5 * (W.mT @ R + R.mT @ W), P)
        X = svt_fn(G + 2 * W @ Lambda + U, 1 / rho)
        U = U + G + 2 * W @ Lambda - X
        history.append(rms(P(W.mT @ (rho * U) + (rho * U).mT @ W)))
        if tol is not None and bool((history[-1] < tol).all()):
            break
    return Lambda, rho * U, history


def _msign_exact(X):
    U, _, Vh = torch.linalg.svd(X, full_matrices=False)
    return U @ Vh


def _svt_exact(Z, tau):
    U, s, Vh = torch.linalg.svd(Z, full_matrices=False)
    return (U * (s - tau).clamp_min(0).unsqueeze(-2)) @ Vh


def exact_solution(W, G, P, steps=3000, rho=None, dtype=torch.float64):
    """Reference (A*, Lambda*, duality gap) in ``dtype`` (float64), for small problems (tests, benchmarks).

    ADMM with SVD-based thresholding. Two primal candidates, each projected onto the tangent space and
    shrunk to op-norm <= 1 (so primal feasible): msign(G + 2 W Lambda) (optimal when that matrix has
    full rank at the optimum) and the scaled multiplier rho U (a subgradient of the nuclear norm, right
    also when it is rank-deficient, e.g. square DGram); the better one A_feas is kept, and
    gap = ||G + 2 W Lambda||_* - <G, A_feas> >= 0 bounds both sub-optimalities (in unit-RMS G units).
    The caller should check the returned gap.
    """
    Wt, Gt, wide = _tall_unit(W.to(dtype), G.to(dtype))
    Lambda, rhoU, _ = _admm_iterations(Wt, Gt, P, steps, rho, None, None, _svt_exact)
    Z = Gt + 2 * Wt @ Lambda
    best, best_value = None, None
    for A in (rhoU, _msign_exact(Z)):  # two primal candidates; keep the better one per matrix
        A = A - Wt @ gram_multiplier(Wt, Wt.mT @ A + A.mT @ Wt, P)  # tangent projection
        A = A / torch.linalg.matrix_norm(A, ord=2).clamp_min(1.0)[..., None, None]  # into the unit op-ball
        value = (Gt * A).sum(dim=(-2, -1))
        if best is None:
            best, best_value = A, value
        else:
            better = value > best_value
            best, best_value = torch.where(better[..., None, None], A, best), torch.maximum(value, best_value)
    gap = torch.linalg.svdvals(Z).sum(-1) - best_value
    return (best.mT if wide else best), Lambda, gap
