"""The page helpers of chapter 10 (activation radii: spectral versus Frobenius, ``chapters/10_activation_radii.md``).

Nothing here decides a verdict. The chapter runs every check it states (the SymPy derivations, the random
inequality checks, the assertions on each measurement) in its own cells. What is here is plumbing:

* inputs of the checks: ``rms``, ``commutation`` (a commutation matrix for Lemma 2), ``kron_norm_worst`` (the
  worst relative error of Lemma 2's two norm identities at random shapes, which the chapter asserts on), ``layer_shapes`` (the
  distinct weight shapes of GPT-2 small and Qwen3-120M), ``radius_cases`` and ``top_singular``;
* the tables of measurements the chapter asserts on, each drawing from the generator it is given in the order
  the original cells drew (so that moving the loops here changed no number): ``condition_frame``,
  ``baiyin_frame``, ``attenuation_frame``, ``monte_carlo_frame``, ``lambda_min_frame``, ``radii_frame``,
  ``init_frame``, and ``stable_rank_frame`` (from the benchmark's run record);
* layout: ``FORMATS`` (each table's column formats), ``radii_table``, ``kappa_table``, ``glue_all`` (several
  ``stated.glue_value`` calls at once) and the two figures ``baiyin_figure`` and ``radii_figure``, returned
  unpublished (the chapter calls ``figures.publish``).
"""

from __future__ import annotations

__all__ = ["glue_all", "rms", "commutation", "condition_frame", "baiyin_frame", "attenuation_frame", "monte_carlo_frame",
           "lambda_min_frame",
           "layer_shapes", "radius_cases", "top_singular", "radii_frame", "init_frame", "FORMATS", "radii_table", "radii_figure", "baiyin_figure",
           "stable_rank_frame", "kappa_table", "RADII_ORDER"]

# The column formats of the chapter's tables, at the precision its prose states.
FORMATS = {
    "cond": {"σ_min / σ_max (mean of 4)": ".4f", "n · σ_min / σ_max": ".2f"},
    "baiyin": {"D_out / D_in": "g", "||W||_2 / (√D_out + √D_in)": ".4f", "(||W||_F/||W||_2) / limit (30)": ".4f"},
    "atten": {c: ".4f" for c in ["||W||_2", "(1 + √(D_out/D_in)) / √D_in", "RMS(Y)", "1 / √D_in"]},
    "mc": {"E||Y||_F^2 (MC)": ".4f", "T σ_x² ||W||_F²": ".4f", "MC std. error": ".4f",
           "1 - E[RMS] / sqrt(E[RMS²])": ".2e"},
    "lam": {"λ_min(Σ_X)": ".2e", "Bai–Yin (1 - √(D_in/T))²": ".4f"},
    # r of (43) to two decimals: for GPT-2 mlp down it is 0.49950 in float32, at the rounding boundary of the third
    "init": {"r of (43), measured": ".2f", "min(√(D_out/D_in), 1)": ".3f", "r of N(0, 1/D_out), measured": ".3f",
             "√(D_in/D_out)": ".3f"},
}

# The constraints of the radii figure, in the order of its legend.
RADII_ORDER = ["spectral_sphere", "spectral, flat spectrum", "frobenius_sphere", "output_oblique_sphere",
               "input_oblique_sphere", "frobenius, rank one"]


def glue_all(**values) -> None:
    """``glue_value(name, value, fmt)`` for each ``name=(value, fmt)``, in the order given."""
    from .stated import glue_value

    for name, (value, fmt) in values.items():
        glue_value(name, float(value) if not fmt.endswith("d") else int(value), fmt)


def rms(A) -> float:
    """||vec(A)||_RMS = ||A||_F / sqrt(number of entries), of a numpy array or a torch tensor."""
    import numpy as np
    import torch

    return float(np.sqrt(np.mean(np.asarray(A) ** 2))) if not torch.is_tensor(A) else float(A.pow(2).mean().sqrt())


def commutation(m: int, n: int):
    """The SymPy commutation matrix K with K vec_col(A) = vec_col(A^T) for A of shape (m, n)."""
    import sympy as sp

    K = sp.zeros(m * n, m * n)
    for i in range(m):
        for j in range(n):
            K[i * n + j, j * m + i] = 1
    return K


