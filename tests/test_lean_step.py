"""The lean step (``inner="lean"``, issue 19): square Stiefel in closed form, the lean solve's certificate, the eigh-free
retractions, and one host synchronisation per optimizer step."""

import pytest
import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.opcount import OpCounter
from manifold_muon.optim import ManifoldMuon, Muon
from manifold_muon.optim.inner_solvers import NEWTON_START, gram_solve, lean_solve
from manifold_muon.manifolds.gram import inverse_sqrt_newton_schulz, inverse_sqrt_series
from manifold_muon.optim.manifold_muon import _square_stiefel_paired, skew_msign, square_stiefel_step

NAMES = ["stiefel", "dgram", "gram_oblique"]
SHAPES = [(12, 5), (5, 12), (8, 8), (7, 7)]


def spectrum_momentum(shape, g, decay=1.3, rank=None):
    m, n = shape
    k = min(m, n)
    U = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))[0]
    s = torch.arange(1, k + 1, dtype=torch.float64).pow(-decay)
    if rank is not None:
        s[rank:] = 0
    return ((U * s) @ V.mT).float()


def assert_honest(sol, M, W, G, dtype):
    """The solve's direction is feasible (unit op-norm ball, tangent, to the rounding of ``dtype``) and its certified
    gap bounds its true relative sub-optimality against a float64 certified optimum."""
    A = sol.matrix().double()
    Wd, Gd = W.double(), G.double() / G.double().pow(2).mean().sqrt()
    slack = 1e-4 if dtype == torch.float32 else 4 * 2**-8
    assert float(torch.linalg.matrix_norm(A, ord=2)) <= 1 + (1e-5 if dtype == torch.float32 else slack)
    assert float(M.tangent_residual(Wd, A)) <= slack * min(W.shape)
    ref = gram_solve(Wd, Gd, M.gram_projector, steps=3000, tol=1e-9)
    opt_value = float((Gd * ref.matrix()).sum())
    assert (opt_value - float((Gd * A).sum())) / opt_value <= float(sol.gap) + slack


def explicit_reads(ops: OpCounter) -> int:
    """The host reads the code makes itself (``sync`` less the checks inside torch's linear algebra)."""
    return ops.counts["sync"] - ops.counts["sync_checked"]


def host_reads_of_a_step(opt, Ws) -> int:
    """Host synchronisations the code makes itself in the second of two steps (the first fills the state)."""
    return explicit_reads(counts_of_a_step(opt, Ws))


def counts_of_a_step(opt, Ws) -> OpCounter:
    for _ in range(2):
        for w in Ws:
            w.grad = torch.randn(w.shape)
        with OpCounter(12) as ops:
            opt.step()
    return ops


@pytest.mark.parametrize("n", [6, 7, 16, 17])
@pytest.mark.parametrize("rank", [None, 3])
def test_square_stiefel_closed_form_is_the_certified_optimum(n, rank):
    """Even and odd n, full-rank and rank-deficient gradients: gap <= 1e-6, the direction equals the float64
    certified reference, and the closed-form retraction is the polar factor of W - lr A (on the manifold)."""
    g = torch.Generator().manual_seed(n)
    M = get_manifold("stiefel")
    W = M.random_point((n, n), generator=g)
    G = spectrum_momentum((n, n), g, rank=rank)
    lr = 0.1
    W_new, gap, violation = square_stiefel_step(W, G, lr)
    assert float(gap.abs()) <= 1e-6 and float(violation) < 1e-6
    ref = gram_solve(W.double(), G.double(), M.gram_projector, steps=2000, tol=1e-10)
    assert float(ref.gap) <= 1e-6
    expected = M.retract(W.double() - lr * ref.matrix())
    assert float((W_new.double() - expected).norm() / expected.norm()) < 1e-5
    assert float(M.residual(W_new)) < 1e-5


def test_square_stiefel_closed_form_without_a_skew_part_stays_with_gap_zero():
    """A symmetric W^T G (no tangent component: here W = I and G symmetric, so that it is symmetric exactly) and G = 0:
    the optimum is the zero direction, certified (gap 0, not 1), and W stays where it is."""
    X = torch.randn(6, 6, generator=torch.Generator().manual_seed(5))
    W = torch.eye(6)
    for G in (X + X.mT, torch.zeros(6, 6)):
        W_new, gap, violation = square_stiefel_step(W, G, 0.1)
        assert float(gap) == 0.0 and float(violation) == 0.0
        assert torch.equal(W_new, W)


@pytest.mark.parametrize("n", [6, 7, 16, 17])
@pytest.mark.parametrize("rank", [None, 3])
def test_square_stiefel_paired_form_is_the_general_form(n, rank):
    """On a generic gradient every kept pair of S's eigenvectors is (v, S v / s): the check holds, and the paired
    form's step and gap are the general form's (S V diag(1/s) V^T) to float32 rounding, even and odd n, full rank
    and rank-deficient."""
    g = torch.Generator().manual_seed(100 + n)
    W = get_manifold("stiefel").random_point((n, n), generator=g)
    G = spectrum_momentum((n, n), g, rank=rank)
    W_new, gap, paired, fix = _square_stiefel_paired(W, G, 0.1)
    assert bool(paired.all())
    W_gen, gap_gen = fix(torch.ones_like(paired))
    assert float((W_new - W_gen).norm() / (W_gen - W).norm()) < 1e-5
    assert abs(float(gap) - float(gap_gen)) < 1e-6


def shared_singular_values(n, g):
    """(W, G) in float64 with W^T G skew, whose singular values come four at a time (two pairs share each, to
    float64 rounding): the eigenvectors of a shared eigenvalue of S^T S are any basis of its four-dimensional
    space. (In float32 the rounding of G splits each four into two pairs, far enough apart for a float64
    eigendecomposition to tell them apart, and the pairing holds.)"""
    R = get_manifold("stiefel").random_point((n, n), generator=g, dtype=torch.float64)
    J = torch.zeros(n, n, dtype=torch.float64)
    for k in range(n // 2):
        J[2 * k + 1, 2 * k] = 3.0 if k < n // 4 else 1.0
    J = J - J.mT
    return torch.eye(n, dtype=torch.float64), R @ J @ R.mT


def test_square_stiefel_takes_the_general_form_where_pairs_share_a_singular_value():
    """Where two pairs share a singular value the pairing check fails (asserted: the case is reached), and the
    step (standalone, and the optimizer's through its guard) is the certified optimum all the same."""
    M = get_manifold("stiefel")
    W, G = shared_singular_values(8, torch.Generator().manual_seed(3))
    assert not bool(_square_stiefel_paired(W, G, 0.1)[2].all())
    W_new, gap, _ = square_stiefel_step(W, G, 0.1)
    assert float(gap.abs()) <= 1e-6
    ref = gram_solve(W, G, M.gram_projector, steps=2000, tol=1e-10)
    expected = M.retract(W - 0.1 * ref.matrix())
    assert float((W_new - expected).norm() / expected.norm()) < 1e-10
    p = torch.nn.Parameter(W.clone())
    opt = ManifoldMuon([p], lr=0.1, momentum=0.0, nesterov=False, inner="lean")
    p.grad = G.clone()
    opt.step()
    assert torch.equal(p.detach(), W_new)
    assert float(opt.state[p]["duality_gap"].abs()) <= 1e-6


@pytest.mark.parametrize("shared", [False, True])
def test_skew_msign_is_the_polar_factor(shared):
    """``skew_msign`` (paired, or the general form where pairs share a singular value) is U V^T of S's SVD, skew."""
    g = torch.Generator().manual_seed(11)
    if shared:
        W, S = shared_singular_values(8, g)
    else:
        X = torch.randn(9, 9, generator=g, dtype=torch.float64)
        S = X - X.mT
    B, gap, paired = skew_msign(S)
    assert bool(paired) is not shared
    U, s, Vh = torch.linalg.svd(S)
    keep = s > 1e-6 * s[0]
    assert torch.allclose(B, (U * keep) @ Vh, atol=1e-10) and torch.allclose(B, -B.mT, atol=1e-12)
    assert abs(float(gap)) < 1e-12


@pytest.mark.parametrize("lr", [0.02, 1.0])
def test_square_stiefel_closed_form_keeps_the_constraint_over_long_runs(lr):
    """Over 1000 steps at n = 64, at Muon's step size and at lr 1 (where F - I is not small and B's accuracy on the
    smallest kept singular values shows), W stays on the manifold to float32 rounding: W's own rounding off it is
    removed each step (F - E/2) and B is a partial isometry to rounding (P = S V diag(1/s) in float64; in float32
    this failed at lr 1 with a residual of 2e-4)."""
    g = torch.Generator().manual_seed(64)
    M = get_manifold("stiefel")
    W = M.random_point((64, 64), generator=g)
    for _ in range(1000):
        W, gap, _ = square_stiefel_step(W, torch.randn(64, 64, generator=g), lr)
    assert float(gap.abs()) <= 1e-6
    assert float(M.residual(W)) < 64 * torch.finfo(torch.float32).eps


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [None, 2])
def test_lean_certificate_is_honest(name, shape, dtype, rank):
    """The reported gap bounds the true relative sub-optimality of the returned direction (against a float64
    certified optimum), and the direction is feasible: tangent and inside the unit op-norm ball."""
    g = torch.Generator().manual_seed(100 * NAMES.index(name) + SHAPES.index(shape))
    M = get_manifold(name)
    W = M.random_point(shape, generator=g).to(dtype)
    G = spectrum_momentum(shape, g, rank=rank).to(dtype)  # rank 2: a rank-deficient gradient
    sol = lean_solve(W, G, M.gram_projector, steps=1, diagonal=name != "gram_oblique")
    A = sol.matrix().double()
    Wd, Gd = W.double(), G.double() / G.double().pow(2).mean().sqrt()
    slack = 1e-4 if dtype == torch.float32 else 4 * 2**-8  # bf16: W itself is on the manifold only to its rounding
    assert float(torch.linalg.matrix_norm(A, ord=2)) <= 1 + (1e-5 if dtype == torch.float32 else slack)
    assert float(M.tangent_residual(Wd, A)) <= slack * min(shape)
    ref = gram_solve(Wd, Gd, M.gram_projector, steps=3000, tol=1e-9)
    opt_value = float((Gd * ref.matrix()).sum())
    true_gap = (opt_value - float((Gd * A).sum())) / opt_value
    assert true_gap <= float(sol.gap) + slack


