"""The benchmark ``step_budget`` (where the lean step's time goes; the one-eigendecomposition prototype): it refuses
bad input before any work, its call timer sees every eigendecomposition and product of a step, and the prototype is what it says: one
eigendecomposition and two eigvalsh a step where the library's tracker takes two and one, with an honest
certificate (a feasible direction whose certified gap bounds its sub-optimality against the exact solve); the float32
arm decomposes the carried multiplier in float32 and nothing else in a lower precision; the first-order arm (``dk``)
takes one eigendecomposition a step and still certifies honestly."""

import contextlib
import math

import pytest
import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.opcount import OpCounter
from manifold_muon.optim import ManifoldMuon
from manifold_muon.optim.inner_solvers import exact_solve, lean_solve
from manifold_muon_book.bench import step_budget


def test_step_budget_refuses_bad_input_first(tmp_path):
    with pytest.raises(ValueError, match="manifold of"):
        step_budget.main(tmp_path, weights=[((24, 8), "sphere")], shapes=())
    with pytest.raises(ValueError, match="m, n >= 2"):
        step_budget.main(tmp_path, weights=[((24, 1), "dgram")], shapes=())
    with pytest.raises(ValueError, match="rectangular"):
        step_budget.main(tmp_path, weights=[((24, 8), "dgram")], shapes=[(16, 16)])
    with pytest.raises(ValueError, match="rectangular"):
        step_budget.main(tmp_path, weights=[((24, 8), "dgram")], shapes=(), float32_weights=[((16, 16), "dgram")])
    with pytest.raises(ValueError, match="repeats"):
        step_budget.main(tmp_path, weights=[((24, 8), "dgram")], shapes=(), repeats=0)
    with pytest.raises(ValueError, match="square_sizes"):
        step_budget.main(tmp_path, weights=[((24, 8), "dgram")], shapes=(), square_sizes=[1])
    with pytest.raises(ValueError, match="float32_weights"):
        step_budget.main(tmp_path, weights=[((24, 8), "dgram")], shapes=(), float32_weights=[((24, 8), "sphere")])
    assert not list(tmp_path.iterdir())


def test_step_budget_rows_add_up(tmp_path):
    out = step_budget.main(tmp_path, weights=[((24, 8), "dgram"), ((12, 12), "stiefel")], shapes=[(24, 8)],
                           seeds=[0], rounds=3, timed=2, float32_weights=[((8, 20), "dgram")], quick=True)
    assert (tmp_path / "step_budget.json").exists()
    for r in out["rows"]:
        for arm in ("lean", "muon"):
            p = r[f"{arm}_bins"]
            assert p["n x n products"] + p["m x n products"] > 0
        assert r["lean_bins"]["eigendecompositions"] > 0 and r["muon_bins"]["eigendecompositions"] == 0
        assert math.isclose(r["floor_ratio"], r["floor_ms"] / r["muon_ms"])
    square = out["rows"][1]
    assert square["lean_bins"]["m x n products"] == 0  # a square weight has no m-long side
    rows = out["one_eigh"]
    assert [(r["manifold"], r["seed"]) for r in rows] == [("dgram", 0), ("stiefel", 0)]
    for r in rows:
        assert (r["lagged_eigh"], r["lagged_eigvalsh"]) == (1, 2) and (r["newton_eigh"], r["newton_eigvalsh"]) == (2, 1)
        assert (r["eig32_eigh"], r["eig32_eigvalsh"]) == (2, 1)  # the same calls, one of them in float32
        assert (r["dk_eigh"], r["dk_eigvalsh"]) == (1, 1)  # the certificate's eigendecomposition is gone
        assert (r["ritz_eigh"], r["ritz_eigvalsh"]) == (1, 1)
        assert all(math.isfinite(r[f"{a}_vs_muon"]) and r[f"{a}_ratio"] > 0 for a in step_budget.ARMS)
    (wide,) = out["float32_weights"]
    assert wide["shape"] == [8, 20] and wide["eig32_ratio"] > 0 and wide["dk_ratio"] > 0 and "lagged_e_W" not in wide
    floors = out["fixed_floor"]
    assert [(f["manifold"], f["arm"]) for f in floors] == [(m, a) for m in ("dgram", "stiefel")
                                                            for a in ("newton", "eig32", "dk", "ritz")]
    assert all(0 <= f["gap_min"] <= f["gap"] <= 1 and 0 < f["damping"] <= 1 for f in floors)
    (sq,) = out["square32"]
    assert (sq["n"], sq["seed"]) == (12, 0) and sq["float32_eigh_ms"] > 0 and sq["float64_eigh_ms"] > 0


