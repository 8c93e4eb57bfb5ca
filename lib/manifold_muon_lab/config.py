"""The configuration of one training run: a dataclass, the presets that fill it, and the checks
that refuse a bad one before any work starts.

    cfg = load_preset("cpu", "runs/presets/training", assignment="hetero")   # <preset_dir>/cpu.yml + overrides
    validate(cfg)                                        # raises ValueError naming every problem
    check_optimizer_options(cfg, vocab_size=256)         # the builder accepts every key of cfg.optimizer
    check_memory(cfg, vocab_size=256)                    # RunError when the run cannot fit in memory

A preset is plain YAML whose keys are the fields of ``TrainConfig``. ``--set key=value`` on the
command line goes through ``parse_overrides`` (values are read as YAML: ``lr=0.02``, ``bias=false``,
``optimizer={inner_steps: 0}``). Numbers are read as Python reads them: ``1e-3`` is a float here, where
plain YAML 1.1 would read a string. A key given twice in one mapping is refused (plain YAML keeps the
last one silently). ``read_yaml_file`` reads a YAML file so, with every problem a ``ValueError`` naming
the file (not UTF-8, not valid YAML, a key twice); ``load_preset`` also refuses an empty preset (it would
run the built-in defaults), and ``preset_scale`` reads one scale of a run preset (``runs/presets/<run>.yml``).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import inspect
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from manifold_muon.assignments import ASSIGNMENTS, OPTIMIZERS, build_optimizers
from manifold_muon.manifolds import available_manifolds

from .data import DATASETS as _DATASETS
from .models import FAMILIES as _FAMILIES
from .models import build_model

__all__ = ["TrainConfig", "RunError", "DEFAULT_PRESET_DIR", "available_presets", "load_preset", "parse_overrides",
           "validate", "read_yaml", "read_yaml_file", "preset_scale", "DuplicateKeyError", "model_fields",
           "check_optimizer_options", "estimate_memory", "available_memory", "check_memory"]


class RunError(Exception):
    """A run that cannot start or go on for a reason the user can fix (a config, data, checkpoint, memory or
    out_dir problem). Its message is one sentence saying what is wrong and what to do; the command line prints
    it alone (the traceback only with ``--debug``). Not a ``RuntimeError``: a sweep records a ``RunError`` as a
    failed run and goes on, while a ``RuntimeError`` (torch's, or a bug) stops it."""

DEFAULT_PRESET_DIR = Path("runs") / "presets" / "training"  # relative to the current directory
FAMILIES = tuple(_FAMILIES)
DATASETS = (*_DATASETS, "synthetic")  # the prepared data sets, plus uniform random tokens
DTYPES = ("float32", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A key given twice in one YAML mapping (``key``; ``first_line`` and ``line`` count from 1)."""

    def __init__(self, key, first_mark, mark):
        super().__init__(None, None, f"duplicate key {key!r}", mark)
        self.key, self.first_line, self.line = key, first_mark.line + 1, mark.line + 1


class _Loader(yaml.SafeLoader):
    """YAML with Python's float literals: 1e-3, 1E5, .5 and 1_000.0 are floats (YAML 1.1 reads 1e-3 as a string);
    a key given twice in one mapping raises ``DuplicateKeyError`` (a merge, ``<<: *base``, overrides on purpose)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the constructor refuses it with its own message
                    continue
                if first is not key_node.start_mark:
                    raise DuplicateKeyError(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                |[0-9][0-9_]*[eE][-+]?[0-9]+|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def read_yaml(text: str):
    """Parse YAML text with Python's float literals (see ``_Loader``)."""
    return yaml.load(text, Loader=_Loader)


@functools.lru_cache(maxsize=256)
def _read_yaml_cached(text: str):
    return read_yaml(text)


def read_yaml_file(path):
    """A YAML file as ``read_yaml`` reads it; a file that cannot be read, is not UTF-8, is not valid YAML or gives a
    key twice raises a ValueError naming the file (and the line), in one sentence saying what to fix."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ValueError(f"cannot read {path} ({e.strerror or e}); give a readable YAML file") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line, column = raw.count(b"\n", 0, e.start) + 1, e.start - raw.rfind(b"\n", 0, e.start)
        raise ValueError(f"{path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at line {line}, column {column}); "
                         "save it as UTF-8") from None
    try:
        return copy.deepcopy(_read_yaml_cached(text))  # a preset is read once per file content, not per training
    except DuplicateKeyError as e:
        raise ValueError(f"{path} gives the key {e.key!r} twice (line {e.first_line} and line {e.line}); "
                         "keep one of them") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path} is not valid YAML ({_yaml_problem(e)}); fix the file") from None


def preset_scale(path, scale: str) -> dict:
    """The parameters of ``scale`` in a run preset file (``runs/presets/<run>.yml``, a mapping scale -> parameters);
    ValueError naming the file for an empty file, an unknown scale (with the valid ones) or an empty scale."""
    path = Path(path)
    presets = read_yaml_file(path)
    if not presets:
        raise ValueError(f"{path} is empty: it defines no scales; give each scale (smoke, cpu, ...) its parameters")
    if not isinstance(presets, dict):
        raise ValueError(f"{path} must be a YAML mapping of scale -> parameters, got {type(presets).__name__}")
    if scale not in presets:
        raise ValueError(f"run {path.stem!r} has no scale {scale!r}; choose one of: {', '.join(map(str, presets))}")
    entry = presets[scale]
    if not entry:
        raise ValueError(f"{path}: scale {scale!r} is empty (it sets no keys); give it its parameters or remove it")
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: scale {scale!r} must be a mapping of parameter -> value, got {type(entry).__name__}")
    return dict(entry)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: what the parser expected and where (PyYAML's own message spans several)."""
    what = " ".join(str(getattr(e, "problem", None) or e).split())
    mark = getattr(e, "problem_mark", None)
    return f"{what} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else what


@dataclass
class TrainConfig:
    """Everything one run depends on. ``validate`` checks it; ``train`` records it in provenance.json
    and in every checkpoint (a checkpoint of another config is refused on resume)."""

    # model
    family: str = "gpt2"              # gpt2 | qwen3
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    n_kv_head: int | None = None      # qwen3 grouped-query attention; None = n_head
    vocab_size: int | None = None     # None = the data set's vocabulary
    bias: bool = False                # gpt2 only
    dropout: float = 0.0              # gpt2 only
    rmsnorm_free: bool = False        # qwen3 only: the normalisation-free variant of 003 Section 4.2
    model_extra: dict = field(default_factory=dict)  # any other field of the family's config class
    # data
    data: str = "kjv"                 # kjv (embedded, byte tokens) | openwebtext | synthetic
    data_dir: str | None = None       # None = the data module's default
    batch_size: int = 16              # sequences per optimizer step, summed over ranks and micro-steps
    gradient_accumulation_steps: int = 1
    block_size: int = 64
    # schedule
    max_steps: int = 100
    lr: float = 0.02                  # matrix optimizer (Muon / Manifold Muon / ...)
    adamw_lr: float = 6e-4            # embeddings, head, 1-D parameters
    warmup: int = 0                   # linear warmup steps
    min_lr_ratio: float = 0.1         # cosine decay from lr to min_lr_ratio * lr at max_steps
    grad_clip: float = 1.0            # 0 = off
    # optimizer routing
    assignment: str | dict = "hetero"  # a name from `assignments`, or a mapping its builder accepts
    optimizer: dict = field(default_factory=dict)  # keyword overrides for build_optimizers
    per_assignment: dict = field(default_factory=dict)  # assignment -> config values for it (e.g. its lr)
    # measurement
    eval_every: int = 50
    eval_batches: int = 4
    spectrum_every: int = 0           # full singular spectra every k steps (0 = never)
    probe_every: int = 0              # attention statistics every k steps (0 = never)
    probe_rows: int = 64              # query rows sampled per layer by the attention probe
    # run
    seed: int = 1337
    dtype: str = "float32"            # bfloat16 = autocast on the run's device (CUDA, or the CPU: the gpu-dry presets)
    compile: bool = False             # torch.compile the model's forward (long GPU runs)
    divergence_loss_threshold: float = 20.0
    checkpoint_every: int = 0         # 0 = only at the end; -1 = never (timing runs)
    out_dir: str | None = None
    device: str = "auto"              # auto | cpu | cuda
    threads: int = 0                  # torch CPU threads; 0 = torch's default

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Build from a mapping, refusing unknown keys with the closest valid one."""
        if not isinstance(d, dict):
            raise TypeError(f"a training config is a mapping of field -> value, got {type(d).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in d if k not in names]
        if unknown:
            raise ValueError("; ".join(_unknown_key_message(k, names) for k in unknown))
        return cls(**d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "TrainConfig":
        return TrainConfig.from_dict({**self.to_dict(), **changes})


def _unknown_key_message(key, names) -> str:
    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(names)}"
    return f"unknown config key {key!r} ({hint})"


def available_presets(preset_dir=DEFAULT_PRESET_DIR) -> list[str]:
    return sorted(p.stem for p in Path(preset_dir).glob("*.yml"))


def load_preset(name_or_path: str | Path, preset_dir=DEFAULT_PRESET_DIR, **overrides) -> TrainConfig:
    """``<preset_dir>/<name>.yml`` (or a path to a YAML file), then ``overrides``."""
    path = Path(name_or_path)
    if path.suffix not in (".yml", ".yaml"):
        path = Path(preset_dir) / f"{name_or_path}.yml"
    if not path.exists():
        known = available_presets(preset_dir)
        raise FileNotFoundError(
            f"no training preset {str(name_or_path)!r} (looked for {path}); "
            + (f"choose one of: {', '.join(known)}" if known else f"{preset_dir} holds no presets; give --preset-dir")
            + " or give a path to a .yml file")
    d = read_yaml_file(path)
    if d is None or d == {}:  # an empty file (or comments only) would run the built-in defaults, unasked
        raise ValueError(f"{path} is empty: it sets no config keys, so the run would use the built-in defaults; "
                         "give the preset's keys (family, n_layer, data, batch_size, max_steps, ...) or choose "
                         "another preset")
    if not isinstance(d, dict):
        raise ValueError(f"{path} must be a YAML mapping of config keys to values")
    return TrainConfig.from_dict(_merge(d, overrides))


def _merge(preset: dict, explicit: dict) -> dict:
    """preset < its ``per_assignment`` row for the chosen assignment < explicit overrides.

    ``per_assignment`` holds a paper's per-optimizer table (lr, radius, ...); ``optimizer`` dicts
    are merged key by key at every level.
    """
    d = {**preset, **explicit}
    row = (d.get("per_assignment") or {}).get(d["assignment"]) if isinstance(d.get("assignment"), str) else None
    if row is not None and not isinstance(row, dict):
        raise ValueError(f"per_assignment[{d['assignment']!r}] must be a mapping of config keys to values")
    row = row or {}
    d.update({k: v for k, v in row.items() if k not in explicit and k != "optimizer"})
    d["optimizer"] = {**(preset.get("optimizer") or {}), **(row.get("optimizer") or {}),
                      **(explicit.get("optimizer") or {})}
    return d


def parse_overrides(items: list[str]) -> dict:
    """``["lr=1e-3", "optimizer={inner_steps: 0}"]`` -> ``{"lr": 0.001, "optimizer": {"inner_steps": 0}}``."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--set takes key=value, got {item!r}")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = read_yaml(value)
        except DuplicateKeyError as e:
            raise ValueError(f"--set {item!r}: the value gives the key {e.key!r} twice; keep one of "
                             "them") from None
        except yaml.YAMLError as e:
            raise ValueError(f"--set {item!r}: the value is not valid YAML ({_yaml_problem(e)}); "
                             "fix it, and quote it for the shell, e.g. --set 'optimizer={inner_steps: 0}'") from None
    return out


def _type_ok(value, hint) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin or hint)


def _type_name(hint) -> str:
    args = typing.get_args(hint)
    return " or ".join(_type_name(a) for a in args) if args else getattr(hint, "__name__", str(hint))


def validate(cfg: TrainConfig, data_len: int | None = None, world_size: int = 1) -> TrainConfig:
    """Every problem with ``cfg`` in one ValueError, before any work starts; returns ``cfg``.

    ``data_len`` (tokens in the smallest split) and ``world_size`` add the checks that need them.
    """
    if isinstance(cfg, dict):
        cfg = TrainConfig.from_dict(cfg)
    problems = []
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if not _type_ok(v, hints[f.name]):
            problems.append(f"{f.name}={v!r} should be {_type_name(hints[f.name])}")
    if problems:  # the value checks below assume the types are right
        raise ValueError("bad training config: " + "; ".join(problems))

    def choice(name, choices):
        if getattr(cfg, name) not in choices:
            problems.append(f"{name}={getattr(cfg, name)!r} is not one of: {', '.join(choices)}")

    choice("family", FAMILIES)
    choice("data", DATASETS)
    choice("dtype", DTYPES)
    choice("device", DEVICES)
    for name in ("n_layer", "n_head", "n_embd", "batch_size", "gradient_accumulation_steps",
                 "block_size", "max_steps", "eval_every", "eval_batches", "probe_rows"):
        if getattr(cfg, name) < 1:
            problems.append(f"{name}={getattr(cfg, name)} must be at least 1")
    if cfg.checkpoint_every < -1:
        problems.append(f"checkpoint_every={cfg.checkpoint_every} must be -1 (never), 0 (at the end) or positive")
    for name in ("warmup", "spectrum_every", "probe_every", "threads"):
        if getattr(cfg, name) < 0:
            problems.append(f"{name}={getattr(cfg, name)} must be 0 or more")
    for name in ("lr", "adamw_lr"):
        if not (getattr(cfg, name) > 0 and math.isfinite(getattr(cfg, name))):
            problems.append(f"{name}={getattr(cfg, name)} must be a positive number")
    if not 0 <= cfg.min_lr_ratio <= 1:
        problems.append(f"min_lr_ratio={cfg.min_lr_ratio} must lie in [0, 1]")
    if cfg.grad_clip < 0:
        problems.append(f"grad_clip={cfg.grad_clip} must be 0 (off) or positive")
    if not 0 <= cfg.dropout < 1:
        problems.append(f"dropout={cfg.dropout} must lie in [0, 1)")
    if not cfg.divergence_loss_threshold > 0:
        problems.append(f"divergence_loss_threshold={cfg.divergence_loss_threshold} must be positive")
    if cfg.warmup > cfg.max_steps:
        problems.append(f"warmup={cfg.warmup} is longer than max_steps={cfg.max_steps}")
    if cfg.n_head >= 1 and cfg.n_embd % cfg.n_head:
        problems.append(f"n_embd={cfg.n_embd} is not divisible by n_head={cfg.n_head}; "
                        f"pick n_head among the divisors of n_embd")
    if cfg.family == "qwen3" and cfg.n_head >= 1 and "head_dim" not in cfg.model_extra \
            and (cfg.n_embd // cfg.n_head) % 2:
        problems.append(f"qwen3 needs an even head dimension for RoPE, n_embd/n_head = {cfg.n_embd // cfg.n_head}")
    if cfg.n_kv_head is not None:
        if cfg.family != "qwen3":
            problems.append("n_kv_head applies to family qwen3 only; remove it for gpt2")
        elif cfg.n_kv_head < 1 or cfg.n_head % cfg.n_kv_head:
            problems.append(f"n_head={cfg.n_head} is not a multiple of n_kv_head={cfg.n_kv_head}")
    if cfg.family in _FAMILIES:
        config_cls = _FAMILIES[cfg.family][1]
        fields = [f.name for f in dataclasses.fields(config_cls)]
        unknown = sorted(set(cfg.model_extra) - set(fields))
        if unknown:
            problems.append(f"model_extra keys {unknown} are not fields of {config_cls.__name__}; remove them or use "
                            f"its fields: {', '.join(fields)}")
    if cfg.rmsnorm_free and cfg.family != "qwen3":
        problems.append("rmsnorm_free applies to family qwen3 only")
    if cfg.family == "qwen3" and (cfg.bias or cfg.dropout):
        problems.append("bias and dropout apply to family gpt2 only; the qwen3 model has neither")
    if cfg.vocab_size is not None and cfg.vocab_size < 2:
        problems.append(f"vocab_size={cfg.vocab_size} must be at least 2 (or null for the data's own)")
    if cfg.data == "synthetic" and cfg.vocab_size is None:
        problems.append("data=synthetic needs vocab_size (the range of the random tokens)")
    per_micro = world_size * cfg.gradient_accumulation_steps
    if cfg.batch_size >= 1 and cfg.batch_size % per_micro:
        problems.append(f"batch_size={cfg.batch_size} is not divisible by world_size x "
                        f"gradient_accumulation_steps = {world_size} x {cfg.gradient_accumulation_steps}; "
                        f"make it a multiple of {per_micro}")
    if data_len is not None and cfg.block_size + 1 > data_len:
        problems.append(f"block_size={cfg.block_size} needs at least {cfg.block_size + 1} tokens per split, "
                        f"the data has {data_len}; lower block_size")
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    for a, row in cfg.per_assignment.items():
        for key in (row if isinstance(row, dict) else {}):
            if key not in names or key in ("assignment", "per_assignment"):
                problems.append(f"per_assignment[{a!r}]: {_unknown_key_message(key, names)}")
    if isinstance(cfg.assignment, str):
        names = sorted(ASSIGNMENTS)
        if cfg.assignment not in names:
            close = difflib.get_close_matches(cfg.assignment, names, n=1)
            problems.append(f"unknown assignment {cfg.assignment!r}"
                            + (f" (did you mean {close[0]!r}?)" if close else "")
                            + f"; choose one of: {', '.join(names)}")
    else:
        problems.extend(_check_assignment_mapping(cfg.assignment))
    if problems:
        raise ValueError("bad training config: " + "; ".join(problems))
    return cfg


def _check_assignment_mapping(mapping: dict) -> list[str]:
    """Each value is an optimizer name or [optimizer, manifold(, options)], as ``manifold_muon.assignments`` reads them."""
    problems = []
    for selector, rule in mapping.items():
        rule = [rule] if isinstance(rule, str) else list(rule) if isinstance(rule, (list, tuple)) else [rule]
        if not rule or rule[0] not in OPTIMIZERS:
            problems.append(f"assignment[{selector!r}]: unknown optimizer {rule[0] if rule else None!r}; "
                            f"choose one of: {', '.join(OPTIMIZERS)}")
        elif len(rule) > 1 and rule[1] is not None and rule[1] not in available_manifolds():
            problems.append(f"assignment[{selector!r}]: unknown manifold {rule[1]!r}; "
                            f"choose one of: {', '.join(available_manifolds())}")
    return problems


# ----------------------------------------------------------------------------- checks that need the model

def model_fields(cfg: TrainConfig, vocab_size: int) -> dict:
    """The model config's fields for ``build_model(cfg.family, ...)``: the sizes, the family's own, ``model_extra``."""
    own = dict(bias=cfg.bias, dropout=cfg.dropout) if cfg.family == "gpt2" else dict(
        n_kv_head=cfg.n_kv_head or cfg.n_head, rmsnorm_free=cfg.rmsnorm_free)
    return dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=cfg.block_size,
                vocab_size=vocab_size, **own, **cfg.model_extra)


def _meta_model(cfg: TrainConfig, vocab_size: int):
    """The run's model on the meta device: shapes and names, no memory, no computation."""
    import torch

    with torch.device("meta"):
        return build_model(cfg.family, **model_fields(cfg, vocab_size))


def check_optimizer_options(cfg: TrainConfig, vocab_size: int, classes: dict | None = None) -> None:
    """Build the optimizers of ``cfg`` on a meta-device copy of its model, so that a key of ``optimizer={...}``
    that no optimizer of the assignment takes (or a bad ``manifold_args``) is refused before any work."""
    try:
        build_optimizers(_meta_model(cfg, vocab_size), cfg.assignment, lr=cfg.lr, adamw_lr=cfg.adamw_lr,
                         classes=classes, **cfg.optimizer)
    except (ValueError, TypeError) as e:
        names = set(inspect.signature(build_optimizers).parameters) - {"model", "assignment", "overrides", "classes"}
        for cls in OPTIMIZERS.values():
            names |= set(inspect.signature(cls.__init__).parameters) - {"self", "params", "args", "kwargs"}
        hints = [f"{close[0]!r} for {k!r}" for k in cfg.optimizer
                 for close in [difflib.get_close_matches(str(k), sorted(names), n=1, cutoff=0.6)]
                 if close and k not in names]
        raise ValueError(f"bad training config: optimizer={cfg.optimizer}: {e}"
                         + (f" (did you mean {', '.join(hints)}?)" if hints else "")
                         + "; fix the key in --set optimizer={...} or in the preset") from None


_GIB = 2**30


def estimate_memory(cfg: TrainConfig, vocab_size: int, world_size: int = 1, cuda: bool = False) -> dict:
    """Bytes one process of a run needs at its peak, by part (an estimate, not a measurement):

    * ``weights``     4 P                      (P parameters, float32)
    * ``gradients``   4 P
    * ``optimizer``   8 P                      (at most two buffers per weight: AdamW's moments; momentum and a
                                                dual variable for the manifold optimizers)
    * ``activations`` b T [a L (8 d + 2 f) + 4 (2 d + 3 V)]   for the training micro-batch of b = batch_size /
                      (world_size x gradient_accumulation_steps) sequences of T = block_size tokens: per layer and
                      token the tensors autograd keeps (gpt2: the two norms' inputs and outputs, q, k, v, the
                      attention output, the MLP's hidden f = 4 d before and after GELU, = 16 d; qwen3's SwiGLU keeps
                      two hidden tensors more, counted as 12 d + 4 f), at a bytes each (4, or 2 under bfloat16
                      autocast on CUDA); then the final norm and, in float32, the logits over V tokens, their
                      log-softmax and its gradient. Attention is ``scaled_dot_product_attention``: no T x T matrix.
                      The evaluation forward (no gradients, batch_size / gradient_accumulation_steps sequences:
                      4 b T (3 V + f + 2 d)) counts instead when it is larger.
    * ``batch``       20 B T                   (B = batch_size: the int64 inputs and targets and the uint16
                                                windows they are cut from, in host memory)

    d = n_embd, L = n_layer, f = the MLP width. On CUDA everything but ``batch`` is device memory.

    It errs low: on a CPU the peak resident memory of a run above the interpreter's own was 1.07 to 1.4 times
    this total for five variants of the cpu presets (batch 256 to 4096 sequences, T = 32 to 1024, d = 32 to
    256; autograd's transient gradients and the allocator are not counted), so ``check_memory`` refuses only
    a config that cannot fit, never one that can.
    """
    model = _meta_model(cfg, vocab_size)
    P = sum(p.numel() for p in model.parameters())
    d, L, T, V = cfg.n_embd, cfg.n_layer, cfg.block_size, vocab_size
    f = getattr(model.config, "ffn_dim", None) or 4 * d
    per_layer = 8 * d + 2 * f if cfg.family == "gpt2" else 12 * d + 4 * f
    a = 2 if cuda and cfg.dtype == "bfloat16" else 4
    accum = max(1, cfg.gradient_accumulation_steps)
    micro = max(1, cfg.batch_size // max(1, world_size * accum))
    train_act = micro * T * (a * L * per_layer + 4 * (2 * d + 3 * V))
    eval_act = max(1, cfg.batch_size // accum) * T * 4 * (3 * V + f + 2 * d)
    parts = {"weights": 4 * P, "gradients": 4 * P, "optimizer": 8 * P, "activations": max(train_act, eval_act),
             "batch": 20 * cfg.batch_size * T}
    return {**parts, "total": sum(parts.values()), "parameters": P, "micro_batch": micro}


def _meminfo_available() -> int | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_headroom() -> int | None:
    """What a memory cgroup (v2, else v1) still allows this process, if one limits it."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            lim = open(limit).read().strip()
            if lim == "max" or int(lim) >= 2**60:
                return None
            return int(lim) - int(open(usage).read().strip())
        except (OSError, ValueError):
            continue
    return None


def available_memory(device: str = "cpu") -> int | None:
    """Bytes free for a run on ``device``: a CUDA device's free memory; for the host, /proc/meminfo's
    MemAvailable (or free pages from ``os.sysconf`` where there is no /proc), capped by a cgroup limit.
    None when the OS does not say."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    free = _meminfo_available()
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            free = None
    headroom = _cgroup_headroom()
    return min(x for x in (free, headroom) if x is not None) if (free, headroom) != (None, None) else None


def check_memory(cfg: TrainConfig, vocab_size: int, world_size: int = 1, device: str = "cpu",
                 concurrent: int = 1, available: dict | None = None) -> dict:
    """Refuse (``RunError``) a run whose ``estimate_memory`` exceeds the memory available, before any work;
    ``concurrent`` runs of this size share it (a parallel sweep). ``available`` ({"host": bytes, "device": bytes})
    replaces what the OS reports (tests). Returns the estimate."""
    cuda = str(device).startswith("cuda")
    est = estimate_memory(cfg, vocab_size, world_size, cuda)
    available = available or {"host": available_memory("cpu"), "device": available_memory(device) if cuda else None}
    need = {"host": est["batch"] if cuda else est["total"], "device": est["total"] - est["batch"] if cuda else 0}
    for where in ("host", "device"):
        have = available.get(where)
        if have is None or need[where] * concurrent <= have:
            continue
        gib = {k: est[k] / _GIB for k in ("total", "weights", "optimizer", "activations", "batch")}
        runs = f"{concurrent} runs of " if concurrent > 1 else ""
        raise RunError(
            f"{runs}this config needs about {need[where] * concurrent / _GIB:.1f} GiB of "
            f"{'GPU' if where == 'device' else 'host'} memory (estimate: weights and gradients "
            f"{2 * gib['weights']:.2f} GiB for {est['parameters']:,} parameters, optimizer state "
            f"{gib['optimizer']:.2f} GiB, activations of a micro-batch of {est['micro_batch']:,} sequences x "
            f"{cfg.block_size} tokens {gib['activations']:.2f} GiB, the batch {gib['batch']:.2f} GiB) but "
            f"{have / _GIB:.1f} GiB is available; lower batch_size or block_size, raise gradient_accumulation_steps, "
            "or pass --no-memory-check if you know better")
    return est
