"""The paper's norm-sphere optimizers ("Demystifying Manifold Constraints"): MACRO, MuonH, SSO, FSO.

All four take one step (the paper's Alg. 1 / Alg. 2 / App. B.2, on the skeleton of ``base``):

    M <- beta M + (1 - beta) G                       momentum (an EMA, as in Alg. 1: momentum=beta, no Nesterov)
    O <- direction(W, M)                             the only line that differs
    W <- P_M((1 - lr wd) W - lr c R O / (||O||_M + eps))   scaled step, then retraction onto the sphere

    MACRO   O = msign(proj_{T_W}(M))                 tangent projection, then msign (Alg. 1)
    MuonH   O = msign(M)                             no projection (App. B.2, Wen et al.)
    FSO     O = msign(M + lambda* W)                 lambda* root of <W, msign(M + lambda W)> (Alg. 2)
    SSO     O = msign(M + lambda* u1 v1^T)           lambda* root of <u1 v1^T, msign(M + lambda u1 v1^T)>

R is the manifold's radius for the matrix's shape (Table 1 / eq. 42 of the paper) and ||.||_M its norm.
``split=k`` treats each (D_out, D_in) weight as k row blocks of shape (D_out/k, D_in), each on its own
sphere with its own radius: the paper's "qkv-split" (after [59]) for GPT-2's fused c_attn is ``split=3``.
Each param group holds its manifold (a name, a spec or an instance of the ``NormSphere`` family), so one
optimizer can hold several. Each step records, per weight, the tangent violation of the direction it took
(``state[p]["tangent_violation"]``: |<Theta, O>| / (||Theta||_F ||O||_F), Theta the sphere's normal at W).

Hyper-parameter defaults: momentum beta = 0.9 (paper, D.3), c = 1.0 (the paper does not state its c for
Table 4), SSO/FSO bisection tolerance ``tol=1e-4`` and at most ``inner_steps=10`` msigns (D.3;
the names are ManifoldMuon's for its inner solve). Each bisection round reads the host once, to stop. ``weight_decay`` shrinks W
before the retraction, as written above: this order is this library's convention (the paper states no order
and publishes no code). A retraction that rescales (Frobenius, oblique, approximate spectral) undoes most
of the shrink: what is left is a step lr / (1 - lr wd) instead of lr.
"""

from __future__ import annotations

import math

import torch

from ..manifolds.spheres import NormSphere
from ..msign import DEFAULT
from .base import MatrixOptimizer

__all__ = ["MACRO", "MuonH", "SSO", "FSO", "bisect_multiplier"]


def bisect_multiplier(M: torch.Tensor, Theta: torch.Tensor, sign, tol: float = 1e-4, max_iter: int = 10):
    """Bisection for lambda* with h(lambda) = <Theta, sign(M + lambda Theta)> = 0, batched over leading dims.

    ``sign`` is the msign to use. The bracket is Lemma 1's, |lambda*| <= 2 ||M||_* / ||Theta||_* (h is
    non-decreasing, so its sign at the midpoint says which half keeps the root). Stops when
    |h| <= tol * ||Theta||_* (|h| <= ||Theta||_* always, as ||msign||_2 <= 1) or after ``max_iter`` msigns.
    Returns (lambda, O, h) at the best midpoint evaluated (smallest |h|).

    h need not be continuous (msign jumps where M + lambda Theta loses rank, generic for square matrices):
    then no exact root may exist and bisection converges to the jump, with |h| > tol left over.
    """
    scale = torch.linalg.svdvals(Theta).sum(-1)  # ||Theta||_*
    B = 2 * torch.linalg.svdvals(M).sum(-1) / scale.clamp_min(1e-30)
    lo, hi = -B, B
    best_h = torch.full_like(B, math.inf)
    best_lam, best_O = torch.zeros_like(B), torch.zeros_like(M)
    for _ in range(max_iter):
        lam = (lo + hi) / 2
        O = sign(M + lam[..., None, None] * Theta)
        h = (Theta * O).sum(dim=(-2, -1))
        better = h.abs() < best_h
        best_h, best_lam = torch.where(better, h.abs(), best_h), torch.where(better, lam, best_lam)
        best_O = torch.where(better[..., None, None], O, best_O)
        lo, hi = torch.where(h < 0, lam, lo), torch.where(h < 0, hi, lam)
        if bool((best_h <= tol * scale).all()):
            break
    h_best = (Theta * best_O).sum(dim=(-2, -1))
    return best_lam, best_O, h_best


