"""msign: the SVD reference is exact; the iterations do what the chapter derives they do."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from manifold_muon import msign as ms

SHAPES = [(8, 8), (12, 5), (5, 12), (3, 2, 7, 4)]  # square, tall, wide, batched


@pytest.mark.parametrize("shape", SHAPES)
def test_svd_msign_is_orthogonal_factor(shape):
    G = torch.randn(*shape, dtype=torch.float64)
    O = ms.msign_svd(G)
    assert O.shape == G.shape
    assert ms.singular_value_error(O).max() < 1e-12
    # msign(G) is the orthogonal polar factor: G = O (O^T G) with O^T G symmetric positive semidefinite
    S = O.mT @ G if shape[-2] >= shape[-1] else G @ O.mT
    assert torch.allclose(S, S.mT, atol=1e-10)
    assert torch.linalg.eigvalsh(S).min() > -1e-10


def test_svd_msign_maps_zero_singular_values_to_zero():
    u = torch.randn(6, 1, dtype=torch.float64)
    v = torch.randn(4, 1, dtype=torch.float64)
    O = ms.msign_svd(u @ v.T)  # rank one
    s = torch.linalg.svdvals(O)
    assert s[0] == pytest.approx(1.0, abs=1e-12)
    assert s[1:].abs().max() < 1e-12


@pytest.mark.parametrize("method", ["newton_schulz", "polar_express"])
@pytest.mark.parametrize("shape", SHAPES)
def test_iterations_match_the_scalar_polynomial(method, shape):
    """Each step maps singular values through its quintic: predicted and measured spectra agree."""
    G = torch.randn(*shape, dtype=torch.float64)
    O = ms.msign(G, method=method, steps=5)
    s = (torch.linalg.svdvals(G) / G.norm(dim=(-2, -1), keepdim=True).squeeze(-1)).numpy()
    coeffs = [ms.JORDAN_COEFFS] * 5 if method == "newton_schulz" else ms.polar_express_coefficients(5)
    if method == "polar_express":
        s = s / 1.01  # its normalisation has the safety factor
    for a, b, c in coeffs:
        s = ms.quintic(s, a, b, c)
    predicted = np.sort(np.abs(s), axis=-1)
    measured = np.sort(torch.linalg.svdvals(O).numpy(), axis=-1)
    assert np.abs(predicted - measured).max() < 1e-6


def test_newton_schulz_band_on_well_conditioned_inputs():
    """Singular values that start above the five-step threshold end in Jordan's band [0.68, 1.21]."""
    U, _ = torch.linalg.qr(torch.randn(64, 16, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))
    G = (U * torch.linspace(0.2, 1.0, 16, dtype=torch.float64)) @ V.T
    s = torch.linalg.svdvals(ms.msign_newton_schulz(G, steps=5))
    assert s.min() > 0.68 and s.max() < 1.21


def test_polar_express_beats_newton_schulz_on_a_wide_spectrum():
    U, _ = torch.linalg.qr(torch.randn(64, 32, dtype=torch.float64))
    G = (U * torch.logspace(-2, 0, 32, dtype=torch.float64)) @ torch.eye(32, dtype=torch.float64)
    err_ns = ms.singular_value_error(ms.msign_newton_schulz(G, 5))
    err_pe = ms.singular_value_error(ms.msign_polar_express(G, 5))
    assert err_pe < err_ns


def test_polar_express_coefficients_shrink_the_error_each_step():
    s = np.geomspace(1e-3, 1, 10_001)
    errs = []
    for a, b, c in ms.polar_express_coefficients(6):
        s = ms.quintic(s, a, b, c)
        errs.append(np.abs(s - 1).max())
    assert all(e2 < e1 for e1, e2 in zip(errs, errs[1:]))
    assert errs[-1] < 0.05


def test_polar_express_traces_without_a_graph_break():
    """torch.compile reads the Polar Express coefficients as constants, computed once: with them behind
    ``functools.lru_cache`` dynamo traced through the cache into the Remez exchange's host arithmetic and broke the
    graph there, at every msign of a step (here the post's recipe on Stiefel, whose retraction takes an 8-step
    Polar Express; its other breaks are the retraction's own host reads, ``manifolds.gram.polar``)."""
    import torch._dynamo

    from manifold_muon.optim import ManifoldMuon

    torch._dynamo.reset()
    W = torch.nn.Parameter(torch.randn(24, 8))
    opt = ManifoldMuon([W], manifold="stiefel", inner="post")
    opt.retract_parameters()
    W.grad = torch.randn(24, 8)
    opt.step()  # the coefficients are made here, eagerly
    W.grad = torch.randn(24, 8)
    breaks = torch._dynamo.explain(opt.step)().break_reasons
    assert breaks and not [b for b in breaks if b.user_stack[-1].filename.endswith("msign.py")]
    assert ms.polar_express_coefficients(8) is ms.polar_express_coefficients(8)  # computed once


