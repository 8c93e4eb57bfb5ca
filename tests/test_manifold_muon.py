"""Inner solvers against a certified reference, and ManifoldMuon: constraint kept, bad input refused."""

import copy
import functools

import pytest
import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.optim import ManifoldMuon
from manifold_muon.optim.manifold_muon import SOLVER_SETTINGS
from manifold_muon.optim.inner_solvers import admm, dual_ascent, exact_solution, svt

NAMES = ["stiefel", "dgram", "gram_oblique"]


def msign_exact(X):
    U, _, Vh = torch.linalg.svd(X, full_matrices=False)
    return U @ Vh


def dual_value(W, G, Lambda):
    """||G + 2 W Lambda||_* on the tall orientation with unit-RMS G (the solvers' units)."""
    if W.size(-2) < W.size(-1):
        W, G = W.mT, G.mT
    G = G / G.pow(2).mean().sqrt()
    return torch.linalg.svdvals(G + 2 * W @ Lambda).sum().item()


def problem(name, shape, seed):
    g = torch.Generator().manual_seed(seed)
    M = get_manifold(name)
    return M, M.random_point(shape, generator=g, dtype=torch.float64), torch.randn(shape, generator=g, dtype=torch.float64)


# ---------------------------------------------------------------- inner solvers


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(8, 4), (4, 8), (6, 6)])
def test_reference_is_certified(name, shape):
    M, W, G = problem(name, shape, 0)
    A, Lambda, gap = exact_solution(W, G, M.gram_projector, steps=300)
    assert gap.item() < 1e-8 * dual_value(W, G, Lambda)  # zero duality gap: A is optimal
    assert M.tangent_residual(W, A).item() < 1e-10
    assert torch.linalg.matrix_norm(A, ord=2).item() <= 1 + 1e-12


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(8, 4), (4, 8), (6, 6)])
@pytest.mark.parametrize("solver", ["dual_ascent", "admm"])
def test_inner_solvers_reach_the_reference(name, shape, solver):
    M, W, G = problem(name, shape, 1)
    A_ref, L_ref, _ = exact_solution(W, G, M.gram_projector, steps=300)
    f_ref = dual_value(W, G, L_ref)
    if solver == "dual_ascent":
        A, Lambda, hist = dual_ascent(W, G, M.gram_projector, steps=500, alpha=0.1, msign_fn=msign_exact)
        rel_tol = 1e-3
    else:
        A, Lambda, hist = admm(W, G, M.gram_projector, steps=100, rho=0.3, msign_fn=msign_exact,
                               svt_fn=lambda Z, t: svt(Z, t, msign_fn=msign_exact))
        rel_tol = 1e-5
    assert f_ref * (1 - 1e-12) <= dual_value(W, G, Lambda) <= f_ref * (1 + rel_tol)
    if shape[0] != shape[1]:  # the maximiser is unique here; on square DGram/Oblique it need not be
        assert (A - A_ref).norm() <= 0.05 * A_ref.norm()
        assert (G * A).sum() >= (G * A_ref).sum() * (1 - 0.01)


def test_dual_ascent_early_stops_per_matrix_and_warm_starts():
    M = get_manifold("gram_oblique")
    g = torch.Generator().manual_seed(2)
    W = M.random_point((3, 8, 4), generator=g, dtype=torch.float64)
    G = torch.randn(3, 8, 4, generator=g, dtype=torch.float64)
    A, Lambda, hist = dual_ascent(W, G, M.gram_projector, steps=400, tol=1e-4, msign_fn=msign_exact)
    assert len(hist) < 400 and (hist[-1] < 1e-4).all()
    _, _, hist2 = dual_ascent(W, G, M.gram_projector, steps=400, tol=1e-4, Lambda0=Lambda, msign_fn=msign_exact)
    assert len(hist2) == 1  # warm start from the solution: converged at once


# ---------------------------------------------------------------- the optimizer


def quadratic_run(name, steps, inner="dual_ascent", shape=(8, 4), dtype=torch.float32, **kw):
    g = torch.Generator().manual_seed(0)
    M = get_manifold(name)
    W = torch.nn.Parameter(M.random_point(shape, generator=g).to(dtype))
    T = torch.randn(shape, generator=g)
    opt = ManifoldMuon([W], lr=0.02, manifold=name, inner=inner, **kw)
    for _ in range(steps):
        opt.zero_grad()
        ((W.float() - T) ** 2).sum().backward()
        opt.step()
    return M, W, T


