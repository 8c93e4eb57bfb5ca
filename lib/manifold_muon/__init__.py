"""manifold_muon: manifold-constrained Muon optimizers, the models they train, and the book's tooling.

Modules: ``msign`` (matrix sign), ``manifolds`` (constraint sets), ``optim`` (optimizers),
``provenance`` (run records and atomic writes), ``pipeline`` (what `make` executes).
"""

__version__ = "0.1.0"
