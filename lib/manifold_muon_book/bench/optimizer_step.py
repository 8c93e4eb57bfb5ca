"""One whole optimizer step over a transformer's block matrices, as a ratio to Muon's step in the same run.

The matrices are GPT-2's (nanoGPT names, weight = (D_out, D_in)): per layer c_attn (3d, d), attn.c_proj
(d, d), mlp.c_fc (4d, d), mlp.c_proj (d, 4d); GPT-2 small is 12 layers at d = 768 (48 matrices). Each
condition is a named assignment of ``manifold_muon.assignments`` with every optimizer at its library
defaults (ManifoldMuon: the certified Gram-space solve, warm-started, at most 16 ADMM iterations, stop at a
relative duality gap of 1e-3; sphere optimizers: Newton-Schulz msign, SSO/FSO at most 10 bisection steps),
weights put on their manifolds first. Gradients are training-like by default: a fresh one each step, with
singular values falling like i^-1.3 (the decay of the momenta recorded from training, chapter 04) and random
singular vectors, smoothed by each optimizer's own momentum. (With one fixed Gaussian gradient, the
variants marked "fixed G", the previous step's multipliers are certified at once and a Manifold Muon step
does no iteration; in training it does not go that way: most non-square solves run to the iteration cap
(chapter 04 trains the smoke model and reads its update records). The fixed-gradient regime alone would
understate the cost.)
Time is the fastest of ``repeats`` steps after one warm-up step (so the warm start has a previous solve to
start from); the timed step's ADMM iterations and certified gaps are recorded with it.

Presets: "cpu" (4 layers, d = 128), "gpt2_small" (12 layers, d = 768; on a CPU-only machine it runs
``cpu_layers`` layer(s) of GPT-2 small shapes instead, since every layer has the same four shapes the ratio
to Muon is unchanged, and says so in the output), "quick" (2 layers, d = 64).
Variants time the same step with one setting changed: Muon's msign in float32 (its default bfloat16
Newton-Schulz is fast on CPUs with bf16 matrix units and slow on others), the spectral sphere's top
singular pair by 10 power iterations instead of an SVD, and the Manifold Muon assignments with the post's
recipe (``inner="post"``) and with this library's earlier default (``inner="dual_ascent"``: 20 cold steps
on unit-RMS G, Polar Express msign).
Targets reported against (issue 9): Hetero <= 2.5x Muon, All-Stiefel and All-DGram <= 3x, against Muon in
float32 and at its default bfloat16. Per preset, ``breakdown`` times the parts of Hetero's default step for
each of a layer's four weights against Muon's msign of the same matrix (``solve_breakdown``): the floor of
a certified step (no iteration), and what each ADMM iteration adds. Measures; asserts nothing about speed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from manifold_muon.assignments import build_optimizers, retract_parameters
from manifold_muon_lab.provenance import Stopwatch
from manifold_muon.manifolds import get_manifold
from manifold_muon.msign import msign
from manifold_muon.optim.inner_solvers import _tall_unit, admm_gram, certificate, gram_picture, gram_solve
from manifold_muon.optim.manifold_muon import fused_retract
from .common import device, one_cpu_thread, time_call, write_result
from .momenta import synthetic_momentum

CONDITIONS = ("unconstrained", "all_stiefel", "all_dgram", "hetero", "hetero_inv",
              "macro_fro", "macro_spec", "muonh_fro", "muonh_spec", "sso", "fso")
# informative variants: (label, assignment, build_optimizers overrides)
VARIANTS = (("unconstrained[msign fp32]", "unconstrained", dict(msign_dtype=torch.float32)),
            ("macro_spec[power 10]", "macro_spec", dict(manifold_args=dict(power_iters=10))),
            ("muonh_spec[power 10]", "muonh_spec", dict(manifold_args=dict(power_iters=10))),
            ("hetero[post]", "hetero", dict(inner="post")),
            ("all_stiefel[post]", "all_stiefel", dict(inner="post")),
            ("all_dgram[post]", "all_dgram", dict(inner="post")),
            ("hetero[dual_ascent]", "hetero", dict(inner="dual_ascent")),
            ("hetero[fixed G]", "hetero", dict(gradients="fixed")),
            ("unconstrained[fixed G]", "unconstrained", dict(gradients="fixed")))
BASELINE = "unconstrained"  # Muon on every block matrix, at its defaults (Newton-Schulz in bfloat16)
FP32_BASELINE = "unconstrained[msign fp32]"
TARGET = {"hetero": 2.5, "all_stiefel": 3.0, "all_dgram": 3.0}


class BlockMatrices(nn.Module):
    """Only the block matrices of a GPT-2, under nanoGPT's names (so assignments find their roles)."""

    def __init__(self, n_layer: int, d: int):
        super().__init__()

        def layer():
            b = nn.Module()
            b.attn, b.mlp = nn.Module(), nn.Module()
            b.attn.c_attn, b.attn.c_proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            b.mlp.c_fc, b.mlp.c_proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)
            return b

        self.transformer = nn.ModuleDict(dict(h=nn.ModuleList([layer() for _ in range(n_layer)])))


