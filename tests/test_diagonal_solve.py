"""The Gram picture's K0 solve where D = W^T W is diagonal to rounding (Stiefel, DGram): the Neumann form
(``_diagonal_solve``) solves the ridged system to float64's rounding, ``gram_picture`` gives the same K0 and a C as
normal to W's range as the Cholesky path did, on tall, wide and square weights; and the benchmark
``diagonal_solve`` writes a row per weight and refuses a bad shape before any work."""

import pytest
import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.optim.inner_solvers import _diagonal_solve, _tall_unit, gram_picture
from manifold_muon_book.bench import diagonal_solve


def test_the_neumann_form_solves_the_ridged_system_to_rounding():
    g = torch.Generator().manual_seed(0)
    n = 40
    d = torch.logspace(0, 2, n, dtype=torch.float64)  # DGram: column norms spread over two decades
    O = 1e-7 * torch.randn(2, n, n, generator=g, dtype=torch.float64) * (d[:, None] * d[None, :]).sqrt()
    O = O + O.mT
    O.diagonal(dim1=-2, dim2=-1).zero_()
    D = torch.diag_embed(d).expand(2, n, n) + O
    B = torch.randn(2, n, n, generator=g, dtype=torch.float64)
    ridge = torch.full((2,), 1e-7, dtype=torch.float64)
    X = _diagonal_solve(D, ridge, B)
    ref = torch.linalg.solve(D + ridge[:, None, None] * torch.eye(n, dtype=torch.float64), B)
    assert float((X - ref).abs().max() / ref.abs().max()) < 1e-11
    # the first-order term does act: diag(D) alone is off by the size of O
    J = 1 / (d + ridge[0])
    assert float((J[:, None] * B - ref).abs().max() / ref.abs().max()) > 1e-9


@pytest.mark.parametrize("name", ["stiefel", "dgram"])
@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (24, 24)])
def test_gram_picture_k0_agrees_with_the_cholesky_path(name, shape):
    M = get_manifold(name)
    g = torch.Generator().manual_seed(1)
    W = M.random_point(shape, generator=g)[None]
    G = torch.randn(1, *shape, generator=g)
    Wt, Gt, _ = _tall_unit(W, G)
    fast = gram_picture(Wt, Gt, M.gram_projector, products=torch.float32, diagonal=True)
    chol = gram_picture(Wt, Gt, M.gram_projector, products=torch.float32, diagonal=False)
    assert float((fast.K0 - chol.K0).abs().max() / chol.K0.abs().max()) < 1e-5
    # C normal to W's range, as with the factorisation (what the solve is for)
    normal = lambda pic: float((Wt.mT @ pic.C).abs().max() / (Wt.mT @ Gt).abs().max())  # noqa: E731
    assert normal(fast) < 4 * normal(chol) + 1e-6


def test_diagonal_solve_benchmark_writes_rows_and_refuses_a_bad_shape_first(tmp_path):
    with pytest.raises(ValueError, match="m, n >= 2"):
        diagonal_solve.main(tmp_path, shapes=[(24, 1)])
    assert not list(tmp_path.iterdir())
    rows = diagonal_solve.main(tmp_path, shapes=[(24, 8), (8, 24)], rounds=3)["rows"]
    assert (tmp_path / "diagonal_solve.json").exists()
    assert [(tuple(r["shape"]), r["manifold"]) for r in rows] == [
        ((24, 8), "stiefel"), ((24, 8), "dgram"), ((8, 24), "stiefel"), ((8, 24), "dgram")]
    for r in rows:
        assert r["ratio"] > 0 and r["neumann_s"] > 0 and r["cholesky_s"] > 0
        assert r["k0_rel_diff"] < 1e-5
        assert r["residual_neumann"] < 1e-5 and r["residual_cholesky"] < 1e-5
