"""Has the tracked lean solve settled after the table's 64 momenta? (issue 19, a referee's check of ``solver_table``.)

The table judges each lean row's e_W at the step after ``STEADY`` = 64 momenta of a stationary stream
(``e_W_steady_lr0.02``), and calls it the settled error: the error of a tracking solve in a training run, past its
start-up from a cold multiplier. Whether 64 momenta are past that start-up was assumed, not measured. This study
measures it: along one stream (``steady_stream(shape, max(checkpoints), seed + 2)``, whose first 64 momenta are the
ones ``solver_seeds`` steps), from the same start point, the step at lr 0.02 is taken at each checkpoint c (the
state after the first c - 1 momenta at lr 0, as ``solver_table.walk`` leaves it) and judged against the certified
reference at the c-th momentum, with issue 19's bar at that momentum (min(1%, 2/3 of Muon's own e_W on it)). The
first checkpoint, 64, is the table's measurement: it reproduces ``solver_seeds``' number for that seed.

Criterion (fixed in this file before any of its data existed; a later change is logged here with why): per
(weight, variant, seed) the verdict e_W <= bar is read at every checkpoint. It is
- **settled** where the verdicts at the first checkpoint (the table's) and at the last two agree;
- **transient** where the last two agree with each other and not with the first: the table's verdict is its
  start-up's, not the settled solve's;
- **unsettled** where the last two disagree (the solve still moves, or sits at the bar).
Beside the verdicts, e_W / bar at each checkpoint (the bar moves with the momentum: the ratio is what a verdict
reads). Stateless variants (the cold step, Stiefel's lean default: nothing is carried from step to step) are the
control: their e_W can only move with the momentum, so a trend in theirs is the stream's, not a settling.
The table's rule is not changed by this study (it judges 64 momenta); what it finds is reported beside the table
(chapter 04, the closing note). No timing: only accuracy.

    python -m manifold_muon_book.bench.solver_settling     # the CPU presets' weights, into runs/bench/solver_settling.json
"""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path

import torch

from manifold_muon.manifolds import get_manifold
from manifold_muon.optim import ManifoldMuon
from manifold_muon_lab.provenance import Stopwatch, write_json_atomic
from .common import CPU_SHAPES, one_cpu_thread, write_result
from . import solver_seeds
from .solver_seeds import bar
from .solver_table import LRS, MANIFOLDS, STEADY, VARIANTS, check_names, e_W, reference, start_point, steady_stream

CHECKPOINTS = (STEADY, 128, 256, 512)
SHAPES = CPU_SHAPES + [(384, 128)]  # the table's weights at the CPU presets' width (GPT-2 small's: pass ``shapes``)
SEEDS = solver_seeds.SEEDS  # the seed study's five draws
QUICK = dict(shapes=[(48, 16)], seeds=(0,), checkpoints=(3, 5, 6))


def walk_checkpoints(make, W0, grads, checkpoints, lr: float) -> dict:
    """An optimizer on one weight W0 along ``grads`` at lr 0 (W stays W0, the solver's state follows the stream);
    at each checkpoint c, the step at ``lr`` on the c-th momentum from a copy of the state after the first c - 1
    (as ``solver_table.walk(make, W0, grads[:c], [lr])`` takes it: from the state saved and loaded), the stream then
    going on at lr 0 from the saved state.
    Returns {c: (W+, the recorded gap)}."""
    W = torch.nn.Parameter(W0.clone())
    opt = make([W])
    for g in opt.param_groups:
        g["lr"] = 0.0
    out = {}
    for i, G in enumerate(grads[:max(checkpoints)], start=1):
        if i in checkpoints:
            saved = copy.deepcopy(opt.state_dict())
            opt.load_state_dict(copy.deepcopy(saved))  # as ``walk`` steps it (a loaded state: the same bits as there)
            for g in opt.param_groups:
                g["lr"] = lr
            with torch.no_grad():
                W.copy_(W0)  # (at lr 0 the retraction still removes W's rounding off the manifold)
            W.grad = G.clone()
            opt.step()
            gap = opt.state[W].get("duality_gap")
            out[i] = (W.detach().clone(), None if gap is None else float(gap))
            opt.load_state_dict(saved)
            for g in opt.param_groups:
                g["lr"] = 0.0
            with torch.no_grad():
                W.copy_(W0)
        W.grad = G.clone()
        opt.step()
    return out


