"""Training speed per assignment: tokens/s, seconds per step, and the optimizer's share of a step.

Each assignment trains a few steps of the ``cpu`` preset (``--quick``: the ``cpu-tiny`` model) through
``train()`` itself, so what is timed is what a run does: forward-backward (``time_fb_s``) and the
optimizer step with gradient clipping (``time_opt_s``), as the run records them in metrics.jsonl. The
tokens are random (``data=synthetic``): speed does not depend on them, and no corpus is prepared.
The first step of every run (allocations, lazy imports) is left out of the medians.

The post's per-step cost ratios to Unconstrained (5.8x All Stiefel, 8.3x Hetero, 13.6x All DGram on an
H100 at GPT-2 124M) are listed next to ours for reference only: the shapes and the hardware differ.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from manifold_muon_lab.provenance import provenance, write_json_atomic

POST_ASSIGNMENTS = ("unconstrained", "all_stiefel", "hetero", "all_dgram", "hetero_inv")
PAPER_003_ASSIGNMENTS = ("muon", "macro_fro", "macro_spec", "muonh_fro", "muonh_spec", "sso", "fso")
POST_RATIOS = {"all_stiefel": 5.8, "hetero": 8.3, "all_dgram": 13.6}  # per-step time / Unconstrained


def time_assignment(preset: str, assignment: str, steps: int, out_dir: Path, **overrides) -> dict:
    """Median seconds per step (fb, opt, total) over steps 1..steps-1 of a short run, and tokens/s."""
    from manifold_muon_lab.config import load_preset
    from manifold_muon_lab.metrics import read_metrics
    from manifold_muon_lab.train import train

    from ..pipeline import repo_root

    cfg = load_preset(preset, repo_root() / "runs" / "presets" / "training", assignment=assignment, data="synthetic", vocab_size=256, max_steps=steps,
                      warmup=0, eval_every=10**9, eval_batches=1, probe_every=0, spectrum_every=0,
                      checkpoint_every=-1, out_dir=str(out_dir / assignment), **overrides)
    summary = train(cfg, resume=False, progress=False)
    st = read_metrics(out_dir / assignment, "step")[1:]
    fb = statistics.median(r["time_fb_s"] for r in st)
    opt = statistics.median(r["time_opt_s"] for r in st)
    total = statistics.median(r["time_fb_s"] + r["time_opt_s"] for r in st)
    return {"status": summary["status"], "steps_timed": len(st), "step_s": total, "fb_s": fb, "opt_s": opt,
            "optimizer_share": opt / (fb + opt), "tokens_per_s": cfg.batch_size * cfg.block_size / total}


def main(out_dir: Path, quick: bool = False) -> dict:
    out_dir = Path(out_dir)
    preset, steps = ("cpu-tiny", 3) if quick else ("cpu", 8)
    t0 = time.perf_counter()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for a in POST_ASSIGNMENTS + PAPER_003_ASSIGNMENTS:
            rows[a] = time_assignment(preset, a, steps, Path(tmp))
            print(f"[bench] training {a:14s} {rows[a]['step_s'] * 1e3:8.1f} ms/step  "
                  f"optimizer {100 * rows[a]['optimizer_share']:5.1f}%  {rows[a]['tokens_per_s']:9.0f} tok/s",
                  flush=True)
    for a, r in rows.items():
        base = rows["unconstrained"] if a in POST_ASSIGNMENTS else rows["muon"]
        r["step_ratio_to_baseline"] = r["step_s"] / base["step_s"]
        r["baseline"] = "unconstrained" if a in POST_ASSIGNMENTS else "muon"
        if a in POST_RATIOS:
            r["post_ratio_h100_gpt2_124m"] = POST_RATIOS[a]
    result = {"preset": preset, "steps_per_run": steps, "data": "synthetic", "assignments": rows,
              "provenance": provenance(parameters={"preset": preset, "steps": steps, "quick": quick},
                                       wall_time_s=time.perf_counter() - t0)}
    write_json_atomic(out_dir / "training.json", result)
    return result


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    main(args.out, quick=args.quick)