@pytest.mark.parametrize("name", NAMES)
def test_1000_steps_keep_the_constraint(name):
    M, W, T = quadratic_run(name, 1000, inner_steps=2)
    assert M.residual(W).item() < 1e-5
    # and it optimised: closer to the target than a fresh random point on the manifold
    W0 = M.random_point((8, 4), generator=torch.Generator().manual_seed(5))
    assert ((W - T) ** 2).sum() < ((W0 - T) ** 2).sum()


@pytest.mark.parametrize("inner", ["dual_ascent", "admm"])
@pytest.mark.parametrize("shape", [(4, 8), (5, 5)])
def test_wide_and_square_stay_on_manifold(inner, shape):
    M, W, _ = quadratic_run("dgram", 30, inner=inner, shape=shape, inner_steps=3)
    assert M.residual(W).item() < 1e-5


@pytest.mark.parametrize("kw", [{}, dict(inner="exact"),
                                dict(inner="lean", tracker="newton", inner_steps=1, warm_start=True),
                                dict(inner="lean", tracker="newton_dk")])
def test_same_shape_matrices_are_batched_like_single_ones(kw):
    """Same-shape weights stepped as one batch land where each would alone, over three steps (the warm-started
    solvers carry per-weight state): the default, the exact mode and the Newton tracker (on Stiefel both solve
    their Newton systems in N's eigenbasis, per matrix of the batch)."""
    g = torch.Generator().manual_seed(0)
    M = get_manifold("stiefel")
    init = M.random_point((2, 6, 3), generator=g, dtype=torch.float64)
    grads = torch.randn(3, 2, 6, 3, generator=g, dtype=torch.float64)
    together = [torch.nn.Parameter(w.clone()) for w in init]
    alone = [torch.nn.Parameter(w.clone()) for w in init]
    opt = ManifoldMuon(together, lr=0.1, **kw)
    solo = [ManifoldMuon([a], lr=0.1, **kw) for a in alone]
    for step in grads:
        for p, a, o, gr in zip(together, alone, solo, step):
            p.grad, a.grad = gr.clone(), gr.clone()
            o.step()
        opt.step()
    for a, p in zip(alone, together):
        assert torch.allclose(a, p, atol=1e-10)


def test_groups_carry_their_own_manifold_and_state_dict_round_trips():
    g = torch.Generator().manual_seed(0)
    a = torch.nn.Parameter(get_manifold("stiefel").random_point((6, 3), generator=g))
    b = torch.nn.Parameter(get_manifold("dgram").random_point((6, 3), generator=g))
    opt = ManifoldMuon([{"params": [a], "manifold": "stiefel"}, {"params": [b], "manifold": "dgram"}],
                       lr=0.05, warm_start=True)
    grads = [torch.randn(6, 3, generator=g) for _ in range(4)]
    for gr in grads[:2]:
        a.grad, b.grad = gr.clone(), 2 * gr.clone()
        opt.step()
    assert "Lambda" in opt.state[a] and opt.state[a]["Lambda"].shape == (3, 3)
    saved = copy.deepcopy(opt.state_dict())
    a2, b2 = torch.nn.Parameter(a.detach().clone()), torch.nn.Parameter(b.detach().clone())
    for gr in grads[2:]:
        a.grad, b.grad = gr.clone(), 2 * gr.clone()
        opt.step()
    opt2 = ManifoldMuon([{"params": [a2], "manifold": "gram_oblique"}, {"params": [b2], "manifold": "gram_oblique"}], lr=1.0)
    opt2.load_state_dict(saved)
    assert opt2.param_groups[1]["manifold"].name == "dgram" and opt2.param_groups[0]["lr"] == 0.05
    for gr in grads[2:]:
        a2.grad, b2.grad = gr.clone(), 2 * gr.clone()
        opt2.step()
    assert torch.equal(a, a2) and torch.equal(b, b2)


def test_lr_scheduler_drives_lr():
    W = torch.nn.Parameter(get_manifold("stiefel").random_point((4, 4)))
    opt = ManifoldMuon([W], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 if t == 0 else 0.0)
    W.grad = torch.randn(4, 4)
    before = W.detach().clone()
    opt.step()
    assert (W - before).abs().max() > 1e-2  # lr 0.1 moved it
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.0
    before = W.detach().clone()
    opt.step()  # lr 0: W - 0 * A, retracted: stays put
    assert torch.allclose(W, before, atol=1e-5)