def classify(met: list[bool]) -> str:
    """The criterion above, on the verdicts at the checkpoints in order (at least three)."""
    first, late = met[0], met[-2:]
    if late[0] != late[1]:
        return "unsettled"
    return "settled" if first == late[0] else "transient"


def measure(shape, manifold: str, seed: int, variants, checkpoints) -> list[dict]:
    """One draw of one weight: the certified reference at every checkpoint's momentum, then each variant along the
    stream; a row per (variant, checkpoint). A checkpoint whose reference is not certified (a rank-deficient
    optimum) says so and carries no verdict."""
    M = get_manifold(manifold)
    W0 = start_point(shape, manifold, seed)
    long = steady_stream(shape, max(checkpoints), seed + 2)
    Wd = W0.double().cpu()
    refs = {c: reference(M, Wd, long[c - 1].double().cpu(), long[c - 1]) for c in checkpoints}
    lr = LRS[0]
    rows = []
    for variant in variants:
        make = lambda p, kw=VARIANTS[variant]: ManifoldMuon(p, momentum=0.0, nesterov=False, manifold=manifold, **kw)  # noqa: E731
        stepped = walk_checkpoints(make, W0, long, checkpoints, lr)
        for c in checkpoints:
            row = dict(shape=list(shape), manifold=manifold, variant=variant, seed=seed, steps=c)
            if refs[c] is None:
                rows.append(dict(row, reference=None))
                continue
            W_star, muon_e_W, ref_gap = refs[c]
            W_new, gap = stepped[c]
            e, b = e_W(W_new, W_star[lr]), bar(muon_e_W[lr])
            rows.append(dict(row, reference="certified", ref_gap=ref_gap, gap=gap, e_W=e, muon_e_W=muon_e_W[lr], bar=b,
                             met=e <= b))
    return rows


def summarise(rows, checkpoints) -> list[dict]:
    """Per (weight, variant, seed) with a certified reference at every checkpoint: e_W and e_W / bar at each, the
    verdicts and their class (``classify``)."""
    key = lambda r: (tuple(r["shape"]), r["manifold"], r["variant"], r["seed"])  # noqa: E731
    out = []
    for k in dict.fromkeys(key(r) for r in rows):
        rs = {r["steps"]: r for r in rows if key(r) == k}
        if any(not rs.get(c, {}).get("reference") for c in checkpoints):
            continue
        rs = [rs[c] for c in checkpoints]
        met = [r["met"] for r in rs]
        out.append(dict(shape=list(k[0]), manifold=k[1], variant=k[2], seed=k[3], checkpoints=list(checkpoints),
                        e_W=[r["e_W"] for r in rs], to_bar=[r["e_W"] / r["bar"] for r in rs], met=met,
                        verdict=classify(met)))
    return out


def counts(summary) -> dict:
    """How many (weight, variant, seed) fall in each class, and the median e_W / bar at each checkpoint, by variant."""
    out = {}
    for v in dict.fromkeys(r["variant"] for r in summary):
        rs = [r for r in summary if r["variant"] == v]
        out[v] = dict({c: sum(r["verdict"] == c for r in rs) for c in ("settled", "transient", "unsettled")},
                      median_to_bar=[statistics.median(r["to_bar"][i] for r in rs) for i in range(len(rs[0]["to_bar"]))])
    return out


def _check(checkpoints, seeds) -> tuple:
    checkpoints, seeds = tuple(checkpoints), solver_seeds.check_seeds("solver_settling", seeds)
    if (len(checkpoints) < 3 or any(not isinstance(c, int) or c < 1 for c in checkpoints)
            or list(checkpoints) != sorted(set(checkpoints))):
        raise ValueError(f"solver_settling: checkpoints must be at least three increasing positive integers (the "
                         f"table's stream length first, e.g. {CHECKPOINTS}), got {checkpoints!r}")
    return checkpoints, seeds