@pytest.mark.parametrize("n", [16, 17, 40])
def test_square32_certificate_is_honest(n):
    """Square Stiefel's float32 swap is certified honestly: in both precisions the certified gap is at least the exact
    relative sub-optimality against ||S||_*, and float64's is at rounding level (the closed form is exact)."""
    for seed in (0, 1):
        r = step_budget.square32(n, seed, calls=1)
        for name in ("float64", "float32"):
            assert r[f"{name}_gap"] >= r[f"{name}_suboptimality"] - 1e-13, (name, r)
            assert r[f"{name}_suboptimality"] >= -1e-13
        assert abs(r["float64_gap"]) < 1e-12


@pytest.mark.parametrize("shape", [(40, 12), (12, 40)])
def test_lagged_tracker_certificate_is_honest(shape):
    """Along a stream, on the DGram weights it is measured on, the prototype's direction is feasible (tangent,
    op-norm <= 1) and its certified gap bounds its sub-optimality: <G, A> >= (1 - gap) OPT, OPT the exact
    solve's."""
    M = get_manifold("dgram")
    g = torch.Generator().manual_seed(3)
    W = M.random_point(shape, generator=g)
    warm, t = None, None
    with step_budget.lagged():
        for _ in range(6):
            G = torch.randn(shape, generator=g)
            sol = lean_solve(W, G, M.gram_projector, warm=warm, steps=1, diagonal=True, tracker="newton", damping=t)
            warm, t = (sol.Lambda, sol.U), sol.damping
            A = sol.matrix().double()
            Wd = W.double()
            S = (Wd.mT @ A) if shape[0] >= shape[1] else (A @ Wd.mT)
            off = S + S.mT - torch.diag_embed(torch.diagonal(S + S.mT))
            assert float(off.abs().max()) < 1e-5
            assert float(torch.linalg.matrix_norm(A, ord=2)) <= 1 + 1e-5
            assert 0 <= float(sol.gap) <= 1
            ref = exact_solve(Wd, G.double(), M.gram_projector, tol=1e-9)
            opt = float((G.double() * ref.matrix()).sum())
            assert float((G.double() * A).sum()) >= (1 - float(sol.gap)) * opt - 1e-6 * abs(opt)


@pytest.mark.parametrize("first_order", [True, False])
@pytest.mark.parametrize("shape,manifold", [((40, 12), "dgram"), ((12, 40), "dgram"), ((40, 12), "stiefel")])
def test_first_order_tracker_certificate_is_honest(shape, manifold, first_order):
    """Along a stream the ``dk`` prototype's direction is feasible (tangent, op-norm <= 1) and its certified gap, from
    the Schur-Horn bound in the carried multiplier's eigenbasis, bounds its sub-optimality: <G, A> >= (1 - gap) OPT;
    and it calls ``eigh`` once a step (the library's tracker: twice); with ``first_order=False`` (the Ritz candidate,
    arm ``ritz``) too."""
    M = get_manifold(manifold)
    g = torch.Generator().manual_seed(5)
    W = M.random_point(shape, generator=g)
    G = torch.randn(shape, generator=g)
    warm, t = None, None
    with step_budget.first_order(first_order):
        for k in range(6):
            G = 0.9 * G + 0.45 * torch.randn(shape, generator=g)  # a moving stream, so the tracker keeps stepping
            with OpCounter(max(shape)) as counter:
                sol = lean_solve(W, G, M.gram_projector, warm=warm, steps=1, diagonal=True, tracker="newton",
                                 damping=t, eigenbasis=manifold == "stiefel")
            if warm is not None:  # (the first step also runs the tracker's ADMM start)
                assert counter.counts["eigh"] == 1
            warm, t = (sol.Lambda, sol.U), sol.damping
            A = sol.matrix().double()
            Wd = W.double()
            S = (Wd.mT @ A) if shape[0] >= shape[1] else (A @ Wd.mT)
            defect = S + S.mT if manifold == "stiefel" else S + S.mT - torch.diag_embed(torch.diagonal(S + S.mT))
            assert float(defect.abs().max()) < 1e-5
            assert float(torch.linalg.matrix_norm(A, ord=2)) <= 1 + 1e-5
            assert 0 <= float(sol.gap) <= 1
            ref = exact_solve(Wd, G.double(), M.gram_projector, tol=1e-9)
            opt = float((G.double() * ref.matrix()).sum())
            assert float((G.double() * A).sum()) >= (1 - float(sol.gap)) * opt - 1e-6 * abs(opt), k


