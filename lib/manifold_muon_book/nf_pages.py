"""The page helpers of chapter 11 (training without normalisation layers): what turns run records into
frames, frames into the tables a reader sees, and frames into figures.

Nothing here decides a verdict. The chapter computes every statistic it checks and asserts it in its own
cells; these functions only gather inputs (``sweep_frame``, ``gains_frame``, ``run_settings``) and lay
results out (``*_table``, ``*_figure``), so that the page shows the checks and not the formatting.
"""

from __future__ import annotations

__all__ = ["OPT_NAMES", "norms_of", "norm_table", "cascade_figure", "sweep_frame", "sweep_table",
           "sweep_figure", "growth_frame", "growth_table", "run_settings", "arm_table", "gains_frame",
           "gain_table", "gain_slopes", "vs_normed_table"]

# The three matrix optimizers of the paper's Table 3, in its order, as the page names them.
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


def run_settings(metrics):
    """The configuration each run of a grid trained with, rebuilt from its record's overrides and the grid's
    training preset exactly as ``paper_runs.run_grid`` built it: group, optimizer, seed, lr, radius factor r
    (None without a manifold) and weight decay of the matrix optimizer."""
    import pandas as pd

    from manifold_muon_lab.config import load_preset

    from .pipeline import repo_root

    presets = repo_root() / "runs" / "presets" / "training"
    rows = []
    for r in metrics["runs"]:
        cfg = load_preset(metrics["training_preset"], presets, **r["overrides"])
        assert cfg.lr == r["lr"] and cfg.seed == r["seed"]  # the record and the rebuilt config agree
        rows.append(dict(group=r["coords"].get("group"), optimizer=r["coords"]["optimizer"], seed=r["seed"],
                         lr=cfg.lr, r=(cfg.optimizer.get("manifold_args") or {}).get("r"),
                         weight_decay=cfg.optimizer.get("weight_decay", 0.0)))
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
