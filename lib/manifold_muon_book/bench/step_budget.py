"""Where the lean step's time goes at the table's width-128 misses, and whether one eigendecomposition a step, or a
float32 one, would do (issue 19).

Two measurements, both on the table's stationary streams (``solver_table``), one CPU thread:

``budget``: the lean step (``ManifoldMuon(inner="lean")``) and Muon's float32 step (``solver_table.muon_fp32``),
each on its own copy of the table's start point, stepped at lr 0 along the timing stream, first timed as they are
(median step, rounds alternating), then ``timed`` more steps with each eigendecomposition (``eigh``,
``eigvalsh``, Cholesky) and each matrix product timed as it runs (a ``TorchFunctionMode``, ``_CallTimer``; one
thread, so each call is synchronous), in three bins: eigendecompositions, products whose operands are all n x n,
products with an m-long side (m x n). What is left of the median step is "everything else": the elementwise
operations, copies, reductions, triangular solves, and the step's Python and dispatch. ``floor_ratio`` is what the
lean step's eigendecompositions and products alone cost, in Muon steps: a step with no Python and no small
operation at all could not be cheaper than that with these calls. Why not ``torch.profiler``: with
``record_shapes`` it made the 128 x 128 DGram step five times slower, most of it charged to the small operations
(2026-12-06), so its shares said more about the profiler than about the step.

``current`` (added 2026-12-08): ``budget`` again with today's library at every width-128 weight of the table, read by
``CURRENT_CRITERION``, and each step's operations that launch device work (``manifold_muon.opcount.KernelCounter``:
``budget``'s rows carry ``lean_kernels`` and ``muon_kernels``; ``kernel_counts`` at GPT-2 small's shapes).

``one_eigh``: the Newton tracker (the lean default on rectangular DGram; ``tracker="newton"`` on Stiefel) against
a prototype that needs one eigendecomposition a step instead of two, the idea the last closing note on issue 19
(stop 46) named next. The prototype (``lagged_newton_track``, swapped in for ``inner_solvers.newton_track`` inside this
benchmark only, not a setting of the library) takes one float64 eigendecomposition of N = Z^T Z at the carried
multiplier, certifies its msign candidate there (so the direction is the carried multiplier's, one momentum
behind the tracker's), takes the Newton step from the same eigendecomposition for the next step, and damps it by
a float64 ``eigvalsh`` of the new N (the dual value; at n = 128 on one thread, 2026-12-06, about 0.4 of an
eigendecomposition's time). Also
the library's tracker with more conjugate-gradient steps (``inner_steps`` 2 and 4), the other way to spend the
time. Per draw: the settled e_W at lr 0.02 after the table's ``STEADY`` momenta against the certified reference,
as a multiple of Muon's own e_W on the same momentum. Criterion, set before this benchmark was written but after
a scratch run of the same prototype at the same shapes (draws 0-2, 2026-12-06): the prototype would be worth
building into the library only if its settled e_W is at most 2/3 of Muon's (issue 19's bar) on every draw at
the three rectangular width-128 DGram weights.

``float32``: the other way to make the tracker's first eigendecomposition cheaper, in float32 instead of float64
(the one at the carried multiplier, which gives the Newton direction and the damping's f(Lambda); the certificate
stays float64). The arm ``eig32`` (``float32_direction``, ``inner_solvers.newton_track`` with ``eig_dtype`` float32
inside this benchmark only, not a setting of the library) runs beside the others in ``one_eigh``, which also times
every arm against Muon's float32 step (``solver_table.paired_times``, the table's protocol). Two more measurements
for it: the library's tracker and ``eig32`` at GPT-2 small's ``c_attn`` shape on DGram (768 x 2304, draw 0;
``EIG32_GPT2``), and ``fixed_floor``: the certified gap and the damping after ``FIXED_STEPS`` steps on one momentum
repeated, where a tracker should converge (the library's docstring says a float32 eigendecomposition stalls there).
Criterion, set after scratch runs of the same swap (2026-12-06: draws 0-2 at the width-128 shapes, draw 0 at
768 x 2304 DGram), so not blind: float32 would be worth building into the library only if (a) its settled
e_W is within 0.02 of the library tracker's (both as multiples of Muon's) on every draw at the three rectangular
width-128 weights and at ``c_attn``, (b) it brings a width-128 weight whose table ratio misses its target under it
on all three draws, and (c) on the fixed momentum it ends within 10x of the library tracker's gap.

``dk``: a third way to one eigendecomposition a step, which keeps the tracker's order (Newton step first, then the
direction at the new multiplier Lambda1) where ``lagged`` gave it up. The arm (``first_order``,
``first_order_newton_track`` swapped in for ``inner_solvers.newton_track``; since 2026-12-06 it calls the library's
``tracker="newton_dk"`` code, ``inner_solvers.first_order_certificate``) builds the direction and the bound at Lambda1
from the carried multiplier's eigendecomposition instead of a second one: the bound is sum_i ||Z1 v_i|| over that
eigenbasis (an upper bound on ||Z1||_* for any orthonormal basis, Schur-Horn; so the gap is still a certificate), the
direction Z1 N1^{-1/2} with N1^{-1/2} to first order in that basis (Daleckii-Krein), made feasible as every candidate
is. Changed after the criterion below was judged (2026-12-06, logged here and in chapter 04): the first run expanded
N1^{-1/2} about N's eigenvalues; on rank-4 momenta (not among this benchmark's streams) that candidate certified
nothing, so the expansion is now about diag(V^T N1 V) (the two agree to first order), and the benchmark was run again
with it; the criterion is unchanged. It runs beside the other arms in ``one_eigh``, at
``float32_weights`` and in ``fixed_floor``. Criterion, set after a scratch run of the same prototype on the 18 draws at
width 128 (2026-12-06) and before the runs at ``c_attn`` and on one momentum: it would be worth building into the
library if (a) its settled e_W (as a multiple of Muon's) is within 0.05 of the library tracker's on every DGram draw at
the three rectangular width-128 shapes and at ``float32_weights``, (b) its step is cheaper than the library
tracker's on every one of those DGram draws (the paired ratios of the same run), and (c) on one momentum on DGram it
ends within 10x of the library tracker's gap. DGram only: it is where the Newton tracker is the default (on
Stiefel the default is the cold step); the Stiefel draws are reported, not judged. The same bound with the Ritz
candidate V diag(M_ii^{-1/2}) V^T (no first-order term) is the one-eigendecomposition variant ``bench.lean_newton``'s
docstring measured before the tracker had its start and its preconditioner (it settled further than the tracker of
that day); the arm ``ritz`` runs it again beside ``dk``, to show what the first-order term buys. It is reported, not
judged (added after the criterion above, on reading that docstring).

``square32``: the same "cheaper call" for square Stiefel's closed form (one eigendecomposition of S^T S, S = 2 skew(W^T
G), ``manifold_muon.optim.manifold_muon.square_stiefel_step``), the table's other width-128 miss. On the table's
momentum (``solver_table``'s stream, draws ``seeds``) at n = 128 and 768, B = V Q V^T is read off the
eigendecomposition in float64 and in float32 (of the same float64 S^T S, rounded), and certified the same way for
both: the bound sum_i ||S v_i|| (Schur-Horn, as ``dk``'s; tight for float64's V to rounding), the value <S, B> divided by
||V||_op^2 (B's op-norm is at most that; float32's V is orthogonal only to its rounding). Also each eigendecomposition's
median time (30 calls). (Chapter 04's section on the closed form's cost found float32's vectors mixed across pairs,
which fails the pairing check; the Schur-Horn bound certifies them anyway, so float32 is judged by a number here.)
Criterion, set after a scratch run of the same swap at both sizes (2026-12-06), so not blind:
float32 would serve the closed form only if its certified gap is at most 1e-6 (issue 19's exactness target for square
Stiefel) on every draw at both sizes.

A benchmark: it measures and reports, it asserts nothing about speed or accuracy. ``budget`` runs on the CPU even
where there is a GPU: a GPU call returns before its kernel ends, so timing calls from the host says nothing there
(on a GPU the question is ``compiled_step``'s, in ``runs/gpu_check.sh``).

    python -m manifold_muon_book.bench.step_budget       # into runs/bench/step_budget.json (about 12 minutes)
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

from torch.overrides import TorchFunctionMode

from manifold_muon.opcount import _DECOMP, _MATMUL, KernelCounter
from manifold_muon.optim import ManifoldMuon
import manifold_muon.optim.inner_solvers as inner_solvers
from manifold_muon.optim.inner_solvers import Span, _sym, eig_sqrt, factor, feasible, inv_sqrt, newton_direction
from .common import one_cpu_thread, write_result

# the table's lean misses at width 128 (runs/bench/solver_table.json), and GPT-2 small's c_attn for contrast
BUDGET_WEIGHTS = (((128, 128), "stiefel"), ((128, 128), "dgram"), ((128, 512), "dgram"), ((512, 128), "dgram"),
                  ((384, 128), "dgram"), ((768, 2304), "dgram"))
ONE_EIGH_SHAPES = ((128, 512), (512, 128), (384, 128))
ONE_EIGH_MANIFOLDS = ("dgram", "stiefel")
ARMS = {"newton": dict(), "newton_cg2": dict(inner_steps=2), "newton_cg4": dict(inner_steps=4),
        "lagged": dict(), "eig32": dict(), "dk": dict(), "ritz": dict()}
EIG32_GPT2 = ((768, 2304), "dgram")  # float32's one GPT-2 small weight (c_attn, draw 0): a reference there takes minutes
WIDE_ARMS = ("newton", "eig32", "dk", "ritz")  # the arms at ``float32_weights`` and on one momentum (``fixed_floor``)
FIXED_STEPS = 30
BINS = ("eigendecompositions", "n x n products", "m x n products", "everything else")


def lagged_newton_track(pic, Lambda, t, cg_steps: int, rtol, dtype=torch.float32, eig_dtype=torch.float64,
                        precondition: bool = True, eigenbasis: bool = False):
    """The one-eigendecomposition prototype (module docstring), with ``inner_solvers.newton_track``'s signature and
    returns: (A, value, bound, A^T A, Lambda', t'), A certified at the carried ``Lambda`` (bound = its dual value,
    so the gap is still a certificate), Lambda' = Lambda + t x where the dual value at it (float64 ``eigvalsh``)
    fell below the carried one's, else Lambda (t doubling to 1, or halving, as in the library's tracker)."""
    a, V, s, Lambda1, N1 = _newton_step(pic, Lambda, t, cg_steps, rtol, dtype, eig_dtype, precondition, eigenbasis)
    f0 = s.sum(-1)
    Y = factor(V, s, lambda s: inv_sqrt(s, rtol))
    A, value, AtA = feasible(pic, Span(a @ Y, Y), 0, fast=True, with_gram=True)
    f1 = torch.linalg.eigvalsh(_sym(N1).to(torch.float64)).clamp_min(0).sqrt().sum(-1)
    return (A, value, f0, AtA, *inner_solvers.damped(f1.to(f0.dtype) < f0, Lambda1, Lambda, t))


def _newton_step(pic, Lambda, t, cg_steps, rtol, dtype, eig_dtype, precondition, eigenbasis):
    """What the prototypes share with the library's tracker: the eigendecomposition N = V diag(s^2) V^T at the carried
    multiplier (in ``eig_dtype``), the library's Newton direction from it, damped by ``t``. Returns (a, V, s, Lambda1,
    N1), a = K0 + 2 Lambda and N1 = Z1^T Z1 at Lambda1 (not symmetrised)."""
    a = pic.K0 + 2 * Lambda
    N = _sym(a.mT @ pic.dmul(a) + pic.R)
    V, s = eig_sqrt(N.to(eig_dtype))
    V, s = V.to(N.dtype), s.to(N.dtype)
    x = newton_direction(pic, a, V, s, rtol, cg_steps, dtype, precondition, eigenbasis)  # the library's tracker's
    x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    Lambda1 = Lambda + t[..., None, None] * x.to(Lambda.dtype)
    a1 = pic.K0 + 2 * Lambda1
    return a, V, s, Lambda1, a1.mT @ pic.dmul(a1) + pic.R


def first_order_newton_track(pic, Lambda, t, cg_steps: int, rtol, dtype=torch.float32, eig_dtype=torch.float64,
                             precondition: bool = True, eigenbasis: bool = False, first_order: bool = True,
                             about_s: bool = False):
    """The first-order arm (module docstring, ``dk``), with ``inner_solvers.newton_track``'s signature and returns: the
    library's Newton step from the carried multiplier, then the candidate and the bound at the new multiplier Lambda1
    from the carried multiplier's eigendecomposition instead of a second one (``inner_solvers.first_order_certificate``:
    the Schur-Horn bound, the Daleckii-Krein first-order candidate), damped by the library tracker's rule
    (``inner_solvers.damped``). Since 2026-12-06 the library's ``tracker="newton_dk"`` step, bit for bit
    (``tests/test_step_budget.py``); the benchmark's first run used this module's own copy, which expanded about N's
    eigenvalues (module docstring; ``about_s=True`` runs it again, ``first_version``). ``first_order=False`` drops the
    off-diagonal term: the Ritz candidate
    with the same bound (the arm ``ritz``, the variant ``bench.lean_newton``'s docstring measured before the tracker had
    its start and its preconditioner)."""
    _, V, s, Lambda1, _ = _newton_step(pic, Lambda, t, cg_steps, rtol, dtype, eig_dtype, precondition, eigenbasis)
    A, value, bound, AtA = inner_solvers.first_order_certificate(pic, Lambda1, V, rtol, first_order,
                                                                  about=s if about_s else None)
    return (A, value, bound, AtA, *inner_solvers.damped(bound < s.sum(-1), Lambda1, Lambda, t))


SQUARE32_SIZES = (128, 768)


def _paired_msign(S, V):
    """(value, bound) of B = V Q V^T for a skew S (float64) from V, the eigenvectors of S^T S in ascending order, paired
    from the top (``manifold_muon.optim.manifold_muon.skew_pairs``' reading): value = <S, B> / ||V||_op^2 (a lower
    bound on the objective of the feasible B / ||B||_op), bound = sum_i ||S v_i|| (>= ||S||_* for orthonormal V)."""
    o = S.size(-1) % 2
    SV = S @ V
    w = (SV[..., o::2] * V[..., o + 1::2]).sum(-2)
    op = torch.linalg.eigvalsh(V.mT @ V)[..., -1].clamp_min(1)  # ||V||_op^2 >= ||B||_op
    bound = torch.linalg.vector_norm(SV, dim=-2).sum(-1)
    return 2 * w.abs().sum(-1) / op, bound


def square32(n: int, seed: int, calls: int = 30) -> dict:
    """Square Stiefel's closed form with the eigendecomposition of S^T S in float64 (the library's) and in float32, on
    the table's momentum of draw ``seed`` at n x n: each one's certified gap (``_paired_msign``), the exact relative
    sub-optimality against ||S||_* (singular values), and the median time of each eigendecomposition."""
    from .solver_table import REPEATS, WARMUP, start_point, stream

    W = start_point((n, n), "stiefel", seed).float().cpu()
    G = stream((n, n), WARMUP + REPEATS + 1, seed)[-1].float().cpu()
    K = W.mT @ G
    S = (K - K.mT).double()  # as the library forms it: products in the weights' precision
    N = S.mT @ S
    nuclear = float(torch.linalg.svdvals(S).sum())
    row = dict(n=n, seed=seed, calls=calls)
    for name, dt in (("float64", torch.float64), ("float32", torch.float32)):
        Nd = N.to(dt)
        _, V = torch.linalg.eigh(Nd)
        value, bound = _paired_msign(S, V.double())
        row[f"{name}_gap"] = float((bound - value) / bound)
        row[f"{name}_suboptimality"] = (nuclear - float(value)) / nuclear
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            torch.linalg.eigh(Nd)
            times.append(time.perf_counter() - t)
        row[f"{name}_eigh_ms"] = 1e3 * statistics.median(times)
    return row


@contextlib.contextmanager
def _tracker(replacement):
    """``inner_solvers.newton_track`` replaced by ``replacement`` inside the block, restored on any exit."""
    original = inner_solvers.newton_track
    inner_solvers.newton_track = replacement
    try:
        yield
    finally:
        inner_solvers.newton_track = original


def float32_direction():
    """``inner_solvers.newton_track`` with its first eigendecomposition (at the carried multiplier) in float32 inside
    the block (this benchmark only; the certificate's stays float64)."""
    return _tracker(functools.partial(inner_solvers.newton_track, eig_dtype=torch.float32))


def swapped(arm: str):
    """The context an arm of ``ARMS`` runs in: the prototype's or float32's swap, else none."""
    return {"lagged": lagged, "eig32": float32_direction, "dk": first_order,
            "ritz": lambda: first_order(False)}.get(arm, contextlib.nullcontext)()


def lagged():
    """``inner_solvers.newton_track`` replaced by ``lagged_newton_track`` inside the block (this benchmark only)."""
    return _tracker(lagged_newton_track)


def first_version():
    """``inner_solvers.newton_track`` replaced by the first version of ``dk`` inside the block: the expansion about N's
    eigenvalues at the carried multiplier, not about diag(V^T N1 V) (chapter 04's comparison on low-rank momenta)."""
    return _tracker(functools.partial(first_order_newton_track, about_s=True))


def first_order(first_order: bool = True):
    """``inner_solvers.newton_track`` replaced by ``first_order_newton_track`` inside the block (this benchmark
    only; ``first_order=False``: its Ritz candidate)."""
    return _tracker(functools.partial(first_order_newton_track, first_order=first_order))


class _CallTimer(TorchFunctionMode):
    """Times every eigendecomposition and matrix product of the steps run under it, each as it runs (one CPU thread:
    the call is synchronous), in ``BINS``' first three bins; every other call passes through untimed."""

    def __init__(self, n: int, m: int):
        super().__init__()
        self.n, self.m, self.ms, self.calls = n, m, dict.fromkeys(BINS[:3], 0.0), dict.fromkeys(BINS[:3], 0)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _MATMUL:
            mats = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2]
            long = self.m != self.n and any(self.m in a.shape[-2:] for a in mats)
            key = "m x n products" if long else "n x n products"
        elif func in _DECOMP:
            key = "eigendecompositions"
        else:
            return func(*args, **kwargs)
        t = time.perf_counter()
        out = func(*args, **kwargs)
        self.ms[key] += 1e3 * (time.perf_counter() - t)
        self.calls[key] += 1
        return out


