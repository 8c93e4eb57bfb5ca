"""manifold_muon: manifold-constrained Muon optimizers for PyTorch.

    from manifold_muon import ManifoldMuon, MACRO, build_optimizers, retract_parameters
    opt = ManifoldMuon(model.attn_weights, lr=0.02, manifold="stiefel")
    optimizers = build_optimizers(model, "hetero")   # the blog post's Stiefel attention / DGram MLP, AdamW for the rest

Modules: ``msign`` (the matrix sign), ``manifolds`` (Gram-space manifolds and norm spheres),
``optim`` (Muon, ManifoldMuon, MACRO, MuonH, SSO, FSO on one skeleton), ``assignments`` (which optimizer
and manifold for which parameter of a model). Depends on torch and numpy only.
"""

from .assignments import ASSIGNMENTS, build_optimizers, describe, retract_parameters
from .manifolds import available_manifolds, get_manifold
from .optim import FSO, MACRO, SSO, TORCH_MUON, ManifoldMuon, MatrixOptimizer, Muon, MuonH

__version__ = "0.4.0"  # the wheel's version (lib/pyproject.toml reads it from here)
__all__ = ["Muon", "TORCH_MUON", "ManifoldMuon", "MACRO", "MuonH", "SSO", "FSO", "MatrixOptimizer", "ASSIGNMENTS",
           "build_optimizers", "describe", "retract_parameters", "available_manifolds", "get_manifold"]