class _SphereOptimizer(MatrixOptimizer):
    """The scaled step on a norm sphere; subclasses give ``sign_direction(manifold, W, M, group, states)`` (O)."""

    manifold_family = NormSphere
    default_manifold = "spectral_sphere"
    allowed_manifolds: tuple[str, ...] | None = None  # None: any norm sphere

    def __init__(self, params, lr: float = 0.01, manifold=None, momentum: float = 0.9, nesterov: bool = False,
                 c: float = 1.0, eps: float = 1e-8, weight_decay: float = 0.0, msign: str = DEFAULT.method,
                 ns_steps: int = DEFAULT.steps, msign_dtype: torch.dtype | None = None, nonfinite: str = "raise",
                 split: int = 1):
        super().__init__(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, msign=msign,
                         ns_steps=ns_steps, msign_dtype=msign_dtype, nonfinite=nonfinite, manifold=manifold,
                         split=split, c=c, eps=eps)

    def check_group(self, group):
        name = type(self).__name__
        if self.allowed_manifolds is not None and group["manifold"].name not in self.allowed_manifolds:
            raise ValueError(f"{name} is defined for the manifolds {', '.join(self.allowed_manifolds)}, "
                             f"got {group['manifold'].name!r}; use MACRO for other manifolds")
        if not group["c"] > 0:
            raise ValueError(f"{name}: c must be > 0 (it sets the update/weight ratio c * lr), got {group['c']!r}")
        if not group["eps"] >= 0:
            raise ValueError(f"{name}: eps must be >= 0, got {group['eps']!r}")

    def sign_direction(self, manifold, W, M, group, states):  # pragma: no cover - abstract
        raise NotImplementedError

    def direction(self, W, G, group, states):
        manifold = group["manifold"]
        O = self.sign_direction(manifold, W, G, group, states)
        Theta = manifold.normal(W)
        violation = ((Theta * O).sum(dim=(-2, -1)).abs()
                     / (torch.linalg.matrix_norm(Theta) * torch.linalg.matrix_norm(O)).clamp_min(1e-30))
        for s, v in zip(states, violation.reshape(len(states), -1).amax(dim=1)):
            s["tangent_violation"] = v  # a tensor: read when logged, not every step
        R = manifold.radius(W.shape)
        return group["c"] * R * O / (manifold.norm(O) + group["eps"])[..., None, None]


class MACRO(_SphereOptimizer):
    """Msign-Aligned Constrained Riemannian Optimizer (the paper's Alg. 1): O = msign(proj_{T_W}(M)).

    Works on every norm sphere; pick it per group with ``manifold=`` (default "spectral_sphere"; a name, a
    spec dict such as ``{"name": "frobenius_sphere", "r": 2.0}``, or an instance).
    """

    def sign_direction(self, manifold, W, M, group, states):
        return self.msign_fn(group)(manifold.project(W, M))


class MuonH(_SphereOptimizer):
    """Muon-Hyperball (the paper's App. B.2): O = msign(M), no tangent projection; Frobenius or spectral sphere.

    With the Frobenius sphere this is Wen et al.'s MuonH (``||O||_F`` normalisation, c folded into lr when c=1);
    with the spectral sphere and the approximate retraction it is the paper's MuonH-spec,
    W <- R (W - lr c R msign(M)) / ||W - lr c R msign(M)||_2 (since ||msign(M)||_2 = 1).
    """

    allowed_manifolds = ("frobenius_sphere", "spectral_sphere")

    def sign_direction(self, manifold, W, M, group, states):
        return self.msign_fn(group)(M)


