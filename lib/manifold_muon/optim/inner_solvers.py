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
* G is rescaled to unit RMS first (``normalize=True``): A* does not change under G -> c G (c > 0), and
  it makes alpha and rho mean the same thing for any gradient scale (the post tuned alpha = 0.1 on
  Gaussian G, RMS 1). A returned Lambda is in these rescaled units. This is a departure from the post,
  which feeds the raw momentum (``normalize=False`` reproduces it; then alpha is in the units of G).
* ``msign_fn`` computes msign; pass an SVD-based one for reference solutions.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..manifolds.gram import gram_multiplier
from ..msign import msign

__all__ = ["dual_ascent", "admm", "svt", "exact_solution", "tangent_init", "rms", "GramPicture", "Span",
           "gram_picture", "certificate", "admm_gram", "GramSolve", "gram_solve", "span_of"]


def rms(X: torch.Tensor) -> torch.Tensor:
    """Root-mean-square of each matrix in a batch: its Frobenius norm over sqrt(m n), one pass over X (squaring first
    and averaging writes a temporary of X's size)."""
    return torch.linalg.vector_norm(X, dim=(-2, -1)) / math.sqrt(X.size(-2) * X.size(-1))


def _add_product(Y, A, B, alpha: float = 1.0):
    """Y + alpha A @ B, in one call where all three are 3-D (``torch.baddbmm``: the product is accumulated into Y's
    copy, no temporary of Y's size and no second pass over it); for other batch shapes (a split weight's blocks) a
    plain sum or difference, scaled only where alpha is not 1 or -1."""
    if Y.dim() == A.dim() == B.dim() == 3:
        return torch.baddbmm(Y, A, B, alpha=alpha)
    if alpha in (1, -1):
        return Y + A @ B if alpha == 1 else Y - A @ B
    return Y + alpha * (A @ B)


def _tall_unit(W, G, normalize=True, views: bool = False):
    """(W, G, wide): a wide pair transposed to tall, G rescaled to unit RMS unless ``normalize`` is False. By default
    as row-major copies (the m x n solvers' elementwise work mixes them with fresh products, and elementwise work
    across two layouts is several times slower, measured); ``views``: the transposes as views, no copy (the Gram
    picture, which keeps every m x n operation in the input's layout: ``gram_picture``, ``Span.matrix``)."""
    wide = W.size(-2) < W.size(-1)
    if wide:
        W, G = (W.mT, G.mT) if views else (W.mT.contiguous(), G.mT.contiguous())
    if not normalize:
        return W, G, wide
    scale = rms(G).clamp_min(torch.finfo(G.dtype).tiny)[..., None, None]
    return W, G / scale, wide


def tangent_init(W, G, P):
    """Lambda0 with G + 2 W Lambda0 = the orthogonal tangent projection of G (tall W, on the manifold).

    For Stiefel this is Bernstein's -(W^T G + G^T W) / 4."""
    return -0.5 * gram_multiplier(W, W.mT @ G + G.mT @ W, P)


def dual_ascent(W, G, P, steps=20, alpha=0.1, schedule="linear", tol=None, Lambda0=None, msign_fn=msign,
                normalize=True):
    """Bernstein's dual ascent with Gram projector P. Returns (A, Lambda, history of ||H||_RMS).

    alpha_t = alpha (1 - t/T) ('linear', Bernstein's) or alpha ('constant'). A matrix whose ||H||_RMS
    drops below ``tol`` stops moving (its Lambda is frozen); the loop ends when all have.
    Lambda0 defaults to ``tangent_init`` (so step 0 is msign of the projected gradient; on Stiefel it is
    Bernstein's -(W^T G + G^T W)/4). ``normalize=False`` feeds G as it is (the post's recipe).
    """
    W, G, wide = _tall_unit(W, G, normalize)
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


# ====================================================================== the Gram-space solve (the default)
#
# Everything the dual needs lives in n x n. For a tall W on its manifold write
#
#     G = W K0 + C,   K0 = D^{-1} W^T G,   W^T C = 0,        D = W^T W,   R = C^T C,
#
# (K0: G's coordinates along the columns of W; C: the part of G normal to them). Every matrix the solvers
# build is X = W a + C b for n x n coefficients (a, b), written Span(a, b): G = Span(K0, I),
# G + 2 W Lambda = Span(K0 + 2 Lambda, I); sums stay in the span, and msign(X) = X (X^T X)^{-1/2} and
# svt(X) = X phi(X^T X) multiply by an n x n factor on the right. Because W^T C = 0,
#
#     W^T X = D a,     X^T X = a^T D a + b^T R b,     <G, X> = <D K0, a> + <R, b>.
#
# So ADMM runs on the coefficients, one n x n eigh per iteration whatever m is; the m-dependent work is
# the blocks D, W^T G, C, R before and one product W+ = W a' + C b' after. R is formed from C, not as
# G^T G - K0^T D K0, so that X^T X is a sum of PSD terms (no cancellation of terms of size ||G||^2:
# singular values of Z = G + 2 W Lambda down to ~sqrt(eps) ||Z|| survive in float32).
# Proven here (and tested): these identities; weak duality, hence the certificate. Measured (the
# benchmark ``inner_solvers``): how many iterations a given accuracy takes on realistic momenta.


def _sym(S):
    return 0.5 * (S + S.mT)


@dataclass
class GramPicture:
    """A tall (W, G) seen in n x n: G = W K0 + C with W^T C = 0, D = W^T W, R = C^T C (see above)."""

    W: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor
    K0: torch.Tensor
    R: torch.Tensor
    P: Callable
    diagonal: bool = False  # D is diagonal to W's rounding: the solve takes D @ X as a row scaling
    DK0: torch.Tensor | None = None  # D K0 (= W^T G up to the ridge), formed once
    off32: torch.Tensor | None = None  # D's off-diagonal part in float32, where it is tiny (``gram_picture``)

    def __post_init__(self):
        if self.DK0 is None:
            self.DK0 = self.dmul(self.K0)

    def dmul(self, X):
        """D @ X as the solve takes it: diag(D) X where D is diagonal to rounding (``diagonal``); where D's
        off-diagonal part is tiny (``off32``: a float32 weight's D formed in float64, the exact mode's), diag(D) X
        plus that part times X in float32: one float32 product instead of a float64 one, whose rounding is float32's
        of a term below ``SPLIT_OFF`` of D (measured 2026-12-07 at the benchmark's DGram points, off-diagonal 2e-8
        of the diagonal: 5e-15 of D X, and the dual value at the solve's multiplier moved by 6e-14 or less)."""
        if self.diagonal:
            return torch.diagonal(self.D, dim1=-2, dim2=-1).unsqueeze(-1) * X
        if self.off32 is not None and X.dtype == torch.float64:
            return torch.diagonal(self.D, dim1=-2, dim2=-1).unsqueeze(-1) * X + (self.off32 @ X.float()).double()
        return self.D @ X

    def eye(self):
        return torch.eye(self.D.size(-1), dtype=self.D.dtype, device=self.D.device).expand_as(self.D)

    def to(self, dtype) -> "GramPicture":
        """The same picture with its n x n blocks (D, K0, R, D K0) in ``dtype``; W and C are shared."""
        if self.D.dtype == dtype:
            return self
        return GramPicture(self.W, self.C, self.D.to(dtype), self.K0.to(dtype), self.R.to(dtype), self.P,
                           self.diagonal, self.DK0.to(dtype), self.off32)


@dataclass
class Span:
    """X = W a + C b of a ``GramPicture``, by its n x n coefficients."""

    a: torch.Tensor
    b: torch.Tensor

    def __add__(self, o):
        return Span(self.a + o.a, self.b + o.b)

    def __sub__(self, o):
        return Span(self.a - o.a, self.b - o.b)

    def __matmul__(self, T):
        return Span(self.a @ T, self.b @ T)

    def times(self, T, pic: "GramPicture"):
        """X @ T, where on a square W (C = 0: ``matrix``, ``gram`` and ``dot_G`` read no b) the b-coefficients are
        kept as they are instead of multiplied: one n x n product fewer. Written out rather than as ``self @ T``:
        torch.compile does not trace a ``Span`` through ``@`` and broke the lean step's graph here (the test
        ``test_lean_step_traces_to_one_graph``)."""
        if pic.W.size(-2) == pic.W.size(-1):
            return Span(self.a @ T, self.b)
        return Span(self.a @ T, self.b @ T)

    def scale(self, c):
        """c X for a per-matrix scalar c (shape of the batch)."""
        return Span(self.a * c[..., None, None], self.b * c[..., None, None])

    def where(self, mask, other):
        m = mask[..., None, None]
        return Span(torch.where(m, self.a, other.a), torch.where(m, self.b, other.b))

    def matrix(self, pic: GramPicture):
        """The m x n matrix W a + C b (the one m-dependent product; on a square W, C = 0 and W a alone), in W's
        layout: where W is the transposed view of a wide weight (``_tall_unit(views=True)``) it is formed as the
        transpose of a^T W^T + b^T C^T, so that the wide weight comes back row-major (no copy, and the caller's
        elementwise work on it stays in one layout)."""
        if pic.W.size(-2) == pic.W.size(-1):
            return pic.W @ self.a.to(pic.W.dtype)
        if _transposed(pic.W):
            return _add_product(self.a.to(pic.W.dtype).mT @ pic.W.mT, self.b.to(pic.C.dtype).mT, pic.C.mT).mT
        return _add_product(pic.W @ self.a.to(pic.W.dtype), pic.C, self.b.to(pic.C.dtype))


def _transposed(X) -> bool:
    """X is the transposed view of a row-major matrix (a wide weight seen tall, ``_tall_unit(views=True)``)."""
    return not X.is_contiguous() and X.mT.is_contiguous()


def _cholesky(A):
    """The Cholesky factor of the positive definite ``A`` without a host synchronisation: ``torch.linalg.cholesky``
    reads LAPACK's status on the host to raise on failure (``manifold_muon.opcount``); ``cholesky_ex`` leaves it on
    the device, unread. Called only on a Gram matrix plus a ridge above float64's rounding of it, which is positive
    definite for every finite input (a non-finite gradient is caught by the optimizer's guard before any step is
    applied)."""
    return torch.linalg.cholesky_ex(A)[0]


def _cholesky_solve(B, L):
    """X with L L^T X = B by two triangular solves: ``torch.cholesky_solve`` reads a status on the host, the
    triangular solves read none (the same LAPACK work, potrs being these two solves)."""
    return torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, B, upper=False), upper=True)


def _factored_solve(D, ridge, B):
    """X with (D + ridge I) X = B (D symmetric positive semi-definite, ridge per matrix) by a float64 Cholesky
    factorisation and its two triangular solves, returned in B's precision: ``gram_picture``'s solve for K0
    where D is not diagonal (Oblique)."""
    eye = torch.eye(D.size(-1), dtype=D.dtype, device=D.device)
    L = _cholesky((D + ridge[..., None, None] * eye).to(torch.float64))
    return _cholesky_solve(B.to(torch.float64), L).to(B.dtype)


def _diagonal_solve(D, ridge, B):
    """``_factored_solve``'s X where D = diag(d) + O and O is at rounding level (a Stiefel or DGram point):
    X = J B - J O J B, J = diag(1 / (d + ridge)), the first two terms of the Neumann series. What is left,
    (J O)^2 X, is second order in O (~1e-14 relative in float32), below the rounding of X itself. One n x n
    product in D's precision, where the float64 Cholesky factorisation and its two triangular solves cost about
    three (measured by the benchmark ``diagonal_solve``, chapter 04)."""
    d = D.diagonal(dim1=-2, dim2=-1)
    J = (d + ridge[..., None]).reciprocal().unsqueeze(-1)
    Y = J * B
    O = D.clone()
    O.diagonal(dim1=-2, dim2=-1).zero_()
    return torch.addcmul(Y, J, O @ Y, value=-1)


SPLIT_OFF = 1e-6  # D's off-diagonal part below this of its diagonal (Frobenius): ``GramPicture.dmul`` splits it off


def gram_picture(W, G, P, dtype=torch.float64, products=torch.float64, diagonal: bool | None = None) -> GramPicture:
    """The blocks of a tall (W, G), products in float64 (measured: float32 blocks let the certificate
    under-report the gap by up to 3x where W^T W is ill conditioned, e.g. Oblique, or where Z has many
    small singular values), n x n blocks returned in ``dtype``; C is kept in W's precision for the final
    product.

    K0 solves D K0 = W^T G by a Cholesky factorisation (with a ridge of rounding size, so that a
    rank-deficient W off its manifold still gives C normal to its range up to rounding). Where D's
    off-diagonal part is at W's rounding level (||off D||_F <= 16 eps ||diag D||, every Stiefel and DGram
    point; measured ~2e-7 relative after float32 steps) the solve takes D as diag(D): its solves and
    products are row scalings (``GramPicture.dmul``; ``multiplier`` always did so), and K0 is solved with
    the whole D by the first two terms of its Neumann series about diag(D) (``_diagonal_solve``: one n x n
    product instead of the factorisation and its two triangular solves; until 2026-12-05 the Cholesky path was
    taken there too). The whole D is kept for the retraction (``gram(..., exact=True)``). For a square W,
    C = 0 exactly and is set so: its rounding noise, amplified by msign, would otherwise leak into A."""
    W64, G64 = W.to(products), G.to(products)
    D = _sym(W64.mT @ W64)
    WtG = W64.mT @ G64
    d = D.diagonal(dim1=-2, dim2=-1)
    ridge = torch.finfo(W.dtype).eps * d.amax(-1).clamp_min(1e-30)
    # On Stiefel and DGram points W^T W is diagonal up to W's own rounding: the solve then takes diag(D)
    # (as ``multiplier`` already does), so that D @ X is a row scaling. ``diagonal`` given: the caller knows
    # (the lean solve: from the manifold, without reading a tensor on the host)
    off32 = None
    if diagonal is None:
        off = D - torch.diag_embed(d)
        off_norm, d_norm = torch.linalg.matrix_norm(off), torch.linalg.vector_norm(d, dim=-1)
        diagonal = bool((off_norm <= 16 * torch.finfo(W.dtype).eps * d_norm).all())
        if not diagonal and dtype == torch.float64 and bool((off_norm <= SPLIT_OFF * d_norm).all()):
            off32 = off.float()  # a float32 weight in float64 (the exact mode): D @ X by a float32 product
    # K0 with the whole D even then: C must be normal to W's range to rounding, as the retraction's
    # X^T X = a^T D a + b^T R b has no cross terms (with diag(D) here, constraints drifted over 1000 steps)
    K0 = (_diagonal_solve if diagonal else _factored_solve)(D, ridge, WtG)
    if W.size(-2) == W.size(-1):  # square: range(W) is everything, C = 0 exactly (what is left is rounding)
        C = torch.zeros_like(G64)
        R = torch.zeros_like(D)
    else:
        # in G's layout: a wide weight's tall view gets C as the transpose of G^T - K0^T W^T (``Span.matrix``)
        C = _add_product(G64.mT, K0.mT, W64.mT, -1).mT if _transposed(G64) else _add_product(G64, W64, K0, -1)
        # float32 products (the lean solve): R is still formed in float64, as the Gram matrix of exactly the C
        # that is stored and multiplied at the end. msign amplifies a direction of singular value s by 1/s, so
        # where C is rank-deficient (a low-rank gradient) R must describe that C below float32's rounding, or
        # the A it certifies feasible is not (measured: a float32 C^T C let ||A||_op reach 1 + 6e-4 on rank 2)
        C64 = C.to(torch.float64)
        R = _sym(C64.mT @ C64)
    return GramPicture(W, C.to(W.dtype), D.to(dtype), K0.to(dtype), R.to(dtype), P, diagonal,  # (no copy in float32)
                       off32=off32)


