"""Muon (Jordan et al.), the same algorithm as ``torch.optim.Muon``, batched over same-shape matrices.

Per matrix parameter W with gradient g and momentum buffer B (all as in torch.optim.Muon):

    B      <- mu B + (1 - mu) g                       (an EMA: torch's buf.lerp_(g, 1 - mu))
    G      <- (1 - mu) g + mu B   if nesterov else B  (torch's g.lerp(B, mu))
    O      <- orthogonalise(G)                        (Newton-Schulz in bfloat16 by default)
    W      <- (1 - lr * weight_decay) W - lr * adjust(shape) * O

``adjust`` is sqrt(max(1, m/n)) ("original", Jordan's) or 0.2 sqrt(max(m, n)) ("match_rms_adamw", Moonshot's).
``momentum_direction`` is the first two lines, shared with the other optimizers of this package so that
they all mean the same thing by "Muon momentum".
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from ..msign import JORDAN_COEFFS, msign

__all__ = ["Muon", "momentum_direction", "newton_schulz_like_torch", "adjust_lr", "check_matrix_params"]

MSIGN_METHODS = ("newton_schulz", "polar_express", "svd")


def momentum_direction(grad: torch.Tensor, buf: torch.Tensor, momentum: float, nesterov: bool) -> torch.Tensor:
    """Update the EMA momentum buffer in place and return the direction to orthogonalise."""
    buf.lerp_(grad, 1 - momentum)
    return grad.lerp(buf, momentum) if nesterov else buf.clone()


def newton_schulz_like_torch(G: torch.Tensor, coeffs=JORDAN_COEFFS, steps: int = 5, eps: float = 1e-7, dtype=torch.bfloat16):
    """Jordan's quintic Newton-Schulz with torch.optim.Muon's exact order of operations, batched."""
    a, b, c = coeffs
    X = G.to(dtype)
    wide = G.size(-2) > G.size(-1)  # torch transposes when rows > columns, so X X^T is the small Gram
    if wide:
        X = X.mT
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        A = X @ X.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c) if A.ndim == 3 else torch.addmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a) if X.ndim == 3 else torch.addmm(X, B, X, beta=a)
    return X.mT if wide else X


def adjust_lr(lr: float, adjust_lr_fn: str | None, shape) -> float:
    m, n = shape[-2:]
    if adjust_lr_fn in (None, "original"):
        return lr * math.sqrt(max(1, m / n))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(m, n))
    return lr


def check_matrix_params(params_groups, who: str) -> None:
    """Refuse non-matrix parameters at construction, with a sentence saying what to do."""
    for group in params_groups:
        for p in group["params"]:
            if p.ndim != 2:
                raise ValueError(
                    f"{who} optimizes 2-D weight matrices, but got a parameter of shape {tuple(p.shape)}. "
                    + ("Give 1-D parameters (biases, norm gains) and embeddings to torch.optim.AdamW instead."
                       if p.ndim < 2 else
                       "Reshape it into a matrix (e.g. a conv kernel as (out, in*k*k)) in the model, or give it to AdamW.")
                )


class Muon(torch.optim.Optimizer):
    """Muon; with default arguments it matches torch.optim.Muon step for step (float rounding aside).

    Extra over torch: ``msign_method`` ('newton_schulz' = torch's, 'polar_express', 'svd') and
    ``msign_dtype`` (torch uses bfloat16). Same-shape matrices in a group are orthogonalised as one batch.
    """

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=JORDAN_COEFFS, eps=1e-7, ns_steps=5, adjust_lr_fn=None,
                 msign_method="newton_schulz", msign_dtype=torch.bfloat16):
        if not lr >= 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not momentum >= 0:
            raise ValueError(f"momentum must be >= 0, got {momentum}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ValueError(f"adjust_lr_fn must be None, 'original' or 'match_rms_adamw', got {adjust_lr_fn!r}")
        if msign_method not in MSIGN_METHODS:
            raise ValueError(f"msign_method must be one of {', '.join(MSIGN_METHODS)}, got {msign_method!r}")
        if not 1 <= ns_steps < 100:
            raise ValueError(f"ns_steps must be in 1..99, got {ns_steps}")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, msign_method=msign_method, msign_dtype=msign_dtype)
        super().__init__(params, defaults)
        check_matrix_params(self.param_groups, "Muon")

    def _orthogonalise(self, G, group):
        if group["msign_method"] == "newton_schulz":
            return newton_schulz_like_torch(G, group["ns_coefficients"], group["ns_steps"], group["eps"], group["msign_dtype"])
        return msign(G, group["msign_method"], steps=group["ns_steps"], dtype=group["msign_dtype"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            batches = defaultdict(list)  # same shape/dtype/device -> one batched msign
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Muon does not support sparse gradients")
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                G = momentum_direction(p.grad, state["momentum_buffer"], group["momentum"], group["nesterov"])
                batches[(p.shape, p.dtype, p.device)].append((p, G))
            for (shape, _, _), items in batches.items():
                O = self._orthogonalise(torch.stack([G for _, G in items]), group)
                lr = group["lr"]
                for (p, _), o in zip(items, O):
                    p.mul_(1 - lr * group["weight_decay"])
                    p.add_(o, alpha=-adjust_lr(lr, group["adjust_lr_fn"], shape))
        return loss
