"""Keigwin's Gram-space manifolds: P(W^T W - C) = 0 for a tall W (m >= n).

P is a self-adjoint projector on symmetric n x n matrices and C a target:

* ``Stiefel``  P = Id,   C = I : orthonormal columns, every singular value 1
* ``DGram``    P = Off,  C = 0 : orthogonal columns of free norm
* ``GramOblique``  P = Diag, C = I : unit-norm columns, free angles (name "gram_oblique", to keep it
  apart from the paper's input/output oblique spheres of ``spheres``, which have a radius and no
  transposition rule)

A wide W (m < n) is handled by the transposition rule: the constraint is put on W^T, i.e. on the
rows. Every method transposes a wide input on the way in and back on the way out.

Tangent space at W: {A : P(W^T A + A^T W) = 0}. Its orthogonal complement is {W Lambda : Lambda
symmetric, Lambda = P(Lambda)}, so the orthogonal projection is G - W Lambda with Lambda solving

    P(M Lambda + Lambda M) = P(W^T G + G^T W),   M = W^T W,   Lambda = P(Lambda).     (*)

``gram_multiplier`` solves (*) as Lambda_ij = P(S)_ij / (M_ii + M_jj). This is exact whenever the
P-part of M Lambda + Lambda M only sees diag(M), which holds at every point of all three manifolds:
Stiefel (M = I), DGram (M diagonal), Oblique (P = Diag, and (M Lambda)_ii = M_ii Lambda_ii for a
diagonal Lambda whatever M is). Off the manifold (e.g. after bf16 rounding) it is a first-order
approximation. The same solve is the least-squares step of ADMM (see ``optim/inner_solvers.py``).
"""

from __future__ import annotations

import torch

import abc

from ..msign import METHODS, msign
from .base import Manifold, check_matrix, register

__all__ = ["GramManifold", "Stiefel", "DGram", "GramOblique", "gram_multiplier", "polar", "off", "diag_part",
           "inverse_sqrt_series", "inverse_sqrt_newton_schulz"]


def diag_part(S: torch.Tensor) -> torch.Tensor:
    """Diag: keep the diagonal, zero the rest."""
    return torch.diag_embed(torch.diagonal(S, dim1=-2, dim2=-1))


def off(S: torch.Tensor) -> torch.Tensor:
    """Off: zero the diagonal."""
    return S - diag_part(S)


def _sym(S: torch.Tensor) -> torch.Tensor:
    return 0.5 * (S + S.mT)


def _eigh_roots(S: torch.Tensor):
    """(V, s) with S = V diag(s^2) V^T, in float64; s is NaN where S is singular (s^2 <= 0 after rounding),
    so that a factor built from 1/s is not finite and the caller falls back."""
    lam, V = torch.linalg.eigh(S.to(torch.float64))
    return V, torch.where(lam > 0, lam.clamp_min(0).sqrt(), float("nan"))


def inverse_sqrt_newton_schulz(S: torch.Tensor, iterations: int) -> torch.Tensor:
    """S^{-1/2} of a symmetric positive definite S close to a multiple of I, by the coupled Newton-Schulz
    iteration Y <- Y T, Z <- T Z, T = (3 I - Z Y) / 2 (Y -> S^{1/2}, Z -> S^{-1/2}; Higham 2008, eq. 6.35) on
    S / mean(diag S): matrix products only. It converges quadratically where ||S / c - I||_2 < 1; for the
    Gram matrix of X = W - lr A on Stiefel (A tangent, ||A||_op <= 1) that distance is at most lr^2, so
    ``iterations`` = 4 leaves an error of about (lr^2)^16: rounding for every lr < 0.9."""
    c = torch.diagonal(S, dim1=-2, dim2=-1).mean(-1)[..., None, None]
    eye = torch.eye(S.size(-1), dtype=S.dtype, device=S.device)
    Y, Z = S / c, eye.expand_as(S)
    for _ in range(iterations):
        T = 1.5 * eye - 0.5 * (Z @ Y)
        Y, Z = Y @ T, T @ Z
    return Z / c.sqrt()