def gradient_stream(model: nn.Module, steps: int, kind: str, seed: int = 0, decay: float = 1.3) -> dict:
    """{parameter: [gradient of step 0, 1, ...]}: ``kind`` "training" (fresh each step, singular values
    proportional to i^-decay, random singular vectors; scaled to unit RMS) or "fixed" (one Gaussian, reused)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for p in model.parameters():
        a, b = p.shape
        if kind == "fixed":
            out[p] = [torch.randn(a, b, generator=g).to(p.device)] * steps
            continue
        out[p] = [synthetic_momentum((a, b), decay, 1.0, False, g).to(p.device) for _ in range(steps)]
    return out


def time_condition(name: str, n_layer: int, d: int, repeats: int, seed: int = 0, overrides=None) -> dict:
    """Seconds of one step of assignment ``name`` (fastest of ``repeats`` after a warm-up), and the ADMM
    iterations (mean over matrices) and the largest certified relative gap of the last step, where recorded."""
    overrides = dict(overrides or {})
    kind = overrides.pop("gradients", "training")
    torch.manual_seed(seed)
    model = BlockMatrices(n_layer, d).to(device())
    params = list(model.parameters())
    grads = gradient_stream(model, repeats + 1, kind, seed)
    opts = build_optimizers(model, name, lr=0.01, **overrides)
    retract_parameters(opts)
    count = iter(range(repeats + 1))

    def step():
        i = next(count)
        for p in params:
            p.grad = grads[p][i]
        for o in opts:
            o.step()

    seconds = time_call(step, repeats)
    states = [o.state[p] for o in opts for p in o.state if "inner_iterations" in o.state[p]]
    return dict(seconds=seconds, gradients=kind,
                inner_iterations=(sum(float(s["inner_iterations"]) for s in states) / len(states)) if states else None,
                max_gap=max(float(s["duality_gap"]) for s in states) if states else None)


def solve_breakdown(role: str, shape: tuple, manifold: str, repeats: int, seed: int = 0, lr: float = 0.01) -> dict:
    """Where one default Manifold Muon step's time goes, for one weight, against Muon's msign of the same
    matrix in the same run (bfloat16, its default, and float32). The parts, each timed alone on a
    training-like momentum (the second of a stream, warm-started from the first's solve):
    ``picture`` (the m x n products into n x n blocks), ``certificate`` (one, msign candidate only: what a
    solve whose warm start is already certified pays), ``certificate_both`` (one with the ADMM candidate
    too: the in-loop check), ``iteration`` (one ADMM iteration), ``polish`` (the extra of the polished
    certificate at the cap), ``retraction`` (``fused_retract``), and ``solve`` (``gram_solve`` whole) and
    its iterations. ``floor`` = picture + certificate + retraction: a certified step that needs no
    iteration, this design's least cost; ``step`` = solve + retraction (the optimizer step of this weight,
    momentum aside)."""
    M = get_manifold(manifold)
    P = M.gram_projector
    g = torch.Generator().manual_seed(seed)
    W = M.random_point(shape, generator=g)
    G_prev, G = (synthetic_momentum(shape, 1.3, 1.0, False, g) for _ in range(2))
    prev = gram_solve(W, G_prev, P)
    warm = (prev.Lambda, prev.U)
    Wt, Gt, _ = _tall_unit(W, G)
    pic = gram_picture(Wt, Gt, P)
    rho, tol = Wt.size(-1) ** -0.5, 1e-3
    sol = gram_solve(W, G, P, warm=warm)
    t = lambda fn: time_call(fn, repeats)
    parts = dict(
        muon_bf16=t(lambda: msign(G, "newton_schulz", 5, torch.bfloat16)),
        muon_fp32=t(lambda: msign(G, "newton_schulz", 5, torch.float32)),
        picture=t(lambda: gram_picture(Wt, Gt, P)),
        certificate=t(lambda: certificate(pic, warm[0], None, None, tol)),
        certificate_both=t(lambda: certificate(pic, warm[0], warm[1], None, None)),
        iteration=t(lambda: admm_gram(pic, warm[0], warm[1], rho, 1)),
        polish=t(lambda: certificate(pic, sol.Lambda, sol.U, None, None, 2)),
        retraction=t(lambda: fused_retract(M, sol, lr, 0.0, W.dtype)),
        solve=t(lambda: gram_solve(W, G, P, warm=warm)),
    )
    parts["polish"] = max(parts["polish"] - parts["certificate_both"], 0.0)
    parts["floor"] = parts["picture"] + parts["certificate"] + parts["retraction"]
    parts["step"] = parts["solve"] + parts["retraction"]
    return dict(role=role, shape=list(shape), manifold=manifold, seconds=parts,
                iterations=int(sol.iterations.max()), gap=float(sol.gap.max()),
                x_muon_bf16={k: v / parts["muon_bf16"] for k, v in parts.items()},
                x_muon_fp32={k: v / parts["muon_fp32"] for k, v in parts.items()})


def breakdown(d: int, repeats: int) -> list[dict]:
    """``solve_breakdown`` for Hetero's four weights of one layer at width ``d`` (nanoGPT's (D_out, D_in))."""
    weights = (("attn.c_attn", (3 * d, d), "stiefel"), ("attn.c_proj", (d, d), "stiefel"),
               ("mlp.c_fc", (4 * d, d), "dgram"), ("mlp.c_proj", (d, 4 * d), "dgram"))
    return [solve_breakdown(role, shape, manifold, repeats) for role, shape, manifold in weights]


def measure(preset: str, n_layer: int, d: int, repeats: int, conditions=CONDITIONS) -> dict:
    timed = {c: time_condition(c, n_layer, d, repeats) for c in conditions}
    timed.update({label: time_condition(a, n_layer, d, repeats, overrides=o) for label, a, o in VARIANTS})
    base, base32 = timed[BASELINE]["seconds"], timed[FP32_BASELINE]["seconds"]
    rows = [dict(condition=c, **t, ratio_to_muon=t["seconds"] / base, ratio_to_muon_fp32=t["seconds"] / base32,
                 target=TARGET.get(c),
                 meets_target=(max(t["seconds"] / base, t["seconds"] / base32) <= TARGET[c]) if c in TARGET else None)
            for c, t in timed.items()]
    return dict(preset=preset, n_layer=n_layer, d=d, matrices=4 * n_layer, repeats=repeats, rows=rows,
                breakdown=breakdown(d, repeats))


def main(out_dir: Path, quick: bool = False, cpu_layers: int = 1) -> dict:
    on_gpu = device().type == "cuda"
    if quick:
        presets = [("quick", 2, 64, 2)]
    else:
        presets = [("cpu", 4, 128, 3), ("gpt2_small", 12 if on_gpu else cpu_layers, 768, 3 if on_gpu else 1)]
    with one_cpu_thread(), Stopwatch() as sw:
        results = [measure(*p) for p in presets]
        params = dict(presets=[dict(zip(("preset", "n_layer", "d", "repeats"), p)) for p in presets],
                      gradients="training: fresh each step, singular values ~ i^-1.3, unit RMS; 'fixed G': one Gaussian",
                      conditions=list(CONDITIONS), variants=[[v[0], v[1], repr(v[2])] for v in VARIANTS],
                      baseline=BASELINE, fp32_baseline=FP32_BASELINE, targets=TARGET, quick=quick, seed=0,
                      note=None if on_gpu or quick else
                      f"no GPU: gpt2_small ran {cpu_layers} layer(s) of GPT-2 small shapes (the ratio per layer "
                      "equals the ratio for 12 identical layers up to batching)")
    result = write_result(out_dir, "optimizer_step", dict(results=results), params, sw.seconds)
    for r in results:
        print(f"[{r['preset']}: {r['n_layer']} layer(s), d={r['d']}, {r['matrices']} matrices, device {device()}]")
        for row in r["rows"]:
            mark = "" if row["target"] is None else f"  (target <= {row['target']}x: {'met' if row['meets_target'] else 'MISSED'})"
            inner = "" if row["inner_iterations"] is None else \
                f"  ({row['inner_iterations']:.1f} ADMM iterations, gap <= {row['max_gap']:.0e})"
            print(f"  {row['condition']:>25}  {row['seconds'] * 1e3:10.2f} ms  x{row['ratio_to_muon']:.2f} Muon bf16"
                  f"  x{row['ratio_to_muon_fp32']:.2f} Muon fp32{mark}{inner}")
        print("  Hetero's default step per weight, parts as x Muon's msign of that matrix (bf16 / fp32):")
        for b in r["breakdown"]:
            x, x32 = b["x_muon_bf16"], b["x_muon_fp32"]
            parts = "  ".join(f"{k} {x[k]:.1f}/{x32[k]:.1f}" for k in ("picture", "certificate", "iteration",
                                                                       "retraction", "floor", "step"))
            print(f"    {b['role']:>11} {tuple(b['shape'])!s:>12} {b['manifold']:>7}: {parts}"
                  f"  ({b['iterations']} iterations, gap {b['gap']:.0e})")
    return result


if __name__ == "__main__":
    main(Path("runs/bench"), quick=True)
