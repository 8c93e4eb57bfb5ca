"""MACRO, MuonH, SSO, FSO (the paper): each against a float64 transcription of its equations; constraints kept;
Lemma 1 checked numerically (and where it fails); bad input refused."""

import io

import pytest
import torch

from manifold_muon.msign import msign_svd
from manifold_muon.manifolds import get_manifold
from manifold_muon.optim import FSO, MACRO, SSO, MuonH
from manifold_muon.optim.spheres import bisect_multiplier

F64 = torch.float64
SPHERES = ["frobenius_sphere", "spectral_sphere", "input_oblique_sphere", "output_oblique_sphere"]


# ---------- direct transcriptions of the paper's equations (float64, one matrix, no batching) ----------

def msign(X):
    U, s, Vh = torch.linalg.svd(X, full_matrices=False)
    return U @ Vh


def top(W):
    U, s, Vh = torch.linalg.svd(W, full_matrices=False)
    return s[0], U[:, 0], Vh[0]


def proj(name, W, M):  # App. B.1
    if name == "frobenius_sphere":
        return M - (M * W).sum() / (W * W).sum() * W
    if name == "spectral_sphere":
        _, u, v = top(W)
        return M - (u @ M @ v) * torch.outer(u, v)
    if name == "input_oblique_sphere":
        return M - (M * W).sum(0, keepdim=True) / (W * W).sum(0, keepdim=True) * W
    return M - (M * W).sum(1, keepdim=True) / (W * W).sum(1, keepdim=True) * W


def norm(name, X):  # ||.||_M of Sec. 2
    return {"frobenius_sphere": lambda: X.norm(), "spectral_sphere": lambda: top(X)[0],
            "input_oblique_sphere": lambda: X.norm(dim=0).max(), "output_oblique_sphere": lambda: X.norm(dim=1).max()}[name]()


def retract(name, X, R):  # App. B.1 (spectral: the approximate R X / ||X||_2 that 003 ran)
    if name in ("frobenius_sphere", "spectral_sphere"):
        return R * X / norm(name, X)
    return R * X / X.norm(dim=0 if name == "input_oblique_sphere" else 1, keepdim=True)


def bisection(M, Theta, tol, iters):  # Lemma 1's bracket, one scalar lambda at a time
    nuc = lambda X: torch.linalg.svdvals(X).sum()
    lo, hi, best = -2 * nuc(M) / nuc(Theta), 2 * nuc(M) / nuc(Theta), None
    for _ in range(iters):
        lam = (lo + hi) / 2
        O = msign(M + lam * Theta)
        h = (Theta * O).sum()
        if best is None or h.abs() < best[0]:
            best = (h.abs(), O)
        lo, hi = (lam, hi) if h < 0 else (lo, lam)
        if h.abs() <= tol * nuc(Theta):
            break
    return best[1]


def reference(kind, name, W, grads, lr, beta, c, R, tol=1e-4, iters=10):
    M = torch.zeros_like(W)
    eps = 1e-8
    for G in grads:
        M = beta * M + (1 - beta) * G
        if kind == "macro":
            O = msign(proj(name, W, M))
        elif kind == "muonh":
            O = msign(M)
        elif kind == "fso":
            O = bisection(M, W, tol, iters)
        else:  # sso
            _, u, v = top(W)
            O = bisection(M, torch.outer(u, v), tol, iters)
        W = retract(name, W - lr * c * R * O / (norm(name, O) + eps), R)
    return W


CASES = [("macro", MACRO, n) for n in SPHERES] + [
    ("muonh", MuonH, "frobenius_sphere"), ("muonh", MuonH, "spectral_sphere"),
    ("fso", FSO, "frobenius_sphere"), ("sso", SSO, "spectral_sphere")]