class _Multiplier(_SphereOptimizer):
    """O = msign(M + lambda* Theta) with Theta the manifold's normal at W and lambda* found by bisection."""

    def __init__(self, params, lr: float = 0.01, manifold=None, momentum: float = 0.9, nesterov: bool = False,
                 c: float = 1.0, eps: float = 1e-8, weight_decay: float = 0.0, tol: float = 1e-4,
                 inner_steps: int = 10, msign: str = DEFAULT.method, ns_steps: int = DEFAULT.steps,
                 msign_dtype: torch.dtype | None = None, nonfinite: str = "raise", split: int = 1):
        # every setting of _SphereOptimizer, then the bisection's own two (the same names as ManifoldMuon's:
        # ``tol`` the relative residual its inner solve stops at, ``inner_steps`` the cap on its iterations)
        MatrixOptimizer.__init__(self, params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                                 msign=msign, ns_steps=ns_steps, msign_dtype=msign_dtype, nonfinite=nonfinite,
                                 manifold=manifold, split=split, c=c, eps=eps, tol=tol, inner_steps=inner_steps)

    def check_group(self, group):
        super().check_group(group)
        if not group["tol"] > 0:
            raise ValueError(f"{type(self).__name__}: tol must be > 0 (the paper uses 1e-4), got {group['tol']!r}")
        if not (isinstance(group["inner_steps"], int) and group["inner_steps"] >= 1):
            raise ValueError(f"{type(self).__name__}: inner_steps (the cap on bisection msigns) must be an int >= 1 "
                             f"(the paper uses 10), got {group['inner_steps']!r}")

    def sign_direction(self, manifold, W, M, group, states):
        Theta = manifold.normal(W)
        lam, O, h = bisect_multiplier(M, Theta, self.msign_fn(group), group["tol"], group["inner_steps"])
        for st, l, hh in zip(states, lam.reshape(len(states), -1), h.reshape(len(states), -1)):
            st["lambda"], st["h"] = l, hh  # diagnostics (tensors, one per row block): the multiplier, what is left of h
        return O


class FSO(_Multiplier):
    """Frobenius Sphere Optimization (the paper's Alg. 2): lambda* solves <W, msign(M + lambda W)> = 0 by bisection."""

    default_manifold = "frobenius_sphere"
    allowed_manifolds = ("frobenius_sphere",)


class SSO(_Multiplier):
    """Spectral Sphere Optimization (Xie et al. [59] in the paper), in the form implemented here.

    The paper defers SSO to [59]; the analogue of Lemma 1 on the spectral sphere replaces W by the normal of
    {||W||_2 = R} at W, Theta = u1 v1^T (the gradient of sigma_1, paper App. B.1). The subproblem is
    max <M, Phi> s.t. ||Phi||_2 = 1, <u1 v1^T, Phi> = 0 (the linearised constraint sigma_1(W - eta Phi) = R),
    whose Lagrangian gives Phi(lambda) = msign(M + lambda u1 v1^T) and
    h(lambda) = <u1 v1^T, msign(M + lambda u1 v1^T)>. Lemma 1's proof goes through word for word with W -> Theta
    (it only uses that msign maximises <X, T> over ||T||_2 <= 1), so h is non-decreasing and any root obeys
    |lambda*| <= 2 ||M||_* / ||Theta||_* = 2 ||M||_*. The step is normalised by ||O||_2 and retracted with the
    manifold's retraction (default R X / ||X||_2, as the paper ran).
    """

    default_manifold = "spectral_sphere"
    allowed_manifolds = ("spectral_sphere",)
