"""Gram-space manifolds (Stiefel, DGram, Oblique): the retraction and projection axioms, by property tests."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from manifold_muon.manifolds import get_manifold
from manifold_muon.manifolds.gram import DGram, GramOblique, Stiefel

NAMES = ["stiefel", "dgram", "gram_oblique"]
# residual tolerances, relative to (1 + ||X||_F^2): float32 keeps ~7 digits, float64 ~15 (polish step included)
TOL = {torch.float32: 1e-5, torch.float64: 1e-9}

shapes = st.tuples(st.integers(1, 10), st.integers(1, 10)).filter(lambda s: max(s) >= 1)
dtypes = st.sampled_from([torch.float32, torch.float64])
seeds = st.integers(0, 2**31 - 1)


def point_and_noise(name, shape, dtype, seed, **kw):
    g = torch.Generator().manual_seed(seed)
    M = get_manifold(name, **kw)
    W = M.random_point(shape, generator=g, dtype=dtype)
    Z = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return M, W, Z


def gram_of_short_side(W):
    """W^T W for tall/square W, W W^T for wide W (the transposition rule)."""
    return W.mT @ W if W.size(-2) >= W.size(-1) else W @ W.mT


@pytest.mark.parametrize("name", NAMES)
@given(shape=shapes, dtype=dtypes, seed=seeds, method=st.sampled_from(["svd", "polar_express"]))
def test_retraction_lands_on_manifold(name, shape, dtype, seed, method):
    M, W, Z = point_and_noise(name, shape, dtype, seed, **({} if name == "gram_oblique" else {"msign": method}))
    X = W + 0.3 * Z
    R = M.retract(X)
    assert R.shape == X.shape and R.dtype == dtype
    assert M.residual(R).item() <= TOL[dtype] * (1 + X.double().norm().item() ** 2)


@pytest.mark.parametrize("name", NAMES)
@given(shape=shapes, dtype=dtypes, seed=seeds)
def test_retraction_is_identity_on_manifold(name, shape, dtype, seed):
    M, W, _ = point_and_noise(name, shape, dtype, seed)
    assert M.residual(W).item() <= TOL[dtype] * (1 + W.double().norm().item() ** 2)
    err = (M.retract(W) - W).abs().max().item()
    assert err <= (1e-4 if dtype == torch.float32 else 1e-9) * (1 + W.abs().max().item())


@pytest.mark.parametrize("name", NAMES)
@given(shape=shapes, dtype=dtypes, seed=seeds)
def test_projection_is_idempotent_and_tangent(name, shape, dtype, seed):
    M, W, G = point_and_noise(name, shape, dtype, seed)
    A = M.project(W, G)
    scale = 1 + G.double().norm().item() * (1 + W.double().norm().item())
    assert M.tangent_residual(W, A).item() <= TOL[dtype] * scale
    assert (M.project(W, A) - A).abs().max().item() <= TOL[dtype] * scale
    # orthogonal, not just any, projection: G - A is normal, i.e. orthogonal to every tangent vector
    B = M.project(W, torch.randn(shape, dtype=dtype))
    assert abs(((G - A) * B).sum().item()) <= 10 * TOL[dtype] * scale * (1 + B.double().norm().item())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(9, 4), (4, 9), (5, 5)])
@pytest.mark.parametrize("retraction", ["retract", "retract_via_gram"])
def test_retraction_is_first_order(name, shape, retraction):
    """R(W + tA) = W + tA + O(t^2) for tangent A: the defect shrinks 100x when t shrinks 10x (both the
    retraction and its Gram-space form, which the optimizer's fused step uses)."""
    M, W, G = point_and_noise(name, shape, torch.float64, 1)
    A = M.project(W, G)
    R = getattr(M, retraction)
    defect = [(R(W + t * A) - (W + t * A)).norm().item() for t in (1e-2, 1e-3)]
    assert defect[1] <= defect[0] / 50


@pytest.mark.parametrize("shape", [(5, 3), (3, 5)])
def test_wide_matrices_constrain_rows(shape):
    M, W, Z = point_and_noise("stiefel", shape, torch.float64, 2)
    R = M.retract(W + Z)
    assert torch.allclose(gram_of_short_side(R), torch.eye(min(shape), dtype=torch.float64), atol=1e-9)
    D = get_manifold("dgram").retract(W + Z)
    Gram = gram_of_short_side(D)
    assert torch.allclose(Gram - torch.diag(torch.diagonal(Gram)), torch.zeros_like(Gram), atol=1e-9)


def test_dgram_post_retraction_is_not_identity_on_manifold():
    """The post's W -> U V^T diag(Sigma) lands on DGram but permutes column norms that are not sorted."""
    W = torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]], dtype=torch.float64)  # orthogonal columns, norms 1, 2
    post, ours = DGram(retraction="svd_post"), DGram(retraction="msign")
    assert post.residual(W).item() == 0
    R = post.retract(W)
    assert post.residual(R).item() < 1e-12  # it does land on the manifold ...
    assert torch.allclose(R.norm(dim=0), torch.tensor([2.0, 1.0], dtype=torch.float64))  # ... with norms swapped
    assert (R - W).abs().max().item() > 0.5  # so it is not the identity there: not a retraction
    assert torch.allclose(ours.retract(W), W, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("method", ["svd", "polar_express", "newton_schulz"])
def test_retraction_of_rank_deficient_matrix_lands_on_manifold(name, method):
    g = torch.Generator().manual_seed(3)
    X = torch.randn(8, 2, generator=g) @ torch.randn(2, 4, generator=g)  # rank 2 < 4
    X[:, 1] = 0  # and a zero column
    M = get_manifold(name, **({} if name == "gram_oblique" else {"msign": method}))
    R = M.retract(X)
    assert torch.isfinite(R).all()
    assert M.residual(R).item() <= 1e-5 * (1 + X.norm().item() ** 2)


def test_gram_projectors_and_targets():
    S = torch.arange(9.0).reshape(3, 3)
    S = S + S.T
    assert torch.equal(Stiefel().gram_projector(S), S)
    assert torch.equal(DGram().gram_projector(S), S - torch.diag(torch.diag(S)))
    assert torch.equal(GramOblique().gram_projector(S), torch.diag(torch.diag(S)))
    assert torch.equal(Stiefel().target(3), torch.eye(3)) and torch.equal(DGram().target(3), torch.zeros(3, 3))


def test_batched_matches_one_by_one():
    M = get_manifold("dgram")
    W = M.random_point((3, 6, 4), generator=torch.Generator().manual_seed(0))
    G = torch.randn(3, 6, 4)
    batched = M.retract(W - 0.1 * M.project(W, G))
    single = torch.stack([M.retract(w - 0.1 * M.project(w, g)) for w, g in zip(W, G)])
    assert torch.allclose(batched, single, atol=1e-5)


def test_unknown_manifold_name_lists_valid_ones():
    with pytest.raises(ValueError, match="stiefel"):
        get_manifold("stifel")


def test_vector_is_refused_with_advice():
    with pytest.raises(ValueError, match="AdamW"):
        Stiefel().retract(torch.randn(5))


def test_bad_retraction_option_is_refused():
    with pytest.raises(ValueError, match="msign"):
        DGram(retraction="qr")
    with pytest.raises(ValueError, match="polar_express"):
        Stiefel(msign="cholesky")


# ---------------------------------------------------------------- the retraction from X^T X alone


@pytest.mark.parametrize("name", NAMES)
@given(shape=shapes, dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]), seed=seeds)
def test_retraction_via_gram_lands_on_manifold_and_equals_retract(name, shape, dtype, seed):
    """X T(X^T X) (what ManifoldMuon's fused step applies) lands on the manifold, equals ``retract`` where X
    has full rank, and is the identity on the manifold; bf16 inputs are retracted in float32."""
    M, W, Z = point_and_noise(name, shape, torch.float64, seed)
    X = (W + 0.3 * Z).to(dtype)
    R = M.retract_via_gram(X)
    tol = TOL[torch.float64 if dtype == torch.float64 else torch.float32]
    assert R.shape == X.shape and R.dtype == dtype
    rounding = 0 if dtype != torch.bfloat16 else 2**-8 * (1 + R.double().abs().max().item())
    assert M.residual(R.float() if dtype == torch.bfloat16 else R).item() <= tol * (1 + X.double().norm().item() ** 2) + 8 * rounding * max(shape)
    assert (R.double() - M.retract(X).double()).abs().max().item() <= 100 * tol * (1 + X.double().abs().max().item()) + 2 * rounding
    W = W.to(dtype)
    assert (M.retract_via_gram(W).double() - W.double()).abs().max().item() <= (
        1e-4 if dtype != torch.float64 else 1e-9) * (1 + W.double().abs().max().item()) + 2 * rounding




