"""Reading a grid that tunes several arms alike (learning rate x radius, several seeds): the configuration each
run trained with, each arm's best cell, the paired gap between two arms' best cells, and the table a page shows.

Shared by chapter 11 (``nf_pages``: the normalisation-free sweep) and chapter 13 (``bench_pages``: the sphere
benchmark), whose issue-21 comparisons give both arms the same grid and read each at its own best cell.
"""

from __future__ import annotations

__all__ = ["run_settings", "best_cells", "paired_gap", "tuned_table"]


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


def best_cells(tuned):
    """Per (norms, optimizer): the (lr, r) cell with the lowest seed-mean validation loss, its mean, its seed
    range and its per-seed losses (a Series indexed by seed, column ``per_seed``); also the grid's size and
    whether the best cell lies on the grid's edge in rate or radius (``edge``: "no", "rate", "radius", both)."""
    import pandas as pd

    key = tuned.r.fillna(-1.0)
    cells = tuned.assign(r_key=key).groupby(["norms", "optimizer", "lr", "r_key"]).val
    means = cells.mean()
    rows = []
    for (norms, opt), m in means.groupby(level=["norms", "optimizer"]):
        (_, _, lr, r_key), mean = m.idxmin(), float(m.min())
        sel = tuned[(tuned.norms == norms) & (tuned.optimizer == opt) & (tuned.lr == lr) & (key == r_key)]
        per_seed = sel.set_index("seed").val.sort_index()
        arm = tuned[(tuned.norms == norms) & (tuned.optimizer == opt)]
        edge = [name for name, v, grid in (("rate", lr, arm.lr), ("radius", r_key, key[arm.index]))
                if grid.nunique() > 1 and v in (grid.min(), grid.max())]
        rows.append(dict(norms=norms, optimizer=opt, lr=lr, r=None if r_key < 0 else r_key, mean=mean,
                         range=float(per_seed.max() - per_seed.min()), per_seed=per_seed, cells=len(m),
                         edge=" and ".join(edge) or "no"))
    return pd.DataFrame(rows).set_index(["norms", "optimizer"])


def tuned_table(best, names: dict, norms_column: bool = True):
    """``best_cells`` as shown: optimizer (its page name from ``names``), norms (unless ``norms_column`` is False),
    the grid searched, the best cell, whether it is on the grid's edge, and its mean and seed range."""
    import pandas as pd

    def show(x):
        return "none" if x is None or x != x else format(x, "g")

    out = pd.DataFrame([{"optimizer": names[o], "RMSNorm gains": norms, "cells searched": int(b.cells),
                         r"best $\eta$": show(b.lr), "best $r$": show(b.r), "on the grid's edge": b.edge,
                         "mean": b["mean"], "seed range": b["range"]}
                        for (norms, o), b in best.sort_index(level=1).iterrows()])
    return out if norms_column else out.drop(columns="RMSNorm gains")


def paired_gap(best, a, b):
    """Per-seed differences of two best cells (``a`` and ``b`` are (norms, optimizer) keys), aligned by seed, and
    the larger of the two cells' seed ranges."""
    d = best.loc[a, "per_seed"] - best.loc[b, "per_seed"]
    if d.isna().any():
        raise ValueError(f"the best cells of {a} and {b} do not share their seeds")
    return d, max(float(best.loc[a, "range"]), float(best.loc[b, "range"]))