def span_of(pic: GramPicture, U: torch.Tensor) -> Span:
    """The coefficients (a, b) of the tall m x n matrix ``U``'s part in span(W, C): a = D^{-1} W^T U and
    b = R^+ C^T U (W^T C = 0, so the two parts are orthogonal and each is a least-squares fit). Two m x n
    products in W's precision; D's solve is a row scaling where the picture takes D as diagonal (an LU solve
    elsewhere), R's a Cholesky solve with a ridge of eps max diag(R) (eps: W's, or 4 n float64 eps where that is
    larger, R's own rounding), which damps only the directions of C whose singular values are below sqrt(eps)
    of its largest (rounding there: C^T U is a product in W's precision). Why: a warm start (Lambda, U) is
    carried from one optimizer step to the next, where W and G, hence C, have moved; U's coefficients in the
    last picture describe another matrix in this one (``U.b`` multiplies the new C), so the m x n matrix is
    carried and expressed in each step's picture."""
    dt = pic.D.dtype
    Ut = U.to(pic.W.dtype)
    WtU = (pic.W.mT @ Ut).to(dt)
    if pic.diagonal:
        d = torch.diagonal(pic.D, dim1=-2, dim2=-1).unsqueeze(-1)
        a = WtU / torch.where(d > 0, d, 1)
    else:
        a = torch.linalg.solve(pic.D.to(torch.float64), WtU.to(torch.float64)).to(dt)
    if pic.W.size(-2) == pic.W.size(-1):  # square: C = 0, nothing reads b
        return Span(a, torch.zeros_like(a))
    R = pic.R.to(torch.float64)
    # the ridge: C^T U's rounding (a product in W's precision) or R's own (a float64 Gram matrix of n columns,
    # whose null directions round to +-n eps), whichever is larger
    rel = max(torch.finfo(pic.W.dtype).eps, 4 * R.size(-1) * torch.finfo(torch.float64).eps)
    ridge = rel * torch.diagonal(R, dim1=-2, dim2=-1).amax(-1).clamp_min(1e-30)
    L = _cholesky(R + ridge[..., None, None] * torch.eye(R.size(-1), dtype=R.dtype, device=R.device))
    b = _cholesky_solve((pic.C.mT @ Ut.to(pic.C.dtype)).to(torch.float64), L).to(dt)
    return Span(a, b)


def wt(pic: GramPicture, X: Span):
    """W^T X."""
    return pic.dmul(X.a)


def gram(pic: GramPicture, X: Span, exact: bool = False):
    """X^T X; ``exact``: with the whole D, also where the solve takes it as diagonal (a retraction must see
    W's own rounding off the manifold to remove it, or that rounding would add up over the steps)."""
    DXa = pic.D @ X.a if exact else pic.dmul(X.a)
    if pic.W.size(-2) == pic.W.size(-1):  # square: C = 0, the b-part is empty
        return _sym(X.a.mT @ DXa)
    return _sym(_add_product(X.a.mT @ DXa, X.b.mT @ pic.R, X.b))


def dot_G(pic: GramPicture, X: Span):
    """<G, X> per matrix."""
    return (pic.DK0 * X.a).sum((-2, -1)) + (pic.R * X.b).sum((-2, -1))


def multiplier(pic: GramPicture, S):
    """Lambda = P(Lambda) with P(D Lambda + Lambda D) = P(S): ``gram_multiplier`` from diag(D) alone (a pair of zero
    columns, d_i + d_j = 0, gets 0: D's diagonal is a Gram matrix's, never negative, so 1 / (d_i + d_j) is +inf
    exactly there)."""
    d = torch.diagonal(pic.D, dim1=-2, dim2=-1)
    inv = (d.unsqueeze(-1) + d.unsqueeze(-2)).reciprocal_().nan_to_num_(posinf=0.0)
    return pic.P(pic.P(S) * inv)


def z_of(pic: GramPicture, Lambda):
    """Z = G + 2 W Lambda."""
    return Span(pic.K0 + 2 * Lambda, pic.eye())


def eig_sqrt(N):
    """(V, s) with N = V diag(s^2) V^T (one eigh; s >= 0): for N = X^T X, s are X's singular values."""
    lam, V = torch.linalg.eigh(N)
    return V, lam.clamp_min(0).sqrt()


def factor(V, s, fn):
    """V diag(fn(s)) V^T."""
    return (V * fn(s).unsqueeze(-2)) @ V.mT


def spectral_factor(N, fn):
    """V diag(fn(s)) V^T for N = V diag(s^2) V^T (N = X^T X: then X V diag(fn(s)) V^T acts on X's singular values)."""
    V, s = eig_sqrt(N)
    return factor(V, s, fn), s


def shrink(rho):
    """The factor of singular value thresholding at 1/rho: s -> (s - 1/rho)_+ / s (``svt`` in the Gram picture)."""
    return lambda s: torch.where(s > 1 / rho, (s - 1 / rho) / torch.where(s > 0, s, 1), 0)


def inv_sqrt(s, rtol):
    """1/s on the numerical range (s > rtol s_max), 0 elsewhere: msign(X) = X V diag(inv_sqrt(s)) V^T."""
    keep = s > rtol * s[..., -1:].clamp_min(torch.finfo(s.dtype).tiny)
    return torch.where(keep, 1 / torch.where(keep, s, 1), 0)


def tangent_defect(pic: GramPicture, X: Span):
    """W^T X + X^T W: X is tangent at W where P of it vanishes."""
    S = wt(pic, X)
    return S + S.mT


def tangent_part(pic: GramPicture, X: Span):
    """X - W Gamma: X's orthogonal projection onto the tangent space at W."""
    return Span(X.a - multiplier(pic, tangent_defect(pic, X)), X.b)


def clip_op(pic: GramPicture, X: Span):
    """X with every singular value above 1 set to 1: the nearest point of the unit op-norm ball (one eigh)."""
    phi, _ = spectral_factor(gram(pic, X), lambda s: torch.where(s > 1, 1 / torch.where(s > 1, s, 1), torch.ones_like(s)))
    return X @ phi


def feasible(pic: GramPicture, X: Span, polish: int = 0, fast: bool = False, with_gram: bool = False):
    """X made primal feasible: its orthogonal tangent part X - W Gamma, shrunk into the unit op-norm ball.
    ``polish`` rounds of alternating projections (tangent part, then ``clip_op``) first: they move X towards
    the intersection of the two sets, so the final uniform shrink costs less of its value. Whatever the
    rounds do, the result is feasible and its value a lower bound on OPT (a result with <G, X> < 0 is replaced by
    X = 0, which is better and keeps the relative gap a bound on the relative sub-optimality). ``fast``: the op-norm in float32
    (with a 1e-6 margin, so still feasible). Returns (X_feasible, <G, X_feasible>), and with ``with_gram``
    also X_feasible^T X_feasible (known for free: the op-norm was read from it)."""
    for _ in range(polish):
        X = clip_op(pic, tangent_part(pic, X))
    X = tangent_part(pic, X)
    N = gram(pic, X)
    if fast:  # the largest eigenvalue only scales X: in float32, its rounding covered by a 1e-6 margin
        op = torch.linalg.eigvalsh(N.to(torch.float32))[..., -1].to(N.dtype).clamp_min(0).sqrt().clamp_min(1) * (1 + 1e-6)
    else:
        op = torch.linalg.eigvalsh(N)[..., -1].clamp_min(0).sqrt().clamp_min(1)
    value = dot_G(pic, X) / op  # <G, X / op>: X is scaled once, below
    # a candidate that points uphill (<G, X> < 0, seen from a wild multiplier) is worse than no step: the zero
    # direction replaces it (value 0, relative gap 1, its true sub-optimality), as the relative gap
    # (bound - value) / bound bounds (OPT - value) / OPT only where value >= 0
    f = torch.where(value < 0, 0.0, 1 / op).to(value.dtype)
    X = X.scale(f)
    value = value.clamp_min(0)
    if with_gram:
        return X, value, N * (f * f)[..., None, None]
    return X, value


def certificate(pic: GramPicture, Lambda, U=None, rtol=None, tol=None, polish: int = 0, fast: bool = False,
                with_gram: bool = False):
    """(A, value, bound) with A feasible, value = <G, A> <= <G, A*> <= bound = ||G + 2 W Lambda||_* (weak duality).

    Candidates for A: msign(G + 2 W Lambda) and (ADMM) the scaled multiplier U, each made feasible; the
    better one is kept per matrix. The relative duality gap (bound - value) / bound bounds A's relative
    sub-optimality. All in n x n: one eigh and one eigvalsh for the msign candidate, one more eigvalsh
    for U. Given ``tol``, U is only tried where the msign candidate's gap is above it (a matrix already
    certified to ``tol`` keeps it, so a batch still gives each matrix what it would get alone), and not
    at all when every matrix is certified. ``polish``: rounds of ``feasible``'s alternating projections
    for each candidate (one eigh each). ``with_gram`` (the msign candidate only, U None): (A, value, bound,
    A^T A, (V, s)), (V, s) the eigendecomposition of Z^T Z (``eig_sqrt``), for a caller that iterates from Z
    (``admm_gram``'s ``eig``)."""
    rtol = rtol if rtol is not None else (1e-7 if pic.D.dtype == torch.float64 else 1e-3)
    Z = z_of(pic, Lambda)
    V, s = eig_sqrt(_sym(Z.a.mT @ pic.dmul(Z.a) + pic.R))  # gram(pic, Z) with Z's C-coefficient the identity
    Y = factor(V, s, lambda s: inv_sqrt(s, rtol))
    if with_gram:
        if U is not None:
            raise ValueError("certificate(with_gram=True) takes the msign candidate only (U None)")
        A, value, AtA = feasible(pic, Span(Z.a @ Y, Y), polish, fast, with_gram=True)
        return A, value, s.sum(-1), AtA, (V, s)
    A, value = feasible(pic, Span(Z.a @ Y, Y), polish, fast)
    bound = s.sum(-1)
    if U is not None:
        open_ = torch.ones_like(value, dtype=torch.bool) if tol is None else _relative_gap(value, bound) > tol
        if bool(open_.any()):
            A_u, value_u = feasible(pic, U, polish)
            A, value = _keep(open_ & (value_u > value), (A_u, value_u), (A, value))
    return A, value, bound


def _keep(take, new, old):
    """Per matrix of the batch, ``new`` where ``take`` (a boolean per matrix) and ``old`` elsewhere; ``new``
    and ``old`` are matching tuples of Spans, n x n tensors and per-matrix scalars."""
    def one(n, o):
        if isinstance(n, Span):
            return n.where(take, o)
        return torch.where(take.reshape(take.shape + (1,) * (n.dim() - take.dim())), n, o)
    return tuple(one(n, o) for n, o in zip(new, old))


def _check_relax(relax, caller: str) -> None:
    if not 0 < relax < 2:
        raise ValueError(f"{caller}: over-relaxation must be in (0, 2) (1: plain ADMM), got {relax!r}")


def admm_gram(pic: GramPicture, Lambda, U, rho, steps, relax=1.0, eig=None):
    """``steps`` iterations of Buchanan's ADMM (as ``admm``) on span coefficients; returns (Lambda, U), U the
    scaled multiplier (a primal candidate). One iteration, from (Lambda, U):
        Y      = G + 2 W Lambda, over-relaxed: Y <- relax Y + (1 - relax) X_prev   (not in the first iteration)
        Z+     = Y + U / rho
        X      = svt(Z+, 1/rho)                      one n x n eigh of (Z+)^T Z+
        U      = rho (Z+ - X)
        Lambda = argmin ||G + 2 W Lambda - X + U/rho ... ||: the least-squares multiplier of X - G - U/rho.
    ``relax`` in (0, 2) is Eckstein and Bertsekas' over-relaxation (Boyd et al. 2011, section 3.4.3): every
    value converges, 1 is plain ADMM; chapter 04 measures how many fewer iterations 1.8 needs to a given
    certificate on momenta with a realistic spectrum. The first iteration of a call is plain (X_prev is
    not carried between calls), so a call of k iterations relaxes k - 1 of them. ``eig``: (V, s) of the first
    iteration's (Z+)^T Z+ (``eig_sqrt``), where the caller has it already (``lean_solve(certify_first=True)``:
    with U = 0, Z+ is the certificate's Z): that iteration then needs no eigendecomposition of its own."""
    _check_relax(relax, "admm_gram")
    G = Span(pic.K0, pic.eye())
    X = None
    for _ in range(steps):
        Y = z_of(pic, Lambda)
        if X is not None and relax != 1.0:
            Y = Span(relax * Y.a + (1 - relax) * X.a, relax * Y.b + (1 - relax) * X.b)
        Zp = Y + Span(U.a / rho, U.b / rho)
        V, s = eig_sqrt(gram(pic, Zp)) if eig is None else eig
        eig = None
        X = Zp.times(factor(V, s, shrink(rho)), pic)
        Ur = Zp - X
        S = wt(pic, X - G - Ur)
        Lambda = multiplier(pic, 0.5 * (S + S.mT))
        U = Span(rho * Ur.a, rho * Ur.b)
    return Lambda, U


ANDERSON_RESTART = 1.0  # ``_Anderson``: a matrix's history is dropped where its residual exceeds this times its least


def _check_anderson(anderson, caller: str) -> None:
    if not isinstance(anderson, int) or isinstance(anderson, bool) or anderson < 0:
        raise ValueError(f"{caller}: anderson is a memory, an int >= 0 (0: no acceleration), got {anderson!r}")