@pytest.mark.parametrize("shape", [(6, 4), (4, 6)])
@pytest.mark.parametrize("kind,cls,name", CASES)
def test_matches_transcription(kind, cls, name, shape):
    g = torch.Generator().manual_seed(7)
    M = get_manifold(name, r=1.3)
    W0 = M.retract(torch.randn(*shape, generator=g, dtype=F64))
    grads = [torch.randn(*shape, generator=g, dtype=F64) for _ in range(3)]
    p = torch.nn.Parameter(W0.clone())
    opt = cls([p], lr=0.05, manifold={"name": name, "r": 1.3}, momentum=0.9, c=0.7, msign="svd")
    for G in grads:
        p.grad = G.clone()
        opt.step()
    ref = reference(kind, name, W0, grads, lr=0.05, beta=0.9, c=0.7, R=M.radius(shape))
    assert torch.allclose(p.detach(), ref, atol=1e-10, rtol=0)
    assert not torch.allclose(p.detach(), W0, atol=1e-3), "the step moved W"


@pytest.mark.parametrize("name", SPHERES)
def test_1000_macro_steps_keep_the_constraint_and_descend(name):
    M = get_manifold(name)
    W = torch.nn.Parameter(M.random_point((4, 3), generator=torch.Generator().manual_seed(0)))
    T = M.random_point((4, 3), generator=torch.Generator().manual_seed(1))  # minimiser on the sphere
    opt = MACRO([W], lr=0.02, manifold=name, c=0.5)
    worst, first = 0.0, None
    for _ in range(1000):
        opt.zero_grad()
        loss = ((W - T) ** 2).sum()
        loss.backward()
        first = first if first is not None else loss.item()
        opt.step()
        worst = max(worst, float(M.residual(W.detach())))
    assert worst < 1e-5
    assert loss.item() < 0.05 * first


def test_sphere_constraint_and_tangency_of_the_fso_sso_directions():
    """FSO/SSO pick O with <Theta, O> ~ 0 on tall matrices (where h is continuous)."""
    g = torch.Generator().manual_seed(5)
    for name, Theta_of in (("frobenius_sphere", lambda W: W), ("spectral_sphere", None)):
        Mf = get_manifold(name)
        W = Mf.retract(torch.randn(4, 9, 5, generator=g, dtype=F64))
        M = torch.randn(4, 9, 5, generator=g, dtype=F64)
        Theta = Mf.normal(W)
        lam, O, h = bisect_multiplier(M, Theta, msign_svd, tol=1e-10, max_iter=60)
        assert torch.allclose(O, msign_svd(M + lam[:, None, None] * Theta))
        assert (h.abs() / torch.linalg.svdvals(Theta).sum(-1)).max() < 1e-9


# ---------- Lemma 1 (The paper, App. B.2) numerically ----------

def _h(G, Theta, lams):
    return torch.stack([(Theta * msign_svd(G + l * Theta)).sum() for l in lams])


@pytest.mark.parametrize("shape", [(3, 3), (5, 2), (2, 5), (6, 6)])
def test_lemma1_monotone_and_bracket(shape):
    g = torch.Generator().manual_seed(11)
    for trial in range(12):
        G = torch.randn(*shape, generator=g, dtype=F64) * (0.1 + 10 * trial)
        W = torch.randn(*shape, generator=g, dtype=F64)
        if trial % 2:  # the spectral analogue: Theta = u1 v1^T
            _, u, v = top(W)
            W = torch.outer(u, v)
        nuc = lambda X: torch.linalg.svdvals(X).sum()
        B = float(2 * nuc(G) / nuc(W))
        lams = torch.linspace(-1.5 * B, 1.5 * B, 241, dtype=F64)
        h = _h(G, W, lams)
        assert (h.diff() >= -1e-9).all(), "h is non-decreasing"
        assert (h[lams < -B * (1 + 1e-9)] < 0).all() and (h[lams > B * (1 + 1e-9)] > 0).all(), \
            "h changes sign inside Lemma 1's bracket"


