"""Matrix manifolds with one shared interface (see ``base``)."""

from .base import Manifold, available_manifolds, check_matrix, get_manifold, register

__all__ = ["Manifold", "available_manifolds", "check_matrix", "get_manifold", "register"]

# Concrete manifolds register themselves on import.
for _mod in ("gram", "spheres"):
    try:
        __import__(f"{__name__}.{_mod}")
    except ModuleNotFoundError as _e:  # a module not written yet
        if _e.name != f"{__name__}.{_mod}":
            raise
