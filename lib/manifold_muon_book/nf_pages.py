"""The page helpers of chapter 11 (training without normalisation layers): what turns run records into
frames, frames into the tables a reader sees, and frames into figures.

Nothing here decides a verdict. The chapter computes every statistic it checks and asserts it in its own
cells; these functions only gather inputs (``sweep_frame``, ``gains_frame``, ``run_settings``), lay
results out (``*_table``, ``*_figure``) and glue the numbers the prose quotes (``glue_*``), so that the page
shows the checks and not the formatting.
"""

from __future__ import annotations

__all__ = ["OPT_NAMES", "norms_of", "norm_table", "cascade_figure", "sweep_frame", "sweep_table",
           "sweep_figure", "growth_frame", "growth_table", "run_settings", "arm_table", "gains_frame",
           "gain_table", "gain_slopes", "vs_normed_table", "glue_cascade", "glue_sweep", "glue_growth",
           "glue_arms", "glue_gains", "TUNED_LRS", "tuned_frame", "glue_tuned"]

# The three matrix optimizers of the paper's Table 3, in its order, as the page names them.
from .tuned_grid import run_settings  # noqa: E402  (chapter 11 reads it as nf_pages.run_settings)

OPT_NAMES = {"muon": "Muon", "macro_fro": "MACRO-fro", "macro_spec": "MACRO-spec"}


def norms_of(model):
    """Every ``RMSNorm`` module of ``model`` (its kind: the last part of its name; whether it has a gain),
    and the set of ``norm_gated`` flags of its MLPs."""
    import pandas as pd

    from manifold_muon_lab.models.qwen3 import SwiGLU

    rows = [dict(kind=name.split(".")[-1], learnable=module.weight is not None)
            for name, module in model.named_modules() if type(module).__name__ == "RMSNorm"]
    gated = {m.norm_gated for m in model.modules() if isinstance(m, SwiGLU)}
    return pd.DataFrame(rows), gated


def norm_table(models: dict):
    """``{label: norms_of(model)[0]}`` -> one row per model and kind of norm: how many, all learnable?"""
    import pandas as pd

    frames = [norms.assign(model=label) for label, norms in models.items()]
    return (pd.concat(frames).groupby(["model", "kind"], sort=False)
            .agg(count=("learnable", "size"), learnable=("learnable", "all")).reset_index())


def cascade_figure(cascade):
    """RMS of the residual stream against the block, one line per (MLP, dtype); non-finite points left out."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for (mlp, dtype), g in cascade.groupby(["mlp", "dtype"], sort=False):
        ax.semilogy(g.layer, g.rms.where(np.isfinite(g.rms)), "-" if dtype == "float32" else ":",
                    label=f"{mlp}, {dtype}")
    ax.set_xlabel("block $l$")
    ax.set_ylabel(r"$\|x_l\|_\mathrm{RMS}$")
    ax.legend(fontsize=8)
    return fig


def sweep_frame(metrics):
    """One row per run of ``runs/nf_sweep.md``: group, optimizer (its tag), lr, seed, loss on the common
    validation batches, status."""
    import pandas as pd

    return pd.DataFrame([dict(group=r["coords"]["group"], optimizer=r["coords"]["optimizer"], lr=r["lr"],
                              seed=r["seed"], val=r["common_val_loss"], status=r["status"],
                              diverged=r["diverged"])
                         for r in metrics["runs"]])


def sweep_table(mean, sd, paper):
    """The paper's Table 3 (``PAPER["table3"]``: one run per rate, None for NaN) above ours (``mean`` and
    ``sd`` over seeds: optimizer x lr), one row per source and learning rate, one column per optimizer:
    the paper's value or "NaN", ours as "mean ± sd", at 3 decimals."""
    import pandas as pd

    rows = []
    for i, lr in enumerate(paper["lr"]):
        rows.append({"source": "paper (330M)", r"$\eta$": format(lr, "g"),
                     **{name: "NaN" if paper[o][i] is None else format(paper[o][i], ".3f")
                        for o, name in OPT_NAMES.items()}})
    for lr in mean.columns:
        rows.append({"source": "ours (4 layers)", r"$\eta$": format(lr, "g"),
                     **{name: f"{mean.loc[o, lr]:.3f} ± {sd.loc[o, lr]:.3f}" for o, name in OPT_NAMES.items()}})
    return pd.DataFrame(rows)