@pytest.mark.parametrize("lr", [0.01, 0.05, 0.15, 0.5])
def test_eigh_free_inverse_square_roots(lr):
    g = torch.Generator().manual_seed(3)
    A = torch.randn(10, 6, generator=g, dtype=torch.float64)
    A = A / torch.linalg.matrix_norm(A, ord=2)
    S = torch.eye(6, dtype=torch.float64) + lr**2 * A.mT @ A
    lam, V = torch.linalg.eigh(S)
    exact = (V * lam.rsqrt()) @ V.mT
    assert torch.allclose(inverse_sqrt_series(S, lr), exact, atol=1e-7)
    assert torch.allclose(inverse_sqrt_newton_schulz(S, 5), exact, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(12, 5), (5, 12), (8, 8), (7, 7)])
@pytest.mark.parametrize("lr", [0.02, 0.1, 0.3])
def test_series_factor_lands_and_is_the_retraction_to_second_order(name, shape, lr):
    """Every manifold's eigh-free factor puts X = W - lr A (A tangent, ||A||_op = 1) on the manifold to float32 rounding, is
    the identity on a point already there, and differs from ``retract`` by O(lr^2) only (a retraction is fixed to
    first order): the difference shrinks at least 3x from lr to lr / 2."""
    M = get_manifold(name)
    g = torch.Generator().manual_seed(5)
    W = M.random_point(shape, generator=g, dtype=torch.float64)
    tall = lambda X: X.mT if X.size(-2) < X.size(-1) else X  # noqa: E731

    def step(lr):
        A = M.project(W, torch.randn(shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64))
        A = A / torch.linalg.matrix_norm(A, ord=2)
        X = tall(W - lr * A)
        T = M.series_factor(X.mT @ X, lr)
        assert bool(M.lands(T, X.mT @ X, torch.float32))  # the series is cut at float32 rounding
        Wn = X @ T
        return float((Wn - tall(M.retract(W - lr * A))).norm() / Wn.norm())

    Wt = tall(W)
    assert torch.allclose(Wt @ M.series_factor(Wt.mT @ Wt, lr), Wt, atol=1e-12)
    big, small = step(lr), step(lr / 2)
    assert big < 5 * lr**2 and (small < big / 3 or big < 1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_lean_retraction_needs_no_eigendecomposition(name):
    """On tall and wide weights the lean step's eigendecompositions are the solve's alone (its default iterations,
    none on Stiefel and one elsewhere, and one certificate): the retraction adds none, on DGram and Oblique too."""
    M = get_manifold(name)
    Ws = [torch.nn.Parameter(M.random_point(s)) for s in [(24, 8), (8, 24)]]
    opt = ManifoldMuon(Ws, lr=0.05, manifold=name, inner="lean")
    for _ in range(2):
        for w in Ws:
            w.grad = torch.randn(w.shape)
        with OpCounter(24) as ops:
            opt.step()
    per_shape = 1 if name == "stiefel" else 2  # cold on Stiefel: one eigh; one iteration and a certificate elsewhere
    assert ops.counts["eigh"] == 2 * per_shape and ops.counts.get("svd", 0) == 0
    assert all(float(M.residual(w.detach())) < 1e-5 for w in Ws)


@pytest.mark.parametrize("name", NAMES)
def test_lean_step_reads_the_host_once_per_step(name):
    """The lean step of several weights (tall, wide, square) makes one host read of its own in all: the
    non-finite check and the retraction guards are read together; diagnostics stay tensors. torch's
    eigendecompositions read their LAPACK status on the host as well (``manifold_muon.opcount``), once per
    batched call: per shape, so three copies of every weight cost the reads of one, and those are the
    eigendecompositions' only (the Cholesky factorisations go unchecked, ``inner_solvers._cholesky``)."""
    M = get_manifold(name)

    def counts(copies):
        torch.manual_seed(0)
        Ws = [torch.nn.Parameter(M.random_point(s)) for s in [(12, 5), (5, 12), (8, 8)] for _ in range(copies)]
        opt = ManifoldMuon(Ws, lr=0.05, manifold=name, inner="lean")
        ops = counts_of_a_step(opt, Ws)
        assert all(isinstance(opt.state[w]["duality_gap"], torch.Tensor) for w in Ws)
        return ops.counts

    one, three = counts(1), counts(3)
    assert one["sync"] - one["sync_checked"] == three["sync"] - three["sync_checked"] == 1
    assert one["sync_checked"] == three["sync_checked"] == one["eigh"] + one.get("eigvalsh", 0)


def test_opcounter_counts_what_it_sees():
    """The counter is not blind: Muon's step has 5 Newton-Schulz steps of 2 full-size products each, none in float64;
    a float64 product is counted among the others and in ``matmul_f64`` too."""
    W = torch.nn.Parameter(torch.randn(24, 8))
    opt = Muon([W])
    W.grad = torch.randn(24, 8)
    with OpCounter(24) as ops:
        opt.step()
    assert ops.counts["matmul_full"] == 10 and ops.counts["matmul_small"] == 5 and ops.counts["eigh"] == 0
    assert ops.counts["matmul_f64"] == 0  # Muon's products are float32
    with OpCounter(24) as ops:
        float(W.sum())
    assert ops.counts["sync"] == 1
    X32, X64 = torch.randn(2, 5, 5), torch.randn(2, 5, 5, dtype=torch.float64)
    with OpCounter(24) as ops:
        X32 @ X32, X64 @ X64, X64.mT @ X64, torch.bmm(X32, X32)
    assert ops.counts["matmul_small"] == 8 and ops.counts["matmul_f64"] == 4  # a batch of two counts two


def test_lean_guard_falls_back_where_the_fast_retraction_misses():
    """A weight knocked off its manifold (so the series' premise fails) is still put back on it: the guard
    sees the miss and the step retracts the m x n matrix itself."""
    M = get_manifold("stiefel")
    W = torch.nn.Parameter(M.random_point((12, 5)))
    with torch.no_grad():
        W.mul_(1.5)  # off the manifold: X^T X is far from I
    opt = ManifoldMuon([W], lr=0.05, inner="lean")
    W.grad = torch.randn(12, 5)
    opt.step()
    assert float(M.residual(W.detach())) < 1e-5


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(24, 8), (8, 24)])
def test_newton_certifies_quickly_and_agrees_with_admm(name, shape):
    """Newton on the dual reaches a relative gap <= 1e-8 on tall and wide problems and lands on the same
    optimum as long ADMM (the solution is unique where Z* has full rank)."""
    from manifold_muon.optim.inner_solvers import newton_solve

    g = torch.Generator().manual_seed(11 + NAMES.index(name))
    M = get_manifold(name)
    W = M.random_point(shape, generator=g, dtype=torch.float64)
    G = spectrum_momentum(shape, g).double()
    nt = newton_solve(W, G, M.gram_projector, tol=1e-9, steps=40)
    assert float(nt.gap) <= 1e-8
    ref = gram_solve(W, G, M.gram_projector, steps=4000, tol=1e-9)
    assert float((nt.matrix() - ref.matrix()).norm() / ref.matrix().norm()) < 1e-3


@pytest.mark.parametrize("name", ["stiefel", "dgram", "gram_oblique"])
@pytest.mark.parametrize("shape", [(24, 8), (8, 24), (40, 13)])
def test_newton_float32_cg_certifies_as_float64_does(name, shape):
    """``newton_solve``'s CG in float32 (the default, ``cg_dtype``) certifies the gap float64 CG certifies, to 1e-10,
    and lands on the same optimum: its directions are put back into P's range exactly, so the float32 rounding they
    carry does not stay in the multiplier (without that the gap stalled near 2e-9 at 40 x 13)."""
    from manifold_muon.optim.inner_solvers import newton_solve

    g = torch.Generator().manual_seed(3 + sum(shape))
    M = get_manifold(name)
    W = M.random_point(shape, generator=g, dtype=torch.float64)
    G = spectrum_momentum(shape, g).double()
    sols = {dt: newton_solve(W, G, M.gram_projector, tol=1e-10, steps=40, cg_dtype=dt)
            for dt in (torch.float32, torch.float64)}
    assert all(float(sol.gap) <= 1e-10 for sol in sols.values()), {str(k): float(v.gap) for k, v in sols.items()}
    A, B = sols[torch.float32].matrix(), sols[torch.float64].matrix()
    assert float((A - B).norm() / B.norm()) < 1e-4


@pytest.mark.parametrize("shape", [(24, 8), (8, 24), (40, 13)])
def test_stiefel_newton_in_the_eigenbasis_certifies_the_same_optimum_in_fewer_products(shape):
    """``newton_solve(eigenbasis=True)`` (Stiefel's exact mode: CG in N's eigenbasis, preconditioned by the exact
    inverse of the Hessian's first term) certifies a relative gap <= 1e-8 from the cold start, lands on the optimum
    that the same system solved with its vectors in the weights' basis lands on (``_diagonal_cg``: six n x n
    products a CG step where the eigenbasis takes two), and spends fewer n x n products doing it."""
    from manifold_muon.optim.inner_solvers import newton_solve

    g = torch.Generator().manual_seed(sum(shape))
    M = get_manifold("stiefel")
    W = M.random_point(shape, generator=g, dtype=torch.float64)
    G = spectrum_momentum(shape, g).double()
    sols, products = {}, {}
    for eigenbasis in (False, True):
        with OpCounter(max(shape)) as ops:
            sols[eigenbasis] = newton_solve(W, G, M.gram_projector, tol=1e-9, steps=40, eigenbasis=eigenbasis)
        products[eigenbasis] = ops.counts["matmul_small"] + ops.counts.get("matmul_full", 0)
    assert float(sols[True].gap) <= 1e-8 and float(sols[False].gap) <= 1e-8
    A, B = sols[True].matrix(), sols[False].matrix()
    assert float((A - B).norm() / B.norm()) < 1e-4
    assert products[True] < 0.9 * products[False]  # measured: 0.59, 0.63 and 0.59 (a certificate costs as much)


