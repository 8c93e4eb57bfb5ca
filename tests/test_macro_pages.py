"""The page helpers of chapter 09 (manifold_muon_book.macro_pages): the references its checks compare against
and the bookkeeping of its tables do what their docstrings say."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.msign import msign_svd
from manifold_muon.optim import MACRO, MuonH
from manifold_muon_book import macro_pages as mp

F64 = torch.float64


def test_inner_nuclear_and_abs_cos():
    A = torch.randn(3, 4, 5, generator=mp.gen(0), dtype=F64)
    assert torch.allclose(mp.inner(A, A), (A**2).sum(dim=(-2, -1)))
    assert torch.allclose(mp.nuclear(A), torch.linalg.matrix_norm(A, ord="nuc"))
    assert torch.allclose(mp.abs_cos(A, -2 * A), torch.ones(3, dtype=F64))
    E1, E2 = torch.zeros(4, 5, dtype=F64), torch.zeros(4, 5, dtype=F64)
    E1[0, 0], E2[1, 1] = 1.0, 1.0
    assert float(mp.abs_cos(E1, E2)) == 0.0


def test_constraint_rate_is_the_first_order_change_of_the_constraints():
    m = get_manifold("frobenius_sphere", r=1.3)
    W = m.random_point((6, 4), generator=mp.gen(1), dtype=F64)
    T = m.project(W, torch.randn(6, 4, generator=mp.gen(2), dtype=F64))
    assert float(mp.constraint_rate("frobenius_sphere", W, T).abs().max()) < 1e-8      # tangent: no change
    assert torch.allclose(mp.constraint_rate("frobenius_sphere", W, W), W.norm().reshape(1))   # d/ds ||(1+s)W||
    Wc = torch.randn(6, 4, generator=mp.gen(3), dtype=F64)
    rate = mp.constraint_rate("input_oblique_sphere", Wc, Wc)                             # one per column
    assert rate.shape == (4,) and torch.allclose(rate, Wc.norm(dim=0))
    assert mp.constraint_rate("output_oblique_sphere", Wc, Wc).shape == (6,)


def test_projection_errors_and_their_worst_case():
    m = get_manifold("spectral_sphere", r=1.0)
    g = mp.gen(4)
    W = m.random_point((6, 4), generator=g, dtype=F64)
    M = torch.randn(6, 4, generator=g, dtype=F64)
    errors = mp.projection_errors("spectral_sphere", m, W, M, m.project(W, M),
                                  m.project(W, torch.randn(6, 4, generator=g, dtype=F64)))
    assert errors["idem"] < 1e-12 and errors["dh"] < 1e-8 and errors["orth"] < 1e-12 and errors["dh_raw"] > 1e-3
    row = mp.worst_projection_row("x", [dict(idem=1.0, dh=2.0, orth=3.0, dh_raw=4.0),
                                        dict(idem=0.5, dh=5.0, orth=0.1, dh_raw=0.2)])
    assert row == {"manifold": "x", "||P(P(M)) - P(M)||": 1.0, "max |dh along Phi|": 5.0,
                   "min |dh along M| (for scale)": 0.2, "max cos(M - Phi, tangent)": 3.0}


def test_rounding_level_columns_are_shown_as_their_bound():
    df = pd.DataFrame({"a": [1e-15, 2e-3], "b": [1.0, 2.0]})
    shown = mp._bounded(df, {"a": 1e-12})
    assert list(shown["a"]) == ["< 1e-12", "2.0e-03"] and list(shown["b"]) == [1.0, 2.0]


def test_the_curve_diag_R_s_leaves_the_restricted_set_at_R_minus_eps():
    ss = np.linspace(0, 1, 11)
    member = mp.diag_curve_in_restricted_set(ss, R=1.0, eps=0.3)
    assert member == [bool(s <= 0.7 + 1e-12) for s in ss]


def test_brute_force_finds_the_nearest_point_of_the_spectral_sphere():
    X = torch.diag(torch.tensor([2.0, 0.5, 0.2], dtype=F64))         # nearest point: diag(1, 0.5, 0.2)
    Q, d = mp.brute_force_spectral(X, iters=400)
    assert abs(float(torch.linalg.matrix_norm(Q, ord=2)) - 1) < 1e-12
    assert 1.0 - 1e-9 <= d <= 1.0 + 1e-3


def test_one_step_is_muonh_on_the_frobenius_sphere_and_macro_keeps_the_constraint():
    m = get_manifold("frobenius_sphere")
    W0 = m.random_point((10, 6), generator=mp.gen(5), dtype=F64)
    G = torch.randn(10, 6, generator=mp.gen(6), dtype=F64)
    R, S = m.radius(W0.shape), msign_svd(G)
    X = W0 - 0.05 * R * S / S.norm()
    assert torch.allclose(mp.one_step(MuonH, W0, G, lr=0.05, manifold="frobenius_sphere", c=1.0), R * X / X.norm(),
                          atol=1e-12)
    W1 = mp.one_step(MACRO, W0, G, lr=0.05, manifold="frobenius_sphere", c=1.0)
    assert float(m.residual(W1)) < 1e-12 and not torch.allclose(W1, R * X / X.norm(), atol=1e-6)


def test_macro_quadratic_run_reports_residual_and_loss_ratio():
    row = mp.macro_quadratic_run("frobenius_sphere", steps=300)
    assert set(row) == {"manifold", "max constraint residual", "loss after / before"}
    assert row["max constraint residual"] < 1e-12 and row["loss after / before"] < 1e-3


def test_sits_on_jump_sees_the_sign_change_across_a_bisection_result():
    W = torch.diag(torch.tensor([2.0, 1.0], dtype=F64))[None]
    G = torch.diag(torch.tensor([1.0, 0.0], dtype=F64))[None]
    assert mp.sits_on_jump(W, G, torch.tensor([-0.5], dtype=F64), mp.nuclear(W))       # h jumps from -3 to 1
    assert not mp.sits_on_jump(W, G, torch.tensor([-0.25], dtype=F64), mp.nuclear(W))  # h = 1 on both sides
    g = mp.gen(7)                                                                        # a tall pair
    Wt, Gt = torch.randn(1, 8, 3, generator=g, dtype=F64), torch.randn(1, 8, 3, generator=g, dtype=F64)
    from manifold_muon.optim.spheres import bisect_multiplier

    lam, _, h = bisect_multiplier(Gt, Wt, msign_svd, tol=1e-12, max_iter=80)
    assert float(h.abs().max() / mp.nuclear(Wt).max()) < 1e-10                          # a root, not a miss
    assert not mp.sits_on_jump(Wt, Gt, lam + 1.0, mp.nuclear(Wt))                        # away from it: no change


def test_phi_star_check_accepts_the_solution_of_7_and_nothing_else():
    W = torch.diag(torch.tensor([2.0, 1.0], dtype=F64))
    G = torch.diag(torch.tensor([1.0, 0.0], dtype=F64))
    mp.check_phi_star_solves_7(W, G, torch.diag(torch.tensor([0.5, -1.0], dtype=F64)), n=2000)
    with pytest.raises(AssertionError):                     # feasible direction, but not on the unit spectral sphere
        mp.check_phi_star_solves_7(W, G, torch.diag(torch.tensor([0.25, -0.5], dtype=F64)), n=2000)
    with pytest.raises(AssertionError):                     # on the sphere, tangent, but not the maximiser
        mp.check_phi_star_solves_7(W, G, torch.diag(torch.tensor([-0.5, 1.0], dtype=F64)), n=2000)


def test_bisection_row_counts_misses():
    h = torch.tensor([0.0, 0.5, 1e-9, 0.2], dtype=F64)
    h10 = torch.tensor([1e-5, 1e-3, 1e-3, 1e-3], dtype=F64)
    scale = torch.ones(4, dtype=F64)
    row = mp.bisection_row((3, 3), 4, h, h10, scale, h.abs() / scale > 1e-6)
    assert row["shape"] == "(3, 3)" and row["no root to 1e-6 (60 iterations)"] == 0.5
    assert row["median |h| / ||W||_* when missed"] == pytest.approx(0.2)        # torch's median: the lower middle
    assert row["tolerance 1e-4 not met in 10 iterations"] == 0.75
    none = mp.bisection_row((8, 3), 4, h * 0, h10, scale, h * 0 > 1)
    assert none["no root to 1e-6 (60 iterations)"] == 0.0 and none["median |h| / ||W||_* when missed"] == 0.0


def test_momentum_noise_norm_without_averaging_is_the_noise_norm():
    assert 0.9 < mp.momentum_noise_norm(mp.gen(8), beta=0.0, t=3, n=2000) < 1.05          # E||N||_F with E||N||^2 = 1
    assert mp.momentum_noise_norm(mp.gen(8), beta=0.9, t=30, n=2000) < 0.5               # averaging shrinks it


def test_spel_row_of_the_exact_step_is_exact():
    st = get_manifold("stiefel")
    W = st.random_point((12, 5), generator=mp.gen(9)).double()
    G = torch.randn(12, 5, generator=mp.gen(10), dtype=F64)
    A = msign_svd(st.project(W, G))
    row = mp.spel_row(st, (12, 5), "same", W, G, A, A)
    assert row["shape"] == "12 x 5" and row["value / optimum"] == pytest.approx(1.0)
    assert row["e_W at lr 0.02"] == 0.0 and row["e_W at lr 0.1"] == 0.0