def test_unknown_manifold_name_is_refused():
    with pytest.raises(ValueError, match="choose one of"):
        ManifoldMuon([torch.nn.Parameter(torch.randn(4, 4))], manifold="stifel")


def test_vector_parameter_is_refused_with_advice():
    with pytest.raises(ValueError, match="AdamW"):
        ManifoldMuon([torch.nn.Parameter(torch.randn(4))])


def test_3d_parameter_is_refused_with_advice():
    with pytest.raises(ValueError, match="reshape"):
        ManifoldMuon([torch.nn.Parameter(torch.randn(2, 4, 4))])


def test_bad_inner_config_is_refused():
    W = [torch.nn.Parameter(torch.randn(4, 4))]
    with pytest.raises(ValueError, match="dual_ascent"):
        ManifoldMuon(W, inner="newton")
    with pytest.raises(ValueError, match="momentum"):
        ManifoldMuon(W, momentum=1.5)


@pytest.mark.parametrize("tracker", ["newton", "newton_dk"])
def test_newton_trackers_refuse_what_they_cannot_do(tracker):
    """Both Newton trackers carry the multiplier (warm_start), take CG steps (inner_steps >= 1), certify after their
    step (no certify_first) and have no ADMM penalty (no rho): each is refused with a sentence, before any step; an
    unknown tracker's message lists the four."""
    W = [torch.nn.Parameter(get_manifold("dgram").random_point((12, 5)))]
    for bad in (dict(warm_start=False), dict(inner_steps=0), dict(certify_first=True), dict(rho=1.0)):
        with pytest.raises(ValueError, match="carries the multiplier from step to step"):
            ManifoldMuon(W, manifold="dgram", inner="lean", tracker=tracker, **bad)
    with pytest.raises(ValueError, match="'newton_dk'"):
        ManifoldMuon(W, manifold="dgram", inner="lean", tracker="newton-dk")
    opt = ManifoldMuon(W, manifold="dgram", inner="lean", tracker=tracker)
    assert opt.param_groups[0]["tracker"] == tracker and opt.param_groups[0]["inner_steps"] == 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_gradient_raises_and_changes_nothing(bad):
    a = torch.nn.Parameter(get_manifold("stiefel").random_point((6, 3)))
    b = torch.nn.Parameter(get_manifold("stiefel").random_point((6, 3)))
    opt = ManifoldMuon([a, b], lr=0.1)
    a.grad, b.grad = torch.randn(6, 3), torch.randn(6, 3)
    b.grad[0, 0] = bad
    before = a.detach().clone()
    with pytest.raises(FloatingPointError, match="NaN or inf; no weight was changed"):
        opt.step()
    assert torch.equal(a, before) and len(opt.state) == 0


def test_zero_gradient_leaves_weights_unchanged():
    W = torch.nn.Parameter(get_manifold("dgram").random_point((6, 3)))
    before = W.detach().clone()
    opt = ManifoldMuon([W], lr=0.1)
    W.grad = torch.zeros(6, 3)
    opt.step()
    assert torch.equal(W, before) and torch.isfinite(W).all()


@pytest.mark.parametrize("name", NAMES)
def test_rank_deficient_weights_land_on_manifold(name):
    W = torch.nn.Parameter(torch.randn(8, 1) @ torch.randn(1, 4))  # rank 1, off every manifold
    opt = ManifoldMuon([W], lr=0.1, manifold=name)
    opt.retract_parameters()
    M = get_manifold(name)
    assert M.residual(W).item() < 1e-5
    W.grad = torch.randn(8, 4)
    opt.step()
    assert torch.isfinite(W).all() and M.residual(W).item() < 1e-5


def test_bf16_weights_are_stepped_in_fp32_and_stay_bf16():
    M, W, _ = quadratic_run("stiefel", 20, dtype=torch.bfloat16, inner_steps=3)
    assert W.dtype == torch.bfloat16 and torch.isfinite(W).all()
    # as close to the manifold as bf16 rounding of an exact point allows (8 bits of mantissa)
    assert M.residual(W.float()).item() < 4 * 2**-8 * 4


def test_inner_solvers_with_iterative_msign_are_usable():
    """The optimizer's default msign (Polar Express, float32) gives a direction close to the reference."""
    M, W, G = problem("stiefel", (8, 4), 3)
    A_ref, _, _ = exact_solution(W, G, M.gram_projector, steps=300)
    pe = functools.partial(__import__("manifold_muon.msign", fromlist=["msign"]).msign, method="polar_express", steps=8)
    A, _, _ = dual_ascent(W.float(), G.float(), M.gram_projector, steps=200, msign_fn=pe)
    assert (A.double() - A_ref).norm() <= 0.05 * A_ref.norm()