def timed_calls(step, prepare, steps: int, shape) -> dict:
    """Milliseconds per step spent in each of ``BINS``' first three bins (``_CallTimer``), over ``steps`` calls of
    ``step`` (``prepare(i)`` before each)."""
    timer = _CallTimer(min(shape), max(shape))
    with timer:
        for i in range(steps):
            prepare(i)
            step()
    return {k: v / steps for k, v in timer.ms.items()}


def _lean_and_muon(shape, manifold: str, seed: int, steps: int):
    """({"lean": (W, opt), "muon": (W, opt)}, momenta): the lean step and Muon's float32 step, each on its own copy of
    the table's start point at lr 0 (``solver_table.at_lr0``), and the first ``steps`` momenta of the table's timing
    stream, on the CPU (a GPU call returns before its kernel ends): what ``budget`` and ``kernel_counts`` step."""
    from .solver_table import at_lr0, muon_fp32, start_point, timing_stream

    W0 = start_point(shape, manifold, seed).float().cpu()
    grads = [G.cpu() for G in timing_stream(shape, seed, steps)]
    lean = lambda p: ManifoldMuon(p, momentum=0.0, nesterov=False, manifold=manifold, inner="lean")  # noqa: E731
    return {"lean": at_lr0(lean, W0), "muon": at_lr0(muon_fp32, W0)}, grads


