"""How long the run notebooks take on a device, from a FLOP and bandwidth model of their presets: what
``python -m manifold_muon_book.pipeline estimate`` prints for a run that has recorded no times at a scale
(a GPU scale, before anyone ran it). A model, not a measurement: it is as good as its assumptions, which
are the named constants below, and it says which term dominates so that one knows which assumption matters.

**What a run does.** ``run_jobs(root, name, scale)`` lists the work of ``runs/<name>.md`` at ``scale`` from
its entry in ``runs/presets/<name>.yml``, in the template's own loop (``TRAINING_LOOPS``: studies x seeds x
assignments, noise levels x seeds, solvers x assignments x seeds, or the ``grid`` of ``paper_runs.expand_grid``
for the notebooks that call ``paper_runs.grid_notebook``), every training config built by ``load_preset``
exactly as the template builds it (per_assignment rows and overrides merged there, not here). The three
notebooks that are matrix studies get a model of their own: ``msign_accuracy`` (SVDs and msigns of its
shapes, on the CPU, as its notebook runs them), ``dual_ascent_shapes`` (its CPU recording, a short
training, and per shape the dual-ascent sweeps, the post's snapshots and the certified float64 reference,
at their iteration caps) and ``dual_ascent_scaling`` (per size the post's dual ascent over its step-size grid);
``MATRIX_STUDIES`` names them. A run this module does not know is reported as "no model" with the reason.

**One training** (``training_cost``) on device D, steps = ``max_steps``:

* ``model``: steps x F / (peak(D, dtype) x ``MFU_TRAIN``), F = 6 (N + N_head) T_step + 12 L T_block d_attn
  T_step (the nanoGPT / PaLM accounting: N the parameters outside the embeddings (``config._meta_model``
  on the meta device), N_head = V d the output head's product, which the tied embedding does not make free;
  12 L T d per token the attention scores and values, forward and backward; T_step = batch_size x
  block_size, batch_size being the sequences of one optimizer step summed over micro-batches and ranks, so
  gradient accumulation does not change it).
* ``optimizer``: the matrix products of each block matrix's optimizer step, from the optimizers built on the
  meta-device model (``manifold_muon_lab.train.build_optimizers``, as ``config.check_optimizer_options``
  does), per parameter group and shape (``matrix_step``). An msign of k steps on an m x n matrix (n the short
  side) costs k (4 m n^2 + 2 n^3) FLOPs, in its dtype: Muon (torch.optim.Muon's settings) one Newton-Schulz
  msign of 5 steps in bfloat16 (msign_tolerance's NoisyMuon: a float64 SVD instead); ManifoldMuon ``post`` (and ``dual_ascent``) inner_steps + 1 msigns in float32
  plus 4 m n^2 per dual step and the retraction's polar factor (Polar Express, 8 steps, then
  ``POLAR_POLISH_STEPS`` cubic steps); ``gram_admm`` float64 Gram blocks (8 m n^2), inner_steps ADMM
  iterations at the cap (most non-square solves in training reach it: bench/optimizer_step.py), each one
  n x n eigh and ~``GRAM_ITER_N3`` n^3 of n x n products, plus its certificates (one eigh and two eigvalsh
  each, one every 4 iterations and at the two starts, a polished one at the cap) and the retraction's eigh, and on
  rectangular weights with ``warm_start`` four m n^2 float32 products that carry ADMM's U as a matrix (the lean
  ADMM tracker in the Gram picture too);
  square Stiefel in closed form (one certificate); ``lean`` an eigh per iteration and the certificate's (one
  fewer with ``certify_first``; on Oblique in the matrix, ``oblique_step``: 6 m n^2 of float64 products for the
  certificate and 4 m n^2 an iteration; with ``tracker="newton"`` two, the default on DGram, its conjugate-gradient steps
  four n x n float32 products each; with ``tracker="newton_dk"`` one, and 3 n^3 of float64 products more; so does
  ``"newton_cold"`` off Stiefel; on Stiefel, its default on long weights, one, two n x n float32 products a
  conjugate-gradient step and 2 n^3 of float64 products, the step kept in N's eigenbasis),
  ~``LEAN_N3`` n^3 of n x n products and
  12 m n^2; the sphere optimizers (``manifold_muon.optim.spheres``): MACRO and MuonH one msign (Polar
  Express, 5 steps, float32), SSO and FSO ``inner_steps`` (10) bisection msigns at the cap, and on the
  spectral sphere an SVD for each top singular pair and svdvals for each spectral norm (MACRO-spec: 2 SVDs,
  2 svdvals; MuonH-spec: 1 and 2; SSO: 2 and 4; FSO: 0 and 2). Optimizer products run at
  peak(D, dtype) x ``OPT_MFU`` x min(1, n / ``OPT_FULL_N``) on a GPU (small matrices fill it less), at the
  rate measured for that size on a CPU.
* ``eigh``: the eigendecompositions and SVDs counted above (and those of the evaluations), at a per-device
  time: a table (``GPUS``: the float64 eigh and float32 SVD of a 768 x 768 matrix in ms, scaling as n^3
  and m n^2 above ``DECOMP_FLOOR_MS``) on a GPU, measured at two sizes on a CPU. Rough numbers: a GPU
  eigendecomposition is latency-bound (cuSOLVER), its time depends on the library version and batching.
* ``memory``: steps x P x ``BYTES_PER_PARAM_STEP`` / bandwidth(D): weights, gradients and optimizer state
  read and written by the step (P all parameters).
* ``eval``: the training loop's evaluations (every ``eval_every`` steps and at the end: 2 x eval_batches
  forward passes of batch_size / gradient_accumulation_steps sequences, F / 3 per token, and svdvals of
  every block matrix), then the notebook's ``common_val_loss`` (its batches of batch_size sequences; on the
  CPU for the grid notebooks, ``paper_runs.common_val_loss``, on the device for the others).

A run on a GPU is its trainings one after the other on one GPU (a GPU is shared, not multiplied, by more
processes); on the CPU, its independent jobs are scheduled on ``workers`` processes as the recorded
estimate does (``pipeline.makespan``). Work a notebook does on the CPU on any machine (dual_ascent_shapes,
msign_accuracy, the grids' common evaluation) is costed at this machine's measured CPU speed.

**The device** (``target_device``): ``MMB_DEVICE`` names one (``MMB_DEVICE=h100 python -m
manifold_muon_book.pipeline estimate --scale gpu``; names: ``GPUS`` and ``ALIASES``, and ``cpu``); else
CUDA's device 0 if torch sees one (``torch.cuda.get_device_name``), else the CPU. An unknown name is refused
(ValueError, one sentence with the known names). The CPU is measured on the spot (``measure_cpu``: float32
and float64 matrix products at n = 64 and 512, an eigh and an SVD at n = 64 and 256, a large copy; about a
second), once per process, on 1 thread for the single-threaded runs (``threads: 1``) and on torch's default
threads for the rest; bfloat16 on the CPU is costed at the float32 rate.

``python -m manifold_muon_book.cost_model --scale cpu --compare`` prints the model beside the times the
runs recorded (its check against this machine).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["GPUS", "ALIASES", "Device", "target_device", "device_named", "known_devices", "measure_cpu", "model_flops", "optimizer_step_cost",
           "training_cost", "run_jobs", "run_estimate", "NoModel", "MFU_TRAIN", "OPT_MFU"]

# ----------------------------------------------------------------------------- assumptions (named)

MFU_TRAIN = 0.35          # achieved / peak FLOPs of a transformer's forward and backward (nanoGPT at 124M: ~0.3-0.6)
MFU_TRAIN_CPU = 0.35      # the same, against the CPU's measured large float32 product rate
OPT_MFU = 0.5             # achieved / peak of the optimizer's large matrix products on a GPU
OPT_FULL_N = 1024         # below this short side, a GPU product's efficiency falls in proportion (n / OPT_FULL_N)
POLAR_POLISH_STEPS = 2    # cubic Newton-Schulz steps after the retraction's Polar Express (manifolds.gram.polar)
GRAM_ITER_N3 = 10         # n^3 (x 2 FLOPs) of n x n products per Gram-space ADMM iteration (admm_gram)
GRAM_CERT_N3 = 8          # the same per certificate (inner_solvers.certificate)
LEAN_N3 = 20              # the lean step's n x n products besides its eighs
EIGVALSH_OVER_EIGH = 0.5  # eigenvalues only, against the full eigendecomposition
SVDVALS_OVER_SVD = 0.5    # singular values only, against the SVD with vectors
DECOMP_FLOOR_MS = 0.3     # a GPU eigh / SVD of a small matrix: launch and synchronisation latency
DECOMP_REF_N = 768        # the size of the GPU table's decomposition times
BYTES_PER_PARAM_STEP = 48  # weights, gradients, optimizer state (and the step's stacked copies) read + written
CPU_MEASURE_SECONDS = 0.03  # each CPU measurement repeats for at least this long
LOGITS_NOTE_GIB = 32      # a common evaluation on the CPU whose logits exceed this many GiB is pointed out (on a
                          # GPU: those that exceed its memory)

# Peak dense TFLOPS (no sparsity; float32 without TF32: torch's default for float32 products), memory
# bandwidth GB/s, memory GiB, and the rough decomposition times at n = 768 (eigh float64, SVD float32 with
# vectors), from the vendors' data sheets; the decomposition times are rough (order of magnitude).
GPUS = {
    "h100-sxm":  dict(label="NVIDIA H100 SXM", bfloat16=989.0, float32=67.0, float64=67.0, bandwidth=3350, memory=80,
                      eigh_ms=4.0, svd_ms=12.0),
    "h100-pcie": dict(label="NVIDIA H100 PCIe", bfloat16=756.0, float32=51.0, float64=51.0, bandwidth=2000, memory=80,
                      eigh_ms=4.5, svd_ms=13.0),
    "h200":      dict(label="NVIDIA H200", bfloat16=989.0, float32=67.0, float64=67.0, bandwidth=4800, memory=141,
                      eigh_ms=4.0, svd_ms=12.0),
    "a100-80gb": dict(label="NVIDIA A100 80GB", bfloat16=312.0, float32=19.5, float64=19.5, bandwidth=2039, memory=80,
                      eigh_ms=5.0, svd_ms=15.0),
    "a100-40gb": dict(label="NVIDIA A100 40GB", bfloat16=312.0, float32=19.5, float64=19.5, bandwidth=1555, memory=40,
                      eigh_ms=5.0, svd_ms=15.0),
    "l40s":      dict(label="NVIDIA L40S", bfloat16=362.0, float32=91.6, float64=1.4, bandwidth=864, memory=48,
                      eigh_ms=8.0, svd_ms=24.0),
    "l4":        dict(label="NVIDIA L4", bfloat16=121.0, float32=30.3, float64=0.47, bandwidth=300, memory=24,
                      eigh_ms=12.0, svd_ms=36.0),
    "a10g":      dict(label="NVIDIA A10G", bfloat16=70.0, float32=31.2, float64=0.98, bandwidth=600, memory=24,
                      eigh_ms=10.0, svd_ms=30.0),
    "rtx4090":   dict(label="NVIDIA GeForce RTX 4090", bfloat16=165.0, float32=82.6, float64=1.3, bandwidth=1008,
                      memory=24, eigh_ms=7.0, svd_ms=21.0),
    "rtx3090":   dict(label="NVIDIA GeForce RTX 3090", bfloat16=71.0, float32=35.6, float64=0.56, bandwidth=936,
                      memory=24, eigh_ms=10.0, svd_ms=30.0),
    # no bfloat16 units: the presets' bfloat16 costed at the float16 tensor-core rate (runs slower in fact)
    "v100":      dict(label="NVIDIA V100 (float16 rate for bfloat16)", bfloat16=125.0, float32=15.7, float64=7.8,
                      bandwidth=900, memory=32, eigh_ms=7.0, svd_ms=21.0),
}
ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "4090": "rtx4090", "3090": "rtx3090"}
# torch.cuda.get_device_name -> table key: the first pattern (all its words in the lower-cased name) that matches
_DETECT = ((("h100", "pcie"), "h100-pcie"), (("h100",), "h100-sxm"), (("h200",), "h200"),
           (("a100", "40gb"), "a100-40gb"), (("a100",), "a100-80gb"), (("l40s",), "l40s"), (("l4",), "l4"),
           (("a10g",), "a10g"), (("4090",), "rtx4090"), (("3090",), "rtx3090"), (("v100",), "v100"))


class NoModel(Exception):
    """A run (or scale) this module cannot cost; the message says why."""


# ----------------------------------------------------------------------------- devices

@dataclass
class Device:
    """Rates of one device. ``tflops`` by dtype (peak on a GPU, measured on a CPU); ``small``: the CPU's
    measured product rates {dtype: {n: TFLOPS}} at the measured sizes; decomposition time models as
    (floor seconds, seconds per n^3 or per m n^2)."""

    key: str
    label: str
    kind: str                      # "gpu" | "cpu"
    tflops: dict
    bandwidth: float               # GB/s
    memory_gib: float | None
    eigh: tuple                    # (a, b): seconds = a + b n^3
    svd: tuple                     # (a, b): seconds = a + b m n^2 (m >= n)
    small: dict = field(default_factory=dict)
    threads: int | None = None

    def rate(self, dtype: str, n: int | None = None, train: bool = False) -> float:
        """FLOP/s of products in ``dtype`` with short side ``n`` (None: large); ``train``: a model's forward and
        backward (``MFU_TRAIN``)."""
        dtype = "float32" if dtype == "bfloat16" and self.kind == "cpu" else dtype
        peak = self.tflops[dtype] * 1e12
        if train:
            return peak * (MFU_TRAIN if self.kind == "gpu" else MFU_TRAIN_CPU)
        if self.kind == "gpu":
            return peak * OPT_MFU * min(1.0, (n or OPT_FULL_N) / OPT_FULL_N)
        pts = self.small.get(dtype) or self.small["float32"]
        (n0, r0), (n1, r1) = sorted(pts.items())
        n = n1 if n is None else min(max(n, n0), n1)
        t = math.log(n / n0) / math.log(n1 / n0)   # log-log interpolation between the measured sizes
        return 1e12 * math.exp((1 - t) * math.log(r0) + t * math.log(r1))

    def eigh_s(self, n: int) -> float:
        return self.eigh[0] + self.eigh[1] * n ** 3

    def svd_s(self, m: int, n: int) -> float:
        m, n = max(m, n), min(m, n)
        return self.svd[0] + self.svd[1] * m * n * n


def _gpu(key: str) -> Device:
    g = GPUS[key]
    floor = DECOMP_FLOOR_MS / 1e3
    return Device(key, g["label"], "gpu", {d: g[d] for d in ("bfloat16", "float32", "float64")}, g["bandwidth"],
                  g["memory"], (floor, (g["eigh_ms"] / 1e3 - floor) / DECOMP_REF_N ** 3),
                  (floor, (g["svd_ms"] / 1e3 - floor) / DECOMP_REF_N ** 3))


def known_devices() -> list[str]:
    return [*GPUS, *ALIASES, "cpu"]


def device_named(name: str) -> Device:
    """The device of a name of ``known_devices()`` (case and spaces ignored); ValueError otherwise."""
    key = str(name).strip().lower().replace(" ", "").replace("_", "-")
    key = ALIASES.get(key, key)
    if key == "cpu":
        return measure_cpu()
    if key in GPUS:
        return _gpu(key)
    raise ValueError(f"unknown device {name!r} (MMB_DEVICE); the cost model knows {', '.join(known_devices())}")


def target_device(name: str | None = None) -> Device:
    """``name``, else ``MMB_DEVICE``, else CUDA's device 0 (by its name), else this CPU."""
    name = name if name is not None else (os.environ.get("MMB_DEVICE") or None)
    if name is not None:
        return device_named(name)
    import torch

    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
        words = gpu.lower().replace("-", " ").split()
        for pattern, key in _DETECT:
            if all(any(p == w or p in w for w in words) for p in pattern):
                return _gpu(key)
        raise ValueError(f"the cost model has no figures for the GPU {gpu!r}; set MMB_DEVICE to the closest of "
                         f"{', '.join(known_devices())}")
    return measure_cpu()