def sweep_figure(free):
    """Validation loss against learning rate: the mean over seeds (line) and each seed (dots)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for o, name in OPT_NAMES.items():
        g = free[free.optimizer == o]
        m = g.groupby("lr").val.mean()
        line, = ax.semilogx(m.index, m.to_numpy(), marker="o", label=name)
        ax.scatter(g.lr, g.val, color=line.get_color(), s=8, alpha=0.5)
    ax.set_xlabel(r"learning rate $\eta$")
    ax.set_ylabel("validation loss")
    ax.legend()
    return fig


def growth_frame(metrics, layer="up_proj"):
    """Per run without learnable norms: optimizer (its page name), lr, seed, the final spectral norm of
    ``layer`` and the median relative step the run recorded for it."""
    import pandas as pd

    return pd.DataFrame([dict(optimizer=OPT_NAMES[r["coords"]["optimizer"]], lr=r["lr"], seed=r["seed"],
                              sigma_up=r["sigma_max_end"][layer], rel_update=r["relative_update"][layer])
                         for r in metrics["runs"] if r["coords"]["group"] == "rmsnorm_free"])


def growth_table(growth):
    """``growth`` (seed means: optimizer, lr, sigma_up, rel_update) as one row per optimizer and quantity,
    one column per learning rate, at 3 significant digits (spectral norm) and 3 decimals (relative step)."""
    import pandas as pd

    rows = []
    for quantity, label, fmt in (("sigma_up", r"$\sigma_\max(W_\mathrm{up})$", ".3g"),
                                 ("rel_update", "relative step", ".3f")):
        for name in OPT_NAMES.values():
            g = growth[growth.optimizer == name].set_index("lr")[quantity]
            rows.append({"optimizer": name, "quantity": label, **{format(lr, "g"): format(v, fmt) for lr, v in g.items()}})
    return pd.DataFrame(rows)


def arm_table(settings, best_lr):
    """The two arms of the comparison with learnable norms, one row per optimizer and arm: the rate the
    comparison uses (``best_lr`` without norms), r, weight decay, and how the setting was chosen."""
    import pandas as pd

    def show(x):
        return "none" if x is None or x != x else format(x, "g")

    rows = []
    for o, name in OPT_NAMES.items():
        for group, label, lr in (("rmsnorm_free", "none", best_lr[o]), ("normalized", "learnable", None)):
            s = settings[(settings.group == group) & (settings.optimizer == o)]
            n_rates = s.lr.nunique()
            rows.append({"optimizer": name, "RMSNorm gains": label,
                         r"$\eta$": show(s.lr.iloc[0] if lr is None else lr),
                         "$r$": show(s.r.iloc[0]), "weight decay": show(s.weight_decay.iloc[0]),
                         "how set": f"best of {n_rates} rates" if n_rates > 1 else "Table 12 (120M)"})
    return pd.DataFrame(rows)


def gains_frame(metrics):
    """One row per run of ``runs/nf_gains.md``: optimizer, r, seed, validation loss and the mean final gain
    of each kind of RMSNorm (``gamma_<kind>``)."""
    import pandas as pd

    return pd.DataFrame([dict(optimizer=r["coords"]["optimizer"], r=float(r["coords"]["r"]), seed=r["seed"],
                              val=r["common_val_loss"], **{f"gamma_{k}": v for k, v in r["gains_end"].items()})
                         for r in metrics["runs"]])


def gain_table(gain_tab):
    """``gain_tab`` as shown: optimizer, norm, the mean gain at each radius ("r = ..." columns, headed
    ``$r = ...$``) and the pooled slope; the per-seed slopes are left to the prose."""
    out = gain_tab.drop(columns=["slope_seed_min", "slope_seed_max"])
    return out.rename(columns={c: f"${c}$" for c in out.columns if c.startswith("r = ")})


def vs_normed_table(with_norm, without, gap):
    """Seed-by-optimizer frames of validation loss with and without learnable norms and their paired
    difference -> one row per optimizer: both means, the mean paired difference and its standard deviation."""
    import pandas as pd

    return pd.DataFrame({"optimizer": [OPT_NAMES[o] for o in with_norm.columns],
                         "with RMSNorm": with_norm.mean().to_numpy(),
                         "without, best rate": without.mean().to_numpy(),
                         "without - with (paired)": gap.mean().to_numpy(), "paired std": gap.std().to_numpy()})


def gain_slopes(gains, kinds):
    """Per optimizer (page name) and kind of norm: the mean final gain at each radius ("r = <r>" columns), the
    slope of log gamma against log r fitted over all runs of that optimizer ("slope", least squares) and its
    smallest and largest value when fitted seed by seed ("slope_seed_min", "slope_seed_max")."""
    import numpy as np
    import pandas as pd

    def log_slope(g, k):
        return float(np.polyfit(np.log(g.r), np.log(g[f"gamma_{k}"]), 1)[0])

    rows = []
    for o, g in gains.groupby("optimizer"):
        for k in kinds:
            per_seed = [log_slope(h, k) for _, h in g.groupby("seed")]
            means = g.groupby("r")[f"gamma_{k}"].mean()
            rows.append(dict(optimizer=OPT_NAMES[o], norm=k, **{f"r = {r:g}": v for r, v in means.items()},
                             slope=log_slope(g, k), slope_seed_min=min(per_seed), slope_seed_max=max(per_seed)))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------------
# The numbers the prose quotes, glued at the precision it states them
# ---------------------------------------------------------------------------------------------------------

def glue_cascade(degree, std32, first_inf, first_nan, log_ratio, ng_growth, ng32, depth):
    """The homogeneity degrees (``degree[gated]``), the last plain float32 block whose stream RMS is below 2
    (``quiet_layer``), the first block with an infinite RMS per dtype and with a NaN stream in float32, the
    range of the successive ratios of log10 s, the gated stack's growth factor and final RMS, and the depth."""
    from .stated import glue_value

    glue_value("degree_swiglu", degree[False], ".2f")
    glue_value("degree_ng", degree[True], ".2f")
    quiet = int(std32.layer[std32.rms >= 2].min()) - 1   # last block with RMS < 2
    glue_value("quiet_layer", quiet, "d")
    glue_value("inf_layer_f32", first_inf["float32"], "d")
    glue_value("inf_layer_bf16", first_inf["bfloat16"], "d")
    glue_value("nan_layer_f32", first_nan["float32"], "d")
    glue_value("log_ratio_min", float(log_ratio.min()), ".2f")
    glue_value("log_ratio_max", float(log_ratio.max()), ".2f")
    glue_value("ng_growth", ng_growth, ".3f")
    glue_value("ng_final", float(ng32.rms.iloc[-1]), ".1f")
    glue_value("depth", depth, "d")


