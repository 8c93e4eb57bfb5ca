"""The page helpers of chapter 02 (Gram-space manifolds: Stiefel, DGram, Oblique).

Nothing here decides a verdict. The chapter states every constraint, dimension count and retraction test
it checks in its own cells, with the assertions; these functions only build inputs (exact rational points
of each manifold, the test points and tangents of the "sorted chamber" experiment) and lay results out
(tables, the retraction-order figure, the glued numbers of the absorption paragraph).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import sympy as sp
import torch

from .stated import glue_value, stated_table

__all__ = ["rational_point", "chamber_regimes", "retraction_table", "retraction_order_figure",
           "glue_absorption", "preconditioner_table", "multiplier_table"]

F64 = torch.float64


# ---------------------------------------------------------------------------------------------------------
# Exact points for the rational rank computation
# ---------------------------------------------------------------------------------------------------------

def _rational_stiefel(m: int, n: int, seed: int) -> sp.Matrix:
    """The first ``n`` columns of the Cayley transform ``(I - K)(I + K)^{-1}`` of a random rational skew
    ``K``: an exactly orthogonal rational matrix."""
    r = np.random.default_rng(seed)
    K = sp.Matrix(m, m, lambda i, j: 0)
    for i in range(m):
        for j in range(i + 1, m):
            q = sp.Rational(int(r.integers(-5, 6)), int(r.integers(1, 6)))
            K[i, j], K[j, i] = q, -q
    Q = (sp.eye(m) - K) * (sp.eye(m) + K).inv()                     # orthogonal, rational
    return Q[:, :n]


def _rational_unit(m: int, r) -> sp.Matrix:
    """A rational unit vector in R^m: inverse stereographic projection of a random rational point of R^(m-1)."""
    u = sp.Matrix([sp.Rational(int(r.integers(-7, 8)), int(r.integers(1, 5))) for _ in range(m - 1)])
    s = (u.T * u)[0]
    return sp.Matrix(list(2 * u) + [s - 1]) / (s + 1)


def rational_point(name: str, m: int, n: int, seed: int) -> sp.Matrix:
    """An exact rational ``m x n`` point of ``name`` ("Stiefel", "DGram" or "Oblique"): a Cayley-transform
    Stiefel point, the same with rational column scales (DGram), or ``n`` rational unit columns (Oblique)."""
    r = np.random.default_rng(seed)
    if name == "Oblique":
        return sp.Matrix.hstack(*[_rational_unit(m, r) for _ in range(n)])
    Q = _rational_stiefel(m, n, seed)
    if name == "Stiefel":
        return Q
    return Q * sp.diag(*[sp.Rational(int(r.integers(1, 9)), int(r.integers(1, 9))) for _ in range(n)])


# ---------------------------------------------------------------------------------------------------------
# Retractions
# ---------------------------------------------------------------------------------------------------------

def chamber_regimes(stiefel, dgram, gen, shape=(24, 8)) -> dict:
    """The three test cases of the post's DGram retraction, as ``{label: (W, V)}`` with unit (or basis)
    tangents ``V`` at ``W = Q diag(d)``: strictly decreasing column norms ``d`` from 2 to 0.6 and a random
    tangent; ``d_1 = d_2`` and the tangent ``q_2 e_2^T`` that grows the second column only; the decreasing
    norms reversed (increasing) and a random tangent. Draws from ``gen`` in that order."""
    m, n = shape
    Q = stiefel.random_point(shape, generator=gen, dtype=F64)
    d_sorted = torch.linspace(2.0, 0.6, n, dtype=F64)                 # strictly decreasing
    d_tie = d_sorted.clone()
    d_tie[1] = d_tie[0]                                                # d_1 = d_2
    regimes = {}
    W_in = Q * d_sorted
    V_in = dgram.project(W_in, torch.randn(m, n, generator=gen, dtype=F64))
    regimes["inside the chamber"] = (W_in, V_in / V_in.norm())
    W_wall = Q * d_tie
    V_wall = torch.zeros(m, n, dtype=F64)
    V_wall[:, 1] = Q[:, 1]                                             # grow column 2 only
    assert float(dgram.tangent_residual(W_wall, V_wall)) < 1e-12
    regimes["on a wall (tie)"] = (W_wall, V_wall)
    W_out = Q * d_sorted.flip(0)                                       # increasing norms
    V_out = dgram.project(W_out, torch.randn(m, n, generator=gen, dtype=F64))
    regimes["outside (unsorted)"] = (W_out, V_out / V_out.norm())
    return regimes


def retraction_table(rows: list[dict]):
    """Per retraction (the rows of the random-input experiment): the largest relative residual of R(X), whether
    every R(X) kept the singular values of X, the smallest and largest ||R(W) - W|| / ||W|| on DGram points.
    Returns the stated table and, for the chapter's assertions, the four per-retraction Series ``lands``,
    ``keeps``, ``moves`` (the smallest move) and ``moves_max`` (the largest)."""
    ret = pd.DataFrame(rows).groupby("retraction", sort=False)
    lands = ret["residual of R(X)"].max()
    keeps = ret["keeps singular values"].all()
    moves = ret["||R(W) - W|| / ||W|| on DGram"].min()
    moves_max = ret["||R(W) - W|| / ||W|| on DGram"].max()
    table = stated_table(pd.DataFrame({"lands on DGram (rel. residual < 1e-12)": lands < 1e-12,
                                       "keeps singular values of X": keeps,
                                       "identity on DGram": moves_max < 1e-12,
                                       "smallest ||R(W) - W|| / ||W||": moves}),
                         {"smallest ||R(W) - W|| / ||W||": ".3f"}, index=True)
    return table, lands, keeps, moves, moves_max


def retraction_order_figure(ts, errors: dict, slopes: dict):
    """The error ||R(W + tV) - (W + tV)|| against t, log-log, one line per retraction with its fitted slope,
    and t^2 for reference; glued as ``fig_retraction_order`` and closed."""
    import matplotlib.pyplot as plt
    from myst_nb import glue

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, e in errors.items():
        ax.loglog(ts, e, marker="o", ms=3, label=f"{label}: slope {slopes[label]:.2f}")
    ax.loglog(ts, ts**2, "k--", lw=1, label="t^2")
    ax.set_xlabel("step length t")
    ax.set_ylabel("||R(W + tV) - (W + tV)||_F")
    ax.legend(fontsize=8)
    glue("fig_retraction_order", fig, display=False)
    plt.close(fig)


def glue_absorption(kappa: pd.DataFrame, st20: pd.Series, eta: float, iso: dict) -> None:
    """Glue the numbers the absorption paragraph quotes: kappa at T = 20 per retraction, the Stiefel ratio
    e_A / e_W and its two factors (1 / eta, ||W_ref|| / ||A_ref||, 1 / kappa), and the isotropic fractions."""
    glue_value("kappa_st_20", float(kappa.loc["Stiefel (msign)", 20]), ".3f")
    glue_value("kappa_dg_20", float(kappa.loc["DGram (library)", 20]), ".3f")
    glue_value("kappa_post_20", float(kappa.loc["DGram (post)", 20]), ".3f")
    glue_value("ratio_st_20", float(st20["e_A / e_W"]), ".1f")
    glue_value("inv_eta", float(1 / eta), ".0f")
    glue_value("norm_ratio_st_20", float(st20["||W_ref|| / ||A_ref||"]), ".2f")
    glue_value("inv_kappa_st_20", float(1 / st20["kappa(T)"]), ".2f")
    glue_value("kappa_iso_st", iso["Stiefel"], ".3f")
    glue_value("kappa_iso_dg", iso["DGram"], ".3f")


def preconditioner_table(pre: pd.DataFrame):
    """Glue the largest cosine and the smallest column-norm rate of the B-RW-03 cases; the stated table."""
    glue_value("pre_cos_max", float(pre["cosine(DGram step, D-scaled Stiefel step)"].max()), ".3f")
    glue_value("pre_rate_min", float(pre["largest column-norm rate"].min()), ".3f")
    return stated_table(pre, {"seed": "d", "cosine(DGram step, D-scaled Stiefel step)": ".3f",
                              "largest column-norm rate": ".3f", "spread of D (max / min)": ".2f"})


def multiplier_table(models: dict, multiplier_size) -> pd.DataFrame:
    """One row per weight of ``models`` (``{model: {weight: (out, in)}}``): its shape and the size ``n`` of
    the multiplier ``multiplier_size(shape)`` returns."""
    return pd.DataFrame([{"model": model, "weight": name, "shape (out x in)": str(shape), "n": multiplier_size(shape)}
                         for model, weights in models.items() for name, shape in weights.items()])