def budget(shape, manifold: str, rounds: int, timed: int, warmup: int = 4, seed: int = 0) -> dict:
    from .solver_table import interleaved_steps

    arms, grads = _lean_and_muon(shape, manifold, seed, warmup + rounds + timed)
    times = dict(zip(arms, interleaved_steps(list(arms.values()), grads, rounds=rounds, warmup=warmup)))
    row = dict(shape=list(shape), manifold=manifold, rounds=rounds, timed_steps=timed,
               lean_ms=1e3 * statistics.median(times["lean"]), muon_ms=1e3 * statistics.median(times["muon"]))
    row["ratio"] = row["lean_ms"] / row["muon_ms"]
    rest = grads[warmup + rounds:]
    for name, (W, opt) in arms.items():
        def prepare(i, W=W):
            W.grad = rest[i].clone()
        calls = timed_calls(opt.step, prepare, timed, shape)
        calls["everything else"] = row[f"{name}_ms"] - sum(calls.values())
        row[f"{name}_bins"] = calls
    p = row["lean_bins"]
    row["floor_ms"] = p["eigendecompositions"] + p["n x n products"] + p["m x n products"]
    row["floor_ratio"] = row["floor_ms"] / row["muon_ms"]
    for name, (W, opt) in arms.items():  # one more step of each, its operations counted
        row[f"{name}_kernels"] = counted_step(W, opt, rest[-1]).total
    return row


