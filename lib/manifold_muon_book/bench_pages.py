"""The plumbing of the optimizer-benchmark chapter (``chapters/13_benchmarks.md``).

The chapter keeps in view the arithmetic it checks: the differences it reads off the paper's Table 4,
the differences to Muon paired by seed, the violation ratios, the bisection experiment, the time ratios.
This module only reshapes what the chapter loads (the run records of ``runs/sphere_benchmark.md``,
chapter 12's learning-rate sweep, the paper's published numbers) into DataFrames, reads each arm's
hyperparameters from its training preset, draws the one figure and shows the numbered tables with their
captions (``show_*_table``: the chapter computes what they show). It states no number itself.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["NAMES", "ORDER", "SPHERE", "paper_val", "dash", "shown", "table4_runs", "arm_tuning", "lr_sweep",
           "eval_curves", "violations", "oblique_runs", "micro_ratios", "curves_figure", "cpu_table",
           "in_thousandths", "BISECTION_ROWS", "bisection_summary", "MANIFOLDS", "oblique_losses", "oblique_norms", "glue_values",
           "show_vs_muon_table", "show_pairs_table", "show_budget_table", "show_tuning_table", "show_cpu_table",
           "show_violation_table", "show_bisection_table", "show_time_table", "show_oblique_tables", "tuned_frame", "PAIRS"]

# The optimizers of the paper's Table 4, in its order, with the names the page shows.
NAMES = {"muon": "Muon", "muonh_fro": "MuonH-fro", "muonh_spec": "MuonH-spec", "fso": "FSO", "sso": "SSO",
         "macro_fro": "MACRO-fro", "macro_spec": "MACRO-spec"}
ORDER = list(NAMES)
SPHERE = {"muon": "none", "muonh_fro": "Frobenius", "muonh_spec": "spectral", "fso": "Frobenius",
          "sso": "spectral", "macro_fro": "Frobenius", "macro_spec": "spectral"}


def paper_val():
    """Table 4's validation losses: one row per optimizer (``ORDER``), one column per scale; NaN where not run."""
    import pandas as pd

    from .paper_runs import PAPER

    scales = PAPER["table4_scales"]
    rows = {o: [v[1] if v is not None else float("nan") for v in PAPER["table4"][o]] for o in ORDER}
    return pd.DataFrame.from_dict(rows, orient="index", columns=scales).rename_axis("optimizer")


def dash(df):
    """``df`` with '-' in the cells the paper did not run (NaN), for a table."""
    return df.astype(object).where(df.notna(), "-")


def shown(df, column: str = "optimizer"):
    """``df`` with the optimizers of ``column`` under the names the page uses."""
    return df.replace({column: NAMES})


def table4_runs(bench: dict):
    """One row per run of the benchmark's Table 4 group: optimizer, seed, final validation loss on the common
    batches, status and the median times of the optimizer step, the whole step and forward-backward."""
    import pandas as pd

    return pd.DataFrame([dict(optimizer=r["coords"]["optimizer"], seed=r["seed"], val=r["common_val_loss"],
                              status=r["status"], opt_s=r["time"]["opt_s"], step_s=r["time"]["step_s"],
                              fb_s=r["time"]["fb_s"])
                         for r in bench["runs"] if r["coords"]["group"] == "table4"])


def arm_tuning(bench: dict, root: Path):
    """What each arm of the benchmark ran at: its sphere, learning rate, radius factor r and weight decay, read
    from the training preset the benchmark names (its ``per_assignment`` rows are Table 12's 120M choices),
    and the learning rate the run records, which must agree."""
    import pandas as pd

    from manifold_muon_lab.config import load_preset

    recorded = {r["coords"]["optimizer"]: r["lr"] for r in bench["runs"] if r["coords"]["group"] == "table4"}
    rows = []
    for o in ORDER:
        cfg = load_preset(bench["training_preset"], root / "runs" / "presets" / "training", assignment=o)
        if cfg.lr != recorded[o]:
            raise ValueError(f"{o}: the preset gives lr {cfg.lr}, the runs recorded {recorded[o]}")
        r = (cfg.optimizer.get("manifold_args") or {}).get("r")
        rows.append({"optimizer": o, "sphere": SPHERE[o], "learning rate": cfg.lr,
                     "radius factor r": "-" if o == "muon" else r, "weight decay": cfg.optimizer.get("weight_decay", 0.0)})
    return pd.DataFrame(rows)