def inverse_sqrt_series(S: torch.Tensor, lr: float, extra: int = 0) -> torch.Tensor:
    """(I + N)^{-1/2} = I - N/2 + 3N^2/8 - 5N^3/16 + 35N^4/128 - ..., N = S - I, for the Gram matrix S = X^T X of
    X = W - lr A on Stiefel: A tangent with ||A||_op <= 1 gives N = lr^2 A^T A (plus W's rounding), so
    ||N||_2 <= lr^2 and the terms kept (up to N^2 for lr <= 0.03, N^3 to 0.2, else ``inverse_sqrt_newton_schulz``)
    leave an error below float32 rounding; ``extra`` (0 or 1) keeps one more power, for an N up to a few times
    larger (DGram's short columns). Matrix products only (one to three n x n)."""
    if extra not in (0, 1):
        raise ValueError(f"inverse_sqrt_series: extra is 0 or 1 more power of N, got {extra!r}")
    eye = torch.eye(S.size(-1), dtype=S.dtype, device=S.device)
    if lr > 0.2:
        return inverse_sqrt_newton_schulz(S, 5)
    N = S - eye
    N2 = N @ N
    T = eye - 0.5 * N + 0.375 * N2
    powers = 2 + (lr > 0.03) + extra
    if powers >= 3:
        N3 = N2 @ N
        T = T - 0.3125 * N3
    if powers >= 4:
        T = T + 0.2734375 * (N2 @ N2)
    return T


def gram_multiplier(W: torch.Tensor, S: torch.Tensor, P) -> torch.Tensor:
    """Lambda = P(Lambda) solving P(M Lambda + Lambda M) = P(S), M = W^T W, for tall W (see module doc).

    Exact on Stiefel, DGram and Oblique points; a pair of zero columns (M_ii + M_jj = 0) gets Lambda_ij = 0.
    """
    d = (W * W).sum(dim=-2)  # diag(W^T W), the squared column norms
    den = d.unsqueeze(-1) + d.unsqueeze(-2)
    return P(torch.where(den > 0, P(S) / torch.where(den > 0, den, 1), 0))


def polar(X: torch.Tensor, method: str = "polar_express", steps: int = 8) -> torch.Tensor:
    """The orthonormal polar factor Q of a tall X (Q^T Q = I), also when X is rank-deficient.

    Iterative methods are followed by cubic Newton-Schulz steps Q <- Q (3 I - Q^T Q) / 2 (each squares
    the singular-value error: ~1e-6 after Polar Express becomes ~1e-12 in one step; Jordan's
    Newton-Schulz, which leaves errors up to ~0.3, needs about four) until max|Q^T Q - I| is at the
    rounding level 8 eps sqrt(m), at most six steps. A matrix still off the manifold after that is
    recomputed by an SVD that keeps every singular direction, so Q^T Q = I always: a rank-deficient X
    (its zero singular values stay zero), or one with a singular value below the iteration's reach (a
    cubic step multiplies a small one by only 1.5; a square Gaussian at n = 768 has one near 3e-4 of the
    largest). The test is the rounding level itself: an error in one singular direction is spread over
    the n^2 entries of Q^T Q, so an entry-wise threshold above rounding lets it through.
    """
    if method == "svd":
        U, _, Vh = torch.linalg.svd(X, full_matrices=False)
        return U @ Vh
    eye = torch.eye(X.size(-1), dtype=X.dtype, device=X.device)
    tol = 8 * torch.finfo(X.dtype).eps * X.size(-2) ** 0.5  # rounding level of the entries of Q^T Q
    Q = msign(X, method=method, steps=steps, dtype=X.dtype)
    for _ in range(6):
        Q = Q @ (1.5 * eye - 0.5 * (Q.mT @ Q))
        err = (Q.mT @ Q - eye).abs().amax(dim=(-2, -1))
        if bool((err < tol).all()):
            break
    bad = err >= tol
    if bad.any():
        Q, Xb, bad = Q.reshape(-1, *Q.shape[-2:]).clone(), X.reshape(-1, *X.shape[-2:]), bad.reshape(-1)
        U, _, Vh = torch.linalg.svd(Xb[bad], full_matrices=False)
        Q[bad] = U @ Vh
        Q = Q.reshape(X.shape)
    return Q


def _tall(returns_matrix: bool):
    """Decorator: call the method on the tall orientation of its matrix arguments (the transposition
    rule) and, if it returns a matrix, transpose that back."""

    def decorate(fn):
        def wrapper(self, *mats):
            for M in mats:
                check_matrix(M, f"{type(self).__name__}.{fn.__name__}")
                if M.shape != mats[0].shape:
                    raise ValueError(f"{fn.__name__}: shapes differ, {tuple(mats[0].shape)} vs {tuple(M.shape)}")
            wide = mats[0].size(-2) < mats[0].size(-1)
            out = fn(self, *[M.mT if wide else M for M in mats])
            return out.mT if (wide and returns_matrix) else out

        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        return wrapper

    return decorate


def _compute_dtype(W: torch.Tensor) -> torch.dtype:
    return torch.float64 if W.dtype == torch.float64 else torch.float32


