"""The page helpers of chapter 07 (spectral evidence: what DGram does to attention).

Nothing here computes a statistic the chapter checks: the growth ratios, the shape rules, the rank
correlations within a step, the bootstrap over runs and the reading of a link all stay on the page, with
their assertions (and ``manifold_muon_book.evidence`` is checked against them there). What is here only
reads run records (``run_parameters``, ``spectra``), draws the three figures (returned unpublished: the
chapter calls ``figures.publish``), lays out the tables and glues the numbers the prose quotes.
"""

from __future__ import annotations

import json

import numpy as np

from .stated import glue_value
from .tables import show_table

__all__ = ["run_parameters", "spectra", "sigma_figure", "growth_shape_table", "glue_growth", "glue_shapes",
           "spectra_figure", "glue_spectra", "glue_links", "link_tables", "links_figure"]


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _glue_text(name: str, text: str) -> None:
    from myst_nb import glue

    glue(name, text, display=False)


def run_parameters(runs: dict) -> dict:
    """``{study: parameters}`` from the ``provenance.json`` of the first run of each study."""
    return {st: json.loads((next(iter(r.values())) / "provenance.json").read_text())["parameters"]
            for st, r in runs.items()}


def spectra(runs: dict, study: str, a: str, seed: int, name: str) -> dict:
    """{step: singular values, descending} of one weight matrix at each spectrum snapshot of one run."""
    from manifold_muon_lab.metrics import read_metrics

    return {r["step"]: np.array(r["spectrum"][name]) for r in read_metrics(runs[study][(a, seed)], "eval")
            if "spectrum" in r}


# ---------------------------------------------------------------------------------------------------------
# How fast sigma_max grows; Figure 6 at small scale
# ---------------------------------------------------------------------------------------------------------

def sigma_figure(top_sigma, order, colors):
    """Figure 6 at small scale: the largest sigma_max over the attention (left) and MLP (right) weights of
    the main study, median over seeds with their range, one colour per assignment."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, group, title in zip(axes, ("attn", "mlp"), ("attention weights", "MLP weights")):
        t = top_sigma("main", group)
        for a in order:
            band = t[t["assignment"] == a].groupby("step")["sigma_max"].agg(["median", "min", "max"])
            ax.semilogy(band.index, band["median"], color=colors[a], label=a)
            ax.fill_between(band.index, band["min"], band["max"], color=colors[a], alpha=0.25)
        ax.set_title(f"largest $\\sigma_{{\\max}}$ over all {title}")
        ax.set_xlabel("step")
    axes[0].set_ylabel(r"$\sigma_{\max}$")
    axes[0].legend(fontsize=8)
    return fig


def growth_shape_table(shapes) -> None:
    """Table tab-growth-shape: R^2 of the linear and the exponential fit, and final over initial sigma_max."""
    r2 = {"R^2 linear": "$R^2$ linear", "R^2 exponential": "$R^2$ exponential"}
    show_table(shapes.rename(columns=r2), r"The largest attention $\sigma_{\max}$ of the two DGram-attention assignments against the "
               r"cumulative learning rate: fraction of its variance explained by a straight line ($R^2$ linear) and by "
               r"an exponential ($R^2$ of $\log \sigma_{\max}$), pooled over seeds; and its largest value over its "
               r"value at step 0.", "tab-growth-shape",
               {"$R^2$ linear": ".3f", "$R^2$ exponential": ".3f", "final / initial": ".1f"})


def glue_growth(worst_ratio, lr_needed, lr_factor, shapes, exp_wins) -> None:
    """Glue the numbers of B-SP-01: the worst growth ratio, the learning rate Figure 6 needs (and in units
    of 0.02), All DGram's growth factor per study, and the word comparing the exponential fit with the line."""
    glue_value("worst_growth_ratio", worst_ratio, ".2f")
    glue_value("post_lr_needed", float(lr_needed), ".1f")
    glue_value("post_lr_factor", float(lr_factor), ".0f")
    pick = lambda st: float(shapes.query("study == @st and assignment == 'all_dgram'")["final / initial"].iloc[0])
    glue_value("dgram_growth_main", pick("main"), ".1f")
    glue_value("dgram_growth_long", pick("long"), ".1f")
    _glue_text("exp_better_word", "better than" if exp_wins.all() else "worse than" if not exp_wins.any()
               else "not consistently better than")


def glue_shapes(between, within, n, unc_attn, dgram_mlp, stiefel_dev, identical) -> None:
    """Glue the numbers of B-SP-02 to B-SP-04: the gaps between and within and the seed-noise bar
    (``within / sqrt(n)``), unconstrained attention's peak and end per study, the DGram MLPs' start and end,
    the Stiefel MLPs' deviation from 1, and the word for the MLP manifold's difference."""
    for name, v in [("sp02_between", between), ("sp02_within", within), ("sp02_bar", within / np.sqrt(n))]:
        glue_value(name, v, ".1%")
    for st, suffix in (("main", ""), ("long", "_long")):
        glue_value(f"unc_attn_peak{suffix}", unc_attn[st][2], ".2f")
        glue_value(f"unc_attn_final{suffix}", unc_attn[st][3], ".2f")
    for (st, a), (_, s0, s1) in dgram_mlp.items():
        glue_value(f"mlp_{st}_{a}_start", s0, ".2f")
        glue_value(f"mlp_{st}_{a}_end", s1, ".2f")
    glue_value("stiefel_mlp_dev", stiefel_dev, ".0e")
    _glue_text("sp02_word", "no more" if identical else "more")