def test_post_dgram_map_via_gram_is_the_svd_one():
    M = DGram(retraction="svd_post")
    X = torch.randn(7, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.allclose(M.retract_via_gram(X), M.retract(X), atol=1e-12)


@pytest.mark.parametrize("norms, grow, identity, first_order", [([3.0, 2.0, 1.5, 1.0], 1, True, True),
                                                                ([1.0, 2.0, 1.5, 3.0], 1, False, False),
                                                                ([2.0, 2.0, 1.0, 0.5], 0, True, True),
                                                                ([2.0, 2.0, 1.0, 0.5], 1, True, False)])
def test_where_the_post_dgram_map_is_a_retraction(norms, grow, identity, first_order):
    """U V^T diag(Sigma) at W = Q0 diag(norms), along a tangent A in which column ``grow``'s norm grows
    fastest: identity iff the norms are non-increasing; first order (defect 100x smaller for t 10x smaller)
    where they are distinct, and at a tie only along directions that keep the tied norms in order."""
    g = torch.Generator().manual_seed(0)
    M = DGram(retraction="svd_post")
    Q0 = torch.linalg.qr(torch.randn(9, 4, generator=g, dtype=torch.float64))[0]
    W = Q0 * torch.tensor(norms, dtype=torch.float64)
    A = M.project(W, torch.randn(9, 4, generator=g, dtype=torch.float64)) + 5 * Q0 * torch.eye(4, dtype=torch.float64)[grow]
    assert M.tangent_residual(W, A).item() < 1e-12
    assert ((M.retract(W) - W).norm().item() < 1e-12) == identity
    defect = [(M.retract(W + t * A) - (W + t * A)).norm().item() for t in (1e-3, 1e-4)]
    assert (defect[1] <= defect[0] / 50) == first_order


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("method", ["polar_express", "newton_schulz"])
@pytest.mark.parametrize("shape", [(256, 256), (384, 256), (256, 384)])
@pytest.mark.parametrize("floor", [1e-3, 3e-4, 1e-4])
def test_retraction_of_ill_conditioned_matrix_lands_on_manifold(name, method, shape, floor):
    """One singular value at ``floor`` of the largest (a square Gaussian at GPT-2 width has one near 3e-4):
    at or below the iterative msign's reach, so where the polish cannot finish the SVD must take over, not
    the iteration stop short of the manifold (its error, spread over n^2 entries, once looked small)."""
    g = torch.Generator().manual_seed(5)
    k = min(shape)
    U = torch.linalg.qr(torch.randn(shape[0], k, generator=g, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(shape[1], k, generator=g, dtype=torch.float64))[0]
    sv = torch.linspace(1, 0.5, k, dtype=torch.float64)
    sv[-1] = floor  # one small singular value, its singular vectors spread over all entries (as a Gaussian's are)
    X = ((U * sv) @ V.mT).float()
    M = get_manifold(name, **({} if name == "gram_oblique" else {"msign": method}))
    R = M.retract(X)
    assert M.residual(R).item() <= TOL[torch.float32] * (1 + X.double().norm().item() ** 2)
