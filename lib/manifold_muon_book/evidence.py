"""Evidence for the blog post's training claims: what the run notebooks of chapters 01, 05 and 07 add to a run.

* ``NoisyMuon``: Muon whose msign is U diag(1 + u) V^T with u_i uniform in [-eps, eps] (the post's
  "orthogonalization error epsilon", B-MS-02); eps = 0 is the exact msign. A run or sweep trains it where
  its assignment names ``"muon"`` with ``train(cfg, optimizers={"muon": NoisyMuon})`` (or ``sweep``'s).
* ``common_val_loss(run_dir)``: ``manifold_muon_lab.evaluate.common_val_loss``, re-exported: the final
  weights of a finished run on the same validation batches for every run and seed.
* ``seed_spread(values)``: mean, sample standard deviation, min and max over seeds.
* ``spearman(x, y)`` and ``within_step_spearman(df, x, y, by)``: rank correlations, pooled and after
  removing what all runs share at one step (the common trend of training), for the causal chain of
  chapter 07.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from manifold_muon.optim.muon import Muon
from manifold_muon_lab.evaluate import common_val_loss  # noqa: F401  (re-exported: the run notebooks import it from here)

__all__ = ["NoisyMuon", "common_val_loss", "seed_spread", "spearman", "within_step_spearman",
           "study_runs", "sigma_table", "chain_table", "bootstrap_runs"]


class NoisyMuon(Muon):
    """Muon with msign(G) replaced by U diag(1 + u) V^T, u_i ~ U[-msign_noise, msign_noise] i.i.d. per singular
    value and step (an SVD per step: a test instrument, not a fast optimizer). The noise generator is seeded
    from torch's global seed when the optimizer is built, so runs with different seeds draw different noise.
    Its noise level is the optimizer override ``msign_noise`` (``TrainConfig.optimizer``)."""

    def __init__(self, params, msign_noise: float = 0.0, **kwargs):
        if not (isinstance(msign_noise, (int, float)) and 0 <= msign_noise < 1):
            raise ValueError(f"NoisyMuon: msign_noise must be in [0, 1) (singular values stay positive), got {msign_noise!r}")
        super().__init__(params, **kwargs)
        for g in self.param_groups:
            g["msign_noise"] = float(msign_noise)
        self._noise = torch.Generator().manual_seed(torch.initial_seed() % 2**63 + 7)

    def direction(self, W, G, group, states):
        U, _, Vh = torch.linalg.svd(G.double(), full_matrices=False)
        eps = group["msign_noise"]
        # drawn on the CPU generator whatever the device (the same noise on a GPU box as here), then moved
        u = (2 * torch.rand(U.shape[:-2] + U.shape[-1:], generator=self._noise, dtype=torch.float64) - 1).to(U.device) * eps
        return ((U * (1 + u).unsqueeze(-2)) @ Vh).to(G.dtype)


@torch.no_grad()
def seed_spread(values) -> dict:
    """mean, std (sample, ddof=1), min, max and n of a list of per-seed values."""
    v = np.asarray(list(values), dtype=float)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else math.nan,
            "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}


def spearman(x, y) -> float:
    """Spearman's rank correlation (average ranks for ties) of two equally long sequences."""
    import pandas as pd

    x, y = pd.Series(np.asarray(x, dtype=float)), pd.Series(np.asarray(y, dtype=float))
    return float(x.rank().corr(y.rank()))


def within_step_spearman(df, x: str, y: str, by: str = "step") -> float:
    """Spearman correlation of ``x`` and ``y`` after subtracting, from the ranks of each, their mean at the same
    ``by`` value: what is left compares runs (and layers) with each other at one moment of training, not the
    early steps with the late ones."""
    rx, ry = df[x].rank(), df[y].rank()
    rx = rx - rx.groupby(df[by]).transform("mean")
    ry = ry - ry.groupby(df[by]).transform("mean")
    if float(rx.std()) == 0 or float(ry.std()) == 0:  # nothing varies within a step (e.g. one run resampled)
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


# ----------------------------------------------------------------------------- reading the runs of a study

ATTN, MLP = ".attn.", ".mlp."