@pytest.mark.parametrize("name", NAMES)
def test_exact_mode_is_one_argument_and_certifies(name):
    M = get_manifold(name)
    g = torch.Generator().manual_seed(5)
    W = torch.nn.Parameter(M.random_point((18, 6), generator=g))
    opt = ManifoldMuon([W], lr=0.05, manifold=name, inner="exact")
    assert opt.param_groups[0]["tol"] == 1e-6
    for _ in range(3):
        W.grad = spectrum_momentum((18, 6), g)
        opt.step()
    assert float(opt.state[W]["duality_gap"]) <= 1e-6
    assert float(M.residual(W.detach())) < 1e-5


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(40, 13), (13, 40)])
def test_warm_exact_mode_takes_newton_first_and_stays_honest(name, shape):
    """From the last step's multiplier (a training run's warm start) the exact mode runs Newton first: on a momentum
    correlated with the last it certifies the asked gap within Newton steps alone (fewer iterations than the ADMM
    stage it skips), its gap bounds its true relative sub-optimality, and it lands where a long ADMM solve does."""
    from manifold_muon.optim.inner_solvers import exact_solve

    g = torch.Generator().manual_seed(17 + NAMES.index(name) + shape[0])
    M = get_manifold(name)
    W = M.random_point(shape, generator=g, dtype=torch.float64)
    G0 = spectrum_momentum(shape, g).double()
    G1 = 0.95 * G0 + 0.3 * spectrum_momentum(shape, g).double()
    last = exact_solve(W, G0, M.gram_projector, eigenbasis=name == "stiefel")  # cold: ADMM, then Newton
    sol = exact_solve(W, G1, M.gram_projector, warm=(last.Lambda, last.U), eigenbasis=name == "stiefel")
    assert float(sol.gap) <= 1e-6
    assert int(sol.iterations) < 16  # Newton steps only: the ADMM stage (16) was not needed
    assert_honest(sol, M, W, G1, torch.float64)
    ref = gram_solve(W, G1, M.gram_projector, steps=4000, tol=1e-10)
    assert float((sol.matrix() - ref.matrix()).norm() / ref.matrix().norm()) < 1e-3


@pytest.mark.parametrize("n", [8, 9])
def test_exact_mode_on_square_stiefel_keeps_the_closed_form_when_warm(n):
    """On a square Stiefel weight the exact mode certifies the cold start (the closed form) before anything else,
    warm or not: no iteration on any step, even and odd n (odd: S is singular, the dual is not smooth, and Newton
    from the carried multiplier would not certify)."""
    g = torch.Generator().manual_seed(n)
    M = get_manifold("stiefel")
    W = torch.nn.Parameter(M.random_point((n, n), generator=g))
    opt = ManifoldMuon([W], lr=0.05, inner="exact")
    for _ in range(3):
        W.grad = spectrum_momentum((n, n), g)
        opt.step()
        assert float(opt.state[W]["duality_gap"]) <= 1e-6 and int(opt.state[W]["inner_iterations"]) == 0


@pytest.mark.parametrize("shape", [(40, 12), (12, 40)])
def test_damped_newton_systems_add_mu_times_the_first_term(shape):
    """``newton_solve``'s Levenberg-Marquardt systems: ``_hvp(mu=m)`` is ``_hvp`` plus m times the Hessian's first
    term (positive on P's range), and mu = 0 changes nothing. ``_eigen_cg(mu=m)`` and ``_diagonal_cg(mu=m)`` (the
    identity projector, its vectors carried as X V) solve that damped system to CG's tolerance."""
    from manifold_muon.optim.inner_solvers import (_diagonal_cg, _eigen_cg, _hvp, _sym, _tall_unit, eig_sqrt,
                                                   gram_picture, inv_sqrt, multiplier)

    g = torch.Generator().manual_seed(sum(shape))
    M = get_manifold("stiefel")
    W, G = M.random_point(shape, generator=g, dtype=torch.float64), spectrum_momentum(shape, g).double()
    Wt, Gt, _ = _tall_unit(W, G, True, views=True)
    pic = gram_picture(Wt, Gt, M.gram_projector, torch.float64, diagonal=True)
    a = pic.K0 - multiplier(pic, pic.DK0 + pic.DK0.mT) + 0.05 * _sym(torch.randn(pic.D.shape, generator=g,
                                                                                dtype=torch.float64))
    V, s = eig_sqrt(_sym(a.mT @ pic.dmul(a) + pic.R))
    mu = torch.tensor(0.7, dtype=torch.float64)
    plain, _, _ = _hvp(pic, a, V, s, torch.float64)
    damped, _, _ = _hvp(pic, a, V, s, torch.float64, mu=mu)
    undamped, _, _ = _hvp(pic, a, V, s, torch.float64, mu=torch.zeros(()))
    x = _sym(torch.randn(pic.D.shape, generator=g, dtype=torch.float64))
    first = (damped(x) - plain(x)) / mu
    assert float((undamped(x) - plain(x)).abs().max()) <= 1e-12 * float(plain(x).abs().max())
    assert float((x * first).sum()) > 0
    y = _eigen_cg(pic, a, V, s, 1e-10, 200, torch.float64, stop=1e-24, mu=mu)
    grad = 2 * _sym((pic.dmul(a) @ V * inv_sqrt(s, 1e-10).unsqueeze(-2)) @ V.mT)
    assert float((damped(y) + grad).norm() / grad.norm()) < 1e-8
    z = _diagonal_cg(pic, a, V, s, grad, 200, torch.float64, stop=1e-24, mu=mu)
    assert float((damped(_sym(z)) + grad).norm() / grad.norm()) < 1e-8


CONGRUENCE_STEPS = 40  # measured: 16, 15 and 28 steps to 1e-8 here; with D replaced by its mean 47, 52 and 79


@pytest.mark.parametrize("shape", [(40, 12), (12, 40), (33, 33)])
def test_congruence_cg_solves_the_damped_dgram_system(shape):
    """``_congruence_cg`` (DGram's exact-mode CG: the first term's exact inverse through x = D^{-1/2} y D^{-1/2})
    solves the same damped, P-projected system as ``_hvp`` with D's diagonal spread 0.25-4: in float64 to a relative
    residual of 1e-8 within ``CONGRUENCE_STEPS`` CG steps, with a zero diagonal (P's range), and in float32, which
    ``newton_solve`` uses, to 1e-3. The step budget is what the congruence buys: with D replaced by its mean (the
    preconditioner before it) CG did not reach 1e-8 in it on any of the three (checked by mutation)."""
    from manifold_muon.optim.inner_solvers import (_congruence_cg, _hvp, _sym, _tall_unit, eig_sqrt, gram_picture,
                                                   inv_sqrt, multiplier)

    g = torch.Generator().manual_seed(7 + sum(shape))
    M = get_manifold("dgram")
    scale = torch.linspace(0.5, 2.0, min(shape), dtype=torch.float64)  # column norms apart: D is not c I
    W = M.random_point(shape, generator=g, dtype=torch.float64)
    W = W * scale if shape[0] >= shape[1] else scale.unsqueeze(-1) * W
    G = spectrum_momentum(shape, g).double()
    Wt, Gt, _ = _tall_unit(W, G, True, views=True)
    pic = gram_picture(Wt, Gt, M.gram_projector, torch.float64, diagonal=True)
    a = pic.K0 - multiplier(pic, pic.DK0 + pic.DK0.mT) + 0.05 * M.gram_projector(
        _sym(torch.randn(pic.D.shape, generator=g, dtype=torch.float64)))
    V, s = eig_sqrt(_sym(a.mT @ pic.dmul(a) + pic.R))
    mu = torch.tensor(0.3, dtype=torch.float64)
    damped, _, _ = _hvp(pic, a, V, s, torch.float64, mu=mu)
    grad = 2 * M.gram_projector(_sym((pic.dmul(a) @ V * inv_sqrt(s, 1e-10).unsqueeze(-2)) @ V.mT))
    x = _congruence_cg(pic, a, V, s, grad, CONGRUENCE_STEPS, torch.float64, stop=1e-24, mu=mu)
    assert float(torch.diagonal(x).abs().max()) <= 1e-12 * float(x.abs().max())
    assert float((damped(_sym(x)) + grad).norm() / grad.norm()) < 1e-8
    x32 = _congruence_cg(pic, a, V, s, grad, 400, torch.float32, stop=1e-10, mu=mu).double()
    assert float((damped(_sym(x32)) + grad).norm() / grad.norm()) < 1e-3


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (24, 24)])
def test_congruence_cg_solves_with_a_stale_basis(shape):
    """``newton_solve`` keeps Qt's eigendecomposition (``_congruence_cg``'s ``basis``) across small steps. One taken at
    another multiplier still preconditions positive definitely: after a random P-projected move of 0.05 CG still solves
    the damped system at the new multiplier to a relative residual of 1e-8 in float64 (within 400 steps), and after
    one of 0.005 (a small step, as the solve keeps the basis only after those) within 1.5x the steps of the fresh
    basis plus two (a basis with its eigenvalues reversed, positive definite but wrong, fails that on the wide and the
    square system: checked by mutation)."""
    from manifold_muon.optim.inner_solvers import (_congruence_basis, _congruence_cg, _hvp, _sym, _tall_unit, eig_sqrt,
                                                   gram_picture, inv_sqrt, multiplier)

    g = torch.Generator().manual_seed(3 + sum(shape))
    M = get_manifold("dgram")
    scale = torch.linspace(0.5, 2.0, min(shape), dtype=torch.float64)
    W = M.random_point(shape, generator=g, dtype=torch.float64)
    W = W * scale if shape[0] >= shape[1] else scale.unsqueeze(-1) * W
    G = spectrum_momentum(shape, g).double()
    Wt, Gt, _ = _tall_unit(W, G, True, views=True)
    pic = gram_picture(Wt, Gt, M.gram_projector, torch.float64, diagonal=True)
    move = lambda: 0.05 * M.gram_projector(_sym(torch.randn(pic.D.shape, generator=g, dtype=torch.float64)))  # noqa
    a = pic.K0 - multiplier(pic, pic.DK0 + pic.DK0.mT) + move()
    step = move()
    V, s = eig_sqrt(_sym(a.mT @ pic.dmul(a) + pic.R))
    mu = torch.tensor(0.1, dtype=torch.float64)
    damped, _, _ = _hvp(pic, a, V, s, torch.float64, mu=mu)
    grad = 2 * M.gram_projector(_sym((pic.dmul(a) @ V * inv_sqrt(s, 1e-10).unsqueeze(-2)) @ V.mT))

    def steps(basis):  # CG steps to a relative residual of 1e-8 (None: not within 400)
        for k in range(1, 401):
            x = _congruence_cg(pic, a, V, s, grad, k, torch.float64, mu=mu, basis=basis)
            if float((damped(_sym(x)) + grad).norm() / grad.norm()) < 1e-8:
                return k
        return None

    def basis_at(a_old):  # the basis taken at another multiplier's N
        return _congruence_basis(pic, *eig_sqrt(_sym(a_old.mT @ pic.dmul(a_old) + pic.R)), torch.float64)

    fresh = steps(_congruence_basis(pic, V, s, torch.float64))
    far, near = steps(basis_at(a - step)), steps(basis_at(a - 0.1 * step))
    assert fresh is not None and far is not None, (fresh, far)
    assert near is not None and near <= 1.5 * fresh + 2, (fresh, near)


