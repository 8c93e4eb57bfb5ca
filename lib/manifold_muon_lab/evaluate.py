"""Evaluating a finished run's weights on batches that every run shares.

The training loop's own evaluations draw their batches from the run's seed, so across seeds two runs
differ in batches as well as in weights. ``common_val_loss`` evaluates the final weights of a run on
``batches`` validation batches drawn from one fixed ``seed``, the same for every run of the same data and
block size, so that two runs compare by their training alone.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

__all__ = ["common_val_loss"]


@torch.no_grad()
def common_val_loss(run_dir, batches: int = 16, batch_size: int | None = None, seed: int = 2026,
                    device: str | None = None) -> float:
    """Mean validation loss of the final weights in ``run_dir/checkpoint.pt`` on ``batches`` batches of
    ``batch_size`` sequences (default: the run's) drawn from ``seed``; NaN if the run left no finished
    checkpoint (it diverged or was stopped)."""
    from .checkpoint import CHECKPOINT
    from .config import TrainConfig
    from .data import Batches
    from .models import build_model
    from .train import model_fields

    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return math.nan
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    ckpt = torch.load(path, map_location=device, weights_only=False)
    if not ckpt.get("done", False):
        return math.nan
    cfg = TrainConfig.from_dict(ckpt["config"])
    data = Batches(cfg.data, cfg.block_size, device, cfg.data_dir, cfg.vocab_size)
    model = build_model(cfg.family, **model_fields(cfg, data.vocab_size)).to(device)
    model.load_state_dict(ckpt["model"])
    model.eval()
    g = torch.Generator().manual_seed(seed)
    size = batch_size or cfg.batch_size
    # evaluated in equal chunks of at most the run's micro-batch (and EVAL_CHUNK sequences): a paper preset's
    # global batch of 1024 sequences would not fit one device's memory at once; the loss is their mean
    micro = max(1, min(size // max(1, cfg.gradient_accumulation_steps), EVAL_CHUNK))
    while size % micro:
        micro -= 1
    total = 0.0
    with torch.no_grad():
        for _ in range(batches):
            X, Y = data.batch("val", size, g)
            total += sum(model(X[i:i + micro], Y[i:i + micro])[1] for i in range(0, size, micro)).item() * micro / size
    return total / batches


EVAL_CHUNK = 64  # sequences per forward pass of ``common_val_loss`` at most