def lr_sweep(width_transfer: dict, width: int) -> dict:
    """Chapter 12's learning-rate sweep at one width: (optimizer, lr) -> final validation loss (one seed)."""
    return {(r["coords"]["optimizer"], r["lr"]): r["common_val_loss"]
            for r in width_transfer["runs"] if int(r["coords"]["width"]) == width}


def eval_curves(bench: dict):
    """The training loop's evaluations of every Table 4 run, long: optimizer, seed, step, validation loss."""
    import pandas as pd

    return pd.DataFrame([dict(optimizer=r["coords"]["optimizer"], seed=r["seed"], step=s, val=v)
                         for r in bench["runs"] if r["coords"]["group"] == "table4"
                         for s, v in zip(r["eval"]["step"], r["eval"]["val_loss"])])


def violations(bench: dict):
    """The tangent violation each Table 4 run recorded, long: optimizer, seed, layer type, the cosine averaged
    over the recorded steps (Muon records none)."""
    import pandas as pd

    return pd.DataFrame([dict(optimizer=r["coords"]["optimizer"], seed=r["seed"], layer=k, cos=v)
                         for r in bench["runs"] if r["coords"]["group"] == "table4"
                         for k, v in r["tangent_violation"].items()])


def oblique_runs(bench: dict, layers=("q_proj", "up_proj")):
    """One row per run of the oblique group: manifold, lr, seed, validation loss and the final norms
    (spectral, largest row, largest column; medians over the layers of a type) of ``layers``."""
    import pandas as pd

    return pd.DataFrame([dict(manifold=r["coords"]["manifold"], lr=r["lr"], seed=r["seed"], val=r["common_val_loss"],
                              **{f"{k} {q}": r["final_norms"][k][q] for k in layers
                                 for q in ("spectral", "max_row", "max_col")})
                         for r in bench["runs"] if r["coords"]["group"] == "oblique"])


def micro_ratios(micro: dict, preset: str = "gpt2_small") -> dict:
    """``runs/bench/optimizer_step.json`` at one preset: optimizer -> its step time over Muon's (``muon`` is
    the benchmark's ``unconstrained`` row)."""
    rows = {r["condition"]: r["ratio_to_muon"] for res in micro["results"] if res["preset"] == preset
            for r in res["rows"]}
    return {o: rows["unconstrained" if o == "muon" else o] for o in ORDER}