class _Anderson:
    """Type-II Anderson acceleration of ADMM's fixed-point map (``gram_solve(anderson=m)``), per matrix of a batch.

    The map is one plain ADMM iteration, x -> T(x), x = (Lambda, U.a, U.b) flattened (on a square W, C = 0 and U.b is
    never read, so x is (Lambda, U.a)). With the residual g = T(x) - x and the last ``memory`` differences of iterates
    (dX) and of residuals (dG), the next iterate is T(x) - (dX + dG) gamma, gamma the least-squares solution of
    dG gamma = g (Walker and Ni 2011, with mixing 1), by its m x m normal equations with a ridge of 1e-12 of their
    trace. Safeguard: where a matrix's residual norm exceeds ``ANDERSON_RESTART`` times the least it has had, its
    history is dropped (the columns written until then are masked out of its least squares, where the ridge gives
    them gamma = 0) and the step is T(x) itself. Each matrix solves its own least squares and restarts on its own
    residual, so a batch gives every matrix what it would get alone. Only iterates change: any multiplier gives a
    bound and any U a candidate that the certificate makes feasible, so the certificate stays what it is. No host
    read of its own (the solve is ``solve_ex``'s, whose status stays on the device; the ridge keeps it regular).

    Why: on square DGram and Oblique weights the optimum is rank-deficient, Newton does not certify it, and the exact
    mode's certificate came from ADMM's slow linear tail. Measured (2026-12-07, scratch probe, one thread, the table's
    128 x 128 draw of seed 0, cold start, certificate every 4 iterations): to a certified gap <= 1e-6, DGram in 156
    iterations with memory 5 where over-relaxed ADMM (relax 1.8) had 1.4e-6 after 500; Oblique in 244 where
    over-relaxed ADMM had 9.5e-6 after 600, and where Anderson without the safeguard had 3e-4 after 600. Memory 3, 10
    and 20 took 208, 148 and 136 on DGram; the least-squares work grows with the memory, five was the knee. A looser
    safeguard (restart above twice the least) took more iterations at n = 64 and ended 3x higher at 768. Larger,
    400 iterations from the cold start on square DGram: 8.6e-7 against 5.3e-6 at n = 256, 9.6e-7 against 1.1e-5 at
    384, and at 768 a wash (neither certifies: 1.7e-5 against 3.8e-5 on the stream's sixth momentum, 4.3e-4 against
    2.1e-4 on its first, each iteration about 10% dearer there); square Oblique at 256, 1.2e-6 against 1.2e-5. The
    history costs 2 ``memory`` + 2 vectors of 3 n^2 (2 n^2 square) entries per matrix."""

    def __init__(self, memory: int):
        self.memory = memory
        self.x_prev = self.g_prev = None
        self.dX = self.dG = None  # (..., N, memory): the history, column i % memory written at iteration i
        self.born = None  # (memory,), on the device: the iteration each column was written at (-1: not yet)
        self.restart = None  # per matrix: the iteration of its last restart (columns written then or before are not its)
        self.least = None  # per matrix: the least residual norm so far
        self.i = 0

    @staticmethod
    def _pack(pic, Lambda, U):
        parts = (Lambda, U.a) if pic.W.size(-2) == pic.W.size(-1) else (Lambda, U.a, U.b)
        return torch.cat([t.flatten(-2) for t in parts], -1)

    @staticmethod
    def _unpack(pic, x):
        n2, shape = pic.D.size(-1) ** 2, pic.D.shape
        Lambda, a = x[..., :n2].reshape(shape), x[..., n2:2 * n2].reshape(shape)
        b = x[..., 2 * n2:].reshape(shape) if x.size(-1) > 2 * n2 else torch.zeros_like(a)
        return Lambda, Span(a, b)

    def step(self, pic, Lambda, U, rho):
        """One accelerated iteration from (Lambda, U): returns the next (Lambda, U)."""
        x = self._pack(pic, Lambda, U)
        fx = self._pack(pic, *admm_gram(pic, Lambda, U, rho, 1))
        g = fx - x
        norm = torch.linalg.vector_norm(g, dim=-1)
        i, self.i = self.i, self.i + 1
        if self.least is None:
            self.least, self.restart = norm, torch.zeros_like(norm, dtype=torch.long)
            self.x_prev, self.g_prev = x, g
            return self._unpack(pic, fx)
        if self.dX is None:
            self.dX = x.new_zeros(x.shape + (self.memory,))
            self.dG = torch.zeros_like(self.dX)
            self.born = torch.full((self.memory,), -1, dtype=torch.long, device=x.device)
        col = (i - 1) % self.memory
        torch.sub(x, self.x_prev, out=self.dX[..., col])
        torch.sub(g, self.g_prev, out=self.dG[..., col])
        self.born[col] = i
        self.restart = torch.where(norm > ANDERSON_RESTART * self.least, i, self.restart)
        self.least = torch.minimum(self.least, norm)
        self.x_prev, self.g_prev = x, g
        k = min(i, self.memory)  # the columns written so far
        dX, dG = self.dX[..., :k], self.dG[..., :k]
        own = (self.born[:k] > self.restart.unsqueeze(-1)).to(x.dtype)  # (..., k): columns since the matrix's restart
        mask = own.unsqueeze(-1) * own.unsqueeze(-2)
        gram = (dG.mT @ dG) * mask
        rhs = (dG.mT @ g.unsqueeze(-1)) * own.unsqueeze(-1)
        trace = torch.diagonal(gram, dim1=-2, dim2=-1).sum(-1)
        ridge = (1e-12 * trace).clamp_min(torch.finfo(x.dtype).tiny)[..., None, None]
        gamma = torch.linalg.solve_ex(gram + ridge * torch.eye(k, dtype=x.dtype, device=x.device), rhs)[0]
        return self._unpack(pic, fx - (dX @ gamma + dG @ gamma).squeeze(-1))


@dataclass
class GramSolve:
    """What ``gram_solve`` returns: the direction A (as Span coefficients of ``picture``), the dual state
    to warm-start from (Lambda, U), the certificate (relative duality gap) and the iterations each matrix took."""

    A: Span
    picture: GramPicture
    Lambda: torch.Tensor
    U: Span
    gap: torch.Tensor
    iterations: torch.Tensor
    wide: bool
    AtA: torch.Tensor | None = None  # A^T A where the solve knows it (the lean solve: its retraction reuses it)
    damping: torch.Tensor | None = None  # the Newton tracker's step length for the next step (``newton_track``)

    def matrix(self):
        A = self.A.matrix(self.picture)
        return A.mT if self.wide else A


def gram_solve(W, G, P, steps=16, tol=1e-3, rho=None, warm=None, check_every=4, dtype=torch.float64,
               normalize=True, relax=1.8, polish=2, anderson: int = 0) -> GramSolve:
    """The default inner solve: Gram-space ADMM (over-relaxed, ``relax``; see ``admm_gram``) with a certificate stop.

    Starts from the better certified of two points: cold, the tangent projection (``tangent_init``,
    U = 0), and ``warm`` = (Lambda, U), a previous solve's (e.g. the previous optimizer step's), if given; U as
    the tall m x n matrix (``span_of`` reads it in this picture: what the optimizer carries) or as a ``Span`` of
    this picture's W and C.
    The warm start is certified first (on a square W the cold one, exact on square Stiefel) and the other
    only where the first is not within ``tol``. Where the gradient changes slowly (a fixed one, say) the
    warm start is within it and the whole solve is one certificate (one eigh, one eigvalsh); in training
    it mostly is not, and the solve iterates (chapter 04). Checks the certificate before iterating and
    every ``check_every`` iterations; a matrix whose relative duality gap is <= ``tol`` stops there (its
    state is frozen, so a batch gives each matrix what it would get alone); at most ``steps`` iterations.
    Returns the best certified feasible direction of each matrix. A matrix still above ``tol`` at the cap
    gets its last certificate again with ``polish`` rounds of alternating projections on each candidate
    (``feasible``; one eigh a round), kept where it certifies a smaller gap. Why: on momenta with a
    training-like spectrum the bound converges much faster than the primal candidates, so at the cap the
    certified gap is mostly the candidates' shortfall, which a few rounds cut for about the cost of as many
    ADMM iterations (chapter 04 measures both).

    Proven: the returned A is tangent (to rounding) with ||A||_op <= 1, and (OPT - <G, A>) / OPT <= gap.
    On a square Stiefel point the cold start is already optimal (Z = W skew(W^T G), msign keeps it
    tangent), so the first certificate is zero up to rounding and no iteration runs:
    A = W msign(skew(W^T G)), the closed form. Elsewhere convergence is ADMM's (O(1/k)); how many
    iterations realistic momenta need is measured (benchmarks ``inner_solvers`` and ``iteration_cap``: on
    training-like momenta the gap falls geometrically, a few-fold every 16 iterations), not proven.
    n x n work in ``dtype`` (float64 by default: measured, a float32 eigendecomposition of Z^T Z resolves
    singular values of Z only down to ~1e-3 of the largest, and on realistic momenta, whose spectra
    fall like i^-1.3, dropping the rest cost up to 4% of the retracted weight on square Stiefel at
    lr 0.1; in float64 the m x n products' own float32 rounding, ~1e-7, is the limit, and directions
    below 1e-6 of the largest are treated as null); G rescaled to unit RMS unless ``normalize=False``.

    ``anderson`` (a memory m > 0; the exact mode's fallback, ``exact_solve``): the iterations are plain ADMM
    iterations (``relax`` is not used) accelerated by Anderson's method with that memory and a restart safeguard
    (``_Anderson``, which says why and what it measured); 0, the default, iterates as above."""
    _check_relax(relax, "gram_solve")
    _check_anderson(anderson, "gram_solve")
    rtol = 1e-3 if dtype != torch.float64 else (1e-7 if W.dtype == torch.float64 else 1e-6)
    if W.dtype not in (torch.float32, torch.float64):  # bfloat16 / float16 in: products in float32
        W, G = W.float(), G.float()
    Wt, Gt, wide = _tall_unit(W, G, normalize, views=True)
    pic = gram_picture(Wt, Gt, P, dtype)
    rho = rho if rho is not None else Wt.size(-1) ** -0.5
    S = pic.DK0  # W^T G
    cold = (-0.5 * multiplier(pic, S + S.mT), None)
    starts = [cold]
    if warm is not None:  # the warm start first (one certificate when it holds); on a square W the cold
        # start first (it is exact on square Stiefel: the closed form)
        warm = (warm[0].to(dtype), _warm_span(pic, warm[1]))
        starts = [cold, warm] if Wt.size(-2) == Wt.size(-1) else [warm, cold]
    gap = None
    for Lambda_s, U_s in starts:  # keep the better certified start, per matrix; stop once all are within tol
        A_s, value_s, bound_s = certificate(pic, Lambda_s, U_s, rtol, tol)
        gap_s = _relative_gap(value_s, bound_s)
        U_s = U_s if U_s is not None else Span(torch.zeros_like(pic.D), torch.zeros_like(pic.D))
        if gap is None:
            Lambda, U, A, gap = Lambda_s, U_s, A_s, gap_s
        else:
            Lambda, U, A, gap = _keep((gap > tol) & (gap_s < gap), (Lambda_s, U_s, A_s, gap_s), (Lambda, U, A, gap))
        if bool((gap <= tol).all()):
            break
    iterations = torch.zeros(pic.D.shape[:-2], dtype=torch.long, device=pic.D.device)
    accelerated = _Anderson(anderson) if anderson else None
    while iterations.max() < steps and not bool((gap <= tol).all()):
        k = min(check_every, steps - int(iterations.max()))
        moving = gap > tol
        if accelerated is None:
            Lambda, U = _keep(moving, admm_gram(pic, Lambda, U, rho, k, relax), (Lambda, U))
        else:  # a matrix already within tol keeps its state (its history is then never read again)
            for _ in range(k):
                Lambda, U = _keep(moving, accelerated.step(pic, Lambda, U, rho), (Lambda, U))
        iterations = iterations + k * moving
        A_k, value_k, bound_k = certificate(pic, Lambda, U, rtol, tol)
        A, gap = _keep(moving, (A_k, _relative_gap(value_k, bound_k)), (A, gap))
    if polish and not bool((gap <= tol).all()):  # at the cap: polish the candidates of the last certificate
        A_p, value_p, bound_p = certificate(pic, Lambda, U, rtol, tol, polish)
        gap_p = _relative_gap(value_p, bound_p)
        A, gap = _keep((gap > tol) & (gap_p < gap), (A_p, gap_p), (A, gap))
    return GramSolve(A, pic, Lambda, U, gap, iterations, wide)


def _warm_span(pic: GramPicture, U) -> Span:
    """A warm start's U in this picture: a Span as given (its coefficients read against this picture's W and C),
    a tall m x n matrix by ``span_of``."""
    dt = pic.D.dtype
    if isinstance(U, Span):
        return Span(U.a.to(dt), U.b.to(dt))
    return span_of(pic, U)


def _relative_gap(value, bound):
    return (bound - value) / bound.clamp_min(torch.finfo(bound.dtype).tiny)


# The Newton tracker's start (``lean_solve(tracker="newton")`` without a carried multiplier): ADMM iterations from the
# tangent projection's multiplier before the first Newton step. That multiplier is far from the optimum's (7x its
# norm on the table's 512 x 128 DGram draw), and one damped Newton step a momentum took 100-200 momenta to recover
# (``bench.solver_settling``, chapter 04: e_W at 64 momenta 1.02-1.53x the bar on rectangular DGram at width 128,
# 0.81-1.00x at 256 and 512). Chosen on the tuning seed (``solver_table.TUNING_SEED``, not a judged draw), e_W at
# 64 momenta over the bar at 512 x 128 and 384 x 128 DGram: cold 1.57 and 1.50; 2 iterations 1.20 and 1.14;
# 4: 1.01 and 1.10; 8: 0.995 and 1.090; 16: 0.992 and 1.088. Eight, where more stopped helping.
NEWTON_START = 8
NEWTON_TRACKERS = ("newton", "newton_dk")  # ``lean_solve``'s Newton trackers: two eigendecompositions a step, or one
# ``lean_solve(tracker="newton_cold")``: nothing carried; from Lambda = 0 one Newton step of ``steps`` conjugate-gradient
# steps, taken at this fraction of its length. One CG step from Lambda = 0 is an exact line search on the dual's
# quadratic model along the preconditioned gradient, and the model overshoots there (the dual is the nuclear norm,
# flatter than its model away from the optimum). Chosen on the tuning draw only (``solver_table.TUNING_SEED`` = 7, one
# momentum at each rectangular Stiefel shape of the table, 2026-12-07, scratch): e_W at lr 0.02 against the certified
# reference at fractions 0.6 / 0.7 / 0.75 / 0.8 / 0.9 / 1 was 0.20 / 0.15 / 0.13 / 0.12 / 0.14 / 0.19% at 512 x 128,
# 0.26 / 0.22 / 0.21 / 0.22 / 0.26 / 0.32% at 384 x 128 and 768 x 2304 (the tangent projection's cold step: 0.65%).
NEWTON_COLD_LENGTH = 0.75
COLD_TRACKER = "newton_cold"
# ``manifold_muon.optim.manifold_muon.resolve_tracker``: "auto" takes the cold Newton step on Stiefel weights at least
# this long for their width, the tangent projection's cold step on the others. From zero the Newton step does well
# where C = G - W W^T G carries much of G (a long weight) and badly near square, where C vanishes and the tangent
# projection's multiplier is the optimum's. Scratch, 2026-12-07, one momentum each (a generator of its own, not the
# table's draws), e_W at lr 0.02, tangent projection's cold step -> cold Newton step: Gaussian 160 x 128 0.54 -> 1.05%,
# 200 x 128 0.55 -> 0.79%, 256 x 128 0.41 -> 0.49%, 320 x 128 0.30 -> 0.29%, 384 x 128 0.24 -> 0.19%; training-like
# (singular values ~ i^-1.3) 0.63 -> 0.98%, 0.67 -> 0.74%, 0.67 -> 0.52%, 0.65 -> 0.31%, 0.65 -> 0.22%; the same
# at width 64 and at 1536 x 768 (aspect 2: 0.42 -> 0.50% Gaussian, 0.67 -> 0.49% training-like).
NEWTON_COLD_ASPECT = 2.5


