"""The page helpers of chapter 02 (``manifold_muon_book.gram_pages``): exact points and test regimes."""

import sympy as sp
import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon_book import gram_pages as gp


def test_rational_points_are_exactly_on_their_manifold():
    for m, n in [(3, 2), (5, 3)]:
        Q = gp.rational_point("Stiefel", m, n, seed=1)
        assert Q.shape == (m, n) and Q.T * Q == sp.eye(n)
        W = gp.rational_point("DGram", m, n, seed=2)
        G = W.T * W
        assert all(G[i, j] == 0 for i in range(n) for j in range(n) if i != j)
        assert all(G[i, i] > 0 for i in range(n))
        O = gp.rational_point("Oblique", m, n, seed=3)
        assert all((O.T * O)[i, i] == 1 for i in range(n))
        assert all(isinstance(x, sp.Rational) for x in list(Q) + list(W) + list(O))


def test_rational_point_is_deterministic_in_its_seed():
    assert gp.rational_point("DGram", 4, 3, seed=43) == gp.rational_point("DGram", 4, 3, seed=43)
    assert gp.rational_point("DGram", 4, 3, seed=43) != gp.rational_point("DGram", 4, 3, seed=44)


def test_chamber_regimes_are_the_three_cases():
    stiefel, dgram = get_manifold("stiefel"), get_manifold("dgram")
    regimes = gp.chamber_regimes(stiefel, dgram, torch.Generator().manual_seed(7))
    assert list(regimes) == ["inside the chamber", "on a wall (tie)", "outside (unsorted)"]
    norms = {k: W.norm(dim=0) for k, (W, _) in regimes.items()}
    assert bool((norms["inside the chamber"][:-1] > norms["inside the chamber"][1:]).all())
    assert torch.isclose(norms["on a wall (tie)"][0], norms["on a wall (tie)"][1])
    assert bool((norms["outside (unsorted)"][:-1] < norms["outside (unsorted)"][1:]).all())
    for W, V in regimes.values():
        assert float(dgram.residual(W)) < 1e-12 and float(dgram.tangent_residual(W, V)) < 1e-12
        assert abs(float(V.norm()) - 1) < 1e-12
