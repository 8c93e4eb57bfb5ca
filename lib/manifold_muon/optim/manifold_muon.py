"""Manifold Muon (Bernstein), on any Gram-space manifold (Keigwin), batched over same-shape matrices.

    G  = Muon momentum direction of the gradient                       (``base``)
    A  = argmax <G, A>  s.t.  ||A||_op <= 1,  A tangent at W             (inner solver on the dual, ``inner_solvers``)
    W <- retract(W - lr A)

Inner solvers (``inner``):

* ``"lean"``: Manifold Muon at about Muon's price. Square Stiefel in closed form
  (``square_stiefel_step``: one eigendecomposition, exact, gap 0 to rounding, retraction free); Oblique in the
  matrix itself (``oblique_step``: its multiplier is diagonal, so the Gram picture's up-front products buy
  nothing, and on a square weight the picture divides by an ill-conditioned W^T W); elsewhere
  ``inner_solvers.lean_solve``, one certificate, and ``lean_retract`` (no eigendecomposition: Stiefel and DGram
  by a series). How the multiplier is found depends on the manifold (``lean_defaults``):
  rectangular Stiefel cold, nothing carried: on weights at least ``inner_solvers.NEWTON_COLD_ASPECT`` (2.5) times as
  long as wide one Newton step with one conjugate-gradient step from a zero multiplier, shortened to
  ``inner_solvers.NEWTON_COLD_LENGTH`` of its length, the direction from that one eigendecomposition
  (``tracker="auto"`` resolves to ``"newton_cold"`` there); nearer square, and before 2026-12-07 on every one, the
  tangent projection's msign with no iteration, scaled into the unit ball (``tracker="admm"`` takes it anywhere);
  DGram and Oblique tracked (the multiplier carried
  from the previous step): on rectangular DGram weights by one damped Newton step on the dual with one
  Jacobi-preconditioned conjugate-gradient step (``tracker="auto"``, ``inner_steps=1``: ``inner_solvers.newton_track``;
  two eigendecompositions; the first step starts from ``inner_solvers.NEWTON_START`` ADMM iterations), on square
  DGram weights and on Oblique by one ADMM iteration (``inner_steps=1``), then
  the certificate (``certify_first=True``, the other order, shares one eigendecomposition between the two and
  settles further). Measured on a
  stream of training-like momenta (benchmark ``solver_table``, chapter 04): on rectangular Stiefel the tangent
  projection's cold step's settled e_W is 0.45x Muon's own at GPT-2 small's shapes where the tracked one's is 0.8x,
  for one eigendecomposition fewer, and the cold Newton step's 3-5x smaller again for the same count; on DGram and Oblique tracking is the more accurate of the two, and on DGram the
  Newton tracker settles closer than one ADMM iteration (0.32-0.37x Muon's e_W at GPT-2 small's rectangular
  shapes since its start, ``inner_solvers.NEWTON_START``, 0.57-0.63x before it, against 0.62-0.68x; on square
  DGram no closer, and dearer). Fixed work per matrix and no host
  read of its own but the step's one guard (torch's eigendecompositions read their status on the host once per
  batched call, ``manifold_muon.opcount``); the certified gap is recorded, not enforced (on training-like momenta it is about
  0.1-0.3: the measured accuracy-cost table is the benchmark ``solver_table`` and chapter 04). Not the default: at the cpu preset it trains measurably
  worse than ``"gram_admm"`` (chapter 05, run ``solver_training``).
* ``"exact"``: ``inner_solvers.exact_solve``: from the previous step's multiplier, Newton-CG on the dual damped by
  Levenberg-Marquardt (quadratic near the optimum; CG's products in float32, the gradient and the certificate in
  float64), then ``inner_steps`` (16) ADMM iterations where it did not certify (on the first step, with no
  multiplier yet, the ADMM iterations first), then more ADMM where neither certified, until the relative gap is
  ``tol`` (1e-6). On square weights, whose DGram and Oblique optima are mostly rank-deficient: the ADMM iterations,
  then the semismooth-Newton augmented Lagrangian method (``inner_solvers.alm_solve``); on square Oblique weights
  from the previous step's state, that method first, at a fixed high penalty. Reads the host to stop; for
  references and for studying the solver's accuracy.
* ``"gram_admm"`` (default): ``inner_solvers.gram_solve``, Buchanan's ADMM (over-relaxed) run on n x n coefficients,
  warm-started from the previous step's multipliers, stopped by a certificate (relative duality gap
  <= ``tol``) or after ``inner_steps`` iterations; the direction and the retraction are fused into one
  final product (the retraction's Gram matrix is known in n x n, ``GramManifold.retraction_factor``).
  Square Stiefel needs no iteration (the closed form A = W msign(skew(W^T G)) certifies itself).
* ``"post"``: the blog post's recipe, ``POST_RECIPE``: 20 cold dual-ascent steps, alpha = 0.1 with
  Bernstein's linear decay, Jordan's Newton-Schulz msign (5 steps), the raw momentum (no rescaling of G).
* ``"dual_ascent"``: the same dual ascent on G rescaled to unit RMS, with the package's msign (this
  library's default before the Gram-space solve); ``"admm"``: Buchanan's ADMM on m x n matrices.

No weight decay by default (it would push W off its manifold; the post applies none). A matrix whose
direction G is exactly zero is left unchanged. Call ``retract_parameters()`` once to put freshly
initialised weights on their manifolds. Each step records, per weight, in ``state[p]``:
``tangent_violation`` ||P(W^T A + A^T W)||_RMS of the direction taken (unit-RMS G units for every solver
but "post"), and for "gram_admm" ``duality_gap`` (the certificate: the relative sub-optimality of A is
at most this) and ``inner_iterations``.
"""

from __future__ import annotations

import torch

from ..manifolds.gram import DGram, GramManifold, GramOblique, Stiefel, inverse_sqrt_newton_schulz, inverse_sqrt_series  # noqa: F401 (re-exported)
from ..msign import DEFAULT, msign
from .base import MatrixOptimizer
from .inner_solvers import (GramSolve, Span, _sym, admm, dual_ascent, eig_sqrt, exact_solve, factor, gram, gram_solve,
                            inv_sqrt, lean_solve, rms, shrink, tangent_defect, COLD_TRACKER, NEWTON_COLD_ASPECT,
                            NEWTON_TRACKERS)


__all__ = ["ManifoldMuon", "POST_RECIPE", "TRACKERS", "fused_retract", "lean_defaults", "lean_retract", "lean_steps",
           "resolve_tracker",
           "oblique_solve", "oblique_step", "range_msign", "skew_msign", "skew_pairs", "square_stiefel_step",
           "post_msign", "inverse_sqrt_newton_schulz", "inverse_sqrt_series"]

# The blog post's inner solve, one argument away (inner="post"): what "Different Layers, Different
# Manifolds" ran for every constrained matrix.
POST_RECIPE = dict(inner_steps=20, alpha=0.1, normalize=False, warm_start=False, tol=None, msign="newton_schulz",
                   ns_steps=5)


def post_msign(X: torch.Tensor) -> torch.Tensor:
    """The post's matrix sign, as ``POST_RECIPE`` names it: Jordan's quintic Newton-Schulz, 5 steps."""
    return msign(X, POST_RECIPE["msign"], POST_RECIPE["ns_steps"])

# The solvers that compute msign exactly (an n x n eigendecomposition) and so take no msign setting.
EXACT_MSIGN = ("lean", "exact", "gram_admm")

