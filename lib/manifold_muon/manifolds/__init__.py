"""Matrix manifolds with one shared interface (``base``), in two families:

* ``gram``     Keigwin's Gram-space manifolds P(W^T W - C) = 0: ``stiefel``, ``dgram``, ``gram_oblique``
* ``spheres``  the paper's norm spheres ||W||_M = R: ``frobenius_sphere``, ``spectral_sphere``,
               ``input_oblique_sphere``, ``output_oblique_sphere``
"""

from .base import Manifold, available_manifolds, check_matrix, get_manifold, register
from .gram import DGram, GramManifold, GramOblique, Stiefel
from .spheres import FrobeniusSphere, InputObliqueSphere, NormSphere, OutputObliqueSphere, SpectralSphere

__all__ = ["Manifold", "GramManifold", "NormSphere", "Stiefel", "DGram", "GramOblique", "FrobeniusSphere",
           "SpectralSphere", "InputObliqueSphere", "OutputObliqueSphere", "available_manifolds", "check_matrix",
           "get_manifold", "register"]
