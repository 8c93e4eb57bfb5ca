"""The training loop: one run of one config, recording why it behaves as it does.

    from manifold_muon_lab.config import load_preset
    from manifold_muon_lab.train import train
    summary = train(load_preset("cpu", "runs/presets/training", assignment="hetero", out_dir="runs/_train/hetero"))

    python -m manifold_muon_lab.train --preset cpu --assignment hetero [--set key=value ...]
    torchrun --nproc_per_node 2 -m manifold_muon_lab.train --preset cpu-tiny     # data parallel

What a run leaves in ``out_dir``: ``metrics.jsonl`` (see ``metrics.Recorder``), ``status.json``
("completed" or "diverged at step k", and the final losses), ``provenance.json`` and ``checkpoint.pt``
(see ``checkpoint``: a killed run restarted with the same config resumes bit-identically).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from manifold_muon import build_optimizers, retract_parameters

from . import distributed
from .checkpoint import Checkpointer
from .config import DEFAULT_PRESET_DIR, TrainConfig, load_preset, parse_overrides, validate
from .data import Batches
from .metrics import Recorder, is_diverged, jsonable
from .models import build_model
from .provenance import provenance, write_json_atomic

__all__ = ["train", "sweep", "lr_ratio", "WarmupCosine", "model_fields", "main"]


def lr_ratio(step: int, warmup: int, max_steps: int, min_lr_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay from 1 to ``min_lr_ratio`` at ``max_steps``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class WarmupCosine:
    """``lr_ratio`` as a picklable callable for ``LambdaLR`` (which multiplies each group's base lr)."""

    def __init__(self, warmup: int, max_steps: int, min_lr_ratio: float):
        self.warmup, self.max_steps, self.min_lr_ratio = warmup, max_steps, min_lr_ratio

    def __call__(self, step: int) -> float:
        return lr_ratio(step, self.warmup, self.max_steps, self.min_lr_ratio)


def model_fields(cfg: TrainConfig, vocab_size: int) -> dict:
    """The model config's fields for ``build_model(cfg.family, ...)``: the sizes, the family's own, ``model_extra``."""
    own = dict(bias=cfg.bias, dropout=cfg.dropout) if cfg.family == "gpt2" else dict(
        n_kv_head=cfg.n_kv_head or cfg.n_head, rmsnorm_free=cfg.rmsnorm_free)
    return dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=cfg.block_size,
                vocab_size=vocab_size, **own, **cfg.model_extra)


def _device(cfg: TrainConfig, local_rank: int) -> str:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda but torch sees no GPU; use device=cpu or auto")
    if cfg.device == "cpu" or not torch.cuda.is_available():
        return "cpu"
    torch.cuda.set_device(local_rank)
    return f"cuda:{local_rank}"


def _write_status(directory: Path, status: str, **extra) -> None:
    write_json_atomic(Path(directory) / "status.json", {"status": status, **jsonable(extra)})


