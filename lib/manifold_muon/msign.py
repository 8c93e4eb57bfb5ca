"""The matrix sign: msign(G) = U V^T for G = U diag(s) V^T.

Three ways to compute it (``METHODS``), all batched over leading dimensions:

* ``svd``            exact (up to float rounding); the reference. Directions with zero singular value
                     map to zero, as sign(0) = 0.
* ``newton_schulz``  Jordan's quintic X <- a X + b (X X^T) X + c (X X^T)^2 X with (a, b, c) =
                     (3.4445, -4.7750, 2.0315), the same polynomial at every step, in the order of
                     operations of ``torch.optim.Muon``. It does not converge to 1: it drives singular
                     values into a band around 1 quickly, which is all Muon needs.
* ``polar_express``  a different odd quintic at every step, each the minimax (equioscillating)
                     approximation of 1 on the interval the previous step left (Amsel et al., "The Polar
                     Express", 2025). The coefficients are computed here by the Remez exchange algorithm.
* ``polar_express_paper``  the coefficient schedule the Polar Express paper publishes (``PAPER_COEFFS``:
                     eight quintics, the first seven shrunk by the safety factor 1.01, the last, 15/8 x - 10/8 x^3
                     + 3/8 x^5, repeated from the eighth step on, so that singular values converge to 1). It is
                     the msign of Bernstein's Manifold Muon reference and of the blog post's code, which run it
                     for 10 steps in bfloat16 (``POST_MSIGN``).

``DEFAULT`` is the one msign every optimizer of the package uses unless told otherwise.
The iterative methods run in ``dtype`` (default: the input's) and return that dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ._checks import check_matrix

__all__ = ["JORDAN_COEFFS", "PAPER_COEFFS", "METHODS", "MsignSpec", "DEFAULT", "POST_MSIGN", "msign", "msign_svd",
           "msign_newton_schulz", "msign_polar_express", "msign_polar_express_paper", "polar_express_coefficients",
           "quintic", "singular_value_error"]

JORDAN_COEFFS = (3.4445, -4.7750, 2.0315)
# The Polar Express paper's published schedule (Amsel, Persson, Musco and Gower 2025, for singular values in
# [1e-3, 1] after normalisation), as Bernstein's reference code and the post's code use it.
PAPER_COEFFS = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
METHODS = ("newton_schulz", "polar_express", "polar_express_paper", "svd")


@dataclass(frozen=True)
class MsignSpec:
    """How to compute msign: ``method`` in METHODS, ``steps`` of an iterative method, ``dtype`` to iterate in
    (None: the input's dtype)."""

    method: str = "polar_express"
    steps: int = 5
    dtype: torch.dtype | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown msign method {self.method!r}; choose one of {', '.join(METHODS)}")
        if not (isinstance(self.steps, int) and 1 <= self.steps < 100):
            raise ValueError(f"msign steps must be an int in 1..99, got {self.steps!r}")

    def __call__(self, G: torch.Tensor) -> torch.Tensor:
        return msign(G, self.method, self.steps, self.dtype)


# The package's default msign: five Polar Express steps in the input's precision. Five steps leave
# singular values that start above 1e-3 of the Frobenius norm within about 0.1 of 1 (chapter 01).
DEFAULT = MsignSpec("polar_express", 5, None)
# The blog post's msign, as its code runs it (and Bernstein's Manifold Muon reference): the paper's Polar Express
# schedule, 10 steps, in bfloat16 (returned in the input's dtype by ``ManifoldMuon``'s solvers).
POST_MSIGN = MsignSpec("polar_express_paper", 10, torch.bfloat16)


def quintic(x, a: float, b: float, c: float):
    """The odd quintic p(x) = a x + b x^3 + c x^5 that one iteration applies to each singular value."""
    return a * x + b * x**3 + c * x**5


def _check_matrix(G: torch.Tensor) -> None:
    check_matrix(G, "msign", "reshape a vector to (n, 1) if you mean a one-column matrix")


def msign_svd(G: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """Exact msign by SVD in float64 (the reference). Singular values below rtol * s_max map to 0."""
    _check_matrix(G)
    X = G.to(torch.float64)
    U, s, Vh = torch.linalg.svd(X, full_matrices=False)
    if rtol is None:
        rtol = max(X.shape[-2:]) * torch.finfo(torch.float64).eps
    keep = s > rtol * s.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return ((U * keep.unsqueeze(-2).to(U.dtype)) @ Vh).to(G.dtype)


def _addmm(C: torch.Tensor, A: torch.Tensor, B: torch.Tensor, beta: float, alpha: float = 1.0) -> torch.Tensor:
    """beta C + alpha A @ B, as torch.optim.Muon computes it (addmm; baddbmm for batches)."""
    if C.ndim == 2:
        return torch.addmm(C, A, B, beta=beta, alpha=alpha)
    lead = C.shape[:-2]
    out = torch.baddbmm(C.reshape(-1, *C.shape[-2:]), A.reshape(-1, *A.shape[-2:]), B.reshape(-1, *B.shape[-2:]),
                        beta=beta, alpha=alpha)
    return out.reshape(*lead, *out.shape[-2:])


def _iterate(G: torch.Tensor, coeffs, dtype: torch.dtype | None, eps: float, safety: float) -> torch.Tensor:
    """Apply the odd quintics ``coeffs`` to G / (safety ||G||_F), on the short side (X X^T is the small Gram)."""
    _check_matrix(G)
    X = G.to(dtype or G.dtype)
    tall = G.size(-2) > G.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * safety).clamp(min=eps)
    for a, b, c in coeffs:
        A = X @ X.mT
        B = _addmm(A, A, A, beta=b, alpha=c)
        X = _addmm(X, B, X, beta=a)
    return X.mT if tall else X


def msign_newton_schulz(G: torch.Tensor, steps: int = 5, dtype: torch.dtype | None = None, eps: float = 1e-7,
                        coefficients=JORDAN_COEFFS) -> torch.Tensor:
    """Jordan's quintic Newton-Schulz iteration (``coefficients``) for ``steps`` steps, as torch.optim.Muon runs it."""
    if not 1 <= steps < 100:
        raise ValueError(f"steps must be >= 1 (and < 100), got {steps}")
    if len(coefficients) != 3:
        raise ValueError(f"coefficients are (a, b, c) of one odd quintic, got {coefficients!r}")
    return _iterate(G, [tuple(coefficients)] * steps, dtype, eps, 1.0)


def _remez_odd_quintic(lo: float, hi: float, tol: float = 1e-15, max_iter: int = 100):
    """Minimax odd quintic p with max_{x in [lo, hi]} |1 - p(x)| smallest; returns (a, b, c, E)."""
    if hi <= 0 or not 0 <= lo <= hi:
        raise ValueError(f"need 0 <= lo <= hi, hi > 0; got lo={lo}, hi={hi}")
    if lo / hi >= 1 - 5e-6:  # interval is a point: the limit polynomial has p(hi)=1, p'(hi)=p''(hi)=0
        return 15 / 8 / hi, -10 / 8 / hi**3, 3 / 8 / hi**5, 0.0
    q, r = (3 * lo + hi) / 4, (lo + 3 * hi) / 4  # interior alternation points, refined below
    E_old = math.inf
    for _ in range(max_iter):
        pts = np.array([lo, q, r, hi])
        signs = np.array([1.0, -1.0, 1.0, -1.0])  # p(x_i) = 1 - s_i E
        M = np.stack([pts, pts**3, pts**5, signs], axis=1)
        a, b, c, E = np.linalg.solve(M, np.ones(4))
        disc = 9 * b * b - 20 * a * c  # p'(x) = a + 3 b x^2 + 5 c x^4 = 0
        if disc < 0 or c == 0:
            break
        roots = sorted(
            math.sqrt(t) for t in ((-3 * b - math.sqrt(disc)) / (10 * c), (-3 * b + math.sqrt(disc)) / (10 * c)) if t > 0
        )
        if len(roots) != 2:
            break
        q, r = roots
        if abs(E_old - E) <= tol:
            break
        E_old = E
    return float(a), float(b), float(c), float(abs(E))


_POLAR_EXPRESS = {}  # (steps, l0, safety) -> coefficients, made once


def polar_express_coefficients(steps: int = 5, l0: float = 1e-3, safety: float = 1.01):
    """Per-step (a, b, c) of the Polar Express: greedy minimax quintics on a shrinking interval.

    Singular values start in [l0, 1] after Frobenius normalisation (any tiny ones are below l0
    and converge more slowly). Each step is optimal for the interval the previous one left.
    ``safety`` shrinks each polynomial's input by that factor so that float rounding that pushes a
    value slightly above the interval does not blow up (p is only optimal inside it).
    Computed once per setting and kept in a plain dict (not ``functools.lru_cache``): ``torch.compile``
    reads a dict entry as a constant, where it traces through an ``lru_cache`` wrapper into the Remez
    exchange's host arithmetic and breaks the graph there, several times per step.
    """
    key = (steps, l0, safety)
    if key not in _POLAR_EXPRESS:
        _POLAR_EXPRESS[key] = _polar_express_coefficients(*key)
    return _POLAR_EXPRESS[key]


def _polar_express_coefficients(steps: int, l0: float, safety: float):
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    lo, hi, coeffs = l0, 1.0, []
    for _ in range(steps):
        a, b, c, E = _remez_odd_quintic(lo, hi)
        coeffs.append((a / safety, b / safety**3, c / safety**5))
        lo, hi = 1 - E, 1 + E
    return tuple(coeffs)


def msign_polar_express(G: torch.Tensor, steps: int = 5, dtype: torch.dtype | None = None, eps: float = 1e-7,
                        l0: float = 1e-3) -> torch.Tensor:
    """Polar Express msign: ``steps`` minimax quintics, each tuned to where the last one left off."""
    if not 1 <= steps < 100:
        raise ValueError(f"steps must be >= 1 (and < 100), got {steps}")
    return _iterate(G, polar_express_coefficients(steps, l0), dtype, eps, 1.01)


def msign_polar_express_paper(G: torch.Tensor, steps: int = 10, dtype: torch.dtype | None = None,
                              eps: float = 1e-7) -> torch.Tensor:
    """The Polar Express paper's published schedule (``PAPER_COEFFS``) for ``steps`` steps: G / (1.01 ||G||_F), the
    first seven quintics shrunk by the safety factor 1.01 (as the paper does; the last is not), the eighth repeated."""
    if not 1 <= steps < 100:
        raise ValueError(f"steps must be >= 1 (and < 100), got {steps}")
    safe = [(a / 1.01, b / 1.01**3, c / 1.01**5) for a, b, c in PAPER_COEFFS[:-1]] + [PAPER_COEFFS[-1]]
    return _iterate(G, [safe[min(k, len(safe) - 1)] for k in range(steps)], dtype, eps, 1.01)


def msign(G: torch.Tensor, method: str = DEFAULT.method, steps: int = DEFAULT.steps,
          dtype: torch.dtype | None = DEFAULT.dtype) -> torch.Tensor:
    """msign(G) by ``method`` in METHODS; ``steps`` and ``dtype`` apply to the iterative methods."""
    if method == "svd":
        return msign_svd(G)
    if method == "newton_schulz":
        return msign_newton_schulz(G, steps=steps, dtype=dtype)
    if method == "polar_express":
        return msign_polar_express(G, steps=steps, dtype=dtype)
    if method == "polar_express_paper":
        return msign_polar_express_paper(G, steps=steps, dtype=dtype)
    raise ValueError(f"unknown msign method {method!r}; choose one of {', '.join(METHODS)}")


def singular_value_error(O: torch.Tensor) -> torch.Tensor:
    """max_i |sigma_i(O) - 1| per matrix (float64), the distance of O's spectrum from an orthogonal one."""
    s = torch.linalg.svdvals(O.to(torch.float64))
    return (s - 1).abs().amax(dim=-1)