def _timed(fn, min_s: float = CPU_MEASURE_SECONDS) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_s:
            return dt / n


@functools.lru_cache(maxsize=None)
def measure_cpu(threads: int | None = None) -> Device:
    """This CPU, measured now on ``threads`` torch threads (None: torch's default): float32 / float64 products
    at n = 64 and 512, a float64 eigh and a float32 SVD at n = 64 and 256 (on one thread: LAPACK on these
    sizes gains little from more), and a 64 MiB copy."""
    import torch

    old = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        g = torch.Generator().manual_seed(0)
        small = {}
        for dtype in (torch.float32, torch.float64):
            pts = {}
            for n in (64, 512):
                A, B = torch.randn(n, n, generator=g, dtype=dtype), torch.randn(n, n, generator=g, dtype=dtype)
                pts[n] = 2 * n ** 3 / _timed(lambda: A @ B) / 1e12
            small[str(dtype).removeprefix("torch.")] = pts
        x = torch.empty(16 * 2 ** 20)
        y = torch.empty_like(x)
        bandwidth = 2 * x.numel() * 4 / _timed(lambda: y.copy_(x)) / 1e9
        torch.set_num_threads(1)
        dec = {}
        for n in (64, 256):
            S = torch.randn(n, n, generator=g, dtype=torch.float64)
            S = S @ S.mT
            X = torch.randn(n, n, generator=g)
            dec[n] = (_timed(lambda: torch.linalg.eigh(S)), _timed(lambda: torch.linalg.svd(X, full_matrices=False)))
        eb = max(dec[256][0] - dec[64][0], 1e-9) / (256 ** 3 - 64 ** 3)
        sb = max(dec[256][1] - dec[64][1], 1e-9) / (256 ** 3 - 64 ** 3)
        eigh = (max(dec[64][0] - eb * 64 ** 3, 0.0), eb)
        svd = (max(dec[64][1] - sb * 64 ** 3, 0.0), sb)
    finally:
        torch.set_num_threads(old)
    nthreads = threads or old
    tflops = {"float32": small["float32"][512], "float64": small["float64"][512]}
    tflops["bfloat16"] = tflops["float32"]
    label = (f"this CPU, {nthreads} thread(s), measured: {tflops['float32'] * 1e3:.0f} GFLOP/s float32 at n=512, "
             f"{bandwidth:.0f} GB/s copy")
    from manifold_muon_lab.config import available_memory

    mem = available_memory("cpu")
    return Device("cpu", label, "cpu", tflops, bandwidth, mem / 2 ** 30 if mem else None, eigh, svd, small, nthreads)