def test_lemma1_root_need_not_exist():
    """Counterexample to 'there exists a root lambda* with h(lambda*) = 0' (Lemma 1 uses the intermediate
    value property, but h is not continuous: msign jumps where G + lambda W loses rank).
    W = diag(2, 1), G = diag(1, 0): h takes only the values -3, -1, 1, 2, 3."""
    W, G = torch.diag(torch.tensor([2.0, 1.0], dtype=F64)), torch.diag(torch.tensor([1.0, 0.0], dtype=F64))
    lams = torch.linspace(-2, 2, 4001, dtype=F64)
    h = _h(G, W, lams)
    assert set(h.round().tolist()) == {-3.0, -1.0, 1.0, 2.0, 3.0}
    assert (h.abs() >= 1 - 1e-12).all(), "h is never 0"
    # bisection homes in on the jump at lambda = -1/2; the best it can return leaves |h| = 1, and says so
    lam, O, hb = bisect_multiplier(G[None], W[None], msign_svd, tol=1e-8, max_iter=40)
    assert -0.5 < float(lam) < 0 and abs(abs(float(hb)) - 1) < 1e-12


def test_random_square_matrices_often_have_no_root():
    """Not a corner case: for square (G, W) the jump is generic. Tall ones meet the tolerance."""
    g = torch.Generator().manual_seed(0)
    G, W = torch.randn(2, 64, 3, 3, generator=g, dtype=F64)
    _, _, h = bisect_multiplier(G, W, msign_svd, tol=1e-12, max_iter=50)
    missed = (h.abs() / torch.linalg.svdvals(W).sum(-1) > 1e-6).float().mean()
    assert missed > 0.1
    G, W = torch.randn(2, 64, 6, 3, generator=g, dtype=F64)
    _, _, h = bisect_multiplier(G, W, msign_svd, tol=1e-12, max_iter=50)
    assert (h.abs() / torch.linalg.svdvals(W).sum(-1)).max() < 1e-9


# ---------- optimizer plumbing ----------

def test_batched_equals_separate_and_groups_hold_different_manifolds():
    g = torch.Generator().manual_seed(2)
    Ws = [get_manifold("spectral_sphere").retract(torch.randn(5, 3, generator=g)) for _ in range(3)]
    Gs = [torch.randn(5, 3, generator=g) for _ in range(3)]
    together = [torch.nn.Parameter(W.clone()) for W in Ws]
    apart = [torch.nn.Parameter(W.clone()) for W in Ws]
    opt = MACRO(together, lr=0.1, msign="svd")
    opts = [MACRO([p], lr=0.1, msign="svd") for p in apart]
    for p, q, G in zip(together, apart, Gs):
        p.grad, q.grad = G.clone(), G.clone()
    opt.step()
    [o.step() for o in opts]
    for p, q in zip(together, apart):
        assert torch.allclose(p, q, atol=1e-6)
    a, b = torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(3, 5))
    opt = MACRO([{"params": [a], "manifold": "input_oblique_sphere"}, {"params": [b], "manifold": "frobenius_sphere"}], lr=0.1)
    a.grad, b.grad = torch.randn(5, 3), torch.randn(3, 5)
    opt.step()
    assert float(get_manifold("input_oblique_sphere").residual(a.detach())) < 1e-5
    assert float(get_manifold("frobenius_sphere").residual(b.detach())) < 1e-5


@pytest.mark.filterwarnings("ignore:Detected call of")
@pytest.mark.parametrize("cls", [MACRO, MuonH, SSO, FSO])
def test_state_dict_round_trip_and_scheduler(cls):
    def make():
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(6, 4))
        return p, cls([p], lr=0.05)
    grads = [torch.randn(6, 4) for _ in range(4)]
    p, opt = make()
    for G in grads[:2]:
        p.grad = G.clone()
        opt.step()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    q, opt2 = make()
    q.data.copy_(p.data)
    opt2.load_state_dict(torch.load(buf, weights_only=True))
    for G in grads[2:]:
        p.grad, q.grad = G.clone(), G.clone()
        opt.step()
        opt2.step()
    assert torch.equal(p, q)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.0)
    sched.step()
    before = p.detach().clone()
    p.grad = grads[0].clone()
    opt.step()
    assert opt.param_groups[0]["lr"] == 0.0
    m = opt.param_groups[0]["manifold"]
    assert torch.allclose(p.detach(), m.retract(before), atol=1e-6), "lr 0 only retracts"