# ---------------------------------------------------------------------------------------------------------
# Figure 7 at small scale: spectra
# ---------------------------------------------------------------------------------------------------------

def spectra_figure(spec: dict):
    """The singular values of layer 0's c_attn at each snapshot, All DGram (left) and All Stiefel (right)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, a in zip(axes, ("all_dgram", "all_stiefel")):
        for k, (step, sv) in enumerate(sorted(spec[a].items())):
            ax.semilogy(np.arange(1, len(sv) + 1), sv, color=plt.cm.viridis(k / max(1, len(spec[a]) - 1)),
                        label=f"step {step}")
        ax.set_title(f"{a}: singular values of layer 0 c_attn")
        ax.set_xlabel("index (descending)")
    axes[0].set_ylabel("singular value")
    axes[0].legend(fontsize=8)
    return fig


def glue_spectra(spread0, spread1, stiefel_flat, layer_ratio, layer0_share) -> None:
    """Glue the numbers of B-SP-05."""
    for name, v, fmt in [("spread_dgram_0", spread0, ".2f"), ("spread_dgram_end", spread1, ".2f"),
                         ("stiefel_flat", stiefel_flat, ".0e"), ("layer_ratio", layer_ratio, ".2f"),
                         ("layer0_share", layer0_share, ".2f")]:
        glue_value(name, float(v), fmt)


# ---------------------------------------------------------------------------------------------------------
# The causal chain
# ---------------------------------------------------------------------------------------------------------

def glue_links(links: dict, toy_rho: dict, chains: dict) -> None:
    """Glue every link's within-step rho and reading per study (``rho_{study}_{i}``, ``verdict_{study}_{i}``),
    the constructed example's four rhos, the row counts and the smallest mean row entropy."""
    for study, t in links.items():
        for i, row in t.iterrows():
            glue_value(f"rho_{study}_{i}", float(row["rho within step"]), ".2f")
            _glue_text(f"verdict_{study}_{i}", row["at this scale"])
    for (y, f), v in toy_rho.items():
        glue_value(f"toy_{y}_{f}", v, ".2f")
    glue_value("n_rows_main", int((chains["main"]["step"] > 0).sum()), "d")
    glue_value("n_rows_long", int((chains["long"]["step"] > 0).sum()), "d")
    glue_value("entropy_min", float(chains["main"]["entropy"].min()), ".2f")


def link_tables(links: dict, chains: dict, n_runs: dict, n_assignments: int, n_seeds: int) -> None:
    """Tables tab-links-main and tab-links-long: the five links with their rhos, interval and reading."""
    n_rows = {st: int((chains[st]["step"] > 0).sum()) for st in links}
    rho = {"predicted": "sign", "rho pooled": "ρ pooled", "rho within step": "ρ within", "at this scale": "reading"}
    show_table(links["main"].rename(columns=rho),
               f"The five links of the post's chain in the 300-step runs ({n_rows['main']:d} layer-evaluations of "
               f"{n_runs['main']:d} runs, {n_assignments:d} assignments x {n_seeds:d} seeds): Spearman's $\\rho$ pooled and within step "
               r"({eq}`eq-within-step-rho`), the 5-95% interval of the within-step $\rho$ from resampling whole runs, "
               r"and the reading.", "tab-links-main", default=".2f")
    show_table(links["long"].rename(columns=rho), f"The same for the 1200-step runs of the 2-layer model ({n_rows['long']:d} "
               f"layer-evaluations of {n_runs['long']:d} runs, one seed each).", "tab-links-long", default=".2f")


def links_figure(chain, links, labels: dict, order, colors):
    """The five links in ``chain`` (rows after step 0), one scatter per link, coloured by assignment."""
    plt = _plt()
    fig, axes = plt.subplots(2, 3, figsize=(11, 6.4))
    c = chain[chain["step"] > 0]
    for ax, (x, y, _) in zip(axes.flat, links):
        for a in order:
            part = c[c["assignment"] == a]
            ax.scatter(part[x], part[y], s=6, alpha=0.6, color=colors[a], label=a)
        ax.set_xlabel(labels[x])
        ax.set_ylabel(labels[y])
        if x == "sigma_qkv":
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(plt.NullFormatter())
        if y in ("grad_qkv", "grad_below"):
            ax.set_yscale("log")
    handles, legend_labels = axes.flat[0].get_legend_handles_labels()
    axes.flat[5].axis("off")
    axes.flat[5].legend(handles, legend_labels, loc="center", markerscale=3)
    return fig
