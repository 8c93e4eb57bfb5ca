"""The training loop: one run of one config, recording why it behaves as it does.

    from manifold_muon.config import load_preset
    from manifold_muon.train import train
    summary = train(load_preset("cpu", assignment="hetero", out_dir="runs/_train/cpu/hetero"))

    python -m manifold_muon.train --preset cpu --assignment hetero [--set key=value ...]
    torchrun --nproc_per_node 2 -m manifold_muon.train --preset cpu-tiny     # data parallel

What a run leaves in ``out_dir``:

* ``metrics.jsonl``   one JSON object per line, each with a ``kind``:
  ``step``   every step: loss, lr, grad norm, seconds in forward-backward and in the optimizer;
  ``eval``   every ``eval_every`` steps, on the weights before that step: train/val loss, sigma_max
             of every matrix, constraint residuals, norm gains, attention statistics
             (``probe_every``) and full singular spectra (``spectrum_every``);
  ``update`` the step taken at an eval step: gradient norm per module, rotation angle and relative
             size of the update per matrix, tangent violation of the applied update.
* ``status.json``     "completed" or "diverged at step k"; ``provenance.json``; ``checkpoint.pt``.

A checkpoint holds model, optimizers, schedulers, RNG states and the step, and is written by
tmp + os.replace; a killed run restarted with the same config resumes from it and ends on the same
weights as a run never killed (bit-identical on CPU). Under ``torchrun`` gradients are averaged
over ranks, and each matrix parameter is stepped by one rank only (``ShardedStep``), which then
broadcasts it: the msign work is spread over ranks as in Jordan's distributed Muon.
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

from . import metrics as M
from .config import TrainConfig, load_preset, parse_overrides, validate
from .provenance import provenance, write_json_atomic

__all__ = ["train", "sweep", "lr_ratio", "WarmupCosine", "ShardedStep", "build_model", "main"]

CHECKPOINT = "checkpoint.pt"
# Keys that may change between a run and its resumption without changing what it computes.
RESUME_SAFE_KEYS = {"out_dir", "checkpoint_every", "device"}


# ----------------------------------------------------------------------------- schedule

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


# ----------------------------------------------------------------------------- data

class _Data:
    """The batches of one data set: ``batch(split, n, generator) -> (X, Y)`` on ``device``."""

    def __init__(self, cfg: TrainConfig, device):
        self.cfg, self.device = cfg, device
        if cfg.data == "synthetic":  # uniform random tokens: for timing, nothing to learn
            self.vocab_size, self.min_split_len = cfg.vocab_size, 10**12
            return
        from . import data

        prepare = getattr(data, "DATASETS", {}).get(cfg.data)
        if prepare is None:
            raise ValueError(f"data={cfg.data!r} is not a data set of manifold_muon.data; choose one of: "
                             f"{', '.join([*getattr(data, 'DATASETS', {}), 'synthetic'])}")
        self.meta = prepare(**({} if cfg.data_dir is None else {"data_dir": cfg.data_dir}))
        self._get_batch, self._dir = data.get_batch, self.meta["data_dir"]
        self.vocab_size = cfg.vocab_size or self.meta["vocab_size"]
        self.min_split_len = min(self.meta["train_tokens"], self.meta["val_tokens"])
        if self.vocab_size < self.meta["vocab_size"]:
            raise ValueError(f"vocab_size={self.vocab_size} is smaller than the data's {self.meta['vocab_size']}")

    def batch(self, split: str, n: int, generator: torch.Generator):
        T = self.cfg.block_size
        if self.cfg.data == "synthetic":
            X = torch.randint(self.vocab_size, (n, T + 1), generator=generator)
            return X[:, :-1].contiguous().to(self.device), X[:, 1:].contiguous().to(self.device)
        return self._get_batch(split, n, T, generator, self.device, data_dir=self._dir)


# ----------------------------------------------------------------------------- model

def build_model(cfg: TrainConfig, vocab_size: int) -> torch.nn.Module:
    """The model of ``cfg.family`` with the config's sizes, plus ``model_extra`` for any other field."""
    import dataclasses

    if cfg.family == "gpt2":
        from .models.gpt2 import GPT as Model, GPTConfig as Config

        own = dict(bias=cfg.bias, dropout=cfg.dropout)
    else:
        from .models.qwen3 import Qwen3 as Model, Qwen3Config as Config

        own = dict(n_kv_head=cfg.n_kv_head or cfg.n_head, rmsnorm_free=cfg.rmsnorm_free)
    fields = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(cfg.model_extra) - fields)
    if unknown:
        raise ValueError(f"model_extra keys {unknown} are not fields of {Config.__name__}: {', '.join(sorted(fields))}")
    return Model(Config(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=cfg.block_size,
                        vocab_size=vocab_size, **own, **cfg.model_extra))


