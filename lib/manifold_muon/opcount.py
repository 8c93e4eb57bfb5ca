"""Count what an optimizer step costs on a GPU: matrix products by size, eigendecompositions, SVDs, and
host synchronisations.

    with OpCounter(big=m) as ops:      # a product is "full-size" when an operand has a dimension >= big
        opt.step()
    ops.counts  # {"matmul_full": .., "matmul_small": .., "matmul_f64": .., "eigh": .., "eigvalsh": .., "svd": ..,
                #  "cholesky": .., "sync": .., "sync_checked": ..}

``matmul_f64`` counts the products with a float64 operand among the others (counted in ``matmul_full`` or
``matmul_small`` too): on a GPU made for training a float64 product runs at a small fraction of float32's rate
(1/32 to 1/64 on consumer and workstation cards; about half on data-centre ones).

Host synchronisations (``sync``) are of two kinds. A tensor read into Python (``bool``, ``float``, ``int``,
``.item()``, ``.tolist()``, ``__index__``), which the code shows. And a read the code does not show
(``sync_checked``, counted in ``sync`` too): PyTorch's checked linear algebra reads its LAPACK / cuSOLVER status
(``info``) on the host after the call, to raise on a failed factorisation (``at::_linalg_check_errors``:
``infos.any().item()``), so every call of ``torch.linalg.eigh``, ``eigvalsh``, ``svd``, ``svdvals``,
``cholesky``, ``solve``, ``inv``, ``matrix_norm(ord=2)`` and ``torch.cholesky_solve`` waits for the device,
once per call (a batched call once for its whole batch). Their ``_ex`` forms (``cholesky_ex``, ``solve_ex``,
``inv_ex``) return the status as a tensor and read less or nothing, and ``solve_triangular`` reads nothing.
``CHECKED_READS`` holds how many reads each makes; ``tests/test_opcount.py`` pins every entry against the
profiler's count of ``aten::_local_scalar_dense`` (the read itself) under the installed torch, on the CPU, and
checks that the counter's total equals the profiler's for whole optimizer steps. The CPU runs the same checks
as CUDA (one code path for both in ``BatchLinearAlgebra.cpp``); that CUDA reads as many was not measured here.

It is a ``TorchFunctionMode``: it sees every torch call made in Python while it is active and changes none.

``KernelCounter`` counts what the counts above leave out: the operations of an eager step that do work on the
device, each at least one kernel launch on a GPU (the elementwise operations, reductions, copies and fills
between the products and the decompositions). On a GPU an eager step pays launch latency for each, whatever the
matrices' size (not measured here); ``torch.compile`` or a CUDA graph removes that cost.

    with KernelCounter() as kernels:
        opt.step()
    kernels.total, kernels.counts  # operations that launch, and by aten operator

It is a ``TorchDispatchMode`` (it sees the aten operations that torch's Python functions become). Not counted:
views (``OpOverload.is_view``, and ``_unsafe_view``), which only make new metadata; ``empty`` and ``empty_strided``
(an allocation, no kernel); ``scalar_tensor`` (the wrapped Python number of ``torch.where(c, x, 0)``, made on the
host); ``_local_scalar_dense`` (a host read, which ``OpCounter`` counts as ``sync``); the profiler's records.
Everything else counts once, so the total is a lower bound: an eigendecomposition, for one, launches many kernels
of its own.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter", "KernelCounter", "CHECKED_READS"]

_MATMUL = {torch.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.mm, torch.bmm, torch.addmm,
           torch.baddbmm, torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.bmm}
_DECOMP = {torch.linalg.eigh: "eigh", torch.linalg.eigvalsh: "eigvalsh", torch.linalg.svd: "svd",
           torch.linalg.svdvals: "svd", torch.linalg.cholesky: "cholesky", torch.linalg.cholesky_ex: "cholesky",
           torch.linalg.qr: "qr"}
_SYNC = {torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.item, torch.Tensor.tolist,
         torch.Tensor.__index__}
# host reads inside one call of a checked linear-algebra function (measured with torch's profiler on the CPU,
# pinned by tests/test_opcount.py)
CHECKED_READS = {torch.linalg.eigh: 1, torch.linalg.eigvalsh: 1, torch.linalg.svd: 1, torch.linalg.svdvals: 1,
                 torch.linalg.cholesky: 1, torch.cholesky_solve: 1, torch.linalg.solve: 3, torch.linalg.inv: 3,
                 torch.linalg.solve_ex: 2, torch.linalg.inv_ex: 2, torch.linalg.cholesky_ex: 0,
                 torch.linalg.solve_triangular: 0, torch.linalg.qr: 0}
_SPECTRAL_ORDS = (2, -2, "nuc")  # matrix_norm through singular values (svdvals: one read); "fro" and 1, inf read none


def _checked_reads(func, args, kwargs) -> int:
    if func is torch.linalg.matrix_norm:
        ord_ = kwargs.get("ord", args[1] if len(args) > 1 else "fro")
        return int(ord_ in _SPECTRAL_ORDS)
    return CHECKED_READS.get(func, 0)


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
            if any(a.dtype == torch.float64 for a in mats):
                self.counts["matmul_f64"] += batch
        elif func in _DECOMP:
            A = args[0]
            self.counts[_DECOMP[func]] += A[..., 0, 0].numel()
        if func in _SYNC:
            self.counts["sync"] += 1
        reads = _checked_reads(func, args, kwargs)
        if reads:
            self.counts["sync"] += reads
            self.counts["sync_checked"] += reads
        return func(*args, **kwargs)


_NO_KERNEL = {"aten._unsafe_view", "aten.empty", "aten.empty_strided", "aten.scalar_tensor", "aten._local_scalar_dense"}


class KernelCounter(TorchDispatchMode):
    """Operations that launch device work while active (module docstring): ``total`` and ``counts`` by aten operator
    (``str`` of its overload packet, e.g. "aten.mul")."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if not (func.is_view or func.namespace != "aten" or name in _NO_KERNEL):
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))