def lean_solve(W, G, P, warm=None, steps=1, rho=None, relax=1.8, normalize=True, diagonal=None,
               polish: int = 0, certify_first: bool = False, tracker: str = "admm", damping=None,
               eigenbasis: bool = False) -> GramSolve:
    """The lean solve: the dual tracked across optimizer steps, a fixed amount of work, no host read of its own
    (torch's ``eigh`` and ``eigvalsh`` read their status on the host once per call, ``manifold_muon.opcount``;
    the picture's Cholesky factorisations read none, ``_cholesky``).

    From ``warm`` (the previous step's (Lambda, U), U a ``Span`` of this picture or the tall m x n matrix, read
    here by ``span_of``; else the cold tangent-projection start) it runs exactly
    ``steps`` over-relaxed ADMM iterations (``admm_gram``: one n x n eigh each) and one certificate with the
    msign candidate only (one eigh, one eigvalsh): every matrix of a batch does the same work, nothing is
    decided on the host. The m x n products (W^T W, W^T G, C, C^T C) are formed in W's precision (float32;
    the n x n work is in float64) where ``diagonal`` says that W^T W is diagonal on this manifold (Stiefel,
    DGram: no test on the host), in float64 elsewhere. There the ADMM iterations run in float32 too: their
    singular value thresholding keeps only singular values above 1/rho = sqrt(n) (in unit-RMS units, the
    top few), which float32's eigh resolves to ~1e-5 relative, and they only move the multiplier that the
    float64 certificate then judges; the certificate (msign maps every singular value to 1, the small ones
    included) stays in float64. A^T A is returned (``GramSolve.AtA``) for ``lean_retract``. Why a few iterations
    suffice: consecutive momenta are close (Muon's momentum 0.95), so the optimal multiplier moves little between steps
    and the iterations of successive steps add up (chapter 04 measures the error against a certified reference along a
    stream). Returns a ``GramSolve`` whose gap is a certificate (an upper bound on A's relative sub-optimality), as a
    tensor.

    ``certify_first``: the other order. The certificate is taken at the carried multiplier first, and the
    iterations then run from (that multiplier, U = 0), for the next step. With U = 0 the first iteration
    thresholds the singular values of the same Z = G + 2 W Lambda that the certificate decomposes, so the two
    share one eigendecomposition: one eigh per step instead of two (with ``steps=1``). The direction returned
    is then the certificate's at the multiplier the previous step's iteration left (``warm``), and the
    returned (Lambda, U) are for the next step. Measured on the benchmark's stationary stream (chapter 04), here:
    on Oblique at the CPU presets' rectangular widths more accurate than the default order, at GPT-2 small's
    rectangular shapes a little less, on square Oblique and on DGram less. Those measurements carried the default
    order's U by its coefficients, whose C-part the next momentum's C reinterprets; Oblique's lean step, which
    carries U as a matrix (``manifold_muon.optim.manifold_muon.oblique_solve``), settles closer in the default
    order on every shape, and the optimizer now carries the matrix here too (``warm``). With
    ``steps`` > 1 the iterations are one ``admm_gram`` call (the first shares the certificate's
    eigendecomposition; the later ones are over-relaxed, as in any call).

    ``tracker="newton"``: instead of ADMM iterations, one damped Newton step on the dual from the carried
    multiplier (``newton_track``; ``steps`` is its number of conjugate-gradient steps, ``damping`` the step
    length carried from the last step, 1 at the start), then the certificate at the new multiplier; ``U`` is
    not used (returned as zeros). Two eigendecompositions a step, as the default order; the first step (``warm``
    None) starts from the multiplier that ``NEWTON_START`` ADMM iterations (as the ADMM tracker's, from the tangent
    projection's multiplier) reach, not from the tangent projection's itself (why: ``NEWTON_START``), and costs
    ``NEWTON_START`` eigendecompositions more, once. ``eigenbasis`` (the caller
    knows W^T W = c I and P is the identity: Stiefel) solves the Newton system in N's eigenbasis, where the
    Hessian's first term is diagonal and inverted exactly (``_eigen_cg``), instead of with the Jacobi
    preconditioner.

    ``tracker="newton_dk"``: the same Newton step, then the direction and the certified bound at the new multiplier
    from the carried multiplier's eigendecomposition instead of a second one (``newton_track(one_eigh=True)``,
    ``first_order_certificate``: the Schur-Horn bound and the Daleckii-Krein first-order candidate): one
    eigendecomposition a step and one host read fewer. Measured by the benchmark ``step_budget`` (chapter 04,
    2026-12-06, as the arm ``dk``), not proven: settled e_W within 0.04 of Muon's own e_W of the two-eigendecomposition
    tracker's on every DGram draw at width 128 and at GPT-2 small's c_attn (0.38x against 0.37x there), each step
    3-17% cheaper on one CPU thread (median 8%), and on one momentum repeated its gap ends where the tracker's does
    (DGram) or within 3x (Stiefel, 7e-6 against 2e-6). Not the default: the seed and settling studies of chapter 04
    measured the two-eigendecomposition tracker, and on the CPU the saving closes no ratio; its case is the GPU,
    where an eigendecomposition and its host read cost many Muon steps.

    ``tracker="newton_cold"`` (the lean default since 2026-12-07 on Stiefel weights at least ``NEWTON_COLD_ASPECT``
    times as long as wide): nothing carried.
    From Lambda = 0 (Z = G, so N = G^T G), one Newton step on the dual with ``steps`` conjugate-gradient steps, taken
    at ``NEWTON_COLD_LENGTH`` of its length, then the direction and the certified bound at the new multiplier from
    Lambda = 0's eigendecomposition (``first_order_certificate``, as ``"newton_dk"``): one eigendecomposition and one
    float32 eigvalsh a step, the cold step's count, and no state. With ``eigenbasis`` (Stiefel, the default's case) the
    step never leaves N's eigenbasis (``cold_newton_eigenbasis``: the same mathematics, four float64 products fewer).
    Why from zero and not from the tangent projection's multiplier (the cold ADMM step's start): on the table's momenta
    that multiplier is 5-7x the optimum's in norm and at a wide angle to it (cosine about 0.3; 2026-12-07, 512 x 128,
    three momenta; chapter 04 computes one), so it lies 5-7 optimum norms from the optimum where zero lies one, and a
    full Newton step from it landed further away than it started. Measured on the table's
    stationary stream, chapter 04: e_W at lr 0.02 3-5x smaller than the tangent projection's cold step (0.65%) at
    every rectangular Stiefel weight of the table (3 and 4 times as long as wide); nearer square it is worse, which
    is why "auto" stops at ``NEWTON_COLD_ASPECT``. On DGram and Oblique it acts too (Jacobi-preconditioned), unmeasured
    there; ``warm`` must be None, ``certify_first`` False."""
    _check_relax(relax, "lean_solve")
    if tracker not in ("admm",) + NEWTON_TRACKERS + (COLD_TRACKER,):
        raise ValueError(f"lean_solve: tracker must be 'admm', 'newton', 'newton_dk' or 'newton_cold', got {tracker!r}")
    if tracker in NEWTON_TRACKERS + (COLD_TRACKER,) and (certify_first or steps < 1):
        raise ValueError(f"lean_solve(tracker={tracker!r}) takes steps >= 1 conjugate-gradient steps and certifies "
                         "after its Newton step: certify_first does not apply")
    if tracker == COLD_TRACKER and warm is not None:
        raise ValueError("lean_solve(tracker='newton_cold') starts every step from Lambda = 0 and carries nothing: "
                         "pass warm=None, or tracker='newton' to start from a carried multiplier")
    if W.dtype not in (torch.float32, torch.float64):
        W, G = W.float(), G.float()
    Wt, Gt, wide = _tall_unit(W, G, normalize, views=True)
    # float32 products where W^T W is diagonal; where it is not (Oblique) its small eigenvalues make the
    # coefficients large and float32 products would let ||A||_op exceed 1 by ~1e-5: float64 there
    products = Wt.dtype if diagonal else torch.float64
    pic = gram_picture(Wt, Gt, P, torch.float64, products=products, diagonal=diagonal)
    rtol = 1e-7 if W.dtype == torch.float64 else 1e-6
    if tracker == COLD_TRACKER:
        t = torch.full_like(pic.D[..., 0, 0], NEWTON_COLD_LENGTH)
        if eigenbasis:
            A, value, bound, AtA, Lambda = cold_newton_eigenbasis(pic, t, steps, rtol)
        else:
            A, value, bound, AtA, Lambda, _ = newton_track(pic, torch.zeros_like(pic.D), t, steps, rtol,
                                                           one_eigh=True)
        iterations = torch.full(pic.D.shape[:-2], steps, dtype=torch.long, device=pic.D.device)
        U = Span(torch.zeros_like(pic.D), torch.zeros_like(pic.D))
        return GramSolve(A, pic, Lambda, U, _relative_gap(value, bound), iterations, wide, AtA)
    rho = rho if rho is not None else Wt.size(-1) ** -0.5
    if warm is None:  # the tangent projection's multiplier
        S = pic.DK0
        Lambda, U = -0.5 * multiplier(pic, S + S.mT), Span(torch.zeros_like(pic.D), torch.zeros_like(pic.D))
    else:
        Lambda, U = warm[0].to(pic.D.dtype), _warm_span(pic, warm[1])
    if tracker in NEWTON_TRACKERS:
        if warm is None:  # the tracker's start: NEWTON_START ADMM iterations from the tangent projection's multiplier
            Lambda, _ = _lean_admm(pic, Lambda, U, rho, NEWTON_START, relax, diagonal and W.dtype == torch.float32)
        t = torch.ones_like(pic.D[..., 0, 0]) if damping is None else damping.to(pic.D.dtype)
        one = dict(one_eigh=True) if tracker == "newton_dk" else {}  # (the benchmarks swap in trackers without it)
        A, value, bound, AtA, Lambda, t = newton_track(pic, Lambda, t, steps, rtol, eigenbasis=eigenbasis, **one)
        iterations = torch.full(pic.D.shape[:-2], steps, dtype=torch.long, device=pic.D.device)
        U = Span(torch.zeros_like(pic.D), torch.zeros_like(pic.D))
        return GramSolve(A, pic, Lambda, U, _relative_gap(value, bound), iterations, wide, AtA, t)
    if certify_first:
        A, value, bound, AtA, Lambda, U = _certify_then_iterate(pic, Lambda, rho, steps, relax, rtol, polish)
        iterations = torch.full(pic.D.shape[:-2], steps, dtype=torch.long, device=pic.D.device)
        return GramSolve(A, pic, Lambda, U, _relative_gap(value, bound), iterations, wide, AtA)
    if steps:
        Lambda, U = _lean_admm(pic, Lambda, U, rho, steps, relax, diagonal and W.dtype == torch.float32)
    A, value, bound, AtA, _ = certificate(pic, Lambda, None, rtol, polish=polish, fast=True, with_gram=True)
    iterations = torch.full(pic.D.shape[:-2], steps, dtype=torch.long, device=pic.D.device)
    return GramSolve(A, pic, Lambda, U, _relative_gap(value, bound), iterations, wide, AtA)


def _lean_admm(pic: GramPicture, Lambda, U, rho, steps: int, relax, in_float32: bool):
    """``lean_solve``'s ADMM iterations (``admm_gram``), in float32 where ``in_float32`` (float32 weights whose W^T W
    is diagonal: ``lean_solve`` says why that suffices), else in the picture's precision; (Lambda, U) returned in the
    picture's precision. The ADMM tracker's iterations and the Newton tracker's start (``NEWTON_START``)."""
    it, dt = (torch.float32 if in_float32 else pic.D.dtype), pic.D.dtype
    Lambda, U = admm_gram(pic.to(it), Lambda.to(it), Span(U.a.to(it), U.b.to(it)), rho, steps, relax)
    return Lambda.to(dt), Span(U.a.to(dt), U.b.to(dt))


def _certify_then_iterate(pic: GramPicture, Lambda, rho, steps: int, relax, rtol, polish: int):
    """``lean_solve(certify_first=True)``: the certificate at ``Lambda`` (msign candidate, fast op-norm), then
    ``steps`` ADMM iterations from (Lambda, U = 0), the first of which reuses the certificate's
    eigendecomposition (with U = 0 its Z+ is the certificate's Z). Returns (A, value, bound, A^T A, Lambda', U'),
    all in float64."""
    A, value, bound, AtA, eig = certificate(pic, Lambda, None, rtol, polish=polish, fast=True, with_gram=True)
    U = Span(torch.zeros_like(pic.D), torch.zeros_like(pic.D))
    if steps:
        Lambda, U = admm_gram(pic, Lambda, U, rho, steps, relax, eig=eig)
    return A, value, bound, AtA, Lambda, U


def _floored(s, dtype=None):
    """N's singular values s floored at 1e-7 of the largest (in ``dtype``, default s's): what the Newton tracker
    divides by (the floor keeps 1/s and ``_dk_denominator`` finite on a null singular value)."""
    floor = 1e-7 * s[..., -1:].clamp_min(torch.finfo(s.dtype).tiny)
    sc = torch.maximum(s, floor)
    return sc if dtype is None else sc.to(dtype)


def _dk_denominator(sc):
    """den_ij = sc_i sc_j (sc_i + sc_j) for floored roots ``sc`` (``_floored``) of a diagonal N = diag(sc^2) (N's
    eigenvalues in its eigenbasis): the Daleckii-Krein matrix of N^{-1/2}, d(N^{-1/2})_ij = -dN_ij / den_ij there.
    A sum of the two roots, not their difference, so it is as well defined on a repeated singular value as anywhere.
    The Newton tracker's Hessian-vector products (``_hvp``, ``_eigen_cg``, the exact mode's CG) and its
    one-eigendecomposition certificate (``first_order_certificate``) read it."""
    return sc.unsqueeze(-1) * sc.unsqueeze(-2) * (sc.unsqueeze(-1) + sc.unsqueeze(-2))


def _dk_setup(s, dtype):
    """(sc, L, inv) for N's singular values ``s``, in ``dtype``: the floored roots (``_floored``), the Daleckii-Krein
    factors 1 / ``_dk_denominator`` and 1/sc as a row, what every Newton-CG helper below builds first."""
    sc = _floored(s, dtype)
    return sc, 1.0 / _dk_denominator(sc), (1.0 / sc).unsqueeze(-2)


def _first_term_divisor(pic: GramPicture, sc, dtype):
    """2 c (1/s_i + 1/s_j), c the mean of W^T W's diagonal, for floored roots ``sc`` (``_floored``): in N's eigenbasis
    the Hessian's first term, 2 (x N^{-1/2} + N^{-1/2} x) c, is x_ij times it (exactly where W^T W = c I). The
    preconditioner of ``_eigen_cg`` and ``_diagonal_cg`` divides by it."""
    inv = (1.0 / sc).unsqueeze(-2)
    c = torch.diagonal(pic.D, dim1=-2, dim2=-1).mean(-1).to(dtype)[..., None, None]
    return 2 * c * (inv + inv.mT)


def _hvp(pic: GramPicture, a, V, s, dtype, mu=None):
    """Hess f [x] (``newton_track``'s Newton system, see the exact mode's derivation below) as a closure, in
    ``dtype``, by four n x n products a call (five with a full D): in N's eigenbasis,
    D dx N^{-1/2} + D a d(N^{-1/2}) = [D (dx V) diag(1/s) + (D a V) Ltilde] V^T, Ltilde the Daleckii-Krein
    matrix of V^T dN V = (D a V)^T (dx V) + its transpose. ``mu`` (per matrix; ``newton_solve``'s damping): the
    first term (D dx N^{-1/2}'s) taken 1 + mu times."""
    P = pic.P
    _, L, inv = _dk_setup(s, dtype)  # (an overflow of L in float32, a G far from unit scale: see newton_track)
    V = V.to(dtype)
    DaV = pic.dmul(a).to(dtype) @ V
    if pic.diagonal:
        d = torch.diagonal(pic.D, dim1=-2, dim2=-1).to(dtype).unsqueeze(-1)
        dmul = lambda X: d * X  # noqa: E731
    else:
        D = pic.D.to(dtype)
        dmul = lambda X: D @ X  # noqa: E731

    if mu is not None:
        inv = inv * (1 + mu.to(dtype)[..., None, None])

    def hvp(x):  # 2 P(sym(inner(2 x))) = 2 P(inner(x) + inner(x)^T), inner linear
        xV = x @ V
        X = DaV.mT @ xV
        inner = (dmul(xV) * inv - DaV @ ((X + X.mT) * L)) @ V.mT
        return 2 * P(inner + inner.mT)

    return hvp, DaV, V


