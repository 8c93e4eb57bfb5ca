"""A wide weight in the Gram picture is seen tall through transposed views, without copies (``_tall_unit(views=True)``):
the picture's C and the m x n matrices it forms are the same as from row-major copies, and come back in the wide
weight's own layout (row-major once transposed back), so the optimizer's elementwise work stays in one layout."""

import pytest
import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.optim import ManifoldMuon
from manifold_muon.optim.inner_solvers import Span, _tall_unit, _transposed, gram_picture, lean_solve


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
@pytest.mark.parametrize("shape", [(16, 48), (8, 40)])
def test_views_give_the_copies_picture_in_the_wide_layout(name, shape):
    M = get_manifold(name)
    g = torch.Generator().manual_seed(3)
    W = M.random_point(shape, generator=g)[None]
    G = torch.randn(1, *shape, generator=g)
    Wc, Gc, wide = _tall_unit(W, G)
    Wv, Gv, wide_v = _tall_unit(W, G, views=True)
    assert wide and wide_v and _transposed(Wv) and _transposed(Gv) and not _transposed(Wc)
    assert Wv.data_ptr() == W.data_ptr()  # a view, no copy
    pc = gram_picture(Wc, Gc, M.gram_projector, products=torch.float32, diagonal=True)
    pv = gram_picture(Wv, Gv, M.gram_projector, products=torch.float32, diagonal=True)
    assert _transposed(pv.C)  # C in G's layout
    assert torch.allclose(pv.C, pc.C, rtol=0, atol=1e-6 * float(pc.C.abs().max()))
    assert torch.allclose(pv.R, pc.R, rtol=1e-5, atol=1e-6 * float(pc.R.abs().max()))
    X = Span(torch.randn(1, shape[0], shape[0], generator=g, dtype=torch.float64),
             torch.randn(1, shape[0], shape[0], generator=g, dtype=torch.float64))
    Xv, Xc = X.matrix(pv), X.matrix(pc)
    assert Xv.mT.is_contiguous() and Xc.is_contiguous()  # the wide matrix comes back row-major
    assert torch.allclose(Xv, Xc, rtol=0, atol=1e-5 * float(Xc.abs().max()))
    sol = lean_solve(W, G, M.gram_projector, diagonal=True, steps=0)
    assert sol.matrix().is_contiguous() and sol.matrix().shape == W.shape


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
def test_a_wide_weight_steps_as_its_transpose_does(name):
    """Transposition equivariance of the lean step: a wide weight and its tall transpose, given transposed
    momenta, end at transposed weights (to float32's rounding)."""
    M = get_manifold(name)
    g = torch.Generator().manual_seed(4)
    W0 = M.random_point((48, 16), generator=g)
    grads = [torch.randn(48, 16, generator=g) for _ in range(4)]
    tall, wide = torch.nn.Parameter(W0.clone()), torch.nn.Parameter(W0.mT.contiguous())
    opts = [ManifoldMuon([p], lr=0.05, manifold=name, inner="lean") for p in (tall, wide)]
    for G in grads:
        tall.grad, wide.grad = G.clone(), G.mT.contiguous()
        for o in opts:
            o.step()
    assert torch.allclose(wide.mT, tall, rtol=0, atol=2e-5)
