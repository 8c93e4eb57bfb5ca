"""Momenta the inner solve meets in training: recorded at the CPU scale, and synthesised for larger shapes.

``record_momenta`` trains the ``cpu`` training preset (GPT-2, 4 layers, d = 64, KJV, Hetero with the
library's default solver) and records, at the chosen steps, every constrained weight W_t (before the step)
and the Nesterov momentum G_t that its inner solve receives (after gradient clipping), exactly as
``ManifoldMuon`` computes it. ``spectral_decay`` measures how fast their singular values fall, and
``synthetic_momentum`` builds a momentum of any shape with that decay, at the recorded scale, and with
LayerNorm's exact rank deficiency: a block matrix writing into the residual stream (attn/mlp c_proj) is
read only through LayerNorms, whose Jacobian removes the mean, so 1^T G = 0 on the (D_out, D_in) weight
(measured: sigma_min / sigma_max ~ 1e-8 on every recorded c_proj). (A matrix reading a LayerNorm output
would have G 1 = 0 only while the LayerNorm gains are all equal: not exact after training, and not
imposed.) Synthetic momenta are a model, and are labelled so.
"""

from __future__ import annotations

import math

import time

import torch

__all__ = ["record_momenta", "spectral_decay", "synthetic_momentum", "correlated", "rotating_stream"]


PROGRESS_EVERY_S = 10.0


def record_momenta(steps, preset: str = "cpu", seed: int = 1337, threads: int = 1, progress: bool = True,
                   **overrides) -> dict:
    """{step: {name: (W, G, manifold name)}} for the constrained weights of a ``preset`` run (float32, CPU);
    ``overrides`` change the preset's fields (e.g. the width, to record at GPT-2 small's shapes). The run is the
    training loop's own (``manifold_muon_lab.train.Trainer``, in a temporary folder), stopped after the last
    wanted step; a ``before_update`` hook reads each weight and its momentum just before the optimizer step.
    ``progress``: a line (step, seconds, rate, ETA) every ``PROGRESS_EVERY_S`` seconds and at the end, so that a
    recording at GPT-2 width is not minutes of silence."""
    import tempfile

    from manifold_muon.optim import ManifoldMuon
    from manifold_muon_lab.config import load_preset
    from manifold_muon_lab.train import Trainer

    from ..pipeline import repo_root

    out, wanted = {}, set(steps)

    def record(trainer, step):
        if step in wanted:
            names = {p: n for n, p in trainer.model.named_parameters()}
            mm = next(o for o in trainer.optimizers if isinstance(o, ManifoldMuon))
            out[step] = {names[p]: (p.detach().clone(), _nesterov(mm, p), g["manifold"].name)
                         for g in mm.param_groups for p in g["params"]}

    old = torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory(prefix="momenta-") as tmp:
            cfg = load_preset(preset, repo_root() / "runs" / "presets" / "training", seed=seed, threads=threads,
                              out_dir=tmp, **overrides)
            trainer = Trainer(cfg, hooks={"before_update": [record]}).setup(resume=False)
            total, t0, shown = max(wanted) + 1, time.perf_counter(), time.perf_counter()
            for k in range(total):
                trainer.step()
                now = time.perf_counter()
                if progress and (now - shown >= PROGRESS_EVERY_S or k + 1 == total):  # something to watch
                    rate = (k + 1) / (now - t0)
                    print(f"[record] training step {k + 1} of {total} ({now - t0:.0f} s, {rate:.2f} steps/s, "
                          f"ETA {(total - k - 1) / rate:.0f} s)", flush=True)
                    shown = now
            trainer.close()
        return out
    finally:
        torch.set_num_threads(old)


def _nesterov(opt, p) -> torch.Tensor:
    """The direction ``MatrixOptimizer`` will hand to the inner solve at this step (momentum not yet updated)."""
    group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
    mu = group["momentum"]
    buf = opt.state[p].get("momentum_buffer", torch.zeros_like(p)).lerp(p.grad, 1 - mu)
    return p.grad.lerp(buf, mu) if group["nesterov"] else buf


