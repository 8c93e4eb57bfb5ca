"""Manifold Muon (Bernstein), on any Gram-space manifold (Keigwin), batched over same-shape matrices.

Per matrix W on its manifold, with gradient g:

    G      <- Muon momentum of g                                  (``momentum_direction``, as torch.optim.Muon)
    A      <- argmax <G, A> s.t. ||A||_op <= 1, A tangent at W     (inner solver: dual ascent or ADMM)
    W      <- retract(W - lr * A)

No weight decay: it would push W off its manifold (as in the post). Precision: the step is computed
in float32 (float64 stays float64) and cast back, so bfloat16 weights are updated in float32 and
rounded once (the momentum buffer is kept in float32); a bfloat16 weight is then only as close to its manifold as bfloat16 rounding allows.
Non-finite gradients raise a ``FloatingPointError`` before any weight or buffer is touched (skip the
step yourself, e.g. with a grad scaler, if you want to continue). A matrix whose direction G is
exactly zero is left unchanged. Call ``retract_parameters()`` once to put freshly initialised weights
on their manifolds.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import torch

from ..manifolds import Manifold, get_manifold
from ..manifolds.gram import GramManifold
from ..msign import msign
from .inner_solvers import admm, dual_ascent
from .muon import check_matrix_params, momentum_direction

__all__ = ["ManifoldMuon"]

INNER = {"dual_ascent": dual_ascent, "admm": admm}
MSIGN_METHODS = ("newton_schulz", "polar_express", "svd")


class ManifoldMuon(torch.optim.Optimizer):
    """Manifold Muon. Param groups carry ``manifold`` (a name or a Manifold instance) and all hyper-parameters.

    Args:
        lr: step length of W - lr * A (A has unit singular values).
        momentum, nesterov: Muon momentum on the gradient.
        manifold: "stiefel", "dgram", "oblique" (Gram-space manifolds) or such an instance.
        inner: "dual_ascent" (Bernstein) or "admm" (Buchanan); inner_steps iterations. inner_steps=0 with
            dual ascent is the one-msign solver A = msign(tangent projection of G).
        alpha: dual-ascent step (linear decay to 0); rho: ADMM penalty (None: 1/sqrt(n)).
        tol: per-matrix early stop on ||H||_RMS (None: always run inner_steps).
        warm_start: keep Lambda in the state between optimizer steps and start the next solve from it.
        msign_method, msign_steps: msign used inside the inner solver. Polar Express with 8 steps leaves
            singular values within ~1e-5 of 1; with 5 steps ~0.1 (Jordan's Newton-Schulz ~0.3), which alone
            puts the retracted weight ~1% (~2%) from the exact step (runs/bench/inner_solvers.json).
    """

    def __init__(self, params, lr=0.02, momentum=0.95, nesterov=True, manifold="stiefel", inner="dual_ascent",
                 inner_steps=20, alpha=0.1, rho=None, tol=None, warm_start=False,
                 msign_method="polar_express", msign_steps=8):
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, manifold=manifold, inner=inner,
                        inner_steps=inner_steps, alpha=alpha, rho=rho, tol=tol, warm_start=warm_start,
                        msign_method=msign_method, msign_steps=msign_steps)
        super().__init__(params, defaults)  # each group is checked by add_param_group

    @staticmethod
    def _check_group(group):
        if not group["lr"] >= 0:
            raise ValueError(f"lr must be >= 0, got {group['lr']}")
        if not 0 <= group["momentum"] < 1:
            raise ValueError(f"momentum must be in [0, 1), got {group['momentum']}")
        if group["inner"] not in INNER:
            raise ValueError(f"unknown inner solver {group['inner']!r}; choose one of {', '.join(INNER)}")
        if not (isinstance(group["inner_steps"], int) and group["inner_steps"] >= 0):
            raise ValueError(f"inner_steps must be an int >= 0, got {group['inner_steps']!r}")
        if group["msign_method"] not in MSIGN_METHODS:
            raise ValueError(f"msign_method must be one of {', '.join(MSIGN_METHODS)}, got {group['msign_method']!r}")
        if not isinstance(group["manifold"], Manifold):
            group["manifold"] = get_manifold(group["manifold"])  # an unknown name lists the valid ones
        if not isinstance(group["manifold"], GramManifold):
            raise ValueError(
                f"ManifoldMuon's inner solvers need a Gram-space manifold (stiefel, dgram, oblique), "
                f"got {group['manifold']!r}; use the optimizers of optim/constrained.py for the others"
            )

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        check_matrix_params([self.param_groups[-1]], "ManifoldMuon")
        self._check_group(self.param_groups[-1])

    def state_dict(self):
        sd = super().state_dict()
        for g in sd["param_groups"]:  # store the manifold by what rebuilds it
            m = g["manifold"]
            g["manifold"] = {"name": m.name, **{k: v for k, v in vars(m).items()}} if isinstance(m, Manifold) else m
        return sd

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        for g in self.param_groups:
            if isinstance(g["manifold"], dict):
                spec = dict(g["manifold"])
                g["manifold"] = get_manifold(spec.pop("name"), **spec)

    @torch.no_grad()
    def retract_parameters(self):
        """Put every parameter on its group's manifold (call once after initialisation)."""
        for group in self.param_groups:
            for p in group["params"]:
                p.copy_(group["manifold"].retract(p.float() if p.dtype != torch.float64 else p))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:  # refuse before touching anything
            for p in group["params"]:
                if p.grad is not None and not torch.isfinite(p.grad).all():
                    raise FloatingPointError(
                        f"ManifoldMuon got a non-finite gradient for a parameter of shape {tuple(p.shape)}; "
                        "no weight was changed. Skip this step (e.g. lower the lr or use a grad scaler)."
                    )
        for group in self.param_groups:
            batches = defaultdict(list)
            for p in group["params"]:
                if p.grad is None:
                    continue
                batches[(p.shape, p.dtype, p.device)].append(p)
            for params in batches.values():
                self._step_batch(params, group)
        return loss

    def _step_batch(self, params, group):
        dt = torch.float64 if params[0].dtype == torch.float64 else torch.float32
        manifold = group["manifold"]
        Gs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, dtype=dt)
            Gs.append(momentum_direction(p.grad.to(dt), state["momentum_buffer"], group["momentum"], group["nesterov"]))
        W, G = torch.stack([p.to(dt) for p in params]), torch.stack(Gs)
        Lambda0 = None
        if group["warm_start"] and all("Lambda" in self.state[p] for p in params):
            Lambda0 = torch.stack([self.state[p]["Lambda"] for p in params])
        msign_fn = functools.partial(msign, method=group["msign_method"], steps=group["msign_steps"], dtype=dt)
        if group["inner"] == "dual_ascent":
            A, Lambda, _ = dual_ascent(W, G, manifold.gram_projector, steps=group["inner_steps"], alpha=group["alpha"],
                                       tol=group["tol"], Lambda0=Lambda0, msign_fn=msign_fn)
        else:
            A, Lambda, _ = admm(W, G, manifold.gram_projector, steps=group["inner_steps"], rho=group["rho"],
                                tol=group["tol"], Lambda0=Lambda0, msign_fn=msign_fn)
        W_new = manifold.retract(W - group["lr"] * A)
        moved = G.flatten(1).abs().amax(dim=1) > 0  # a zero direction leaves W exactly as it was
        for p, w, lam, keep in zip(params, W_new, Lambda, moved):
            if group["warm_start"]:
                self.state[p]["Lambda"] = lam.clone()
            if keep:
                p.copy_(w)