# Settings left at None take these, per solver (a solver's unread settings are filled too, so that every
# group holds every key; SOLVER_SETTINGS says which it reads, and a user-given unread one is refused).
SOLVER_DEFAULTS = {
    # lean: inner_steps and warm_start by manifold (``lean_defaults``), filled in before these
    "lean": dict(inner_steps=1, tol=None, warm_start=True, normalize=True, msign=DEFAULT.method,
                 ns_steps=DEFAULT.steps),
    "gram_admm": dict(inner_steps=16, tol=1e-3, warm_start=True, normalize=True, msign=DEFAULT.method,
                      ns_steps=DEFAULT.steps),
    # the exact mode: 16 warm ADMM iterations, then Newton on the dual, until the relative gap is 1e-6
    # (``inner_solvers.exact_solve``)
    "exact": dict(inner_steps=16, tol=1e-6, warm_start=True, normalize=True, msign=DEFAULT.method,
                  ns_steps=DEFAULT.steps),
    "post": POST_RECIPE,
    "dual_ascent": dict(inner_steps=20, alpha=0.1, tol=None, warm_start=False, normalize=True, msign=DEFAULT.method,
                        ns_steps=DEFAULT.steps),
    "admm": dict(inner_steps=10, tol=None, warm_start=False, normalize=True, msign=DEFAULT.method,
                 ns_steps=DEFAULT.steps),
}

# What each solver reads; a setting given for a solver that does not read it is refused (it would do nothing).
# ``rho`` None means 1/sqrt(n) where it is read (``OBLIQUE_RHO`` = 2 in Oblique's lean step); ``msign_dtype``
# None means the compute dtype.
SOLVER_SETTINGS = {
    "lean": ("inner_steps", "warm_start", "normalize", "rho", "certify_first", "tracker"),
    "gram_admm": ("inner_steps", "tol", "warm_start", "rho"),
    "exact": ("inner_steps", "tol", "warm_start"),
    "post": ("inner_steps", "alpha", "tol", "warm_start", "normalize", "msign", "ns_steps", "msign_dtype"),
    "dual_ascent": ("inner_steps", "alpha", "tol", "warm_start", "normalize", "msign", "ns_steps", "msign_dtype"),
    "admm": ("inner_steps", "rho", "tol", "warm_start", "msign", "ns_steps", "msign_dtype"),
}


TRACKERS = ("auto", "admm", "newton", "newton_dk", "newton_cold")


def lean_defaults(manifold, tracker: str | None = None) -> dict:
    """The lean solve's ``tracker``, ``inner_steps``, ``warm_start`` and ``certify_first`` on ``manifold`` (a name
    or an instance): on Stiefel cold, nothing carried: one Newton step of one conjugate-gradient step from a zero
    multiplier (rectangular weights, ``tracker="auto"`` resolves to "newton_cold"; before 2026-12-07 the tangent
    projection's msign with no iteration, which ``tracker="admm"`` still takes there; a square weight takes the
    closed form and reads none of them); on DGram the multiplier tracked from the last step, on its rectangular weights by
    one damped Newton step of one conjugate-gradient step, on its square ones by one ADMM iteration
    (``tracker="auto"``, ``resolve_tracker``); on Oblique tracked by one ADMM iteration, then certified, in the
    matrix itself (``oblique_step``, which carries the ADMM's U as a matrix; from 2026-12-03 to 2026-12-04 the
    default there was ``certify_first=True``, one eigendecomposition fewer, which settles further from the optimum
    than this order once U is carried as a matrix: chapter 04; its ADMM penalty is ``OBLIQUE_RHO``, not the
    picture's 1/sqrt(n), unless ``rho`` is given). Given
    ``tracker`` ("auto", "admm", "newton", "newton_dk" or "newton_cold"), the defaults that go with it: "newton" and
    "newton_dk" carry the multiplier with one CG step on every weight, "newton_cold" carries nothing and takes one CG
    step from zero, "admm" and "auto" take the per-manifold defaults above
    ("admm" on DGram: one tracked ADMM iteration on every weight, the default before 2026-12-04). Why: measured on the benchmark
    ``solver_table``'s stationary stream of momenta (chapter 04), not proven."""
    from ..manifolds import get_manifold

    M = get_manifold(manifold)
    tracker = tracker or "auto"
    if tracker in NEWTON_TRACKERS:
        return dict(tracker=tracker, inner_steps=1, warm_start=True, certify_first=False)
    if tracker == COLD_TRACKER or (tracker == "auto" and isinstance(M, Stiefel)):
        return dict(tracker=tracker, inner_steps=1, warm_start=False, certify_first=False)
    if isinstance(M, Stiefel):
        return dict(tracker=tracker, inner_steps=0, warm_start=False, certify_first=False)
    return dict(tracker=tracker, inner_steps=1, warm_start=True, certify_first=False)


def resolve_tracker(manifold, tracker: str, shape) -> str:
    """What ``tracker`` means for one weight of ``shape``: "auto" is "newton_cold" on a Stiefel weight at least
    ``inner_solvers.NEWTON_COLD_ASPECT`` (2.5) times as long as it is wide, the tangent projection's cold step on the
    other Stiefel weights ("admm" with no iteration, ``lean_steps``; square ones take the closed form), "newton" on a
    rectangular DGram weight and "admm" elsewhere (measured, chapter 04: on the table's Stiefel weights, 3 and 4
    times as long as wide, the cold Newton step from zero lands 3-5x closer to the optimum than the tangent
    projection's cold step, for the same eigendecomposition count, and nearer square it lands further, the
    constant's comment; on square DGram, whose optimum is rank-deficient, the Newton step
    settles no closer than one ADMM iteration and costs more; on Oblique the certified-first ADMM iteration
    costs one eigendecomposition where Newton needs two)."""
    if tracker != "auto":
        return tracker
    if isinstance(manifold, Stiefel):
        long = max(shape[-2], shape[-1]) >= NEWTON_COLD_ASPECT * min(shape[-2], shape[-1])
        return COLD_TRACKER if long else "admm"
    return "newton" if isinstance(manifold, DGram) and shape[-2] != shape[-1] else "admm"


def lean_steps(manifold, tracker: str, shape, inner_steps: int) -> int:
    """The lean solve's iterations on one weight of ``shape``: ``inner_steps``, but none where "auto" resolves to the
    tangent projection's cold step (a Stiefel weight shorter than ``NEWTON_COLD_ASPECT`` times its width,
    ``resolve_tracker``): there ``inner_steps`` counts the cold Newton step's CG steps, which that step does not take."""
    if tracker == "auto" and isinstance(manifold, Stiefel) and resolve_tracker(manifold, tracker, shape) == "admm":
        return 0
    return inner_steps


_WHY_NOT = {
    "tol": "it does a fixed amount of work (inner_steps iterations) and records its certified gap instead of stopping on one",
    "msign": "it computes msign exactly from an n x n eigendecomposition",
    "ns_steps": "it computes msign exactly from an n x n eigendecomposition",
    "msign_dtype": "it computes msign exactly from an n x n eigendecomposition",
    "alpha": "alpha is the step of dual ascent (inner='post' or 'dual_ascent')",
    "rho": "rho is the ADMM penalty (inner='gram_admm', 'lean' or 'admm')",
    "certify_first": "certify_first orders the lean step's certificate and iterations (inner='lean')",
    "tracker": "tracker chooses how the lean step carries its multiplier (inner='lean')",
    "normalize": "it does not rescale G before its solve",
}


