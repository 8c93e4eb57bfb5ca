"""The paper's norm spheres ("Demystifying Manifold Constraints", Sec. 2, App. B.1): one norm fixed to R.

Weights follow PyTorch's Linear convention, W in R^{D_out x D_in}; leading dimensions are a batch.

    name                     constraint                                   ||.||_M (the norm MACRO normalises by)
    "frobenius_sphere"       ||W||_F = R,  R = r sqrt(D_out)              Frobenius
    "spectral_sphere"        ||W||_2 = R,  R = r sqrt(D_out / D_in)       spectral
    "input_oblique_sphere"   ||W[:, j]||_2 = R for all j, R = r sqrt(D_out / D_in)   1->2 (max column norm)
    "output_oblique_sphere"  ||W[i, :]||_2 = R for all i, R = r                      2->inf (max row norm)

The radii are Table 1 / eq. (42) of the paper; ``radius=`` overrides the rule with one number.
The paper calls the last two the input and output oblique manifolds; here they carry "_sphere" (a radius,
PyTorch's (D_out, D_in) orientation always) to keep them apart from the Gram-space ``gram_oblique``.

Every sphere belongs to the ``NormSphere`` family, which the sphere optimizers work on: besides the
manifold interface it answers ``radius(shape)``, ``norm(X)`` and ``normal(W)`` (the gradient Theta of the
scalar constraint, used by the tangent projection and by SSO/FSO).

The spectral sphere is not a manifold where sigma_1 = sigma_2 (paper, App. C.1); its "tangent space" here
is the one the paper uses, {A : <u1 v1^T, A> = 0} with (u1, v1) the leading singular pair.
"""

from __future__ import annotations

import abc
import math

import torch

from .base import Manifold, check_matrix, register

__all__ = ["NormSphere", "FrobeniusSphere", "SpectralSphere", "InputObliqueSphere", "OutputObliqueSphere",
           "top_singular_pair"]

_TINY = 1e-30


def _work(X: torch.Tensor) -> torch.Tensor:
    """Half precision is computed in float32 and cast back by the caller."""
    return X.float() if X.dtype in (torch.float16, torch.bfloat16) else X


def _fro(X: torch.Tensor) -> torch.Tensor:
    return torch.linalg.matrix_norm(X, ord="fro")


def _inner(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return (A * B).sum(dim=(-2, -1))


def top_singular_pair(W: torch.Tensor, power_iters: int | None = None):
    """(sigma_1, u1, v1) of each matrix: exact by SVD, or by ``power_iters`` power iterations on W^T W.

    Power iteration starts from the all-ones vector (deterministic) and converges at the rate
    (sigma_2 / sigma_1)^2 per iteration, so it is only accurate when the top singular value is separated.
    """
    X = _work(W)
    if power_iters is None:
        U, s, Vh = torch.linalg.svd(X, full_matrices=False)
        return s[..., 0], U[..., :, 0], Vh[..., 0, :]
    v = torch.ones(X.shape[:-2] + X.shape[-1:], dtype=X.dtype, device=X.device)
    v = v / v.norm(dim=-1, keepdim=True)
    for _ in range(power_iters):
        v = (X.mT @ (X @ v.unsqueeze(-1))).squeeze(-1)
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(_TINY)
    Xv = (X @ v.unsqueeze(-1)).squeeze(-1)
    s = Xv.norm(dim=-1)
    return s, Xv / s.unsqueeze(-1).clamp_min(_TINY), v


class NormSphere(Manifold):
    """The norm-sphere family, ||W||_M = R: what MACRO, MuonH, SSO and FSO work on.

    Subclasses give ``rule(D_out, D_in)`` (the factor that multiplies r), ``norm`` and ``normal``.
    """

    _spec_args = ("r", "radius")

    def __init__(self, r: float = 1.0, radius: float | None = None):
        if not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
            raise ValueError(f"{type(self).__name__}: r must be a positive number (the paper sweeps 0.5 to 10), got {r!r}")
        if radius is not None and not (isinstance(radius, (int, float)) and math.isfinite(radius) and radius > 0):
            raise ValueError(f"{type(self).__name__}: radius must be a positive number or None (use the rule), got {radius!r}")
        self.r, self.radius_value = float(r), radius

    @staticmethod
    @abc.abstractmethod
    def rule(D_out: int, D_in: int) -> float: ...

    @abc.abstractmethod
    def norm(self, X: torch.Tensor) -> torch.Tensor:
        """||X||_M per matrix: the norm the step is normalised by."""

    @abc.abstractmethod
    def normal(self, W: torch.Tensor) -> torch.Tensor:
        """Theta, the gradient of the scalar constraint at W (the tangent space is {A : <Theta, A> = 0})."""

    def radius(self, shape) -> float:
        """R for matrices of ``shape`` (..., D_out, D_in): the explicit radius, else r * rule(D_out, D_in)."""
        if len(shape) < 2:
            raise ValueError(f"{type(self).__name__}.radius needs a matrix shape (..., D_out, D_in), got {tuple(shape)}")
        if self.radius_value is not None:
            return float(self.radius_value)
        return self.r * self.rule(int(shape[-2]), int(shape[-1]))

    def spec(self) -> dict:
        return {"name": self.name, "r": self.r, "radius": self.radius_value,
                **{k: getattr(self, k) for k in self._spec_args if k not in ("r", "radius")}}

    def random_point(self, shape, generator=None, dtype=torch.float32) -> torch.Tensor:
        X = torch.randn(*shape, generator=generator, dtype=torch.float64)
        return self.retract(X).to(dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.spec().items() if k != 'name')})"