def kron_norm_worst(rng, n: int) -> float:
    """The largest relative error of ``||W kron I_T||_2 = ||W||_2`` and ``||W kron I_T||_F = sqrt(T) ||W||_F`` over
    ``n`` random ``(T, D_out, D_in)`` in ``1..8`` and scales 0.1, 1, 10, drawn from ``rng`` in the order the
    chapter's original loop drew them."""
    import numpy as np

    worst = 0.0
    for _ in range(n):
        Tn, do, di = (int(v) for v in rng.integers(1, 9, size=3))
        Wn = rng.standard_normal((do, di)) * rng.choice([0.1, 1.0, 10.0])
        K = np.kron(Wn, np.eye(Tn))
        worst = max(worst, abs(np.linalg.norm(K, 2) / np.linalg.norm(Wn, 2) - 1),
                    abs(np.linalg.norm(K) / (np.sqrt(Tn) * np.linalg.norm(Wn)) - 1))
    return worst


def condition_frame(gen):
    """sigma_min / sigma_max of Gaussian (rho n) x n matrices (float64, drawn from ``gen``): per n in 32, 64, 128,
    256 and rho = D_out / D_in in 1, 4, the mean over four draws, and n times that mean."""
    import numpy as np
    import pandas as pd
    import torch

    rows = []
    for n in (32, 64, 128, 256):
        for rho in (1, 4):
            ratios = []
            for _ in range(4):
                s = torch.linalg.svdvals(torch.randn(rho * n, n, generator=gen, dtype=torch.float64))
                ratios.append(float(s[-1] / s[0]))
            m = float(np.mean(ratios))
            rows.append({"D_in": n, "D_out / D_in": rho, "σ_min / σ_max (mean of 4)": m, "n · σ_min / σ_max": n * m})
    return pd.DataFrame(rows)


def baiyin_frame(gen):
    """The two Bai-Yin ratios of Gaussian D_out x D_in matrices (float64, drawn from ``gen``), mean of four draws,
    for D_out / D_in in 1/4, 1, 4 and D_in in 16, ..., 256: ||W||_2 / (sqrt(D_out) + sqrt(D_in)), and
    (||W||_F / ||W||_2) divided by its limit (30), sqrt(D_out) / (1 + sqrt(D_out / D_in))."""
    import math

    import numpy as np
    import pandas as pd
    import torch

    rows = []
    for rho in (0.25, 1.0, 4.0):
        for di in (16, 32, 64, 128, 256):
            do = int(rho * di)
            spec_ratio, fro_ratio = [], []
            for _ in range(4):
                s = torch.linalg.svdvals(torch.randn(do, di, generator=gen, dtype=torch.float64))
                spec_ratio.append(float(s[0]) / (math.sqrt(do) + math.sqrt(di)))
                fro_ratio.append(float(s.norm() / s[0]) / (math.sqrt(do) / (1 + math.sqrt(do / di))))
            rows.append({"D_out / D_in": rho, "D_in": di, "D_out": do,
                         "||W||_2 / (√D_out + √D_in)": float(np.mean(spec_ratio)),
                         "(||W||_F/||W||_2) / limit (30)": float(np.mean(fro_ratio))})
    return pd.DataFrame(rows)


def attenuation_frame(gen):
    """What the worst-case Frobenius radius (28), R = sqrt(D_out / D_in), does to a layer, for D_out x D_in in
    256 x 256, 1024 x 256 and 64 x 256: a random point of that sphere and 64 Gaussian tokens (float64, from ``gen``,
    in that order per shape); its ||W||_2 beside the Bai-Yin prediction (1 + sqrt(D_out/D_in)) / sqrt(D_in), and the
    output RMS ratio RMS(Y) / RMS(X) beside 1 / sqrt(D_in)."""
    import math

    import pandas as pd
    import torch

    from manifold_muon.manifolds import get_manifold

    rows = []
    for do, di in ((256, 256), (1024, 256), (64, 256)):
        fro_small = get_manifold("frobenius_sphere", radius=math.sqrt(do / di))
        Wt = fro_small.random_point((do, di), generator=gen, dtype=torch.float64)
        Xt = torch.randn(64, di, generator=gen, dtype=torch.float64)
        rows.append({"D_out": do, "D_in": di, "||W||_2": float(torch.linalg.matrix_norm(Wt, 2)),
                     "(1 + √(D_out/D_in)) / √D_in": (1 + math.sqrt(do / di)) / math.sqrt(di),
                     "RMS(Y)": rms(Xt @ Wt.T) / rms(Xt), "1 / √D_in": 1 / math.sqrt(di)})
    return pd.DataFrame(rows)