def spectral_decay(G: torch.Tensor) -> float:
    """Exponent p of the fit sigma_i ~ sigma_1 i^{-p} over the top half of G's spectrum (the exact zero
    that LayerNorm leaves is excluded)."""
    s = torch.linalg.svdvals(G.double())
    k = max(2, s.numel() // 2)
    i = torch.arange(1, k + 1, dtype=torch.float64)
    slope = torch.linalg.lstsq(torch.stack([torch.ones_like(i), i.log()], 1), s[:k].log()[:, None]).solution[1, 0]
    return float(-slope)


def synthetic_momentum(shape, decay: float, rms: float, writes_residual: bool, generator=None) -> torch.Tensor:
    """A (D_out, D_in) momentum: random singular vectors, sigma_i ~ i^{-decay}, RMS ``rms``, and, for a matrix
    that writes into the residual stream, LayerNorm's null direction 1^T G = 0."""
    m, n = shape
    k = min(m, n)
    U = torch.linalg.qr(torch.randn(m, k, generator=generator, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(n, k, generator=generator, dtype=torch.float64))[0]
    G = (U * torch.arange(1, k + 1, dtype=torch.float64).pow(-decay)) @ V.mT
    if writes_residual:
        G = G - G.mean(dim=0, keepdim=True)  # columns orthogonal to 1: 1^T G = 0
    return (G * (rms / G.pow(2).mean().sqrt())).float()


def correlated(G: torch.Tensor, fresh: torch.Tensor, rho: float = 0.95) -> torch.Tensor:
    """rho G + sqrt(1 - rho^2) fresh, at G's RMS: the previous step's momentum (Muon momentum 0.95)."""
    X = rho * G + math.sqrt(1 - rho**2) * fresh * (G.pow(2).mean().sqrt() / fresh.pow(2).mean().sqrt())
    return X * (G.pow(2).mean().sqrt() / X.pow(2).mean().sqrt())


def _orthonormal(X: torch.Tensor) -> torch.Tensor:
    """The Q of X = Q R with R's diagonal positive (so that a small change of X moves Q a little)."""
    Q, R = torch.linalg.qr(X)
    return Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)


def rotating_stream(shape, steps: int, decay: float = 1.3, rho: float = 0.95, generator=None) -> list[torch.Tensor]:
    """``steps`` momenta of unit RMS with one fixed spectrum (sigma_i ~ i^{-decay}) whose singular vectors turn a
    little each step: U <- orth(U + eps Z_U), V <- orth(V + eps Z_V), eps set (by bisection on the first step) so
    that consecutive momenta correlate ``rho``. Unlike a chain of ``correlated`` mixtures, whose sum of randomly
    oriented matrices flattens the spectrum step by step (after 48 steps at 768 x 2304 Muon's own e_W on it fell
    from 1.04% to 0.39%), this stream is stationary: every momentum has the training-like spectrum."""
    m, n = shape
    k = min(m, n)
    U = _orthonormal(torch.randn(m, k, generator=generator, dtype=torch.float64))
    V = _orthonormal(torch.randn(n, k, generator=generator, dtype=torch.float64))
    s = torch.arange(1, k + 1, dtype=torch.float64).pow(-decay)
    make = lambda U, V: (U * s) @ V.mT  # noqa: E731
    G0 = make(U, V)
    Zu = torch.randn(m, k, generator=generator, dtype=torch.float64)
    Zv = torch.randn(n, k, generator=generator, dtype=torch.float64)
    lo, hi = 1e-5, 1.0
    for _ in range(30):
        eps = math.sqrt(lo * hi)
        c = float((G0 * make(_orthonormal(U + eps * Zu), _orthonormal(V + eps * Zv))).sum() / (G0 * G0).sum())
        lo, hi = (eps, hi) if c > rho else (lo, eps)
    unit = lambda G: (G / G.pow(2).mean().sqrt()).float()  # noqa: E731 - each kept in float32 as it is made
    out = [unit(G0)]  # (so a long stream at GPT-2's shapes holds one float64 momentum at a time, not all of them)
    for _ in range(steps - 1):
        U = _orthonormal(U + eps * torch.randn(m, k, generator=generator, dtype=torch.float64))
        V = _orthonormal(V + eps * torch.randn(n, k, generator=generator, dtype=torch.float64))
        out.append(unit(make(U, V)))
    return out