def study_runs(base, study: str = "main") -> dict:
    """``{(assignment, seed): run folder}`` of ``base/<study>/<assignment>/seed<k>`` (what runs/five_assignments writes)."""
    out = {}
    for d in sorted(Path(base, study).glob("*/seed*")):
        if (d / "metrics.jsonl").exists():
            out[(d.parent.name, int(d.name[len("seed"):]))] = d
    return out


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[parts.index("h") + 1]) if "h" in parts else None


def sigma_table(runs: dict) -> "pd.DataFrame":
    """One row per run, evaluation step and block matrix: assignment, seed, step, name, layer, group (attn/mlp),
    sigma_max, train_loss, val_loss."""
    import pandas as pd
    from manifold_muon_lab.metrics import read_metrics

    rows = []
    for (a, s), d in runs.items():
        for r in read_metrics(d, "eval"):
            for name, sig in r["sigma_max"].items():
                group = "attn" if ATTN in name else "mlp" if MLP in name else None
                if group is None:
                    continue
                rows.append({"assignment": a, "seed": s, "step": r["step"], "name": name, "layer": _layer(name),
                             "group": group, "sigma_max": sig, "train_loss": r["train_loss"], "val_loss": r["val_loss"]})
    return pd.DataFrame(rows)


def chain_table(runs: dict) -> "pd.DataFrame":
    """The post's causal chain, one row per run, evaluation step with an attention probe, and layer l:

    d and d_k (width and head width), ln1_gain_max (largest gain of the LayerNorm before the attention),
    sigma_qkv (sigma_max of layer l's fused query-key-value weight), logit_range and jacobian (mean over the
    probed rows of the logit range and of ||J||_F; logit_range_max, jacobian_min), entropy, grad_qkv (gradient norm of that weight at the same
    step, before clipping), grad_below (gradient norm of everything under layer l: embeddings and blocks < l),
    train_loss and val_loss."""
    import pandas as pd
    from manifold_muon_lab.metrics import read_metrics

    rows = []
    for (a, s), d in runs.items():
        records = read_metrics(d)
        params = json.loads((Path(d) / "provenance.json").read_text())["parameters"]
        grads = {r["step"]: r["grad_norm"] for r in records if r["kind"] == "update"}
        for r in records:
            if r["kind"] != "eval" or not r.get("attention") or r["step"] not in grads:
                continue
            g = grads[r["step"]]
            for layer, stats in r["attention"].items():
                l = int(layer)
                qkv = next(k for k in r["sigma_max"] if _layer(k) == l and k.endswith("attn.c_attn.weight"))
                below = [v for k, v in g.items() if (_layer(k) is not None and _layer(k) < l) or _layer(k) is None
                         and k.split(".")[-1] in ("wte", "wpe")]
                gain = r["norm_gains"].get(f"transformer.h.{l}.ln_1", {})
                rows.append({"assignment": a, "seed": s, "step": r["step"], "layer": l,
                             "d": params["n_embd"], "d_k": params["n_embd"] // params["n_head"],
                             "ln1_gain_max": gain.get("max", math.nan),
                             "sigma_qkv": r["sigma_max"][qkv],
                             "logit_range": stats["logit_range"]["mean"], "logit_range_max": stats["logit_range"]["max"],
                             "jacobian": stats["jacobian_fro"]["mean"], "jacobian_min": stats["jacobian_fro"]["min"],
                             "entropy": stats["entropy"]["mean"],
                             "grad_qkv": g[qkv.rsplit(".", 1)[0]],
                             "grad_below": math.sqrt(sum(v * v for v in below)),
                             "train_loss": r["train_loss"], "val_loss": r["val_loss"]})
    return pd.DataFrame(rows)


def bootstrap_runs(df, statistic, n: int = 200, seed: int = 0, by=("assignment", "seed")) -> tuple[float, float]:
    """A 90% percentile interval of ``statistic(df)`` when whole runs (groups ``by``) are resampled with
    replacement: the uncertainty that comes from having few seeds, not from the rows within a run."""
    rng = np.random.default_rng(seed)
    groups = [g for _, g in df.groupby(list(by))]
    import pandas as pd

    values = []
    for _ in range(n):
        pick = rng.integers(len(groups), size=len(groups))
        values.append(statistic(pd.concat([groups[i] for i in pick], ignore_index=True)))
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(np.quantile(values, 0.05)), float(np.quantile(values, 0.95))