def counted_step(W, opt, G) -> KernelCounter:
    """One step of ``opt`` on its weight ``W`` with gradient ``G``, its operations that launch device work counted
    (``KernelCounter``, returned)."""
    W.grad = G.clone()
    with KernelCounter() as kernels:
        opt.step()
    return kernels


def kernel_counts(shape, manifold: str, steps: int = 3, seed: int = 0) -> dict:
    """The operations that launch device work (``KernelCounter``) in one step of the lean step and of Muon's float32
    step, each on its own copy of the table's start point, counted at the ``steps``-th momentum of the table's
    timing stream (after the first steps, so a tracking solve counts its tracked step, not its start)."""
    arms, grads = _lean_and_muon(shape, manifold, seed, steps)
    row = dict(shape=list(shape), manifold=manifold, steps=steps)
    for name, (W, opt) in arms.items():
        for G in grads[:-1]:
            W.grad = G.clone()
            opt.step()
        kernels = counted_step(W, opt, grads[-1])
        row[f"{name}_kernels"] = kernels.total
        row[f"{name}_kernels_by_op"] = dict(kernels.counts.most_common())
    return row


CURRENT_WEIGHTS = tuple(((m, n), manifold) for m, n in ((128, 128), (128, 512), (512, 128), (384, 128))
                        for manifold in ("stiefel", "dgram", "gram_oblique"))
