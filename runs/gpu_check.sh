#!/usr/bin/env bash
# One short check for a lent GPU (written for one H200; about 10 minutes): the solver's table at GPT-2 small's
# shapes, the sync-free msign prototype, the square closed form's cost by part at 128 and 768 and the Gram
# picture's first solve two ways, and the lean step compiled (solver_table_gpu.json, sync_free_msign_gpu.json,
# square_cost_gpu.json, diagonal_solve_gpu.json, compiled_step_gpu.json; DGram's two Newton trackers,
# solver_table_newton_dk_gpu.json),
# then 30 steps of the gpt2-124m
# preset (GPT-2 124M, 64 x 1024 tokens per step, bf16 autocast) per assignment, the post's five and
# the paper's seven optimizers, and the per-step time of each as a ratio to plain Muon, printed next to the
# post's 5.8x (All Stiefel), 8.3x (Hetero) and 13.6x (All DGram) measured on an H100.
#
#   bash runs/gpu_check.sh            # results also in $OUT/gpu_check.json (or runs/bench/)
#   PRESET=cpu-tiny STEPS=8 DEVICE=cpu bash runs/gpu_check.sh      # a dry run of the script on a CPU
#
# The tokens are random (data=synthetic, vocab 50304): the machine has no network for OpenWebText,
# and speed does not depend on the tokens. Steps 0-4 (allocation, cuBLAS/cuSOLVER warm-up) are left
# out of the median; no checkpoint is written; no torch.compile (a minute of compiling per run would
# not fit, so the forward-backward is slower than a compiled nanoGPT's and the ratios come out lower
# than with compile). The post's three ratios come first, and the driver stops starting new runs
# after BUDGET_S seconds, so a slow machine still reports the ones that fit; each row is printed
# (and gpu_check.json rewritten) as it finishes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD/lib${PYTHONPATH:+:$PYTHONPATH}"
RESULT_DIR=${OUT:-runs/bench}
mkdir -p "$RESULT_DIR"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

# First the solver's table on the GPU (about a minute): at GPT-2 small's four shapes, each Gram manifold, the
# lean default and the post's recipe against Muon's float32 step of the same matrix, with the operation counts
# (products, eigendecompositions, host synchronisations); timing only (no float64 reference on the GPU).
RESULT_DIR="$RESULT_DIR" timeout 240 "$PY" -c "
import os; from pathlib import Path
from manifold_muon_book.bench import solver_table
solver_table.main(Path(os.environ['RESULT_DIR']), ref_max_n=0, exact_max_n=0, fail_on_miss=False,
                  name='solver_table_gpu')
" || echo "solver_table did not finish in 240 s"

# Then DGram's Newton tracker with two eigendecompositions a step (the lean default on rectangular DGram) against the
# option tracker="newton_dk" with one (under two minutes; bench solver_table's comparison lean_newton_dk, chapter
# 04): on one CPU thread the second costs 3-17% less; on a GPU, where an eigendecomposition and its host read cost
# many Muon steps, the question is how much less.
RESULT_DIR="$RESULT_DIR" timeout 120 "$PY" -c "
import os; from pathlib import Path
from manifold_muon_book.bench import solver_table
solver_table.main(Path(os.environ['RESULT_DIR']), ref_max_n=0, exact_max_n=0, fail_on_miss=False,
                  manifolds=['dgram'], variants=['lean', 'lean_newton_dk'], name='solver_table_newton_dk_gpu')
" || echo "solver_table (newton_dk) did not finish in 120 s"

# Then square Stiefel's msign by products alone against its eigendecomposition (a prototype, under a minute): the
# comparison a CPU cannot make (bench sync_free_msign, chapter 04). Both GPU files have their own names, so that a
# run without OUT leaves the book's CPU measurements in runs/bench as they are.
RESULT_DIR="$RESULT_DIR" timeout 90 "$PY" -c "
import os; from pathlib import Path
from manifold_muon_book.bench import sync_free_msign
sync_free_msign.main(Path(os.environ['RESULT_DIR']), name='sync_free_msign_gpu')
" || echo "sync_free_msign did not finish in 90 s"

# And where square Stiefel's closed form spends its time on the GPU, part by part against a Muon step (bench
# square_cost, chapter 04; under a minute): its eigendecomposition is the part a CPU cannot speak for.
RESULT_DIR="$RESULT_DIR" timeout 90 "$PY" -c "
import os; from pathlib import Path
from manifold_muon_book.bench import square_cost
square_cost.main(Path(os.environ['RESULT_DIR']), name='square_cost_gpu')
" || echo "square_cost did not finish in 90 s"