class GramManifold(Manifold):
    """The Gram-space family, P(W^T W - C) = 0: what Manifold Muon's dual solvers work with.

    Subclasses give ``gram_projector`` (P), ``target`` (C) and ``_retract_tall``.
    ``residual`` is ||P(W^T W - C)||_F and ``tangent_residual`` is ||P(W^T A + A^T W)||_F per matrix,
    both computed in float64 on the tall orientation.
    Work is done in float32 (float64 inputs stay float64) and returned in the input dtype.
    ``msign``/``ns_steps``: the msign inside the retraction (polished to rounding level, see ``polar``).
    """

    _spec_args = ("msign", "ns_steps")
    # W^T W is diagonal at every point (Stiefel, DGram): a solve may take W^T W's products as row scalings
    diagonal_gram = True

    def __init__(self, msign: str = "polar_express", ns_steps: int = 8):
        if msign not in METHODS:
            raise ValueError(f"unknown msign {msign!r}; choose one of {', '.join(METHODS)}")
        self.msign, self.ns_steps = msign, ns_steps

    @abc.abstractmethod
    def gram_projector(self, S: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def target(self, n: int, dtype=torch.float32, device=None) -> torch.Tensor: ...

    @abc.abstractmethod
    def _retract_tall(self, X: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def retraction_factor(self, S: torch.Tensor) -> torch.Tensor:
        """T with retract(X) = X T for a tall X, from S = X^T X alone (n x n; eigh in float64): the
        retraction without touching X, so that an optimizer that knows X^T X in n x n (``ManifoldMuon``'s
        Gram-space solve) retracts in its one final product. The same map as ``retract`` where X has full
        column rank. Forming S squares X's condition number: use ``checked_factor``, which says when the
        result would not be on the manifold to rounding."""

    def series_factor(self, S: torch.Tensor, lr: float) -> torch.Tensor:
        """A factor T with X T on the manifold, from S = X^T X of X = W - lr A (W on the manifold, A tangent,
        ||A||_op <= 1), by matrix products only where the manifold allows it (the lean step's retraction: no
        eigendecomposition on a GPU); here ``retraction_factor``. X T need not equal ``retract(X)``: a retraction
        is fixed only to first order, and the manifolds that override this say how far apart the two are.
        Check the result with ``lands``: the series assumes lr^2 A^T A small against W's column norms."""
        return self.retraction_factor(S)

    def checked_factor(self, S: torch.Tensor) -> torch.Tensor | None:
        """``retraction_factor(S)``, or None where X T would be off the manifold by more than rounding
        (||P(T^T S T - C)||_F > 64 eps (1 + tr S), eps of S's dtype): then retract X itself."""
        T = self.retraction_factor(S)
        ok = self.lands(T.to(torch.float64), S.to(torch.float64), S.dtype)
        return T if bool(ok.all()) else None

    def lands(self, T: torch.Tensor, S: torch.Tensor, eps_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Per matrix (a bool tensor, no host read): is X T on the manifold to rounding, T finite and
        ||P(T^T S T - C)||_F <= 64 eps (1 + tr S), S = X^T X, computed in S's dtype, eps of ``eps_dtype``
        (default S's)?"""
        n = S.size(-1)
        off = self.gram_projector(T.mT @ S @ T - self.target(n, S.dtype, S.device))
        trace = torch.diagonal(S, dim1=-2, dim2=-1).sum(-1)
        bound = 64 * torch.finfo(eps_dtype or S.dtype).eps * (1 + trace)
        return torch.isfinite(T).flatten(-2).all(-1) & (torch.linalg.matrix_norm(off) <= bound)

    @_tall(returns_matrix=True)
    def retract_via_gram(self, X):
        """retract(X) as X T(X^T X) (``retraction_factor``): one Gram product, one n x n eigh, one product;
        ``retract`` where that would not land on the manifold to rounding (``checked_factor``)."""
        Xc = X.to(_compute_dtype(X))
        T = self.checked_factor(_sym(Xc.mT @ Xc))
        return (self._retract_tall(Xc) if T is None else Xc @ T).to(X.dtype)

    @_tall(returns_matrix=False)
    def residual(self, W):
        W = W.to(torch.float64)
        R = self.gram_projector(W.mT @ W - self.target(W.size(-1), torch.float64, W.device))
        return torch.linalg.matrix_norm(R)

    @_tall(returns_matrix=False)
    def tangent_residual(self, W, A):
        W, A = W.to(torch.float64), A.to(torch.float64)
        return torch.linalg.matrix_norm(self.gram_projector(W.mT @ A + A.mT @ W))

    @_tall(returns_matrix=True)
    def project(self, W, G):
        dt = _compute_dtype(W)
        W, G = W.to(dt), G.to(dt)
        Lambda = gram_multiplier(W, W.mT @ G + G.mT @ W, self.gram_projector)
        return G - W @ Lambda

    @_tall(returns_matrix=True)
    def retract(self, X):
        return self._retract_tall(X.to(_compute_dtype(X))).to(X.dtype)

    def random_point(self, shape, generator=None, dtype=torch.float32):
        *batch, m, n = shape
        big, small = max(m, n), min(m, n)
        Z = torch.randn(*batch, big, small, generator=generator, dtype=torch.float64)
        W = self._random_tall(Z, generator)
        return (W.mT if m < n else W).to(dtype).contiguous()

    def _random_tall(self, Z, generator):
        return polar(Z, "svd")


@register
class Stiefel(GramManifold):
    """W^T W = I. Retraction: the polar factor msign(X) (``msign``: svd / polar_express / newton_schulz)."""

    name = "stiefel"

    def gram_projector(self, S):
        return S

    def target(self, n, dtype=torch.float32, device=None):
        return torch.eye(n, dtype=dtype, device=device)

    def _retract_tall(self, X):
        return polar(X, self.msign, self.ns_steps)

    def retraction_factor(self, S):
        """polar(X) = X S^{-1/2}. (For X = W - lr A with A tangent, S = I + lr^2 A^T A.)"""
        V, s = _eigh_roots(S)
        return ((V / s.unsqueeze(-2)) @ V.mT).to(S.dtype)

    def series_factor(self, S, lr):
        """S^{-1/2} by ``inverse_sqrt_series``: the polar factor itself (S = I + lr^2 A^T A), to the series' error."""
        return inverse_sqrt_series(S, lr)


@register
class DGram(GramManifold):
    """off(W^T W) = 0: orthogonal columns, free norms.

    Two retractions, chosen by ``retraction``:

    * ``"msign"`` (default): Q = msign(X), then W = Q diag(diag(Q^T X)): each column of Q scaled by
      the least-squares fit of X's column onto it. One msign. It is the identity on the manifold
      (X = Q0 D with Q0 orthonormal, D > 0 diagonal gives msign(X) = Q0, diag(Q0^T X) = D) and a
      first-order retraction: with W = Q0 D, a tangent A has S = W^T A + A^T W diagonal, so
      d msign(W + tA)/dt = A D^-1 - Q0 D^-2 S / 2 and d diag(Q^T X)/dt = diag(Q0^T A); their sum in
      dR/dt = dQ/dt D + Q0 diag(dd/dt) is A - Q0 diag(Q0^T A) + Q0 diag(Q0^T A) = A.
    * ``"svd_post"``: the post's W -> U V^T diag(Sigma) for X = U Sigma V^T. It lands on the manifold
      (orthonormal columns of U V^T, each scaled), but it pairs column j with the j-th LARGEST
      singular value, so it permutes the column norms of a point already on the manifold unless they
      are sorted in decreasing order: it is not the identity there, hence not a retraction.
      Exactly where it is one (lemma; tests/test_gram_manifolds.py): at W = Q0 D on DGram it is the
      identity iff the column norms D are non-increasing (then U V^T = Q0 and Sigma = D); where they
      are strictly decreasing it is also first order (the pairing of columns with singular values is
      locally constant, and then it agrees to first order with the "msign" retraction: d/dt of
      sigma_j is (Q0^T A)_jj, the same as of diag(Q^T X)); where norms tie it is the identity, and first
      order only along tangents that keep the tied norms in order (a tied pair's singular values of
      W + tA move by the diagonal entries of Q0^T A and are then sorted: along a direction that grows
      the later column, the pairing swaps and the defect is O(t)). So it is a retraction on the open
      set of DGram points with strictly decreasing column norms, and at no other point.
      Kept so that the claim can be checked.
    """

    name = "dgram"
    _spec_args = ("retraction", "msign", "ns_steps")

    def __init__(self, retraction: str = "msign", msign: str = "polar_express", ns_steps: int = 8):
        super().__init__(msign, ns_steps)
        if retraction not in ("msign", "svd_post"):
            raise ValueError(f"unknown DGram retraction {retraction!r}; choose 'msign' (default) or 'svd_post'")
        self.retraction = retraction

    def gram_projector(self, S):
        return off(S)

    def target(self, n, dtype=torch.float32, device=None):
        return torch.zeros(n, n, dtype=dtype, device=device)

    def _retract_tall(self, X):
        if self.retraction == "svd_post":
            U, s, Vh = torch.linalg.svd(X, full_matrices=False)
            return (U @ Vh) * s.unsqueeze(-2)
        Q = polar(X, self.msign, self.ns_steps)
        return Q * (Q * X).sum(dim=-2, keepdim=True)

    def retraction_factor(self, S):
        """msign: Q = X S^{-1/2} and diag(Q^T X) = diag(S^{1/2}), so T = S^{-1/2} diag(diag(S^{1/2})).
        svd_post: U V^T = X S^{-1/2} and Sigma = the singular values, largest first: T = S^{-1/2} diag(Sigma)."""
        V, s = _eigh_roots(S)
        inv = (V / s.unsqueeze(-2)) @ V.mT
        if self.retraction == "svd_post":
            return (inv * s.flip(-1).unsqueeze(-2)).to(S.dtype)
        half = ((V * s.unsqueeze(-2)) * V).sum(-1)  # diag(S^{1/2})
        return (inv * half.unsqueeze(-2)).to(S.dtype)

    def series_factor(self, S, lr):
        """Without an eigendecomposition (``retraction="msign"``; "svd_post" takes ``retraction_factor``):
        with d = diag(S) and E = d^{-1/2} S d^{-1/2} (unit diagonal), T = d^{-1/2} E^{-1/2} d^{1/2}, E^{-1/2} by
        ``inverse_sqrt_series``. Then T^T S T = d^{1/2} E^{-1/2} E E^{-1/2} d^{1/2} = diag(d): X T has orthogonal
        columns with X's own column norms, exactly (to the series' error). For a tangent A the off-diagonal of S
        is lr^2 off(A^T A) (off(W^T A + A^T W) = 0), so E - I is O(lr^2) and the series converges as on
        Stiefel. It is a retraction (T = I at lr = 0, I + O(lr^2) along tangent A) but not the same map as
        ``retract``'s (X S^{-1/2} diag(S^{1/2})): the two differ at second order (measured on GPT-2 shapes,
        a relative 6e-6 of W+ at lr 0.02 and 2e-4 at lr 0.1; tests/test_lean_step.py)."""
        if self.retraction != "msign":
            return self.retraction_factor(S)
        d = torch.diagonal(S, dim1=-2, dim2=-1)
        r = torch.where(d > 0, d.clamp_min(torch.finfo(S.dtype).tiny).rsqrt(), float("nan"))
        E = r.unsqueeze(-1) * S * r.unsqueeze(-2)
        # one more power of the series than on Stiefel: E - I is lr^2 off(A^T A) scaled by 1 / (|x_i| |x_j|),
        # larger than Stiefel's where columns are short (measured: a 1000-step run at lr 0.1 drifted to 1e-5
        # off the manifold without it)
        return r.unsqueeze(-1) * inverse_sqrt_series(E, lr, extra=1) * d.clamp_min(0).sqrt().unsqueeze(-2)

    def _random_tall(self, Z, generator):
        scales = 0.5 + 1.5 * torch.rand(*Z.shape[:-2], 1, Z.size(-1), generator=generator, dtype=Z.dtype)
        return polar(Z, "svd") * scales


@register
class GramOblique(GramManifold):
    """diag(W^T W) = 1 on the tall orientation: unit-norm columns (rows of a wide W). Retraction: divide each
    column by its norm (a zero column, which has no direction, becomes the first basis vector e_1)."""

    name = "gram_oblique"
    _spec_args = ()
    diagonal_gram = False  # unit columns at free angles: W^T W is a full matrix

    def __init__(self):
        super().__init__()

    def gram_projector(self, S):
        return diag_part(S)

    def target(self, n, dtype=torch.float32, device=None):
        return torch.eye(n, dtype=dtype, device=device)

    def _retract_tall(self, X):
        norms = X.norm(dim=-2, keepdim=True)
        e1 = torch.zeros_like(X)
        e1[..., 0, :] = 1
        return torch.where(norms > 0, X / torch.where(norms > 0, norms, 1), e1)

    def retraction_factor(self, S):
        """X / column norms: T = diag(S)^{-1/2} (NaN for a zero column, which ``retract`` sends to e_1)."""
        d = torch.diagonal(S, dim1=-2, dim2=-1)
        return torch.diag_embed(torch.where(d > 0, d.rsqrt(), float("nan")))

    def series_factor(self, S, lr):
        """``retraction_factor`` itself: a column scaling, exact and free of any eigendecomposition."""
        return self.retraction_factor(S)

    def _random_tall(self, Z, generator):
        return Z / Z.norm(dim=-2, keepdim=True)
