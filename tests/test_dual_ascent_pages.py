"""The page helpers of chapter 03 (manifold_muon_book.dual_ascent_pages): the grid, the fit, the widening loop,
the numbers read off a sweep, the retraction study's summaries and the problems, on small known inputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from manifold_muon_book import dual_ascent_pages as pages

NS, TALL = "square, Newton-Schulz W", "tall, exact W"


def test_the_grid_is_the_posts_interval_in_eleven_log_steps():
    g = pages.POST_GRID
    assert len(g) == 11 and g[0] == 0.002 and g[-1] == 0.5
    assert np.allclose(np.diff(np.log(g)), np.log(250) / 10, rtol=1e-4)
    assert 0.01 not in set(g) and 0.1 not in set(g)  # the post's two quoted values are added beside it


def _sweep(alpha_of_best: dict, alphas) -> pd.DataFrame:
    """Rows whose final violation is smallest at alpha_of_best[(kind, n)] (a V in log alpha)."""
    return pd.DataFrame([{"construction": k, "n": n, "alpha": a, "final": abs(np.log(a / best)) + 1e-3}
                         for (k, n), best in alpha_of_best.items() for a in alphas])


def test_the_fit_recovers_a_known_power_law():
    alphas = [0.003 * n**0.67 for n in (32, 64, 128)]
    best = pages.best_alpha(_sweep({(TALL, n): a for n, a in zip((32, 64, 128), alphas)}, alphas))
    sub, a, b = pages.fit_exponent(best, TALL)
    assert list(sub.index) == [32, 64, 128]
    assert a == pytest.approx(0.003) and b == pytest.approx(0.67)


def test_widening_doubles_the_top_until_every_tall_optimum_is_interior():
    optimum = {32: 1.3, 64: 2.6, 128: 3.1}  # the true best step: beyond the grid's 0.5 at every size
    calls = []

    def sweep_rows(kind, n, alpha):
        calls.append(alpha)
        return {"construction": kind, "n": n, "alpha": alpha, "final": abs(np.log(alpha / optimum[n])) + 1e-3}

    grid = pd.DataFrame([sweep_rows(k, n, a) for k in (NS, TALL) for n in optimum for a in (0.25, 0.5)])
    calls.clear()
    wide, best_w, top = pages.widen_until_interior(grid, sweep_rows, [NS, TALL], list(optimum))
    assert top == 8                                   # 4 is the best at n = 128 (3.1), so one more doubling
    assert sorted(set(calls)) == [1.0, 2.0, 4.0, 8.0] and len(calls) == 4 * 2 * 3
    assert [best_w.loc[(TALL, n), "alpha"] for n in optimum] == [1.0, 2.0, 4.0]
    assert len(wide) == len(grid) + len(calls)
    _, _, top_capped = pages.widen_until_interior(grid, sweep_rows, [NS, TALL], list(optimum), cap=2)
    assert top_capped == 2                            # the cap stops it even where the optimum is at the top


def test_at_n64_reads_the_best_on_the_grid_and_the_quoted_alphas():
    alphas = sorted(set(pages.POST_GRID.tolist()) | {0.01, 0.1})
    rows = pd.DataFrame([{"alpha": a, "final": 1 / (1 + a), "peak": 2 * a, "peak_step": int(100 * a)} for a in alphas])
    best, a001, a01, peak01, step01 = pages.at_n64(rows)
    assert best == pytest.approx(1 / 1.5)             # the grid's largest alpha, 0.5: the off-grid ones do not count
    assert (a001, a01, peak01, step01) == (pytest.approx(1 / 1.01), pytest.approx(1 / 1.1), pytest.approx(0.2), 10)


def test_retraction_rows_flatness_and_the_ra03_evidence():
    e_A, e_W = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.01, 0.01, 0.02])
    row = pages.retraction_row(TALL, 16, 20, e_A, e_W, 1.25 * e_W)
    assert row["e_A"] == pytest.approx(0.2) and row["e_A / e_W"] == pytest.approx(15)
    assert row["retraction factor e_step / e_W"] == pytest.approx(1.25)
    ret = pd.DataFrame([{"construction": k, "n": n, "T": T, "e_A": 1 / T, "e_W": (2 if T == 5 else 1) / T}
                        for k in (NS, TALL) for n in (16, 32) for T in (5, 20, 100)])
    flat, falls = pages.flatness(ret, [NS, TALL], [16, 32])
    assert len(flat) == 4 and all(v == pytest.approx(40.0) for v in flat.values()) and falls
    t20 = pd.DataFrame({"construction": [NS, NS, TALL, TALL], "n": [16, 32, 16, 32], "e_A": [0.5, 0.4, 0.1, 0.2],
                        "e_W": [0.03, 0.02, 0.008, 0.012]}).set_index(["construction", "n"])
    evidence, tall_eA, tall_eW = pages.ra03_evidence(t20["e_A"], t20["e_W"])
    assert evidence == {"tall_in": False, "tall_near": True, "ordering": True}   # e_W 0.012 > 0.01, within 1.5x
    assert list(tall_eA) == [0.1, 0.2] and list(tall_eW) == [0.008, 0.012]


def test_the_problems_are_seeded_per_size_and_seed_and_have_their_construction():
    W, G = pages.problem(8, 1, TALL)
    W2, G2 = pages.problem(8, 1, TALL)
    assert W.shape == G.shape == (16, 8) and torch.equal(W, W2) and torch.equal(G, G2)
    assert torch.allclose(W.mT @ W, torch.eye(8), atol=1e-5)           # the exact W is on the manifold
    Wns, _ = pages.problem(8, 1, NS)
    assert Wns.shape == (8, 8) and not torch.allclose(Wns.mT @ Wns, torch.eye(8), atol=1e-3)  # five NS steps: not
    Ws, Gs = pages.batch(8, TALL, [0, 1, 2])
    assert Ws.shape == (3, 16, 8) and torch.equal(Ws[1], W) and torch.equal(Gs[1], G)


def test_the_verdict_prose_quotes_what_it_is_given():
    grows = {TALL: [0.5, 1.0, 2.0], NS: [0.29, 0.5, 1.0]}
    text = pages.reason_da03(0.019, 0.35, [32, 1024], False, 0.77, 0.51, 0.81, grows, True, 3e-7, 4)
    assert "n = 32..1024" in text and "from 0.019 to 0.35, though not with every doubling" in text
    assert "exponent is 0.77, between 0.51 and 0.81" in text and "4 seeds" in text and "order 1e-07" in text
    assert "0.5, 1, 2 for the tall" in text and "non-decreasing in both" in text
    assert "with every doubling of n" in pages.reason_da03(0.01, 0.3, [32, 64], True, 1, 0.5, 1.5, grows, True, 1e-7, 4)
    assert "not monotone" in pages.reason_da03(0.01, 0.3, [32, 64], True, 1, 0.5, 1.5, {TALL: [1, 1, 1]}, False, 1e-7, 4)
    assert pages.reason_da12(25.7, 19.6, 0.03, 9.5, [2e-6, 3e-4], True).startswith(
        "Exact arithmetic on the fit: 25.7x the default at n = 768 (19.6x at n = 512)")
    assert "3x to 950x the default" in pages.reason_da12(25.7, 19.6, 0.03, 9.5, [2e-6, 3e-4], False)


def _scaling_rows(moving_seeds=(0,), flat_seeds=(1,)):
    """Synthetic finals of the run dual_ascent_scaling at n = 32..256 on the grid k = -28..0: a moving seed's are
    smallest at k = round(4 * 0.67 log2 n) - 30 (exponent 0.67), a flat seed's at k = -20 for every n (exponent 0)."""
    import math

    rows = []
    for n in [32, 64, 128, 256]:
        k_opt = round(4 * 0.67 * math.log2(n)) - 30
        for k in range(-28, 1):
            rows += [{"n": n, "k": k, "alpha": 2.0 ** (k / 4), "seed": s, "final": 1 + (k - k_opt) ** 2}
                     for s in moving_seeds]
            rows += [{"n": n, "k": k, "alpha": 2.0 ** (k / 4), "seed": s, "final": 1 + 1e-4 * (k + 20) ** 2}
                     for s in flat_seeds]
    return rows


