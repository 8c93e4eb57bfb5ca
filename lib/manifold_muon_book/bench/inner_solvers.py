"""Manifold Muon's inner solve: accuracy against a certified solution, and the cost of a whole step.

For each shape (D_out, D_in) and manifold (Stiefel, DGram, GramOblique), a weight W on the manifold, the
momentum G it receives and the two before it (G_-2, G_-1, G: each solve is warm-started from the previous
one, as in training), and three solvers:

* ``default``: ``ManifoldMuon()``'s inner solve (``gram_solve``: Gram-space ADMM, warm start, stop at a
  relative duality gap <= 1e-3 or 16 iterations), with its fused retraction.
* ``post``: ``ManifoldMuon(inner="post")``, the post's recipe in this library (20 cold dual-ascent steps,
  alpha 0.1 linearly decayed, Jordan's Newton-Schulz msign, the raw momentum), library retraction.
* ``author``: the algorithm as the post describes it, transcribed from Bernstein's reference loop with
  Keigwin's projector: Lambda_0 = -P(W^T G + G^T W)/4, the same schedule and msign on the raw momentum,
  stop when ||H||_RMS < 1e-6, A = the last msign computed in the loop; retraction msign(X) on Stiefel,
  the post's U V^T diag(Sigma) on DGram, column normalisation on Oblique.

Measures (e_W at lr 0.02, the training lr, and lr 0.1, the post's studies):
* e_W = ||W+ - W+_ref||_F / ||W+_ref||_F with W+_ref = the manifold's retraction of W - lr A_ref;
* sub-optimality (<G, A_ref> - <G, A>) / <G, A_ref> (negative for an A that leaves the tangent space or
  the unit ball) and the tangent violation ||P(W^T A + A^T W)||_RMS: both meaningful when the optimum is
  not unique (e_W then depends on which optimum the reference found);
* A_ref: ``gram_solve`` in float64, warm-started from the default's answer, up to ``ref_steps`` iterations
  or a relative duality gap of 1e-7; its gap is reported (ref_gap);
* step time (solve + retraction, a whole ``optimizer.step()`` on that one weight, one thread) as a ratio to
  Muon's step in the same process, Muon in float32 and at torch's default bfloat16 Newton-Schulz;
* msign / eigh calls of the step.

Momenta: ``gaussian`` (unit Gaussian, the post's setting), ``recorded`` (the cpu preset's run, d = 64,
steps 100-103: real W and G), ``synthetic`` (GPT-2 and d = 128 shapes: the recorded run's spectral decay
and scale, random singular vectors, LayerNorm's exact null direction on c_proj; a model, labelled so).
At GPT-2 shapes: synthetic momenta, Stiefel and DGram (the manifolds of the post's assignments), one
timed repeat, and no float64 reference (hundreds of 768 x 768 float64 iterations per problem, beyond a
2-core machine): there the accuracy reported is the certified bound on the relative sub-optimality,
(f(Lambda) - <G, A>) / f(Lambda) with the default's dual bound f, for the default and the post's recipe.

The certificate check (``check_certificates``) FAILS the benchmark if a default solve's relative duality gap,
recomputed in float64 from the m x n matrices, is worse than the gap the solve reported. The targets of
issue 9 (e_W <= 0.5%, Hetero <= 2.5x Muon) are reported as met or missed, by how much; they do not fail it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.optim import ManifoldMuon, Muon, TORCH_MUON
from manifold_muon.optim.manifold_muon import post_msign
from manifold_muon.optim.inner_solvers import _tall_unit, gram_solve
from manifold_muon_lab.provenance import Stopwatch
from .common import device, one_cpu_thread, time_call, write_result
from .momenta import correlated, record_momenta, spectral_decay, synthetic_momentum

MANIFOLDS = ("stiefel", "dgram", "gram_oblique")
LRS = (0.02, 0.1)
ROLES = ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj")


def gpt2_shapes(d):
    """(role, (D_out, D_in)) of one GPT-2 block of width d."""
    return list(zip(ROLES, [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)]))


TARGET_E_W = 0.005


class CertificateError(AssertionError):
    """A default solve reported a duality gap that the float64 recomputation does not confirm."""


# ------------------------------------------------------------------ the author's algorithm, as described


def author_direction(W, G, P, steps=20, alpha=0.1, tol=1e-6):
    """Bernstein's reference loop (thinking-machines-lab/manifolds, src/manifold_muon.py) with projector P and
    Jordan's Newton-Schulz msign, on the raw momentum. Returns (A, msign calls)."""
    wide = W.size(-2) < W.size(-1)
    W, G = (W.mT, G.mT) if wide else (W, G)
    Lambda = -0.25 * P(W.mT @ G + G.mT @ W)
    calls = 0
    for step in range(steps):
        A = post_msign(G + 2 * W @ Lambda)
        calls += 1
        H = P(W.mT @ A + A.mT @ W)
        if torch.norm(H) / math.sqrt(H.numel()) < tol:
            break
        Lambda = Lambda - alpha * (1 - step / steps) * H
    return (A.mT if wide else A), calls


