"""Manifold Muon (Bernstein), on any Gram-space manifold (Keigwin), batched over same-shape matrices.

    G  = Muon momentum direction of the gradient                       (``base``)
    A  = argmax <G, A>  s.t.  ||A||_op <= 1,  A tangent at W             (inner solver on the dual, ``inner_solvers``)
    W <- retract(W - lr A)

No weight decay by default (it would push W off its manifold; the post applies none). A matrix whose
direction G is exactly zero is left unchanged. Call ``retract_parameters()`` once to put freshly
initialised weights on their manifolds. Each step records, per weight, the tangent violation
||P(W^T A + A^T W)||_RMS of the direction it took (``state[p]["tangent_violation"]``).
"""

from __future__ import annotations

import torch

from ..manifolds.gram import GramManifold
from ..msign import DEFAULT
from .base import MatrixOptimizer
from .inner_solvers import admm, dual_ascent, rms

__all__ = ["ManifoldMuon"]

INNER = {"dual_ascent": dual_ascent, "admm": admm}


class ManifoldMuon(MatrixOptimizer):
    """Manifold Muon on a Gram-space manifold: ``manifold`` = "stiefel", "dgram", "gram_oblique" or an instance.

    Args:
        lr: step length of W - lr * A (A has unit singular values).
        momentum, nesterov: Muon momentum on the gradient.
        inner: "dual_ascent" (Bernstein) or "admm" (Buchanan); ``inner_steps`` iterations. inner_steps=0 with
            dual ascent is the one-msign solver A = msign(tangent projection of G).
        alpha: dual-ascent step (linear decay to 0); rho: ADMM penalty (None: 1/sqrt(n)).
        tol: per-matrix early stop on ||H||_RMS (None: always run inner_steps).
        warm_start: keep the multiplier Lambda between optimizer steps and start the next solve from it.
        msign, ns_steps, msign_dtype: the msign inside the inner solver (``msign.DEFAULT`` unless given).
    """

    manifold_family = GramManifold
    default_manifold = "stiefel"

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 manifold="stiefel", inner: str = "dual_ascent", inner_steps: int = 20, alpha: float = 0.1,
                 rho: float | None = None, tol: float | None = None, warm_start: bool = False,
                 weight_decay: float = 0.0, msign: str = DEFAULT.method, ns_steps: int = DEFAULT.steps,
                 msign_dtype: torch.dtype | None = None, nonfinite: str = "raise"):
        super().__init__(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                         msign=msign, ns_steps=ns_steps, msign_dtype=msign_dtype, nonfinite=nonfinite,
                         manifold=manifold, inner=inner, inner_steps=inner_steps, alpha=alpha, rho=rho, tol=tol,
                         warm_start=warm_start)

    def check_group(self, group):
        if group["inner"] not in INNER:
            raise ValueError(f"ManifoldMuon: unknown inner solver {group['inner']!r}; choose one of {', '.join(INNER)}")
        if not (isinstance(group["inner_steps"], int) and group["inner_steps"] >= 0):
            raise ValueError(f"ManifoldMuon: inner_steps must be an int >= 0, got {group['inner_steps']!r}")
        if group["split"] != 1:
            raise ValueError("ManifoldMuon does not split weights into row blocks; use split=1")

    def direction(self, W, G, group, states):
        P = group["manifold"].gram_projector
        Lambda0 = None
        if group["warm_start"] and all("Lambda" in s for s in states):
            Lambda0 = torch.stack([s["Lambda"] for s in states])
        if group["inner"] == "dual_ascent":
            A, Lambda, _ = dual_ascent(W, G, P, steps=group["inner_steps"], alpha=group["alpha"], tol=group["tol"],
                                       Lambda0=Lambda0, msign_fn=self.msign_fn(group))
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
