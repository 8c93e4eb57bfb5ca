"""What a training run records about its weights, gradients and updates: small pure functions.

Each takes tensors (or a model) and returns plain Python numbers, so that a record is one JSON line.

* ``sigma_max(W)``                  largest singular value (the spectral norm)
* ``singular_values(W)``            the full spectrum, descending
* ``rotation_angle(W_new, W_old)``  arccos(<W_new, W_old> / (|W_new| |W_old|)), in radians
* ``relative_update(W_new, W_old)`` |W_new - W_old|_F / |W_old|_F
* ``grad_norms_by_module(model)``   gradient Frobenius norm per module (parameters grouped by owner)
* ``constraint_residual(manifold, W)`` / ``tangent_violation(manifold, W, A)``  the manifold's own measures
* ``norm_gains(model)``             mean / min / max of every normalisation layer's gain vector
* ``attention_summary(stats)``      per layer and statistic of ``attention_probe``: mean, min, max over rows
* ``is_diverged(loss, threshold)``  NaN, inf or above the threshold
* ``jsonable(x)``                   tensors and numpy scalars -> floats and lists
* ``read_metrics(path, kind)``      the records of a run's metrics.jsonl (of one ``kind``), "nan" back to floats
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "sigma_max",
    "singular_values",
    "rotation_angle",
    "relative_update",
    "grad_norms_by_module",
    "constraint_residual",
    "tangent_violation",
    "norm_gains",
    "attention_summary",
    "is_diverged",
    "jsonable",
    "read_metrics",
]


def _matrix(W: torch.Tensor) -> torch.Tensor:
    if W.ndim != 2:
        raise ValueError(f"expected a matrix, got shape {tuple(W.shape)}; flatten leading dimensions first")
    return W.detach().float()


def sigma_max(W: torch.Tensor) -> float:
    return torch.linalg.matrix_norm(_matrix(W), ord=2).item()


def singular_values(W: torch.Tensor) -> list[float]:
    return torch.linalg.svdvals(_matrix(W)).tolist()


def rotation_angle(W_new: torch.Tensor, W_old: torch.Tensor) -> float:
    """The angle between W_new and W_old as vectors, arccos(<a, b> / (|a| |b|)).

    Computed as 2 atan2(|a^ - b^|, |a^ + b^|) with a^ = a / |a|: the same angle, but accurate for the
    tiny angles of one optimizer step, where arccos of a number near 1 loses all its digits.
    """
    a = W_new.detach().double().flatten()
    b = W_old.detach().double().flatten()
    na, nb = a.norm(), b.norm()
    if na == 0 or nb == 0:
        return float("nan")
    a, b = a / na, b / nb
    return (2 * torch.atan2((a - b).norm(), (a + b).norm())).item()


def relative_update(W_new: torch.Tensor, W_old: torch.Tensor) -> float:
    nb = W_old.detach().double().norm()
    if nb == 0:
        return float("inf")
    return ((W_new.detach().double() - W_old.detach().double()).norm() / nb).item()


def grad_norms_by_module(model: torch.nn.Module) -> dict[str, float]:
    """sqrt(sum of squared gradient entries) over each module's own parameters, keyed by module name."""
    sq: dict[str, float] = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        module = name.rsplit(".", 1)[0] if "." in name else name
        sq[module] = sq.get(module, 0.0) + p.grad.detach().double().pow(2).sum().item()
    return {k: math.sqrt(v) for k, v in sq.items()}


def _reduce(r) -> float:
    r = torch.as_tensor(r).detach().double()
    return r.max().item() if r.numel() else 0.0


def constraint_residual(manifold, W: torch.Tensor) -> float:
    """How far W is from the manifold, by the manifold's own measure (max over a batch)."""
    return _reduce(manifold.residual(W.detach().float()))


def tangent_violation(manifold, W: torch.Tensor, A: torch.Tensor) -> float:
    """How far the update direction A is from the tangent space at W, by the manifold's own measure."""
    return _reduce(manifold.tangent_residual(W.detach().float(), A.detach().float()))


def norm_gains(model: torch.nn.Module) -> dict[str, dict[str, float]]:
    """Summary of each normalisation layer's gain (LayerNorm, RMSNorm and look-alikes)."""
    out = {}
    for name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if "norm" in type(module).__name__.lower() and isinstance(w, torch.Tensor) and w.ndim == 1:
            g = w.detach().float()
            out[name] = {"mean": g.mean().item(), "min": g.min().item(), "max": g.max().item()}
    return out


def attention_summary(stats: dict) -> dict:
    """``{layer: {stat: tensor of rows}}`` -> ``{layer: {stat: {mean, min, max}}}`` (floats).

    All three matter: a saturating softmax shows first in the max of the logit range and the min of
    the Jacobian norm, long before the mean moves.
    """
    out = {}
    for layer, layer_stats in stats.items():
        out[str(layer)] = {}
        for name, rows in layer_stats.items():
            rows = torch.as_tensor(rows).detach().double().flatten()
            out[str(layer)][name] = {"mean": rows.mean().item(), "min": rows.min().item(), "max": rows.max().item()}
    return out


def is_diverged(loss: float, threshold: float) -> bool:
    return not math.isfinite(loss) or loss > threshold


def jsonable(x):
    """Tensors, numpy scalars, tuples and nested dicts -> what json.dumps takes; NaN/inf become strings."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return jsonable(x.item() if x.numel() == 1 else x.tolist())
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):  # numpy scalar
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)  # "nan" / "inf": strict JSON has no NaN
    return x


def _unjson(x):
    if isinstance(x, str) and x in ("nan", "inf", "-inf"):
        return float(x)
    if isinstance(x, dict):
        return {k: _unjson(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_unjson(v) for v in x]
    return x


def read_metrics(path, kind: str | None = None) -> list[dict]:
    """The records of ``path`` (a metrics.jsonl, or the run folder holding one), in order; with ``kind``
    only those of that kind ("step", "eval", "update"). Non-finite numbers come back as floats."""
    import json
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; run manifold_muon.train first")
    records = [_unjson(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if kind is None or r.get("kind") == kind]
