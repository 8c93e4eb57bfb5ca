"""The cost counter's host synchronisations against torch's profiler: every checked linear-algebra function's reads
(``CHECKED_READS``) as the installed torch makes them, and whole optimizer steps, where the counter's total must
equal the profiler's count of the read itself (``aten::_local_scalar_dense``)."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from manifold_muon.manifolds import get_manifold
from manifold_muon.opcount import CHECKED_READS, KernelCounter, OpCounter
from manifold_muon.optim import FSO, MACRO, SSO, ManifoldMuon, Muon, MuonH


def profiled_reads(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.name == "aten::_local_scalar_dense" for e in prof.events())


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3, 9, 6, generator=g, dtype=dtype)
    S = X.mT @ X + torch.eye(6, dtype=dtype)
    return X, S, torch.linalg.cholesky(S)


CALLS = {  # each checked function on a batch of three matrices
    torch.linalg.eigh: lambda X, S, L: torch.linalg.eigh(S),
    torch.linalg.eigvalsh: lambda X, S, L: torch.linalg.eigvalsh(S),
    torch.linalg.svd: lambda X, S, L: torch.linalg.svd(X, full_matrices=False),
    torch.linalg.svdvals: lambda X, S, L: torch.linalg.svdvals(X),
    torch.linalg.cholesky: lambda X, S, L: torch.linalg.cholesky(S),
    torch.cholesky_solve: lambda X, S, L: torch.cholesky_solve(X.mT, L),
    torch.linalg.solve: lambda X, S, L: torch.linalg.solve(S, X.mT),
    torch.linalg.inv: lambda X, S, L: torch.linalg.inv(S),
    torch.linalg.solve_ex: lambda X, S, L: torch.linalg.solve_ex(S, X.mT),
    torch.linalg.inv_ex: lambda X, S, L: torch.linalg.inv_ex(S),
    torch.linalg.cholesky_ex: lambda X, S, L: torch.linalg.cholesky_ex(S),
    torch.linalg.solve_triangular: lambda X, S, L: torch.linalg.solve_triangular(L, X.mT, upper=False),
    torch.linalg.qr: lambda X, S, L: torch.linalg.qr(X),
}


def test_every_checked_function_is_called_here():
    assert set(CALLS) == set(CHECKED_READS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("func", list(CHECKED_READS), ids=lambda f: f.__name__)
def test_checked_reads_are_what_torch_makes(func, dtype):
    args = _inputs(dtype)
    assert profiled_reads(lambda: CALLS[func](*args)) == CHECKED_READS[func]
    with OpCounter(big=9) as ops:
        CALLS[func](*args)
    assert ops.counts["sync"] == ops.counts["sync_checked"] == CHECKED_READS[func]


@pytest.mark.parametrize("ord_, reads", [(2, 1), (-2, 1), ("nuc", 1), ("fro", 0), (1, 0)])
def test_matrix_norm_reads_where_it_takes_singular_values(ord_, reads):
    X = _inputs(torch.float64)[0]
    assert profiled_reads(lambda: torch.linalg.matrix_norm(X, ord=ord_)) == reads
    with OpCounter(big=9) as ops:
        torch.linalg.matrix_norm(X, ord=ord_)
    assert ops.counts["sync"] == reads


SHAPES = [(12, 5), (5, 12), (8, 8), (7, 7), (12, 5)]  # tall, wide, square even and odd, two of one shape


def _optimizers():
    for name in ("stiefel", "dgram", "gram_oblique"):
        for inner in ("lean", "gram_admm", "exact", "post", "dual_ascent", "admm"):
            yield f"{name}-{inner}", name, lambda Ws, name=name, inner=inner: ManifoldMuon(
                Ws, lr=0.05, manifold=name, inner=inner)
        for tracker in ("newton", "newton_dk", "newton_cold"):
            yield f"{name}-lean-{tracker}", name, lambda Ws, name=name, tracker=tracker: ManifoldMuon(
                Ws, lr=0.05, manifold=name, inner="lean", tracker=tracker)
    yield "muon", None, lambda Ws: Muon(Ws, lr=0.05)
    for cls, name in ((MACRO, "spectral_sphere"), (MuonH, "frobenius_sphere"), (SSO, "spectral_sphere"),
                      (FSO, "frobenius_sphere")):
        yield cls.__name__, name, lambda Ws, cls=cls: cls(Ws, lr=0.05)


@pytest.mark.parametrize("label, manifold, make", list(_optimizers()), ids=lambda x: x if isinstance(x, str) else "")
def test_counter_sees_every_host_read_of_a_step(label, manifold, make):
    """Three steps of each optimizer on weights of every shape kind: the counter's ``sync`` equals the profiler's
    count of host reads in each step (so ``CHECKED_READS`` covers every checked call the library makes)."""
    g = torch.Generator().manual_seed(1)
    M = get_manifold(manifold) if manifold else None
    Ws = [torch.nn.Parameter(M.random_point(s, generator=g) if M else torch.randn(s, generator=g)) for s in SHAPES]
    opt = make(Ws)
    for _ in range(3):
        for w in Ws:
            w.grad = torch.randn(w.shape, generator=g)
        with OpCounter(big=12) as ops:
            reads = profiled_reads(opt.step)
        assert ops.counts["sync"] == reads, (label, dict(ops.counts))


def test_kernel_counter_counts_operations_that_do_work_and_no_views_allocations_or_reads():
    a, b = torch.ones(4, 3), torch.ones(3, 3)
    with KernelCounter() as k:
        c = a @ b                       # one product
        c.mT, c.view(-1), c[0], c.unsqueeze(0)  # views: metadata only
        e = torch.where(c > 0, c, 0)    # a comparison and a select (the 0 is made on the host)
        torch.empty(3)                  # an allocation
        float(e.sum())                  # a reduction, then a host read
    assert dict(k.counts) == {"aten.mm": 1, "aten.gt": 1, "aten.where": 1, "aten.sum": 1}
    assert k.total == 4


def test_kernel_counter_changes_no_step_and_sees_the_lean_step_launch_more_than_muons():
    g = torch.Generator().manual_seed(3)
    M = get_manifold("stiefel")
    W0 = M.random_point((24, 8), generator=g)
    G = torch.randn(24, 8, generator=g)
    totals = {}
    for name, make in (("lean", lambda p: ManifoldMuon(p, manifold="stiefel", inner="lean")), ("muon", Muon)):
        stepped = []
        for counted in (False, True):
            p = torch.nn.Parameter(W0.clone())
            opt = make([p])
            p.grad = G.clone()
            if counted:
                with KernelCounter() as k:
                    opt.step()
                totals[name] = k.total
            else:
                opt.step()
            stepped.append(p.detach().clone())
        assert torch.equal(*stepped)
    assert totals["lean"] > 2 * totals["muon"] > 0
