"""What a training run records about its weights, gradients and updates.

Small pure functions, each taking tensors (or a model) and returning plain Python numbers, so that a
record is one JSON line; and ``Recorder``, which writes a run's ``metrics.jsonl`` from them.

* ``sigma_max(W)``                  largest singular value (the spectral norm)
* ``singular_values(W)``            the full spectrum, descending
* ``rotation_angle(W_new, W_old)``  arccos(<W_new, W_old> / (|W_new| |W_old|)), in radians
* ``relative_update(W_new, W_old)`` |W_new - W_old|_F / |W_old|_F
* ``grad_norms_by_module(model)``   gradient Frobenius norm per module (parameters grouped by owner)
* ``constraint_residual(manifold, W)``  the manifold's own measure of how far W is from it
* ``norm_gains(model)``             mean / min / max of every normalisation layer's gain vector
* ``attention_summary(stats)``      per layer and statistic of ``attention_probe``: mean, min, max over rows
* ``is_diverged(loss, threshold)``  NaN, inf or above the threshold
* ``jsonable(x)``                   tensors and numpy scalars -> floats and lists
* ``read_metrics(path, kind)``      the records of a run's metrics.jsonl (of one ``kind``), "nan" back to floats
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from manifold_muon import MatrixOptimizer

__all__ = [
    "sigma_max",
    "singular_values",
    "rotation_angle",
    "relative_update",
    "grad_norms_by_module",
    "constraint_residual",
    "norm_gains",
    "attention_summary",
    "is_diverged",
    "jsonable",
    "read_metrics",
    "Recorder",
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
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; run manifold_muon_lab.train first")
    records = [_unjson(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if kind is None or r.get("kind") == kind]


class Recorder:
    """A run's ``metrics.jsonl``, one JSON object per line, each with a ``kind``:

    * ``step``   every step: loss, lr, grad norm, seconds in forward-backward and in the optimizer;
    * ``eval``   every ``eval_every`` steps, on the weights before that step: train/val loss, sigma_max of every
      matrix, constraint residuals, norm gains, attention statistics (``probe_every``), full singular spectra
      (``spectrum_every``);
    * ``update`` the step taken at an eval step: gradient norm per module, rotation angle and relative size of
      the update per matrix, and the tangent violation the optimizer recorded for the direction it took.

    Only the main rank writes (``main``). ``open(metrics_bytes)`` starts the file (0) or, on resumption, cuts
    it back to the length the checkpoint recorded.
    """

    def __init__(self, out_dir, cfg, model, optimizers, data, main: bool = True):
        self.path, self.cfg, self.model, self.data, self.main = Path(out_dir) / "metrics.jsonl", cfg, model, data, main
        self.names = {p: n for n, p in model.named_parameters()}
        self.matrices = [p for p in model.parameters() if p.ndim == 2 and p.requires_grad]
        self.constrained = {p: (opt, g) for opt in optimizers if isinstance(opt, MatrixOptimizer)
                            for g in opt.param_groups if g["manifold"] is not None for p in g["params"]}
        self.optimizers, self._log = optimizers, None

    def open(self, metrics_bytes: int) -> None:
        if not self.main:
            return
        if metrics_bytes == 0:
            self.path.write_text("")
        elif not self.path.exists() or self.path.stat().st_size < metrics_bytes:
            raise RuntimeError(f"{self.path} is shorter than the checkpoint says it was; it was edited or truncated "
                               "since. Pass resume=False (--no-resume) to start over")
        os.truncate(self.path, metrics_bytes)  # drop what a killed run wrote after its checkpoint
        self._log = open(self.path, "a")

    def tell(self) -> int:
        return self._log.tell() if self._log is not None else 0

    def emit(self, record: dict) -> None:
        if self._log is not None:
            self._log.write(json.dumps(jsonable(record), allow_nan=False) + "\n")
            self._log.flush()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    @torch.no_grad()
    def evaluate(self, step: int, forward, ctx, batch_size: int, spectra: bool, probe: bool) -> dict:
        """Write the ``eval`` record of the weights before ``step``; return its train and val loss."""
        losses = self.losses(forward, ctx, batch_size)
        record = {"kind": "eval", "step": step, **losses, "sigma_max": {}, "constraint_residual": {},
                  "norm_gains": norm_gains(self.model)}
        if spectra:
            record["spectrum"] = {}
        for p in self.matrices:
            name = self.names[p]
            record["sigma_max"][name] = sigma_max(p)
            if spectra:
                record["spectrum"][name] = singular_values(p)
            if p in self.constrained:
                opt, group = self.constrained[p]
                record["constraint_residual"][name] = constraint_residual(group["manifold"], opt.blocks(p, group))
        if probe:
            from .models import attention_probe

            X, _ = self.data.batch("val", 1, torch.Generator().manual_seed(self.cfg.seed + 31337))
            stats = attention_probe(self.model, X, layers=list(range(self.cfg.n_layer)), max_rows=self.cfg.probe_rows)
            record["attention"] = attention_summary(stats)
        self.emit(record)
        return losses

    @torch.no_grad()
    def losses(self, forward, ctx, batch_size: int) -> dict:
        """Mean loss over ``eval_batches`` batches of each split; the same batches at every evaluation."""
        self.model.eval()
        out = {}
        for split in ("train", "val"):
            g = torch.Generator().manual_seed(self.cfg.seed + (7919 if split == "val" else 104729))
            total = 0.0
            for _ in range(self.cfg.eval_batches):
                X, Y = self.data.batch(split, batch_size, g)
                with ctx:
                    _, loss = forward(X, Y)
                total += loss.item()
            out[f"{split}_loss"] = total / self.cfg.eval_batches
        self.model.train()
        return out

    def snapshot(self) -> dict:
        """W_t of every matrix, to measure the step about to be taken; the gradient norms of every module."""
        return {"weights": {p: p.detach().clone() for p in self.matrices}, "grad_norm": grad_norms_by_module(self.model)}

    @torch.no_grad()
    def update(self, step: int, before: dict) -> None:
        """Write the ``update`` record of the step W_t -> W_{t+1} (``before`` from ``snapshot``)."""
        state = {p: st for opt in self.optimizers for p, st in opt.state.items()}
        record = {"kind": "update", "step": step, "grad_norm": before["grad_norm"], "rotation_angle": {},
                  "relative_update": {}, "tangent_violation": {}, "duality_gap": {}, "inner_iterations": {}}
        for p, W_old in before["weights"].items():
            name = self.names[p]
            record["rotation_angle"][name] = rotation_angle(p, W_old)
            record["relative_update"][name] = relative_update(p, W_old)
            for key in ("tangent_violation", "duality_gap", "inner_iterations"):  # what the optimizer recorded
                if key in state.get(p, {}):
                    record[key][name] = state[p][key]
        self.emit(record)
