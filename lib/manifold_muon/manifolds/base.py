"""What every manifold answers, and the two families the optimizers rely on.

A manifold here is a set of weight matrices W of shape (..., m, n) (leading dimensions are a batch of
same-shape matrices). Every manifold answers:

* ``project(W, G)``          orthogonal projection of G onto the tangent space at W
* ``retract(X)``             a point on the manifold near X (the retraction used after a step)
* ``residual(W)``            how far W is from satisfying the constraint (0 on the manifold), per matrix
* ``tangent_residual(W, A)`` how far A is from satisfying the linearised constraint at W, per matrix
* ``random_point(shape)``    a point on the manifold, for tests and initialisation
* ``spec()``                 the name and constructor arguments that rebuild it (``get_manifold(spec)``)

Two families add what their optimizers need (``gram.GramManifold``: the Gram projector P that
Manifold Muon's dual solvers work with; ``spheres.NormSphere``: the radius, norm and normal that the
sphere optimizers scale and project with). An optimizer declares the family it works on and is given
only manifolds of it; it never asks which manifold it holds. Adding a manifold is one subclass plus
``register``; adding an optimizer never touches this file.
"""

from __future__ import annotations

import abc

import torch

from .._checks import check_matrix as _check

__all__ = ["Manifold", "register", "get_manifold", "available_manifolds", "check_matrix"]

_REGISTRY: dict[str, type["Manifold"]] = {}


def check_matrix(W: torch.Tensor, who: str) -> None:
    """Refuse what is not a (batch of) matrices, with a sentence that says what to do."""
    _check(W, who, "give 1-D parameters (biases, gains) to AdamW instead of a matrix manifold")


class Manifold(abc.ABC):
    """Base class: subclasses set ``name``, implement the five methods and list their constructor
    arguments in ``_spec_args`` (attribute names equal to the argument names)."""

    name: str = ""
    _spec_args: tuple[str, ...] = ()

    @abc.abstractmethod
    def project(self, W: torch.Tensor, G: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def retract(self, X: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def residual(self, W: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def tangent_residual(self, W: torch.Tensor, A: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def random_point(self, shape, generator: torch.Generator | None = None, dtype=torch.float32) -> torch.Tensor: ...

    def spec(self) -> dict:
        """``{"name": ..., **constructor arguments}``: plain data that ``get_manifold`` turns back into this manifold."""
        return {"name": self.name, **{k: getattr(self, k) for k in self._spec_args}}

    def __eq__(self, other) -> bool:
        return isinstance(other, Manifold) and self.spec() == other.spec()

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self.spec().items())))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._spec_args)
        return f"{type(self).__name__}({args})"


def register(cls: type[Manifold]) -> type[Manifold]:
    """Class decorator: make ``cls`` reachable by ``get_manifold(cls.name)``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty `name` to be registered")
    _REGISTRY[cls.name] = cls
    return cls


def available_manifolds() -> list[str]:
    return sorted(_REGISTRY)


def get_manifold(manifold, **kwargs) -> Manifold:
    """A manifold from its name (plus constructor ``kwargs``), from its ``spec()`` dict, or as it is.

    An unknown name lists the valid ones.
    """
    if isinstance(manifold, Manifold):
        if kwargs:
            raise ValueError(f"got a manifold instance {manifold!r} and arguments {kwargs}; give one or the other")
        return manifold
    if isinstance(manifold, dict):
        kwargs = {**{k: v for k, v in manifold.items() if k != "name"}, **kwargs}
        manifold = manifold.get("name")
    if manifold not in _REGISTRY:
        raise ValueError(f"unknown manifold {manifold!r}; choose one of: {', '.join(available_manifolds())}")
    return _REGISTRY[manifold](**kwargs)
