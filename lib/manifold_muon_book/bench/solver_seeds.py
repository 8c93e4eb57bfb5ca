"""Do the solver table's accuracy verdicts hold on other draws? (issue 19, a referee's check of ``solver_table``.)

The table judges each lean row's settled e_W (``e_W_steady_lr0.02``: the step after 64 momenta of a stationary
stream, against a certified float64 reference, issue 19's bar min(1%, 2/3 of Muon's own e_W on the same momentum))
on one draw: seed 0's start point and stream. That draw is also where the lean defaults were chosen
(``manifold_muon.optim.lean_defaults``: cold or tracked, ADMM or Newton, by manifold and shape, each choice read off
the table's rows). So seed 0 is both the tuning set and the test set. This study repeats the same measurement
(``solver_table.walk`` along ``steady_stream``, ``solver_table.reference``) on held-out draws: seed k's start point
``start_point(shape, manifold, k)`` and stream ``steady_stream(shape, 64, k + 2)``, k = 1..4 (the ADMM penalty's tuning
seed, ``solver_table.TUNING_SEED``, is not among them), with seed 0 run again beside them (it reproduces the table's
number).

Criterion (fixed in this file before any of its data existed; a later change is logged here with why): per weight
and variant the verdict at each seed is e_W <= bar, the bar taken at that seed (Muon's e_W moves with the draw too).
A verdict **holds** where it is the same at every seed, and is **fragile** where it flips. The table's rule is not
changed by this study (it judges seed 0); fragile rows are reported beside it (chapter 04, the closing note).
Weights: the table's, where it measures a settled e_W (every rectangular weight; square ones where the reference
certifies: Stiefel, and DGram and Oblique at n <= 128, ``solver_table.measure``). No timing: only accuracy.

    python -m manifold_muon_book.bench.solver_seeds            # every weight, variant lean, into runs/bench/solver_seeds.json
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.optim import ManifoldMuon
from manifold_muon_lab.provenance import Stopwatch
from .common import one_cpu_thread, write_result
from .solver_table import (LRS, MANIFOLDS, STEADY, TABLE_SHAPES, TUNING_SEED, VARIANTS, check_names, e_W, reference,
                           start_point, steady_stream, walk)

SEEDS = (0, 1, 2, 3, 4)
QUICK = dict(shapes=[(48, 16)], seeds=(0, 1), steady=6)


def judged(shape, manifold: str) -> bool:
    """Whether the table measures a settled e_W on this weight (its reference is certified there)."""
    return shape[0] != shape[1] or manifold == "stiefel" or shape[0] <= 128


def judged_weights(who: str, shapes, manifolds) -> list:
    """The (shape, manifold) pairs of ``shapes`` x ``manifolds`` that are ``judged``; a clear error where none is."""
    weights = [(s, m) for s in shapes for m in manifolds if judged(s, m)]
    if not weights:
        raise ValueError(f"{who}: none of these weights has a certified reference, so none has a settled e_W (square "
                         "DGram and Oblique only at n <= 128); pass a rectangular shape or Stiefel")
    return weights


def check_seeds(who: str, seeds) -> tuple:
    """``seeds`` as a tuple of distinct non-negative integers, or a clear error."""
    seeds = tuple(seeds)
    if not seeds or any(not isinstance(s, int) or s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"{who}: seeds must be distinct non-negative integers, got {seeds!r}")
    return seeds


def bar(muon_e_W: float) -> float:
    """Issue 19's accuracy bar on one momentum: min(1%, 2/3 of Muon's own e_W)."""
    return min(0.01, 2 / 3 * muon_e_W)


def measure(shape, manifold: str, seed: int, variants, steady: int) -> list[dict]:
    """One draw of one weight: the certified reference at the stream's last momentum, then each variant along the
    stream (every step but the last at lr 0), its step at lr 0.02 judged against it. Rows without a certified
    reference say so (``reference``: None) and carry no verdict."""
    M = get_manifold(manifold)
    W0 = start_point(shape, manifold, seed)
    long = steady_stream(shape, steady, seed + 2)
    ref = reference(M, W0.double().cpu(), long[-1].double().cpu(), long[-1])
    base = dict(shape=list(shape), manifold=manifold, seed=seed, steady_steps=steady)
    if ref is None:
        return [dict(base, variant=v, reference=None) for v in variants]
    W_star, muon_e_W, ref_gap = ref
    lr = LRS[0]
    rows = []
    for variant in variants:
        make = lambda p, kw=VARIANTS[variant]: ManifoldMuon(p, momentum=0.0, nesterov=False, manifold=manifold, **kw)  # noqa: E731
        W_s, gaps, _ = walk(make, W0, long, [lr])
        e, b = e_W(W_s[lr], W_star[lr]), bar(muon_e_W[lr])
        rows.append(dict(base, variant=variant, reference="certified", ref_gap=ref_gap, gap=gaps[lr],
                         **{f"e_W_steady_lr{lr}": e, f"muon_e_W_steady_lr{lr}": muon_e_W[lr]}, bar=b, met=e <= b))
    return rows


def summarise(rows) -> list[dict]:
    """Per (weight, variant): the settled e_W over the seeds (median, range), the bars, the verdict at each seed,
    whether it holds (the same at every seed) and what seed 0 (the table's draw) says."""
    key = lambda r: (tuple(r["shape"]), r["manifold"], r["variant"])  # noqa: E731
    out = []
    for k in dict.fromkeys(key(r) for r in rows):
        rs = sorted((r for r in rows if key(r) == k and r.get("reference")), key=lambda r: r["seed"])
        if not rs:
            continue
        e = [r["e_W_steady_lr0.02"] for r in rs]
        met = [r["met"] for r in rs]
        at0 = [r["met"] for r in rs if r["seed"] == 0]
        out.append(dict(shape=list(k[0]), manifold=k[1], variant=k[2], seeds=[r["seed"] for r in rs],
                        e_W=e, bars=[r["bar"] for r in rs], met=met, e_W_median=statistics.median(e),
                        e_W_min=min(e), e_W_max=max(e), holds=len(set(met)) == 1,
                        met_at_seed0=at0[0] if at0 else None, times_met=sum(met)))
    return out


def main(out_dir: Path, quick: bool = False, shapes=None, manifolds=MANIFOLDS, variants=("lean",), seeds=SEEDS,
         steady: int | None = None, name: str = "solver_seeds") -> dict:
    """The study over ``shapes`` (default the table's, ``TABLE_SHAPES``) x ``manifolds`` x ``seeds``, ``variants`` of
    ``solver_table.VARIANTS`` (default the library's lean step), into ``out_dir/name.json``. Bad arguments are
    refused before any work."""
    check_names("solver_seeds", variants, manifolds)
    seeds = check_seeds("solver_seeds", seeds)
    if TUNING_SEED - 2 in seeds:  # its stream would be the penalty's tuning stream
        raise ValueError(f"solver_seeds: seed {TUNING_SEED - 2} draws the ADMM penalty's tuning stream "
                         f"(solver_table.TUNING_SEED = {TUNING_SEED}); leave it out")
    if quick:
        shapes, seeds, steady = QUICK["shapes"], QUICK["seeds"], QUICK["steady"]
    shapes = [tuple(s) for s in (shapes or TABLE_SHAPES)]
    steady = steady or STEADY
    weights = judged_weights("solver_seeds", shapes, manifolds)
    with one_cpu_thread(), Stopwatch() as sw:
        rows = []
        for s, m in weights:
            for seed in seeds:
                rows += measure(s, m, seed, variants, steady)
                r = rows[-1]
                if r.get("reference"):
                    print(f"{str(s):12s} {m:12s} seed {seed}: " + ", ".join(
                        f"{x['variant']} {100 * x['e_W_steady_lr0.02']:.3f}%" for x in rows[-len(variants):])
                        + f"  (bar {100 * r['bar']:.3f}%)", flush=True)
    summary = summarise(rows)
    params = dict(shapes=[list(s) for s in shapes], manifolds=list(manifolds), variants=list(variants),
                  seeds=list(seeds), steady=steady, lr=LRS[0], quick=quick,
                  criterion="per seed: e_W <= min(1%, 2/3 Muon's e_W at that seed); holds where every seed agrees")
    result = write_result(out_dir, name, dict(rows=rows, summary=summary), params, sw.seconds)
    for r in summary:
        verdicts = "".join("y" if m else "n" for m in r["met"])
        print(f"{str(tuple(r['shape'])):12s} {r['manifold']:12s} {r['variant']:11s} e_W median "
              f"{100 * r['e_W_median']:.3f}% ({100 * r['e_W_min']:.3f}-{100 * r['e_W_max']:.3f}) met by seed "
              f"{verdicts} {'holds' if r['holds'] else 'FRAGILE'}")
    return result


def skew_floors(out_dir: Path, shapes=((128, 128), (768, 768)), seeds=SEEDS, steady: int = STEADY,
                name: str = "solver_seeds_skew_floor") -> dict:
    """Why square Stiefel's closed form (exact, gap 0) can sit a little off the reference: per draw of ``measure``,
    the singular values of S = skew(W0^T G) (float64, from the float32 weight and momentum the study steps), the
    smallest relative to the largest, and how many lie below the closed form's numerical range (1e-6 of the
    largest, ``manifold_muon.optim.manifold_muon.skew_pairs`` and ``range_msign``: null there, B = 0 on them, while the
    float64 reference resolves them; a pair there moves the step by about lr sqrt(2 / n) of the weight)."""
    if any(s[0] != s[1] for s in shapes):
        raise ValueError(f"solver_seeds.skew_floors: square shapes only (the closed form's), got {list(shapes)}")
    rows = []
    with one_cpu_thread(), Stopwatch() as sw:
        for shape in shapes:
            for seed in seeds:
                W0 = start_point(shape, "stiefel", seed).double().cpu()
                G = steady_stream(shape, steady, seed + 2)[-1].double().cpu()
                K = W0.mT @ G
                sv = torch.linalg.svdvals(K - K.mT)
                rel = sv / sv[0]
                rows.append(dict(shape=list(shape), seed=seed, s_min_rel=float(rel[-1]),
                                 below_range=int((rel <= 1e-6).sum()), range_rtol=1e-6))
    return write_result(out_dir, name, dict(rows=rows), dict(shapes=[list(s) for s in shapes], seeds=list(seeds),
                                                             steady=steady), sw.seconds)


def merge(out_dir: Path, parts, name: str = "solver_seeds", key=None, who: str = "solver_seeds", finish=None) -> dict:
    """One study from parts written by ``main(..., name=part)`` (e.g. the CPU presets' shapes and GPT-2 small's, run
    in separate processes): rows and summaries concatenated, each part's parameters and provenance kept under
    ``parts``. A (weight, variant, seed) measured by two parts is refused: say which part to keep. ``key`` (a row's
    identity, default (shape, manifold, variant, seed)), ``who`` and ``finish(payload, loaded)`` (checks and adds to
    the payload before anything is written) let another study merge its parts the same way (``solver_settling``)."""
    import json

    key = key or (lambda r: (tuple(r["shape"]), r["manifold"], r["variant"], r["seed"]))
    loaded = [json.loads((Path(out_dir) / f"{p}.json").read_text()) for p in parts]
    seen = {}
    for p, t in zip(parts, loaded):
        for r in t["rows"]:
            k = key(r)
            if k in seen:
                raise ValueError(f"{who}.merge: {k} is in parts {seen[k]} and {p}; merge only one of them")
            seen[k] = p
    payload = dict(rows=[r for t in loaded for r in t["rows"]], summary=[s for t in loaded for s in t["summary"]],
                   parts={p: {k: v for k, v in t.items() if k not in ("rows", "summary")} for p, t in zip(parts, loaded)})
    if finish is not None:
        finish(payload, loaded)
    return write_result(out_dir, name, payload, dict(merged=list(parts)), sum(t["wall_time_s"] for t in loaded))

if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench"))