def test_picture_splits_a_tiny_off_diagonal():
    """A float32 DGram point given in float64 (the exact mode's input) has W^T W diagonal only to float32's rounding:
    ``gram_picture`` keeps D whole but splits its off-diagonal part off (``off32``), and ``dmul`` then agrees with the
    float64 product D X to 1e-13 (relative; the diagonal part alone misses it by the off-diagonal's size, ~1e-8, checked
    by mutation). Oblique's W^T W is far from diagonal: no split there."""
    from manifold_muon.optim.inner_solvers import _tall_unit, gram_picture

    g = torch.Generator().manual_seed(5)
    for name, split in (("dgram", True), ("gram_oblique", False)):
        M = get_manifold(name)
        W = M.random_point((96, 32), generator=g).double()  # float32 point, float64 dtype
        G = spectrum_momentum((96, 32), g).double()
        Wt, Gt, _ = _tall_unit(W, G, True, views=True)
        pic = gram_picture(Wt, Gt, M.gram_projector, torch.float64)
        assert not pic.diagonal
        assert (pic.off32 is not None) == split, name
        X = torch.randn(pic.D.shape, generator=g, dtype=torch.float64)
        full = pic.D @ X
        assert float((pic.dmul(X) - full).norm() / full.norm()) <= 1e-13, name


def test_exact_mode_carries_no_zero_U():
    """The exact mode's Newton solve keeps no ADMM multiplier U (it returns U = 0): the optimizer carries only Lambda
    (no tall "U" formed from zeros: two m x n products a step saved), and the next step, warm from it, certifies as
    before."""
    g = torch.Generator().manual_seed(9)
    W = torch.nn.Parameter(get_manifold("dgram").random_point((96, 32), generator=g))
    opt = ManifoldMuon([W], lr=0.02, manifold="dgram", inner="exact")
    for _ in range(3):
        W.grad = spectrum_momentum((96, 32), g)
        opt.step()
        state = opt.state[W]
        assert "Lambda" in state and not any(k in state for k in ("U", "U_a", "U_b")), sorted(state)
        assert float(state["duality_gap"]) <= 1e-6


@pytest.mark.parametrize("shape", [(40, 12), (12, 40)])
def test_dgram_exact_mode_certifies_with_a_zero_column(shape):
    """Where a column of W (a row, wide) is zero, D^{-1/2} does not exist: ``_congruence_cg`` floors d at 1e-6 of its
    largest, and ``newton_solve`` certifies its tolerance from the cold start there as with that column at 1e-2 (with
    d unfloored the eigendecomposition of D^{-1/2} N^{-1/2} D^{-1/2} fails on its infinite entries: checked by
    mutation; a first version fell back to ``_hvp`` with Jacobi there and stayed at a gap near 0.2)."""
    from manifold_muon.optim.inner_solvers import newton_solve

    g = torch.Generator().manual_seed(11 + sum(shape))
    M = get_manifold("dgram")
    W = M.random_point(shape, generator=g, dtype=torch.float64)
    G = spectrum_momentum(shape, g).double()
    for scale in (0.0, 1e-2):  # a zero column (d floored), and one at 1e-2 (d down to 1e-4 of its largest)
        Ws = W.clone()
        if shape[0] >= shape[1]:
            Ws[:, 0] *= scale
        else:
            Ws[0, :] *= scale
        assert float(newton_solve(Ws, G, M.gram_projector, tol=1e-8, steps=40).gap) <= 1e-8


@pytest.mark.parametrize("make", [lambda ps: Muon(ps), lambda ps: ManifoldMuon(ps, manifold="dgram", inner="lean"),
                                  lambda ps: ManifoldMuon(ps, inner="lean"),  # Stiefel: (8, 8) in closed form
                                  lambda ps: __import__("manifold_muon").MACRO(ps, lr=0.01, manifold="spectral_sphere"),
                                  lambda ps: __import__("manifold_muon").MuonH(ps, lr=0.01, manifold="frobenius_sphere"),
                                  lambda ps: ManifoldMuon(ps, manifold="gram_oblique", inner="dual_ascent")])
def test_one_host_read_per_step_for_every_fixed_work_optimizer(make):
    """Muon, the lean Manifold Muon, MACRO and MuonH make one host read of their own per step whatever the number
    of weights (the reads inside torch's checked linear algebra are counted apart, ``explicit_reads``; SSO and FSO
    stop their bisection early, which reads the host once per bisection step)."""
    Ws = [torch.nn.Parameter(torch.randn(s)) for s in [(12, 5), (5, 12), (8, 8), (12, 5), (9, 4)]]
    opt = make(Ws)
    if hasattr(opt, "retract_parameters"):
        opt.retract_parameters()
    assert host_reads_of_a_step(opt, Ws) == 1


@pytest.mark.parametrize("inner,manifold", [("gram_admm", "stiefel"), ("exact", "stiefel"), ("exact", "dgram"),
                                            ("post", "stiefel"), ("admm", "dgram")])
def test_the_iterating_paths_read_the_host_per_shape_not_per_weight(inner, manifold):
    """gram_admm and exact read the host to stop their iterations, and the polar retraction of the m x n
    paths (post, admm on Stiefel and DGram) to stop its polish: once per check for a whole batch of same-shape
    weights, so five copies of one weight cost the reads of one."""
    def reads(k):
        torch.manual_seed(0)
        W0, grads = get_manifold(manifold).random_point((12, 5)), [torch.randn(12, 5) for _ in range(2)]
        Ws = [torch.nn.Parameter(W0.clone()) for _ in range(k)]
        opt = ManifoldMuon(Ws, manifold=manifold, inner=inner)
        for G in grads:
            for w in Ws:
                w.grad = G.clone()
            with OpCounter(12) as ops:
                opt.step()
        return ops.counts["sync"]
    assert reads(5) == reads(1)


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
@pytest.mark.parametrize("rank", [2, 5])
def test_lean_direction_is_feasible_on_low_rank_gradients(name, rank):
    """A low-rank gradient leaves C rank-deficient: the picture's C^T C must describe the float32 C that is
    multiplied at the end, or msign's 1/s amplifies float32 rounding into ||A||_op > 1 (seen with a float32
    C^T C: 1 + 6e-4)."""
    M = get_manifold(name)
    worst = 0.0
    for shape in [(40, 16), (16, 40), (12, 5)]:
        for seed in range(10):
            g = torch.Generator().manual_seed(1000 * seed + shape[0])
            W = M.random_point(shape, generator=g)
            G = spectrum_momentum(shape, g, rank=rank)
            A = lean_solve(W, G, M.gram_projector, steps=1, diagonal=True).matrix().double()
            worst = max(worst, float(torch.linalg.matrix_norm(A, ord=2)) - 1)
    assert worst <= 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_lean_defaults_by_manifold_act(name):
    """The lean step's defaults: cold on Stiefel (no iteration, no warm start: its direction is the cold lean solve's
    on every step, whatever came before), tracked elsewhere (the multiplier carried: on DGram by one Newton step of
    one conjugate-gradient step, on Oblique by one ADMM iteration, then certified); a value the user gives acts
    instead."""
    M = get_manifold(name)
    g = torch.Generator().manual_seed(3)
    W = torch.nn.Parameter(M.random_point((24, 8), generator=g))
    opt = ManifoldMuon([W], lr=0.0, momentum=0.0, nesterov=False, manifold=name, inner="lean")
    group = opt.param_groups[0]
    cold = name == "stiefel"
    assert (group["inner_steps"], group["warm_start"]) == ((1, False) if cold else (1, True))
    assert group["certify_first"] is False  # (Oblique certified first from 2026-12-03 to 2026-12-04)
    assert group["tracker"] == "auto"
    from manifold_muon.optim.manifold_muon import resolve_tracker
    assert resolve_tracker(M, "auto", (24, 8)) == resolve_tracker(M, "auto", (8, 24)) == \
        {"dgram": "newton", "stiefel": "newton_cold"}.get(name, "admm")
    assert resolve_tracker(M, "auto", (8, 8)) == "admm"     # square DGram: its optimum is rank-deficient
    G1, G2 = (spectrum_momentum((24, 8), g) for _ in range(2))
    for G in (G1, G2):
        W.grad = G.clone()
        opt.step()
    assert ("Lambda" in opt.state[W]) == (not cold)
    assert ("newton_t" in opt.state[W]) == (name == "dgram")   # the Newton step's length, carried per weight
    alone = lean_solve(W.detach(), G2, M.gram_projector, warm=None, steps=1, diagonal=M.diagonal_gram,
                       tracker="newton_cold" if cold else "admm", eigenbasis=cold)
    assert torch.allclose(opt.state[W]["duality_gap"], alone.gap) == cold  # tracked: another multiplier
    pinned = ManifoldMuon([torch.nn.Parameter(W.detach().clone())], manifold=name, inner="lean", inner_steps=2)
    assert pinned.param_groups[0]["inner_steps"] == 2
    assert pinned.param_groups[0]["warm_start"] == (not cold)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_certify_first_shares_one_eigendecomposition_and_stays_honest(name, shape, dtype):
    """``lean_solve(certify_first=True)`` along a stream, the multiplier carried (the last momentum rank-deficient):
    its certificate and its iteration are those of ``certificate`` at the carried multiplier and of ``admm_gram``
    from (it, U = 0), to the last bit; they share one eigendecomposition; the direction is feasible and its gap
    bounds its true relative sub-optimality (against a float64 certified optimum)."""
    from manifold_muon.optim.inner_solvers import _tall_unit, admm_gram, certificate, gram_picture, Span

    g = torch.Generator().manual_seed(7 * NAMES.index(name) + SHAPES.index(shape))
    M, P = get_manifold(name), get_manifold(name).gram_projector
    W = M.random_point(shape, generator=g).to(dtype)
    stream = [spectrum_momentum(shape, g), spectrum_momentum(shape, g), spectrum_momentum(shape, g, rank=2)]
    diagonal, warm = name != "gram_oblique", None
    for G in stream:
        G = G.to(dtype)
        with OpCounter(max(shape)) as ops:
            sol = lean_solve(W, G, P, warm=warm, steps=1, diagonal=diagonal, certify_first=True)
        assert ops.counts["eigh"] == 1
        if warm is not None and dtype == torch.float32:  # the same certificate and iteration, in one eigh
            Wt, Gt, _ = _tall_unit(W, G, views=True)
            pic = gram_picture(Wt, Gt, P, torch.float64, products=torch.float32 if diagonal else torch.float64,
                               diagonal=diagonal)
            A_c, value_c, bound_c = certificate(pic, warm[0], None, 1e-6, fast=True)
            zero = Span(torch.zeros_like(pic.D), torch.zeros_like(pic.D))
            Lambda_i, U_i = admm_gram(pic, warm[0], zero, pic.W.size(-1) ** -0.5, 1, 1.8)
            assert torch.equal(sol.A.a, A_c.a) and torch.equal(sol.A.b, A_c.b)
            assert torch.equal(sol.Lambda, Lambda_i) and torch.equal(sol.U.a, U_i.a) and torch.equal(sol.U.b, U_i.b)
        warm = (sol.Lambda, sol.U)
    assert_honest(sol, M, W, G, dtype)