def author_retract(X, name):
    """The retraction the post writes down: msign(X) = U V^T (exact) on Stiefel, U V^T diag(Sigma) on DGram."""
    if name == "dgram":
        return get_manifold("dgram", retraction="svd_post").retract(X)
    return get_manifold(name).retract(X)


# ------------------------------------------------------------------ one problem


def problems(kind, role, shape, name, seed, recorded=None, profile=None):
    """(W, [G_-2, G_-1, G]) for one (momentum kind, shape, manifold)."""
    g = torch.Generator().manual_seed(seed)
    M = get_manifold(name)
    if kind == "recorded":
        seq = [recorded[t][role] for t in sorted(recorded)]
        W = M.retract(seq[-1][0])  # the recorded weight, put on this manifold
        return W, [G for _, G, _ in seq[-3:]]
    W = M.random_point(shape, generator=g)
    if kind == "gaussian":
        fresh = lambda: torch.randn(shape, generator=g)
    else:
        fresh = lambda: synthetic_momentum(shape, profile["decay"], profile["rms"], "c_proj" in role, generator=g)
    G = fresh()
    G1 = correlated(G, fresh())
    return W, [correlated(G1, fresh()), G1, G]


def step_with(opt_kwargs, W, Gs, name, lr):
    """Run ManifoldMuon through the sequence of momenta (momentum 0: the G given is what the solve sees) and
    return (W+, the optimizer, its parameter) after the last one; W is reset before each step."""
    p = torch.nn.Parameter(W.clone())
    opt = ManifoldMuon([p], lr=lr, manifold=name, momentum=0.0, nesterov=False, **opt_kwargs)
    for G in Gs:
        with torch.no_grad():
            p.copy_(W)
        p.grad = G.clone()
        opt.step()
    return p.detach().clone(), opt, p


def measure(kind, role, shape, name, seed=0, ref_steps=600, repeats=3, recorded=None, profile=None,
            full=True):
    """One row. ``full=False`` (GPT-2 shapes on a CPU): no float64 reference (e_W is not reported), no
    author run, and single timings; sub-optimality is then bounded by the default's own dual bound."""
    M = get_manifold(name)
    P = M.gram_projector
    W, Gs = problems(kind, role, shape, name, seed, recorded, profile)
    G = Gs[-1]
    _, opt, p = step_with({}, W, Gs[:-1], name, 0.02)  # the default, warm-started through the sequence
    sol = gram_solve(W, G, P, warm=_warm(opt.state[p]))
    A_def = sol.matrix()
    gap64 = recomputed_gap(W, G, P, A_def, sol.Lambda)  # the certificate, recomputed in float64
    claimed = float(sol.gap.max())
    Wt, Gt, wide = _tall_unit(W.double(), G.double())
    value = lambda A: float((Gt * (A.double().mT if wide else A.double())).sum())
    bound = float(torch.linalg.svdvals(Gt + 2 * Wt @ sol.Lambda.double()).sum())  # >= <G, A*> (weak duality)
    row = dict(kind=kind, role=role, shape=list(shape), manifold=name, default_gap=claimed, default_gap_float64=gap64,
               default_iterations=int(sol.iterations.max()), certificate_ok=gap64 <= claimed * 1.05 + 1e-5)
    solvers = {"default": A_def, "post": post_direction(W, G, name)}
    auth_calls = None
    if full:
        solvers["author"], auth_calls = author_direction(W, G, P)
        ref = gram_solve(W.double(), G.double(), P, steps=ref_steps, tol=1e-7, warm=(sol.Lambda.double(), _to64(sol.U)))
        A_ref = ref.matrix()
        row.update(ref_gap=float(ref.gap.max()), ref_iterations=int(ref.iterations.max()))
        bound = min(bound, float(torch.linalg.svdvals(Gt + 2 * Wt @ ref.Lambda.double()).sum()))
    for label, A in solvers.items():
        row[f"{label}_suboptimality_bound"] = (bound - value(A)) / bound  # >= the true relative sub-optimality
        row[f"{label}_tangent_violation"] = float(M.tangent_residual(W, A.to(W.dtype))) / min(shape)
        if not full:
            continue
        row[f"{label}_suboptimality"] = (value(A_ref) - value(A)) / value(A_ref)
        for lr in LRS:
            W_ref = M.retract(W.double() - lr * A_ref)
            e_W = lambda W_new: float((W_new.double() - W_ref).norm() / W_ref.norm())
            row[f"{label}_e_W_lr{lr}"] = e_W(author_retract(W - lr * A, name) if label == "author" else M.retract(W - lr * A))
            if label == "author":  # its direction with the library's retraction, to separate the two
                row[f"author_libretract_e_W_lr{lr}"] = e_W(M.retract(W - lr * A))
    row["author_msign_calls"] = None if auth_calls is None else auth_calls + (1 if name == "stiefel" else 0)
    row["post_msign_calls"] = 21
    row["default_eigh_calls"] = 2 + int(sol.iterations.max()) + math.ceil(int(sol.iterations.max()) / 4) + 1
    row.update(timings(W, G, name, repeats))
    return row