CURRENT_CRITERION = (
    "per weight, lean's calls against Muon's calls (floor_ms over Muon's n x n and m x n products) in every repeat: "
    "below the weight's target in every repeat, the gap between the eager ratio and the target is overhead, which "
    "fusing could close only by removing more of the lean step's overhead than of Muon's; at or above it in every "
    "repeat, only fewer or cheaper calls close it; on both sides, neither is shown (set after a scratch run of "
    "budget on 384x128, 128x512 and 512x128 Stiefel and 128x128 Oblique and Stiefel, two repeats, 2026-12-08)")


def current(out_dir: Path, name: str = "step_budget_current", weights=CURRENT_WEIGHTS, repeats: int = 3,
            kernel_shapes=None, rounds: int = 30, timed: int = 10) -> dict:
    """``budget`` with today's library at every width-128 weight of the table (``CURRENT_WEIGHTS``: the part
    ``step_budget`` measured the lean step of 2026-12-06, on DGram and square Stiefel only; rectangular Stiefel's
    default has changed since), ``repeats`` times each, read by ``CURRENT_CRITERION``; and ``kernel_counts`` at
    GPT-2 small's shapes on each manifold (``kernel_shapes``, default ``GPT2_SHAPES``). Refused before any work
    unless every weight names a Gram manifold and every side is >= 2, and repeats is an int >= 1."""
    from .common import GPT2_SHAPES
    from .solver_table import MANIFOLDS

    weights = [(tuple(s), m) for s, m in weights]
    kernel_shapes = [tuple(s) for s in (GPT2_SHAPES if kernel_shapes is None else kernel_shapes)]
    bad = [(s, m) for s, m in weights if len(s) != 2 or min(s) < 2 or m not in MANIFOLDS]
    bad += [s for s in kernel_shapes if len(s) != 2 or min(s) < 2]
    if bad:
        raise ValueError(f"step_budget.current: weights are ((m, n), manifold) with m, n >= 2 and a manifold of "
                         f"{', '.join(MANIFOLDS)}, kernel_shapes (m, n) with m, n >= 2; got {bad}")
    if not (isinstance(repeats, int) and repeats >= 1):
        raise ValueError(f"step_budget.current: repeats is an int >= 1, got {repeats!r}")
    t0 = time.perf_counter()
    with one_cpu_thread():
        rows = []
        for rep, (s, m) in ((rep, w) for rep in range(repeats) for w in weights):
            r = dict(budget(s, m, rounds, timed), repeat=rep)
            rows.append(r)
            calls = r["muon_bins"]["n x n products"] + r["muon_bins"]["m x n products"]
            print(f"{str(s):12s} {m:12s} [{rep}] {r['ratio']:.2f}x Muon eager; calls against calls "
                  f"{r['floor_ms'] / calls:.2f}; kernels {r['lean_kernels']} against {r['muon_kernels']}", flush=True)
        kernels = []
        for s in kernel_shapes:
            for m in MANIFOLDS:
                kernels.append(kernel_counts(s, m))
                k = kernels[-1]
                print(f"{str(s):12s} {m:12s} kernels {k['lean_kernels']} against {k['muon_kernels']}", flush=True)
    params = dict(weights=[[list(s), m] for s, m in weights], repeats=repeats, rounds=rounds, timed=timed,
                  kernel_shapes=[list(s) for s in kernel_shapes], criterion=CURRENT_CRITERION)
    return write_result(out_dir, name, dict(rows=rows, kernels=kernels), params, time.perf_counter() - t0)