def main(out_dir: Path, quick: bool = False, shapes=None, manifolds=MANIFOLDS, variants=("lean", "lean_newton"),
         seeds=SEEDS, checkpoints=CHECKPOINTS, name: str = "solver_settling") -> dict:
    """The study over ``shapes`` (default the CPU presets' weights, ``SHAPES``) x ``manifolds`` x ``seeds``,
    ``variants`` of ``solver_table.VARIANTS``, into ``out_dir/name.json``. Bad arguments are refused before any work.

    Resumable: after each (weight, draw) the rows so far are written to ``out_dir/name.partial.json`` (a draw at
    GPT-2 small's shapes takes about 25 minutes); a run with the same settings starts from there and measures only
    what is missing, and removes the file once the study is written. A partial file of other settings is refused
    before any work (finish it with its own settings, or delete it)."""
    check_names("solver_settling", variants, manifolds)
    checkpoints, seeds = _check(checkpoints, seeds)
    if quick:
        shapes, seeds, checkpoints = QUICK["shapes"], QUICK["seeds"], QUICK["checkpoints"]
    shapes = [tuple(s) for s in (shapes or SHAPES)]
    weights = solver_seeds.judged_weights("solver_settling", shapes, manifolds)
    params = dict(shapes=[list(s) for s in shapes], manifolds=list(manifolds), variants=list(variants),
                  seeds=list(seeds), checkpoints=list(checkpoints), lr=LRS[0], quick=quick,
                  criterion="per (weight, variant, seed): e_W <= min(1%, 2/3 Muon's) at each checkpoint; settled where "
                            "the first checkpoint's verdict and the last two agree, transient where the last two agree "
                            "and not with the first, unsettled where the last two disagree")
    progress = Path(out_dir) / f"{name}.partial.json"
    rows, before = _resume(progress, params)
    done = {(tuple(r["shape"]), r["manifold"], r["seed"]) for r in rows}
    t0 = time.perf_counter()
    with one_cpu_thread(), Stopwatch() as sw:
        for s, m in weights:
            for seed in seeds:
                if (s, m, seed) in done:
                    continue
                new = measure(s, m, seed, variants, checkpoints)
                rows += new
                write_json_atomic(progress, dict(parameters=params, rows=rows, seconds=before + time.perf_counter() - t0))
                for v in variants:
                    print(f"{str(s):12s} {m:12s} {v:11s} seed {seed}: " + " ".join(
                        f"{r['steps']}:{100 * r['e_W']:.3f}%/{100 * r['bar']:.3f}%" if r.get("reference") else
                        f"{r['steps']}:-" for r in new if r["variant"] == v), flush=True)
    summary = summarise(rows, checkpoints)
    result = write_result(out_dir, name, dict(rows=rows, summary=summary, counts=counts(summary) if summary else {}),
                          params, before + sw.seconds)
    progress.unlink(missing_ok=True)
    for r in summary:
        print(f"{str(tuple(r['shape'])):12s} {r['manifold']:12s} {r['variant']:11s} seed {r['seed']}: e_W/bar "
              + " ".join(f"{x:.2f}" for x in r["to_bar"]) + f"  {r['verdict']}")
    return result


def _resume(progress: Path, params: dict) -> tuple[list, float]:
    """(rows, seconds) of an interrupted run of the same settings, ([], 0) where there is none."""
    import json

    if not progress.exists():
        return [], 0.0
    saved = json.loads(progress.read_text())
    if saved["parameters"] != json.loads(json.dumps(params)):
        raise ValueError(f"solver_settling: {progress} holds an interrupted run with other settings "
                         f"({saved['parameters']}); run it again with those settings to finish it, or delete the file")
    return saved["rows"], saved["seconds"]


def merge(out_dir: Path, parts, name: str = "solver_settling") -> dict:
    """One study from parts written by ``main(..., name=part)`` (``solver_seeds.merge``: a (weight, variant, seed,
    checkpoint) measured by two parts is refused), the counts taken over all; parts read at other checkpoints are
    refused."""
    def finish(payload, loaded):
        cps = {tuple(t["parameters"]["checkpoints"]) for t in loaded}
        if len(cps) != 1:
            raise ValueError(f"solver_settling.merge: the parts were read at different checkpoints {sorted(cps)}; "
                             "measure them alike")
        payload["counts"] = counts(payload["summary"])

    return solver_seeds.merge(out_dir, parts, name, who="solver_settling", finish=finish,
                              key=lambda r: (tuple(r["shape"]), r["manifold"], r["variant"], r["seed"], r["steps"]))

if __name__ == "__main__":
    main(Path("runs/bench"))