def _warm(state):
    """The optimizer's carried dual (``ManifoldMuon._carry``) as ``gram_solve``'s warm start for one weight, read by
    the optimizer's own reader (``ManifoldMuon._warm``)."""
    from manifold_muon.optim.inner_solvers import Span

    warm = ManifoldMuon._warm({"warm_start": True}, [state])
    if warm is None:
        return None
    Lambda, U = warm
    return Lambda[0], (Span(U.a[0], U.b[0]) if isinstance(U, Span) else U[0])


def _to64(U):
    from manifold_muon.optim.inner_solvers import Span

    return Span(U.a.double(), U.b.double())


def post_direction(W, G, name):
    from manifold_muon.optim.inner_solvers import dual_ascent

    P = get_manifold(name).gram_projector
    A, _, _ = dual_ascent(W[None], G[None], P, steps=20, alpha=0.1, normalize=False,
                          msign_fn=post_msign)
    return A[0]


def recomputed_gap(W, G, P, A, Lambda):
    """The relative duality gap of (A, Lambda) in float64 from the m x n matrices (A must be tangent and in
    the unit ball: it is projected and shrunk here, and the result must still reach the claimed value)."""
    Wt, Gt, wide = _tall_unit(W.double(), G.double())
    At = A.double().mT if wide else A.double()
    Lambda = Lambda.double().reshape(At.shape[-1], At.shape[-1])
    bound = float(torch.linalg.svdvals(Gt + 2 * Wt @ Lambda).sum())
    from manifold_muon.manifolds.gram import gram_multiplier

    At = At - Wt @ gram_multiplier(Wt, Wt.mT @ At + At.mT @ Wt, P)
    At = At / max(1.0, float(torch.linalg.matrix_norm(At, ord=2)))
    return (bound - float((Gt * At).sum())) / bound


def timings(W, G, name, repeats):
    """Seconds of one optimizer step on this weight: default (warm), post, Muon fp32 and Muon bf16 (torch's).
    The fastest of ``repeats`` steps after one warm-up step (which also gives the default its warm start)."""
    out = {}

    def timed(make):
        p = torch.nn.Parameter(W.clone())
        opt = make([p])
        p.grad = G.clone()
        return time_call(opt.step, repeats)

    out["seconds_default"] = timed(lambda ps: ManifoldMuon(ps, lr=0.02, manifold=name))
    out["seconds_post"] = timed(lambda ps: ManifoldMuon(ps, lr=0.02, manifold=name, inner="post"))
    out["seconds_muon_fp32"] = timed(lambda ps: Muon(ps, lr=0.02, msign="newton_schulz", ns_steps=5,
                                                     msign_dtype=torch.float32))
    out["seconds_muon_bf16"] = timed(lambda ps: Muon(ps, lr=0.02, **TORCH_MUON))
    for k in ("default", "post"):
        out[f"{k}_over_muon_fp32"] = out[f"seconds_{k}"] / out["seconds_muon_fp32"]
        out[f"{k}_over_muon_bf16"] = out[f"seconds_{k}"] / out["seconds_muon_bf16"]
    return out


# ------------------------------------------------------------------ the run


def plan(quick: bool):
    """[(kind, d, role, shape, manifolds, ref_steps, repeats, full)]."""
    if quick:
        return [(kind, 16, role, shape, MANIFOLDS, 200, 1, True) for kind in ("gaussian", "synthetic")
                for role, shape in gpt2_shapes(16)]
    rows = []
    for role, shape in gpt2_shapes(64):
        rows += [("recorded", 64, role, shape, MANIFOLDS, 1500, 3, True), ("gaussian", 64, role, shape, MANIFOLDS, 1500, 3, True)]
    for role, shape in gpt2_shapes(128):
        rows += [("synthetic", 128, role, shape, MANIFOLDS, 800, 3, True), ("gaussian", 128, role, shape, MANIFOLDS, 800, 3, True)]
    # GPT-2 small: synthetic momenta, the two manifolds the post's assignments use, no float64 reference
    # (hundreds of 768 x 768 float64 iterations per problem: beyond a 2-core machine), one timed repeat
    for role, shape in gpt2_shapes(768):
        rows += [("synthetic", 768, role, shape, ("stiefel", "dgram"), 0, 1, False)]
    return rows