def _eigen_cg(pic: GramPicture, a, V, s, rtol, cg_steps: int, dtype, stop: float | None = None, mu=None,
              grad_dtype=None, DaV=None, in_eigenbasis: bool = False):
    """``newton_track``'s Newton direction where W^T W = c I and P is the identity (Stiefel: ``eigenbasis``), by
    conjugate gradients in N's eigenbasis. There the Hessian's first term, 2 (x N^{-1/2} + N^{-1/2} x) c, is
    diagonal: x_ij -> 2 c (1/s_i + 1/s_j) x_ij, so its exact inverse is the preconditioner (where the Jacobi
    one, the diagonal of that term in the weights' basis, is not). With A_hat = V^T D a V (formed once) the
    gradient is A_hat diag(1/s) + its transpose and a Hessian-vector product is 2 (I + I^T),
    I = c x diag(1/s) - A_hat ((A_hat^T x + x A_hat) o L), L the Daleckii-Krein matrix of ``_hvp``: two n x n
    products a CG step (four in ``_hvp``), two more to bring x back. ``stop`` (the exact mode, which may read the
    host): end early once every residual's squared norm is below ``stop`` times its first. ``mu`` (per matrix; the
    exact mode's Levenberg-Marquardt damping, ``newton_solve``): solve (Hess f + mu H1) x = -grad f instead, H1 the
    first term, whose inverse then preconditions with the factor 1 + mu. ``grad_dtype`` (the exact mode: float64):
    the gradient's own precision where it differs from the products' (a sum of terms of order one that cancel to the
    gap near the optimum: measured, formed in float32 it is rounding once the gap is below ~1e-5, and the exact mode
    stalled there on Stiefel). ``DaV``: D a V, where the caller has formed it (``cold_newton_eigenbasis``: one product
    fewer). Returns x in the weights' basis, in ``dtype``, or with ``in_eigenbasis`` V^T x V (two products fewer)."""
    sc, L, inv = _dk_setup(s, dtype)
    Vd = V.to(dtype)
    c = torch.diagonal(pic.D, dim1=-2, dim2=-1).mean(-1).to(dtype)[..., None, None]
    gd = dtype if grad_dtype is None else grad_dtype
    Vg = V.to(gd)
    Ah = Vg.mT @ ((pic.dmul(a).to(gd) @ Vg) if DaV is None else DaV.to(gd))
    Y = Ah * inv_sqrt(s, rtol).to(gd).unsqueeze(-2)
    r = -(Y + Y.mT).to(dtype)  # -grad f, in the eigenbasis
    Ah = Ah.to(dtype)
    jac = _first_term_divisor(pic, sc, dtype)

    if mu is not None:  # Levenberg-Marquardt: mu times the first term, which is jac * x in this basis
        mu = mu.to(dtype)[..., None, None]
        jac_mu = jac * mu
        jac = jac * (1 + mu)

    def hvp(x):
        X = Ah.mT @ x
        inner = c * x * inv - Ah @ ((X + X.mT) * L)
        out = 2 * (inner + inner.mT)
        return out if mu is None else out + jac_mu * x

    x = _pcg(hvp, r, lambda r: r / jac, cg_steps, stop)
    return x if in_eigenbasis else Vd @ x @ Vd.mT


def _pcg(hvp, r, pre, steps: int, stop: float | None = None):
    """Preconditioned conjugate gradients on Hess [x] = r from x = 0, every matrix of the batch together: ``steps``
    steps (a matrix whose r^T z reaches 0 stops moving), or fewer with ``stop``, once every residual's squared
    norm is below ``stop`` times its first (a host read a step: the exact mode only). The residual after the last
    step is not formed (it would only make a direction that is never taken)."""
    x = torch.zeros_like(r)
    z = pre(r)
    p = z
    rz = (r * z).sum((-2, -1))
    rr0 = (r * r).sum((-2, -1))
    tiny = torch.finfo(r.dtype).tiny
    for k in range(steps):
        Ap = hvp(p)
        curv = (p * Ap).sum((-2, -1))
        alpha = torch.where((curv > 0) & (rz > 0), rz / curv.clamp_min(tiny), 0)
        x = x + alpha[..., None, None] * p
        if k + 1 == steps:
            break
        r = r - alpha[..., None, None] * Ap
        if stop is not None and not bool(((r * r).sum((-2, -1)) > stop * rr0).any()):
            break
        z = pre(r)
        rz_new = (r * z).sum((-2, -1))
        p = z + torch.where(rz > 0, rz_new / rz.clamp_min(tiny), 0)[..., None, None] * p
        rz = rz_new
    return x


def newton_track(pic: GramPicture, Lambda, t, cg_steps: int, rtol, dtype=torch.float32, eig_dtype=torch.float64,
                 precondition: bool = True, eigenbasis: bool = False, one_eigh: bool = False):
    """The lean solve's Newton tracker (``lean_solve(tracker="newton")``): from the carried multiplier ``Lambda``,
    one Newton step on the dual f(Lambda) = ||G + 2 W Lambda||_*, damped by ``t`` (per matrix), then the
    certificate at the new multiplier. Returns (A, value, bound, A^T A, Lambda', t'), A the certificate's
    candidate at Lambda + t x.

    One eigendecomposition of N = Z^T Z at ``Lambda`` (in ``eig_dtype``, float64: it gives f(Lambda), the
    gradient and the Hessian's eigenbasis; measured, a float32 one resolves N's small eigenvalues too coarsely
    for the gradient, and on a fixed G the tracker then stalls at a gap of ~3e-4 with its damping collapsing,
    where in float64 it reaches 1e-6; measured again by the benchmark ``step_budget``, chapter 04: on its moving
    streams at width 128 a float32 one settles as close for a few per cent less time and closes no ratio, at
    768 x 2304 on DGram it settles about twice as far from the optimum, and on one momentum on Stiefel it stalls
    near 1e-2 where float64 reaches 2e-6), ``cg_steps`` conjugate-gradient steps on Hess f [x] = -grad f (``_hvp``:
    four n x n products each, in ``dtype``, float32: the step only has to be a good direction; a fixed number,
    no test on the host; Jacobi-preconditioned, or with ``eigenbasis`` (Stiefel) in N's eigenbasis with the
    exact inverse of the Hessian's first term, ``_eigen_cg``: measured, on a fixed gradient one such CG step
    converges to a gap of ~1e-6 where one Jacobi-preconditioned step stalls near 0.1 at n >= 32), and the
    float64 certificate at Lambda + t x (one eigh, one eigvalsh). Without a host read of its own the damping
    adapts per matrix: where the certified bound fell
    below f(Lambda) the new multiplier is carried and t doubles (to at most 1), elsewhere the old one is kept
    and t halves (an undamped step from the carried multiplier diverged in a prototype: chapter 04). Measured
    on the benchmark ``solver_table``'s stationary stream (chapter 04), not proven: the settled e_W on GPT-2
    small's DGram shapes is 0.32-0.37x Muon's own from ``NEWTON_START``'s start (0.57-0.63x from the tangent
    projection's multiplier), where one ADMM iteration's is 0.62-0.68x. ``bound`` is the
    certificate's own (float64) bound, so the relative gap it gives is a certificate.

    ``one_eigh`` (``lean_solve(tracker="newton_dk")``): the same Newton step, then the candidate and the bound at the
    new multiplier from the carried multiplier's eigendecomposition (``first_order_certificate``) instead of a
    second one: one eigendecomposition and one float32 eigvalsh a step, and three n x n products more."""
    a = pic.K0 + 2 * Lambda
    N = _sym(a.mT @ pic.dmul(a) + pic.R)
    V, s = eig_sqrt(N.to(eig_dtype))
    V, s = V.to(N.dtype), s.to(N.dtype)
    x = newton_direction(pic, a, V, s, rtol, cg_steps, dtype, precondition, eigenbasis)
    x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)  # an overflow (a G far from unit scale) moves nothing
    Lambda1 = Lambda + t[..., None, None] * x.to(Lambda.dtype)  # x is in P's range (grad f and Hess f [.] are)
    if one_eigh:
        A, value, bound, AtA = first_order_certificate(pic, Lambda1, V, rtol)
    else:
        A, value, bound, AtA, _ = certificate(pic, Lambda1, None, rtol, fast=True, with_gram=True)
    Lambda, t = damped(bound < s.sum(-1), Lambda1, Lambda, t)
    return A, value, bound, AtA, Lambda, t


def damped(fell, Lambda1, Lambda, t):
    """The Newton tracker's damping rule, per matrix: where the certified bound at Lambda1 fell below the dual value
    at the carried Lambda (``fell``), carry Lambda1 and double t (to at most 1); elsewhere keep Lambda and halve t.
    The bound is at least f(Lambda1), so a multiplier is carried only where the dual fell."""
    return torch.where(fell[..., None, None], Lambda1, Lambda), torch.where(fell, (2 * t).clamp_max(1), 0.5 * t)


def _first_order_factor(inner, m, rtol):
    """N1^{-1/2} to first order in V's basis (``first_order_certificate``, ``cold_newton_eigenbasis``): ``inner``, the
    first-order off-diagonal terms -M / den, with diag(1/m) on its diagonal, written in place. A direction
    numerically null at the new multiplier (m_i <= rtol max m, which ``inv_sqrt`` maps to 0) takes no first-order
    term either: there den is floored, and the term would carry float32 C's rounding (C^T W ~ 1e-7, not 0) into A at
    1/floor (seen on a rank-2 momentum from Lambda = 0: a direction 0.04 off the tangent space,
    tests/test_lean_step.py)."""
    iv = inv_sqrt(m, rtol)
    live = iv > 0
    inner.masked_fill_(~(live.unsqueeze(-1) & live.unsqueeze(-2)), 0)
    inner.diagonal(dim1=-2, dim2=-1).copy_(iv)
    return inner


def first_order_certificate(pic: GramPicture, Lambda1, V, rtol, first_order: bool = True, about=None):
    """(A, value, bound, A^T A) at the multiplier ``Lambda1`` from the eigenvectors V of N = Z^T Z taken at another
    multiplier (the carried one: ``newton_track(one_eigh=True)``), with no eigendecomposition of its own.

    With N1 = Z1^T Z1 at Lambda1 and M = V^T N1 V (two n x n products, float64):
    - bound: sum_i sqrt(M_ii) >= tr N1^{1/2} = ||Z1||_* = f(Lambda1) for any orthonormal V (Schur-Horn: M's diagonal
      is majorized by N1's eigenvalues, and the sum of a concave function is larger on the majorized vector; equality
      where V is N1's eigenbasis), so the relative gap it gives is a certificate however far Lambda1 is from where V
      was taken;
    - candidate: Z1 N1^{-1/2}, with N1^{-1/2} to first order about diag(M) in V's basis,
      V [diag(1/m) - offdiag(M) / den] V^T, m_i = sqrt(M_ii) and den the Daleckii-Krein denominators of m
      (``_dk_denominator``: the derivative of N^{-1/2} at diag(M), applied to M's off-diagonal part), made feasible as
      every candidate is (``feasible``: tangent part, op-norm in float32 with its margin), so its value is a lower
      bound on the optimum whatever the first-order error. About diag(M), not about N's own eigenvalues s^2 (the two
      agree to first order in the step): M is positive semi-definite, so |M_ij| <= m_i m_j, and the first-order part
      of Z1 V [...] in V's basis, sum_i (Z1 v_i) M_ij / den_ij with ||Z1 v_i|| = m_i, has terms of size at most
      m_i^2 m_j / (m_i m_j (m_i + m_j)) < 1; about s, a direction that N had near null and the step filled
      (m_i >> s_i) blows its terms up (chapter 04 measures both on DGram streams of rank-4 momenta: about s the
      candidate certified nothing at nearly every step; ``tests/test_lean_step.py``). ``about`` (N's singular values
      s at the carried multiplier): expand about s^2 instead, the first version (2026-12-06), kept for that
      comparison. ``first_order=False`` drops the off-diagonal term (the Ritz candidate V diag(1/m) V^T, kept for the
      benchmark ``step_budget``'s comparison).
    Three n x n products more than the certificate's own (M's two, the candidate's factor V inner V^T where the
    certificate's takes one), and no eigendecomposition where the certificate takes one."""
    a1 = pic.K0 + 2 * Lambda1
    M = _sym(V.mT @ (a1.mT @ pic.dmul(a1) + pic.R) @ V)
    d = M.diagonal(dim1=-2, dim2=-1).clamp_min(0)
    m = d.sqrt()
    bound = m.sum(-1)
    inner = -M / _dk_denominator(_floored(m if about is None else about)) if first_order else torch.zeros_like(M)
    Y = V @ _first_order_factor(inner, m, rtol) @ V.mT
    A, value, AtA = feasible(pic, Span(a1 @ Y, Y), 0, fast=True, with_gram=True)
    return A, value, bound, AtA