@pytest.mark.parametrize("name", NAMES)
def test_certify_first_with_more_iterations_is_admm_grams_own_run(name):
    """With ``steps=3``, ``certify_first``'s iterations are one ``admm_gram`` call of three from (Lambda, U = 0),
    to the last bit (its second and third over-relaxed, as in any call), for two eigendecompositions fewer
    than the certificate and the call apart would take."""
    from manifold_muon.optim.inner_solvers import _tall_unit, admm_gram, gram_picture, Span

    g = torch.Generator().manual_seed(11 + NAMES.index(name))
    shape, (M, P) = (24, 10), (get_manifold(name), get_manifold(name).gram_projector)
    W, diagonal = M.random_point(shape, generator=g), name != "gram_oblique"
    first = lean_solve(W, spectrum_momentum(shape, g), P, steps=1, diagonal=diagonal)
    G = spectrum_momentum(shape, g)
    with OpCounter(max(shape)) as ops:
        sol = lean_solve(W, G, P, warm=(first.Lambda, first.U), steps=3, diagonal=diagonal, certify_first=True)
    assert ops.counts["eigh"] == 3
    Wt, Gt, _ = _tall_unit(W, G, views=True)
    pic = gram_picture(Wt, Gt, P, torch.float64, products=torch.float32 if diagonal else torch.float64,
                       diagonal=diagonal)
    zero = Span(torch.zeros_like(pic.D), torch.zeros_like(pic.D))
    Lambda, U = admm_gram(pic, first.Lambda, zero, pic.W.size(-1) ** -0.5, 3, 1.8)
    assert torch.equal(sol.Lambda, Lambda) and torch.equal(sol.U.a, U.a) and torch.equal(sol.U.b, U.b)


@pytest.mark.parametrize("name, eigenbasis", [(n, False) for n in NAMES] + [("stiefel", True)])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tracker", ["newton", "newton_dk"])
def test_newton_tracker_stays_honest_and_damps_by_its_rule(name, eigenbasis, shape, dtype, tracker):
    """``lean_solve(tracker="newton")`` along a stream (the last momentum rank-deficient): two eigendecompositions a
    step (``tracker="newton_dk"``: one; the first step ``NEWTON_START`` more, its start's ADMM iterations) and no
    host read; the damping follows
    its rule (the multiplier moves and t doubles, to at most 1, where
    the certified bound fell below f at the carried multiplier; elsewhere it stays and t halves); the direction
    is feasible and its gap bounds its true relative sub-optimality (against a float64 certified optimum). On
    Stiefel with the Jacobi preconditioner and with CG in N's eigenbasis (``eigenbasis``, what the optimizer
    takes there)."""
    from manifold_muon.optim.inner_solvers import _dual_value, _tall_unit, gram_picture

    g = torch.Generator().manual_seed(5 * NAMES.index(name) + SHAPES.index(shape))
    M, P = get_manifold(name), get_manifold(name).gram_projector
    W = M.random_point(shape, generator=g).to(dtype)
    stream = [spectrum_momentum(shape, g) for _ in range(3)] + [spectrum_momentum(shape, g, rank=2)]
    diagonal, warm, t = name != "gram_oblique", None, None
    for G in stream:
        G = G.to(dtype)
        with OpCounter(max(shape)) as ops:
            sol = lean_solve(W, G, P, warm=warm, steps=3, diagonal=diagonal, tracker=tracker, damping=t,
                             eigenbasis=eigenbasis)
        per_step = 2 if tracker == "newton" else 1
        assert ops.counts["eigh"] == per_step + (NEWTON_START if warm is None else 0) and explicit_reads(ops) == 0
        assert ops.counts["eigvalsh"] == 1  # the candidate's op-norm (float32), for both trackers
        if warm is not None:
            Wt, Gt, _ = _tall_unit(W.float(), G.float(), views=True)
            pic = gram_picture(Wt, Gt, P, torch.float64, products=torch.float32 if diagonal else torch.float64,
                               diagonal=diagonal)
            f = lambda L: float(_dual_value(pic, L))  # noqa: E731 - the dual ||G + 2 W L||_*
            moved = not torch.equal(sol.Lambda, warm[0])
            assert float(sol.damping) == (min(2 * float(t), 1.0) if moved else 0.5 * float(t))
            if moved:  # carried only where the dual fell (to float64 rounding)
                assert f(sol.Lambda) < f(warm[0]) * (1 + 1e-9)
        else:
            assert float(sol.damping) in (0.5, 1.0)
        warm, t = (sol.Lambda, sol.U), sol.damping
        assert torch.equal(sol.U.a, torch.zeros_like(sol.U.a))
    assert_honest(sol, M, W, G, dtype)


@pytest.mark.parametrize("name, shape", [("stiefel", (24, 8)), ("dgram", (24, 8)), ("dgram", (9, 40)),
                                         ("gram_oblique", (8, 24))])
def test_newton_tracker_starts_where_the_admm_iterations_end(name, shape):
    """The Newton tracker's first step (no carried multiplier) is its step from the multiplier that ``NEWTON_START``
    ADMM iterations reach from the tangent projection's (the ADMM tracker's cold solve of as many iterations), bit
    for bit, and that multiplier's dual value is below the tangent projection's."""
    from manifold_muon.optim.inner_solvers import _dual_value, _tall_unit, gram_picture, multiplier

    g = torch.Generator().manual_seed(11)
    M = get_manifold(name)
    P, diagonal = M.gram_projector, M.diagonal_gram
    W, G = M.random_point(shape, generator=g), spectrum_momentum(shape, g)
    cold = lean_solve(W, G, P, steps=2, diagonal=diagonal, tracker="newton")
    admm = lean_solve(W, G, P, steps=NEWTON_START, diagonal=diagonal)
    warm = lean_solve(W, G, P, warm=(admm.Lambda, admm.U), steps=2, diagonal=diagonal, tracker="newton",
                      damping=torch.ones(()))
    assert torch.equal(cold.Lambda, warm.Lambda) and torch.equal(cold.gap, warm.gap)
    assert torch.equal(cold.A.a, warm.A.a) and torch.equal(cold.A.b, warm.A.b)
    Wt, Gt, _ = _tall_unit(W, G, views=True)
    pic = gram_picture(Wt, Gt, P, torch.float64, products=torch.float32 if diagonal else torch.float64,
                       diagonal=diagonal)
    f = lambda L: float(_dual_value(pic, L))  # noqa: E731 - the dual ||G + 2 W L||_*
    S = pic.DK0
    assert f(admm.Lambda) < f(-0.5 * multiplier(pic, S + S.mT))


@pytest.mark.parametrize("name, shape", [("stiefel", (24, 8)), ("dgram", (24, 8)), ("dgram", (9, 40)),
                                         ("gram_oblique", (8, 24))])
@pytest.mark.parametrize("tracker", ["newton", "newton_dk"])
def test_newton_tracker_converges_on_a_fixed_gradient(name, shape, tracker):
    """On one momentum repeated, the Newton tracker's certified gap falls from the tangent projection's multiplier
    (~0.1-0.3; carried in as if a step had left it, so without the start's ADMM iterations, ``NEWTON_START``) below
    1e-4 within 15 steps and its damping ends at a full step or near it: what makes it a tracker (it converges
    where the target stands still). A float32 eigendecomposition stalls at ~3e-4 here (the docstring's
    measurement). The same for ``tracker="newton_dk"``, whose bound and direction at the new multiplier come from
    the eigendecomposition at the carried one: it still converges (the step shrinks, so the basis becomes exact)."""
    g = torch.Generator().manual_seed(5)
    M = get_manifold(name)
    W, G = M.random_point(shape, generator=g), spectrum_momentum(shape, g)
    far = lean_solve(W, G, M.gram_projector, steps=0, diagonal=M.diagonal_gram)  # the tangent projection's multiplier
    warm, t = (far.Lambda, far.U), torch.ones(())
    gaps = []
    for _ in range(15):
        sol = lean_solve(W, G, M.gram_projector, warm=warm, steps=3, diagonal=M.diagonal_gram, tracker=tracker,
                         damping=t)
        warm, t = (sol.Lambda, sol.U), sol.damping
        gaps.append(float(sol.gap))
    assert gaps[0] > 1e-2 and min(gaps[-3:]) < 1e-4