def check_certificates(rows):
    bad = [r for r in rows if not r["certificate_ok"]]
    if bad:
        raise CertificateError("default solves whose float64 duality gap exceeds the reported one: " + "; ".join(
            f"{r['kind']} {r['shape']} {r['manifold']}: reported {r['default_gap']:.2e}, float64 "
            f"{r['default_gap_float64']:.2e}" for r in bad))


def main(out_dir: Path, quick: bool = False) -> dict:
    sw = Stopwatch().__enter__()
    with one_cpu_thread():
        recorded, profile = None, None
        if not quick:
            t0 = time.perf_counter()
            rec = record_momenta(range(100, 104))
            recorded = {t: {_role(n): (W, G, m) for n, (W, G, m) in r.items() if ".h.1." in n} for t, r in rec.items()}
            last = rec[max(rec)]
            profile = dict(decay=sum(spectral_decay(G) for _, G, _ in last.values()) / len(last),
                           rms=sum(float(G.pow(2).mean().sqrt()) for _, G, _ in last.values()) / len(last),
                           seconds_to_record=time.perf_counter() - t0)
        else:
            profile = dict(decay=1.3, rms=1e-4)
        rows = []
        for kind, d, role, shape, manifolds, ref_steps, repeats, full in plan(quick):
            for name in manifolds:
                r = measure(kind, role, shape, name, ref_steps=ref_steps, repeats=repeats, recorded=recorded,
                            profile=profile, full=full)
                r["d"] = d
                rows.append(r)
                acc = (f"e_W lr.02/.1: default {100 * r['default_e_W_lr0.02']:.2f}/{100 * r['default_e_W_lr0.1']:.2f}%  "
                       f"post {100 * r['post_e_W_lr0.02']:.2f}/{100 * r['post_e_W_lr0.1']:.2f}%  ref {r['ref_gap']:.0e}"
                       if full else "")
                print(f"{kind:>9} {str(tuple(shape)):>12} {name:>12}  {acc}  sub-opt bound: default "
                      f"{r['default_suboptimality_bound']:.1e} post {r['post_suboptimality_bound']:.1e}  "
                      f"({r['default_iterations']} it)  time x{r['default_over_muon_fp32']:.1f} fp32 / "
                      f"x{r['default_over_muon_bf16']:.1f} bf16 Muon (post x{r['post_over_muon_fp32']:.1f} fp32)", flush=True)
        summary = summarise(rows)
        sw.__exit__()
        result = write_result(out_dir, "inner_solvers", dict(rows=rows, summary=summary, momentum_profile=profile),
                              dict(quick=quick, lrs=LRS, manifolds=MANIFOLDS, target_e_W=TARGET_E_W,
                                   default=dict(inner="gram_admm", inner_steps=16, tol=1e-3, warm_start=True),
                                   post=ManifoldMuon.POST_RECIPE), sw.seconds)
    check_certificates(rows)
    return result


def _role(name):
    return next(r for r in ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj") if name.endswith(r + ".weight"))


def summarise(rows):
    """Per lr and momentum kind (rows with a reference): how many default solves meet e_W <= 0.5%, and the
    worst e_W of each solver; per d: the worst sub-optimality bound of the default and the post."""
    out = {}
    for lr in LRS:
        for kind in sorted({r["kind"] for r in rows}):
            sub = [r for r in rows if r["kind"] == kind and f"default_e_W_lr{lr}" in r]
            if sub:
                out[f"lr{lr}_{kind}"] = dict(n=len(sub), default_meets_target=sum(r[f"default_e_W_lr{lr}"] <= TARGET_E_W for r in sub),
                                             **{f"{s}_worst_e_W": max(r[f"{s}_e_W_lr{lr}"] for r in sub)
                                                for s in ("default", "post", "author", "author_libretract")})
    for d in sorted({r["d"] for r in rows}):
        sub = [r for r in rows if r["d"] == d]
        out[f"d{d}"] = {f"{s}_worst_suboptimality_bound": max(r[f"{s}_suboptimality_bound"] for r in sub)
                        for s in ("default", "post")}
    return out