def cold_newton_eigenbasis(pic: GramPicture, t, cg_steps: int, rtol, dtype=torch.float32):
    """``lean_solve(tracker="newton_cold", eigenbasis=True)`` (Stiefel, the lean default on long weights): the cold
    Newton step from Lambda = 0 and its first-order certificate (``newton_track(one_eigh=True)`` from zero, the same
    mathematics) with the step never taken out of N's eigenbasis. Returns (A, value, bound, A^T A, Lambda').

    With N = K0^T D K0 + R = V diag(s^2) V^T (one float64 eigh) and the Newton direction V x V^T (``_eigen_cg`` in the
    eigenbasis, x symmetric), the multiplier Lambda1 = t V x V^T has a1 V = K0 V + 2 t V x, and since V^T N V =
    diag(s^2) and V^T R V = diag(s^2) - (K0 V)^T D (K0 V),
    M = V^T N1 V = diag(s^2) + 2 t (Q^T V x + (V x)^T Q) + 4 t^2 (V x)^T D (V x),  Q = D K0 V.
    The bound reads only M's diagonal, formed elementwise in float64 from Q and V x (both float64 products), so the
    certificate is as honest as ``first_order_certificate``'s (whose V^T N1 V carries float64 rounding of the same
    size: eigh's residual here); M's off-diagonal part, which only shapes the candidate, and the candidate's factors
    (Y = V inner V^T, a1 Y = (K0 V + 2 t V x) inner V^T) are float32 products (float64 for a float64 weight), the
    candidate made feasible in float64 as every candidate is (``feasible``), so its value stays a lower bound. The
    returned multiplier t V x V^T is formed in the same precision, as information (the cold step carries nothing).
    Small products: N, K0 V, V^T Q (the CG's A_hat), the CG's two a step, V x, Q^T V x, (V x)^T D V x, inner V^T,
    V (inner V^T), (a1 V) (inner V^T), (V x) V^T, then ``feasible``'s three: 15 at one CG step, 6 of them float64,
    where ``newton_track`` and ``first_order_certificate`` take 16, 10 of them float64 (the weights' basis round
    trips of x and of M; ``manifold_muon.opcount``, ``tests/test_lean_step.py``). Why it matters: on a GPU made for
    training a float64 product runs at 1/32 to 1/2 of float32's rate; on one CPU thread the solve is a few per cent
    faster at width 128 and about a tenth at GPT-2 small's rectangular shapes (the benchmark
    ``solver_table.cold_eigenbasis``, chapter 04)."""
    f64 = pic.D.dtype
    pd = torch.float64 if pic.W.dtype == torch.float64 else dtype
    N = _sym(pic.K0.mT @ pic.DK0 + pic.R)
    V, s = eig_sqrt(N.to(torch.float64))
    V, s = V.to(f64), s.to(f64)
    K0V = pic.K0 @ V
    Q = pic.dmul(K0V)  # D K0 V
    x = _eigen_cg(pic, pic.K0, V, s, rtol, cg_steps, dtype, DaV=Q, in_eigenbasis=True)
    x = _sym(torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)).to(f64)  # an overflow moves nothing
    tf = t.to(f64)
    tt = tf[..., None, None]
    Vx = V @ x
    DVx = pic.dmul(Vx)
    diag = s * s + 4 * tf[..., None] * (Q * Vx).sum(-2) + 4 * (tf * tf)[..., None] * (Vx * DVx).sum(-2)
    m = diag.clamp_min(0).sqrt()
    bound = m.sum(-1)
    # the off-diagonal part, in the products' precision from here on (it only shapes the candidate; its products were
    # already there): M's off-diagonal terms, divided by the Daleckii-Krein denominators in place
    Vxp, Vp = Vx.to(pd), V.to(pd)
    QVx = Q.to(pd).mT @ Vxp
    tp = tf.to(pd)[..., None, None]
    inner = torch.addcmul(QVx + QVx.mT, Vxp.mT @ DVx.to(pd), 2 * tp)  # M / (2t)
    inner.mul_(-2 * tp).div_(_dk_denominator(_floored(m, pd)))  # -M / den
    B = _first_order_factor(inner, m, rtol) @ Vp.mT
    a1V = torch.addcmul(K0V, Vx, 2 * tt).to(pd)
    A, value, AtA = feasible(pic, Span((a1V @ B).to(f64), (Vp @ B).to(f64)), 0, fast=True, with_gram=True)
    # the multiplier t V x V^T, or 0 where the step did not lower the bound (``damped``'s rule from zero)
    L = Vxp @ Vp.mT
    Lambda = ((L + L.mT) * torch.where(bound < s.sum(-1), 0.5 * tf, 0).to(pd)[..., None, None]).to(f64)
    return A, value, bound, AtA, Lambda


def newton_direction(pic: GramPicture, a, V, s, rtol, cg_steps: int, dtype=torch.float32, precondition: bool = True,
                     eigenbasis: bool = False):
    """``newton_track``'s Newton direction at a = K0 + 2 Lambda from the eigendecomposition (V, s) of N = Z^T Z:
    ``cg_steps`` conjugate-gradient steps on Hess f [x] = -grad f in ``dtype``, Jacobi-preconditioned (or
    unpreconditioned), or with ``eigenbasis`` in N's eigenbasis (``_eigen_cg``)."""
    if eigenbasis:
        return _eigen_cg(pic, a, V, s, rtol, cg_steps, dtype)
    hvp, DaV, Vt = _hvp(pic, a, V, s, dtype)
    grad = 2 * pic.P(_sym((DaV * inv_sqrt(s, rtol).to(dtype).unsqueeze(-2)) @ Vt.mT))
    pre = _jacobi(pic, Vt, s, dtype) if precondition else (lambda r: r)
    return _pcg(hvp, -grad, pre, cg_steps)


def _projector_kind(P, like) -> str | None:
    """"identity" (Stiefel) or "off" (DGram: the diagonal zeroed) where the multiplier space's projector ``P`` is one
    of the two, else None: read off P of the all-ones matrix (one host read)."""
    ones = torch.ones_like(like)
    Q = P(ones)
    if bool((Q == ones).all()):
        return "identity"
    if bool((Q == ones - torch.eye(ones.size(-1), dtype=ones.dtype, device=ones.device)).all()):
        return "off"
    return None


def _diagonal_cg(pic: GramPicture, a, V, s, grad, cg_steps: int, dtype, stop: float | None = None, mu=None):
    """The exact mode's Newton direction where W^T W is diagonal and P is the identity (a Stiefel point solved without
    ``eigenbasis``: the benchmark ``reference_times``' weights'-basis arm), with D taken as diag(d) in the Hessian
    (the gradient ``grad``, formed by the caller, has the whole D): the same system as ``_hvp``, preconditioned by
    the first term's exact inverse with D replaced by its mean c I (division by ``_first_term_divisor`` in N's
    eigenbasis), with every CG vector carried right-multiplied by V (X V for X; CG's inner products are the same, V
    being orthogonal; ``_eigen_cg``, in the eigenbasis, takes two products a step). With
    I = D p N^{-1/2} + D a d(N^{-1/2})[p] (``_hvp``'s inner), I V is two products from p V, (I + I^T) V =
    I V + V (V^T I V)^T two more, and the preconditioner's V ((V^T r V) / den) two: six a step. Returns x in the
    weights' basis, in ``dtype``."""
    sc, L, inv = _dk_setup(s, dtype)
    d = torch.diagonal(pic.D, dim1=-2, dim2=-1).to(dtype).unsqueeze(-1)
    den = _first_term_divisor(pic, sc, dtype)
    first = inv
    if mu is not None:
        m1 = (1 + mu.to(dtype))[..., None, None]
        den, first = den * m1, inv * m1
    Vd = V.to(dtype)
    DaV = (d * a.to(dtype)) @ Vd

    def hvp(pV):
        X = DaV.mT @ pV
        IV = d * pV * first - DaV @ ((X + X.mT) * L)
        return 2 * (IV + Vd @ (Vd.mT @ IV).mT)

    return _pcg(hvp, -(grad.to(dtype) @ Vd), lambda rV: Vd @ ((Vd.mT @ rV) / den), cg_steps, stop) @ Vd.mT


def _congruence_e(pic: GramPicture, dtype):
    """E = D^{-1/2} as a column (d floored at 1e-6 of its largest: a zero column of W), in ``dtype``."""
    dd = torch.diagonal(pic.D, dim1=-2, dim2=-1)
    return torch.maximum(dd, 1e-6 * dd.amax(-1, keepdim=True)).rsqrt().to(dtype).unsqueeze(-1)


def _congruence_basis(pic: GramPicture, V, s, dtype):
    """(q, Vt), the eigendecomposition of Qt = E N^{-1/2} E (``_congruence_cg``'s preconditioner) from N's (V, s),
    in ``dtype``: one n x n product and one eigh (N^{-1/2} from the floored roots, ``_floored``, as the Newton
    helpers take it)."""
    inv = (1.0 / _floored(s, dtype)).unsqueeze(-2)
    e, Vd = _congruence_e(pic, dtype), V.to(dtype)
    return torch.linalg.eigh(_sym(e * ((Vd * inv) @ Vd.mT) * e.mT))


def _congruence_cg(pic: GramPicture, a, V, s, grad, cg_steps: int, dtype, stop: float | None = None, mu=None,
                   basis=None):
    """The exact mode's Newton direction where W^T W = D = diag(d) and P zeroes the diagonal (DGram): the
    same damped system as ``_hvp``'s, (Hess f + mu H1) x = -``grad``, preconditioned by the exact inverse of its first
    term H1 (where ``_diagonal_cg`` replaces D by its mean), seven n x n products a CG step and one eigendecomposition
    (in ``dtype``: float32 in the exact mode) a call not given ``basis``.

    Why it is exact. With E = D^{-1/2} and the congruence x = E y E (which keeps a symmetric matrix with a zero
    diagonal one: P commutes with it, D being diagonal), the first term H1(x) = 2 P(D x Q + Q x D), Q = N^{-1/2},
    becomes E H1(E y E) E = 2 P(y Qt + Qt y) with Qt = E Q E (E D E = I). In Qt's
    eigenbasis (Qt = Vt diag(q) Vt^T, one eigh) that is the division of Vt^T y Vt by 2 (q_i + q_j), then P: the
    preconditioner of the system in y, E (Hess f + mu H1)(E y E) E = -E grad E, and it is H1's exact inverse on the
    diagonal-free matrices up to P's coupling (as ``_diagonal_cg``'s is where D = c I). Measured (2026-12-06, one
    thread, the benchmark's warm stream, scratch probes): at 384 x 1152 and 768 x 2304 on DGram (d from 0.25 to 4) it
    takes 39 and 43 CG steps to ``newton_solve``'s gap where D replaced by its mean took 65 and 67 (as many as a
    DGram system with D = I takes, 39 at 384: D's spread is then free); the solve, interleaved with the old one
    (medians), 0.89 s against 0.96 s and 6.7 s against 7.1 s. On ``tests/test_lean_step.py``'s damped systems (D
    from 0.25 to 4, tall, wide and square) it reaches a relative residual of 1e-8 in 15-28 CG steps where D's mean
    took 47-79.

    How the products are spent. Every direction is carried as E y Vt (x = E y E), the residual in Qt's eigenbasis
    (r = Vt^T r_y Vt). With B = Vt^T E V (once), x V = (E y Vt) B (one product) gives I V, I = D x Q +
    D a d(N^{-1/2})[x] (``_hvp``'s inner; two products: Daleckii-Krein in N's eigenbasis), and the curvature
    4 <x V, I V> (x in P's range); the residual's update Vt^T P(E (I + I^T) E) Vt = H + H^T - 2 Vt^T diag(e^2 diag(I))
    Vt, H = (E Vt)^T (I V) B^T, takes three (diag(I) is the row sums of (I V) o V); the preconditioned residual's
    E z Vt = E Vt z_hat - diag(Vt z_hat Vt^T) E Vt, z_hat = r / den, one (P in that layout is a row scaling).
    E is D^{-1/2} with d floored at 1e-6 of its largest: any positive E is an exact change of variables, and where a
    column of W is zero (d_i = 0) the preconditioner is then exact everywhere but there (a zero column certifies
    as another does: ``tests/test_lean_step.py``). ``basis``: Qt's eigendecomposition (``_congruence_basis``) where
    the caller has one, possibly from an earlier N: any orthonormal basis and positive q keep the preconditioner
    positive definite, so a stale one costs CG steps, never correctness (``newton_solve`` takes it again after a
    step that moved f by more than ``BASIS_REFRESH``). Returns x = E y E in the weights' basis, in ``dtype``."""
    sc, L, inv = _dk_setup(s, dtype)
    e = _congruence_e(pic, dtype)
    d = torch.diagonal(pic.D, dim1=-2, dim2=-1).to(dtype).unsqueeze(-1)
    Vd = V.to(dtype)
    q, Vt = _congruence_basis(pic, V, s, dtype) if basis is None else basis
    den = 2 * (q.unsqueeze(-1) + q.unsqueeze(-2))
    first = inv
    if mu is not None:
        m1 = (1 + mu.to(dtype))[..., None, None]
        den, first = den * m1, inv * m1
    B = Vt.mT @ (e * Vd)
    DaV = (d * a.to(dtype)) @ Vd
    dfirst, eVt, e2 = d * first, e * Vt, e * e

    def zE_of(zh):  # E P(Vt zh Vt^T) Vt; diag(Vt zh Vt^T) = rowsums((E Vt zh) o Vt) / e
        VZ = eVt @ zh
        return VZ - (VZ * Vt).sum(-1, keepdim=True) * Vt

    r = -(Vt.mT @ ((e * grad.to(dtype) * e.mT) @ Vt))
    y = torch.zeros_like(r)  # carried as E y Vt (x = E y E), as every direction
    zh = r / den
    pE = zE_of(zh)
    rz = (r * zh).sum((-2, -1))
    rr0 = (r * r).sum((-2, -1))
    tiny = torch.finfo(r.dtype).tiny
    for k in range(cg_steps):
        xV = pE @ B
        X = DaV.mT @ xV
        IV = dfirst * xV - DaV @ ((X + X.mT) * L)
        curv = 4 * (xV * IV).sum((-2, -1))
        alpha = torch.where((curv > 0) & (rz > 0), rz / curv.clamp_min(tiny), 0)[..., None, None]
        y = torch.addcmul(y, alpha, pE)
        if k + 1 == cg_steps:
            break
        H = eVt.mT @ (IV @ B.mT)
        Ap = torch.sub(H + H.mT, Vt.mT @ ((e2 * (IV * Vd).sum(-1, keepdim=True)) * Vt), alpha=2)
        r = torch.addcmul(r, -2 * alpha, Ap)
        if stop is not None and not bool(((r * r).sum((-2, -1)) > stop * rr0).any()):
            break
        zh = r / den
        rz_new = (r * zh).sum((-2, -1))
        pE = torch.addcmul(zE_of(zh), torch.where(rz > 0, rz_new / rz.clamp_min(tiny), 0)[..., None, None], pE)
        rz = rz_new
    return (y @ Vt.mT) * e.mT


def _jacobi(pic: GramPicture, V, s, dtype, mu=None):
    """Jacobi on the first term of the Hessian, 2 P(D x N^{-1/2} + N^{-1/2} x D): division by its diagonal (times
    1 + mu, where ``mu`` damps, as in ``_hvp``), from N's eigenvectors V (in ``dtype``)."""
    d = torch.diagonal(pic.D, dim1=-2, dim2=-1).to(dtype)
    V = V.to(dtype)
    nih = (V * V / _floored(s, dtype).unsqueeze(-2)).sum(-1)  # diag(N^{-1/2})
    jac = 2 * (d.unsqueeze(-1) * nih.unsqueeze(-2) + nih.unsqueeze(-1) * d.unsqueeze(-2))
    if mu is not None:
        jac = jac * (1 + mu.to(dtype)[..., None, None])
    return lambda r: r / jac


# ====================================================================== the exact mode: Newton on the dual
#
# With Z = W a + C, a = K0 + 2 Lambda (the Gram picture), the dual is f(Lambda) = ||Z||_* = tr N^{1/2},
# N = a^T D a + R. Where N is positive definite f is smooth:
#     grad f = 2 P(sym(D a N^{-1/2}))                    (= H, the tangent violation of msign(Z))
#     d grad = 2 P(sym(D da N^{-1/2} + D a d(N^{-1/2}))),  da = 2 dLambda,  dN = da^T D a + a^T D da,
# and, in the eigenbasis N = V diag(s^2) V^T, d(N^{-1/2}) = V [-(V^T dN V)_ij / (s_i s_j (s_i + s_j))] V^T
# (Daleckii-Krein). So a Hessian-vector product is five n x n products, and Newton's system is solved by
# conjugate gradients (the Hessian is positive semi-definite: f is convex).


def _dual_value(pic: GramPicture, Lambda):
    """f(Lambda) = ||G + 2 W Lambda||_* (one eigvalsh)."""
    a = pic.K0 + 2 * Lambda
    return torch.linalg.eigvalsh(_sym(a.mT @ pic.dmul(a) + pic.R)).clamp_min(0).sqrt().sum(-1)


LM_START = 1.0  # the exact mode's first Levenberg-Marquardt damping (``newton_solve``: why 1)
LM_TRIES = 8  # directions tried a Newton step before the multiplier stays where it is for that step
FORCING_MIN, FORCING_MAX = 1e-12, 1e-2  # CG's squared relative residual in the exact mode: the gap, clamped
BASIS_REFRESH = 1e-4  # DGram's preconditioner basis is taken again after a step that lowered f by more (relative)