# ----------------------------------------------------------------------------- distributed

def _dist_setup() -> tuple[int, int, int]:
    """(rank, local_rank, world_size); starts the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    if dist.is_initialized():
        return dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0")), dist.get_world_size()
    return 0, 0, 1


def _all_reduce_mean_(tensors, world: int) -> None:
    if world == 1:
        return
    handles = [dist.all_reduce(t, async_op=True) for t in tensors]
    for h, t in zip(handles, tensors):
        h.wait()
        t.div_(world)


class ShardedStep:
    """Step a list of optimizers with the matrix work spread over ranks.

    Every matrix parameter of a non-Adam optimizer is owned by one rank (largest first, each to the
    least loaded rank); a rank steps only the parameters it owns (the others' gradients are set to
    None, which every optimizer here skips) and then each owner broadcasts its updated weights.
    Adam-family optimizers (embeddings, gains) are cheap and step everywhere on the same averaged
    gradient. With one process it is a plain loop over ``optimizer.step()``.
    """

    def __init__(self, optimizers, rank: int = 0, world: int = 1):
        self.optimizers, self.rank, self.world = list(optimizers), rank, world
        sharded = [p for opt in self.optimizers if not isinstance(opt, (torch.optim.Adam, torch.optim.AdamW))
                   for g in opt.param_groups for p in g["params"] if p.ndim >= 2]
        load = [0] * world
        self.owner = {}
        for p in sorted(sharded, key=lambda p: -p.numel()):  # stable sort: ties keep model order
            r = min(range(world), key=lambda i: load[i])
            self.owner[p] = r
            load[r] += p.numel()

    def step(self) -> None:
        if self.world == 1:
            for opt in self.optimizers:
                opt.step()
            return
        for p, r in self.owner.items():
            if r != self.rank:
                p.grad = None
        error = None
        try:
            for opt in self.optimizers:
                opt.step()
        except FloatingPointError as e:  # every rank must learn of it, or the others wait forever
            error = e
        device = self.optimizers[0].param_groups[0]["params"][0].device
        failed = torch.tensor([float(error is not None)], device=device)
        dist.all_reduce(failed)
        if failed.item() > 0:
            raise error or FloatingPointError("another rank's optimizer refused a non-finite gradient")
        for p, r in self.owner.items():
            dist.broadcast(p.data, src=r)


# ----------------------------------------------------------------------------- checkpoints

def _save(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path, cfg: TrainConfig, world: int) -> dict:
    try:
        # our own file; it holds optimizer param groups and RNG states, so not weights-only
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        raise RuntimeError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e}); delete it to start "
                           "over, or pass resume=False (--no-resume)") from None
    if not isinstance(ckpt, dict) or "config" not in ckpt or "step" not in ckpt:
        raise RuntimeError(f"{path} is not a checkpoint of manifold_muon.train; delete it or pass resume=False")
    old, new = ckpt["config"], cfg.to_dict()
    diff = sorted(k for k in set(old) | set(new) if k not in RESUME_SAFE_KEYS and old.get(k) != new.get(k))
    if diff:
        changes = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff)
        raise RuntimeError(f"checkpoint {path} was written by another config ({changes}); use another out_dir, "
                           "restore those values, or pass resume=False to start over")
    if ckpt.get("world_size", 1) != world:
        raise RuntimeError(f"checkpoint {path} was written by {ckpt.get('world_size', 1)} processes, this run has "
                           f"{world}; resume with the same number of processes")
    return ckpt


# ----------------------------------------------------------------------------- measurements

@torch.no_grad()
def _evaluate(model, data, cfg, eval_bs, ctx, device) -> dict:
    """Mean loss over ``eval_batches`` batches of each split; the same batches at every evaluation."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        g = torch.Generator().manual_seed(cfg.seed + (7919 if split == "val" else 104729))
        losses = []
        for _ in range(cfg.eval_batches):
            X, Y = data.batch(split, eval_bs, g)
            with ctx:
                _, loss = model(X, Y)
            losses.append(loss.item())
        out[f"{split}_loss"] = sum(losses) / len(losses)
    model.train()
    return out