# ----------------------------------------------------------------------------- what one step costs

@dataclass
class Cost:
    """Work of one step: products {(dtype, n): FLOPs}, decompositions {(kind, m, n): count} (kind: eigh,
    eigvalsh, svd, svdvals), msigns (a count, for reading), bytes moved."""

    products: dict = field(default_factory=dict)
    decomps: dict = field(default_factory=dict)
    msigns: float = 0.0

    def mm(self, flops: float, n: int, dtype: str) -> None:
        self.products[(dtype, n)] = self.products.get((dtype, n), 0.0) + flops

    def dec(self, kind: str, m: int, n: int, count: float = 1.0) -> None:
        key = (kind, max(m, n), min(m, n))
        self.decomps[key] = self.decomps.get(key, 0.0) + count

    def msign(self, m: int, n: int, steps: int, dtype: str, method: str = "newton_schulz", count: float = 1.0) -> None:
        """``count`` msigns of ``steps`` iterations on an m x n matrix (an SVD for method "svd")."""
        self.msigns += count
        m, n = max(m, n), min(m, n)
        if method == "svd":
            self.dec("svd", m, n, count)
            self.mm(count * 2 * m * n * n, n, dtype)
        else:
            self.mm(count * steps * (4 * m * n * n + 2 * n ** 3), n, dtype)

    def add(self, other: "Cost", times: float = 1.0) -> "Cost":
        for k, v in other.products.items():
            self.products[k] = self.products.get(k, 0.0) + times * v
        for k, v in other.decomps.items():
            self.decomps[k] = self.decomps.get(k, 0.0) + times * v
        self.msigns += times * other.msigns
        return self

    @property
    def flops(self) -> float:
        return sum(self.products.values())

    def product_seconds(self, dev: Device) -> float:
        return sum(f / dev.rate(dtype, n) for (dtype, n), f in self.products.items())

    def decomp_seconds(self, dev: Device) -> float:
        t = 0.0
        for (kind, m, n), c in self.decomps.items():
            if kind in ("eigh", "eigvalsh"):
                t += c * dev.eigh_s(n) * (EIGVALSH_OVER_EIGH if kind == "eigvalsh" else 1.0)
            else:
                t += c * dev.svd_s(m, n) * (SVDVALS_OVER_SVD if kind == "svdvals" else 1.0)
        return t


