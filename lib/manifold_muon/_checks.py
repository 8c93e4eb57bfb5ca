"""The one check every public entry point makes on a matrix argument."""

from __future__ import annotations

import torch


def check_matrix(X, who: str, advice: str) -> None:
    """Refuse what is not a tensor of ndim >= 2 (a matrix or a batch of matrices), with ``advice`` on what to do."""
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"{who} takes a torch.Tensor, got {type(X).__name__}")
    if X.ndim < 2:
        raise ValueError(f"{who} needs a matrix or a batch of matrices (ndim >= 2), got shape {tuple(X.shape)}; {advice}")