def newton_solve(W, G, P, warm=None, tol=1e-8, steps=40, cg_steps=40, normalize=True,
                 eigenbasis: bool = False, cg_dtype=torch.float32) -> GramSolve:
    """The exact mode's engine: Newton-CG on the dual (see above), in float64, damped by Levenberg-Marquardt, from
    ``warm`` (a previous solve's (Lambda, U)) or the cold tangent-projection start, until the certified relative gap
    is <= ``tol`` or after ``steps`` Newton steps.

    Each step: the certificate's msign candidate from the current eigendecomposition (one eigvalsh for its op-norm);
    a direction by at most ``cg_steps`` conjugate-gradient steps on (Hess f + mu H1) x = -grad f, H1 the Hessian's
    first term (positive definite on P's range); then one eigh at Lambda + x, which gives f there and is the next
    step's eigendecomposition. Where f did not fall (to rounding) the step is not taken and mu grows 4x (up to
    ``LM_TRIES`` directions a step); where it fell mu shrinks 4x, so that near the optimum the step is Newton's and
    converges quadratically where Z* has full rank. CG stops once its squared relative residual is below the
    current gap (clamped to [``FORCING_MIN``, ``FORCING_MAX``] = [1e-12, 1e-2]: an inexact Newton method's forcing
    term, the relative residual the gap's square root, loose far from the optimum and tight near it). CG's products
    are in ``cg_dtype`` (float32: the direction only has to be a good one, the gradient is formed in float64 and the
    direction is put back into P's range exactly), with ``eigenbasis`` (W^T W = c I and P the identity: Stiefel) in
    N's eigenbasis, preconditioned by the exact inverse of the damped first term (``_eigen_cg``, two n x n products
    a CG step); where W^T W = D is diagonal and P keeps the off-diagonal part (DGram), by the exact inverse of the
    damped first term with D's spread, through the congruence x = D^{-1/2} y D^{-1/2} (``_congruence_cg``, seven
    products a CG step and one float32 eigendecomposition, taken again only after a step that lowered f by more than
    ``BASIS_REFRESH`` = 1e-4 relative: measured at 768 x 2304 along the benchmark's stream, a basis kept from the
    second direction on took the CG steps of a fresh one at every direction, one kept from the first took 30% more
    and a Newton step more; D replaced by its mean, ``_diagonal_cg``'s preconditioner, took 1.6 times the CG steps,
    measured there); where W^T W is diagonal and P the identity without
    ``eigenbasis``, by the latter (``_diagonal_cg``, six); elsewhere (Oblique) ``_hvp`` (five with a full D)
    preconditioned by the first term's diagonal (``_jacobi``).

    Why these settings (2026-12-06, measured on one CPU thread, not in the book): at 384 x 1152 from the last step's
    multiplier, on DGram the forcing term at the gap itself (the relative residual the gap) took 84 CG steps in 6
    Newton steps and 2.2 s, its square root 53 in the same 6 and 1.6 s; float32 products took that to 1.1 s, and
    carrying X V instead of X (a CG step from eight products to six) to 0.9 s, the same Newton steps. A looser forcing
    term (the gap's fourth root) took more Newton steps (15) than it saved CG steps.

    Why the damping (2026-12-06): from the last optimizer step's multiplier at 768 x 2304 on Stiefel, the pure Newton
    direction with a backtracking line search on f (this solve until then) crept for ten steps, the gap from 0.16 to
    0.08 (N's small singular values make the second term nearly cancel the first in a few directions, so the full
    step overshoots there), then converged in three: thirteen steps. Damped from mu = ``LM_START`` = 1 it took six,
    every one accepted. Where Z* is rank-deficient (square DGram and Oblique: f is not smooth there) it stays a
    descent method. Returns the best certified candidate (the reported gap is a certificate)."""
    if W.dtype != torch.float64:
        W, G = W.double(), G.double()
    Wt, Gt, wide = _tall_unit(W, G, normalize, views=True)
    pic = gram_picture(Wt, Gt, P, torch.float64)
    if warm is None:
        S = pic.DK0
        Lambda = -0.5 * multiplier(pic, S + S.mT)
    else:
        Lambda = warm[0].to(torch.float64)

    def at(Lambda):  # (a, V, s, f) at a multiplier: one eigh
        a = pic.K0 + 2 * Lambda
        lam, V = torch.linalg.eigh(_sym(a.mT @ pic.dmul(a) + pic.R))
        s = lam.clamp_min(0).sqrt()
        return a, V, s, s.sum(-1)

    a, V, s, f = at(Lambda)
    mu = torch.full_like(f, LM_START)
    # CG off the eigenbasis: where W^T W is diagonal to float32's rounding (a DGram or Stiefel point in float64; the
    # picture's own test uses W's epsilon) and P is the identity, ``_diagonal_cg``; where P zeroes the diagonal,
    # ``_congruence_cg``; elsewhere (Oblique: P keeps the diagonal, and W^T W is far from diagonal) ``_hvp`` with
    # Jacobi. (Host reads.)
    d = pic.D.diagonal(dim1=-2, dim2=-1)
    off = torch.linalg.matrix_norm(pic.D - torch.diag_embed(d))
    near = bool((off <= 1e-4 * torch.linalg.vector_norm(d, dim=-1)).all())
    kept = _projector_kind(P, pic.D) if near else None
    near = kept is not None
    best_A, best_gap = None, None
    basis = None
    iterations = torch.zeros(pic.D.shape[:-2], dtype=torch.long, device=pic.D.device)
    for it in range(steps + 1):
        Y = (V * inv_sqrt(s, 1e-10).unsqueeze(-2)) @ V.mT
        Z = Span(a @ Y, Y)  # msign(G + 2 W Lambda)'s coefficients
        A, value = feasible(pic, Z)
        gap = _relative_gap(value, f)
        if best_A is None:
            best_A, best_gap = A, gap
        else:
            best_A, best_gap = _keep(gap < best_gap, (A, gap), (best_A, best_gap))
        if it == steps or bool((best_gap <= tol).all()):
            break
        moving = best_gap > tol
        iterations = iterations + moving
        grad = None if eigenbasis else 2 * P(_sym(pic.dmul(Z.a))).to(cg_dtype)  # D a Y: a row scaling (DGram)
        stop = best_gap.clamp(FORCING_MIN, FORCING_MAX)  # CG's squared relative residual: the gap, clamped
        for _ in range(LM_TRIES):
            if eigenbasis:  # (it forms the gradient in the eigenbasis itself)
                x = _eigen_cg(pic, a, V, s, 1e-10, cg_steps, cg_dtype, stop=stop, mu=mu, grad_dtype=torch.float64)
            elif near and kept == "off":
                if basis is None:
                    basis = _congruence_basis(pic, V, s, cg_dtype)
                x = _congruence_cg(pic, a, V, s, grad, cg_steps, cg_dtype, stop, mu, basis)
            elif near:
                x = _diagonal_cg(pic, a, V, s, grad, cg_steps, cg_dtype, stop, mu)
            else:
                hvp, _, _ = _hvp(pic, a, V, s, cg_dtype, mu=mu)
                x = _pcg(hvp, -grad, _jacobi(pic, V, s, cg_dtype, mu), cg_steps, stop)
            # back into P's range exactly: a direction formed by products in float32 (V x V^T) is symmetric and
            # P-projected only to its rounding, and a multiplier that took on that rounding kept it (no later step
            # sees a direction outside P's range): measured, the certified gap then stalled near 2e-9
            x = P(_sym(torch.nan_to_num(x.to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)))
            a1, V1, s1, f1 = at(Lambda + x)
            fell = moving & (f1 <= f * (1 + 1e-13))  # (NaN compares False: not taken)
            if bool((fell & (f - f1 > BASIS_REFRESH * f)).any()):
                basis = None  # the preconditioner's basis is taken again at the new multiplier
            take = fell[..., None, None]
            Lambda, a, V = torch.where(take, Lambda + x, Lambda), torch.where(take, a1, a), torch.where(take, V1, V)
            s, f = torch.where(fell[..., None], s1, s), torch.where(fell, f1, f)
            mu = torch.where(fell, 0.25 * mu, torch.where(moving, 4 * mu, mu))
            moving = moving & ~fell
            if not bool(moving.any()):
                break
    U = Span(torch.zeros_like(pic.D), torch.zeros_like(pic.D))
    return GramSolve(best_A, pic, Lambda, U, best_gap, iterations, wide)


# ====================================================================== the exact mode on square weights: SSN-ALM
#
# Square DGram and Oblique optima are mostly rank-deficient (chapter 04, ``sec-exact-square``): Z* = G + 2 W Lambda*
# has singular values that vanish, f is not differentiable there, and Newton on f does not certify. The augmented
# Lagrangian method on the primal (Rockafellar's proximal method of multipliers on the dual) has an inner problem that
# stays smooth there. With W = Q R (square, R^T R = D) everything is n x n in R's coordinates: g = Q^T G = R K0, a
# primal candidate y = Q^T A, and for a multiplier Lambda the point X = y + sigma (g + 2 R Lambda). One outer step:
#     Lambda+ = argmin h(Lambda),  h = Moreau envelope of ||.||_* at X / sigma, grad h = P(R^T Pi(X) + Pi(X)^T R)
#     y+      = Pi(X(Lambda+)),    Pi: singular values clipped at 1 (the projection onto the unit op-norm ball)
# so y+ is in the ball and, where grad h = 0, tangent: the primal candidate is feasible by construction and the dual
# bound is ||g + 2 R Lambda+||_*. The inner problem is solved by semismooth Newton-CG: Pi's generalised Jacobian at
# X = U diag(s) V^T is dPi[H] = U (Omega1 o sym(U^T H V) + Omega2 o skew(U^T H V)) V^T, Omega1_ij = (f_i - f_j) /
# (s_i - s_j), Omega2_ij = (f_i + f_j) / (s_i + s_j), f = min(s, 1): entries in [0, 1], bounded where the
# rank-deficiency makes the Hessian of f itself blow up (1 / s). Zhao, Sun and Toh (2010, SDPNAL) for the method.

ALM_STEPS = 60  # the exact mode's outer steps on a square weight (``exact_solve``)
ALM_SIGMA = (1.0, 1.5, 100.0)  # the penalty: first value, growth a step, cap (``alm_solve``: measured there)
ALM_CG32 = 1e-6  # the inner target below which CG's products are float64
# the exact mode from a warm start on a square weight whose multiplier is diagonal (Oblique): ``alm_solve`` at this
# fixed penalty first, at most this many outer steps (``exact_solve``: why, and why not on DGram)
ALM_WARM_PENALTY, ALM_WARM_STEPS = 1000.0, 20
ALM_FORCING = 0.05  # the inner solve stops at ||grad h|| <= this times the last outer step's ||y+ - y||


def _alm_omegas(s):
    """(Omega1 + Omega2) / 2 and (Omega1 - Omega2) / 2 of the clipped singular values (see above), so that
    dPi's middle factor is Op o M + Om o M^T."""
    f = s.clamp_max(1)
    si, sj = s.unsqueeze(-1), s.unsqueeze(-2)
    fi, fj = f.unsqueeze(-1), f.unsqueeze(-2)
    diff, total = si - sj, si + sj
    inside = (s < 1).to(s.dtype)
    close = diff.abs() <= 1e-12 * total
    o1 = torch.where(close, 0.5 * (inside.unsqueeze(-1) + inside.unsqueeze(-2)),
                     (fi - fj) / torch.where(close, 1, diff))
    o2 = torch.where(total > 0, (fi + fj) / torch.where(total > 0, total, 1), 1.0)
    return 0.5 * (o1 + o2), 0.5 * (o1 - o2)


def _alm_at(y, sigma, g, RL):
    """(U, s, Vh, Pi(X), h's value up to a constant) at X = y + sigma (g + RL) (one SVD)."""
    X = y + sigma[..., None, None] * (g + RL)
    U, s, Vh = torch.linalg.svd(X)
    Pi = (U * s.clamp_max(1).unsqueeze(-2)) @ Vh
    h = ((s - 1).clamp_min(0).sum(-1) + 0.5 * (s.clamp_max(1) ** 2).sum(-1)) / sigma
    return U, s, Vh, Pi, h