def test_scaling_fit_reads_the_exponent_the_criterion_defines():
    """``scaling_fit`` on finals whose mean is smallest at alpha = 2^(k/4) with k = round(4 * 0.67 log2 n) - 30: the
    exponent it fits is that of the optima (within one grid step's resolution of 0.67), every optimum is interior,
    and a seed whose own optima do not move with n gets an exponent of 0."""
    rows = _scaling_rows()
    fit = pages.scaling_fit(pd.DataFrame(rows))
    assert fit["interior"] and abs(fit["b"] - 0.67) <= fit["resolution"]
    assert abs(fit["b_seeds"][1]) < 1e-12 and abs(fit["b_seeds"][0] - 0.67) <= fit["resolution"]
    edge = pd.DataFrame([r for r in rows if not (r["n"] == 256 and r["k"] > round(4 * 0.67 * 8) - 30)])
    assert not pages.scaling_fit(edge)["interior"]  # n = 256's optimum now on its grid's upper edge


def test_scaling_bootstrap_resamples_the_seeds_of_the_mean_curve():
    """``scaling_bootstrap`` refits the mean curve's optima on every ordered draw of the seeds with replacement: s^s
    values; the draw of all seeds once each is the plain fit, and a draw of one seed alone is that seed's own fit."""
    rows = _scaling_rows(moving_seeds=(0, 2), flat_seeds=(1,))
    frame = pd.DataFrame(rows)
    boot = pages.scaling_bootstrap(frame)
    fit = pages.scaling_fit(frame)
    assert len(boot) == 27
    assert abs(boot[1 * 9 + 1 * 3 + 1] - fit["b_seeds"][1]) < 1e-12 and abs(boot[1 * 9 + 1 * 3 + 1]) < 1e-12  # (1, 1, 1)
    assert abs(boot[0 * 9 + 1 * 3 + 2] - fit["b"]) < 1e-12                                                  # (0, 1, 2)
    assert boot.min() < 1e-12 and abs(boot.max() - fit["b_seeds"][0]) < 1e-12
