"""Muon (Jordan et al.), the algorithm of ``torch.optim.Muon``, batched over same-shape matrices.

    D  = msign(G)                                    (G: the Nesterov momentum direction, ``base``)
    W <- (1 - lr * weight_decay) W - lr * adjust(shape) * D

``adjust`` is sqrt(max(1, m/n)) ("original", Jordan's) or 0.2 sqrt(max(m, n)) ("match_rms_adamw", Moonshot's).
With its default arguments it is ``torch.optim.Muon`` with its default arguments, bit for bit (Jordan's
Newton-Schulz, five steps, in bfloat16: ``TORCH_MUON``; tests/test_muon.py holds it over several steps, shapes
and param groups). ``msign="polar_express"`` and ``msign_dtype=torch.float32`` are options: Polar Express
resolves small singular values better (chapter 01), float32 is slower on CPUs with bfloat16 matrix units.
``ns_coefficients`` and ``eps`` are Newton-Schulz's and are refused with another ``msign``.
"""

from __future__ import annotations

import math

import torch

from ..msign import JORDAN_COEFFS, msign_newton_schulz
from .base import MatrixOptimizer

__all__ = ["Muon", "TORCH_MUON"]

# The settings that make Muon torch.optim.Muon: Jordan's Newton-Schulz, five steps, in bfloat16.
TORCH_MUON = dict(msign="newton_schulz", ns_steps=5, msign_dtype=torch.bfloat16)
ADJUST_LR = (None, "original", "match_rms_adamw")


class Muon(MatrixOptimizer):
    """Muon; the arguments of ``torch.optim.Muon`` with its defaults, then this package's ``msign`` (default
    "newton_schulz"), ``msign_dtype`` (default bfloat16) and ``nonfinite``."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients=JORDAN_COEFFS, eps: float = 1e-7, ns_steps: int = 5,
                 adjust_lr_fn: str | None = None, msign: str = "newton_schulz",
                 msign_dtype: torch.dtype | None = torch.bfloat16, nonfinite: str = "raise"):
        super().__init__(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, msign=msign,
                         ns_steps=ns_steps, msign_dtype=msign_dtype, nonfinite=nonfinite,
                         ns_coefficients=tuple(ns_coefficients), eps=eps, adjust_lr_fn=adjust_lr_fn)

    def check_group(self, group):
        if group["adjust_lr_fn"] not in ADJUST_LR:
            raise ValueError(f"Muon: adjust_lr_fn must be None, 'original' or 'match_rms_adamw', "
                             f"got {group['adjust_lr_fn']!r}")
        if len(group["ns_coefficients"]) != 3:
            raise ValueError(f"Muon: ns_coefficients are (a, b, c) of one quintic, got {group['ns_coefficients']!r}")
        if group["msign"] != "newton_schulz" and (tuple(group["ns_coefficients"]) != tuple(JORDAN_COEFFS)
                                                  or group["eps"] != 1e-7):
            raise ValueError(f"Muon: ns_coefficients and eps are Newton-Schulz's and do nothing with "
                             f"msign={group['msign']!r}; leave them at their defaults or use msign='newton_schulz'")

    def direction(self, W, G, group, states):
        if group["msign"] == "newton_schulz":
            return msign_newton_schulz(G, group["ns_steps"], group["msign_dtype"], group["eps"], group["ns_coefficients"])
        return self.msign_fn(group)(G)

    def step_scale(self, shape, group):
        m, n = shape[-2:]
        if group["adjust_lr_fn"] in (None, "original"):
            return math.sqrt(max(1, m / n))
        return 0.2 * math.sqrt(max(m, n))