def fused_retract(M: GramManifold, sol: GramSolve, lr: float, weight_decay: float = 0.0,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """W+ = M.retract((1 - lr wd) W - lr A) from a ``gram_solve``'s picture, without forming X: X = W ((1 - lr wd) I
    - lr a) + C (-lr b) has an n x n Gram matrix, whose factor T puts X T on the manifold; the m x n product is
    formed once. ``dtype``: the weight's (T is rounded to it, as a retraction of the m x n X would be)."""
    pic, A = sol.picture, sol.A
    X = Span((1 - lr * weight_decay) * pic.eye() - lr * A.a, -lr * A.b)
    T = M.checked_factor(gram(pic, X, exact=True).to(dtype or pic.W.dtype))
    # None: X^T X too ill conditioned: retract X itself
    W_new = X.times(T.to(X.a.dtype), pic).matrix(pic) if T is not None else M.retract(X.matrix(pic))
    return W_new.mT if sol.wide else W_new


def _landed(M: GramManifold, T, S, dtype) -> torch.Tensor:
    """Per matrix: does X T lie on M to rounding (``GramManifold.lands``, eps of ``dtype``)?"""
    return M.lands(T, S, dtype)


def lean_retract(M: GramManifold, sol: GramSolve, lr: float, weight_decay: float = 0.0, dtype=torch.float32):
    """(W+, landed, fix): the retraction of X = (1 - lr wd) W - lr A from the solve's n x n picture, without
    a host synchronisation and without an eigendecomposition. X = W a' + C b' has Gram matrix S = X^T X in
    n x n; the manifold's ``series_factor`` T puts X T on M by matrix products in float32 (Stiefel: S^{-1/2}
    by a series; DGram: the same series on S with its diagonal scaled out; GramOblique: the exact column
    scaling). S is assembled from W^T W (whole: W's own rounding off the manifold is seen and removed), W^T A
    (a row scaling on Stiefel and DGram) and the solve's A^T A (``GramSolve.AtA``), without an n x n product;
    the last products (X T where W^T W is diagonal, and W a + C b) are in the weights' precision. ``landed`` (a bool per matrix, a tensor) says where X T is on M to rounding; ``fix(bad)``
    recomputes those by retracting the m x n X itself (the optimizer reads ``landed`` in its one
    synchronisation per step, ``guard``)."""
    pic, A = sol.picture, sol.A
    c = 1 - lr * weight_decay

    def coefficients(dt):  # X = W a' + C b', a' = c I - lr a and b' = -lr b, in dt
        a = A.a.to(dt) * -lr
        a.diagonal(dim1=-2, dim2=-1).add_(c)
        return Span(a, A.b.to(dt) * -lr)

    if sol.AtA is None:
        S = gram(pic, coefficients(A.a.dtype), exact=True)
    else:  # S = c^2 W^T W - c lr (W^T A + A^T W) + lr^2 A^T A from what the solve knows: no n x n product; each
        # term is exactly symmetric (D and A^T A are formed so, a sum with its transpose is), so S is
        WtA = pic.dmul(A.a)
        S = torch.add(pic.D, sol.AtA, alpha=lr * lr).sub_(WtA + WtA.mT, alpha=lr) if c == 1 else \
            c * c * pic.D - c * lr * (WtA + WtA.mT) + lr * lr * sol.AtA
    S = S.to(torch.float32)
    T = M.series_factor(S, lr)
    landed = _landed(M, T, S, dtype)
    # X T in the weights' precision where W^T W is diagonal; elsewhere (Oblique) X's coefficients can be large
    # (W^T W ill conditioned) and X T stays in float64 (measured: float32 there doubles the constraint's rounding)
    dt = pic.W.dtype if pic.diagonal else A.a.dtype
    T = torch.nan_to_num(T).to(dt)
    W_new = coefficients(dt).times(T, pic).matrix(pic)

    def fix(bad):
        Xm = coefficients(A.a.dtype).matrix(pic)
        return _orient(torch.where(bad[..., None, None], M.retract(Xm), W_new), sol.wide)

    return _orient(W_new, sol.wide), landed, fix


def _orient(W, wide):
    return W.mT if wide else W


PAIR_RTOL = 1e-6  # a pair of S's eigenvectors is taken as (v, S v / s) where |v_hi^T S v_lo| >= (1 - PAIR_RTOL) s


def _skew_eig(W: torch.Tensor, G: torch.Tensor):
    """(W, E, S, s, V) for the closed form on square Stiefel: W and G in the products' precision, E = W^T W,
    S = 2 skew(W^T G) in float64 (from products in the weights' precision), and the float64 eigendecomposition
    of S^T S, S's singular values s ascending with their vectors V."""
    dt = torch.float64 if W.dtype == torch.float64 else torch.float32
    W, G = W.to(dt), G.to(dt)
    K = W.mT @ G
    E = W.mT @ W  # I + W's rounding off the manifold
    S = (K - K.mT).to(torch.float64)  # 2 skew(W^T G)
    lam, V = torch.linalg.eigh(S.mT @ S)
    return W, E, S, lam.clamp_min(0).sqrt(), V


def _retraction_coefficients(lr: float, weight_decay: float):
    """(c, kappa, a): X = W (c I - lr B), its inverse square root factor I / c + kappa Pi, and a = lr (1 / c + kappa)."""
    c = 1 - lr * weight_decay
    kappa = 1 / (c * c + lr * lr) ** 0.5 - 1 / c
    return c, kappa, lr * (1 / c + kappa)


def range_msign(S: torch.Tensor, s: torch.Tensor, V: torch.Tensor):
    """(keep, P): msign(S) = P V^T on S's numerical range (s > 1e-6 s_max; ``keep``), P = S V diag(1/s) in float64
    there and 0 off it, from the eigendecomposition of S^T S (s ascending, vectors V). Any real S: the general
    form that ``square_stiefel_step`` falls back to where its pairing of a skew S's vectors does not hold."""
    keep = s > 1e-6 * s[..., -1:]  # all False where S = 0: B = 0
    inv = torch.where(keep, s, 1).reciprocal_().mul_(keep)
    return keep, (S @ V).mul_(inv.unsqueeze(-2))


def _square_stiefel_general(W, E, S, s, V, lr, weight_decay):
    """(W+, gap) from B = msign(S) = P V^T (``range_msign``), the retraction's factor built from B and
    Pi = V diag(keep) V^T: two more n x n products than the paired form, one of them in float64."""
    dt = W.dtype
    keep, P = range_msign(S, s, V)
    P = P.to(dt)
    V32 = V.to(dt)  # then products in the weights' precision
    B = P @ V32.mT
    bound = (s * keep).sum(-1)
    gap = (bound - (S * B).sum((-2, -1))) / bound.clamp_min(torch.finfo(bound.dtype).tiny)  # 0 where S = 0
    c, kappa, a = _retraction_coefficients(lr, weight_decay)
    # (c I - lr B)(I / c + kappa Pi) = I + c kappa Pi - a B (B Pi = B), B taken skew: with Pi = V diag(keep) V^T and
    # skew(B) = (P V^T - V P^T) / 2, F = I + (c kappa V diag(keep) - a P / 2) V^T + a B^T / 2, then - E / 2 + I / 2
    F = (V32 * (c * kappa * keep).to(dt).unsqueeze(-2) - (0.5 * a) * P) @ V32.mT
    F = F.add_(B.mT, alpha=0.5 * a).sub_(E, alpha=0.5)
    F.diagonal(dim1=-2, dim2=-1).add_(1.5)
    return W @ F, gap


def skew_pairs(S: torch.Tensor, s: torch.Tensor, V: torch.Tensor):
    """(t, keep, gap, paired) for a skew S (float64) from the eigendecomposition of S^T S (s ascending, vectors V):
    per pair of neighbouring columns (v_lo, v_hi), counted from the top (odd n: column 0 has none), t = +-1 with
    S v_lo = t s v_hi, ``keep`` (the pair is on the numerical range, s > 1e-6 s_max), the relative gap of
    B = V Q V^T (Q = [[0, -t], [t, 0]] per kept pair; ``square_stiefel_step`` says why it is msign(S)), and
    ``paired`` (a bool per matrix): |v_hi^T S v_lo| >= (1 - PAIR_RTOL) s on every kept pair."""
    o = s.size(-1) % 2  # odd n: the smallest (a null direction of a real skew S) has no pair
    w = ((S @ V[..., o::2]) * V[..., o + 1::2]).sum(-2)  # v_hi^T S v_lo = +-s for a pair (v_lo, v_hi)
    s_hi = s[..., o + 1::2]
    keep = s_hi > 1e-6 * s[..., -1:]  # all False where S = 0: B = 0
    bound = ((s[..., o::2] + s_hi) * keep).sum(-1)
    a = w.abs()
    gap = (bound - 2 * (a * keep).sum(-1)) / bound.clamp_min(torch.finfo(bound.dtype).tiny)  # 0 where S = 0
    paired = ((a >= (1 - PAIR_RTOL) * s_hi) | ~keep).all(-1)
    return torch.sign(w) * keep, keep, gap, paired


def _pair_columns(V: torch.Tensor) -> torch.Tensor:
    """V's paired columns as (..., n, k, 2) (odd n: without column 0)."""
    return V[..., V.size(-1) % 2:].unflatten(-1, (-1, 2))


def skew_msign(S: torch.Tensor):
    """(B, gap, paired): msign(S) of a skew S (batched) on its numerical range, float64, from one eigendecomposition
    of S^T S by the pairing of its vectors (``skew_pairs``), B = V Q V^T; where the pairing does not hold
    (``paired`` False: two pairs share a singular value), the general form (``range_msign``)."""
    S = S.to(torch.float64)
    lam, V = torch.linalg.eigh(S.mT @ S)
    s = lam.clamp_min(0).sqrt()
    t, keep, gap, paired = skew_pairs(S, s, V)
    Vp = _pair_columns(V)
    B = (Vp.flip(-1) * torch.stack((t, -t), -1).unsqueeze(-3)).flatten(-2) @ Vp.flatten(-2).mT  # (V Q) V^T
    if not bool(paired.all()):
        keep_g, P = range_msign(S, s, V)
        B_g = P @ V.mT
        B = torch.where(paired[..., None, None], B, 0.5 * (B_g - B_g.mT))
        bound = (s * keep_g).sum(-1)
        gap = torch.where(paired, gap, (bound - (S * B).sum((-2, -1))) / bound.clamp_min(torch.finfo(bound.dtype).tiny))
    return B, gap, paired


def _square_stiefel_paired(W, G, lr: float, weight_decay: float = 0.0):
    """(W+, gap, paired, fix): ``square_stiefel_step`` by the pairing of S's eigenvectors (``skew_pairs``);
    ``paired`` (a bool per matrix, a tensor) says where it held on every kept pair, and ``fix(bad)`` returns
    (W+, gap) with the general form (``range_msign``) where ``bad``."""
    W, E, S, s, V = _skew_eig(W, G)
    dt = W.dtype
    t, keep, gap, paired = skew_pairs(S, s, V)
    c, kappa, a = _retraction_coefficients(lr, weight_decay)
    # F = V (c kappa diag(keep) - a Q) V^T + 3 I / 2 - E / 2, Q = V^T B V: per pair [[0, -t], [t, 0]]
    Vp = _pair_columns(V.to(dt))  # (..., n, k, 2): each pair's two columns
    t = (a * t).to(dt)
    VM = torch.addcmul(Vp * (c * kappa * keep).to(dt)[..., None, :, None], Vp.flip(-1),
                       torch.stack((-t, t), -1).unsqueeze(-3))
    F = (VM.flatten(-2) @ Vp.flatten(-2).mT).sub_(E, alpha=0.5)
    F.diagonal(dim1=-2, dim2=-1).add_(1.5)

    def fix(bad):
        W_g, gap_g = _square_stiefel_general(W, E, S, s, V, lr, weight_decay)
        return torch.where(bad[..., None, None], W_g, W_new), torch.where(bad, gap_g, gap)

    W_new = W @ F
    return W_new, gap, paired, fix


def square_stiefel_step(W: torch.Tensor, G: torch.Tensor, lr: float, weight_decay: float = 0.0):
    """Manifold Muon's step on square Stiefel (W orthogonal, n x n) in closed form: (W+, gap, violation).

    Tangent directions at W are A = W B with B skew, and ||A||_op = ||B||_op, so the inner problem is
    max <S, B> over skew B with ||B||_op <= 1, S = skew(W^T G) (the symmetric part of W^T G is orthogonal to
    every skew B). Its answer is B = msign(S): msign of a skew matrix is skew (S = U Sigma V^T gives
    S = -S^T = -V Sigma U^T, so U V^T = -(U V^T)^T by uniqueness of the polar factor on the range), it has
    op-norm 1, and <S, B> = ||S||_* meets the bound <S, B> <= ||S||_* ||B||_op: the certified gap is zero
    up to rounding. One float64 eigendecomposition of S^T S = -S^2 gives it, on the numerical range
    (s > 1e-6 s_max; 0 elsewhere: S comes from float32 products, whose rounding makes a true null direction look
    like s ~ 1e-7 s_max). That range is where it is exact: measured (chapter 04), on training-like momenta at
    768 x 768 S's smallest singular values sit near 1e-6 s_max, and in about half the draws one skew pair falls
    below and gets B = 0, an e_W of lr sqrt(2/n) against the SVD's closed form, with the certified gap unchanged
    (those directions carry ~1e-6 of the objective).

    How B is read off the eigendecomposition: S is skew, so S^T S = S S^T and each singular value comes twice,
    with the vectors v and S v / s (orthogonal, since v^T S v = 0). The eigenvalues come sorted, so the two of a
    pair are neighbours, counted from the top (odd n: the smallest, a null direction, has none); for a pair
    (v_lo, v_hi), S v_lo = t s v_hi and S v_hi = -t s v_lo with t = +-1, so B V = V Q, Q = [[0, -t], [t, 0]]
    per pair, and B = V Q V^T is skew and a partial isometry by construction. t and the objective
    <S, B> = 2 sum |w| come from w = v_hi^T S v_lo (half an n x n product in float64), and the pairing is
    checked: |w| >= (1 - 1e-6) s on every kept pair (measured on the benchmark's streams, chapter 04: within
    1e-10 at 127 x 127 and 128 x 128, and 2e-7 at 768 x 768 on a pair near 6e-6 s_max: the smallest kept pairs
    are the ones the eigendecomposition resolves least well). Where two pairs share a singular value (a gradient built
    that way), the eigenvectors of the shared eigenvalue are any basis of it, the check fails and that matrix
    takes the general form, B = S V diag(1/s) V^T (``range_msign``, two more n x n products, one in float64);
    ``square_stiefel_step`` reads the check on the host, the optimizer in its step's one read (``guard``).
    Where S has full rank (only possible for even n: a real
    skew matrix of odd size is singular) B is orthogonal; in general it is a partial isometry with
    B^T B = Pi, the projector on S's range. Then X = W Y, Y = c I - lr B (c = 1 - lr wd) has
    X^T X = c^2 I + lr^2 Pi exactly (B skew, W^T W = I), whose inverse square root is
    (I - Pi) / c + Pi / sqrt(c^2 + lr^2): the retraction (the polar factor of X) needs no second
    eigendecomposition, for odd n and rank-deficient gradients too. W's own rounding off the manifold
    (W^T W = I + E, E ~ 1e-7) is removed by the factor I - E / 2, so it does not add up; the factor is applied
    as F - E / 2 rather than (I - E / 2) F, which differs by E (F - I), of size |E| lr: below float32's rounding
    at the step sizes Muon uses, and still contracting (|F - I| < 1 for lr < sqrt(3) c). With B = V Q V^T and
    Pi = V diag(keep) V^T, F = V (c kappa diag(keep) - a Q) V^T + 3 I / 2 - E / 2 is one product.

    Cost (the skew part is taken as 2 skew(W^T G): the scale cancels in B and in the relative gap): five n x n
    products and a half against Muon's fifteen: four in the weights' precision (W^T G, W^T W, F, W F), S^T S and
    the half-product S V_lo in float64, and one float64 eigendecomposition (at n = 128 on one CPU thread, what
    keeps the step above 1.5x Muon's). Until 2026-12-05 B was formed as S V diag(1/s) V^T everywhere: seven
    products, two in float64 (P = S V diag(1/s) must be: in float32 its rounding, amplified by 1/s on the
    smallest kept singular values, left B's columns off unit length, and at lr 1 the weights drifted off the
    manifold to ~2e-4 over 1000 steps at n = 64; the paired form has no 1/s, and the test of that drift,
    ``tests/test_lean_step.py``, holds for both). The step's direction is skew by construction, so it is
    tangent and ``violation`` is 0.
    """
    W_new, gap, paired, fix = _square_stiefel_paired(W, G, lr, weight_decay)
    if not bool(paired.all()):  # the one host read (the optimizer folds it into its step's one: ``guard``)
        W_new, gap = fix(~paired)
    return W_new, gap, torch.zeros_like(gap, dtype=W_new.dtype)




def _column_dots(X, Y):
    """diag(X^T Y) without the product: the per-column dot products, shape (..., n)."""
    return (X * Y).sum(-2)


OBLIQUE_RHO = 2.0  # the Oblique lean step's ADMM penalty (``oblique_solve``: why 2)


def oblique_solve(W: torch.Tensor, G: torch.Tensor, warm=None, steps: int = 1, rho: float | None = None,
                  relax: float = 1.8, normalize: bool = True, certify_first: bool = False):
    """The lean solve on Oblique weights (unit columns of the tall orientation; a wide W is transposed), in the
    matrix itself rather than the Gram picture: (A, gap, Lambda, U, wide), float64, A tall and in unit-RMS G
    units (as ``lean_solve``'s). ``warm``: (Lambda, U), the multiplier (n x n, diagonal) and the ADMM's scaled
    multiplier (an m x n matrix, tall; None: 0) carried from the last step (as the optimizer carries it for the
    Gram picture too, on rectangular weights: ``ManifoldMuon._carry``); None: the cold
    start (the tangent projection of G). ``steps``, ``rho``, ``relax``, ``normalize`` and ``certify_first`` as in
    ``inner_solvers.lean_solve`` (``steps`` ADMM iterations; with ``certify_first`` the certificate at the carried
    multiplier first, its eigendecomposition shared by the first iteration, which then starts from U = 0).

    Why not the Gram picture (``lean_solve``, which every other rectangular weight takes): the picture pays four
    m x n products up front (W^T W, W^T G, C = G - W K0, C^T C) so that everything after them is n x n, which is
    worth it where the multiplier is a full matrix (Stiefel, DGram: Z = G + 2 W Lambda is itself a product). On
    Oblique it is diagonal (the constraint reads diag(W^T A) = 0), so in the matrix Z = G + 2 W Lambda is a column
    scaling, the tangent projection X - W diag(gamma), gamma_i = <w_i, x_i> / ||w_i||^2, needs column dot products
    only, and the retraction (each column divided by its norm) no product at all: the certificate takes four
    m x n x n products (Z^T Z, then msign(Z) = ((Z V) diag(1/s)) V^T, then X^T X for the op-norm), one float64
    eigh and one float32 eigvalsh (the op-norm, with ``feasible``'s 1e-6 margin); an ADMM iteration two m x n x n
    products (Zp^T Zp, Zp F), one n x n (the shrink factor F) and one eigh (float32, below), its Zp^T Zp and eigh
    those of the certificate under ``certify_first``: six m x n x n products a step by default, five certified
    first. The picture's step took six m x n products and about twenty n x n ones. And on a square weight the
    picture divides by W: its coefficients solve (W^T W) K0 = W^T G, and a random square point of the Oblique manifold
    has an ill-conditioned W^T W (3.5e8 in chapter 04's draw at n = 128, where the picture's certificate candidate at
    a given multiplier was 12% from the same candidate by an SVD and outside the unit ball by a few 1e-6; this solve's
    agreed with the SVD's to within 1e-5 with float64 candidate products, 1e-4 with float32 ones). The
    certificate is in float64 (the float32 entries of W and G are exact there), but for the two products that
    form its candidate msign(Z) from the float64 V and s, which are in the iterations' precision: the candidate
    is then made tangent, its op-norm measured and its value <G, A> taken in float64 on the candidate as
    rounded, so its rounding moves the answer, not the certificate's honesty (measured on the benchmark
    ``solver_table``, chapter 04, with the fused elementwise work that came with it: e_W six steps in within
    5.1% of itself, the settled e_W of the tracked step 0.86-1.24x what it was, all below 0.1% of the weight,
    the step 0.81-0.97x as long). The ADMM iterations are in float32 on float32 and bfloat16 weights (float64
    on float64 ones), as the Gram picture's lean iterations are: they only move the multiplier (and U) that the
    float64 certificate then judges, and U is returned (and carried) in their precision. Measured on the
    benchmark ``solver_table``'s streams, against the same iterations in float64: e_W at lr 0.02 (first and
    settled) moved by at most 0.16% of itself (with the old rho below; with rho = 2 the same to three digits at
    the CPU presets' widths), and the step's ratio to Muon's fell to 0.62-0.89 of what it
    was on the tall and square weights (chapter 04).

    ``rho`` (the ADMM penalty) defaults to ``OBLIQUE_RHO`` = 2 in unit-RMS units of G (``normalize``; in G's own
    units otherwise), not the Gram picture's 1/sqrt(n): the singular value thresholding at 1/rho = 0.5 keeps
    nearly every singular value of Z, so that U = rho (Z+ - X) tracks msign(Z) where 1/sqrt(n) kept the top few.
    Tuned on streams the benchmark does not judge (rotating streams of seed 7, prototype runs: rho in
    1/sqrt(n) x {1, ..., 1024} at 384 x 128 and 128 x 128, x {8, 16, 32} at 128 x 512, from 1/sqrt(n) to 9.2 at
    768 x 2304): the settled e_W was smallest at rho = 1.4 (n = 128) and 2.3 (n = 768), 5-24x below
    1/sqrt(n)'s; chapter 04 judges 2 on the table's own streams, and shows the scan run again as a benchmark
    part on one grid with the library as it is (``solver_table.rho_scan``). The gap is a certificate: the value
    <G, A> of a feasible A (tangent, op-norm <= 1; one with <G, A> < 0 replaced by 0) against
    ||G + 2 W Lambda||_* (weak duality)."""
    return _oblique_solve(W, G, warm, steps, rho, relax, normalize, certify_first)[:5]


def _oblique_solve(W, G, warm, steps, rho, relax, normalize, certify_first):
    """``oblique_solve``, which see, and the tall float64 W it made (for ``oblique_step``)."""
    wide = W.size(-2) < W.size(-1)
    W64, G64 = (W.mT, G.mT) if wide else (W, G)
    W64, G64 = (X.to(torch.float64, memory_format=torch.contiguous_format) for X in (W64, G64))
    n = W64.size(-1)
    rtol = 1e-7 if W.dtype == torch.float64 else 1e-6
    rho = rho if rho is not None else OBLIQUE_RHO
    if normalize:  # unit RMS: ||G||_F = sqrt(mn)
        norm = torch.linalg.vector_norm(G64, dim=(-2, -1)) * (G64.size(-2) * n) ** -0.5
        G64 = G64 / norm.clamp_min(torch.finfo(torch.float64).tiny)[..., None, None]
    d = _column_dots(W64, W64)  # diag(W^T W): 1 to W's rounding
    it = torch.float64 if W.dtype == torch.float64 else torch.float32  # the iterations' precision (below)
    if warm is None:  # the tangent projection of G: Lambda_ii = -<w_i, g_i> / (2 d_i)
        lam, U = -_column_dots(W64, G64) / (2 * d), None
    else:
        lam, U = torch.diagonal(warm[0], dim1=-2, dim2=-1).to(torch.float64), warm[1]
        U = None if U is None else U.to(it)

    def z_of(lam, G=G64, W=W64):  # Z = G + 2 W Lambda (in the iterations' precision where they pass theirs)
        return torch.addcmul(G, W, lam.unsqueeze(-2), value=2)

    def eig(Z):  # eigh reads the lower triangle only: Z^T Z needs no symmetrising
        return eig_sqrt(Z.mT @ Z)

    def certify(lam, V_s=None):
        Z = z_of(lam)
        V, s = eig(Z) if V_s is None else V_s
        V_it = V.to(it)  # msign(Z) = Z V diag(1/s) V^T: products in the iterations' precision, V and s float64
        X = ((Z.to(it) @ V_it) * inv_sqrt(s, rtol).to(it).unsqueeze(-2) @ V_it.mT).to(torch.float64)
        X = torch.addcmul(X, W64, (-_column_dots(W64, X) / d).unsqueeze(-2))  # its orthogonal tangent part
        op = torch.linalg.eigvalsh((X.mT @ X).to(torch.float32))[..., -1].to(torch.float64)
        A = X / (op.clamp_min(0).sqrt().clamp_min(1) * (1 + 1e-6))[..., None, None]
        value = torch.linalg.vecdot(G64.flatten(-2), A.flatten(-2))
        keep = value >= 0  # an uphill candidate is worse than no step (``inner_solvers.feasible``)
        return torch.where(keep[..., None, None], A, 0), value.clamp_min(0), s.sum(-1), (V, s)

    W_it, G_it, d_it = W64.to(it), G64.to(it), d.to(it)

    def iterate(lam, U, k, V_s=None):
        X = None
        lam = lam.to(it)
        for _ in range(k):
            Y = z_of(lam, G_it, W_it)
            if X is not None and relax != 1.0:
                Y = torch.lerp(X, Y, relax)  # relax Y + (1 - relax) X
            Zp = Y if U is None else torch.add(Y, U, alpha=1 / rho)
            V, s = eig(Zp) if V_s is None else (V_s[0].to(it), V_s[1].to(it))
            V_s = None
            X = Zp @ factor(V, s, shrink(rho))
            Ur = Zp - X
            lam = _column_dots(W_it, (X - Ur).sub_(G_it)) / (2 * d_it)
            U = Ur.mul_(rho)
        return lam.to(torch.float64), U

    if certify_first and steps:
        A, value, bound, V_s = certify(lam)
        lam, U = iterate(lam, None, steps, V_s)
    else:
        lam, U = iterate(lam, U, steps)
        A, value, bound, _ = certify(lam)
    gap = (bound - value) / bound.clamp_min(torch.finfo(bound.dtype).tiny)
    return A, gap, torch.diag_embed(lam), U, wide, W64


def oblique_step(W: torch.Tensor, G: torch.Tensor, lr: float, weight_decay: float = 0.0, warm=None, steps: int = 1,
                 rho: float | None = None, relax: float = 1.8, normalize: bool = True, certify_first: bool = False):
    """``oblique_solve``, then the retraction of (1 - lr wd) W - lr A (each column of the tall orientation divided by
    its norm: exact, no product): (W+, gap, violation, Lambda, U), violation the RMS of P(W^T A + A^T W), U tall
    (None where nothing is carried: ``certify_first`` and ``steps=0`` start the next step's iterations from 0)."""
    A, gap, Lambda, U, wide, W64 = _oblique_solve(W, G, warm, steps, rho, relax, normalize, certify_first)
    violation = 2 * torch.linalg.vector_norm(_column_dots(W64, A), dim=-1) / W64.size(-1)
    X = torch.add(W64 if weight_decay == 0 else (1 - lr * weight_decay) * W64, A, alpha=-lr)
    W_new = GramOblique()._retract_tall(X).to(W.dtype)
    return (W_new.mT if wide else W_new), gap, violation, Lambda, (None if certify_first and steps else U)


class ManifoldMuon(MatrixOptimizer):
    """Manifold Muon on a Gram-space manifold: ``manifold`` = "stiefel", "dgram", "gram_oblique" or an instance.

    Args:
        lr: step length of W - lr * A (A has singular values <= 1).
        momentum, nesterov: Muon momentum on the gradient.
        inner: "gram_admm" (default), "lean", "exact", "post", "dual_ascent" or "admm" (module docstring).
        inner_steps: iterations (None: for lean 1 (CG steps on Stiefel and rectangular DGram, ADMM elsewhere; 0 on
            Stiefel given tracker="admm"), 16 ADMM before Newton
            for exact, 16 for gram_admm, 20 for post / dual_ascent, 10 for admm).
        tol: the relative residual the inner solve stops at: gram_admm / exact stop when the relative
            duality gap is <= tol (1e-3 / 1e-6); dual_ascent / admm stop a matrix when ||H||_RMS < tol
            (default None: never). lean does fixed work and refuses it.
        warm_start: start each solve from the previous step's multipliers (default: True for gram_admm and
            exact; for lean False on Stiefel, True on DGram and Oblique).
        certify_first: lean only: certify the carried multiplier first, then iterate for the next step, the
            two sharing one eigendecomposition (``inner_solvers.lean_solve``, ``oblique_solve``; default False,
            True on Oblique from 2026-12-03 to 2026-12-04; given True where warm_start is False or inner_steps 0,
            it is refused).
        tracker: lean only: how the multiplier is carried from step to step, "admm" (``inner_steps`` ADMM
            iterations), "newton" (one damped Newton step on the dual with ``inner_steps`` preconditioned
            conjugate-gradient steps, ``inner_solvers.newton_track``; on Stiefel in N's eigenbasis, where the
            Hessian's first term is diagonal, elsewhere Jacobi-preconditioned; its first step, with no multiplier
            carried yet, starts from ``inner_solvers.NEWTON_START`` ADMM iterations), "newton_dk" (the same Newton
            step, then the direction and a certified bound at the new multiplier from the carried multiplier's
            eigendecomposition instead of a second one: one eigendecomposition and one host read a step fewer,
            ``inner_solvers.first_order_certificate``; opt-in, measured on the CPU only: chapter 04), "newton_cold"
            (nothing carried: the "newton_dk" step from a zero multiplier, shortened to
            ``inner_solvers.NEWTON_COLD_LENGTH`` of its length) or "auto" (the default: "newton_cold" on Stiefel
            weights at least 2.5 times as long as wide and the tangent projection's cold step on the other Stiefel
            weights, "newton" on rectangular DGram weights, "admm" elsewhere, ``resolve_tracker``). "newton", "newton_dk" (and
            "auto" on DGram) need warm_start and inner_steps >= 1 and refuse certify_first and rho; "newton_cold"
            (and "auto" on Stiefel) needs inner_steps >= 1 and refuses warm_start, certify_first and rho.
        alpha: dual-ascent step (linear decay to 0), read by post / dual_ascent; rho: ADMM penalty
            (None: 1/sqrt(n)), read by gram_admm / lean / admm.
        normalize: rescale G to unit RMS before the solve (lean, post and dual_ascent; False for "post", as
            the post does).
        msign, ns_steps, msign_dtype: the msign inside post / dual_ascent / admm (None: the package's DEFAULT,
            Newton-Schulz 5 for "post"); lean, exact and gram_admm compute msign exactly through an n x n eigh.

    Every setting left at None takes its solver's default (``SOLVER_DEFAULTS``); a setting the chosen solver
    does not read (``SOLVER_SETTINGS``) is refused with a ValueError that names the solvers that read it.
    """

    manifold_family = GramManifold
    default_manifold = "stiefel"
    POST_RECIPE = POST_RECIPE

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 manifold="stiefel", inner: str = "gram_admm", inner_steps: int | None = None,
                 tol: float | None = None, warm_start: bool | None = None, alpha: float | None = None,
                 rho: float | None = None, normalize: bool | None = None, weight_decay: float = 0.0,
                 msign: str | None = None, ns_steps: int | None = None, msign_dtype: torch.dtype | None = None,
                 nonfinite: str = "raise", split: int = 1, certify_first: bool | None = None,
                 tracker: str | None = None):
        super().__init__(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                         msign=msign, ns_steps=ns_steps, msign_dtype=msign_dtype, nonfinite=nonfinite,
                         manifold=manifold, split=split, inner=inner, inner_steps=inner_steps, alpha=alpha, rho=rho, tol=tol,
                         warm_start=warm_start, normalize=normalize, certify_first=certify_first, tracker=tracker)

    def add_param_group(self, param_group: dict) -> None:
        """Settings left at None take the defaults of the group's solver (``SOLVER_DEFAULTS``) before checking."""
        inner = param_group.get("inner", self.defaults["inner"])
        if inner not in SOLVER_DEFAULTS:
            raise ValueError(f"ManifoldMuon: unknown inner solver {inner!r}; choose one of {', '.join(SOLVER_DEFAULTS)}")
        inert = [k for k in ("inner_steps", "tol", "warm_start", "alpha", "rho", "normalize", "msign", "ns_steps",
                             "msign_dtype", "certify_first", "tracker")
                 if k not in SOLVER_SETTINGS[inner] and param_group.get(k, self.defaults.get(k)) is not None]
        if inert:
            readers = {k: [s for s, keys in SOLVER_SETTINGS.items() if k in keys] for k in inert}
            raise ValueError(f"ManifoldMuon(inner={inner!r}) does not read {', '.join(inert)} "
                             f"({'; '.join(dict.fromkeys(_WHY_NOT[k] for k in inert))}), so it would do nothing: "
                             "leave it out, or choose an inner solver that reads it ("
                             + "; ".join(f"{k}: {', '.join(v)}" for k, v in readers.items()) + ")")
        certify_first = param_group.get("certify_first", self.defaults.get("certify_first"))  # as the user gave it
        tracker = param_group.get("tracker", self.defaults.get("tracker"))  # as the user gave it
        if inner == "lean":  # by manifold first (cold on Stiefel, tracked elsewhere)
            if tracker is not None and tracker not in TRACKERS:
                raise ValueError(f"ManifoldMuon(inner='lean'): tracker must be 'auto' (by manifold and shape), 'admm' (ADMM "
                                 f"iterations), 'newton' (one damped Newton step on the dual), 'newton_dk' (the same "
                                 f"with one eigendecomposition a step) or 'newton_cold' (one Newton step from a zero "
                                 f"multiplier, nothing carried), got {tracker!r}")
            for key, value in lean_defaults(param_group.get("manifold", self.defaults["manifold"]), tracker).items():
                if param_group.get(key, self.defaults.get(key)) is None:
                    param_group[key] = value
            if certify_first is None and not (param_group.get("warm_start", self.defaults.get("warm_start"))
                                              and param_group.get("inner_steps", self.defaults.get("inner_steps"))):
                param_group["certify_first"] = False  # nothing carried (given warm_start=False or inner_steps=0)
        for key, value in SOLVER_DEFAULTS[inner].items():
            if param_group.get(key, self.defaults.get(key)) is None:
                param_group[key] = value
        if inner == "lean" and param_group.get("inner_steps", self.defaults.get("inner_steps")) == 0 \
                and param_group.get("rho", self.defaults.get("rho")) is not None:
            raise ValueError("ManifoldMuon(inner='lean') with inner_steps=0 (tracker='admm' on Stiefel: the tangent "
                             "projection's cold step) runs no ADMM iteration, so rho (the ADMM penalty) would do nothing: "
                             "leave rho out, or give inner_steps >= 1 for it to act")
        from ..manifolds import get_manifold

        cold = param_group.get("tracker", self.defaults.get("tracker")) == COLD_TRACKER or (
            param_group.get("tracker", self.defaults.get("tracker")) == "auto"
            and isinstance(get_manifold(param_group.get("manifold", self.defaults["manifold"])), Stiefel))
        if inner == "lean" and cold:  # (auto on Stiefel: its rectangular weights take the cold Newton step)
            given = {k: param_group.get(k, self.defaults.get(k)) for k in ("warm_start", "inner_steps", "rho")}
            if given["warm_start"] or not given["inner_steps"] or certify_first is True or given["rho"] is not None:
                raise ValueError("ManifoldMuon(inner='lean', tracker='newton_cold', or 'auto' on Stiefel, the default "
                                 "there) carries nothing from step to step and takes one Newton step of inner_steps >= 1 "
                                 "conjugate-gradient steps from a zero multiplier, so warm_start, certify_first and rho "
                                 "would do nothing: leave them out and give inner_steps >= 1, or give tracker='admm' "
                                 "for ADMM iterations (on Stiefel with inner_steps=0: the tangent projection's cold "
                                 "step, the default there before 2026-12-07)")

        newton = param_group.get("tracker", self.defaults.get("tracker")) in NEWTON_TRACKERS or (
            param_group.get("tracker", self.defaults.get("tracker")) == "auto"
            and isinstance(get_manifold(param_group.get("manifold", self.defaults["manifold"])), DGram))
        if inner == "lean" and newton:  # (auto on DGram: its rectangular weights take the Newton step)
            given = {k: param_group.get(k, self.defaults.get(k)) for k in ("warm_start", "inner_steps", "rho")}
            if not given["warm_start"] or not given["inner_steps"] or certify_first is True or given["rho"] is not None:
                raise ValueError("ManifoldMuon(inner='lean', tracker='newton' or 'newton_dk', or 'auto' on DGram, the "
                                 "default there) carries the multiplier from step to step (warm_start=True), takes inner_steps >= 1 "
                                 "conjugate-gradient steps, certifies after its Newton step and has no ADMM penalty: "
                                 "leave warm_start, certify_first and rho out (or give tracker='admm' for them), and "
                                 "give inner_steps >= 1")
        if inner == "lean" and certify_first is True and not (
                param_group.get("warm_start", self.defaults.get("warm_start"))
                and param_group.get("inner_steps", self.defaults.get("inner_steps"))):
            raise ValueError("ManifoldMuon(inner='lean', certify_first=True) certifies the multiplier carried from the "
                             "last step and iterates for the next one; with warm_start=False or inner_steps=0 (the "
                             "defaults on Stiefel) nothing is carried, so it would only throw the iterations away: "
                             "give warm_start=True and inner_steps >= 1, or leave certify_first out")
        super().add_param_group(param_group)

    def check_group(self, group):
        if not (isinstance(group["inner_steps"], int) and group["inner_steps"] >= 0):
            raise ValueError(f"ManifoldMuon: inner_steps must be an int >= 0, got {group['inner_steps']!r}")
        if group["inner"] == "lean" and not isinstance(group["certify_first"], bool):
            raise ValueError(f"ManifoldMuon: certify_first must be True or False, got {group['certify_first']!r}")
        if group["inner"] == "lean" and group["tracker"] not in TRACKERS:
            raise ValueError(f"ManifoldMuon: tracker must be one of {', '.join(TRACKERS)}, got {group['tracker']!r}")
        if group["inner"] in ("gram_admm", "exact") and not (isinstance(group["tol"], (int, float)) and group["tol"] >= 0):
            raise ValueError(f"ManifoldMuon: gram_admm stops on a relative duality gap tol >= 0, got {group['tol']!r}")
        if group["split"] != 1:
            raise ValueError(f"ManifoldMuon(split={group['split']!r}): ManifoldMuon steps each weight as one matrix on "
                             "its manifold and does not split it into row blocks (the sphere optimizers MACRO, MuonH, "
                             "SSO and FSO do); use split=1, or give W_q, W_k and W_v as separate parameters")

    # ------------------------------------------------------------------ the Gram-space solve, fused

    def update(self, W, G, group, states, shape):
        if group["inner"] == "lean":
            return self._lean_update(W, G, group, states)
        if group["inner"] not in ("gram_admm", "exact"):
            return super().update(W, G, group, states, shape)
        M = group["manifold"]
        warm = self._warm(group, states)
        if group["inner"] == "exact":
            sol = exact_solve(W, G, M.gram_projector, warm=warm, tol=group["tol"], admm_steps=group["inner_steps"],
                              eigenbasis=isinstance(M, Stiefel))
        else:
            sol = gram_solve(W, G, M.gram_projector, steps=group["inner_steps"], tol=group["tol"], rho=group["rho"],
                             warm=warm)
        # the exact mode's Newton solve keeps no U (it returns U = 0): none is carried, as the next step starts from
        # U = 0 without one (``_warm``) and the tall U would cost two m x n products (a host read: the exact mode's)
        with_U = group["inner"] != "exact" or bool(sol.U.a.any() | sol.U.b.any())
        self._record(states, group, rms(M.gram_projector(tangent_defect(sol.picture, sol.A))), sol, with_U)
        return fused_retract(M, sol, group["lr"], group["weight_decay"], W.dtype)

    def _lean_update(self, W, G, group, states):
        """The lean default: square Stiefel in closed form (``square_stiefel_step``); Oblique (tracked by ADMM, the
        default there) in the matrix itself (``oblique_step``); elsewhere in the Gram picture
        (``_picture_update``: ``lean_solve`` from the last step's multiplier where ``warm_start``, else from the
        tangent projection, the defaults by manifold, ``lean_defaults``; then ``lean_retract``). No host read of
        its own: diagnostics stay tensors, the retraction's guard is read once per step by ``step`` (torch's
        eigendecompositions read their LAPACK / cuSOLVER status once per batched call, ``manifold_muon.opcount``)."""
        M, lr, wd = group["manifold"], group["lr"], group["weight_decay"]
        if isinstance(M, Stiefel) and W.size(-2) == W.size(-1):
            W_new, gap, paired, fix = _square_stiefel_paired(W, G, lr, wd)
            zero = torch.zeros((), dtype=W_new.dtype, device=W.device)
            for i, s in enumerate(states):
                s["tangent_violation"], s["duality_gap"] = zero, gap[i]
                s["inner_iterations"] = torch.zeros((), dtype=torch.long, device=W.device)

            def general(bad):  # read in the step's one host synchronisation (``guard``)
                W_g, gap_g = fix(bad)
                for i, s in enumerate(states):
                    s["duality_gap"] = gap_g[i]
                return W_g

            self.guard(paired, general)
            return W_new
        if isinstance(M, GramOblique) and resolve_tracker(M, group["tracker"], W.shape) == "admm":
            return self._oblique_update(W, G, group, states)
        return self._picture_update(W, G, group, states)

    def _picture_update(self, W, G, group, states):
        """The lean step in the Gram picture (``lean_solve``, ``lean_retract``): Stiefel (but square) and DGram
        weights, and Oblique ones given ``tracker="newton"`` or ``"newton_dk"``."""
        M, lr, wd = group["manifold"], group["lr"], group["weight_decay"]
        warm = self._warm(group, states)
        damping = None
        if warm is not None and all("newton_t" in s for s in states):
            damping = torch.stack([s["newton_t"] for s in states])
        steps = lean_steps(M, group["tracker"], W.shape, group["inner_steps"])
        tracker = resolve_tracker(M, group["tracker"], W.shape)
        sol = lean_solve(W, G, M.gram_projector, warm=warm, steps=steps, rho=group["rho"],
                         normalize=group["normalize"], diagonal=M.diagonal_gram, certify_first=group["certify_first"],
                         tracker=tracker, damping=damping,
                         eigenbasis=isinstance(M, Stiefel))
        violation = rms(M.gram_projector(tangent_defect(sol.picture, sol.A)))
        for i, s in enumerate(states):
            s["tangent_violation"], s["duality_gap"], s["inner_iterations"] = violation[i], sol.gap[i], sol.iterations[i]
            if sol.damping is not None:
                s["newton_t"] = sol.damping[i]
        if group["warm_start"]:
            self._carry(states, sol, with_U=sol.damping is None)  # the Newton tracker keeps no U
        W_new, landed, fix = lean_retract(M, sol, lr, wd, W.dtype)
        self.guard(landed, fix)
        return W_new

    @staticmethod
    def _carry(states, sol, with_U: bool = True, clone: bool = False):
        """Keep the solve's dual (Lambda, U) in ``states`` for the next step's warm start (``_warm``). U, ADMM's
        scaled multiplier, is an m x n matrix that the solve holds by its coefficients in this step's picture,
        U = W U.a + C U.b. On a rectangular weight it is kept as the tall m x n matrix ("U", two m x n products)
        and the next step reads it in its own picture (``inner_solvers.span_of``): the coefficients alone would be
        read against the next momentum's C, another matrix (measured on the benchmark ``solver_table``'s
        stationary stream: the default solve settles 1.4-1.8x further from the optimum with the coefficients on
        rectangular Stiefel and DGram weights at the CPU presets' widths, chapter 04). On a square weight
        C = 0 and U = W U.a: the coefficient is kept ("U_a", no product; the next W differs by the step, lr A).
        ``with_U`` False (the Newton tracker): no U (the next step starts from U = 0). Each path removes the keys
        it does not keep, so every state holds one U."""
        square = sol.picture.W.size(-2) == sol.picture.W.size(-1)
        U = sol.U.matrix(sol.picture) if with_U and not square else None
        for i, s in enumerate(states):
            s["Lambda"] = sol.Lambda[i].clone() if clone else sol.Lambda[i]
            for key in ("U", "U_a", "U_b"):
                s.pop(key, None)
            if with_U and square:
                s["U_a"] = sol.U.a[i].clone() if clone else sol.U.a[i]
            elif with_U:
                s["U"] = U[i]

    @staticmethod
    def _warm(group, states):
        """(Lambda, U) from the last step's state where ``warm_start`` and every state has a multiplier, else None.
        U: the tall m x n matrix "U" (``_carry``, ``_oblique_update``), or a Span of the square picture's
        coefficient "U_a" (with "U_b", as states saved before 2026-12-04 keep it), or 0 where the last step kept
        none."""
        if not (group["warm_start"] and all("Lambda" in s for s in states)):
            return None
        Lambda = torch.stack([s["Lambda"] for s in states])
        if all(s.get("U") is not None for s in states):
            return Lambda, torch.stack([s["U"] for s in states])
        if all(s.get("U_a") is not None for s in states):
            U_a = torch.stack([s["U_a"] for s in states])
            U_b = (torch.stack([s["U_b"] for s in states]) if all(s.get("U_b") is not None for s in states)
                   else torch.zeros_like(U_a))
            return Lambda, Span(U_a, U_b)
        return Lambda, Span(torch.zeros_like(Lambda), torch.zeros_like(Lambda))

    @staticmethod
    def _oblique_update(W, G, group, states):
        """The lean step on Oblique weights (``oblique_step``): the multiplier kept as "Lambda" (n x n, as the
        Gram picture keeps it), the ADMM's scaled multiplier as the tall m x n matrix "U" where the next step
        starts from it (``certify_first=False``), as the picture keeps it on rectangular weights (``_carry``; on square
        ones its coefficient "U_a"), so either resumes from the other's multiplier and U."""
        warm = None
        if group["warm_start"] and all("Lambda" in s for s in states):
            U = (torch.stack([s["U"] for s in states]) if all(s.get("U") is not None for s in states) else None)
            warm = (torch.stack([s["Lambda"] for s in states]), U)
        W_new, gap, violation, Lambda, U = oblique_step(
            W, G, group["lr"], group["weight_decay"], warm=warm, steps=group["inner_steps"], rho=group["rho"],
            normalize=group["normalize"], certify_first=group["certify_first"])
        for i, s in enumerate(states):
            s["tangent_violation"], s["duality_gap"] = violation[i], gap[i]
            s["inner_iterations"] = torch.full((), group["inner_steps"], dtype=torch.long, device=W.device)
            if group["warm_start"]:
                s["Lambda"] = Lambda[i]
                for key in ("U", "U_a", "U_b"):
                    s.pop(key, None)
                if U is not None:
                    s["U"] = U[i]
        return W_new

    def _record(self, states, group, violation, sol, with_U: bool = True):
        for i, s in enumerate(states):  # tensors: read when logged, not every step
            s["tangent_violation"], s["duality_gap"], s["inner_iterations"] = violation[i], sol.gap[i], sol.iterations[i]
        if group["warm_start"]:
            self._carry(states, sol, with_U=with_U, clone=True)

    # ------------------------------------------------------------------ dual ascent / ADMM on m x n matrices

    def direction(self, W, G, group, states):
        P = group["manifold"].gram_projector
        Lambda0 = None
        if group["warm_start"] and all("Lambda" in s for s in states):
            Lambda0 = torch.stack([s["Lambda"] for s in states])
        sign = self.msign_fn(group)
        msign_fn = lambda X: sign(X).to(X.dtype)  # noqa: E731 - a bfloat16 msign_dtype rounds the msign, not the solve
        if group["inner"] in ("dual_ascent", "post"):
            A, Lambda, _ = dual_ascent(W, G, P, steps=group["inner_steps"], alpha=group["alpha"], tol=group["tol"],
                                       Lambda0=Lambda0, msign_fn=msign_fn, normalize=group["normalize"])
        else:
            A, Lambda, _ = admm(W, G, P, steps=group["inner_steps"], rho=group["rho"], tol=group["tol"],
                                Lambda0=Lambda0, msign_fn=msign_fn)
        wide = W.size(-2) < W.size(-1)
        Wt, At = (W.mT, A.mT) if wide else (W, A)
        violation = rms(P(Wt.mT @ At + At.mT @ Wt))
        for s, lam, v in zip(states, Lambda, violation):
            s["tangent_violation"] = v
            if group["warm_start"]:
                s["Lambda"] = lam.clone()
        return A
