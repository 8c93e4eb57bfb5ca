"""The tracked-Newton prototype's command line (issue 19): bad input refused before any work, a small run works."""

import pytest

from manifold_muon_book.bench.lean_newton import _cli


@pytest.mark.parametrize("args, message", [(["384by128"], "two positive integers"), (["0x8"], "two positive integers"),
                                           (["16x8", "stiefel", "zero"], "steps must be"),
                                           (["16x8", "stiefel", "3", "x"], "at most three")])
def test_bad_arguments_are_refused_with_the_usage(args, message):
    with pytest.raises(SystemExit, match=message):
        _cli(args)


def test_a_small_oblique_run_reports_every_arm_against_muon():
    out = _cli(["16x8", "gram_oblique", "3"])
    assert set(out) == {"muon_e_W", "newton-cg3", "newton-cg5", "newton-cg10", "lean (ADMM-1)", "lean_cold"}
    assert all(v >= 0 for v in out.values()) and out["muon_e_W"] > 0