def alm_solve(W, G, P, warm=None, tol=1e-8, steps=60, cg_steps=200, newton_steps=8, normalize=True,
              sigma=ALM_SIGMA) -> GramSolve:
    """The exact mode's engine on a square weight (see above): the semismooth-Newton augmented Lagrangian method, in
    float64, from ``warm`` = (Lambda, U) (a ``gram_solve``'s: its multiplier and its scaled ADMM multiplier U, a primal
    candidate, as a ``Span`` or the m x n matrix) or the cold start (the tangent projection's multiplier, y = 0), until
    the certified relative gap is <= ``tol`` or after ``steps`` outer steps. Each outer step: at most ``newton_steps``
    semismooth Newton steps on h until ||grad h|| <= ``ALM_FORCING`` times the last outer step's ||y+ - y||, each a
    conjugate-gradient solve (at most ``cg_steps`` steps of four n x n products, five or six where R is not taken as
    its diagonal; in float32 while the inner target is above ``ALM_CG32``; Jacobi-preconditioned where D is diagonal)
    and a backtracking line search on h (one SVD a try); then y+ = Pi(X), the penalty grows (``sigma`` = (first,
    growth, cap)), and the certificate: y+ made feasible (``feasible``: tangent part, then scaled into the ball; one
    eigvalsh) against the bound ||G + 2 W Lambda||_* from Z's singular values (one ``svdvals``; why not through
    Z^T Z: below). A matrix within ``tol`` stops moving. Returns the best certified candidate of each matrix (the gap
    is a certificate) and its (Lambda, U = y's coefficients) to warm-start from. Host reads: the exact mode's, a few
    an inner step. On a batch (one batch dimension: the optimizer batches weights of one shape) the outer steps run
    on the matrices not yet certified, and a line-search try's SVD is taken for the matrices still searching only
    (until 2026-12-07 every matrix took every SVD: a batch of four square Oblique weights warm-started at the fixed
    penalty took 316 and 240 SVDs at n = 16 and 32, against 237 and 132 for its matrices one by one; now 236 and
    135, ``tests/test_inner_solve.py``). The certificate is still taken on the whole batch each outer step.

    Measured (2026-12-07, one CPU thread, the benchmark's 128 x 128 draws, momenta 0 and 5, cold, through
    ``exact_solve``), against the path the exact mode took on square weights until then (eight Newton steps, then the
    Anderson fallback): to tol 1e-9, DGram in 1.6 s and 1.2 s, certified 4e-10 and 2e-10, where the old path stopped
    at 6e-8 and 2e-8 in 1.4 s and 1.3 s; Oblique in 0.16 s and 0.24 s, where the old path took 1.0 s and 1.4 s and
    the second stopped at 2.4e-6. To tol 1e-6, DGram in 0.86 s and 0.68 s (old: 1.05 s and 0.53 s), Oblique in 0.12 s
    and 0.18 s (old: 0.08 s, and 1.3 s stopping at 2.4e-6). The inner tolerance follows the last outer step, up and
    down: held to its least so far, DGram to 1e-6 took 1.44 s and 0.97 s; where a face of optima lets the candidate
    drift (a rank-2 gradient), the Anderson fallback takes over after it (``exact_solve``). The penalty schedule: growth
    1.5 to a cap of 100 from 1, chosen on DGram momentum 0 at 128 among first values 0.3 to 10, growths 1.3 to 2 and
    caps 30 to 1000 (0.84-3.3 s to 1e-6; larger penalties take fewer outer steps and more CG steps each)."""
    if W.size(-2) != W.size(-1):
        raise ValueError(f"alm_solve: square weights only (got {tuple(W.shape[-2:])}); a rectangular weight's optimum "
                         "is mostly full-rank: use newton_solve or exact_solve")
    if not (len(sigma) == 3 and 0 < sigma[0] <= sigma[2] and sigma[1] >= 1):
        raise ValueError(f"alm_solve: sigma must be (first > 0, growth >= 1, cap >= first), got {sigma!r}")
    if W.dtype != torch.float64:
        W, G = W.double(), G.double()
    Wt, Gt, wide = _tall_unit(W, G, normalize, views=True)
    pic = gram_picture(Wt, Gt, P, torch.float64)
    # W = Q R with the whole D (R^T R = D): where the picture takes D as diagonal (a DGram point), its off-diagonal
    # rounding (~1e-8 relative for a float32 weight) would otherwise be a floor of that size under the certified gap.
    # The ridge (float64's rounding of D) keeps R invertible where W has a zero column
    d = torch.diagonal(pic.D, dim1=-2, dim2=-1)
    ridge = torch.finfo(torch.float64).eps * d.amax(-1).clamp_min(1e-30)
    R = _cholesky(pic.D + ridge[..., None, None] * pic.eye()).mT
    to_y = lambda a: R @ a  # noqa: E731
    from_y = lambda y: torch.linalg.solve_triangular(R, y, upper=True)  # noqa: E731
    g = R @ pic.K0
    if warm is None:
        S = pic.DK0
        Lambda, y = -0.5 * multiplier(pic, S + S.mT), torch.zeros_like(g)
    else:
        Lambda = warm[0].to(torch.float64)
        y = to_y(_warm_span(pic, warm[1]).a) if warm[1] is not None else torch.zeros_like(g)

    def grad(R, Pi):
        S = R.mT @ Pi
        return P(S + S.mT)

    def norm(X):
        return torch.linalg.matrix_norm(X)

    batch = pic.D.shape[:-2]
    sig = torch.full(batch, float(sigma[0]), dtype=torch.float64, device=g.device)
    best_A, best_gap, best_Lambda, best_y = None, None, Lambda, y
    iterations = torch.zeros(batch, dtype=torch.long, device=g.device)
    stop_in = torch.full(batch, 1e-3, dtype=torch.float64, device=g.device)

    def inner(y, g, R, Lambda, sig, stop_in, moving):
        """One outer step's semismooth Newton steps on h (per matrix of the batch given): (Lambda, Pi(X))."""
        U, s, Vh, Pi, h = _alm_at(y, sig, g, 2 * R @ Lambda)
        F = grad(R, Pi)
        for _ in range(newton_steps):
            Fn = norm(F)
            todo = moving & (Fn > stop_in)
            if not bool(todo.any()):
                break
            Op, Om = _alm_omegas(s)
            # CG in float32 while the inner target is loose: the direction only has to be a good one (F and
            # the line search are float64); below ALM_CG32 float32's rounding of the products stalls it
            c32 = torch.float32 if float(stop_in.min()) > ALM_CG32 else torch.float64
            R32 = R.to(c32)
            r32 = torch.diagonal(R32, dim1=-2, dim2=-1)
            U32, Vh32, Op32, Om32 = U.to(c32), Vh.to(c32), Op.to(c32), Om.to(c32)
            V32, two_sig = Vh32.mT, (2 * sig).to(c32)[..., None, None]
            # R as its diagonal in float32 where D is diagonal to float32's rounding (the rest is below it)
            row = pic.diagonal and c32 == torch.float32  # (the Jacobi weights below read r32 where diagonal)
            rmul = (lambda x: r32.unsqueeze(-1) * x) if row else (lambda x: R32 @ x)
            rtmul = (lambda x: r32.unsqueeze(-1) * x) if row else (lambda x: R32.mT @ x)

            def hvp(x):
                H = U32.mT @ (two_sig * rmul(x)) @ V32
                S = rtmul(U32 @ (Op32 * H + Om32 * H.mT) @ Vh32)
                return P(S + S.mT) + 1e-12 * x

            if pic.diagonal:  # Jacobi: the Hessian's diagonal without its O(1/n) cross terms
                T = (r32 * r32).unsqueeze(-1) * ((U32 * U32) @ Op32 @ (V32 * V32).mT)
                dg = T + T.mT
                dg = torch.where(dg > 0, dg, 1)
                pre = lambda z: z / dg  # noqa: E731
            else:
                pre = lambda z: z  # noqa: E731
            target = (torch.minimum(Fn.sqrt(), torch.full_like(Fn, 0.1)) * torch.minimum(Fn, stop_in) / Fn) ** 2
            x = _pcg(hvp, -F.to(c32), pre, cg_steps, stop=float(target.min()))
            x = P(_sym(torch.nan_to_num(x.to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)))
            slope = (F * x).sum((-2, -1))
            t = torch.ones_like(sig)
            open_ = todo.clone()
            for _ in range(12):  # backtracking on h, per matrix; where h's rounding hides the decrease, taken
                trial = Lambda + t[..., None, None] * x
                if open_.dim() == 1 and not bool(open_.all()):  # a trial SVD for the open matrices only
                    k = open_.nonzero().squeeze(-1)
                    U1, s1, Vh1, Pi1, h1 = (old.index_copy(0, k, new) for old, new in zip(
                        (U, s, Vh, Pi, h), _alm_at(y[k], sig[k], g[k], 2 * R[k] @ trial[k])))
                else:
                    U1, s1, Vh1, Pi1, h1 = _alm_at(y, sig, g, 2 * R @ trial)
                ok = (h1 <= h + 1e-4 * t * slope) | ((t * slope).abs() < 1e-13 * h.abs())
                take = open_ & ok
                Lambda = torch.where(take[..., None, None], trial, Lambda)
                U, Vh, Pi = (torch.where(take[..., None, None], new, old)
                             for new, old in ((U1, U), (Vh1, Vh), (Pi1, Pi)))
                s, h = torch.where(take[..., None], s1, s), torch.where(take, h1, h)
                open_ = open_ & ~ok
                if not bool(open_.any()):
                    break
                t = torch.where(open_, 0.5 * t, t)
            F = grad(R, Pi)
        return Lambda, Pi

    for it in range(steps + 1):
        if it:
            # only the matrices still moving (a batch's certified ones would cost an SVD a try for nothing): where
            # some are done, the outer step runs on the others (one batch dimension, the optimizer's)
            sub = moving.nonzero().squeeze(-1) if len(batch) == 1 and not bool(moving.all()) else None
            if sub is None:
                Lambda, Pi = inner(y, g, R, Lambda, sig, stop_in, moving)
            else:
                L_s, Pi_s = inner(y[sub], g[sub], R[sub], Lambda[sub], sig[sub], stop_in[sub], moving[sub])
                Lambda, Pi = Lambda.index_copy(0, sub, L_s), y.index_copy(0, sub, Pi_s)
            step = norm(Pi - y)
            y = torch.where(moving[..., None, None], Pi, y)
            stop_in = torch.where(moving, (ALM_FORCING * step).clamp_min(1e-13), stop_in)
            sig = torch.where(moving, (sig * sigma[1]).clamp_max(sigma[2]), sig)
            iterations = iterations + moving
        # the certificate: y made feasible (``feasible``), and the bound ||Z||_* from Z's own singular values in R's
        # coordinates (Z = Q (g + 2 R Lambda)): through Z^T Z (``certificate``) each of the many vanishing singular
        # values of a rank-deficient Z carries an error of ~1e-8 of the largest, a floor near 1e-8 under the gap
        A, value = feasible(pic, Span(from_y(y), torch.zeros_like(y)))
        bound = torch.linalg.svdvals(g + 2 * R @ Lambda).sum(-1)
        gap = _relative_gap(value, bound)
        if best_A is None:
            best_A, best_gap = A, gap
        else:
            better = gap < best_gap
            best_A, best_gap, best_Lambda, best_y = _keep(better, (A, gap, Lambda, y),
                                                          (best_A, best_gap, best_Lambda, best_y))
        moving = best_gap > tol
        if not bool(moving.any()):
            break
    U = Span(from_y(best_y), torch.zeros_like(best_y))
    return GramSolve(best_A, pic, best_Lambda, U, best_gap, iterations, wide)


def _diagonal_multiplier(P, like) -> bool:
    """Whether the multiplier space's projector ``P`` keeps the diagonal only (Oblique's): P of the all-ones matrix
    is the identity (one host read)."""
    ones = torch.ones(like.shape[-1:] * 2, dtype=like.dtype, device=like.device)
    return bool((P(ones) == torch.eye(ones.size(-1), dtype=like.dtype, device=like.device)).all())


ANDERSON_MEMORY = 5  # the exact mode's fallback: Anderson-accelerated ADMM with this memory (``_Anderson``)


def exact_solve(W, G, P, warm=None, tol=1e-6, admm_steps=16, newton_steps=30, cg_steps=20, fallback_steps=400,
                normalize=True, eigenbasis: bool = False, anderson: int = ANDERSON_MEMORY,
                alm_steps: int = ALM_STEPS, warm_alm_steps: int = ALM_WARM_STEPS) -> GramSolve:
    """The exact mode. On a square weight: ``gram_solve`` (``admm_steps``, from ``warm`` and the cold start; it
    certifies the cold start first, which is the closed form on square Stiefel), then, where the certificate is above
    ``tol``, the augmented Lagrangian method (``alm_solve``, at most ``alm_steps`` outer steps; 0: none) from its
    multiplier and its ADMM multiplier U. Why: square DGram and Oblique optima are mostly rank-deficient (chapter 04,
    ``sec-exact-square``), where the dual is not smooth and Newton on it does not certify; ``alm_solve`` says what it
    measured against the path taken there until 2026-12-07 (eight Newton steps, then the fallback below). From a warm
    start (a training run's: the last step's multiplier and candidate) on a square weight whose multiplier is
    diagonal (Oblique), ``alm_solve`` comes first instead, at the fixed penalty ``ALM_WARM_PENALTY`` (at most
    ``warm_alm_steps`` outer steps, ``ALM_WARM_STEPS``; 0: none, the path above alone, as until 2026-12-07, which
    the benchmark ``alm_warm`` compares with), and the path above runs only where it does not certify: a large penalty takes few
    outer steps once the start is close, where the schedule climbs from 1 whatever the start. Measured (2026-12-07,
    benchmark ``alm_warm``, one CPU thread, four warm solves a stream, the median): at 768 x 768 9.8 Muon steps where
    the path above took 77 on the table's rotating stream, and 36 where it took 143 on its mixture stream (whose
    momenta move more); at 128 x 128 31 against 130 and 141 against 232, certified to 1e-6 on every solve. (Its
    criterion, item 3's 20 Muon steps on both streams, was not met; it was adopted after the data because it cost less
    on every weight and stream measured.) Not on DGram: there the same fixed penalty ran its 60 outer steps
    (5,840 to 5,881 SVDs) to a gap of 0.1-0.2 at 128 x 128 (part ``alm_warm_dgram``).

    On a rectangular weight from ``warm`` (a training run's: the last step's multiplier): ``newton_solve`` from it
    first, then ``gram_solve`` (ADMM, ``admm_steps``) from it where Newton did not certify. Cold (``warm`` None):
    ``gram_solve`` first, then ``newton_solve`` from its multiplier where the certificate is above ``tol``.

    On either, where the certificate is still above ``tol``: ADMM again up to ``fallback_steps`` from the best state
    so far, accelerated by Anderson's method with memory ``anderson`` (``_Anderson``; 0: plain over-relaxed ADMM, as
    until 2026-12-07); per matrix the best certified candidate. (On a square weight this is for faces of optima rather
    than points, e.g. a rank-2 gradient on a bfloat16 Oblique weight: ``tests/test_inner_solve.py``.) The returned gap
    is a certificate; a matrix can still end above ``tol`` (then the gap says by how much). ``eigenbasis``:
    ``newton_solve``'s, for Stiefel.

    Why Newton first when warm (2026-12-06, chapter 04): the ADMM iterations are there to bring a cold start into
    Newton's reach, and the last step's multiplier is already there; on GPT-2 small's rectangular Stiefel shapes
    they cost as much as the Newton steps that followed and did not shorten them."""
    _check_anderson(anderson, "exact_solve")  # before any work (the fallback, which reads it, comes last)
    for name, value in (("alm_steps", alm_steps), ("warm_alm_steps", warm_alm_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"exact_solve: {name} is a number of outer steps, an int >= 0 (0: none), got {value!r}")
    if W.size(-2) == W.size(-1):
        first = None
        if warm is not None and alm_steps and warm_alm_steps and _diagonal_multiplier(P, W):
            first = alm_solve(W, G, P, warm=warm, tol=tol, steps=min(alm_steps, warm_alm_steps), normalize=normalize,
                              sigma=(ALM_WARM_PENALTY, 1.0, ALM_WARM_PENALTY))
            if bool((first.gap <= tol).all()):
                return first
        sol = gram_solve(W, G, P, steps=admm_steps, tol=tol, warm=warm, normalize=normalize)
        sol = sol if first is None else _better(sol, first)
        if bool((sol.gap <= tol).all()) or not alm_steps:
            return sol
        sol = _better(sol, alm_solve(W, G, P, warm=(sol.Lambda, sol.U), tol=tol, steps=alm_steps,
                                     normalize=normalize))
    elif warm is None:
        sol = gram_solve(W, G, P, steps=admm_steps, tol=tol, warm=warm, normalize=normalize)
        if bool((sol.gap <= tol).all()):
            return sol
        nt = newton_solve(W, G, P, warm=(sol.Lambda, sol.U), tol=tol, steps=newton_steps, cg_steps=cg_steps,
                          normalize=normalize, eigenbasis=eigenbasis)
        sol = _better(sol, nt)
    else:
        sol = newton_solve(W, G, P, warm=warm, tol=tol, steps=newton_steps, cg_steps=cg_steps, normalize=normalize,
                           eigenbasis=eigenbasis)
        if bool((sol.gap <= tol).all()):
            return sol
        sol = _better(sol, gram_solve(W, G, P, steps=admm_steps, tol=tol, warm=warm, normalize=normalize))
    if bool((sol.gap <= tol).all()) or not fallback_steps:
        return sol
    more = gram_solve(W, G, P, steps=fallback_steps, tol=tol, warm=(sol.Lambda, sol.U), normalize=normalize,
                      anderson=anderson)
    return _better(sol, more)


def _better(old: GramSolve, new: GramSolve) -> GramSolve:
    """Per matrix the solve with the smaller certified gap (the picture is the first's: both describe one problem;
    coefficients are taken in its dtype)."""
    take = new.gap < old.gap
    cast = lambda X: Span(X.a.to(old.A.a.dtype), X.b.to(old.A.b.dtype))
    A, = _keep(take, (cast(new.A),), (old.A,))
    Lambda = torch.where(take[..., None, None], new.Lambda.to(old.Lambda.dtype), old.Lambda)
    U, = _keep(take, (cast(new.U),), (old.U,))
    return GramSolve(A, old.picture, Lambda, U, torch.minimum(old.gap, new.gap.to(old.gap.dtype)),
                     old.iterations + new.iterations, old.wide)
