"""The norm-sphere optimizers of 003 ("Demystifying Manifold Constraints"): MACRO, MuonH, SSO, FSO.

All four share one step (003, Alg. 1 / Alg. 2 / App. B.2):

    M <- beta M + (1 - beta) G                       momentum (an EMA, as in Alg. 1)
    O <- direction(W, M)                             the only line that differs
    W <- P_M(W - lr c R O / (||O||_M + eps))         scaled step, then retraction onto the sphere

    MACRO   O = msign(proj_{T_W}(M))                 tangent projection, then msign (Alg. 1)
    MuonH   O = msign(M)                             no projection (App. B.2, Wen et al.)
    FSO     O = msign(M + lambda* W)                 lambda* root of <W, msign(M + lambda W)> (Alg. 2)
    SSO     O = msign(M + lambda* u1 v1^T)           lambda* root of <u1 v1^T, msign(M + lambda u1 v1^T)>

R is the manifold's radius for the matrix's shape (Table 1 / eq. 42 of 003) and ||.||_M its norm.
``split=k`` treats each (D_out, D_in) weight as k row blocks of shape (D_out/k, D_in), each on its own
sphere with its own radius: 003's "qkv-split" (after [59]) for GPT-2's fused c_attn is ``split=3``.
Each param group names its manifold (``manifold``, a registered name, plus ``manifold_kwargs``) so one
optimizer can hold several; matrices of one shape in a group are stepped as one batch. Work is done in
float32 for bf16/fp16 weights (cast back after the step; momentum kept in float32), else in the weights'
own dtype (float32 or float64).

Hyper-parameter defaults: beta = 0.9 (003, D.3), c = 1.0 (003 does not state its c for Table 4),
SSO/FSO bisection tolerance 1e-4 and at most 10 iterations (D.3). ``weight_decay`` shrinks W before the
retraction, W <- P_M((1 - lr wd) W - lr step); 003 runs with 0. A retraction that rescales (Frobenius,
oblique, approximate spectral) undoes most of the shrink: what is left is a step lr / (1 - lr wd) instead of lr.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from ..manifolds import get_manifold
from ..msign import METHODS, msign

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


class _SphereOptimizer(torch.optim.Optimizer):
    """Momentum, the scaled step and the retraction; subclasses give ``direction(manifold, W, M, group)``."""

    default_manifold = "spectral_sphere"
    allowed_manifolds: tuple[str, ...] | None = None  # None: any registered manifold with norm()

    def __init__(self, params, lr: float = 0.01, manifold: str | None = None, manifold_kwargs: dict | None = None,
                 r: float | None = None, beta: float = 0.9, c: float = 1.0, eps: float = 1e-8,
                 weight_decay: float = 0.0, msign_method: str = "newton_schulz", msign_steps: int = 5,
                 nonfinite: str = "raise", split: int = 1, **extra):
        name = type(self).__name__
        if isinstance(lr, torch.Tensor) or not (isinstance(lr, (int, float)) and lr >= 0):
            raise ValueError(f"{name}: lr must be a float >= 0 (003 sweeps 5e-3 to 5e-2), got {lr!r}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"{name}: beta must be in [0, 1) (003 uses 0.9), got {beta!r}")
        if not c > 0:
            raise ValueError(f"{name}: c must be > 0 (it sets the update/weight ratio c * lr), got {c!r}")
        if not eps >= 0:
            raise ValueError(f"{name}: eps must be >= 0, got {eps!r}")
        if not weight_decay >= 0:
            raise ValueError(f"{name}: weight_decay must be >= 0 (003 uses 0 with a constraint), got {weight_decay!r}")
        if msign_method not in METHODS:
            raise ValueError(f"{name}: unknown msign_method {msign_method!r}; choose one of {', '.join(METHODS)}")
        if not (isinstance(msign_steps, int) and msign_steps >= 1):
            raise ValueError(f"{name}: msign_steps must be an int >= 1, got {msign_steps!r}")
        if nonfinite not in ("raise", "skip"):
            raise ValueError(f"{name}: nonfinite must be 'raise' or 'skip' (skip leaves W and momentum unchanged), "
                             f"got {nonfinite!r}")
        kwargs = dict(manifold_kwargs or {})
        if r is not None:
            kwargs["r"] = r
        defaults = dict(lr=lr, manifold=manifold or self.default_manifold, manifold_kwargs=kwargs, beta=beta, c=c,
                        eps=eps, weight_decay=weight_decay, msign_method=msign_method, msign_steps=msign_steps,
                        nonfinite=nonfinite, split=split, **extra)
        super().__init__(params, defaults)

    def _check_group(self, group):
        name = type(self).__name__
        m = self._manifold(group)  # raises on an unknown name, listing the valid ones
        if self.allowed_manifolds is not None and group["manifold"] not in self.allowed_manifolds:
            raise ValueError(f"{name} is defined for the manifolds {', '.join(self.allowed_manifolds)}, "
                             f"got {group['manifold']!r}; use MACRO for other manifolds")
        if not callable(getattr(m, "norm", None)):
            raise ValueError(f"{name}: manifold {group['manifold']!r} has no norm() to scale the step by; "
                             "use a norm sphere (frobenius_sphere, spectral_sphere, oblique_in, oblique_out)")
        for p in group["params"]:
            if p.ndim != 2:
                raise ValueError(f"{name} steps 2-D weight matrices, got a parameter of shape {tuple(p.shape)}; "
                                 "give 1-D parameters to AdamW and reshape other tensors to (D_out, D_in)")
            if p.is_complex() or not p.is_floating_point():
                raise ValueError(f"{name} needs real floating-point parameters, got {p.dtype}")
            k = group["split"]
            if not (isinstance(k, int) and k >= 1 and p.shape[0] % k == 0):
                raise ValueError(f"{name}: split={k!r} must be a positive int dividing D_out={p.shape[0]} "
                                 "(e.g. 3 for GPT-2's fused c_attn = [W_q; W_k; W_v]); use split=1 for one matrix")

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        self._check_group(self.param_groups[-1])  # refuse bad config before any step

    @staticmethod
    def _manifold(group):
        m = group["manifold"]
        return m if not isinstance(m, str) else get_manifold(m, **group["manifold_kwargs"])

    @torch.no_grad()
    def retract_parameters(self):
        """Put every parameter on its group's manifold (call once after initialisation)."""
        for group in self.param_groups:
            manifold, k = self._manifold(group), group["split"]
            for p in group["params"]:
                blocks = (k, p.shape[0] // k, p.shape[1]) if k > 1 else p.shape
                W = p.float() if p.dtype in (torch.float16, torch.bfloat16) else p
                p.copy_(manifold.retract(W.reshape(blocks)).reshape(p.shape).to(p.dtype))

    def _sign(self, group):
        method, steps = group["msign_method"], group["msign_steps"]
        return lambda X: msign(X, method, steps)  # in X's dtype: float32, or float64 for float64 weights

    def direction(self, manifold, W, M, group, state):  # pragma: no cover - abstract
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            manifold = self._manifold(group)
            batches = defaultdict(list)  # same shape, device, dtype -> one batched step
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not bool(torch.isfinite(p.grad).all()):
                    if group["nonfinite"] == "skip":
                        continue
                    raise FloatingPointError(
                        f"{type(self).__name__}: a gradient of shape {tuple(p.shape)} has NaN or inf; fix the loss, "
                        "lower the lr, or pass nonfinite='skip' to leave such parameters unchanged")
                batches[(tuple(p.shape), p.device, p.dtype)].append(p)
            for ps in batches.values():
                self._step_batch(group, manifold, ps)
        return loss

    def _step_batch(self, group, manifold, ps):
        beta, lr, c, eps, wd = group["beta"], group["lr"], group["c"], group["eps"], group["weight_decay"]
        dtype = torch.float32 if ps[0].dtype in (torch.float16, torch.bfloat16) else ps[0].dtype
        for p in ps:
            st = self.state[p]
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = torch.zeros_like(p, dtype=dtype)
            st["momentum_buffer"].lerp_(p.grad.to(dtype), 1 - beta)  # M = beta M + (1 - beta) G
        k = group["split"]  # k > 1: each matrix is k row blocks, each on its own sphere (a batch dimension)
        blocks = (k, ps[0].shape[0] // k, ps[0].shape[1]) if k > 1 else ps[0].shape
        W = torch.stack([p.to(dtype).reshape(blocks) for p in ps])
        M = torch.stack([self.state[p]["momentum_buffer"].view(blocks) for p in ps])
        R = manifold.radius(W.shape) if callable(getattr(manifold, "radius", None)) else 1.0
        O = self.direction(manifold, W, M, group, [self.state[p] for p in ps])
        step = c * R * O / (manifold.norm(O) + eps)[..., None, None]
        W = manifold.retract(W * (1 - lr * wd) - lr * step)
        for p, w in zip(ps, W):
            p.copy_(w.reshape(p.shape).to(p.dtype))


class MACRO(_SphereOptimizer):
    """Msign-Aligned Constrained Riemannian Optimizer (003, Alg. 1): O = msign(proj_{T_W}(M)).

    Works on every registered manifold that has ``norm()`` (the four spheres of 003); pick it per group
    with ``manifold=`` (default "spectral_sphere") and the radius rule's ``r=`` (or ``manifold_kwargs``).
    """

    def direction(self, manifold, W, M, group, state):
        Phi = manifold.project(W, M)
        return self._sign(group)(Phi)


class MuonH(_SphereOptimizer):
    """Muon-Hyperball (003, App. B.2): O = msign(M), no tangent projection; Frobenius or spectral sphere.

    With the Frobenius sphere this is Wen et al.'s MuonH (``||O||_F`` normalisation, c folded into lr when c=1);
    with the spectral sphere and the approximate retraction it is 003's MuonH-spec,
    W <- R (W - lr c R msign(M)) / ||W - lr c R msign(M)||_2 (since ||msign(M)||_2 = 1).
    """

    allowed_manifolds = ("frobenius_sphere", "spectral_sphere")

    def direction(self, manifold, W, M, group, state):
        return self._sign(group)(M)


class _Multiplier(_SphereOptimizer):
    """O = msign(M + lambda* Theta) with Theta the manifold's normal at W and lambda* found by bisection."""

    def __init__(self, params, lr: float = 0.01, tol: float = 1e-4, max_iter: int = 10, **kwargs):
        if not tol > 0:
            raise ValueError(f"{type(self).__name__}: tol must be > 0 (003 uses 1e-4), got {tol!r}")
        if not (isinstance(max_iter, int) and max_iter >= 1):
            raise ValueError(f"{type(self).__name__}: max_iter must be an int >= 1 (003 uses 10), got {max_iter!r}")
        super().__init__(params, lr=lr, tol=tol, max_iter=max_iter, **kwargs)

    def direction(self, manifold, W, M, group, state):
        Theta = manifold.normal(W)
        lam, O, h = bisect_multiplier(M, Theta, self._sign(group), group["tol"], group["max_iter"])
        for st, l, hh in zip(state, lam, h):  # diagnostics: the multiplier and the constraint left over
            st["lambda"], st["h"] = l.tolist(), hh.tolist()
        return O


class FSO(_Multiplier):
    """Frobenius Sphere Optimization (003, Alg. 2): lambda* solves <W, msign(M + lambda W)> = 0 by bisection."""

    default_manifold = "frobenius_sphere"
    allowed_manifolds = ("frobenius_sphere",)


class SSO(_Multiplier):
    """Spectral Sphere Optimization (Xie et al. [59] in 003), in the form implemented here.

    003 defers SSO to [59]; the analogue of Lemma 1 on the spectral sphere replaces W by the normal of
    {||W||_2 = R} at W, Theta = u1 v1^T (the gradient of sigma_1, 003 App. B.1). The subproblem is
    max <M, Phi> s.t. ||Phi||_2 = 1, <u1 v1^T, Phi> = 0 (the linearised constraint sigma_1(W - eta Phi) = R),
    whose Lagrangian gives Phi(lambda) = msign(M + lambda u1 v1^T) and
    h(lambda) = <u1 v1^T, msign(M + lambda u1 v1^T)>. Lemma 1's proof goes through word for word with W -> Theta
    (it only uses that msign maximises <X, T> over ||T||_2 <= 1), so h is non-decreasing and any root obeys
    |lambda*| <= 2 ||M||_* / ||Theta||_* = 2 ||M||_*. The step is normalised by ||O||_2 and retracted with the
    manifold's retraction (default R X / ||X||_2, as 003 ran).
    """

    default_manifold = "spectral_sphere"
    allowed_manifolds = ("spectral_sphere",)