@pytest.mark.parametrize("shape", [(96, 32), (32, 96), (45, 15)])
def test_stiefel_newton_tracker_converges_with_one_cg_step_in_the_eigenbasis(shape):
    """On Stiefel one CG step in N's eigenbasis (``eigenbasis=True``, the optimizer's choice there) makes the tracker
    converge on a fixed gradient: from the tangent projection's multiplier its certified gap falls below 1e-4 within
    20 steps, where one Jacobi-preconditioned CG step stays above 1e-3 (measured ~0.1 at these widths: the Jacobi
    preconditioner of the Hessian's first term is poor where that term is far from diagonal in the weights' basis)."""
    g = torch.Generator().manual_seed(5)
    M = get_manifold("stiefel")
    W, G = M.random_point(shape, generator=g), spectrum_momentum(shape, g)
    last = {}
    far = lean_solve(W, G, M.gram_projector, steps=0, diagonal=True)  # the tangent projection's multiplier
    for eigenbasis in (False, True):
        warm, t = (far.Lambda, far.U), torch.ones(())
        gaps = []
        for _ in range(20):
            sol = lean_solve(W, G, M.gram_projector, warm=warm, steps=1, diagonal=True, tracker="newton",
                             damping=t, eigenbasis=eigenbasis)
            warm, t = (sol.Lambda, sol.U), sol.damping
            gaps.append(float(sol.gap))
        last[eigenbasis] = min(gaps[-3:])
    assert last[True] < 1e-4 < 1e-3 < last[False]


@pytest.mark.parametrize("shape", [(40, 12), (12, 40), (33, 33)])
@pytest.mark.parametrize("cg_steps", [1, 3])
def test_eigen_cg_is_the_preconditioned_newton_direction(shape, cg_steps):
    """``_eigen_cg`` (CG in N's eigenbasis, two products a step) gives the direction that preconditioned CG in the
    weights' basis gives with ``_hvp``'s Hessian-vector product and the preconditioner x -> V ((V^T x V) / J) V^T,
    J_ij = 2 (1/s_i + 1/s_j) (the exact inverse of the Hessian's first term on Stiefel): the same Krylov iterates,
    to float64 rounding. Tall, wide (transposed to tall) and square (C = 0) weights."""
    from manifold_muon.optim.inner_solvers import (_eigen_cg, _hvp, _sym, _tall_unit, eig_sqrt, gram_picture,
                                                   inv_sqrt, multiplier)

    g = torch.Generator().manual_seed(sum(shape) + cg_steps)
    M = get_manifold("stiefel")
    W, G = M.random_point(shape, generator=g).double(), spectrum_momentum(shape, g).double()
    Wt, Gt, _ = _tall_unit(W, G, True, views=True)
    pic = gram_picture(Wt, Gt, M.gram_projector, torch.float64, diagonal=True)
    noise = _sym(torch.randn(pic.D.shape, generator=g, dtype=torch.float64))  # a multiplier off the cold start
    a = pic.K0 - multiplier(pic, pic.DK0 + pic.DK0.mT) + 0.05 * noise
    V, s = eig_sqrt(_sym(a.mT @ pic.dmul(a) + pic.R))
    x = _eigen_cg(pic, a, V, s, 1e-7, cg_steps, torch.float64)
    hvp, DaV, _ = _hvp(pic, a, V, s, torch.float64)
    r = -2 * _sym((DaV * inv_sqrt(s, 1e-7).unsqueeze(-2)) @ V.mT)
    iv = 1 / s
    J = 2 * (iv.unsqueeze(-1) + iv.unsqueeze(-2))
    pre = lambda r: V @ ((V.mT @ r @ V) / J) @ V.mT  # noqa: E731
    y, z = torch.zeros_like(r), pre(r)
    p, rz = z, (r * z).sum()
    for _ in range(cg_steps):
        Ap = hvp(p)
        alpha = rz / (p * Ap).sum()
        y, r = y + alpha * p, r - alpha * Ap
        z = pre(r)
        p, rz = z + (r * z).sum() / rz * p, (r * z).sum()
    assert float((x - y).norm() / y.norm()) < 1e-6


@pytest.mark.parametrize("name, shape", [("dgram", (24, 8)), ("dgram", (8, 24)), ("stiefel", (20, 9)),
                                         ("stiefel", (9, 20)), ("gram_oblique", (30, 7))])
def test_first_order_certificate_bounds_and_is_first_order(name, shape):
    """``first_order_certificate`` (``tracker="newton_dk"``) at a multiplier Lambda1 = Lambda + h X from the
    eigendecomposition at Lambda: its bound is at least ||Z1||_* (float64 singular values) however far Lambda1 is,
    and equal to it where the basis is Lambda1's own; its factor Y (the candidate is Z1 Y) approximates N1^{-1/2} to
    second order in h (halving h divides the error by more than 3), where the Ritz factor (no first-order term) is
    first order (by less than 2.5): what the Daleckii-Krein term buys. Rectangular weights, where the tracker runs
    (square Stiefel takes the closed form; on square DGram, the ADMM tracker by default, N is near singular at the
    optimum and a step of 0.02 is not small)."""
    from manifold_muon.optim.inner_solvers import (_sym, _tall_unit, eig_sqrt, first_order_certificate, gram_picture,
                                                   multiplier)
    import manifold_muon.optim.inner_solvers as inner_solvers

    g = torch.Generator().manual_seed(sum(shape))
    M = get_manifold(name)
    W, G = M.random_point(shape, generator=g, dtype=torch.float64), spectrum_momentum(shape, g).double()
    Wt, Gt, _ = _tall_unit(W, G, True, views=True)
    pic = gram_picture(Wt, Gt, M.gram_projector, torch.float64, diagonal=M.diagonal_gram)
    noise = lambda: M.gram_projector(_sym(torch.randn(pic.D.shape, generator=g, dtype=torch.float64)))  # noqa: E731
    Lambda = -0.5 * multiplier(pic, pic.DK0 + pic.DK0.mT) + 0.05 * noise()  # off the cold start (N nonsingular)
    X = noise()
    N = lambda L: _sym((pic.K0 + 2 * L).mT @ pic.dmul(pic.K0 + 2 * L) + pic.R)  # noqa: E731
    V, _ = eig_sqrt(N(Lambda))
    factors = {}
    original = inner_solvers.feasible

    def spy(pic_, X_, *args, **kwargs):  # the factor Y of the candidate Span(a1 Y, Y) the certificate makes feasible
        factors["Y"] = X_.b
        return original(pic_, X_, *args, **kwargs)

    try:
        inner_solvers.feasible = spy
        errors = {True: [], False: []}
        for h in (0.4, 0.04, 0.02):
            L1 = Lambda + h * X
            lam1, V1 = torch.linalg.eigh(N(L1))
            exact = (V1 / lam1.sqrt().unsqueeze(-2)) @ V1.mT
            nuclear = float(torch.linalg.svdvals(_z_matrix(pic, L1)).sum())
            for first_order in (True, False):
                _, value, bound, _ = first_order_certificate(pic, L1, V, 1e-12, first_order)
                assert float(bound) >= nuclear * (1 - 1e-12) and float(value) <= float(bound)
                errors[first_order].append(float((factors["Y"] - exact).norm() / exact.norm()))
            _, _, own, _ = first_order_certificate(pic, L1, V1, 1e-12)
            assert abs(float(own) - nuclear) <= 1e-10 * nuclear
    finally:
        inner_solvers.feasible = original
    fo, ritz = errors[True], errors[False]
    assert fo[1] / fo[2] > 3 and ritz[1] / ritz[2] < 2.5 and fo[2] < ritz[2]


@pytest.mark.parametrize("shape", [(64, 16), (16, 64)])
def test_newton_dk_keeps_certifying_on_low_rank_momenta(shape):
    """On a stream of rank-4 momenta (Z = G + 2 W Lambda then has a few large singular values and many small ones, and
    a Newton step fills directions that N had near null) ``tracker="newton_dk"`` keeps a useful certified direction:
    its median gap over the stream is within 0.15 of the two-eigendecomposition tracker's and below 0.5. Its first
    version, which expanded N1^{-1/2} about N's eigenvalues instead of diag(V^T N1 V) (``step_budget.first_version``),
    certifies next to nothing there: median gap above 0.6 (measured 0.81-0.94)."""
    from manifold_muon_book.bench.low_rank import low_rank_gaps

    med = low_rank_gaps(shape)
    assert med["newton_dk"] < min(0.5, med["newton"] + 0.15) and med["first_version"] > 0.6, med


def _z_matrix(pic, Lambda):
    """Z = G + 2 W Lambda of a Gram picture, as the m x n matrix (float64)."""
    return pic.W.double() @ (pic.K0 + 2 * Lambda) + pic.C.double()


def test_lean_solve_refuses_what_the_newton_tracker_cannot_do():
    g = torch.Generator().manual_seed(0)
    M = get_manifold("dgram")
    W, G = M.random_point((12, 5), generator=g), spectrum_momentum((12, 5), g)
    for kw in (dict(tracker="bfgs"), dict(tracker="newton", steps=0), dict(tracker="newton", certify_first=True),
               dict(tracker="newton_dk", steps=0), dict(tracker="newton_dk", certify_first=True)):
        with pytest.raises(ValueError, match="tracker"):
            lean_solve(W, G, M.gram_projector, **{"steps": 1, **kw})


def _exact_oblique_candidate(W, G, lam):
    """The certificate's candidate at a diagonal multiplier, by an SVD in float64 (W, G tall): the tangent part of
    msign(G + 2 W diag(lam)), scaled into the unit op-norm ball."""
    Z = G + 2 * W * lam.unsqueeze(-2)
    U, _, Vh = torch.linalg.svd(Z, full_matrices=False)
    X = U @ Vh
    X = X - W * ((W * X).sum(-2) / (W * W).sum(-2)).unsqueeze(-2)
    return X / torch.linalg.matrix_norm(X, ord=2).clamp_min(1)[..., None, None]


OBLIQUE_SHAPES = [(6, 6), (7, 7), (16, 16), (17, 17), (40, 16), (16, 40), (12, 5)]


