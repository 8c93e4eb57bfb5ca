"""The benchmark ``compiled_step`` (the lean step and Muon, eager and under torch.compile): it refuses a bad weight
before any work, writes a row per weight with every arm timed, and the compiled lean step lands where the eager
one does. Traced with the "eager" backend (dynamo without inductor's C++ compile, which takes most of a
minute here); the published run uses inductor."""

import math

import pytest

from manifold_muon_book.bench import compiled_step


def test_compiled_step_refuses_a_bad_weight_first(tmp_path):
    with pytest.raises(ValueError, match="manifold of"):
        compiled_step.main(tmp_path, weights=[((24, 8), "sphere")])
    with pytest.raises(ValueError, match="m, n >= 2"):
        compiled_step.main(tmp_path, weights=[((24, 1), "dgram")])
    assert not list(tmp_path.iterdir())


def test_compiled_step_writes_a_row_per_weight(tmp_path):
    rows = compiled_step.main(tmp_path, weights=[((24, 8), "dgram"), ((12, 12), "stiefel")], rounds=3,
                              backend="eager")["rows"]
    assert (tmp_path / "compiled_step.json").exists()
    assert [(tuple(r["shape"]), r["manifold"]) for r in rows] == [((24, 8), "dgram"), ((12, 12), "stiefel")]
    for r in rows:
        assert all(r[f"{a}_s"] > 0 for a in compiled_step.ARMS)
        ratios = ("ratio_eager", "ratio_compiled", "ratio_compiled_vs_eager")
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ratios)
        assert r["step_rel_diff"] < 1e-4  # the traced step is the same step (to float32 rounding of the step)