def _dt(dtype) -> str:
    return "float32" if dtype is None else str(dtype).removeprefix("torch.")


def _polar(c: Cost, M, m: int, n: int) -> None:
    """A Gram manifold's ``retract`` of an m x n matrix: polar factor by its msign, then the polish steps."""
    method, steps = getattr(M, "msign", "polar_express"), getattr(M, "ns_steps", 8)
    c.msign(m, n, steps, "float32", method)
    if method != "svd":
        c.mm(POLAR_POLISH_STEPS * 6 * max(m, n) * min(m, n) ** 2, min(m, n), "float32")


def matrix_step(opt, group: dict, shape) -> Cost:
    """The work of ``opt``'s step on one weight of ``shape`` in ``group`` (see the module docstring)."""
    from manifold_muon.manifolds.gram import GramOblique, Stiefel
    from manifold_muon.optim import FSO, MACRO, SSO, ManifoldMuon, Muon, MuonH

    c = Cost()
    k = group.get("split", 1) or 1
    m, n = shape[0] // k, shape[1]
    big, small = max(m, n), min(m, n)
    if isinstance(opt, Muon):
        if type(opt).__name__ == "NoisyMuon":  # manifold_muon_book.evidence: an SVD per step, float64
            c.msigns += 1
            c.dec("svd", big, small)
            c.mm(2 * big * small * small, small, "float64")
        else:
            c.msign(big, small, group["ns_steps"], _dt(group["msign_dtype"]), group["msign"])
        return c
    if isinstance(opt, ManifoldMuon):
        M, inner, steps = group["manifold"], group["inner"], int(group["inner_steps"])
        square_stiefel = isinstance(M, Stiefel) and m == n
        if inner in ("post", "dual_ascent", "admm"):
            dtype = _dt(group["msign_dtype"])
            per = 1 + (inner == "admm")  # ADMM's svt: a second (n x n) msign
            c.msign(big, small, group["ns_steps"], dtype, group["msign"], count=steps + 1)
            if inner == "admm":
                c.msign(small, small, group["ns_steps"], dtype, group["msign"], count=steps)
            c.mm((4 * steps * per + 4) * big * small * small, small, "float32")  # W Lambda, W^T A; init, violation
            _polar(c, M, big, small)
        elif inner == "lean":
            if square_stiefel:
                c.dec("eigh", n, n)
                c.mm(20 * n ** 3, n, "float64")
            else:
                from manifold_muon.optim.inner_solvers import COLD_TRACKER
                from manifold_muon.optim.manifold_muon import lean_steps, resolve_tracker

                tracker = resolve_tracker(M, group.get("tracker") or "auto", shape)
                steps = lean_steps(M, group.get("tracker") or "auto", shape, steps)
                if isinstance(M, GramOblique) and tracker == "admm":  # in the matrix (``oblique_step``), float64
                    shared = 1 if group.get("certify_first") and steps else 0
                    c.dec("eigh", small, small, steps + 1 - shared)
                    c.dec("eigvalsh", small, small)
                    # certificate: Z^T Z, Z Y, X^T X; an iteration: Zp^T Zp (but the shared one), Zp F
                    c.mm(2 * (3 + 2 * steps - shared) * big * small * small, small, "float64")
                    c.mm(2 * (1 + steps) * small ** 3, small, "float64")  # the factors Y and F
                    return c
                if tracker == "newton":  # Newton basis, certificate
                    c.dec("eigh", small, small, 2)
                    c.mm(2 * (4 * steps + 3) * small ** 3, small, "float32")  # four a CG step; gradient, setup
                elif tracker == COLD_TRACKER and isinstance(M, Stiefel):  # never out of N's eigenbasis
                    c.dec("eigh", small, small, 1)                          # (inner_solvers.cold_newton_eigenbasis)
                    # float32: A_hat, two a CG step, M's two, the candidate's three, the multiplier (float64: K0 V, V x)
                    c.mm(2 * (2 * steps + 7) * small ** 3, small, "float32")
                    c.mm(2 * 2 * small ** 3, small, "float64")
                elif tracker in ("newton_dk", COLD_TRACKER):  # Newton basis; the certificate from it (M = V^T N1 V, V inner V^T)
                    c.dec("eigh", small, small, 1)
                    c.mm(2 * (4 * steps + 3) * small ** 3, small, "float32")
                    c.mm(2 * 3 * small ** 3, small, "float64")
                else:
                    shared = 1 if group.get("certify_first") and steps else 0  # certify_first: one eigh serves both
                    c.dec("eigh", small, small, steps + 1 - shared)             # an eigh per iteration, the certificate's
                    if group.get("warm_start") and m != n:  # U carried as the matrix: W U_a + C U_b, W^T U, C^T U
                        c.mm(8 * big * small * small, small, "float32")
                c.dec("eigvalsh", small, small)
                c.mm(2 * LEAN_N3 * small ** 3, small, "float64")
                c.mm(10 * big * small * small, small, "float32")
                c.mm(2 * big * small * small, small, "float64")          # R = C^T C of the stored float32 C
        else:  # gram_admm (and exact: its ADMM stage at the cap, the Newton stage not counted)
            c.mm(8 * big * small * small, small, "float64")             # the Gram blocks D, W^T G, C, R
            c.mm(4 * big * small * small, small, "float32")             # the final W a + C b
            if group.get("warm_start") and m != n:  # U carried as the m x n matrix (W U_a + C U_b; W^T U, C^T U)
                c.mm(8 * big * small * small, small, "float32")
            if square_stiefel:                                          # closed form: one certificate
                c.dec("eigh", n, n, 2)
                c.dec("eigvalsh", n, n, 1)
                c.mm(2 * GRAM_CERT_N3 * n ** 3, n, "float64")
            else:
                certs = 2 + math.ceil(steps / 4)                         # both starts, one every 4 iterations
                c.dec("eigh", small, small, steps + certs + 5 + 1)      # + the polished one (5), the retraction
                c.dec("eigvalsh", small, small, 2 * certs + 2)
                c.mm(2 * (GRAM_ITER_N3 * steps + GRAM_CERT_N3 * (certs + 1)) * small ** 3, small, "float64")
        return c
    if isinstance(opt, (MACRO, MuonH, SSO, FSO)):
        M = group["manifold"]
        spectral = M.name == "spectral_sphere"
        power = getattr(M, "power_iters", None)
        dtype, steps, method = _dt(group["msign_dtype"]), group["ns_steps"], group["msign"]

        def pair(count):  # top singular pair(s): an SVD, or power iterations
            if power:
                c.mm(count * power * 4 * big * small, small, "float32")
            else:
                c.dec("svd", big, small, count)

        def sigma1(count):  # a spectral norm: svdvals, or power iterations
            if power:
                c.mm(count * power * 4 * big * small, small, "float32")
            else:
                c.dec("svdvals", big, small, count)

        if isinstance(opt, (SSO, FSO)):
            c.msign(big, small, steps, dtype, method, count=int(group["inner_steps"]))
            c.dec("svdvals", big, small, 2)                              # ||Theta||_*, ||M||_* (bracket)
            if isinstance(opt, SSO):
                pair(2)                                                  # Theta in the bisection and in direction()
        else:
            c.msign(big, small, steps, dtype, method)
            if spectral:
                pair(2 if isinstance(opt, MACRO) else 1)                 # (projection,) normal
        if spectral:
            sigma1(2)                                                    # ||O||_2 and the approx retraction
            if getattr(M, "retraction", "approx") == "exact":
                c.dec("svd", big, small)
        return c
    raise NoModel(f"no cost model for the optimizer {type(opt).__name__}")


