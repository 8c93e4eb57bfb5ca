"""The four norm spheres of 003 (App. B.1): retractions land on the sphere, projections are tangent."""

import math

import pytest
import torch

from manifold_muon.manifolds import available_manifolds, get_manifold
from manifold_muon.manifolds.spheres import SpectralSphere, top_singular_pair

SPHERES = ["frobenius_sphere", "spectral_sphere", "input_oblique_sphere", "output_oblique_sphere"]
SHAPES = [(7, 4), (4, 7), (5, 5)]
DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: 2e-5, torch.float64: 1e-11}


def _manifolds():
    yield from [(n, get_manifold(n, r=1.5)) for n in SPHERES]
    yield "spectral_sphere[exact]", get_manifold("spectral_sphere", r=1.5, retraction="exact")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("label,M", list(_manifolds()))
def test_retract_project_on_the_sphere(label, M, shape, dtype):
    g = torch.Generator().manual_seed(1)
    X = 3 * torch.randn(*shape, generator=g, dtype=dtype)
    W = M.retract(X)
    assert W.dtype == dtype
    assert float(M.residual(W)) < TOL[dtype], "retraction must land on the sphere"
    assert torch.allclose(M.retract(W), W, atol=10 * TOL[dtype], rtol=0), "retraction is the identity on the sphere"
    G = torch.randn(*shape, generator=g, dtype=dtype)
    A = M.project(W, G)
    assert torch.allclose(M.project(W, A), A, atol=10 * TOL[dtype], rtol=0), "projection must be idempotent"
    assert float(M.tangent_residual(W, A)) < 10 * TOL[dtype], "projection must satisfy the linearised constraint"
    assert float(M.tangent_residual(W, G)) > 1e-3, "a random G is not tangent (the residual can tell)"
    # orthogonal projection: G - A is normal, i.e. orthogonal to every tangent vector
    B = M.project(W, torch.randn(*shape, generator=g, dtype=dtype))
    assert abs(float(((G - A) * B).sum())) < 100 * TOL[dtype] * float(G.norm() * B.norm())


@pytest.mark.parametrize("name", SPHERES)
def test_batched_equals_per_matrix(name):
    M = get_manifold(name)
    X, G = torch.randn(3, 6, 4, dtype=torch.float64), torch.randn(3, 6, 4, dtype=torch.float64)
    W = M.retract(X)
    for i in range(3):
        assert torch.allclose(W[i], M.retract(X[i]))
        assert torch.allclose(M.project(W, G)[i], M.project(W[i], G[i]))
        assert torch.allclose(M.residual(W)[i], M.residual(W[i]))
    assert M.residual(W).shape == (3,)


def test_radius_rules_table1():
    D_out, D_in, r = 12, 3, 0.5
    assert math.isclose(get_manifold("frobenius_sphere", r=r).radius((D_out, D_in)), r * math.sqrt(D_out))
    assert math.isclose(get_manifold("spectral_sphere", r=r).radius((D_out, D_in)), r * math.sqrt(D_out / D_in))
    assert math.isclose(get_manifold("input_oblique_sphere", r=r).radius((D_out, D_in)), r * math.sqrt(D_out / D_in))
    assert math.isclose(get_manifold("output_oblique_sphere", r=r).radius((D_out, D_in)), r)
    assert get_manifold("frobenius_sphere", radius=2.5).radius((D_out, D_in)) == 2.5
    # eq. (42): the oblique radii are chosen so that ||W||_F equals the Frobenius sphere's radius
    for name in ("input_oblique_sphere", "output_oblique_sphere"):
        W = get_manifold(name, r=r).random_point((D_out, D_in), dtype=torch.float64)
        assert math.isclose(float(W.norm()), r * math.sqrt(D_out), rel_tol=1e-12)


def test_spectral_exact_retraction_is_nearest_and_approx_is_not():
    exact, approx = SpectralSphere(radius=1.0, retraction="exact"), SpectralSphere(radius=1.0)
    g = torch.Generator().manual_seed(3)
    for scale in (0.1, 10.0):  # all singular values below R (lift the top one) / some above (clip)
        X = scale * torch.randn(6, 4, generator=g, dtype=torch.float64)
        We, Wa = exact.retract(X), approx.retract(X)
        assert float(exact.residual(We)) < 1e-12 and float(approx.residual(Wa)) < 1e-12
        assert (We - X).norm() <= (Wa - X).norm() + 1e-12
        for _ in range(20):  # no random point of the sphere is nearer than the exact retraction
            P = exact.random_point((6, 4), generator=g, dtype=torch.float64)
            assert (We - X).norm() <= (P - X).norm() + 1e-12
    s_X, s_We = torch.linalg.svdvals(X), torch.linalg.svdvals(We)
    assert torch.allclose(s_We, s_X.clamp(max=1.0), atol=1e-12), "exact retraction clips singular values above R"


def test_power_iteration_matches_svd_with_a_gap():
    U, _ = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(5, 5, dtype=torch.float64))
    W = U[:, :5] @ torch.diag(torch.tensor([3.0, 1.0, 0.5, 0.2, 0.1], dtype=torch.float64)) @ V.T
    s, u, v = top_singular_pair(W, power_iters=30)
    s0, u0, v0 = top_singular_pair(W)
    assert abs(float(s - s0)) < 1e-12 and abs(abs(float(u @ u0)) - 1) < 1e-12 and abs(abs(float(v @ v0)) - 1) < 1e-12
    M = SpectralSphere(radius=2.0, power_iters=30)
    assert float(M.residual(M.retract(W))) < 1e-12


@pytest.mark.parametrize("name", SPHERES)
def test_bf16_and_degenerate_inputs(name):
    M = get_manifold(name)
    X = torch.randn(6, 4).bfloat16()
    W = M.retract(X)
    assert W.dtype == torch.bfloat16 and float(M.residual(W)) < 1e-2
    rank1 = M.retract(torch.outer(torch.randn(6), torch.randn(4)).double())
    assert float(M.residual(rank1)) < 1e-12
    A = M.project(rank1, torch.randn(6, 4, dtype=torch.float64))
    assert torch.isfinite(A).all() and float(M.tangent_residual(rank1, A)) < 1e-10
    assert torch.isfinite(M.retract(torch.zeros(6, 4))).all(), "the zero matrix has no nearest point; no NaN either"


def test_bad_input_is_refused():
    assert set(SPHERES) <= set(available_manifolds())
    with pytest.raises(ValueError, match="frobenius_sphere"):
        get_manifold("frobenius_spher")
    with pytest.raises(ValueError, match="AdamW"):
        get_manifold("spectral_sphere").retract(torch.randn(5))
    with pytest.raises(ValueError, match="r must be a positive"):
        get_manifold("input_oblique_sphere", r=0)
    with pytest.raises(ValueError, match="radius"):
        get_manifold("output_oblique_sphere", radius=-1.0)
    with pytest.raises(ValueError, match="approx, exact"):
        get_manifold("spectral_sphere", retraction="svd")