@register
class FrobeniusSphere(NormSphere):
    """||W||_F = R with R = r sqrt(D_out). Normal W; retraction R X / ||X||_F."""

    name = "frobenius_sphere"

    @staticmethod
    def rule(D_out, D_in):
        return math.sqrt(D_out)

    def norm(self, X):
        return _fro(_work(X))

    def normal(self, W):
        return _work(W)

    def project(self, W, G):
        check_matrix(W, "FrobeniusSphere.project")
        W, G = _work(W), _work(G)
        coef = _inner(G, W) / _inner(W, W).clamp_min(_TINY)
        return G - coef[..., None, None] * W

    def retract(self, X):
        check_matrix(X, "FrobeniusSphere.retract")
        Y = _work(X)
        R = self.radius(X.shape)
        return (R * Y / _fro(Y).clamp_min(_TINY)[..., None, None]).to(X.dtype)

    def residual(self, W):
        R = self.radius(W.shape)
        return (_fro(_work(W)) - R).abs() / R

    def tangent_residual(self, W, A):
        W, A = _work(W), _work(A)
        return _inner(W, A).abs() / (_fro(W) * _fro(A)).clamp_min(_TINY)


@register
class SpectralSphere(NormSphere):
    """||W||_2 = R with R = r sqrt(D_out / D_in). Normal u1 v1^T.

    ``retraction="approx"`` (default; what the paper ran, App. B.1): R X / ||X||_2.
    ``retraction="exact"``: the Frobenius-nearest point, by SVD: clip singular values above R to R, and if
    none was above R lift the largest to R. Both land exactly on the sphere (up to rounding); "exact" also
    leaves the other singular values alone where "approx" rescales them all.
    ``power_iters``: estimate (sigma_1, u1, v1) by that many power iterations instead of an SVD (faster, less
    accurate where sigma_1 is close to sigma_2); used by ``project``, ``normal`` and the approx retraction.
    """

    name = "spectral_sphere"
    RETRACTIONS = ("approx", "exact")
    _spec_args = ("r", "radius", "retraction", "power_iters")

    def __init__(self, r: float = 1.0, radius: float | None = None, retraction: str = "approx",
                 power_iters: int | None = None):
        super().__init__(r, radius)
        if retraction not in self.RETRACTIONS:
            raise ValueError(f"SpectralSphere: unknown retraction {retraction!r}; choose one of {', '.join(self.RETRACTIONS)}")
        if power_iters is not None and (not isinstance(power_iters, int) or power_iters < 1):
            raise ValueError(f"SpectralSphere: power_iters must be a positive int or None (exact SVD), got {power_iters!r}")
        self.retraction, self.power_iters = retraction, power_iters

    @staticmethod
    def rule(D_out, D_in):
        return math.sqrt(D_out / D_in)

    def _sigma1(self, X):
        if self.power_iters is None:
            return torch.linalg.matrix_norm(_work(X), ord=2)  # singular values only: cheaper than a full SVD
        return top_singular_pair(X, self.power_iters)[0]

    def norm(self, X):
        return self._sigma1(X)

    def normal(self, W):
        _, u, v = top_singular_pair(W, self.power_iters)
        return u.unsqueeze(-1) * v.unsqueeze(-2)

    def project(self, W, G):
        check_matrix(W, "SpectralSphere.project")
        _, u, v = top_singular_pair(W, self.power_iters)
        G = _work(G)
        coef = (u.unsqueeze(-2) @ G @ v.unsqueeze(-1))[..., 0, 0]  # u1^T G v1
        return G - coef[..., None, None] * (u.unsqueeze(-1) * v.unsqueeze(-2))

    def retract(self, X):
        check_matrix(X, "SpectralSphere.retract")
        Y, R = _work(X), self.radius(X.shape)
        if self.retraction == "approx":
            s1 = self._sigma1(Y)
            return (R * Y / s1.clamp_min(_TINY)[..., None, None]).to(X.dtype)
        U, s, Vh = torch.linalg.svd(Y, full_matrices=False)
        s = s.clamp(max=R)
        s[..., 0] = R  # after clipping the largest is <= R; either it was clipped to R or it is lifted to R
        return ((U * s.unsqueeze(-2)) @ Vh).to(X.dtype)

    def residual(self, W):
        R = self.radius(W.shape)
        return (torch.linalg.matrix_norm(_work(W), ord=2) - R).abs() / R

    def tangent_residual(self, W, A):
        A = _work(A)
        return _inner(self.normal(W), A).abs() / _fro(A).clamp_min(_TINY)