def optimizer_step_cost(cfg, vocab_size: int, classes: dict | None = None) -> tuple[Cost, dict]:
    """(work of one optimizer step over every block matrix of ``cfg``'s model, {what: count}), from the
    optimizers built on the meta-device model as training builds them."""
    import torch

    from manifold_muon_lab.config import _meta_model
    from manifold_muon_lab.train import build_optimizers

    model = _meta_model(cfg, vocab_size)
    opts = build_optimizers(model, cfg.assignment, lr=cfg.lr, adamw_lr=cfg.adamw_lr, classes=classes, **cfg.optimizer)
    total, info = Cost(), {"matrices": 0}
    for opt in opts:
        if isinstance(opt, torch.optim.AdamW):
            continue
        for group in opt.param_groups:
            for p in group["params"]:
                total.add(matrix_step(opt, group, tuple(p.shape)))
                info["matrices"] += 1
    return total, info


def model_flops(cfg, vocab_size: int) -> dict:
    """Per optimizer step: {"N": non-embedding parameters, "N_head": V d, "P": all parameters, "tokens":
    batch_size x block_size, "per_token": training FLOPs per token, "flops": per step, "attention": its
    attention part, "d_attn", "matrices": [(m, n)] of the block matrices}."""
    from manifold_muon.assignments import MATRIX_ROLES, param_roles
    from manifold_muon_lab.config import _meta_model, model_fields

    key = json.dumps([cfg.family, model_fields(cfg, vocab_size), cfg.batch_size], sort_keys=True, default=str)
    if key in _FLOPS_CACHE:
        return _FLOPS_CACHE[key]
    model = _meta_model(cfg, vocab_size)
    roles = param_roles(model)
    params = dict(model.named_parameters())
    P = sum(p.numel() for p in params.values())
    emb = [params[k] for k, r in roles.items() if r in ("embedding", "pos_embedding")]
    N = P - sum(p.numel() for p in emb)
    head = [params[k] for k, r in roles.items() if r == "head"]
    tok = [params[k] for k, r in roles.items() if r == "embedding"]
    N_head = head[0].numel() if head else (tok[0].numel() if tok else 0)  # tied: the embedding's matrix
    mc = model.config
    d_attn = getattr(mc, "n_head", cfg.n_head) * (getattr(mc, "head_dim", None) or cfg.n_embd // cfg.n_head)
    attention = 12 * cfg.n_layer * cfg.block_size * d_attn
    per_token = 6 * (N + N_head) + attention
    tokens = cfg.batch_size * cfg.block_size
    mats = [tuple(params[k].shape) for k, r in roles.items() if r in MATRIX_ROLES]
    _FLOPS_CACHE[key] = dict(N=N, N_head=N_head, P=P, tokens=tokens, per_token=per_token,
                             attention=attention * tokens, flops=per_token * tokens, d_attn=d_attn, matrices=mats)
    return _FLOPS_CACHE[key]


_FLOPS_CACHE: dict = {}


def _vocab(cfg) -> int:
    from manifold_muon_lab.data import VOCAB_SIZES

    return cfg.vocab_size or VOCAB_SIZES.get(cfg.data) or 256


def training_cost(cfg, dev: Device, classes: dict | None = None, steps: int | None = None, evaluate: bool = True,
                  common_batches: int = 0, common_dev: Device | None = None) -> dict:
    """Seconds of one training run of ``cfg`` on ``dev`` by term (``model``, ``optimizer``, ``eigh``,
    ``memory``, ``eval``), ``total``, ``steps``, ``flops`` and ``notes``. ``steps`` (None: max_steps);
    ``evaluate``: the loop's evaluations; ``common_batches`` batches of the notebook's common evaluation on
    ``common_dev`` (None: ``dev``)."""
    vocab = _vocab(cfg)
    steps = cfg.max_steps if steps is None else steps
    mf = model_flops(cfg, vocab)
    opt, info = _cached_optimizer_cost(cfg, vocab, classes)
    dtype = "bfloat16" if cfg.dtype == "bfloat16" else "float32"
    terms = {"model": steps * mf["flops"] / dev.rate(dtype, train=True),
             "optimizer": steps * opt.product_seconds(dev),
             "eigh": steps * opt.decomp_seconds(dev),
             "memory": steps * mf["P"] * BYTES_PER_PARAM_STEP / (dev.bandwidth * 1e9),
             "eval": 0.0}
    notes = []
    if evaluate:
        evals = len(range(0, steps, cfg.eval_every)) + 1
        eval_tokens = evals * 2 * cfg.eval_batches * (cfg.batch_size // cfg.gradient_accumulation_steps) * cfg.block_size
        svd = Cost()
        for shape in mf["matrices"]:
            svd.dec("svdvals", *shape, count=evals + (len(range(0, steps, cfg.spectrum_every)) + 1
                                                     if cfg.spectrum_every else 0))
        terms["eval"] += eval_tokens * mf["per_token"] / 3 / dev.rate(dtype, train=True) + svd.decomp_seconds(dev)
    if common_batches:
        cd = common_dev or dev
        tokens = common_batches * cfg.batch_size * cfg.block_size
        terms["eval"] += tokens * mf["per_token"] / 3 / cd.rate("float32", train=True)
        logits = cfg.batch_size * cfg.block_size * vocab * 4 * 3 / 2 ** 30
        if logits > (cd.memory_gib if cd.kind == "gpu" and cd.memory_gib else LOGITS_NOTE_GIB):
            where = "the CPU" if cd.kind == "cpu" else f"one {cd.label}"
            notes.append(("logits", logits, f"its common evaluation holds ~{logits:.0f} GiB of logits at once on "
                          f"{where} (batches of {cfg.batch_size} x {cfg.block_size} tokens x vocabulary {vocab}, "
                          "float32, with their log-softmax)"))
    if dev.kind == "gpu" and dev.memory_gib and steps:
        from manifold_muon_lab.config import estimate_memory

        need = estimate_memory(cfg, vocab, cuda=True)["total"] / 2 ** 30
        if need > dev.memory_gib:
            notes.append(("memory", need, f"a training needs up to ~{need:.0f} GiB of GPU memory in one process "
                          f"(config.estimate_memory), more than the {dev.memory_gib:.0f} GiB of one {dev.label}: it "
                          "needs more GPUs (torchrun) or more gradient accumulation (about the same GPU-hours)"))
    return dict(terms, total=sum(terms.values()), steps=steps, flops=mf["flops"], msigns=opt.msigns,
                opt_flops=opt.flops, notes=notes, tokens=mf["tokens"], N=mf["N"])


def _opt_key(cfg, classes):
    d = cfg.to_dict()
    keep = ("family", "n_layer", "n_head", "n_embd", "n_kv_head", "vocab_size", "bias", "rmsnorm_free", "model_extra",
            "block_size", "data", "assignment", "optimizer")
    return json.dumps({k: d[k] for k in keep}, sort_keys=True, default=str) + repr(sorted((classes or {}).items()))


_OPT_CACHE: dict = {}


def _cached_optimizer_cost(cfg, vocab, classes):
    key = _opt_key(cfg, classes)
    if key not in _OPT_CACHE:
        _OPT_CACHE[key] = optimizer_step_cost(cfg, vocab, classes)
    return _OPT_CACHE[key]


# ----------------------------------------------------------------------------- what a run notebook does

@dataclass
class Training:
    """One training a run notebook does: its config, optimizer classes, and its common evaluation."""

    cfg: object
    classes: dict | None = None
    common_batches: int = 0
    common_on_cpu: bool = False


def _studies(preset, presets):  # runs/five_assignments.md
    from manifold_muon_lab.config import load_preset

    out = []
    for study, spec in preset["studies"].items():
        for s in spec["seeds"]:
            for a in spec["assignments"]:
                cfg = load_preset(preset["training_preset"], presets, **spec.get("overrides", {}), assignment=a, seed=s)
                out.append(Training(cfg, None, spec.get("common_eval_batches", 16)))
    return out


def _noise(preset, presets):  # runs/msign_tolerance.md
    from manifold_muon_lab.config import load_preset

    from .evidence import NoisyMuon

    return [Training(load_preset(preset["training_preset"], presets, **preset.get("overrides", {}),
                                 assignment="unconstrained", optimizer={"msign_noise": eps}, seed=s),
                     {"muon": NoisyMuon}, preset.get("common_eval_batches", 16))
            for s in preset["seeds"] for eps in preset["noise"]]


def _solvers(preset, presets):  # runs/solver_training.md: the trainings its notebook enumerates
    from .solver_runs import configs

    return [Training(cfg, None, preset["common_eval_batches"]) for cfg in configs(preset, presets)]


def _grid(preset, presets):  # paper_runs.run_grid (the notebooks that call grid_notebook)
    from manifold_muon_lab.config import load_preset

    from .paper_runs import expand_grid

    out = []
    for _, overrides in expand_grid(preset):
        cfg = load_preset(preset["training_preset"], presets, **overrides)
        cfg.checkpoint_every = 0
        out.append(Training(cfg, None, 32, common_on_cpu=True))  # paper_runs.common_val_loss: 32 batches, CPU
    return out


TRAINING_LOOPS = {"five_assignments": _studies, "msign_tolerance": _noise, "solver_training": _solvers}
# The notebooks that are matrix studies (a model of their own in ``run_jobs``; one small recorded training at most)
MATRIX_STUDIES = ("msign_accuracy", "dual_ascent_shapes", "dual_ascent_scaling")


# A checkpoint holds the weights (4 P bytes) and at most two float32 buffers per weight of optimizer state
# (8 P: config.estimate_memory's count); the model's and the optimizers' dictionaries add a little.
CHECKPOINT_BYTES_PER_PARAM = 12


def trainings(root: Path, name: str, scale: str) -> list[Training]:
    """The trainings run ``name`` does at ``scale`` (the enumerators above); [] for the ``MATRIX_STUDIES``;
    ``NoModel`` if unknown."""
    from .pipeline import load_run_preset, run_scales

    if scale not in run_scales(root, name):
        raise NoModel(f"no {scale} entry in runs/presets/{name}.yml")
    if name in MATRIX_STUDIES:
        return []
    preset = load_run_preset(name, scale, root)
    presets = root / "runs" / "presets" / "training"
    if name in TRAINING_LOOPS:
        return TRAINING_LOOPS[name](preset, presets)
    if "grid_notebook(" in (root / "runs" / f"{name}.md").read_text() and ("axes" in preset or "groups" in preset):
        return _grid(preset, presets)
    raise NoModel(f"runs/{name}.md is neither a training loop this module knows ({', '.join(TRAINING_LOOPS)}, "
                  "the grid notebooks) nor one of its matrix studies; add its loop to TRAINING_LOOPS")


def checkpoint_bytes(cfg) -> int:
    """The bytes of the checkpoint one training keeps (0 with ``checkpoint_every`` = -1): 12 P."""
    if cfg.checkpoint_every < 0:
        return 0
    from manifold_muon_lab.config import model_fields

    fields = model_fields(cfg, _vocab(cfg))
    return CHECKPOINT_BYTES_PER_PARAM * _parameters(cfg.family, tuple(sorted(fields.items())))


@functools.lru_cache(maxsize=None)
def _parameters(family: str, fields: tuple) -> int:
    """Parameters of the model ``family`` with ``fields`` (built on the meta device, once per shape)."""
    import torch

    from manifold_muon_lab.models import build_model

    with torch.device("meta"):
        return sum(p.numel() for p in build_model(family, **dict(fields)).parameters())


def disk_need(root: Path, name: str, scale: str) -> tuple[int, int]:
    """(bytes the run's finished trainings keep on disk in checkpoints, the largest single checkpoint): every
    training keeps its last checkpoint (for resuming), and an atomic write holds one more copy while it writes."""
    sizes = [checkpoint_bytes(t.cfg) for t in trainings(root, name, scale)]
    return sum(sizes), max(sizes, default=0)


@dataclass
class Job:
    """Independent work of a run (``parallel``: the template runs such jobs ``workers`` at a time) or its
    notebook's own sequential work (``parallel=False``); ``on`` is "device" or "cpu"."""

    seconds: float
    terms: dict
    on: str = "device"
    parallel: bool = True
    steps: int = 0
    training: bool = True


def run_jobs(root: Path, name: str, scale: str, dev: Device) -> tuple[list[Job], list[str]]:
    """The jobs of run ``name`` at ``scale`` on ``dev`` and notes about them; ``NoModel`` if unknown."""
    from .pipeline import load_run_preset, run_scales

    if scale not in run_scales(root, name):
        raise NoModel(f"no {scale} entry in runs/presets/{name}.yml")
    preset = load_run_preset(name, scale, root)
    presets = root / "runs" / "presets" / "training"
    if name == "msign_accuracy":
        return _msign_accuracy(preset), []
    if name == "dual_ascent_shapes":
        return _dual_ascent_shapes(preset, presets, dev)
    if name == "dual_ascent_scaling":
        return _dual_ascent_scaling(preset), []
    jobs, notes = [], []
    for t in trainings(root, name, scale):
        on_cpu = dev.kind == "cpu" or t.cfg.device == "cpu"
        d = measure_cpu(t.cfg.threads or None) if on_cpu else dev
        r = training_cost(t.cfg, d, t.classes)
        jobs.append(Job(r["total"], {k: r[k] for k in TERMS}, "cpu" if on_cpu else "device", True, r["steps"]))
        if t.common_batches:  # after the sweep, in the notebook's process (torch's default threads on a CPU)
            common_dev = measure_cpu() if (t.common_on_cpu or on_cpu) else d
            c = training_cost(t.cfg, d, t.classes, steps=0, evaluate=False, common_batches=t.common_batches,
                              common_dev=common_dev)
            jobs.append(Job(c["eval"], _zero_terms(eval=c["eval"]), common_dev.kind.replace("gpu", "device"),
                            False, 0, False))
            r["notes"] += c["notes"]
        for note in r["notes"]:
            _keep_note(notes, note)
    return jobs, notes


def _keep_note(notes: list, note: tuple) -> None:
    """Notes are (kind, size, text): of each kind the largest is kept."""
    for i, (kind, size, _) in enumerate(notes):
        if kind == note[0]:
            if note[1] > size:
                notes[i] = note
            return
    notes.append(note)


def _zero_terms(**kw) -> dict:
    return {**{k: 0.0 for k in ("model", "optimizer", "eigh", "memory", "eval")}, **kw}


def _cost_job(c: Cost, dev: Device, parallel: bool) -> Job:
    return Job(c.product_seconds(dev) + c.decomp_seconds(dev),
               _zero_terms(optimizer=c.product_seconds(dev), eigh=c.decomp_seconds(dev)), "cpu", parallel, 0, False)


def _msign_accuracy(preset) -> list[Job]:
    """runs/msign_accuracy.md, on the CPU (its tensors are made there), torch's default threads: per input
    kind, shape and seed a float64 SVD (the reference; logspaced inputs also two QRs, taken as SVDs) and per
    method, dtype and step count an msign and float64 svdvals; then per shape the timing loop's
    1 + repeats SVDs and msigns."""
    dev = measure_cpu()
    c = Cost()
    variants = len(preset["methods"]) * len(preset["dtypes"])
    for m, n in preset["shapes"]:
        for kind in preset["inputs"]:
            per_seed = Cost()
            per_seed.dec("svd", m, n, 1 + 2 * (kind == "logspaced"))
            for k in preset["steps"]:
                per_seed.msign(m, n, k, "float32", count=variants)
                per_seed.dec("svdvals", m, n, variants)
            c.add(per_seed, len(preset["seeds"]))
        reps = 1 + int(preset["repeats"])
        c.dec("svd", m, n, reps)
        for k in preset["steps"]:
            c.msign(m, n, k, "float32", count=variants * reps)
    return [_cost_job(c, dev, False)]


def _dual_ascent_scaling(preset) -> list[Job]:
    """runs/dual_ascent_scaling.md, on the CPU on any machine (torch's default threads): per size n and seed, the
    construction's msign and, per step size of the grid (the once-only widening not counted), ``steps``
    dual-ascent steps of one Polar Express msign (10 steps, bfloat16; costed as float32, as a CPU without
    bfloat16 units runs it) and the two n x n float32 products of the multiplier's update."""
    dev = measure_cpu()
    c = Cost()
    grid, steps = int(preset["k_hi"]) - int(preset["k_lo"]) + 1, int(preset["steps"])
    for n in preset["sizes"]:
        seeds = len(preset["seeds"])
        c.msign(n, n, 10, "bfloat16", method="polar_express", count=seeds * (1 + grid * steps))
        c.mm(seeds * grid * steps * 2 * 2 * n ** 3, n, "float32")
    return [_cost_job(c, dev, False)]


def _dual_ascent_shapes(preset, presets, dev: Device) -> tuple[list[Job], list[str]]:
    """runs/dual_ascent_shapes.md, on the CPU on any machine (one thread): the recording (``step`` + 1 training
    steps of its preset, no evaluation), then per block shape of the recorded layer (the four shapes of a GPT-2
    block) one job: the step-size sweep ((alphas + 1) x (T + 1) Newton-Schulz msigns, no widening counted),
    the post's snapshots (2 x (T_ref + 1) msigns), the certified float64 reference (``ref_steps`` Gram-space
    iterations at the cap, as gram_admm's per iteration; none on square Stiefel) and the retractions of the
    snapshots (float64 polar factors)."""
    from manifold_muon_lab.config import load_preset

    cpu1 = measure_cpu(1)
    rec = preset["record"]
    cfg = load_preset(rec["training_preset"], presets, seed=int(rec["seed"]), threads=1, **rec["overrides"])
    r = training_cost(cfg, cpu1 if (dev.kind == "cpu" or cfg.device == "cpu") else dev, steps=int(rec["step"]) + 1,
                      evaluate=False)
    jobs = [Job(r["total"], {k: r[k] for k in ("model", "optimizer", "eigh", "memory", "eval")},
                "cpu" if (dev.kind == "cpu" or cfg.device == "cpu") else "device", False, r["steps"])]
    d = cfg.n_embd
    T, T_ref, S = int(preset["T"]), int(preset["T_ref"]), len(preset["snapshots"])
    lrs, ref = len(preset["lrs"]), int(preset["ref_steps"])
    # (D_out, D_in) and the manifold Hetero gives it: attention Stiefel, MLP DGram
    for (m, n), stiefel in (((3 * d, d), True), ((d, d), True), ((4 * d, d), False), ((d, 4 * d), False)):
        big, small = max(m, n), min(m, n)
        c = Cost()
        msigns = (len(preset["alphas"]) + 1) * (T + 1) + 2 * (T_ref + 1)
        c.msign(big, small, 5, "float32", count=msigns)
        c.mm(msigns * 4 * big * small * small, small, "float32")
        one = Cost()  # one gram_solve iteration (and its share of certificates), float64
        one.dec("eigh", small, small, 1.25)
        one.dec("eigvalsh", small, small, 0.5)
        one.mm(2 * (GRAM_ITER_N3 + GRAM_CERT_N3 / 4) * small ** 3, small, "float64")
        iters = 0 if (stiefel and m == n) else ref + 2 * 16   # the reference, and the two default solves
        c.add(one, iters)
        c.mm(8 * big * small * small * 3, small, "float64")     # three Gram pictures
        retracts = (2 * (S + 1) + 2) * lrs
        c.msign(big, small, 8 + 6, "float64", count=retracts)   # float64 polar factors, polished to rounding
        jobs.append(_cost_job(c, cpu1, True))
    return jobs, []


# ----------------------------------------------------------------------------- a run's estimate

TERMS = ("model", "optimizer", "eigh", "memory", "eval")


def run_estimate(root: Path, name: str, scale: str, dev: Device, workers: int = 1) -> dict:
    """{run, trainings, steps, cpu_s (on a GPU: the seconds of work on the CPU), job_s (independent jobs, one process), rest_s, estimate_s (on ``dev``; CPU jobs
    on ``workers`` processes when the template runs them in parallel), terms (seconds by term), largest (the
    largest term), notes}; a run without a model has ``estimate_s`` NaN and ``reason``."""
    from .pipeline import makespan, takes_workers

    try:
        jobs, notes = run_jobs(root, name, scale, dev)
    except NoModel as e:
        return dict(run=name, trainings=0, steps=0, job_s=0.0, rest_s=float("nan"), estimate_s=float("nan"),
                    reason=str(e), terms={}, largest="-", notes=[])
    par = workers if takes_workers(root / "runs" / f"{name}.md") else 1
    device_s = sum(j.seconds for j in jobs if j.on == "device")
    cpu_par = [j.seconds for j in jobs if j.on == "cpu" and j.parallel]
    cpu_seq = sum(j.seconds for j in jobs if j.on == "cpu" and not j.parallel)
    terms = {k: sum(j.terms.get(k, 0.0) for j in jobs) for k in TERMS}
    job_s = sum(j.seconds for j in jobs if j.parallel)
    rest_s = sum(j.seconds for j in jobs if not j.parallel)
    cpu_s = (makespan(cpu_par, par) if cpu_par else 0.0) + cpu_seq
    estimate_s = device_s + cpu_s
    cpu_s = cpu_s if dev.kind == "gpu" else 0.0
    return dict(run=name, trainings=sum(1 for j in jobs if j.training), steps=sum(j.steps for j in jobs), cpu_s=cpu_s,
                jobs=sum(1 for j in jobs if j.parallel), job_s=job_s, rest_s=rest_s, estimate_s=estimate_s,
                terms=terms, largest=max(terms, key=terms.get) if any(terms.values()) else "-",
                notes=[text for _, _, text in notes])


def assumptions(dev: Device) -> str:
    """One line: what the numbers assume."""
    if dev.kind == "gpu":
        return (f"{dev.label} (peak {dev.tflops['bfloat16']:.0f} TFLOPS bfloat16, {dev.tflops['float32']:.0f} float32, "
                f"{dev.tflops['float64']:.1f} float64, {dev.bandwidth:.0f} GB/s), MFU {MFU_TRAIN} for training, "
                f"{OPT_MFU} x min(1, n/{OPT_FULL_N}) for the optimizer's products, a rough {GPUS[dev.key]['eigh_ms']:g} ms "
                f"per float64 eigh at n={DECOMP_REF_N}")
    return f"{dev.label}, MFU {MFU_TRAIN_CPU} of that for training, measured rates for the optimizer's sizes"


def _compare(root: Path, scale: str) -> None:
    """The model on this CPU beside the single-process seconds the runs recorded at ``scale``."""
    from .pipeline import _job_seconds, run_dir, run_templates

    dev = measure_cpu()
    print(f"cost model on {assumptions(dev)}")
    print(f"{'run':22s} {'recorded jobs':>14s} {'model jobs':>11s} {'ratio':>6s}  largest    recorded wall  model (2 workers)")
    tot_rec = tot_mod = 0.0
    for name in run_templates(root):
        path = run_dir(name, scale, root) / "metrics.json"
        if not path.exists():
            continue
        metrics = json.loads(path.read_text())
        rec = sum(_job_seconds(metrics))
        wall = float(metrics.get("provenance", {}).get("wall_time_s") or 0.0)
        est = run_estimate(root, name, scale, dev, workers=2)
        if est["estimate_s"] != est["estimate_s"]:
            print(f"{name:22s} no model: {est['reason']}")
            continue
        model = est["job_s"]
        ratio = model / rec if rec else float("nan")
        if rec:
            tot_rec, tot_mod = tot_rec + rec, tot_mod + model
        print(f"{name:22s} {rec / 60:10.1f} min {model / 60:7.1f} min {ratio:6.2f}  {est['largest']:9s} "
              f"{wall / 60:9.1f} min {est['estimate_s'] / 60:9.1f} min")
    if tot_rec:
        print(f"all recorded jobs: model / recorded = {tot_mod / tot_rec:.2f} ({tot_mod / 60:.0f} min vs {tot_rec / 60:.0f} min)")


def main(argv=None) -> None:
    import argparse

    from .pipeline import repo_root

    ap = argparse.ArgumentParser(prog="python -m manifold_muon_book.cost_model", description=__doc__.split("\n")[0])
    ap.add_argument("--scale", default="gpu")
    ap.add_argument("--compare", action="store_true", help="the model on this CPU beside the recorded times")
    args = ap.parse_args(argv)
    root = repo_root()
    if args.compare:
        _compare(root, args.scale)
        return
    from .pipeline import print_estimate

    print_estimate(root, args.scale, os.cpu_count() or 1)


if __name__ == "__main__":
    main()