class _OnManifold:
    """A parameter's manifold, seen through the optimizer's ``split`` (k row blocks, each on its own)."""

    def __init__(self, manifold, split: int = 1):
        self.manifold, self.split = manifold, split

    def _blocks(self, W):
        return W.reshape(self.split, W.shape[0] // self.split, W.shape[1]) if self.split > 1 else W

    def residual(self, W):
        return self.manifold.residual(self._blocks(W))

    def tangent_residual(self, W, A):
        return self.manifold.tangent_residual(self._blocks(W), self._blocks(A))


def _manifolds_by_param(optimizers) -> dict:
    from .manifolds import get_manifold

    out = {}
    for opt in optimizers:
        for g in opt.param_groups:
            if g.get("manifold") not in (None, "none"):
                m = _OnManifold(get_manifold(g["manifold"], **(g.get("manifold_kwargs") or {})), g.get("split", 1))
                for p in g["params"]:
                    out[p] = m
    return out


@torch.no_grad()
def _weight_record(model, names, manifolds, data, cfg, spectra: bool, probe: bool) -> dict:
    rec = {"sigma_max": {}, "constraint_residual": {}, "norm_gains": M.norm_gains(model)}
    if spectra:
        rec["spectrum"] = {}
    for p, name in names.items():
        if p.ndim != 2:
            continue
        rec["sigma_max"][name] = M.sigma_max(p)
        if spectra:
            rec["spectrum"][name] = M.singular_values(p)
        if p in manifolds:
            rec["constraint_residual"][name] = M.constraint_residual(manifolds[p], p)
    if probe:
        from .models.gpt2 import attention_probe  # works for every model of the package

        X, _ = data.batch("val", 1, torch.Generator().manual_seed(cfg.seed + 31337))
        stats = attention_probe(model, X, layers=list(range(cfg.n_layer)), max_rows=cfg.probe_rows)
        rec["attention"] = M.attention_summary(stats)
    return rec


@torch.no_grad()
def _update_record(names, manifolds, before: dict, grad_norm: dict, optimizers) -> dict:
    """The step W_t -> W_{t+1} of every matrix. ``tangent_violation``: the optimizer's own measure of its
    direction A when it keeps one in its state (key ``tangent_violation``), else the manifold's
    tangent residual of the applied update dW = W_{t+1} - W_t at W_t (which includes the retraction's
    correction, O(|dW|^2) on a manifold); ``tangent_violation_source`` says which."""
    state = {p: st for opt in optimizers for p, st in opt.state.items()}
    rec = {"grad_norm": grad_norm, "rotation_angle": {}, "relative_update": {}, "tangent_violation": {},
           "tangent_violation_source": {}}
    for p, W_old in before.items():
        name = names[p]
        rec["rotation_angle"][name] = M.rotation_angle(p, W_old)
        rec["relative_update"][name] = M.relative_update(p, W_old)
        if p in manifolds:
            own = state.get(p, {}).get("tangent_violation")
            if own is not None:
                rec["tangent_violation"][name] = float(torch.as_tensor(own).max())
                rec["tangent_violation_source"][name] = "optimizer"
            else:
                rec["tangent_violation"][name] = M.tangent_violation(manifolds[p], W_old, p.detach() - W_old)
                rec["tangent_violation_source"][name] = "applied_update"
    return rec


# ----------------------------------------------------------------------------- the loop

def _write_status(directory: Path, status: str, **extra) -> None:
    write_json_atomic(Path(directory) / "status.json", {"status": status, **M.jsonable(extra)})


def train(cfg: TrainConfig | dict, resume: bool = True, progress: bool = True) -> dict:
    """Run ``cfg`` to ``max_steps`` or divergence; returns a summary (also in ``out_dir/status.json``)."""
    from .assignments import build_optimizers, retract_parameters

    t_start = time.perf_counter()
    cfg = TrainConfig.from_dict(cfg) if isinstance(cfg, dict) else cfg
    rank, local_rank, world = _dist_setup()
    validate(cfg, world_size=world)
    if cfg.out_dir is None:
        raise ValueError("out_dir is not set; give out_dir (or --out-dir) for the metrics and checkpoints")
    out_dir = Path(cfg.out_dir)
    main_rank = rank == 0

    if cfg.device == "auto":
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    elif cfg.device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device=cuda but torch sees no GPU; use device=cpu or auto")
        device = f"cuda:{local_rank}"
    else:
        device = "cpu"
    is_cuda = device.startswith("cuda")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if is_cuda:
        torch.cuda.set_device(device)
    ctx = (torch.autocast("cuda", dtype=torch.bfloat16) if is_cuda and cfg.dtype == "bfloat16"
           else contextlib.nullcontext())

    data = _Data(cfg, device)
    validate(cfg, data_len=data.min_split_len, world_size=world)  # block_size vs the data
    if not data.vocab_size:
        raise ValueError(f"the data module gave no vocab_size for {cfg.data!r}; set vocab_size in the config")
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, data.vocab_size).to(device)
    forward = torch.compile(model) if cfg.compile else model  # same parameters; names and state from `model`
    optimizers = build_optimizers(model, cfg.assignment, lr=cfg.lr, adamw_lr=cfg.adamw_lr, **cfg.optimizer)
    retract_parameters(optimizers)  # constrained weights start on their manifolds
    schedule = WarmupCosine(cfg.warmup, cfg.max_steps, cfg.min_lr_ratio)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(opt, schedule) for opt in optimizers]
    stepper = ShardedStep(optimizers, rank, world)
    names = {p: n for n, p in model.named_parameters()}
    manifolds = _manifolds_by_param(optimizers)
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(cfg.seed + 1)  # the training batches
    micro = cfg.batch_size // (world * cfg.gradient_accumulation_steps)
    eval_bs = cfg.batch_size // cfg.gradient_accumulation_steps

    # -- resume or start fresh
    ckpt_path = out_dir / CHECKPOINT
    shard_path = lambda step, r: out_dir / f"optim_rank{r}_step{step}.pt"  # noqa: E731
    start, done, metrics_bytes = 0, False, 0
    if resume and ckpt_path.exists():
        ckpt = _load_checkpoint(ckpt_path, cfg, world)
        model.load_state_dict(ckpt["model"])
        opt_states = ckpt["optimizers"] if world == 1 else torch.load(shard_path(ckpt["step"], rank),
                                                                      map_location="cpu", weights_only=False)
        for opt, s in zip(optimizers, opt_states):
            opt.load_state_dict(s)
        for sch, s in zip(schedulers, ckpt["schedulers"]):
            sch.load_state_dict(s)
        torch.set_rng_state(ckpt["rng_torch"])
        if is_cuda and ckpt.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng_cuda"])
        gen.set_state(ckpt["rng_data"])
        start, done, metrics_bytes = ckpt["step"], ckpt.get("done", False), ckpt["metrics_bytes"]
    if main_rank:
        out_dir.mkdir(parents=True, exist_ok=True)
        mpath = out_dir / "metrics.jsonl"
        if start == 0 and not done:  # a fresh start: nothing of an earlier run may be resumed or read
            for stale in (CHECKPOINT, "status.json", "provenance.json", *[f.name for f in out_dir.glob("optim_rank*")]):
                (out_dir / stale).unlink(missing_ok=True)
            mpath.write_text("")
        elif not mpath.exists() or mpath.stat().st_size < metrics_bytes:
            raise RuntimeError(f"{mpath} is shorter than checkpoint {ckpt_path} says it was; it was edited or "
                               "truncated since. Pass resume=False to start over")
        os.truncate(mpath, metrics_bytes)  # drop what a killed run wrote after its checkpoint
        log = open(mpath, "a")
    if world > 1:
        dist.barrier()

    def emit(record: dict) -> None:
        if main_rank:
            log.write(json.dumps(M.jsonable(record), allow_nan=False) + "\n")
            log.flush()

    def checkpoint(step: int, finished: bool) -> None:
        opt_states = [opt.state_dict() for opt in optimizers]
        if world > 1:
            _save(shard_path(step, rank), opt_states)
            dist.barrier()
        if main_rank:
            _save(ckpt_path, {
                "config": cfg.to_dict(), "step": step, "done": finished, "world_size": world,
                "model": model.state_dict(), "optimizers": opt_states if world == 1 else None,
                "schedulers": [s.state_dict() for s in schedulers],
                "rng_torch": torch.get_rng_state(), "rng_cuda": torch.cuda.get_rng_state() if is_cuda else None,
                "rng_data": gen.get_state(), "metrics_bytes": log.tell(),
            })
            for old in out_dir.glob("optim_rank*_step*.pt"):
                if not old.name.endswith(f"_step{step}.pt"):
                    old.unlink(missing_ok=True)
        if world > 1:
            dist.barrier()

    def sync() -> None:
        if is_cuda:
            torch.cuda.synchronize()

    from tqdm.auto import tqdm

    bar = tqdm(total=cfg.max_steps, initial=start, disable=not (progress and main_rank and sys.stderr.isatty()),
               desc=f"{cfg.assignment if isinstance(cfg.assignment, str) else 'custom'}", dynamic_ncols=True)
    status, last_loss, last_eval = "completed", float("nan"), {}
    tokens_per_step = cfg.batch_size * cfg.block_size
    step = start
    for step in range(start, cfg.max_steps if not done else start):
        at_eval = step % cfg.eval_every == 0
        if at_eval and main_rank:
            last_eval = _evaluate(forward, data, cfg, eval_bs, ctx, device)
            want_spec = cfg.spectrum_every > 0 and step % cfg.spectrum_every == 0
            want_probe = cfg.probe_every > 0 and step % cfg.probe_every == 0
            emit({"kind": "eval", "step": step, **last_eval,
                  **_weight_record(model, names, manifolds, data, cfg, want_spec, want_probe)})

        # W_t of every matrix, to measure the step taken at an evaluation step
        before = {p: p.detach().clone() for p in params if p.ndim == 2} if at_eval and main_rank else None

        # forward-backward over the micro-batches of this rank's share of the global batch
        sync()
        t0 = time.perf_counter()
        X, Y = data.batch("train", cfg.batch_size, gen)
        X, Y = X[rank * micro * cfg.gradient_accumulation_steps:], Y[rank * micro * cfg.gradient_accumulation_steps:]
        loss_sum = torch.zeros((), device=device)
        for k in range(cfg.gradient_accumulation_steps):
            with ctx:
                _, loss = forward(X[k * micro:(k + 1) * micro], Y[k * micro:(k + 1) * micro])
            loss = loss / cfg.gradient_accumulation_steps
            loss.backward()
            loss_sum += loss.detach().float()
        _all_reduce_mean_([p.grad for p in params if p.grad is not None] + [loss_sum], world)
        sync()
        t1 = time.perf_counter()
        last_loss = loss_sum.item()
        if M.is_diverged(last_loss, cfg.divergence_loss_threshold):
            emit({"kind": "step", "step": step, "loss": last_loss})
            status = f"diverged at step {step}"
            break

        # the optimizer step
        grad_norms = M.grad_norms_by_module(model) if before is not None else None  # before sharding drops grads
        gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        try:
            stepper.step()
        except FloatingPointError as e:  # a non-finite gradient the optimizer refused
            emit({"kind": "step", "step": step, "loss": last_loss, "error": str(e)})
            status = f"diverged at step {step}"
            break
        sync()
        t2 = time.perf_counter()
        if before is not None:
            emit({"kind": "update", "step": step, **_update_record(names, manifolds, before, grad_norms, optimizers)})
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        lrs = {type(opt).__name__: opt.param_groups[0]["lr"] for opt in optimizers}  # what this step used
        for sch in schedulers:
            sch.step()
        emit({"kind": "step", "step": step, "loss": last_loss, "lr": lrs, "lr_ratio": schedule(step),
              "grad_norm": gnorm.item(), "time_fb_s": t1 - t0, "time_opt_s": t2 - t1,
              "tokens_per_s": tokens_per_step / (t2 - t0)})
        bar.update(1)
        bar.set_postfix(loss=f"{last_loss:.4f}", **({"val": f"{last_eval['val_loss']:.4f}"} if last_eval else {}))
        if cfg.checkpoint_every > 0 and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.max_steps:
            checkpoint(step + 1, finished=False)
    else:
        step = cfg.max_steps
        if not done:
            if main_rank:
                last_eval = _evaluate(forward, data, cfg, eval_bs, ctx, device)
                emit({"kind": "eval", "step": step, **last_eval,
                      **_weight_record(model, names, manifolds, data, cfg,
                                       cfg.spectrum_every > 0, cfg.probe_every > 0)})
            if cfg.checkpoint_every >= 0:
                checkpoint(step, finished=True)
    bar.close()

    summary = {"status": status, "step": step, "last_loss": last_loss, **{f"final_{k}": v for k, v in last_eval.items()},
               "wall_time_s": time.perf_counter() - t_start, "out_dir": str(out_dir)}
    if main_rank:
        if done:  # resumed a finished run: keep what it recorded
            old = json.loads((out_dir / "status.json").read_text()) if (out_dir / "status.json").exists() else {}
            summary = {**summary, **{k: v for k, v in old.items() if k not in ("status", "wall_time_s", "out_dir")}}
        log.close()
        _write_status(out_dir, status, **{k: v for k, v in summary.items() if k != "status"})
        write_json_atomic(out_dir / "provenance.json",
                          provenance(parameters={**cfg.to_dict(), "world_size": world},
                                     wall_time_s=summary["wall_time_s"]))
    return summary


def sweep(cfgs, resume: bool = True, progress: bool = True) -> list[dict]:
    """Train each config in turn; a diverged (or crashed) run is recorded and the next one starts.

    Every config is validated before the first run starts, so a typo in the fifth does not cost the
    first four.
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


# ----------------------------------------------------------------------------- command line

def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m manifold_muon.train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu", help="a name in runs/presets/training/ or a .yml path")
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
        cfg = load_preset(args.preset, **overrides)
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
        print(json.dumps(M.jsonable(summary)))
    if dist.is_initialized():
        dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    main()