@pytest.mark.parametrize("method", ["newton_schulz", "polar_express"])
def test_bfloat16_runs_and_stays_close(method):
    G = torch.randn(48, 96)
    O16 = ms.msign(G, method=method, dtype=torch.bfloat16)
    O32 = ms.msign(G, method=method, dtype=torch.float32)
    assert O16.dtype == torch.bfloat16
    rel = (O16.double() - O32.double()).norm() / O32.double().norm()
    # bfloat16 keeps ~3 significant digits; Polar Express's first polynomial has large coefficients
    # (about 8, -24, 18) and loses more of them than Newton-Schulz does.
    assert rel < (0.05 if method == "newton_schulz" else 0.1)


@given(m=st.integers(1, 9), n=st.integers(1, 9), scale=st.floats(1e-2, 1e6), seed=st.integers(0, 2**31 - 1))
def test_iterations_are_scale_invariant_and_finite(m, n, scale, seed):
    G = torch.randn(m, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    G = G / G.norm()
    for method in ("newton_schulz", "polar_express"):
        O1 = ms.msign(G, method=method)
        O2 = ms.msign(G * scale, method=method)
        assert torch.isfinite(O2).all()
        # equal up to the eps = 1e-7 added to the norm, amplified by at most |p'| ~ 6 per step
        assert torch.allclose(O1, O2, rtol=1e-3, atol=1e-6)


def test_zero_matrix_gives_zero_not_nan():
    Z = torch.zeros(5, 3)
    for method in ms.METHODS:
        O = ms.msign(Z, method=method)
        assert torch.isfinite(O).all() and O.abs().max() == 0


def test_bad_input_is_refused_clearly():
    with pytest.raises(ValueError, match="unknown msign method"):
        ms.msign(torch.randn(3, 3), method="qr")
    with pytest.raises(ValueError, match="ndim >= 2"):
        ms.msign(torch.randn(3))
    with pytest.raises(ValueError, match="steps must be >= 1"):
        ms.msign_newton_schulz(torch.randn(3, 3), steps=0)
    with pytest.raises(TypeError):
        ms.msign([[1.0, 0.0]])


def test_remez_gives_the_equioscillating_quintic():
    a, b, c, E = ms._remez_odd_quintic(0.1, 1.0)
    s = np.linspace(0.1, 1.0, 100_001)
    err = np.abs(1 - ms.quintic(s, a, b, c))
    assert err.max() == pytest.approx(E, rel=1e-6)
    assert math.isclose(abs(1 - ms.quintic(0.1, a, b, c)), E, rel_tol=1e-9)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_paper_schedule_maps_singular_values_through_its_published_quintics(shape):
    """polar_express_paper: G / (1.01 ||G||_F), then the paper's quintics (the first seven shrunk by 1.01, the
    eighth repeated): predicted and measured spectra agree, and ten float64 steps reach 1 to rounding."""
    G = torch.randn(*shape, dtype=torch.float64)
    O = ms.msign(G, method="polar_express_paper", steps=10)
    s = (torch.linalg.svdvals(G) / G.norm(dim=(-2, -1), keepdim=True).squeeze(-1)).numpy() / 1.01
    for k in range(10):
        a, b, c = ms.PAPER_COEFFS[min(k, 7)]
        shrink = 1.01 if k < 7 else 1.0
        s = ms.quintic(s, a / shrink, b / shrink**3, c / shrink**5)
    measured = np.sort(torch.linalg.svdvals(O).numpy(), axis=-1)
    assert np.abs(np.sort(np.abs(s), axis=-1) - measured).max() < 1e-6
    sv = torch.linalg.svdvals(G)
    well = sv.amin(-1) > 1e-2 * sv.amax(-1)  # singular values well inside the schedule's [1e-3, 1]
    assert (ms.singular_value_error(O)[well] < 1e-6).all()


def test_the_post_s_msign_is_the_paper_schedule_for_ten_bfloat16_steps():
    assert (ms.POST_MSIGN.method, ms.POST_MSIGN.steps, ms.POST_MSIGN.dtype) == ("polar_express_paper", 10, torch.bfloat16)
    G = torch.randn(128, 64, generator=torch.Generator().manual_seed(0))  # tall: well conditioned
    err16 = float(ms.singular_value_error(ms.POST_MSIGN(G).float()))
    err32 = float(ms.singular_value_error(ms.msign(G, "polar_express_paper", 10, torch.float32)))
    assert err32 < 1e-5 < 1e-3 < err16 < 3e-2  # bfloat16 leaves its singular values about 1e-2 off 1