def one_eigh(shape, manifold: str, seed: int, arms=tuple(ARMS), timing=None) -> dict:
    """The settled e_W / Muon's of each of ``arms`` on draw ``seed`` (``solver_table.measure``'s steady stream), and
    each arm's step against Muon's float32 step (``paired_times`` on the table's timing stream; ``timing``: its
    settings, default ``solver_table.TIMING``)."""
    from manifold_muon.manifolds import get_manifold
    from .solver_table import (STEADY, TIMING, VARIANTS, e_W, paired_times, reference, start_point, steady_stream,
                               timing_stream, walk)

    timing = dict(TIMING, **(timing or {}))
    timed = timing_stream(shape, seed, timing["warmup"] + timing["max_rounds"])

    M = get_manifold(manifold)
    W0 = start_point(shape, manifold, seed)
    long = steady_stream(shape, STEADY, seed + 2)
    W_star, muon_e_W, ref_gap = reference(M, W0.double(), long[-1].double(), long[-1])
    row = dict(shape=list(shape), manifold=manifold, seed=seed, steady_steps=STEADY, muon_e_W=muon_e_W[0.02],
               ref_gap=ref_gap)
    for arm in arms:
        kw = dict(VARIANTS["lean_newton"], **ARMS[arm])
        make = lambda p: ManifoldMuon(p, momentum=0.0, nesterov=False, manifold=manifold, **kw)  # noqa: E731
        with swapped(arm):
            W_s, gaps, ops = walk(make, W0, long, (0.02,))
            row[f"{arm}_ratio"] = paired_times(make, W0, timed, **timing)["ratio"]
        row[f"{arm}_e_W"] = e_W(W_s[0.02], W_star[0.02])
        row[f"{arm}_vs_muon"] = row[f"{arm}_e_W"] / row["muon_e_W"]
        row[f"{arm}_gap"] = gaps[0.02]
        row[f"{arm}_eigh"], row[f"{arm}_eigvalsh"] = ops.get("eigh", 0), ops.get("eigvalsh", 0)
    return row