def glue_sweep(n_diverged, n_runs, spec_minus_fro, top, muon_vs_spec_best):
    """The sweep's divergences and runs, the range of MACRO-spec's mean lead over MACRO-fro across rates
    (``spec_minus_fro["mean"]``, sign flipped), the loss each optimizer loses from its best rate to 1 (``top``)
    and MACRO-spec's best minus Muon's."""
    from .stated import glue_value

    glue_value("nf_diverged", n_diverged, "d")
    glue_value("nf_runs", n_runs, "d")
    glue_value("nf_spec_fro_min", float(-spec_minus_fro["mean"].max()), ".3f")
    glue_value("nf_spec_fro_max", float(-spec_minus_fro["mean"].min()), ".3f")
    glue_value("nf_top_muon", float(top["muon"]), ".2f")
    glue_value("nf_top_spec", float(top["macro_spec"]), ".2f")
    glue_value("nf_top_fro", float(top["macro_fro"]), ".2f")
    glue_value("nf_spec_vs_muon", muon_vs_spec_best, "+.3f")


def glue_growth(g_muon, g_spec):
    """Muon's final up-projection spectral norm at eta = 0.01 and 1 and its largest relative step; MACRO-spec's
    relative step at eta = 1 (``g_*``: seed means indexed by lr)."""
    from .stated import glue_value

    glue_value("muon_sigma_001", float(g_muon.sigma_up[0.01]), ".1f")
    glue_value("muon_sigma_1", float(g_muon.sigma_up[1.0]), ".0f")
    glue_value("muon_rel_max", float(g_muon.rel_update.max()), ".3f")
    glue_value("spec_rel_1", float(g_spec.rel_update[1.0]), ".2f")