def monte_carlo_frame(W, T: int, sx: float, n_mc: int, gen, target: float):
    """Monte Carlo of (31) and (32) for a fixed ``W`` (float64): ``n_mc`` inputs of ``T`` rows with Gaussian entries,
    then ``n_mc`` with Rademacher entries (both times ``sx``, the same second moment; drawn from ``gen`` in that
    order). Per distribution: the mean of ||Y||_F^2 beside ``target`` = T sx^2 ||W||_F^2, its standard error, and
    the Jensen gap 1 - E[RMS] / sqrt(E[RMS^2]) of the output RMS."""
    import math

    import pandas as pd
    import torch

    do, di = W.shape
    draws = (("Gaussian", lambda: torch.randn(n_mc, T, di, generator=gen, dtype=torch.float64)),
             ("Rademacher", lambda: torch.randint(0, 2, (n_mc, T, di), generator=gen).double() * 2 - 1))
    rows = []
    for name, draw in draws:
        energy = (sx * draw() @ W.T).pow(2).sum(dim=(1, 2))
        rms_b = (energy / (T * do)).sqrt()
        rows.append({"rows of X": name, "E||Y||_F^2 (MC)": float(energy.mean()), "T σ_x² ||W||_F²": target,
                     "MC std. error": float(energy.std() / math.sqrt(n_mc)),
                     "1 - E[RMS] / sqrt(E[RMS²])": 1 - float(rms_b.mean()) / math.sqrt(float(energy.mean()) / (T * do))})
    return pd.DataFrame(rows)


def lambda_min_frame(gen, di: int = 128, Ts=(64, 128, 256, 512, 1024)):
    """lambda_min(Sigma_X) of T Gaussian tokens of width ``di`` (float64, drawn from ``gen``) per T in ``Ts``, beside
    the Bai-Yin limit (1 - sqrt(D_in / T))^2. Returned: the table, where T < D_in shows the exact 0 that the rank
    gives (the computed value is rounding noise whose digits differ from CPU to CPU), and the computed values."""
    import math

    import pandas as pd
    import torch

    rows, computed = [], []
    for Tn in Ts:
        Xt = torch.randn(Tn, di, generator=gen, dtype=torch.float64)
        lam_min = float(torch.linalg.eigvalsh(Xt.T @ Xt / Tn)[0])
        computed.append(lam_min)
        rows.append({"T": Tn, "D_in": di, "λ_min(Σ_X)": 0.0 if Tn < di else lam_min,
                     "Bai–Yin (1 - √(D_in/T))²": (1 - math.sqrt(di / Tn)) ** 2 if Tn >= di else 0.0})
    return pd.DataFrame(rows), computed


def layer_shapes(gpt2, qwen3) -> dict:
    """``{layer: (D_out, D_in)}``: every distinct weight shape of GPT-2 small (``gpt2``, a ``GPTConfig``) and of
    the paper's 120M Qwen3 (``qwen3``, a ``Qwen3Config``), each shape once under the first label that has it
    (Qwen3-120M's query and output projections are 768 x 768, GPT-2's attention output, and are left out)."""
    g, q = gpt2, qwen3
    shapes = {
        "GPT-2 attn qkv": (3 * g.n_embd, g.n_embd), "GPT-2 attn out": (g.n_embd, g.n_embd),
        "GPT-2 mlp up": (4 * g.n_embd, g.n_embd), "GPT-2 mlp down": (g.n_embd, 4 * g.n_embd),
        "Qwen3-120M q/o": (q.n_head * q.head_dim, q.n_embd), "Qwen3-120M k/v": (q.n_kv_head * q.head_dim, q.n_embd),
        "Qwen3-120M gate/up": (q.ffn_dim, q.n_embd), "Qwen3-120M down": (q.n_embd, q.ffn_dim),
    }
    distinct = {}
    for label, shape in shapes.items():
        if shape not in distinct.values():
            distinct[label] = shape
    return distinct