def fixed_floor(shape, manifold: str, arm: str, steps: int = FIXED_STEPS, seed: int = 0) -> dict:
    """Where the tracker of ``arm`` (``ARMS``) ends on one momentum repeated: the certified gap and the damping t after
    ``steps`` optimizer steps at lr 0 on the first momentum of draw ``seed``'s steady stream, from the table's start
    point (the tracker's first step starts from ``NEWTON_START`` ADMM iterations, as in training)."""
    from .solver_table import VARIANTS, at_lr0, start_point, steady_stream

    G = steady_stream(shape, 1, seed + 2)[0]
    kw = dict(VARIANTS["lean_newton"], **ARMS[arm])
    W, opt = at_lr0(lambda p: ManifoldMuon(p, momentum=0.0, nesterov=False, manifold=manifold, **kw),
                    start_point(shape, manifold, seed))
    gaps = []
    with swapped(arm):
        for _ in range(steps):
            W.grad = G.clone()
            opt.step()
            gaps.append(float(opt.state[W]["duality_gap"]))
    return dict(shape=list(shape), manifold=manifold, arm=arm, steps=steps, seed=seed, gap=gaps[-1],
                gap_min=min(gaps), damping=float(opt.state[W]["newton_t"]))


def main(out_dir: Path, quick: bool = False, weights=None, shapes=None, seeds=None, rounds: int | None = None,
         timed: int | None = None, float32_weights=None, repeats: int | None = None, square_sizes=None,
         name: str = "step_budget") -> dict:
    """``weights``: ((m, n), manifold) pairs for ``budget`` (default ``BUDGET_WEIGHTS``); ``shapes`` and ``seeds``
    for ``one_eigh`` and ``fixed_floor`` (default ``ONE_EIGH_SHAPES`` on both of ``ONE_EIGH_MANIFOLDS``, draws 0-2;
    ``shapes=()`` skips them); ``repeats``: times ``budget`` runs on every weight, each a row with its ``repeat``
    (default 3, 1 in quick mode: on 2026-12-06 two single runs put one weight's calls-against-calls ratio on either
    side of its target); ``float32_weights``: the weights where ``WIDE_ARMS`` (the library's tracker, float32
    and ``dk``) are also compared on draw 0 (default ``(EIG32_GPT2,)``, none in quick mode); ``square_sizes``: the
    sizes n of ``square32`` on draws ``seeds`` (default ``SQUARE32_SIZES``, (12,) in quick mode). Refused before any work
    unless every weight names a Gram manifold and every side is >= 2 (and the ``one_eigh`` and ``float32_weights``
    shapes are rectangular: the Newton tracker's)."""
    from .solver_table import MANIFOLDS

    weights = [(tuple(s), m) for s, m in (weights or ((((24, 8), "dgram"),) if quick else BUDGET_WEIGHTS))]
    shapes = [tuple(s) for s in (((24, 8),) if quick and shapes is None else (ONE_EIGH_SHAPES if shapes is None
                                                                                  else shapes))]
    seeds = list(seeds if seeds is not None else ((0,) if quick else (0, 1, 2)))
    bad = [(s, m) for s, m in weights if len(s) != 2 or min(s) < 2 or m not in MANIFOLDS]
    if bad:
        raise ValueError(f"step_budget: weights are ((m, n), manifold) with m, n >= 2 and a manifold of "
                         f"{', '.join(MANIFOLDS)}; got {bad}")
    float32_weights = [(tuple(s), m) for s, m in (float32_weights if float32_weights is not None
                                                  else (() if quick else (EIG32_GPT2,)))]
    bad = [(s, m) for s, m in float32_weights if m not in MANIFOLDS]
    if bad:
        raise ValueError(f"step_budget: float32_weights are ((m, n), manifold) with a manifold of "
                         f"{', '.join(MANIFOLDS)}; got {bad}")
    bad = [s for s in [*shapes, *(s for s, _ in float32_weights)] if len(s) != 2 or min(s) < 2 or s[0] == s[1]]
    if bad:
        raise ValueError(f"step_budget: the one-eigendecomposition study's shapes are rectangular (m != n, both "
                         f">= 2; the Newton tracker runs on rectangular weights), got {bad}")
    square_sizes = list(square_sizes if square_sizes is not None else ((12,) if quick else SQUARE32_SIZES))
    if not all(isinstance(n, int) and n >= 2 for n in square_sizes):
        raise ValueError(f"step_budget: square_sizes are ints n >= 2 (square Stiefel n x n), got {square_sizes!r}")
    rounds, timed = rounds or (3 if quick else 30), timed or (2 if quick else 10)
    repeats = repeats if repeats is not None else (1 if quick else 3)
    if not (isinstance(repeats, int) and repeats >= 1):
        raise ValueError(f"step_budget: repeats is an int >= 1, got {repeats!r}")
    timing = dict(warmup=1, min_rounds=2, max_rounds=3, budget_s=0.0) if quick else None
    t0 = time.perf_counter()
    with one_cpu_thread():
        rows = []
        for rep, (s, m) in ((rep, w) for rep in range(repeats) for w in weights):
            r = dict(budget(s, m, rounds, timed if max(s) < 768 else max(2, timed // 5)), repeat=rep)
            rows.append(r)
            p = r["lean_bins"]
            print(f"{str(s):12s} {m:8s} [{rep}] lean {r['lean_ms']:.2f} ms = {r['ratio']:.2f}x Muon; timed calls: "
                  + ", ".join(f"{b} {p[b]:.2f}" for b in BINS) + f" ms; floor {r['floor_ratio']:.2f}x Muon",
                  flush=True)
        studies = []
        for seed in seeds:
            for s in shapes:
                for m in ONE_EIGH_MANIFOLDS:
                    r = one_eigh(s, m, seed, timing=timing)
                    studies.append(r)
                    print(f"{str(s):12s} {m:8s} draw {seed}: e_W / Muon's, step / Muon's " + ", ".join(
                        f"{a} {r[f'{a}_vs_muon']:.2f}, {r[f'{a}_ratio']:.2f}" for a in ARMS), flush=True)
        wide = []
        for s, m in float32_weights:
            r = one_eigh(s, m, 0, arms=WIDE_ARMS, timing=timing)
            wide.append(r)
            print(f"{str(s):12s} {m:8s} draw 0: e_W / Muon's, step / Muon's " + ", ".join(
                f"{a} {r[f'{a}_vs_muon']:.2f}, {r[f'{a}_ratio']:.2f}" for a in WIDE_ARMS), flush=True)
        floors, fixed_steps = [], 4 if quick else FIXED_STEPS
        for s in shapes:
            for m in ONE_EIGH_MANIFOLDS:
                for arm in WIDE_ARMS:
                    floors.append(fixed_floor(s, m, arm, fixed_steps))
                    f = floors[-1]
                    print(f"{str(s):12s} {m:8s} {arm:6s} on one momentum: gap {f['gap']:.1e} after {f['steps']} "
                          f"steps, damping {f['damping']:.1e}", flush=True)
        squares = []
        for n in square_sizes:
            for seed in seeds:
                squares.append(square32(n, seed))
                q = squares[-1]
                print(f"square Stiefel {n}x{n} draw {seed}: certified gap float64 {q['float64_gap']:.1e}, float32 "
                      f"{q['float32_gap']:.1e}; eigh {q['float64_eigh_ms']:.2f} ms against {q['float32_eigh_ms']:.2f} "
                      "ms", flush=True)
    params = dict(weights=[[list(s), m] for s, m in weights], shapes=[list(s) for s in shapes], seeds=seeds,
                  rounds=rounds, timed=timed, repeats=repeats, quick=quick,
                  arms={a: repr(kw) for a, kw in ARMS.items()},
                  float32_weights=[[list(s), m] for s, m in float32_weights], fixed_steps=fixed_steps,
                  criterion="lagged adopted only if its settled e_W <= 2/3 of Muon's on every draw at the three "
                            "rectangular width-128 DGram weights",
                  criterion_eig32="float32 adopted only if its settled e_W is within 0.02 (as a multiple of Muon's) "
                                  "of the library tracker's on every draw at the three rectangular width-128 shapes "
                                  "and at float32_weights, it brings a width-128 weight whose table ratio misses "
                                  "under its target on all three draws, and on one momentum it ends within 10x of "
                                  "the library tracker's gap (set after scratch runs of the same swap, 2026-12-06)",
                  criterion_dk="dk worth building into the library if its settled e_W is within 0.05 (as a multiple "
                               "of Muon's) of the library tracker's on every DGram draw at the three rectangular "
                               "width-128 shapes and at float32_weights, its step is cheaper than the library "
                               "tracker's on every one of those draws, and on one momentum on DGram it ends within 10x "
                               "of the library tracker's gap (set after a scratch run on the width-128 draws, "
                               "2026-12-06, before the runs at float32_weights and on one momentum)",
                  square_sizes=list(square_sizes),
                  criterion_square32="float32 serves square Stiefel's closed form only if its certified gap is at "
                                     "most 1e-6 on every draw at every size (set after a scratch run at 128 and 768, "
                                     "2026-12-06)")
    return write_result(out_dir, name, dict(rows=rows, one_eigh=studies, float32_weights=wide, fixed_floor=floors,
                                            square32=squares), params, time.perf_counter() - t0)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench"))
