"""The page helpers of chapter 10 (manifold_muon_book.radii_pages): the inputs its checks use are what their
docstrings say, and the tables it asserts on are laid out as the page reads them."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import sympy as sp
import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon_book import radii_pages as pages


def test_rms_is_the_same_for_numpy_and_torch():
    A = np.arange(12.0).reshape(3, 4)
    assert math.isclose(pages.rms(A), math.sqrt(np.mean(A**2)))
    assert math.isclose(pages.rms(torch.from_numpy(A)), pages.rms(A), rel_tol=1e-15)


@pytest.mark.parametrize("m, n", [(2, 3), (3, 2), (1, 4)])
def test_commutation_maps_vec_of_a_matrix_to_vec_of_its_transpose(m, n):
    A = sp.Matrix(m, n, lambda i, j: sp.Symbol(f"a{i}{j}"))
    vec = lambda M: M.T.reshape(len(M), 1)  # column-major
    K = pages.commutation(m, n)
    assert K * vec(A) == vec(A.T)
    assert K.T * K == sp.eye(m * n)  # a permutation


def test_kron_norm_worst_is_rounding_and_draws_like_the_original_loop():
    a = np.random.default_rng(3)
    assert pages.kron_norm_worst(a, 25) < 1e-12
    c = np.random.default_rng(3)  # the states agree only if the helper drew what the chapter's old loop drew
    for _ in range(25):
        Tn, do, di = (int(v) for v in c.integers(1, 9, size=3))
        c.standard_normal((do, di)); c.choice([0.1, 1.0, 10.0])
    assert a.bit_generator.state == c.bit_generator.state


def test_layer_shapes_keeps_each_shape_once_under_its_first_label():
    from manifold_muon_lab.models.gpt2 import GPTConfig
    from manifold_muon_lab.models.qwen3 import Qwen3Config

    shapes = pages.layer_shapes(GPTConfig.gpt2_124m(), Qwen3Config.qwen3_120m())
    assert len(set(shapes.values())) == len(shapes)
    assert shapes["GPT-2 attn out"] == (768, 768) and "Qwen3-120M q/o" not in shapes  # 768 x 768 twice
    assert shapes["GPT-2 mlp down"] == (768, 3072) and shapes["GPT-2 mlp up"] == (3072, 768)


@pytest.mark.parametrize("shape", [(48, 32), (32, 48)])
def test_radius_cases_are_the_points_the_chapter_describes(shape):
    do, di = shape
    cases = pages.radius_cases(do, di, torch.Generator().manual_seed(0))
    assert list(cases) == ["frobenius_sphere", "output_oblique_sphere", "input_oblique_sphere", "spectral_sphere",
                           "spectral, flat spectrum", "frobenius, rank one"]
    assert all(W.shape == shape and W.dtype == torch.float32 for W in cases.values())
    for name in ("frobenius_sphere", "output_oblique_sphere", "input_oblique_sphere", "spectral_sphere"):
        assert float(get_manifold(name).residual(cases[name].double()).max()) < 1e-5, name
    R_spec = get_manifold("spectral_sphere").radius(shape)
    s_flat = torch.linalg.svdvals(cases["spectral, flat spectrum"].double())
    assert torch.allclose(s_flat, torch.full_like(s_flat, R_spec), rtol=1e-5)  # every singular value R_spec
    s_r1 = torch.linalg.svdvals(cases["frobenius, rank one"].double())
    R_fro = get_manifold("frobenius_sphere").radius(shape)
    assert math.isclose(float(s_r1[0]), R_fro, rel_tol=1e-5) and float(s_r1[1]) < 1e-5 * R_fro  # rank one
    for W in cases.values():
        assert math.isclose(pages.top_singular(W), float(torch.linalg.matrix_norm(W.double(), 2)), rel_tol=1e-4)


def test_lambda_min_frame_shows_the_exact_zero_of_a_rank_deficient_sigma():
    table, computed = pages.lambda_min_frame(torch.Generator().manual_seed(0), di=16, Ts=(8, 16, 64))
    assert list(table["T"]) == [8, 16, 64] and len(computed) == 3
    assert table["λ_min(Σ_X)"].iloc[0] == 0.0 and abs(computed[0]) < 1e-12  # T < D_in: rank T
    assert table["λ_min(Σ_X)"].iloc[2] == computed[2] > 0
    assert math.isclose(table["Bai–Yin (1 - √(D_in/T))²"].iloc[2], 0.25)


def test_glue_all_glues_each_value_at_its_format(monkeypatch):
    glued = []
    monkeypatch.setattr("manifold_muon_book.stated.glue_value", lambda *args: glued.append(args))
    pages.glue_all(a=(np.float64(0.5), ".3f"), b=(np.int64(7), "d"))
    assert glued == [("a", 0.5, ".3f"), ("b", 7, "d")]
    assert type(glued[0][1]) is float and type(glued[1][1]) is int


def _bench():
    spectra = lambda k: {"layers.0.attn.q_proj.weight": {"d_min": 64, "kappa": k, "cond_inv": 0.1},
                         "layers.0.mlp.down_proj.weight": {"d_min": 64, "kappa": 2 * k, "cond_inv": 0.01},
                         "embed.weight": {"d_min": 64, "kappa": 99.0, "cond_inv": 0.5}}
    run = lambda opt, seed, group: {"coords": {"group": group, "optimizer": opt}, "seed": seed,
                                    "spectra_start": spectra(1.0), "spectra_end": spectra(1.5 + seed)}
    return {"runs": [run("muon", 0, "table4"), run("muon", 1, "table4"), run("macro_fro", 0, "table4"),
                     run("muon", 0, "other")]}


def test_stable_rank_frame_keeps_the_block_matrices_of_table4_runs():
    srk = pages.stable_rank_frame(_bench())
    assert len(srk) == 3 * 2 * 2  # three table4 runs, start and end, two block matrices (no embedding)
    assert set(srk.layer) == {"q_proj", "down_proj"} and 99.0 not in set(srk.kappa)


def test_kappa_table_has_one_row_per_optimizer_and_a_format_per_column():
    tab, formats = pages.kappa_table(pages.stable_rank_frame(_bench()))
    assert list(tab.optimizer) == ["macro_fro", "muon"]
    muon = tab.set_index("optimizer").loc["muon"]
    assert muon["kappa_max (end)"] == 2 * 2.5 and muon["kappa_median (start)"] == 1.5
    assert muon["smallest_cond_inv (end)"] == 0.01
    assert set(formats) == set(tab.columns) - {"optimizer"}
    assert formats["kappa_max (end)"] == ".2f" and formats["smallest_cond_inv (start)"] == ".0e"


def test_radii_table_is_one_row_per_layer_and_one_column_per_constraint():
    radii = pd.DataFrame([dict(layer=l, D_out=2, D_in=3, **{"constraint (r = 1)": c, "RMS(Y), random X": v,
                                                            "worst-case RMS(Y)": 1.0})
                          for l, c, v in (("b", "x", 0.5), ("b", "y", 0.25), ("a", "x", 1.0), ("a", "y", 2.0))])
    table = pages.radii_table(radii)
    assert list(table.columns) == ["layer", "D_out", "D_in", "x", "y"] and list(table.layer) == ["b", "a"]
    assert list(table.x) == ["0.500", "1.000"]