@pytest.mark.parametrize("shape", OBLIQUE_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [None, 2])
@pytest.mark.parametrize("certify_first", [False, True])
def test_oblique_matrix_solve_is_feasible_honest_and_exact(shape, dtype, rank, certify_first):
    """The Oblique lean solve in the matrix (tall, wide, odd and even square) along a stream, the multiplier and U
    carried (the last momentum rank-deficient where ``rank``): its direction is feasible (op-norm <= 1 and
    diag(W^T A) = 0 in float64), its gap bounds its true relative sub-optimality against a float64 certified
    optimum, and its direction is the SVD's candidate at the multiplier it certifies (the one it returns; with
    ``certify_first`` the carried one), where Z has full rank."""
    from manifold_muon.optim.manifold_muon import oblique_solve

    g = torch.Generator().manual_seed(shape[0] * 100 + shape[1] + (7 if rank else 0))
    M = get_manifold("gram_oblique")
    W = M.random_point(shape, generator=g).to(dtype)
    wide = shape[0] < shape[1]
    Wd = (W.mT if wide else W).double()
    warm = None
    for i in range(3):
        G = spectrum_momentum(shape, g, rank=rank if i == 2 else None).to(dtype)
        A, gap, Lambda, U, was_wide = oblique_solve(W, G, warm=warm, certify_first=certify_first)
        assert was_wide == wide and A.shape == Wd.shape
        Gd = (G.mT if wide else G).double()
        Gd = Gd / Gd.pow(2).mean().sqrt()
        if warm is not None and rank is None:
            at = warm[0] if certify_first else Lambda
            expected = _exact_oblique_candidate(Wd, Gd, torch.diagonal(at, dim1=-2, dim2=-1))
            assert float((A - expected).norm() / expected.norm()) < 1e-5
        warm = (Lambda, None if certify_first else U)
    assert float(torch.linalg.matrix_norm(A, ord=2)) <= 1 + 1e-12
    assert float((Wd * A).sum(-2).abs().max()) <= 1e-12
    ref = gram_solve(Wd, Gd, M.gram_projector, steps=3000, tol=1e-9)
    opt_value = float((Gd * ref.matrix()).sum())
    assert (opt_value - float((Gd * A).sum())) / opt_value <= float(gap) + 1e-9


@pytest.mark.parametrize("certify_first", [True, False])
@pytest.mark.parametrize("steps", [0, 1, 3])
@pytest.mark.parametrize("shape", [(9, 9), (20, 6)])
@pytest.mark.parametrize("rho", [None, 0.3])
def test_oblique_matrix_iterations_are_the_pictures_admm(certify_first, steps, shape, rho):
    """In float64 on a small, well-conditioned W the Gram picture is exact too: from the same multiplier (and U = 0)
    the matrix solve's multipliers after ``steps`` ADMM iterations are ``lean_solve``'s (same order, same
    over-relaxation, the same ``rho``: None is each one's own default, Oblique's OBLIQUE_RHO and the picture's
    1/sqrt(n), so it is passed) to 1e-9 relative, its U is the picture's W U_a + C U_b, and its direction and
    certified gap are the picture's. (Carried to the next step, the two U differ on a rectangular W by design: the
    picture keeps U's coefficients, and its C-part follows the next momentum's C.)"""
    from manifold_muon.optim.inner_solvers import Span
    from manifold_muon.optim.manifold_muon import oblique_solve

    from manifold_muon.optim.manifold_muon import OBLIQUE_RHO

    if certify_first and not steps:
        pytest.skip("certify_first carries nothing without an iteration (refused by the optimizer)")
    rho = OBLIQUE_RHO if rho is None else rho
    g = torch.Generator().manual_seed(11)
    M = get_manifold("gram_oblique")
    W = M.random_point(shape, generator=g).double()
    warm_d = warm_p = None
    for _ in range(3):
        G = spectrum_momentum(shape, g).double()
        A, gap, Lambda, U, _ = oblique_solve(W, G, warm=warm_d, steps=steps, certify_first=certify_first, rho=rho)
        sol = lean_solve(W, G, M.gram_projector, warm=warm_p, steps=steps, diagonal=False, certify_first=certify_first,
                         rho=rho)
        assert float((Lambda - sol.Lambda).abs().max()) <= 1e-9 * float(sol.Lambda.abs().max())
        assert float((A - sol.matrix()).abs().max()) <= 1e-9
        if steps and not certify_first:
            assert float((U - sol.U.matrix(sol.picture)).abs().max()) <= 1e-9 * (1 + float(U.abs().max()))
        assert abs(float(gap) - float(sol.gap)) <= 1e-9
        warm_d, warm_p = (Lambda, None), (sol.Lambda, Span(torch.zeros_like(sol.Lambda), torch.zeros_like(sol.Lambda)))