def curves_figure(mean_curve, gap_curve, n_seeds: int, ylim=(1.9, 3.1)):
    """Two panels: the mean validation curve of each optimizer, and its difference to Muon's; one colour per
    optimizer in both panels."""
    import matplotlib.pyplot as plt

    colours = dict(zip(ORDER, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for o in mean_curve.columns:
        axes[0].plot(mean_curve.index, mean_curve[o], marker="o", ms=3, color=colours[o], label=NAMES[o])
        if o in gap_curve.columns:
            axes[1].plot(gap_curve.index, gap_curve[o], marker="o", ms=3, color=colours[o], label=NAMES[o])
    axes[0].set_ylim(*ylim)
    axes[0].set_xlabel("step")
    axes[0].set_ylabel(f"validation loss (mean of {n_seeds} seeds)")
    axes[0].legend(fontsize=9, ncol=2)
    axes[1].axhline(0, color="k", lw=0.8)
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("minus Muon's")
    return fig


def cpu_table(val, diff, paper):
    """The cpu-scale table: per optimizer the mean and spread over seeds of the final validation loss and of
    its paired difference to Muon, with the paper's Table 4 validation losses beside ('-' where not run)."""
    import pandas as pd

    out = pd.DataFrame({"optimizer": ORDER, "mean": val.mean().to_numpy(), "std": val.std().to_numpy(),
                        "vs Muon (paired)": diff.mean().to_numpy(), "paired std": diff.std().to_numpy()})
    return out.join(dash(paper.reindex(ORDER).reset_index(drop=True).rename(columns=lambda s: f"paper {s}")))


def in_thousandths(value) -> str:
    """A ``stated_table`` format: ``value`` in units of 1e-3 at two significant digits (0.0037 -> '3.7',
    0.11 -> '110'), the precision of '.1e' without its exponent."""
    return format(float(format(float(value) * 1e3, ".2g")), "g")


# The rows of the bisection table: column of the experiment -> (label on the page, format).
BISECTION_ROWS = {"bracket": (r"Lemma 1's bracket $2\|M\|_*/\|\Theta\|_*$", ".3g"),
                  "lam_root": (r"root $|\lambda^*|$ (60 halvings)", ".3g"),
                  "root_over_bracket": ("root / bracket", ".1e"),
                  "lam10_is_zero": (r"share of instances where 10 halvings return $\lambda = 0$", ".2f"),
                  "cos_muonh": (r"violation $\cos$ with $\lambda = 0$ (MuonH)", ".1e"),
                  "cos10": (r"violation $\cos$ after 10 halvings (the paper's cap)", ".1e"),
                  "cos60": (r"violation $\cos$ after 60 halvings", None)}


def bisection_summary(bis, below: float = 1e-9):
    """The bisection experiment's means, one row per quantity and one column per sphere, as the strings shown;
    the 60-halving violation, rounding noise, is shown as the bound '< below' that the chapter asserts."""
    import pandas as pd

    from .stated import above_rounding

    means = bis.groupby("sphere").mean(numeric_only=True)
    spheres = {"frobenius_sphere": "Frobenius", "spectral_sphere": "spectral"}
    rows = []
    for key, (label, fmt) in BISECTION_ROWS.items():
        show = above_rounding(below) if fmt is None else (lambda v, f=fmt: format(float(v), f))
        rows.append({"quantity (mean of the instances)": label, **{spheres[s]: show(means.loc[s, key]) for s in spheres}})
    return pd.DataFrame(rows)


MANIFOLDS = {"frobenius": "Frobenius", "input_oblique": "input oblique", "output_oblique": "output oblique"}


def oblique_losses(obl_val, obl_diff):
    """Per learning rate and manifold: mean and standard deviation over seeds of the validation loss, and of its
    difference to the Frobenius sphere paired by seed ('-' on the Frobenius rows), with the formats."""
    import pandas as pd

    rows = []
    for lr in sorted(obl_val.index.get_level_values("lr").unique()):
        at, d = obl_val.xs(lr, level="lr"), obl_diff.xs(lr, level="lr")
        for m, label in MANIFOLDS.items():
            paired = ("-", "-") if m == "frobenius" else (d[m].mean(), d[m].std())
            rows.append({"lr": lr, "manifold": label, "mean": at[m].mean(), "std": at[m].std(),
                         "minus Frobenius (paired)": paired[0], "paired std": paired[1]})
    return pd.DataFrame(rows), {"lr": "g", "mean": ".3f", "std": ".3f", "minus Frobenius (paired)": "+.3f",
                                "paired std": ".3f"}


def oblique_norms(obl):
    """Per learning rate and manifold: the seed means of the final norms (columns such as 'q spectral', 'up max
    col'), with the formats of the columns."""
    norm_cols = [c for c in obl.columns if "proj" in c]
    out = obl.groupby(["lr", "manifold"])[norm_cols].mean().reset_index()
    out.columns = [c.replace("_proj ", " ").replace("max_", "max ") for c in out.columns]
    out = out.replace({"manifold": {"frobenius": "Frobenius", "input_oblique": "input", "output_oblique": "output"}})
    return out, {"lr": "g", **{c: ".3f" for c in out.columns if c.startswith(("q ", "up "))}}


def glue_values(fmt: str, **values) -> None:
    """``stated.glue_value(name, x, fmt)`` for each ``name=x``: several numbers that the prose shows at one format."""
    from .stated import glue_value

    for name, x in values.items():
        glue_value(name, x if isinstance(x, int) else float(x), fmt)


# ---------------------------------------------------------------------------------------------------------
# The chapter's numbered tables, with their captions (``tables.show_table``)
# ---------------------------------------------------------------------------------------------------------

def _scales():
    from .paper_runs import PAPER

    return PAPER["table4_scales"]


def show_vs_muon_table(vs_muon) -> None:
    """tab-ben-paper-vs-muon: Table 4's Delta_{o,s}, each constrained optimizer minus Muon per scale."""
    from .tables import show_table

    show_table(dash(shown(vs_muon.reset_index())),
               r"The paper's Table 4: validation loss of each constrained optimizer minus Muon's, $\Delta_{o,s}$, at "
               "each scale (negative: better than Muon). One run per cell; '-' where the paper did not run SSO or FSO.",
               "tab-ben-paper-vs-muon", {s: "+.3f" for s in _scales()})


def show_pairs_table(paper_pairs) -> None:
    """tab-ben-paper-pairs: Table 4's differences between the pairs the summary sentences compare."""
    from .tables import show_table

    show_table(dash(paper_pairs), "The paper's Table 4, validation loss differences between the optimizers that its "
               "summary sentences compare (negative: the first of the pair is better).", "tab-ben-paper-pairs",
               {s: "+.3f" for s in _scales()})


def show_budget_table(budget) -> None:
    """tab-ben-budget: Table 10's token budgets recomputed, the stated ones, parameters, tokens per parameter."""
    from .tables import show_table

    show_table(budget.rename(columns={"tokens": "tokens (B)", "stated": "stated (B)", "params": "parameters (M)",
                                      "tokens_per_param": "tokens per parameter"}),
               "Table 10's token budgets recomputed with a per-GPU batch, against the stated ones; parameters of "
               "the library's Qwen3-like model (FFN width 8/3 of the model width).", "tab-ben-budget",
               {"tokens (B)": ".2f", "stated (B)": ".1f", "parameters (M)": ".1f", "tokens per parameter": ".0f"})


def show_tuning_table(tuning) -> None:
    """tab-ben-tuning: each arm's hyperparameters (``arm_tuning``)."""
    from .tables import show_table

    show_table(shown(tuning), "The hyperparameters of each arm at the cpu scale: Table 12's choices at 120M, "
               "as the training preset gives them (the AdamW parameters of embeddings and gains are the same for all).",
               "tab-ben-tuning", {"learning rate": "g", "weight decay": "g"})


def show_cpu_table(val, diff, paper) -> None:
    """tab-ben-cpu: ``cpu_table(val, diff, paper)`` under the page's names."""
    from .tables import show_table

    show_table(shown(cpu_table(val, diff, paper)),
               "Final validation loss at the cpu scale (each arm at its Table 12 setting for 120M, "
               "{numref}`tab-ben-tuning`): mean and standard deviation over 3 seeds, and the difference to Muon "
               "paired by seed; the paper's validation losses (one run each) beside.", "tab-ben-cpu",
               {"mean": ".3f", "std": ".3f", "vs Muon (paired)": "+.3f", "paired std": ".3f",
                **{f"paper {s}": ".3f" for s in _scales()}})


def show_violation_table(vio_tab) -> None:
    """tab-ben-violation: the mean cos_t per optimizer and layer type, in thousandths."""
    from .paper_runs import LAYER_TYPES
    from .tables import show_table

    show_table(shown(vio_tab.reset_index()).rename(columns=lambda c: c.replace("_proj", "")),
               r"Tangent violation $\cos_t$ of eq. {eq}`eq-ben-violation`, in units of $10^{-3}$, per layer type (q, k, "
               r"v, o: attention; gate, up, down: MLP), averaged over the recorded steps (every 25th) and 3 seeds. Muon "
               r"has no sphere and is not listed.", "tab-ben-violation",
               {k.replace("_proj", ""): in_thousandths for k in LAYER_TYPES})


def show_bisection_table(bis, below: float) -> None:
    """tab-ben-bisection: ``bisection_summary(bis, below)``."""
    from .tables import show_table

    show_table(bisection_summary(bis, below=below),
               r"The multiplier bisection on 20 random $64 \times 64$ instances per sphere ($r = 1$ Frobenius, $r = 2$ "
               r"spectral), means over the instances.", "tab-ben-bisection")


def show_time_table(r_opt, r_step, gpt2: dict) -> None:
    """tab-ben-time: the medians over seeds of the time ratios to Muon (optimizer step, whole step) and the
    micro-benchmark's ratios."""
    import pandas as pd

    from .tables import show_table

    timing = pd.DataFrame({"optimizer": ORDER, "optimizer step / Muon's": r_opt.median().to_numpy(),
                           "whole step / Muon's": r_step.median().to_numpy(),
                           "micro-benchmark, 768 wide": [gpt2[o] for o in ORDER]})
    show_table(shown(timing),
               "Time per step relative to Muon: the optimizer step alone and forward-backward plus optimizer step "
               "(medians over the 3 seeds of per-run medians, cpu scale), and the library's micro-benchmark of the "
               "optimizer step at GPT-2-small shapes.", "tab-ben-time", default=".2g")


def show_oblique_tables(obl_val, obl_diff, obl) -> None:
    """tab-ben-oblique (``oblique_losses``) and tab-ben-oblique-norms (``oblique_norms``)."""
    from .tables import show_table

    losses, loss_formats = oblique_losses(obl_val, obl_diff)
    show_table(losses, "MACRO on the Frobenius sphere and the two oblique manifolds ($r = 1$, no weight decay, the "
               "same two rates for all three): final validation loss, and its difference to the Frobenius sphere "
               "paired by seed, mean and standard deviation over 3 seeds.", "tab-ben-oblique", loss_formats)
    norms, norm_formats = oblique_norms(obl)
    show_table(norms, "Final norms of the query (q) and MLP up-projection (up) weights in the runs of "
               "{numref}`tab-ben-oblique` (input, output: the oblique manifolds): spectral, largest row and largest "
               "column (medians over the layers of a type, means over seeds).", "tab-ben-oblique-norms", norm_formats)


def tuned_frame(bench: dict):
    """The runs of the benchmark's group ``tuned`` (each sphere optimizer on the same 3 x 3 grid of rate and radius
    factor), one row each, in the shape ``nf_pages.best_cells`` reads: norms ("learnable": this model keeps its
    RMSNorm), optimizer (the assignment), lr, r, seed, validation loss on the common batches, diverged."""
    import pandas as pd

    from .tuned_grid import run_settings

    runs = [r for r in bench["runs"] if r["coords"].get("group") == "tuned"]
    settings = run_settings({**bench, "runs": runs})
    return pd.DataFrame([dict(norms="learnable", optimizer=run["assignment"], lr=s.lr, r=s.r, seed=run["seed"],
                              val=run["common_val_loss"], diverged=run["diverged"])
                         for run, (_, s) in zip(runs, settings.iterrows())])


PAIRS = [("MuonH", "muonh_spec", "muonh_fro"), ("SSO / FSO", "sso", "fso"), ("MACRO", "macro_spec", "macro_fro")]
"""The spectral / Frobenius pairs of the paper's Table 4: (label, spectral optimizer, Frobenius optimizer)."""