def glue_arms(gap, normed_spec_minus_fro, same_rate):
    """The mean paired gaps without minus with learnable norms per optimizer, MACRO-spec minus MACRO-fro with
    the norms, and MACRO-spec's gap at the normalised arm's rate."""
    from .stated import glue_value

    glue_value("nf_gap_spec", float(gap["macro_spec"].mean()), "+.3f")
    glue_value("nf_gap_fro", float(gap["macro_fro"].mean()), "+.3f")
    glue_value("nf_gap_muon", float(gap["muon"].mean()), "+.3f")
    glue_value("nf_normed_spec_fro", normed_spec_minus_fro, "+.3f")
    glue_value("nf_same_rate_spec", same_rate, "+.3f")


def glue_gains(gains, gamma_cols, gain_tab):
    """The largest deviation of a gain from 1, the steepest pooled slope and the range of per-seed slopes,
    MACRO-spec's MLP pre-norm slope, and the largest spread over the radii of an optimizer's mean validation
    loss."""
    from .stated import glue_value

    glue_value("gain_dev_max", float((gains[gamma_cols] - 1).abs().max().max()), ".2f")
    glue_value("gain_slope_min", float(gain_tab.slope.min()), "+.3f")
    glue_value("gain_seed_slope_min", float(gain_tab.slope_seed_min.min()), "+.3f")
    glue_value("gain_seed_slope_max", float(gain_tab.slope_seed_max.max()), "+.3f")
    mlp_spec = gain_tab[(gain_tab.optimizer == "MACRO-spec") & (gain_tab.norm == "mlp_norm")].iloc[0]
    glue_value("gain_mlp_spec_slope", float(mlp_spec.slope), "+.3f")
    val_by_r = gains.groupby(["optimizer", "r"]).val.mean()
    spread = val_by_r.groupby("optimizer").agg(lambda v: v.max() - v.min())
    glue_value("gain_val_spread", float(spread.max()), ".3f")


# ------------------------------------------------------------------ both arms tuned alike (issue 21)

TUNED_LRS = (0.01, 0.03, 0.1)  # the rates every arm of the tuned comparison is run at


def tuned_frame(metrics):
    """The runs of the tuned comparison, one row each: norms ("none": groups rmsnorm_free at the rates
    ``TUNED_LRS`` and free_tuned; "learnable": group normalized_tuned), optimizer (the assignment: muon,
    macro_fro, macro_spec), lr, radius factor r (None for Muon), seed, validation loss on the common batches.
    Every MACRO arm then covers the same 3 x 3 grid of rate and radius, Muon the same three rates."""
    import pandas as pd

    settings = run_settings(metrics)
    rows = []
    for run, (_, s) in zip(metrics["runs"], settings.iterrows()):
        group = run["coords"]["group"]
        if group == "rmsnorm_free" and run["lr"] not in TUNED_LRS:
            continue
        if group not in ("rmsnorm_free", "free_tuned", "normalized_tuned"):
            continue
        rows.append(dict(norms="learnable" if group == "normalized_tuned" else "none", optimizer=run["assignment"],
                         lr=s.lr, r=s.r if s.r is not None else float("nan"), seed=run["seed"],
                         val=run["common_val_loss"], diverged=run["diverged"]))
    return pd.DataFrame(rows)


def glue_tuned(nf06: dict, nf07: dict, normed_spec_minus_fro: float, muon_price: float, muon_range: float):
    """The tuned comparison's numbers: P-NF-06's d_free, R_free, d_norm; P-NF-07's gap and R; MACRO-spec minus
    MACRO-fro with norms; Muon without minus with norms (each arm at its best cell) and that pair's seed range."""
    from .stated import glue_value

    glue_value("nft_d_free", nf06["d_free"], "+.3f")
    glue_value("nft_R_free", nf06["R_free"], ".3f")
    glue_value("nft_d_norm", nf06["d_norm"], "+.3f")
    glue_value("nft_gap", nf07["gap"], "+.3f")
    glue_value("nft_R", nf07["R"], ".3f")
    glue_value("nft_normed_spec_fro", normed_spec_minus_fro, "+.3f")
    glue_value("nft_muon_price", muon_price, "+.3f")
    glue_value("nft_muon_R", muon_range, ".3f")