class _ObliqueSphere(NormSphere):
    """Every column (dim=-2 reduced, ``axis=-2``) or every row (``axis=-1``) has norm R."""

    axis: int = -2

    def norm(self, X):
        return _work(X).norm(dim=self.axis).amax(dim=-1)

    def normal(self, W):
        return _work(W)

    def project(self, W, G):
        check_matrix(W, f"{type(self).__name__}.project")
        W, G = _work(W), _work(G)
        coef = (W * G).sum(dim=self.axis, keepdim=True) / (W * W).sum(dim=self.axis, keepdim=True).clamp_min(_TINY)
        return G - coef * W

    def retract(self, X):
        check_matrix(X, f"{type(self).__name__}.retract")
        Y, R = _work(X), self.radius(X.shape)
        return (R * Y / Y.norm(dim=self.axis, keepdim=True).clamp_min(_TINY)).to(X.dtype)

    def residual(self, W):
        R = self.radius(W.shape)
        return ((_work(W).norm(dim=self.axis) - R).abs() / R).amax(dim=-1)

    def tangent_residual(self, W, A):
        W, A = _work(W), _work(A)
        per = (W * A).sum(dim=self.axis).abs() / W.norm(dim=self.axis).clamp_min(_TINY)
        return per.amax(dim=-1) / _fro(A).clamp_min(_TINY)


@register
class InputObliqueSphere(_ObliqueSphere):
    """Radius-R columns: ||W[:, j]||_2 = R for every input feature j, R = r sqrt(D_out / D_in); norm 1->2."""

    name = "input_oblique_sphere"
    axis = -2

    @staticmethod
    def rule(D_out, D_in):
        return math.sqrt(D_out / D_in)


@register
class OutputObliqueSphere(_ObliqueSphere):
    """Radius-R rows: ||W[i, :]||_2 = R for every output feature i, R = r; norm 2->inf."""

    name = "output_oblique_sphere"
    axis = -1

    @staticmethod
    def rule(D_out, D_in):
        return 1.0
