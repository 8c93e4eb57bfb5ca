"""The training grids behind chapters 10-13 (the paper "Demystifying Manifold Constraints"), and what the
chapters read from them.

A run notebook (``runs/nf_sweep.md``, ``runs/nf_gains.md``, ``runs/sphere_benchmark.md``,
``runs/width_transfer.md``: a title, a paragraph and its parameters) calls ``grid_notebook(name, scale, ...)``,
the body they share, which trains with ``run_grid(name, scale, out_dir)``. Its preset
(``runs/presets/<name>.yml``) names, per scale, a training preset, ``base`` overrides and ``axes``: a
mapping axis name -> list of override dicts. The grid is the product of the axes, the last axis varying
fastest (put the seed axis first and the optimizer axis last, so that each seed's optimizers run next to
each other in time and their step times compare under the same machine load). ``groups`` (a list of such
specs) runs several grids in one notebook.

Every run trains in ``runs/_train/<name>/<scale>/<tag>`` (git-ignored). What the book keeps is one
``summarize_run`` record per run, written to ``runs/<name>/<scale>/metrics.json``: final losses, the
status (a divergence is recorded, not raised), evaluation curves, the step loss and global gradient norm
every few steps, median step times, the tangent violation the optimizers recorded (per layer type), the
RMSNorm gains and the singular spectra at the start and the end.

``MANIFOLD_MUON_KEEP_RUNS=1`` keeps each run's final checkpoint so that executing the notebook again only
re-summarises (for developing the summary); by default checkpoints are deleted and every execution trains.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import statistics
import time
from pathlib import Path

from manifold_muon_lab.evaluate import common_val_loss as _common_val_loss

__all__ = ["expand_grid", "run_grid", "grid_notebook", "summarize_run", "common_val_loss", "final_weight_norms", "layer_type", "LAYER_TYPES", "runs_table",
           "seed_stats", "PAPER"]

# Layer types of the Qwen3-like model, in the order the paper's Figure 10 lists them (plus the MLP's others).
LAYER_TYPES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def layer_type(name: str) -> str:
    """``layers.0.attn.q_proj.weight`` -> ``q_proj``; a norm ``layers.1.mlp_norm`` -> ``mlp_norm``."""
    parts = name.split(".")
    if parts[-1] in ("weight", "bias"):
        parts = parts[:-1]
    return parts[-1]


def _merge(a: dict, b: dict) -> dict:
    """``b`` over ``a``; the ``optimizer`` dict (and its ``manifold_args``) merged key by key."""
    out = copy.deepcopy(a)
    for k, v in b.items():
        if k == "tag":
            continue
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _label(d: dict):
    """The coordinate of one axis entry: its ``tag``, else its single value, else key=value pairs."""
    if "tag" in d:
        return d["tag"]
    if len(d) == 1:
        return next(iter(d.values()))
    return ",".join(f"{k}={v}" for k, v in d.items())


def expand_grid(spec: dict) -> list[tuple[dict, dict]]:
    """[(coords, overrides)] for a spec with ``base`` and ``axes`` (or ``groups`` of such specs)."""
    if "groups" in spec:
        return [row for group in spec["groups"] for row in expand_grid(_group(spec, group))]
    axes = spec.get("axes") or {}
    names = list(axes)
    rows = []
    for combo in itertools.product(*(axes[n] for n in names)):
        overrides = dict(spec.get("base") or {})
        coords = {"group": spec["group"]} if spec.get("group") else {}
        for n, entry in zip(names, combo):
            overrides = _merge(overrides, entry)
            coords[n] = _label(entry)
        rows.append((coords, overrides))
    return rows


def _group(spec: dict, group: dict) -> dict:
    out = {k: v for k, v in spec.items() if k != "groups"}
    out["base"] = _merge(spec.get("base") or {}, group.get("base") or {})
    out["axes"] = group["axes"]
    out["group"] = group.get("name")
    return out


def _tag(coords: dict) -> str:
    return "/".join(str(v) for v in coords.values()).replace(" ", "")


def run_grid(name: str, scale: str, out_dir, workers: int = 1, progress: bool = False) -> dict:
    """Train the grid of ``runs/presets/<name>.yml`` at ``scale``; return the metrics to write."""
    from manifold_muon_lab.config import load_preset
    from manifold_muon_lab.sweep import sweep

    from .pipeline import load_run_preset, repo_root

    root = repo_root()
    preset = load_run_preset(name, scale, root)
    rows = expand_grid(preset)
    train_root = root / "runs" / "_train" / name / scale
    presets_dir = root / "runs" / "presets" / "training"
    cfgs = []
    for coords, overrides in rows:
        cfgs.append(load_preset(preset["training_preset"], presets_dir, **overrides,
                                out_dir=str(train_root / _tag(coords))))
    keep = os.environ.get("MANIFOLD_MUON_KEEP_RUNS") == "1"
    for c in cfgs:  # the final weights, for common_val_loss; deleted below unless kept
        c.checkpoint_every = 0
    t0 = time.perf_counter()
    results = sweep(cfgs, resume=keep, progress=progress, workers=workers)
    wall = time.perf_counter() - t0
    runs = []
    for (coords, overrides), cfg, result in zip(rows, cfgs, results):
        record = {"coords": coords, "overrides": overrides, "lr": cfg.lr, "seed": cfg.seed,
                  "assignment": cfg.assignment, **summarize_run(cfg.out_dir, result)}
        record["common_val_loss"] = common_val_loss(cfg.out_dir) if not record["diverged"] else float("nan")
        record["final_norms"] = final_weight_norms(cfg.out_dir) if not record["diverged"] else {}
        runs.append(_rounded(record))
        if not keep:
            for ckpt in Path(cfg.out_dir).glob("*.pt"):
                ckpt.unlink()
    return {"run": name, "scale": scale, "training_preset": preset["training_preset"], "n_runs": len(runs),
            "wall_time_s": wall, "train_time_s": sum(r.get("wall_time_s") or 0.0 for r in runs), "runs": runs}


def grid_notebook(name: str, scale: str, out_dir=None, workers: int = 1, inputs_sha: str | None = None) -> dict:
    """The body of the grid run notebooks: train the grid of ``runs/presets/<name>.yml`` at ``scale``
    (``run_grid``), print one line per run, and write ``metrics.json`` to ``out_dir`` (None:
    ``runs/<name>/<scale>``) with its provenance and the pipeline's ``inputs_sha``; returns the metrics.

    Each point trains in ``runs/_train/<name>/<scale>/`` (git-ignored; checkpoints are deleted at the end). A
    run that diverges is recorded as diverged, with its step, and the next one starts. What the book reads is
    ``runs/<name>/<scale>/metrics.json``: per run its coordinates, final losses, status, curves, step times,
    tangent violations, norm gains and singular spectra."""
    from manifold_muon_lab.provenance import provenance, write_json_atomic

    from .pipeline import load_run_preset, repo_root

    out_dir = Path(out_dir) if out_dir else repo_root() / "runs" / name / scale
    preset = load_run_preset(name, scale)
    print(f"scale={scale}: {len(expand_grid(preset))} runs of training preset {preset['training_preset']}")
    metrics = run_grid(name, scale, out_dir, workers=workers)
    for r in metrics["runs"]:
        print(f"{'/'.join(str(v) for v in r['coords'].values()):40s} {r['status']:22s} "
              f"val {r.get('final_val_loss', float('nan')):.4f}  {r.get('wall_time_s') or 0:.1f} s")
    print(f"{metrics['n_runs']} runs, {metrics['train_time_s']:.0f} s of training, {metrics['wall_time_s']:.0f} s wall")
    metrics.update(inputs_sha=inputs_sha, provenance=provenance(
        parameters={"scale": scale, "workers": workers, "preset": preset}, wall_time_s=metrics["wall_time_s"]))
    write_json_atomic(out_dir / "metrics.json", json.loads(json.dumps(metrics, default=float)))
    print(f"wrote {out_dir / 'metrics.json'}")
    return metrics


def common_val_loss(run_dir, batches: int = 32) -> float:
    """The grid's common evaluation: ``manifold_muon_lab.evaluate.common_val_loss`` on 32 batches, on the run's
    device (a GPU where there is one: on the CPU a paper preset's evaluation would take hours)."""
    return _common_val_loss(run_dir, batches=batches)


def final_weight_norms(run_dir) -> dict:
    """Per layer type, the median over layers of the final weights' spectral norm, Frobenius norm, largest
    row norm (the 2->inf norm) and largest column norm (the 1->2 norm); {} if the run left no final weights."""
    import torch

    from manifold_muon_lab.checkpoint import CHECKPOINT

    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return {}
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    by = {}
    for name, W in ckpt["model"].items():
        if W.ndim != 2 or layer_type(name) not in LAYER_TYPES:
            continue
        W = W.double()
        by.setdefault(layer_type(name), []).append({
            "spectral": torch.linalg.matrix_norm(W, ord=2).item(), "frobenius": W.norm().item(),
            "max_row": W.norm(dim=1).max().item(), "max_col": W.norm(dim=0).max().item()})
    return {k: {q: _median([v[q] for v in vs]) for q in vs[0]} for k, vs in by.items()}


def _rounded(x, digits: int = 6):
    """Floats to ``digits`` significant digits, recursively: a summary is read at a few digits, never at 17."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else x
    if isinstance(x, dict):
        return {k: _rounded(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v, digits) for v in x]
    return x


def _median(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else float("nan")


def _mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def _spectra(record: dict) -> dict:
    """Per matrix: stable rank, kappa = d_min / srk (the paper's Assumption 4), sigma_min / sigma_max."""
    out = {}
    for name, s in (record.get("spectrum") or {}).items():
        s = [float(x) for x in s]
        if not s or s[0] <= 0:
            continue
        fro2 = sum(x * x for x in s)
        srk = fro2 / (s[0] ** 2)
        out[name] = {"srk": srk, "d_min": len(s), "kappa": len(s) / srk, "cond_inv": s[-1] / s[0],
                     "sigma_max": s[0]}
    return out


def _gains(record: dict) -> dict:
    """Mean gain per kind of norm (attn_norm, mlp_norm, q_norm, k_norm, norm) over layers."""
    by = {}
    for name, g in (record.get("norm_gains") or {}).items():
        by.setdefault(layer_type(name), []).append(g["mean"])
    return {k: _mean(v) for k, v in by.items()}


def summarize_run(run_dir, result: dict | None = None, every: int = 5) -> dict:
    """What the chapters read from one training run (see the module docstring)."""
    from manifold_muon_lab.metrics import read_metrics

    run_dir = Path(run_dir)
    result = dict(result or {})
    status_path = run_dir / "status.json"
    if status_path.exists():
        result = {**json.loads(status_path.read_text()), **result}
    status = str(result.get("status", "missing"))
    out = {"status": status, "diverged": status.startswith("diverged"), "failed": status.startswith("failed"),
           "wall_time_s": result.get("wall_time_s")}
    if out["diverged"]:
        out["diverged_step"] = int(status.rsplit(" ", 1)[-1])
    if not (run_dir / "metrics.jsonl").exists():
        return out
    records = read_metrics(run_dir)
    evals = [r for r in records if r["kind"] == "eval"]
    steps = [r for r in records if r["kind"] == "step"]
    updates = [r for r in records if r["kind"] == "update"]
    out["final_val_loss"] = evals[-1]["val_loss"] if evals and not out["diverged"] else float("nan")
    out["final_train_loss"] = evals[-1]["train_loss"] if evals and not out["diverged"] else float("nan")
    out["eval"] = {"step": [r["step"] for r in evals], "val_loss": [r["val_loss"] for r in evals],
                   "train_loss": [r["train_loss"] for r in evals]}
    kept = [r for r in steps if r["step"] % every == 0 or r is steps[-1]]
    out["steps"] = {"step": [r["step"] for r in kept], "loss": [r["loss"] for r in kept],
                    "grad_norm": [r.get("grad_norm", float("nan")) for r in kept],
                    "lr_ratio": [r.get("lr_ratio", float("nan")) for r in kept]}
    timed = [r for r in steps if "time_opt_s" in r][3:]  # the first steps warm up kernels and caches
    out["time"] = {"fb_s": _median([r["time_fb_s"] for r in timed]), "opt_s": _median([r["time_opt_s"] for r in timed]),
                   "step_s": _median([r["time_fb_s"] + r["time_opt_s"] for r in timed])}
    vio, rot, rel = {}, {}, {}
    for r in updates:
        for name, v in (r.get("tangent_violation") or {}).items():
            vio.setdefault(layer_type(name), []).append(v)
        for name, v in (r.get("rotation_angle") or {}).items():
            rot.setdefault(layer_type(name), []).append(v)
        for name, v in (r.get("relative_update") or {}).items():
            rel.setdefault(layer_type(name), []).append(v)
    out["tangent_violation"] = {k: _mean(v) for k, v in vio.items()}
    out["tangent_violation_max"] = {k: max(v) for k, v in vio.items() if v}
    out["rotation_angle"] = {k: _median(v) for k, v in rot.items() if k != "embed"}
    out["relative_update"] = {k: _median(v) for k, v in rel.items() if k != "embed"}
    if evals:
        out["gains_start"], out["gains_end"] = _gains(evals[0]), _gains(evals[-1])
        out["sigma_max_end"] = {k: _median([v for n, v in evals[-1]["sigma_max"].items() if layer_type(n) == k])
                                for k in {layer_type(n) for n in evals[-1]["sigma_max"]}}
        types = sorted({layer_type(n) for n in evals[0]["sigma_max"]})
        out["sigma_max_series"] = {"step": [r["step"] for r in evals],
                                   **{k: [_median([v for n, v in r["sigma_max"].items() if layer_type(n) == k])
                                          for r in evals] for k in types}}
        with_spectra = [r for r in evals if "spectrum" in r]
        if with_spectra:
            out["spectra_start"], out["spectra_end"] = _spectra(with_spectra[0]), _spectra(with_spectra[-1])
            out["spectra_end_step"] = with_spectra[-1]["step"]
    return out


def runs_table(metrics: dict, fields=("final_val_loss", "final_train_loss", "status", "diverged")):
    """One row per run: its coordinates, lr, seed and the chosen summary fields (a pandas DataFrame)."""
    import pandas as pd

    rows = []
    for r in metrics["runs"]:
        rows.append({**r["coords"], "lr": r["lr"], "seed": r["seed"], **{f: r.get(f) for f in fields}})
    return pd.DataFrame(rows)


def seed_stats(df, by, value="final_val_loss"):
    """Mean, standard deviation, min, max and count over seeds of ``value``, grouped by ``by``."""
    return df.groupby(by, sort=False)[value].agg(["mean", "std", "min", "max", "count"]).reset_index()


# The paper's published numbers that the chapters set beside ours (text of "Demystifying Manifold
# Constraints in LLM Pre-training", An, Li, Goldfarb, Ma, 2026).
PAPER = {
    # Table 3: 330M, no learnable normalisation; validation loss per learning rate (None = NaN)
    "table3": {"lr": [3e-3, 5e-3, 7e-3, 1e-2, 3e-2],
               "muon": [2.912, 2.849, 2.823, 2.813, None],
               "macro_fro": [2.901, 2.825, 2.787, 2.758, 2.781],
               "macro_spec": [2.820, 2.768, 2.747, 2.739, 2.819]},
    # Table 4: (train, validation) at 120M, 330M, 1B (None = not run)
    "table4": {"muon": [(3.008, 3.019), (2.684, 2.736), (2.419, 2.473)],
               "muonh_fro": [(2.997, 3.007), (2.680, 2.717), (2.404, 2.468)],
               "muonh_spec": [(3.008, 3.019), (2.679, 2.716), (2.409, 2.464)],
               "fso": [(2.990, 3.001), (2.690, 2.726), None],
               "sso": [(3.001, 3.011), (2.675, 2.712), None],
               "macro_fro": [(2.995, 3.005), (2.670, 2.718), (2.403, 2.467)],
               "macro_spec": [(3.007, 3.017), (2.665, 2.714), (2.398, 2.461)]},
    "table4_scales": ["120M", "330M", "1B"],
}