@pytest.mark.parametrize("cls", [MACRO, MuonH, SSO, FSO])
def test_zero_nonfinite_rank_deficient_bf16(cls):
    name = {MACRO: "output_oblique_sphere", MuonH: "frobenius_sphere", SSO: "spectral_sphere", FSO: "frobenius_sphere"}[cls]
    M = get_manifold(name)
    p = torch.nn.Parameter(M.random_point((6, 4)))
    opt = cls([p], lr=0.1, manifold=name)
    p.grad = torch.zeros(6, 4)
    before = p.detach().clone()
    opt.step()
    assert torch.isfinite(p).all() and torch.allclose(p.detach(), before, atol=1e-6), "zero gradient: no move, no NaN"
    p.grad = torch.full((6, 4), float("nan"))
    with pytest.raises(FloatingPointError, match="nonfinite='skip'"):
        opt.step()
    skip = cls([p], lr=0.1, manifold=name, nonfinite="skip")
    p.grad = torch.full((6, 4), float("inf"))
    skip.step()
    assert torch.allclose(p.detach(), before, atol=1e-6)
    r = torch.nn.Parameter(M.retract(torch.outer(torch.randn(6), torch.randn(4))))  # rank one on the sphere
    opt = cls([r], lr=0.1, manifold=name)
    r.grad = torch.randn(6, 4)
    opt.step()
    assert torch.isfinite(r).all() and float(M.residual(r.detach())) < 1e-5
    b = torch.nn.Parameter(M.random_point((6, 4)).bfloat16())
    opt = cls([b], lr=0.1, manifold=name)
    b.grad = torch.randn(6, 4).bfloat16()
    opt.step()
    assert b.dtype == torch.bfloat16 and opt.state[b]["momentum_buffer"].dtype == torch.float32
    assert float(M.residual(b.detach())) < 2e-2


def test_bad_config_is_refused():
    p = torch.nn.Parameter(torch.randn(4, 3))
    with pytest.raises(ValueError, match="frobenius_sphere"):
        MACRO([p], manifold="sphere")
    with pytest.raises(ValueError, match="AdamW"):
        MACRO([torch.nn.Parameter(torch.randn(4))])
    with pytest.raises(ValueError, match="reshape"):
        MACRO([torch.nn.Parameter(torch.randn(2, 4, 3))])
    with pytest.raises(ValueError, match="lr"):
        MACRO([p], lr=-1.0)
    with pytest.raises(ValueError, match="momentum"):
        MACRO([p], momentum=1.0)
    with pytest.raises(TypeError, match="beta"):  # a misspelt setting is refused, not ignored
        MACRO([p], beta=0.9)
    with pytest.raises(ValueError, match="use MACRO"):
        MuonH([p], manifold="input_oblique_sphere")
    with pytest.raises(ValueError, match="use MACRO"):
        SSO([p], manifold="frobenius_sphere")
    with pytest.raises(ValueError, match="newton_schulz"):
        FSO([p], msign="qr")
    with pytest.raises(ValueError, match="inner_steps"):
        FSO([p], inner_steps=0)
    with pytest.raises(TypeError, match="max_iter"):  # the cap on bisection msigns is inner_steps, as in ManifoldMuon
        FSO([p], max_iter=10)
    opt = MACRO([p])
    with pytest.raises(ValueError, match="AdamW"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(3))]})


