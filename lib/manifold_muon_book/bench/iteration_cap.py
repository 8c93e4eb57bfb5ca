"""What the retracted-weight accuracy target costs: the default solve at a range of iteration caps, against
a float64 solution certified to a relative duality gap of about 1e-8.

Per weight (Hetero's manifold for each of a layer's non-square weights, at GPT-2 small's width 768 and at
the cpu preset's 128): W a random point of the manifold, G a training-like momentum (singular values
~ i^-1.3, random singular vectors, unit RMS) correlated 0.95 with the previous step's, and the solve
warm-started from that previous step's default solve, as in training. For each cap (``steps`` of
``gram_solve``, everything else at its defaults): the time of the solve (one thread, one timing, and as
a ratio to the default cap's time in the same run), the ADMM iterations taken, the
certified relative gap, e_A = ||A - A*|| / ||A*|| and e_W = ||W+ - W+*|| / ||W+*|| at learning rates 0.02
and 0.1 (W+ = the manifold's retraction of W - lr A).
The reference A* is ``gram_solve`` in float64 from the same warm start, at most ``ref_steps`` iterations;
a second reference by another path (the cold start and 4x the ADMM penalty, ``check_unique``) measures
whether the certified solution is unique (their e_A is recorded). Measures; asserts nothing.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.optim.inner_solvers import gram_solve
from manifold_muon_lab.provenance import Stopwatch
from .common import one_cpu_thread, write_result
from .momenta import correlated, synthetic_momentum

CAPS = (8, 16, 32, 48, 64, 96)
DEFAULT_CAP = 16
LRS = (0.02, 0.1)
E_W_TARGET = 0.005  # issue 9: e_W <= 0.5%


def weights(d: int):
    """Hetero's non-square weights of one layer at width d: (role, (D_out, D_in), manifold)."""
    return (("attn.c_attn", (3 * d, d), "stiefel"), ("mlp.c_fc", (4 * d, d), "dgram"),
            ("mlp.c_proj", (d, 4 * d), "dgram"))


def problem(shape, manifold: str, seed: int = 0):
    """(W, G, the previous step's solve's (Lambda, U)): a training-like step of one weight."""
    g = torch.Generator().manual_seed(seed)
    M = get_manifold(manifold)
    W = M.retract(torch.randn(*shape, generator=g) / math.sqrt(shape[1]))
    G_prev = synthetic_momentum(shape, 1.3, 1.0, False, g)
    G = correlated(G_prev, synthetic_momentum(shape, 1.3, 1.0, False, g), 0.95)
    prev = gram_solve(W, G_prev, M.gram_projector)
    return W, G, (prev.Lambda, prev.U)


def measure(role: str, shape, manifold: str, caps=CAPS, ref_steps: int = 800,
            check_unique: bool = True, seed: int = 0) -> dict:
    M = get_manifold(manifold)
    P = M.gram_projector
    W, G, warm = problem(shape, manifold, seed)
    ref = gram_solve(W.double(), G.double(), P, steps=ref_steps, tol=1e-8, warm=warm)
    A_ref = ref.matrix()
    out = dict(role=role, shape=list(shape), manifold=manifold, ref_gap=float(ref.gap.max()),
               ref_iterations=int(ref.iterations.max()))
    if check_unique:  # a second reference by another path (the cold start, 4x the ADMM penalty): is the
        # certified solution unique, or do two certified solves land on different ones?
        cold = gram_solve(W.double(), G.double(), P, steps=ref_steps, tol=1e-8, rho=4 / math.sqrt(min(shape)))
        out.update(cold_ref_gap=float(cold.gap.max()),
                   refs_e_A=float((cold.matrix() - A_ref).norm() / A_ref.norm()))
    W_ref = {lr: M.retract(W.double() - lr * A_ref) for lr in LRS}
    rows = []
    for cap in caps:
        t0 = time.perf_counter()  # one timing of the solve measured (seconds-long calls; no warm-up needed)
        sol = gram_solve(W, G, P, steps=cap, warm=warm)
        seconds = time.perf_counter() - t0
        A = sol.matrix().double()
        row = dict(cap=cap, seconds=seconds, iterations=int(sol.iterations.max()), gap=float(sol.gap.max()),
                   e_A=float((A - A_ref).norm() / A_ref.norm()))
        for lr in LRS:
            W_new = M.retract(W.double() - lr * A)
            row[f"e_W_lr{lr}"] = float((W_new - W_ref[lr]).norm() / W_ref[lr].norm())
        rows.append(row)
    base = next(r["seconds"] for r in rows if r["cap"] == DEFAULT_CAP) if DEFAULT_CAP in caps else None
    for r in rows:
        r["x_default"] = r["seconds"] / base if base else None
    out["rows"] = rows
    for lr in LRS:  # the least cap at which e_W meets the target (None: none of those tried)
        met = [r["cap"] for r in rows if r[f"e_W_lr{lr}"] <= E_W_TARGET]
        out[f"least_cap_lr{lr}"] = min(met) if met else None
    return out


def main(out_dir: Path, quick: bool = False) -> dict:
    if quick:
        plan, caps, ref_steps = [(64, w) for w in weights(64)[:1]], (8, 16), 200
    else:
        plan, caps, ref_steps = [(d, w) for d in (128, 768) for w in weights(d)], CAPS, 800
    with one_cpu_thread(), Stopwatch() as sw:  # the second reference: every weight at d <= 128, the first at 768
        results = [dict(d=d, **measure(*w, caps=caps, ref_steps=ref_steps,
                                       check_unique=d <= 128 or w[0] == "attn.c_attn")) for d, w in plan]
    params = dict(caps=list(caps), default_cap=DEFAULT_CAP, lrs=list(LRS), e_W_target=E_W_TARGET,
                  ref_steps=ref_steps, ref_tol=1e-8, decay=1.3, correlation=0.95, seed=0, quick=quick)
    result = write_result(out_dir, "iteration_cap", dict(results=results), params, sw.seconds)
    for r in results:
        print(f"[{r['role']} {tuple(r['shape'])} {r['manifold']}: reference gap {r['ref_gap']:.0e} after "
              f"{r['ref_iterations']} iterations; second reference differs by e_A {r.get('refs_e_A', float('nan')):.0e}]")
        for row in r["rows"]:
            print(f"  cap {row['cap']:3d}: {row['seconds']:7.2f} s (x{row['x_default'] or float('nan'):.1f} the default)"
                  f"  gap {row['gap']:.1e}  e_A {row['e_A']:.3f}  "
                  + "  ".join(f"e_W@{lr} {100 * row[f'e_W_lr{lr}']:.2f}%" for lr in LRS))
    return result


if __name__ == "__main__":
    main(Path("runs/bench"), quick=True)
