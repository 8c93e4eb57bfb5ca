"""The prototype of square Stiefel's msign by products alone (bench ``sync_free_msign``): exact to the step's
standard with no eigendecomposition and no host read, at even and odd sizes; the benchmark refuses bad shapes."""

import pytest
import torch

from manifold_muon.opcount import OpCounter
from manifold_muon_book.bench import sync_free_msign as sfm


@pytest.mark.parametrize("n", [24, 25])
def test_products_alone_reach_the_closed_form_without_reading_the_host(n):
    S = sfm.skew_momentum((n, n))
    with OpCounter(big=n) as ops:
        B = sfm.matmul_msign(S, 10, 1e-5, 1)
    assert ops.counts.get("eigh", 0) == 0 and ops.counts.get("sync", 0) == 0
    assert ops.counts["matmul_full"] == 3 * 10 + 2
    assert torch.equal(B, -B.mT)                                          # tangent: exactly skew
    s = torch.linalg.svdvals(S)
    op = float(torch.linalg.matrix_norm(B, ord=2))
    assert op <= 1 + 1e-9
    assert (float(s.sum()) - float((S * B).sum())) / float(s.sum()) <= 1e-6   # the closed form's gap standard
    assert float((B - sfm.eigh_msign(S)).norm() / sfm.eigh_msign(S).norm()) <= 1e-4
    with OpCounter(big=n) as ops:
        sfm.eigh_msign(S)
    # the eigh's own read, and the pairing check's (``skew_msign``)
    assert ops.counts["eigh"] == 1 and ops.counts["sync_checked"] == 1 and ops.counts["sync"] == 2


def test_too_few_quintics_fall_short_of_the_gap():
    """The measurement can say no: five quintics tuned for [1e-3, 1], unpolished, miss the 1e-6 gap by far."""
    S = sfm.skew_momentum((24, 24))
    B = sfm.matmul_msign(S, 5, 1e-3, 0)
    s = torch.linalg.svdvals(S)
    value = float((S * B).sum()) / max(1.0, float(torch.linalg.matrix_norm(B, ord=2)))
    assert (float(s.sum()) - value) / float(s.sum()) > 1e-3


def test_the_benchmark_writes_its_rows_and_refuses_a_rectangle_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="square shapes"):
        sfm.main(tmp_path, shapes=[(24, 12)])
    assert not list(tmp_path.iterdir())
    out = sfm.main(tmp_path, quick=True, configs=((10, 1e-5, 1),), rounds=1)
    rows = out["rows"]
    assert [r["path"] for r in rows] == ["eigh", "matmul"] * 2
    assert all(r["ops"].get("sync", 0) == 0 for r in rows if r["path"] == "matmul")
    assert (tmp_path / "sync_free_msign.json").exists()
