"""Manifold Muon (Bernstein), on any Gram-space manifold (Keigwin), batched over same-shape matrices.

    G  = Muon momentum direction of the gradient                       (``base``)
    A  = argmax <G, A>  s.t.  ||A||_op <= 1,  A tangent at W             (inner solver on the dual, ``inner_solvers``)
    W <- retract(W - lr A)

Inner solvers (``inner``):

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

from ..manifolds.gram import GramManifold
from ..msign import DEFAULT, msign
from .base import MatrixOptimizer
from .inner_solvers import GramSolve, Span, admm, dual_ascent, gram, gram_solve, rms, tangent_defect


__all__ = ["ManifoldMuon", "POST_RECIPE", "fused_retract", "post_msign"]

# The blog post's inner solve, one argument away (inner="post"): what "Different Layers, Different
# Manifolds" ran for every constrained matrix.
POST_RECIPE = dict(inner_steps=20, alpha=0.1, normalize=False, warm_start=False, tol=None, msign="newton_schulz",
                   ns_steps=5)


def post_msign(X: torch.Tensor) -> torch.Tensor:
    """The post's matrix sign, as ``POST_RECIPE`` names it: Jordan's quintic Newton-Schulz, 5 steps."""
    return msign(X, POST_RECIPE["msign"], POST_RECIPE["ns_steps"])

# Settings left at None take these, per solver.
SOLVER_DEFAULTS = {
    "gram_admm": dict(inner_steps=16, tol=1e-3, warm_start=True, normalize=True, msign=DEFAULT.method,
                      ns_steps=DEFAULT.steps),
    "post": POST_RECIPE,
    "dual_ascent": dict(inner_steps=20, tol=None, warm_start=False, normalize=True, msign=DEFAULT.method,
                        ns_steps=DEFAULT.steps),
    "admm": dict(inner_steps=10, tol=None, warm_start=False, normalize=True, msign=DEFAULT.method,
                 ns_steps=DEFAULT.steps),
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
    W_new = (X @ T.to(X.a.dtype)).matrix(pic) if T is not None else M.retract(X.matrix(pic))
    return W_new.mT if sol.wide else W_new


class ManifoldMuon(MatrixOptimizer):
    """Manifold Muon on a Gram-space manifold: ``manifold`` = "stiefel", "dgram", "gram_oblique" or an instance.

    Args:
        lr: step length of W - lr * A (A has singular values <= 1).
        momentum, nesterov: Muon momentum on the gradient.
        inner: "gram_admm" (default), "post", "dual_ascent" or "admm" (see the module docstring).
        inner_steps: iteration cap (None: 16 for gram_admm, 20 for post / dual_ascent, 10 for admm).
        tol: gram_admm stops when the relative duality gap is <= tol (default 1e-3); dual_ascent / admm
            stop a matrix when ||H||_RMS < tol (default None: never).
        warm_start: start each solve from the previous step's multipliers (default: True for gram_admm).
        alpha: dual-ascent step (linear decay to 0); rho: ADMM penalty (None: 1/sqrt(n)).
        normalize: rescale G to unit RMS before the solve (default True; False for "post", as the post does).
        msign, ns_steps, msign_dtype: the msign inside dual_ascent / admm (None: the package's DEFAULT,
            Newton-Schulz 5 for "post"); gram_admm computes msign exactly through an n x n eigh.
    """

    manifold_family = GramManifold
    default_manifold = "stiefel"
    POST_RECIPE = POST_RECIPE

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 manifold="stiefel", inner: str = "gram_admm", inner_steps: int | None = None,
                 tol: float | None = None, warm_start: bool | None = None, alpha: float = 0.1,
                 rho: float | None = None, normalize: bool | None = None, weight_decay: float = 0.0,
                 msign: str | None = None, ns_steps: int | None = None, msign_dtype: torch.dtype | None = None,
                 nonfinite: str = "raise"):
        super().__init__(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                         msign=msign, ns_steps=ns_steps, msign_dtype=msign_dtype, nonfinite=nonfinite,
                         manifold=manifold, inner=inner, inner_steps=inner_steps, alpha=alpha, rho=rho, tol=tol,
                         warm_start=warm_start, normalize=normalize)

    def add_param_group(self, param_group: dict) -> None:
        """Settings left at None take the defaults of the group's solver (``SOLVER_DEFAULTS``) before checking."""
        inner = param_group.get("inner", self.defaults["inner"])
        if inner not in SOLVER_DEFAULTS:
            raise ValueError(f"ManifoldMuon: unknown inner solver {inner!r}; choose one of {', '.join(SOLVER_DEFAULTS)}")
        for key, value in SOLVER_DEFAULTS[inner].items():
            if param_group.get(key, self.defaults.get(key)) is None:
                param_group[key] = value
        super().add_param_group(param_group)

    def check_group(self, group):
        if not (isinstance(group["inner_steps"], int) and group["inner_steps"] >= 0):
            raise ValueError(f"ManifoldMuon: inner_steps must be an int >= 0, got {group['inner_steps']!r}")
        if group["inner"] == "gram_admm" and not (isinstance(group["tol"], (int, float)) and group["tol"] >= 0):
            raise ValueError(f"ManifoldMuon: gram_admm stops on a relative duality gap tol >= 0, got {group['tol']!r}")
        if group["split"] != 1:
            raise ValueError("ManifoldMuon does not split weights into row blocks; use split=1")

    # ------------------------------------------------------------------ the Gram-space solve, fused

    def update(self, W, G, group, states, shape):
        if group["inner"] != "gram_admm":
            return super().update(W, G, group, states, shape)
        M = group["manifold"]
        warm = None
        if group["warm_start"] and all("Lambda" in s for s in states):
            warm = (torch.stack([s["Lambda"] for s in states]),
                    Span(torch.stack([s["U_a"] for s in states]), torch.stack([s["U_b"] for s in states])))
        sol = gram_solve(W, G, M.gram_projector, steps=group["inner_steps"], tol=group["tol"], rho=group["rho"],
                         warm=warm)
        self._record(states, group, rms(M.gram_projector(tangent_defect(sol.picture, sol.A))), sol)
        return fused_retract(M, sol, group["lr"], group["weight_decay"], W.dtype)

    @staticmethod
    def _record(states, group, violation, sol):
        for i, s in enumerate(states):
            s["tangent_violation"] = float(violation[i])
            s["duality_gap"] = float(sol.gap[i])
            s["inner_iterations"] = int(sol.iterations[i])
            if group["warm_start"]:
                s["Lambda"], s["U_a"], s["U_b"] = sol.Lambda[i].clone(), sol.U.a[i].clone(), sol.U.b[i].clone()

    # ------------------------------------------------------------------ dual ascent / ADMM on m x n matrices

    def direction(self, W, G, group, states):
        P = group["manifold"].gram_projector
        Lambda0 = None
        if group["warm_start"] and all("Lambda" in s for s in states):
            Lambda0 = torch.stack([s["Lambda"] for s in states])
        if group["inner"] in ("dual_ascent", "post"):
            A, Lambda, _ = dual_ascent(W, G, P, steps=group["inner_steps"], alpha=group["alpha"], tol=group["tol"],
                                       Lambda0=Lambda0, msign_fn=self.msign_fn(group), normalize=group["normalize"])
        else:
            A, Lambda, _ = admm(W, G, P, steps=group["inner_steps"], rho=group["rho"], tol=group["tol"],
                                Lambda0=Lambda0, msign_fn=self.msign_fn(group))
        wide = W.size(-2) < W.size(-1)
        Wt, At = (W.mT, A.mT) if wide else (W, A)
        violation = rms(P(Wt.mT @ At + At.mT @ Wt))
        for s, lam, v in zip(states, Lambda, violation):
            s["tangent_violation"] = float(v)
            if group["warm_start"]:
                s["Lambda"] = lam.clone()
        return A