@pytest.mark.parametrize("shape", [(9, 9), (40, 16), (16, 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_oblique_iterations_run_in_float32_on_float32_weights(shape, dtype):
    """On float32 and bfloat16 weights the Oblique solve's ADMM iterations run in float32 (the U they carry is
    float32), on float64 weights in float64; from the same entries the two differ by float32's rounding only:
    the multiplier and the direction agree to 1e-4 relative and the certified gaps to 1e-4, along a carried stream."""
    from manifold_muon.optim.manifold_muon import oblique_solve

    g = torch.Generator().manual_seed(31)
    W = get_manifold("gram_oblique").random_point(shape, generator=g).to(dtype)
    warm32 = warm64 = None
    for _ in range(4):
        G = spectrum_momentum(shape, g).to(dtype)
        A32, gap32, L32, U32, _ = oblique_solve(W, G, warm=warm32, steps=2)
        A64, gap64, L64, U64, _ = oblique_solve(W.double(), G.double(), warm=warm64, steps=2)
        assert U32.dtype == torch.float32 and U64.dtype == torch.float64 and A32.dtype == torch.float64
        assert float((L32 - L64).abs().max()) <= 1e-4 * float(L64.abs().max())
        assert float((A32 - A64).norm() / A64.norm()) <= 1e-4
        assert abs(float(gap32) - float(gap64)) <= 1e-4
        warm32, warm64 = (L32, U32), (L64, U64)


@pytest.mark.parametrize("certify_first", [True, False])
@pytest.mark.parametrize("shape", [(12, 12), (30, 10), (10, 30)])
def test_the_optimizer_takes_oblique_weights_in_the_matrix(certify_first, shape):
    """ManifoldMuon(inner='lean') on Oblique weights takes ``oblique_step``: no Cholesky (the picture's K0), one
    eigendecomposition a step with ``certify_first`` (two without), one host read a step; it carries U (the tall
    m x n matrix) only where the next step reads it, and that U is the solve's own; the weights stay on the manifold
    over a long run at a large lr; a switch to the picture's solver mid-run resumes from the multiplier (and U)."""
    from manifold_muon.optim.manifold_muon import oblique_solve

    g = torch.Generator().manual_seed(5)
    M = get_manifold("gram_oblique")
    Ws = [torch.nn.Parameter(M.random_point(shape, generator=g)) for _ in range(2)]
    opt = ManifoldMuon(Ws, lr=0.1, momentum=0.0, nesterov=False, manifold="gram_oblique", inner="lean",
                       certify_first=certify_first)
    for step in range(40):
        for w in Ws:
            w.grad = spectrum_momentum(shape, g)
        before = Ws[0].detach().clone()
        state = {k: v for k, v in opt.state[Ws[0]].items()} if step else None
        with OpCounter(max(shape)) as ops:
            opt.step()
        assert ops.counts.get("cholesky", 0) == 0 and explicit_reads(ops) == 1
        assert ops.counts["eigh"] == len(Ws) * (1 if certify_first else 2)  # (counted per matrix of the batch)
        assert (opt.state[Ws[0]].get("U") is None) == certify_first
        if step == 1:
            warm = (state["Lambda"][None], None if state.get("U") is None else state["U"][None])
            _, _, Lambda, U, _ = oblique_solve(before[None], Ws[0].grad[None], warm=warm, certify_first=certify_first)
            assert torch.equal(opt.state[Ws[0]]["Lambda"], Lambda[0])
            if not certify_first:
                assert torch.equal(opt.state[Ws[0]]["U"], U[0])
    for w in Ws:
        assert float(M.residual(w.detach())) < 1e-5
        assert float(opt.state[w]["tangent_violation"]) < 1e-10
    for group in opt.param_groups:  # the picture's solver resumes from the carried multiplier (and U, where carried)
        group.update(inner="gram_admm", tol=1e-3, inner_steps=16, certify_first=None, tracker=None)
    Lambda = opt.state[Ws[0]]["Lambda"].clone()
    opt.step()
    square = shape[0] == shape[1]  # the picture keeps U as its coefficient U_a on a square weight, else as the matrix
    assert ("U_a" in opt.state[Ws[0]]) == square and ("U" in opt.state[Ws[0]]) == (not square)
    assert not torch.equal(opt.state[Ws[0]]["Lambda"], Lambda)


@pytest.mark.parametrize("name, eigenbasis", [("stiefel", True), ("stiefel", False), ("dgram", False),
                                              ("gram_oblique", False)])
@pytest.mark.parametrize("shape", [(24, 8), (8, 24), (25, 9), (9, 40)])  # tall, wide, odd n, even n
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cold_newton_step_is_stateless_and_honest(name, eigenbasis, shape, dtype):
    """``lean_solve(tracker="newton_cold")``: one eigendecomposition and one eigvalsh a step, no host read of its own,
    the same direction whatever came before (it carries nothing: ``warm`` is refused), and on every momentum of a
    stream (the last rank-deficient) a feasible direction whose gap bounds its true relative sub-optimality."""
    g = torch.Generator().manual_seed(7 * shape[0] + shape[1])
    M, P = get_manifold(name), get_manifold(name).gram_projector
    W = M.random_point(shape, generator=g).to(dtype)
    diagonal = name != "gram_oblique"
    stream = [spectrum_momentum(shape, g) for _ in range(2)] + [spectrum_momentum(shape, g, rank=2)]
    for G in stream:
        G = G.to(dtype)
        with OpCounter(max(shape)) as ops:
            sol = lean_solve(W, G, P, steps=1, diagonal=diagonal, tracker="newton_cold", eigenbasis=eigenbasis)
        assert ops.counts["eigh"] == 1 and ops.counts["eigvalsh"] == 1 and explicit_reads(ops) == 0
        assert sol.damping is None and torch.equal(sol.U.a, torch.zeros_like(sol.U.a))
        assert_honest(sol, M, W, G, dtype)
    with pytest.raises(ValueError, match="carries nothing"):
        lean_solve(W, G, P, warm=(sol.Lambda, sol.U), steps=1, diagonal=diagonal, tracker="newton_cold")
    with pytest.raises(ValueError, match="steps >= 1"):
        lean_solve(W, G, P, steps=0, diagonal=diagonal, tracker="newton_cold")


@pytest.mark.parametrize("shape", [(96, 24), (24, 96), (75, 25), (40, 16)])  # tall, wide, odd n, even n
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cold_step_in_the_eigenbasis_is_the_weights_basis_step(shape, dtype):
    """``inner_solvers.cold_newton_eigenbasis`` (the Stiefel default's path) is the cold Newton step of
    ``newton_track(one_eigh=True)`` from zero, kept in N's eigenbasis: on training-like and rank-2 momenta the same
    certified bound (the same multiplier; float32 rounding apart, 1e-6), the same value to 1e-4 and the same direction
    to 1e-3 (measured: about 1e-6 on full-rank momenta; up to 1.3e-4 on rank-2 ones from a bfloat16 weight, where
    the float32 candidate's rounding moves a direction across the numerically-null threshold), with one n x n product
    fewer and four float64 products fewer."""
    from manifold_muon.optim.inner_solvers import (NEWTON_COLD_LENGTH, _tall_unit, cold_newton_eigenbasis, gram_picture,
                                                   newton_track)

    g = torch.Generator().manual_seed(shape[0] + 3 * shape[1])
    M = get_manifold("stiefel")
    W = M.random_point(shape, generator=g).to(dtype)
    for G in (spectrum_momentum(shape, g), spectrum_momentum(shape, g, rank=2)):
        Wt, Gt, wide = _tall_unit(W.float(), G.to(dtype).float(), True, views=True)
        pic = gram_picture(Wt, Gt, M.gram_projector, torch.float64, products=Wt.dtype, diagonal=True)
        t = torch.full_like(pic.D[..., 0, 0], NEWTON_COLD_LENGTH)
        with OpCounter(max(shape)) as ops_w:
            A_w, value_w, bound_w, _, Lambda_w, _ = newton_track(pic, torch.zeros_like(pic.D), t, 1, 1e-6,
                                                                 eigenbasis=True, one_eigh=True)
        with OpCounter(max(shape)) as ops_e:
            A_e, value_e, bound_e, _, Lambda_e = cold_newton_eigenbasis(pic, t, 1, 1e-6)
        assert float((bound_e - bound_w).abs() / bound_w) <= 1e-6
        assert float((Lambda_e - Lambda_w).norm() / Lambda_w.norm()) <= 1e-5
        Aw, Ae = A_w.matrix(pic).double(), A_e.matrix(pic).double()
        assert float((Ae - Aw).norm() / Aw.norm()) <= 1e-3
        assert float((value_e - value_w).abs() / value_w) <= 1e-4
        assert ops_e.counts["matmul_small"] == ops_w.counts["matmul_small"] - 1
        assert ops_e.counts["matmul_f64"] == ops_w.counts["matmul_f64"] - 4
        assert ops_e.counts["eigh"] == ops_w.counts["eigh"] == 1


@pytest.mark.parametrize("shape, most", [((96, 24), 0.3), ((24, 96), 0.3), ((75, 25), 0.45)])
def test_cold_newton_step_lands_closer_than_the_tangent_projection(shape, most):
    """On long Stiefel weights (3 and 4 times as long as wide) and training-like momenta, the cold Newton step's
    direction is closer to the certified optimum than the tangent projection's cold step's, by the factor the
    library's comment reports (measured here at these sizes, six draws: 0.17-0.25 of the distance at aspect 4,
    0.28-0.37 at aspect 3); ``most`` bounds the worst of the draws."""
    M = get_manifold("stiefel")
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        W, G = M.random_point(shape, generator=g), spectrum_momentum(shape, g)
        Gd = G.double() / G.double().pow(2).mean().sqrt()
        ref = gram_solve(W.double(), Gd, M.gram_projector, steps=3000, tol=1e-10).matrix()
        dist = {}
        for tracker, steps in (("admm", 0), ("newton_cold", 1)):
            A = lean_solve(W, G, M.gram_projector, steps=steps, tracker=tracker, diagonal=True,
                           eigenbasis=True).matrix().double()
            dist[tracker] = float((A - ref).norm() / ref.norm())
        assert dist["newton_cold"] <= most * dist["admm"], (seed, dist)


def test_lean_default_on_stiefel_by_aspect_and_its_refusals():
    """``tracker="auto"`` on Stiefel: the cold Newton step on weights at least ``NEWTON_COLD_ASPECT`` times as long as
    wide, the tangent projection's cold step (no iteration) on the others, each the lean solve's direction on that
    weight alone, bit for bit, in one optimizer; nothing is carried. Settings the cold Newton step would not read are
    refused before any work, and tracker="admm" with inner_steps=0 still takes the tangent projection's step."""
    from manifold_muon.optim.inner_solvers import NEWTON_COLD_ASPECT
    from manifold_muon.optim.manifold_muon import lean_steps, resolve_tracker

    M = get_manifold("stiefel")
    assert resolve_tracker(M, "auto", (40, 16)) == "newton_cold" and NEWTON_COLD_ASPECT * 16 <= 40
    assert resolve_tracker(M, "auto", (16, 39)) == "admm" and lean_steps(M, "auto", (16, 39), 1) == 0
    assert lean_steps(M, "auto", (40, 16), 1) == 1 and lean_steps(M, "admm", (16, 39), 1) == 1
    g = torch.Generator().manual_seed(2)
    Ws = [torch.nn.Parameter(M.random_point(s, generator=g)) for s in ((40, 16), (16, 39))]
    opt = ManifoldMuon(Ws, lr=0.0, momentum=0.0, nesterov=False, inner="lean")
    for _ in range(2):
        Gs = [spectrum_momentum(W.shape, g) for W in Ws]
        for W, G in zip(Ws, Gs):
            W.grad = G.clone()
        opt.step()
    for W, G, which in zip(Ws, Gs, ("newton_cold", "admm")):
        alone = {tracker: lean_solve(W.detach(), G, M.gram_projector, steps=steps, tracker=tracker, diagonal=True,
                                     eigenbasis=True).gap for tracker, steps in (("newton_cold", 1), ("admm", 0))}
        assert not torch.allclose(alone["newton_cold"], alone["admm"], rtol=1e-3)  # the check tells them apart
        assert torch.allclose(opt.state[W]["duality_gap"], alone[which], rtol=1e-4, atol=0)
        assert "Lambda" not in opt.state[W] and "newton_t" not in opt.state[W]
    W = [torch.nn.Parameter(M.random_point((40, 16), generator=g))]
    for bad in (dict(warm_start=True), dict(inner_steps=0), dict(rho=1.0), dict(certify_first=True),
                dict(tracker="newton_cold", warm_start=True)):
        with pytest.raises(ValueError, match="carries nothing from step to step"):
            ManifoldMuon(W, inner="lean", **bad)
    old = ManifoldMuon(W, inner="lean", tracker="admm", inner_steps=0)
    assert (old.param_groups[0]["inner_steps"], old.param_groups[0]["warm_start"]) == (0, False)


@pytest.mark.parametrize("shape", [(12, 5), (5, 12), (9, 9)])
def test_the_fused_helpers_are_their_plain_forms(shape):
    """The one-pass forms the lean step uses (2026-12-07) compute what their plain forms did: ``_add_product`` (a
    ``baddbmm`` on 3-D batches, a sum elsewhere), ``rms``, ``multiplier`` (0, not inf or NaN, on a pair of zero
    columns) and ``feasible``, whose one scaling must return a candidate in the unit op-norm ball whose value and
    Gram matrix are those of the X it returns, and the zero direction where the candidate points uphill."""
    from manifold_muon.optim.inner_solvers import (Span, _add_product, dot_G, feasible, gram, gram_picture,
                                                   multiplier, rms)
    g = torch.Generator().manual_seed(5)
    Y, A, B = (torch.randn(2, 3, *s, generator=g, dtype=torch.float64) for s in ((6, 4), (6, 5), (5, 4)))
    for y, a, b in ((Y, A, B), (Y[0], A[0], B[0]), (Y[:, 0].mT, B[:, 0].mT, A[:, 0].mT)):  # 4-D, 3-D, transposed
        for alpha in (-0.5, -1, 1):
            torch.testing.assert_close(_add_product(y, a, b, alpha), y + alpha * (a @ b), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(rms(Y), Y.pow(2).mean((-2, -1)).sqrt(), rtol=1e-14, atol=0)

    M = get_manifold("dgram")
    tall = (max(shape), min(shape))  # the picture's view of the weight
    Wt = M.retract(torch.randn(1, *tall, generator=g, dtype=torch.float64))
    Wt[..., :, :2] = 0  # a pair of zero columns (DGram allows them)
    pic = gram_picture(Wt, torch.randn(1, *tall, generator=g, dtype=torch.float64), M.gram_projector)
    S = torch.randn_like(pic.D)
    lam = multiplier(pic, S)
    d = torch.diagonal(pic.D, dim1=-2, dim2=-1)
    den = d.unsqueeze(-1) + d.unsqueeze(-2)
    ref = M.gram_projector(torch.where(den > 0, M.gram_projector(S) / torch.where(den > 0, den, 1), 0))
    assert bool(torch.isfinite(lam).all()) and float(lam[..., 0, 1].abs()) == 0.0
    torch.testing.assert_close(lam, ref, rtol=1e-14, atol=0)

    n = pic.D.size(-1)
    for sign in (1.0, -1.0):  # a candidate along G (value > 0) and against it (uphill: the zero direction)
        X = Span(sign * 3 * pic.K0, sign * 3 * torch.eye(n, dtype=torch.float64).expand_as(pic.D))
        Xf, value, AtA = feasible(pic, X, fast=True, with_gram=True)
        torch.testing.assert_close(value, dot_G(pic, Xf).clamp_min(0), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(AtA, gram(pic, Xf), rtol=1e-12, atol=1e-14)
        assert float(torch.linalg.eigvalsh(AtA)[..., -1]) <= 1 + 1e-9
        if sign < 0:
            assert float(value) == 0.0 and float(Xf.a.abs().max()) == 0.0 and float(Xf.b.abs().max()) == 0.0
        else:
            assert float(value) > 0