def train(cfg: TrainConfig | dict, resume: bool = True, progress: bool = True) -> dict:
    """Run ``cfg`` to ``max_steps`` or divergence; returns a summary (also in ``out_dir/status.json``)."""
    t_start = time.perf_counter()
    cfg = TrainConfig.from_dict(cfg) if isinstance(cfg, dict) else cfg
    rank, local_rank, world = distributed.setup()
    validate(cfg, world_size=world)
    if cfg.out_dir is None:
        raise ValueError("out_dir is not set; give out_dir (or --out-dir) for the metrics and checkpoints")
    out_dir, main_rank = Path(cfg.out_dir), rank == 0
    device = _device(cfg, local_rank)
    cuda = device.startswith("cuda")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if cuda and cfg.dtype == "bfloat16" else contextlib.nullcontext()
    data = Batches(cfg.data, cfg.block_size, device, cfg.data_dir, cfg.vocab_size)
    validate(cfg, data_len=data.min_split_len, world_size=world)  # block_size vs the data

    torch.manual_seed(cfg.seed)
    model = build_model(cfg.family, **model_fields(cfg, data.vocab_size)).to(device)
    forward = torch.compile(model) if cfg.compile else model  # same parameters; names and state from `model`
    optimizers = build_optimizers(model, cfg.assignment, lr=cfg.lr, adamw_lr=cfg.adamw_lr, **cfg.optimizer)
    retract_parameters(optimizers)  # constrained weights start on their manifolds
    schedule = WarmupCosine(cfg.warmup, cfg.max_steps, cfg.min_lr_ratio)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(opt, schedule) for opt in optimizers]
    stepper = distributed.ShardedStep(optimizers, rank, world)
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(cfg.seed + 1)  # the training batches
    accum = cfg.gradient_accumulation_steps
    micro, eval_bs = cfg.batch_size // (world * accum), cfg.batch_size // accum

    # resume where a checkpoint of this config left off, or start fresh
    ckpt = Checkpointer(out_dir, cfg, rank, world)
    start, done, metrics_bytes = 0, False, 0
    if resume and ckpt.exists():
        saved = ckpt.read()
        ckpt.restore(saved, model, optimizers, schedulers, gen, cuda)
        start, done, metrics_bytes = saved["step"], saved.get("done", False), saved["metrics_bytes"]
    rec = Recorder(out_dir, cfg, model, optimizers, data, main=main_rank)
    if main_rank:
        out_dir.mkdir(parents=True, exist_ok=True)
        if start == 0 and not done:  # nothing of an earlier run may be resumed or read
            ckpt.clear()
            for stale in ("status.json", "provenance.json"):
                (out_dir / stale).unlink(missing_ok=True)
        rec.open(metrics_bytes)
    if world > 1:
        dist.barrier()

    def save(step: int, finished: bool) -> None:
        ckpt.save(step, finished, model, optimizers, schedulers, gen, rec.tell(), cuda)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    status, last_loss, last_eval = "completed", float("nan"), {}
    progress_every = max(1, cfg.max_steps // 20)
    step = start
    for step in range(start, start if done else cfg.max_steps):
        at_eval = step % cfg.eval_every == 0 and main_rank
        if at_eval:
            last_eval = rec.evaluate(step, forward, ctx, eval_bs, spectra=cfg.spectrum_every > 0
                                     and step % cfg.spectrum_every == 0,
                                     probe=cfg.probe_every > 0 and step % cfg.probe_every == 0)

        # forward-backward over the micro-batches of this rank's share of the global batch
        sync()
        t0 = time.perf_counter()
        X, Y = data.batch("train", cfg.batch_size, gen)
        X, Y = X[rank * micro * accum:], Y[rank * micro * accum:]
        loss_sum = torch.zeros((), device=device)
        for k in range(accum):
            with ctx:
                _, loss = forward(X[k * micro:(k + 1) * micro], Y[k * micro:(k + 1) * micro])
            (loss / accum).backward()
            loss_sum += loss.detach().float() / accum
        distributed.all_reduce_mean_([p.grad for p in params if p.grad is not None] + [loss_sum], world)
        sync()
        t1 = time.perf_counter()
        last_loss = loss_sum.item()
        if is_diverged(last_loss, cfg.divergence_loss_threshold):
            rec.emit({"kind": "step", "step": step, "loss": last_loss})
            status = f"diverged at step {step}"
            break

        # the optimizer step (W_t kept at an evaluation step, to measure the update)
        before = rec.snapshot() if at_eval else None
        gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        lrs = {type(opt).__name__: opt.param_groups[0]["lr"] for opt in optimizers}  # what this step uses
        try:
            stepper.step()
        except FloatingPointError as e:  # a non-finite gradient the optimizer refused
            rec.emit({"kind": "step", "step": step, "loss": last_loss, "error": str(e)})
            status = f"diverged at step {step}"
            break
        sync()
        t2 = time.perf_counter()
        if before is not None:
            rec.update(step, before)
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        for sch in schedulers:
            sch.step()
        rec.emit({"kind": "step", "step": step, "loss": last_loss, "lr": lrs, "lr_ratio": schedule(step),
                  "grad_norm": gnorm.item(), "time_fb_s": t1 - t0, "time_opt_s": t2 - t1,
                  "tokens_per_s": cfg.batch_size * cfg.block_size / (t2 - t0)})
        if progress and main_rank and ((step + 1) % progress_every == 0 or step + 1 == cfg.max_steps):
            val = f" val {last_eval['val_loss']:.4f}" if last_eval else ""
            print(f"[train] step {step + 1}/{cfg.max_steps} loss {last_loss:.4f}{val}", file=sys.stderr, flush=True)
        if cfg.checkpoint_every > 0 and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.max_steps:
            save(step + 1, finished=False)
    else:
        step = cfg.max_steps
        if not done:
            if main_rank:
                last_eval = rec.evaluate(step, forward, ctx, eval_bs, spectra=cfg.spectrum_every > 0,
                                         probe=cfg.probe_every > 0)
            if cfg.checkpoint_every >= 0:
                save(step, finished=True)

    summary = {"status": status, "step": step, "last_loss": last_loss,
               **({f"final_{k}": v for k, v in last_eval.items()} if status == "completed" else {}),
               "wall_time_s": time.perf_counter() - t_start, "out_dir": str(out_dir)}
    if main_rank:
        rec.close()
        old = json.loads((out_dir / "status.json").read_text()) if done and (out_dir / "status.json").exists() else None
        if old is not None:  # a finished run, resumed: it keeps what it recorded, wall time included
            summary = {**summary, **{k: v for k, v in old.items() if k != "out_dir"}}
        else:
            _write_status(out_dir, status, **{k: v for k, v in summary.items() if k != "status"})
            write_json_atomic(out_dir / "provenance.json", provenance(
                parameters={**cfg.to_dict(), "world_size": world}, wall_time_s=summary["wall_time_s"]))
    return summary


def sweep(cfgs, resume: bool = True, progress: bool = True) -> list[dict]:
    """Train each config in turn; a diverged (or crashed) run is recorded and the next one starts.

    Every config is validated before the first run starts, so a typo in the fifth does not cost the first four.
    """
    cfgs = [TrainConfig.from_dict(c) if isinstance(c, dict) else c for c in cfgs]
    for c in cfgs:
        validate(c)
    results = []
    for c in cfgs:
        try:
            results.append(train(c, resume=resume, progress=progress))
        except (RuntimeError, FloatingPointError) as e:
            results.append({"status": f"failed: {type(e).__name__}: {e}", "out_dir": c.out_dir})
            if c.out_dir:
                _write_status(Path(c.out_dir), results[-1]["status"])
    return results


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m manifold_muon_lab.train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu", help="a preset name (a .yml file in --preset-dir) or a .yml path")
    ap.add_argument("--preset-dir", default=str(DEFAULT_PRESET_DIR), help="where preset names are looked up")
    ap.add_argument("--assignment", default=None, help="manifold assignment (overrides the preset's)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key (value read as YAML); repeatable")
    ap.add_argument("--out-dir", default=None, help="default: runs/_train/<preset>/<assignment>")
    ap.add_argument("--no-resume", action="store_true", help="start over even if a checkpoint exists")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    try:  # a bad preset or override is a usage error: say what is wrong, no traceback
        overrides = parse_overrides(args.overrides)
        if args.assignment is not None:
            overrides["assignment"] = args.assignment
        cfg = load_preset(args.preset, args.preset_dir, **overrides)
        if args.out_dir is not None:
            cfg.out_dir = args.out_dir
        if cfg.out_dir is None:
            tag = cfg.assignment if isinstance(cfg.assignment, str) else "custom"
            cfg.out_dir = str(Path("runs") / "_train" / Path(args.preset).stem / tag)
        validate(cfg, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    except (ValueError, TypeError, FileNotFoundError) as e:
        ap.error(str(e))
    summary = train(cfg, resume=not args.no_resume, progress=not args.no_progress)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(jsonable(summary)))
    if dist.is_initialized():
        dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    main()