def test_qkv_split_puts_each_block_on_its_own_sphere():
    p = torch.nn.Parameter(torch.randn(9, 4))
    for cls in (MACRO, MuonH, SSO):
        opt = cls([p], lr=0.1, manifold={"name": "spectral_sphere", "r": 2.0}, split=3)
        opt.retract_parameters()
        p.grad = torch.randn(9, 4)
        opt.step()
        blocks = p.detach().view(3, 3, 4)
        R = get_manifold("spectral_sphere", r=2.0).radius((3, 4))
        assert torch.allclose(torch.linalg.matrix_norm(blocks, ord=2), torch.full((3,), R), atol=1e-5)
    assert float(torch.linalg.matrix_norm(p.detach(), ord=2)) > R * 1.01, "the fused matrix is not on one sphere"
    with pytest.raises(ValueError, match="dividing D_out"):
        MACRO([torch.nn.Parameter(torch.randn(8, 4))], split=3)


def test_frobenius_constraint_is_not_invariant_under_qkv_split():
    """The paper, Table 11 caption: 'the Frobenius constraint is invariant under the split'. Not as sets (three
    spheres of radius r sqrt(d) are a strict subset of one of radius r sqrt(3d)), nor as steps: from a point
    on both, one MACRO-fro step with and without the split lands at different weights."""
    g = torch.Generator().manual_seed(4)
    d = 4
    blocks = get_manifold("frobenius_sphere").retract(torch.randn(3, d, d, generator=g, dtype=F64))
    W0, G = blocks.reshape(3 * d, d), torch.randn(3 * d, d, generator=g, dtype=F64)
    assert abs(float(W0.norm()) - (3 * d) ** 0.5) < 1e-12, "the start is on the fused sphere too"
    out = []
    for split in (1, 3):
        p = torch.nn.Parameter(W0.clone())
        opt = MACRO([p], lr=0.1, manifold="frobenius_sphere", split=split, msign="svd")
        p.grad = G.clone()
        opt.step()
        out.append(p.detach())
    assert (out[0] - out[1]).norm() > 1e-3
    assert torch.linalg.matrix_norm(out[0].view(3, d, d)).sub(d ** 0.5).abs().max() > 1e-3, "fused: blocks drift"


@pytest.mark.parametrize("name", ["frobenius_sphere", "spectral_sphere", "output_oblique_sphere"])
def test_weight_decay_is_a_learning_rate_change_under_a_rescaling_retraction(name):
    """The paper's App. D.2 finds wd = 0 and wd = 0.1 'agree within 0.001'. With a scale-invariant retraction
    P(a X) = P(X) that is algebra, not evidence: P((1 - lr wd) W - lr S) = P(W - lr / (1 - lr wd) S)."""
    g = torch.Generator().manual_seed(9)
    W0 = get_manifold(name).retract(torch.randn(6, 4, generator=g, dtype=F64))
    grads = [torch.randn(6, 4, generator=g, dtype=F64) for _ in range(5)]
    lr, wd, out = 0.01, 0.1, []
    for kw in (dict(lr=lr, weight_decay=wd), dict(lr=lr / (1 - lr * wd), weight_decay=0.0)):
        p = torch.nn.Parameter(W0.clone())
        opt = MACRO([p], manifold=name, msign="svd", **kw)
        for G in grads:
            p.grad = G.clone()
            opt.step()
        out.append(p.detach())
    assert torch.allclose(out[0], out[1], atol=1e-12)


@pytest.mark.parametrize("name", ["frobenius_sphere", "spectral_sphere"])
def test_retracting_an_all_zero_weight_is_refused_and_writes_nothing(name):
    W, V = torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.zeros(6, 4))
    before = W.detach().clone()
    opt = MACRO([W, V], manifold=name)
    with pytest.raises(ValueError, match="all zero.*initialise it"):
        opt.retract_parameters()
    assert torch.equal(W, before)  # nothing written before the refusal