@pytest.mark.parametrize("n", [4, 6])
def test_square_stiefel_is_solved_by_the_initial_multiplier(n):
    """On a square Stiefel point the tangent space is W * skew, and msign(tangent projection of G) is already
    the maximiser: zero dual-ascent steps reach the reference (the post tunes alpha on this case)."""
    M, W, G = problem("stiefel", (n, n), 4)
    A_ref, _, _ = exact_solution(W, G, M.gram_projector, steps=300)
    A, _, hist = dual_ascent(W, G, M.gram_projector, steps=0, msign_fn=msign_exact)
    assert hist == [] and torch.allclose(A, A_ref, atol=1e-8)


@pytest.mark.parametrize("inner", ["lean", "exact", "gram_admm"])
@pytest.mark.parametrize("setting", [dict(ns_steps=1), dict(msign="newton_schulz"), dict(msign_dtype=torch.bfloat16)])
def test_msign_settings_are_refused_where_the_solve_computes_msign_exactly(inner, setting):
    W = torch.nn.Parameter(get_manifold("stiefel").random_point((6, 3)))
    with pytest.raises(ValueError, match="would do nothing"):
        ManifoldMuon([W], inner=inner, **setting)
    ManifoldMuon([W], inner="post", **setting)  # there they act


# A value unlike each setting's default, to see that it acts.
_OTHER = dict(inner_steps=lambda d: d + 3, tol=lambda d: 1e9 if d is None else 0.5, warm_start=lambda d: not d,
              alpha=lambda d: 0.5, rho=lambda d: 3.0, normalize=lambda d: not d,
              msign=lambda d: "polar_express" if d == "newton_schulz" else "newton_schulz", ns_steps=lambda d: 2,
              msign_dtype=lambda d: torch.bfloat16, certify_first=lambda d: not d,
              tracker=lambda d: "admm" if d == "newton" else "newton")


def _two_steps(**settings):
    torch.manual_seed(0)
    W = torch.nn.Parameter(get_manifold("stiefel").random_point((15, 5)).double())  # (long: the lean cold Newton step)
    opt = ManifoldMuon([W], lr=0.1, **settings)
    G = torch.randn_like(W)
    for _ in range(3):  # correlated gradients, as in training: a warm start has something to keep
        W.grad = G + 0.05 * torch.randn_like(W)
        opt.step()
    return W.detach().clone()


@pytest.mark.parametrize("inner", list(SOLVER_SETTINGS))
@pytest.mark.parametrize("setting", list(_OTHER))
def test_every_setting_acts_or_is_refused(inner, setting):
    """A setting the chosen solver reads changes the weights; one it does not read is refused, with a
    message that names the solvers that do read it."""
    W = torch.nn.Parameter(get_manifold("stiefel").random_point((6, 3)))
    default = ManifoldMuon([W], inner=inner).param_groups[0][setting]
    value = _OTHER[setting](default)
    if setting not in SOLVER_SETTINGS[inner]:
        readers = [s for s, keys in SOLVER_SETTINGS.items() if setting in keys]
        with pytest.raises(ValueError, match=f"does not read {setting}.*{readers[0]}"):
            ManifoldMuon([W], inner=inner, **{setting: value})
        return
    base = dict(inner=inner, tol=0.0) if setting == "inner_steps" and inner in ("gram_admm", "exact") else dict(inner=inner)
    # (a solve stopped by tol before its cap shows inner_steps only when run to the cap)
    if inner == "lean" and setting in ("rho", "warm_start", "certify_first"):  # the lean step on Stiefel is the cold
        with pytest.raises(ValueError, match="carries nothing from step to step"):  # Newton step (no ADMM iteration,
            ManifoldMuon([W], inner=inner, **{setting: value})  # nothing carried): refused there; they act with ADMM
        base = dict(inner=inner, tracker="admm", inner_steps=1, warm_start=setting != "warm_start")
    assert not torch.equal(_two_steps(**base), _two_steps(**{**base, setting: value})), \
        f"{setting}={value!r} did nothing with inner={inner!r}"


def test_split_is_refused_with_a_sentence():
    W = torch.nn.Parameter(get_manifold("stiefel").random_point((6, 3)))
    with pytest.raises(ValueError, match="separate parameters"):
        ManifoldMuon([W], split=3)
