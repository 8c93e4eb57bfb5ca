"""Optimizers, each a ``torch.optim.Optimizer`` on the one skeleton of ``base.MatrixOptimizer``:

* ``Muon``          msign of the momentum, no manifold (``torch.optim.Muon``'s algorithm)
* ``ManifoldMuon``  steepest descent on a Gram-space manifold (Stiefel, DGram, GramOblique) by a dual solve
* ``MACRO``, ``MuonH``, ``SSO``, ``FSO``   the paper's optimizers on norm spheres
"""

from .base import MatrixOptimizer
from .manifold_muon import ManifoldMuon
from .muon import TORCH_MUON, Muon
from .spheres import FSO, MACRO, SSO, MuonH

__all__ = ["MatrixOptimizer", "Muon", "TORCH_MUON", "ManifoldMuon", "MACRO", "MuonH", "SSO", "FSO"]