@pytest.mark.parametrize("shape,manifold", [((40, 12), "dgram"), ((12, 40), "dgram"), ((40, 12), "stiefel")])
def test_first_order_arm_is_the_library_tracker(shape, manifold):
    """The arm ``dk`` (the swap) and the library's ``tracker="newton_dk"`` take the same steps bit for bit along a
    stream, through the optimizer: what ``step_budget.json`` measured as ``dk`` is the library's tracker."""
    M = get_manifold(manifold)
    g = torch.Generator().manual_seed(3)
    W0 = M.random_point(shape, generator=g)
    grads = [torch.randn(shape, generator=g) for _ in range(5)]
    out = []
    for arm, tracker in (("dk", "newton"), (None, "newton_dk"), (None, "newton")):
        W = torch.nn.Parameter(W0.clone())
        opt = ManifoldMuon([W], lr=0.05, manifold=manifold, inner="lean", tracker=tracker)
        with step_budget.swapped(arm) if arm else contextlib.nullcontext():
            for G in grads:
                W.grad = G.clone()
                with OpCounter(max(shape)) as counter:
                    opt.step()
        assert counter.counts["eigh"] == (2 if (arm, tracker) == (None, "newton") else 1)
        out.append((W.detach().clone(), opt.state[W]["duality_gap"].clone(), opt.state[W]["Lambda"].clone()))
    for a, b in zip(out[0], out[1]):
        assert torch.equal(a, b)
    assert not torch.equal(out[1][0], out[2][0])  # the library's two trackers differ


def test_first_order_term_acts():
    """``dk`` and ``ritz`` differ only by the first-order term, and it acts: from the same carried state the two give
    different directions after the same Newton step, and ``dk``'s certified gap (the same bound) is the smaller."""
    M = get_manifold("dgram")
    g = torch.Generator().manual_seed(7)
    W, G = M.random_point((40, 12), generator=g), torch.randn(40, 12, generator=g)
    warm = lean_solve(W, G, M.gram_projector, steps=1, diagonal=True, tracker="newton")
    G = G + 0.3 * torch.randn(40, 12, generator=g)
    out = {}
    for flag in (True, False):
        with step_budget.first_order(flag):
            out[flag] = lean_solve(W, G, M.gram_projector, warm=(warm.Lambda, warm.U), steps=1, diagonal=True,
                                   tracker="newton", damping=warm.damping)
    assert float((out[True].matrix() - out[False].matrix()).norm()) > 1e-4
    assert torch.equal(out[True].Lambda, out[False].Lambda)  # the same Newton step and damping decision
    assert float(out[True].gap) < float(out[False].gap)


@pytest.mark.parametrize("shape", [(30, 9), (9, 30), (16, 16)])
def test_schur_horn_bound(shape):
    """The bound the ``dk`` prototype certifies with: for any orthonormal V, sum_i ||Z v_i|| >= ||Z||_*, with equality
    in Z's right singular basis (a sum of sqrt over N's diagonal in any basis is at least its sum over N's
    eigenvalues)."""
    g = torch.Generator().manual_seed(2)
    Z = torch.randn(shape, dtype=torch.float64, generator=g) * torch.logspace(0, -3, shape[1], dtype=torch.float64)
    nuclear = float(torch.linalg.svdvals(Z).sum())
    for _ in range(20):
        V, _ = torch.linalg.qr(torch.randn(shape[1], shape[1], dtype=torch.float64, generator=g))
        assert float(torch.linalg.vector_norm(Z @ V, dim=0).sum()) >= nuclear * (1 - 1e-12)
    Vs = torch.linalg.svd(Z, full_matrices=False).Vh.mT
    assert math.isclose(float(torch.linalg.vector_norm(Z @ Vs, dim=0).sum()), nuclear, rel_tol=1e-10)


@pytest.mark.parametrize("arm", ["lagged", "eig32", "dk", "ritz"])
def test_swaps_are_undone(arm):
    import manifold_muon.optim.inner_solvers as iso

    before = iso.newton_track
    with pytest.raises(RuntimeError):
        with step_budget.swapped(arm):
            assert iso.newton_track is not before
            raise RuntimeError
    assert iso.newton_track is before


