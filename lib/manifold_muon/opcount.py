"""Count what an optimizer step costs on a GPU: matrix products by size, eigendecompositions, SVDs, and
host synchronisations (a tensor read into Python: ``bool``, ``float``, ``int``, ``.item()``, ``.tolist()``).

    with OpCounter(big=m) as ops:      # a product is "full-size" when an operand has a dimension >= big
        opt.step()
    ops.counts  # {"matmul_full": .., "matmul_small": .., "eigh": .., "eigvalsh": .., "svd": .., "sync": ..}

It is a ``TorchFunctionMode``: it sees every torch call made in Python while it is active and changes none.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["OpCounter"]

_MATMUL = {torch.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.mm, torch.bmm, torch.addmm,
           torch.baddbmm, torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.bmm}
_DECOMP = {torch.linalg.eigh: "eigh", torch.linalg.eigvalsh: "eigvalsh", torch.linalg.svd: "svd",
           torch.linalg.svdvals: "svd", torch.linalg.cholesky: "cholesky", torch.linalg.qr: "qr"}
_SYNC = {torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.item, torch.Tensor.tolist,
         torch.Tensor.__index__}


class OpCounter(TorchFunctionMode):
    def __init__(self, big: int):
        super().__init__()
        self.big, self.counts = big, Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _MATMUL:
            mats = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2]
            full = any(max(a.shape[-2:]) >= self.big for a in mats)
            batch = max((a[..., 0, 0].numel() for a in mats), default=1)
            self.counts["matmul_full" if full else "matmul_small"] += batch
        elif func in _DECOMP:
            A = args[0]
            self.counts[_DECOMP[func]] += A[..., 0, 0].numel()
        elif func in _SYNC:
            self.counts["sync"] += 1
        return func(*args, **kwargs)
