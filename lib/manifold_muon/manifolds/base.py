"""The one interface every manifold answers, so that an optimizer never asks which one it holds.

A manifold here is a set of weight matrices W of shape (..., m, n) (leading dimensions are a
batch of same-shape matrices). Every method works on a batch.

* ``project(W, G)``          orthogonal projection of G onto the tangent space at W
* ``retract(X)``             a point on the manifold near X (the retraction used after a step)
* ``residual(W)``            how far W is from satisfying the constraint (0 on the manifold), per matrix
* ``tangent_residual(W, A)`` how far A is from satisfying the linearised constraint at W, per matrix
* ``random_point(shape)``    a point on the manifold, for tests and initialisation

Adding a manifold is one small subclass plus ``register``; adding an optimizer never touches this file.
"""

from __future__ import annotations

import abc

import torch

__all__ = ["Manifold", "register", "get_manifold", "available_manifolds", "check_matrix"]

_REGISTRY: dict[str, type["Manifold"]] = {}


def check_matrix(W: torch.Tensor, who: str) -> None:
    """Refuse what is not a (batch of) matrices, with a sentence that says what to do."""
    if not isinstance(W, torch.Tensor):
        raise TypeError(f"{who} takes a torch.Tensor, got {type(W).__name__}")
    if W.ndim < 2:
        raise ValueError(
            f"{who} constrains matrices, got a tensor of shape {tuple(W.shape)}; "
            "give 1-D parameters (biases, gains) to AdamW instead of a matrix manifold"
        )


class Manifold(abc.ABC):
    """Base class: subclasses set ``name`` and implement the five methods."""

    name: str = ""

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

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def register(cls: type[Manifold]) -> type[Manifold]:
    """Class decorator: make ``cls`` reachable by ``get_manifold(cls.name)``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty `name` to be registered")
    _REGISTRY[cls.name] = cls
    return cls


def available_manifolds() -> list[str]:
    return sorted(_REGISTRY)


def get_manifold(name: str, **kwargs) -> Manifold:
    """The manifold called ``name``, built with ``kwargs``; an unknown name lists the valid ones."""
    if isinstance(name, Manifold):
        return name
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown manifold {name!r}; choose one of: {', '.join(available_manifolds())}"
        ) from None
    return cls(**kwargs)
