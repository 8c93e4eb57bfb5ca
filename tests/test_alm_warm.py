"""The benchmark ``alm_warm`` (the exact mode on square weights against the augmented Lagrangian method warm-started
at a fixed penalty): it refuses a bad request before any work, writes a row per (weight, stream) whose solves are
certified, and judges its criterion only on what it was written for."""

import copy

import pytest

from manifold_muon_book.bench import alm_warm


def test_alm_warm_refuses_bad_input_first(tmp_path):
    for weights in ([((12, 8), "gram_oblique")], [((12, 12), "stiefel")], [((1, 1), "dgram")]):
        with pytest.raises(ValueError, match="square with n >= 2"):
            alm_warm.main(tmp_path, weights=weights)
    for steps in (-1, 0, True, 2.5):
        with pytest.raises(ValueError, match="steps is a number of warm solves"):
            alm_warm.main(tmp_path, weights=[((12, 12), "dgram")], steps=steps)
    assert not list(tmp_path.iterdir())


def test_alm_warm_rows_are_certified_solves(tmp_path):
    out = alm_warm.main(tmp_path, weights=[((12, 12), "gram_oblique")], steps=2)
    assert (tmp_path / "alm_warm.json").exists()
    assert [r["stream"] for r in out["rows"]] == list(alm_warm.STREAMS)
    for r in out["rows"]:
        for arm in alm_warm.ARMS:
            solves = r[arm]["solves"]
            assert len(solves) == 2
            assert all(s["gap"] <= alm_warm.TOL and s["svd"] >= 1 and s["seconds"] > 0 for s in solves)
            assert r[arm]["ratio"] == pytest.approx(r[arm]["median_s"] / r["muon_fp32_s"])
    assert out["criterion"] == {"per_stream": {}, "holds": False}  # judged at 768 x 768 Oblique only


def _row(stream, ratio=10.0, gap=1e-7, exact_s=2.0):
    arm = dict(ratio=ratio, max_gap=gap, median_s=ratio * 0.1)
    return dict(shape=[768, 768], manifold="gram_oblique", stream=stream, alm_fixed=arm,
                exact=dict(ratio=exact_s / 0.1, max_gap=1e-7, median_s=exact_s))


def test_alm_warm_criterion():
    rows = [_row("rotating"), _row("mixture")]
    assert alm_warm.judge(rows) == {"per_stream": {"rotating": True, "mixture": True}, "holds": True}
    for change in (dict(ratio=25.0, exact_s=5.0), dict(gap=2e-6), dict(ratio=15.0, exact_s=1.0)):
        bad = copy.deepcopy(rows)
        bad[1] = _row("mixture", **change)
        assert alm_warm.judge(bad) == {"per_stream": {"rotating": True, "mixture": False}, "holds": False}
    assert alm_warm.judge(rows[:1])["holds"] is False  # one stream is not both