def radius_cases(do: int, di: int, gen) -> dict:
    """``{constraint: W}`` at r = 1 for a ``do x di`` layer (float32), drawn from ``gen`` in this order: a random
    point of the Frobenius sphere and of both oblique spheres (``get_manifold(name).random_point``); one of the
    spectral sphere (for a wide shape the transpose of a tall one at the same radius: the same set of points, a
    cheaper SVD); a flat-spectrum spectral weight, all singular values R_spec (orthonormal columns from a QR,
    what a Muon-type update tends toward); and the rank-one point of the Frobenius sphere."""
    import torch

    from manifold_muon.manifolds import get_manifold

    cases = {name: get_manifold(name).random_point((do, di), generator=gen)
             for name in ("frobenius_sphere", "output_oblique_sphere", "input_oblique_sphere")}
    R_spec = get_manifold("spectral_sphere").radius((do, di))
    tall = get_manifold("spectral_sphere", radius=R_spec).random_point((max(do, di), min(do, di)), generator=gen)
    cases["spectral_sphere"] = tall if do >= di else tall.mT
    Q = torch.linalg.qr(torch.randn(max(do, di), min(do, di), generator=gen))[0]   # orthonormal columns
    cases["spectral, flat spectrum"] = R_spec * (Q if do >= di else Q.mT)
    R_fro = get_manifold("frobenius_sphere").radius((do, di))
    u1, v1 = torch.randn(do, 1, generator=gen), torch.randn(1, di, generator=gen)
    cases["frobenius, rank one"] = R_fro * (u1 @ v1) / (u1 @ v1).norm()
    return cases


def top_singular(W) -> float:
    """sigma_max(W), from the largest eigenvalue of the smaller Gram matrix (cheap at 3072 x 768)."""
    import torch

    do, di = W.shape
    return float(torch.linalg.eigvalsh(W.T @ W if do >= di else W @ W.T)[-1]) ** 0.5


def init_frame(shapes: dict, gen):
    """r = ||W_0||_F / sqrt(D_out) of one float32 Gaussian draw per layer of ``shapes`` (from ``gen``), at the std of
    equation (43), min(sqrt(D_out / D_in), 1) / sqrt(D_in), and at Wen et al.'s N(0, 1/D_out), beside the values
    the algebra predicts, min(sqrt(D_out / D_in), 1) and sqrt(D_in / D_out). Indexed by layer."""
    import math

    import pandas as pd
    import torch

    rows = []
    for label, (do, di) in shapes.items():
        sig43 = min(math.sqrt(do / di), 1) / math.sqrt(di)
        r43 = float((torch.randn(do, di, generator=gen) * sig43).norm()) / math.sqrt(do)
        r_wen = float((torch.randn(do, di, generator=gen) / math.sqrt(do)).norm()) / math.sqrt(do)
        rows.append({"layer": label, "D_out": do, "D_in": di, "r of (43), measured": r43,
                     "min(√(D_out/D_in), 1)": min(math.sqrt(do / di), 1), "r of N(0, 1/D_out), measured": r_wen,
                     "√(D_in/D_out)": math.sqrt(di / do)})
    return pd.DataFrame(rows).set_index("layer", drop=False)


def radii_frame(shapes: dict, gen, t_tok: int):
    """One row per layer of ``shapes`` and constraint of ``radius_cases``: ``t_tok`` Gaussian tokens (float32, from
    ``gen``, drawn before the layer's weights) scaled to unit RMS, the output RMS rms(X W^T) they get, and the worst
    case over all inputs of unit RMS, sqrt(D_in / D_out) sigma_max(W) (attained by tokens along v_1)."""
    import math

    import pandas as pd
    import torch

    rows = []
    for label, (do, di) in shapes.items():
        Xt = torch.randn(t_tok, di, generator=gen)
        Xt = Xt / rms(Xt)
        for case, Wt in radius_cases(do, di, gen).items():
            rows.append({"layer": label, "D_out": do, "D_in": di, "constraint (r = 1)": case,
                         "RMS(Y), random X": rms(Xt @ Wt.T), "worst-case RMS(Y)": math.sqrt(di / do) * top_singular(Wt)})
    return pd.DataFrame(rows)