# And the Gram picture's first solve two ways (bench diagonal_solve, chapter 04; seconds): a Cholesky factorisation
# with its triangular solves against one product, where the GPU's ratio need not be the CPU's.
RESULT_DIR="$RESULT_DIR" timeout 60 "$PY" -c "
import os; from pathlib import Path
from manifold_muon_book.bench import diagonal_solve
diagonal_solve.main(Path(os.environ['RESULT_DIR']), name='diagonal_solve_gpu')
" || echo "diagonal_solve did not finish in 60 s"

# And the lean step under torch.compile against Muon under it too, at GPT-2 small's c_attn (DGram) and c_proj
# (Stiefel) (bench compiled_step, chapter 04; about two minutes, most of it compiling): fused launches are what a
# GPU gains from compiling, which a CPU cannot speak for.
RESULT_DIR="$RESULT_DIR" timeout 180 "$PY" -c "
import os; from pathlib import Path
from manifold_muon_book.bench import compiled_step
compiled_step.main(Path(os.environ['RESULT_DIR']), weights=[((768, 2304), 'dgram'), ((768, 768), 'stiefel')],
                   name='compiled_step_gpu')
" || echo "compiled_step did not finish in 180 s"

export PRESET=${PRESET:-gpt2-124m} STEPS=${STEPS:-30} DEVICE=${DEVICE:-cuda}
BUDGET_S=${BUDGET_S:-420} RESULT_DIR="$RESULT_DIR" timeout 540 "$PY" - <<'EOF'
import json, os, statistics, tempfile, time
from pathlib import Path

import torch

from manifold_muon_lab.config import load_preset
from manifold_muon_lab.provenance import provenance, write_json_atomic
from manifold_muon_lab.train import train

order = ["unconstrained", "all_stiefel", "hetero", "all_dgram", "muon", "macro_fro", "macro_spec",
         "muonh_fro", "muonh_spec", "hetero_inv", "fso", "sso"]  # the post's three ratios first
post = {"all_stiefel": 5.8, "hetero": 8.3, "all_dgram": 13.6}
budget, t0, rows = float(os.environ["BUDGET_S"]), time.perf_counter(), {}
preset, steps, device = os.environ["PRESET"], int(os.environ["STEPS"]), os.environ["DEVICE"]
cuda = device == "cuda"
PRESETS = "runs/presets/training"
vocab = {} if load_preset(preset, PRESETS).vocab_size else {"vocab_size": 256}
out = Path(os.environ["RESULT_DIR"]) / "gpu_check.json"
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0) if cuda else 'cpu'}, {preset}, {steps} steps",
      flush=True)
print(f"{'assignment':14s} {'ms/step':>9s} {'opt ms':>9s} {'ratio':>7s} {'post':>6s}  status", flush=True)
with tempfile.TemporaryDirectory() as tmp:
    for a in order:
        if time.perf_counter() - t0 > budget:
            print(f"{a:14s} skipped: the {budget:.0f} s budget is spent", flush=True)
            continue
        cfg = load_preset(preset, PRESETS, assignment=a, data="synthetic", max_steps=steps, warmup=3,
                          eval_every=10**9, eval_batches=1, probe_every=0, spectrum_every=0,
                          checkpoint_every=-1, compile=False, device=device, out_dir=f"{tmp}/{a}", **vocab)
        try:
            s = train(cfg, resume=False, progress=False)
        except Exception as e:  # report and go on: one broken optimizer must not hide the others
            print(f"{a:14s} failed: {type(e).__name__}: {e}", flush=True)
            rows[a] = {"status": f"failed: {type(e).__name__}: {e}"}
            continue
        recs = [json.loads(l) for l in open(f"{tmp}/{a}/metrics.jsonl")]
        st = [r for r in recs if r["kind"] == "step"][5:]
        step = statistics.median(r["time_fb_s"] + r["time_opt_s"] for r in st) if st else float("nan")
        opt = statistics.median(r["time_opt_s"] for r in st) if st else float("nan")
        rows[a] = {"status": s["status"], "step_s": step, "opt_s": opt, "steps_timed": len(st)}
        if cuda:
            rows[a]["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        base = rows.get("unconstrained", {}).get("step_s")
        ratio = step / base if base else float("nan")
        rows[a]["ratio_to_unconstrained"] = ratio
        claimed = f"{post[a]:5.1f}x" if a in post else f"{'-':>6s}"
        print(f"{a:14s} {1e3 * step:9.1f} {1e3 * opt:9.1f} {ratio:6.1f}x {claimed}  {s['status']}", flush=True)
        write_json_atomic(out, {"rows": rows, "post_ratios_h100": post, "provenance": provenance(
            parameters={"preset": preset, "steps": steps, "data": "synthetic", "device": device},
            wall_time_s=time.perf_counter() - t0)})
print(f"total {time.perf_counter() - t0:.0f} s; written {out}", flush=True)
EOF