@pytest.mark.parametrize("shape,manifold", [((24, 8), "dgram"), ((8, 24), "stiefel")])
def test_float32_arm_decomposes_the_carried_multiplier_in_float32(shape, manifold, monkeypatch):
    """Under ``float32_direction`` the tracker's first eigendecomposition (at the carried multiplier) gets a float32
    matrix and the certificate's stays float64; without it both are float64. (The op-norm's eigvalsh is float32 in
    both.)"""
    g = torch.Generator().manual_seed(1)
    M = get_manifold(manifold)
    W, G = M.random_point(shape, generator=g), torch.randn(shape, generator=g)
    warm = lean_solve(W, G, M.gram_projector, steps=1, diagonal=True, tracker="newton")
    seen = []
    eigh = torch.linalg.eigh
    monkeypatch.setattr(torch.linalg, "eigh", lambda A, *a, **k: seen.append(A.dtype) or eigh(A, *a, **k))
    for arm in ("newton", "eig32"):
        seen.clear()
        with step_budget.swapped(arm):
            lean_solve(W, G, M.gram_projector, warm=(warm.Lambda, warm.U), steps=1, diagonal=True, tracker="newton",
                       damping=warm.damping, eigenbasis=manifold == "stiefel")
        first = torch.float32 if arm == "eig32" else torch.float64
        assert seen == [first, torch.float64], (arm, seen)


@pytest.mark.parametrize("shape,manifold", [((24, 8), "dgram"), ((8, 24), "dgram"), ((12, 12), "stiefel")])
def test_call_timer_sees_every_call(shape, manifold):
    """The timer's bins hold as many calls as ``OpCounter`` counts in the same kind of step (a tracked one)."""
    g = torch.Generator().manual_seed(0)
    W = torch.nn.Parameter(get_manifold(manifold).random_point(shape, generator=g))
    opt = ManifoldMuon([W], lr=0.0, momentum=0.0, nesterov=False, manifold=manifold, inner="lean")
    for _ in range(2):
        W.grad = torch.randn(shape, generator=g)
        opt.step()
    W.grad = torch.randn(shape, generator=g)
    with OpCounter(max(shape)) as counter:
        opt.step()
    timer = step_budget._CallTimer(min(shape), max(shape))
    W.grad = torch.randn(shape, generator=g)
    with timer:
        opt.step()
    c = counter.counts
    assert timer.calls["eigendecompositions"] == c["eigh"] + c["eigvalsh"] + c["cholesky"] > 0
    assert timer.calls["n x n products"] + timer.calls["m x n products"] == c["matmul_full"] + c["matmul_small"]
    assert (timer.calls["m x n products"] > 0) == (shape[0] != shape[1])


def test_low_rank_refuses_bad_input_first():
    from manifold_muon_book.bench.low_rank import low_rank_gaps

    for kw in (dict(shape=(16, 1)), dict(shape=(16, 8), rank=0), dict(shape=(16, 8), steps=4, skip=4)):
        with pytest.raises(ValueError, match="low_rank_gaps"):
            low_rank_gaps(**kw)


def test_current_refuses_bad_input_first(tmp_path):
    with pytest.raises(ValueError, match="manifold"):
        step_budget.current(tmp_path, weights=[((24, 8), "sphere")])
    with pytest.raises(ValueError, match="kernel_shapes"):
        step_budget.current(tmp_path, weights=[((24, 8), "dgram")], kernel_shapes=[(24, 1)])
    with pytest.raises(ValueError, match="repeats"):
        step_budget.current(tmp_path, weights=[((24, 8), "dgram")], repeats=0)
    assert not list(tmp_path.iterdir())


def test_current_budgets_every_weight_each_repeat_and_counts_kernels(tmp_path):
    weights = [((24, 8), "stiefel"), ((8, 8), "dgram")]
    out = step_budget.current(tmp_path, weights=weights, repeats=2, kernel_shapes=[(8, 20)], rounds=3, timed=2)
    assert (tmp_path / "step_budget_current.json").exists()
    assert [(tuple(r["shape"]), r["manifold"], r["repeat"]) for r in out["rows"]] == [
        (s, m, rep) for rep in range(2) for s, m in weights]
    assert all(r["lean_kernels"] > r["muon_kernels"] > 0 for r in out["rows"])
    assert [(k["shape"], k["manifold"]) for k in out["kernels"]] == [([8, 20], m) for m in ("stiefel", "dgram",
                                                                                           "gram_oblique")]
    for k in out["kernels"]:
        assert sum(k["lean_kernels_by_op"].values()) == k["lean_kernels"] > k["muon_kernels"] > 0