def radii_table(radii):
    """The measured random-input RMS, one row per layer shape, one column per constraint, at 3 decimals."""
    from .stated import stated_table

    wide = radii.pivot_table(index=["layer", "D_out", "D_in"], columns="constraint (r = 1)",
                             values="RMS(Y), random X", sort=False)
    return stated_table(wide.reset_index(), default=".3f")


def radii_figure(radii):
    """Two bar charts per layer shape and constraint: the output RMS for random inputs, and the worst case
    (log scale); the dashed line is the target 1."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=False)
    for ax, col in zip(axes, ("RMS(Y), random X", "worst-case RMS(Y)")):
        sns.barplot(data=radii, x="layer", y=col, hue="constraint (r = 1)", hue_order=RADII_ORDER, ax=ax)
        ax.set_xlabel("")
        ax.tick_params(axis="x", rotation=60, labelsize=8)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
    axes[1].set_yscale("log")
    axes[0].get_legend().remove()
    axes[1].legend(fontsize=7, loc="upper left")
    return fig


def baiyin_figure(baiyin):
    """The relative excess of ||W||_F / ||W||_2 over its Bai-Yin limit (30) against D_in, log-log, one line per
    aspect ratio, with a slope -2/3 line for reference."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for rho, grp in baiyin.groupby("D_out / D_in"):
        ax.loglog(grp["D_in"], grp["(||W||_F/||W||_2) / limit (30)"] - 1, "o-", label=f"D_out / D_in = {rho:g}")
    ns = np.array([16, 256])
    ax.loglog(ns, 0.3 * ns ** (-2 / 3.0), "k--", lw=1, label="slope -2/3, for reference")
    sizes = sorted(baiyin["D_in"].unique())
    ax.set_xticks(sizes, [str(n) for n in sizes])   # the measured sizes, without overlapping minor labels
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("D_in")
    ax.set_ylabel("relative excess over limit (30)")
    ax.legend(fontsize=8)
    return fig


def stable_rank_frame(bench):
    """One row per attention or MLP matrix of each ``table4`` run of the benchmark record ``bench``, at its
    first (``when="start"``) and last step: optimizer, seed, layer type, d_min = min(D_in, D_out),
    kappa = d_min / srk and cond_inv = sigma_min / sigma_max, as the run recorded them."""
    import pandas as pd

    from .paper_runs import LAYER_TYPES, layer_type

    rows = []
    for r in bench["runs"]:
        if r["coords"]["group"] != "table4":
            continue
        for when in ("start", "end"):
            for name, v in r[f"spectra_{when}"].items():
                if layer_type(name) in LAYER_TYPES:
                    rows.append(dict(optimizer=r["coords"]["optimizer"], seed=r["seed"], when=when,
                                     layer=layer_type(name), d_min=v["d_min"], kappa=v["kappa"],
                                     cond_inv=v["cond_inv"]))
    return pd.DataFrame(rows)


def kappa_table(srk):
    """Per optimizer, at the start and the end: median and largest kappa, smallest sigma_min / sigma_max;
    returned with the formats its columns are shown at (kappa at 2 decimals, the ratio as 1 digit)."""
    tab = (srk.groupby(["optimizer", "when"]).agg(kappa_median=("kappa", "median"), kappa_max=("kappa", "max"),
                                                  smallest_cond_inv=("cond_inv", "min"))
           .unstack("when"))
    tab.columns = [f"{a} ({b})" for a, b in tab.columns]
    tab = tab.reset_index()
    formats = ({c: ".2f" for c in tab.columns if c.startswith("kappa")}
               | {c: ".0e" for c in tab.columns if c.startswith("smallest")})
    return tab, formats
