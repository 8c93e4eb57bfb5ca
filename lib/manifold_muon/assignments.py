"""Which optimizer, on which manifold, for each parameter of a model: an *assignment*.

Every trainable parameter has a *role*. Block matrices (``attn_q``, ``attn_k``, ``attn_v``, ``attn_qkv``,
``attn_o``, ``mlp_up``, ``mlp_gate``, ``mlp_down``) go where the assignment says; everything else
(``embedding``, ``pos_embedding``, ``head``, ``norm``, ``bias``, ``other``) goes to AdamW, as in both papers.
``param_roles`` decides each parameter's role by the first of these that gives one:

1. ``roles=`` given by the caller: {parameter name or fnmatch glob ("blocks.*.mix.weight"): role}; a later
   entry overrides an earlier one, and an entry that matches no parameter is an error;
2. ``model.param_roles()`` when the model has it (the book's GPT-2 and Qwen3 do);
3. a naming preset, when the model's names are a preset's: nanoGPT / GPT-2 (``c_attn``, ``attn.c_proj``,
   ``c_fc``, ``mlp.c_proj``, ``wte``, ``wpe``, ``ln_*``) or Qwen3 / Llama (``q_proj`` ... ``down_proj``,
   ``embed_tokens``, ``norm``): once one block-matrix name of a preset is present, the preset's names
   (``infer_role``) give the role of every parameter they name;
4. the parameter's module and shape (``module_roles``), for any ``nn.Module``:

   * ``nn.MultiheadAttention``: ``in_proj_weight`` (3d x d = [W_q; W_k; W_v], like GPT-2's c_attn, so
     ``split_qkv`` applies) is ``attn_qkv``, ``q/k/v_proj_weight`` (kdim or vdim != d) are ``attn_q/k/v``,
     its ``out_proj`` weight is ``attn_o``;
   * the weight of any other ``nn.Linear`` is a hidden matrix, ``mlp_up`` when out_features >= in_features,
     else ``mlp_down``, except the *output head*: the model's last ``nn.Linear`` (in module order, not
     counting attention's out_proj) is ``head`` when its out_features equals the num_embeddings of one of
     the model's ``nn.Embedding`` (a projection back to the vocabulary). A head tied to the embedding is
     that embedding's tensor, listed once (as ``embedding``);
   * ``nn.Embedding`` / ``nn.EmbeddingBag`` weights are ``embedding``; every parameter of a norm layer
     (``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.GroupNorm``, batch and instance norms) and every non-2-D one of
     a class whose name contains "Norm" (a custom RMSNorm's gain) is ``norm``; a parameter named ``*bias``
     is ``bias``;
   * any other parameter that is not 2-D (a convolution's kernel, a gain or scalar outside a norm layer) is
     ``other``, for AdamW: the matrix optimizers take 2-D weights only;
   * any other 2-D parameter (an ``nn.Parameter`` of a custom module, an RNN's gate matrices) is refused
     with a ValueError that names it: pass ``roles={name: role}`` for it.

Parameters with ``requires_grad=False`` are left out (no optimizer holds them, ``retract_parameters`` does not
move them); every other parameter gets exactly one role, and tied parameters are one parameter.

An assignment maps selectors to rules, applied in order (a later entry overrides an earlier one for the
parameters both match):

    selector   "*" (every block matrix), "attn", "mlp", or a role ("attn_qkv", "mlp_up", ...)
    rule       (optimizer, manifold) or (optimizer, manifold, {options}); optimizer a key of OPTIMIZERS,
               manifold a registered name (None for Muon), options keyword arguments of that optimizer

Named assignments (``ASSIGNMENTS``): the blog post's five ("unconstrained", "all_stiefel", "all_dgram",
"hetero" = attention Stiefel / MLP DGram, "hetero_inv" = the reverse) and the paper's ("muon", "macro_fro",
"macro_spec", "muonh_fro", "muonh_spec", "sso", "fso"). Both papers' Muon baselines are torch.optim.Muon,
so their Muon rules carry ``TORCH_MUON`` (Newton-Schulz in bfloat16).

GPT-2's fused c_attn (2304 x 768 = [W_q; W_k; W_v]) is one matrix on one manifold by default: that is what
the post evidently did (its Fig. 7 shows "layer 0, c_attn" with 768 singular values, the spectrum of
the fused matrix). ``split_qkv=True`` instead puts each of W_q, W_k, W_v on its own sphere (the paper's
"qkv-split", after [59]); it is implemented for the sphere optimizers (MACRO, MuonH, SSO, FSO) only.
"""

from __future__ import annotations

import difflib
import fnmatch
import inspect
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from .manifolds import available_manifolds, get_manifold
from .optim import FSO, MACRO, SSO, TORCH_MUON, ManifoldMuon, MatrixOptimizer, Muon, MuonH

__all__ = ["ASSIGNMENTS", "MATRIX_ROLES", "ADAMW_ROLES", "OPTIMIZERS", "Assignment", "build_optimizers",
           "describe", "plan", "infer_role", "module_roles", "param_roles", "retract_parameters"]

MATRIX_ROLES = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_o", "mlp_up", "mlp_gate", "mlp_down")
ADAMW_ROLES = ("embedding", "pos_embedding", "head", "norm", "bias", "other")
OPTIMIZERS = {"muon": Muon, "manifold_muon": ManifoldMuon, "macro": MACRO, "muonh": MuonH, "sso": SSO, "fso": FSO}
_SPLITTABLE = ("macro", "muonh", "sso", "fso")


@dataclass(frozen=True)
class Assignment:
    """Ordered (selector, rule) pairs and the AdamW settings for everything that is not a block matrix."""

    name: str
    rules: tuple
    adamw: dict = field(default_factory=dict)


_POST_ADAMW = dict(lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)  # nanoGPT's defaults, as the post says
_PAPER_ADAMW = dict(lr=5e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)  # the paper, App. D (its weight decay unstated)
_TORCH_MUON = ("muon", None, TORCH_MUON)


def _all(rule, adamw):
    return (("*", rule),), adamw


ASSIGNMENTS = {
    "unconstrained": Assignment("unconstrained", *_all(_TORCH_MUON, _POST_ADAMW)),
    "all_stiefel": Assignment("all_stiefel", *_all(("manifold_muon", "stiefel"), _POST_ADAMW)),
    "all_dgram": Assignment("all_dgram", *_all(("manifold_muon", "dgram"), _POST_ADAMW)),
    "hetero": Assignment("hetero", (("attn", ("manifold_muon", "stiefel")), ("mlp", ("manifold_muon", "dgram"))),
                         _POST_ADAMW),
    "hetero_inv": Assignment("hetero_inv", (("attn", ("manifold_muon", "dgram")),
                                            ("mlp", ("manifold_muon", "stiefel"))), _POST_ADAMW),
    "muon": Assignment("muon", *_all(_TORCH_MUON, _PAPER_ADAMW)),
    "macro_fro": Assignment("macro_fro", *_all(("macro", "frobenius_sphere"), _PAPER_ADAMW)),
    "macro_spec": Assignment("macro_spec", *_all(("macro", "spectral_sphere"), _PAPER_ADAMW)),
    "muonh_fro": Assignment("muonh_fro", *_all(("muonh", "frobenius_sphere"), _PAPER_ADAMW)),
    "muonh_spec": Assignment("muonh_spec", *_all(("muonh", "spectral_sphere"), _PAPER_ADAMW)),
    "sso": Assignment("sso", *_all(("sso", "spectral_sphere"), _PAPER_ADAMW)),
    "fso": Assignment("fso", *_all(("fso", "frobenius_sphere"), _PAPER_ADAMW)),
}

# nanoGPT (GPT-2) and Qwen3 names -> role, for models without param_roles(); first match wins
_NAME_PATTERNS = (
    (r"(^|\.)c_attn\.weight$", "attn_qkv"), (r"attn\.c_proj\.weight$", "attn_o"),
    (r"mlp\.c_fc\.weight$", "mlp_up"), (r"mlp\.c_proj\.weight$", "mlp_down"),
    (r"(^|\.)q_proj\.weight$", "attn_q"), (r"(^|\.)k_proj\.weight$", "attn_k"),
    (r"(^|\.)v_proj\.weight$", "attn_v"), (r"(^|\.)o_proj\.weight$", "attn_o"),
    (r"(^|\.)gate_proj\.weight$", "mlp_gate"), (r"(^|\.)up_proj\.weight$", "mlp_up"),
    (r"(^|\.)down_proj\.weight$", "mlp_down"),
    (r"(^|\.)(wte|embed|embed_tokens)\.weight$", "embedding"),
    (r"(^|\.)wpe\.weight$", "pos_embedding"), (r"(^|\.)lm_head\.weight$", "head"),
    (r"(ln_\w+|norm\w*)\.(weight|bias)$", "norm"), (r"\.bias$", "bias"),
)
# a model is named after a preset when one of its parameters has one of these (block-matrix) names
_PRESET_MARKERS = tuple(pattern for pattern, role in _NAME_PATTERNS if role in MATRIX_ROLES)
_NORM_TYPES = tuple(t for t in (nn.LayerNorm, getattr(nn, "RMSNorm", None), nn.GroupNorm, nn.LocalResponseNorm,
                                nn.modules.batchnorm._NormBase) if t is not None)
_ROLE_LIST = (f"a block-matrix role for the matrix optimizer ({', '.join(MATRIX_ROLES)}) "
              f"or an AdamW role ({', '.join(ADAMW_ROLES)})")


def infer_role(name: str, p: torch.Tensor) -> str:
    """The role of parameter ``name`` from nanoGPT / Qwen3 naming (the presets); an unknown 2-D name is an error.

    ``param_roles`` uses these names only for a model named after a preset, and the parameter's module and
    shape (``module_roles``) for anything else."""
    role = _preset_role(name)
    if role is not None:
        return role
    if p.ndim < 2:
        return "norm" if "norm" in name or "ln" in name else "bias"
    raise ValueError(f"no role for parameter {name!r} of shape {tuple(p.shape)}: give the model a param_roles() "
                     f"method or pass roles={{name: role}} with {_ROLE_LIST}")


def _preset_role(name: str) -> str | None:
    for pattern, role in _NAME_PATTERNS:
        if re.search(pattern, name):
            return role
    return None


def _is_norm(module: nn.Module, p: torch.Tensor) -> bool:
    """A norm layer's parameter: any of torch's norms, or a gain / shift (not 2-D) of a class named *Norm*."""
    return isinstance(module, _NORM_TYPES) or (p.ndim != 2 and "norm" in type(module).__name__.lower())


def module_roles(model: torch.nn.Module) -> dict:
    """{id(parameter): role} from the module that holds each parameter and its shape, no names (rule 4 of the
    module docstring); a 2-D parameter of no nn.Linear, nn.Embedding or nn.MultiheadAttention gets None."""
    modules = list(model.modules())
    vocab = {m.num_embeddings for m in modules if isinstance(m, (nn.Embedding, nn.EmbeddingBag))}
    out_proj = {id(m.out_proj) for m in modules if isinstance(m, nn.MultiheadAttention)}
    linears = [m for m in modules if isinstance(m, nn.Linear) and id(m) not in out_proj]
    head = linears[-1] if linears and linears[-1].out_features in vocab else None
    mha = {"in_proj_weight": "attn_qkv", "q_proj_weight": "attn_q", "k_proj_weight": "attn_k",
           "v_proj_weight": "attn_v"}
    roles, embeddings = {}, {}
    for m in modules:
        for attr, p in m.named_parameters(recurse=False):
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and attr == "weight":
                role = embeddings[id(p)] = "embedding"  # wins over the Linear that shares it (a tied head)
            elif isinstance(m, nn.MultiheadAttention) and attr in mha:
                role = mha[attr]
            elif _is_norm(m, p):
                role = "norm"
            elif attr.endswith("bias"):
                role = "bias"
            elif isinstance(m, nn.Linear) and attr == "weight" and p.ndim == 2:
                role = ("attn_o" if id(m) in out_proj else "head" if m is head
                        else "mlp_up" if m.out_features >= m.in_features else "mlp_down")
            elif p.ndim != 2:
                role = "other"
            else:
                role = None
            roles.setdefault(id(p), role)
    return {**roles, **embeddings}


def _explicit_roles(names: list[str], roles: dict | None) -> dict:
    """{name: role} from the caller's {name or glob: role}, later entries overriding earlier ones."""
    out = {}
    for key, role in (roles or {}).items():
        hits = [n for n in names if n == key or fnmatch.fnmatchcase(n, key)]
        if not hits:
            close = difflib.get_close_matches(key, names, n=3)
            raise ValueError(f"roles={{{key!r}: {role!r}}} matches no parameter of the model"
                             + (f" (did you mean {', '.join(map(repr, close))}?)" if close else "")
                             + "; give a parameter name of model.named_parameters() or an fnmatch glob of them")
        out.update(dict.fromkeys(hits, role))
    return out


def param_roles(model: torch.nn.Module, roles: dict | None = None) -> dict:
    """{name: role} for every trainable (deduplicated, so a tied head appears once) parameter of ``model``:
    from ``roles=`` (names or globs), else ``model.param_roles()``, else the nanoGPT / Qwen3 names when the
    model has them, else the parameter's module and shape (see the module docstring)."""
    named = list(model.named_parameters())
    explicit = _explicit_roles([n for n, _ in named], roles)
    found = dict(model.param_roles()) if callable(getattr(model, "param_roles", None)) else {}
    preset = any(re.search(pattern, n) for n, _ in named for pattern in _PRESET_MARKERS)
    by_module = None
    out = {}
    for name, p in named:
        if not p.requires_grad:
            continue
        role = explicit.get(name) or found.get(name) or (_preset_role(name) if preset else None)
        if role is None:
            by_module = module_roles(model) if by_module is None else by_module
            role = by_module.get(id(p))
        if role is None:
            owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            raise ValueError(f"no role for parameter {name!r} of shape {tuple(p.shape)} (of a "
                             f"{type(owner).__name__}): a 2-D parameter that is not the weight of an nn.Linear, "
                             f"nn.Embedding or nn.MultiheadAttention is not classified by shape; pass "
                             f"roles={{{name!r}: role}} (or a glob for several) with {_ROLE_LIST}, "
                             "or give the model a param_roles() method")
        if role not in MATRIX_ROLES + ADAMW_ROLES:
            raise ValueError(f"parameter {name!r} has unknown role {role!r}; "
                             f"choose one of {', '.join(MATRIX_ROLES + ADAMW_ROLES)}")
        out[name] = role
    return out


def _matches(selector, role: str) -> bool:
    if selector == "*":
        return True
    if selector in ("attn", "mlp"):
        return role.startswith(selector + "_")
    if selector in MATRIX_ROLES:
        return role == selector
    if selector in ADAMW_ROLES:
        raise ValueError(f"role {selector!r} always goes to AdamW; an assignment selects block matrices only "
                         f"({', '.join(MATRIX_ROLES)})")
    raise ValueError(f"unknown selector {selector!r}; use '*', 'attn', 'mlp' or a role ({', '.join(MATRIX_ROLES)})")


def _rule(rule):
    rule = (rule, None) if isinstance(rule, str) else tuple(rule)
    if len(rule) == 2:
        rule = (*rule, {})
    opt, manifold, options = rule
    if opt not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {opt!r}; choose one of {', '.join(OPTIMIZERS)} "
                         "(AdamW takes the non-matrix parameters by itself)")
    if opt == "muon" and manifold is not None:
        raise ValueError(f"Muon has no manifold, got {manifold!r}; use manifold None or another optimizer")
    if opt != "muon" and manifold not in available_manifolds():
        raise ValueError(f"unknown manifold {manifold!r} for {opt}; choose one of {', '.join(available_manifolds())}")
    return opt, manifold, dict(options)


def _assignment(assignment) -> Assignment:
    if isinstance(assignment, Assignment):
        return assignment
    if isinstance(assignment, str):
        if assignment not in ASSIGNMENTS:
            raise ValueError(f"unknown assignment {assignment!r}; choose one of {', '.join(ASSIGNMENTS)} "
                             "or pass a mapping {selector: (optimizer, manifold)}")
        return ASSIGNMENTS[assignment]
    if isinstance(assignment, dict):
        return Assignment("custom", tuple(assignment.items()), dict(_POST_ADAMW))
    raise TypeError(f"an assignment is a name ({', '.join(ASSIGNMENTS)}), a dict or an Assignment, "
                    f"got {type(assignment).__name__}")


def plan(model: torch.nn.Module, assignment, roles: dict | None = None, split_qkv: bool = False) -> list[dict]:
    """One row per parameter: name, shape, role, optimizer ("adamw" for non-matrices), manifold, options."""
    a = _assignment(assignment)
    rules = [(sel, _rule(rule)) for sel, rule in a.rules]
    params = dict(model.named_parameters())
    rows = []
    for name, role in param_roles(model, roles).items():
        p = params[name]
        opt, manifold, options = "adamw", None, {}
        if role in MATRIX_ROLES:
            if p.ndim != 2:
                raise ValueError(f"{name!r} has role {role!r} but shape {tuple(p.shape)}; block matrices are 2-D")
            chosen = None
            for sel, rule in rules:
                if _matches(sel, role):
                    chosen = rule
            if chosen is None:
                raise ValueError(f"assignment {a.name!r} selects no optimizer for {name!r} (role {role}); "
                                 "add a '*' entry or one that matches it")
            opt, manifold, options = chosen
            if split_qkv and role == "attn_qkv":
                if opt not in _SPLITTABLE:
                    raise ValueError(f"split_qkv is implemented for {', '.join(_SPLITTABLE)}, not {opt}; "
                                     "use split_qkv=False (one fused c_attn matrix)")
                options = {**options, "split": 3}
        rows.append(dict(name=name, shape=tuple(p.shape), role=role, optimizer=opt, manifold=manifold,
                         options=options))
    return rows


def _accepted(cls) -> set:
    """The keyword arguments ``cls(params, ...)`` takes (its own and its bases')."""
    names = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None and issubclass(klass, MatrixOptimizer):
            names |= {n for n, q in inspect.signature(init).parameters.items()
                      if q.kind not in (q.VAR_KEYWORD, q.VAR_POSITIONAL) and n not in ("self", "params")
                      and not n.startswith("_")}
    return names


def build_optimizers(model: torch.nn.Module, assignment, lr: float = 0.02, adamw_lr: float | None = None,
                     roles: dict | None = None, split_qkv: bool = False, adamw: dict | None = None,
                     manifold_args: dict | None = None, inner: str | None = None, classes: dict | None = None,
                     **overrides) -> list[torch.optim.Optimizer]:
    """[one optimizer per matrix-optimizer kind used (a param group per manifold and options), AdamW].

    ``lr`` goes to every matrix optimizer; ``overrides`` go to each matrix optimizer that accepts them
    (e.g. ``inner_steps=20`` to ManifoldMuon, ``c=2.0`` to the sphere optimizers), over the assignment's
    own options (``msign_dtype=torch.float32`` replaces the bfloat16 of the post's Muon); one accepted by
    none is an error. ``manifold_args`` go to every manifold of the assignment (e.g. ``{"r": 2.0}``, the radius
    factor of the paper's spheres). ``adamw_lr`` and ``adamw`` (a dict) change the AdamW settings of the
    assignment (the post's use nanoGPT's, the paper's its App. D values). AdamW's weight decay applies to
    2-D parameters (embeddings, head) only, as in nanoGPT. Call ``retract_parameters(optimizers)`` once to
    put the weights on their manifolds.

    ``inner`` picks Manifold Muon's inner solver wherever the assignment uses it and is ignored where it
    does not (so one setting trains all five of the post's assignments): None or "gram_admm" (the
    library's default, a certified Gram-space solve), "lean" (about Muon's price, certified gap ~0.1),
    "exact" (ADMM then Newton on the dual, gap 1e-6), "post" (the post's recipe, ``POST_RECIPE``: 20 cold
    dual-ascent steps, alpha 0.1 linearly decayed, Newton-Schulz msign, raw momentum), "dual_ascent"
    (the same on unit-RMS G with the package's msign) or "admm".

    ``classes`` replaces the class behind a name of ``OPTIMIZERS`` for this call, e.g. ``{"muon": NoisyMuon}``:
    every rule of the assignment that names ``"muon"`` builds a ``NoisyMuon`` (the registry is not changed).
    """
    registry = dict(OPTIMIZERS)
    for name, cls in (classes or {}).items():
        if name not in OPTIMIZERS:
            raise ValueError(f"classes: {name!r} is not a name of the optimizer registry; choose one of "
                             f"{', '.join(OPTIMIZERS)}")
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            raise ValueError(f"classes[{name!r}]={cls!r} must be an optimizer class (a torch.optim.Optimizer)")
        registry[name] = cls
    if "manifold" in overrides:
        raise ValueError("build_optimizers: the assignment chooses each parameter's manifold, so manifold= would be "
                         "ignored; pass an assignment whose rules name the manifold you want (see ASSIGNMENTS), or "
                         "manifold_args= to change the assignment's manifolds' arguments")
    if inner is not None:
        overrides = {**overrides, "inner": inner} if any(
            r["optimizer"] == "manifold_muon" for r in plan(model, assignment, roles, split_qkv)) else overrides
    a = _assignment(assignment)
    rows = plan(model, a, roles, split_qkv)
    used = {registry[r["optimizer"]] for r in rows if r["optimizer"] != "adamw"}
    accepted = set().union(*[_accepted(c) for c in used]) if used else set()
    unknown = set(overrides) - accepted
    if unknown:
        raise ValueError(f"no optimizer of assignment {a.name!r} takes {', '.join(sorted(unknown))}; "
                         f"they take {', '.join(sorted(accepted))}")
    params = dict(model.named_parameters())
    groups: dict[str, dict] = {}
    decay, no_decay = [], []
    for r in rows:
        p = params[r["name"]]
        if r["optimizer"] == "adamw":
            (decay if p.ndim >= 2 else no_decay).append(p)
            continue
        key = (r["manifold"], tuple(sorted(r["options"].items())))
        groups.setdefault(r["optimizer"], {}).setdefault(key, []).append(p)
    optimizers = []
    for opt_name, by_key in groups.items():
        cls = registry[opt_name]
        kwargs = {k: v for k, v in overrides.items() if k in _accepted(cls)}
        param_groups = []
        for (manifold, options), ps in by_key.items():
            # the caller's overrides win over the assignment's own options (e.g. msign_dtype over Muon's bf16)
            g = {"params": ps, **dict(options), **kwargs}
            if manifold is not None:
                g["manifold"] = _manifold(manifold, manifold_args)
            param_groups.append(g)
        optimizers.append(cls(param_groups, lr=lr, **kwargs))
    settings = {**a.adamw, **(adamw or {})}
    if adamw_lr is not None:
        settings["lr"] = adamw_lr
    wd = settings.pop("weight_decay", 0.0)
    adamw_groups = [g for g in ({"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0})
                    if g["params"]]
    if adamw_groups:
        optimizers.append(torch.optim.AdamW(adamw_groups, **settings))
    return optimizers


def _manifold(name: str, manifold_args: dict | None):
    try:
        return get_manifold(name, **(manifold_args or {}))
    except TypeError as e:
        raise ValueError(f"manifold {name!r} does not take manifold_args {manifold_args} ({e}); give each manifold "
                         "only arguments it takes (the spheres take r, radius; see manifold_muon.manifolds)") from None


@torch.no_grad()
def retract_parameters(optimizers) -> None:
    """Put every manifold-constrained weight on its manifold (once, after initialisation)."""
    for opt in optimizers:
        if isinstance(opt, MatrixOptimizer):
            opt.retract_parameters()


def describe(assignment, model: torch.nn.Module, roles: dict | None = None, split_qkv: bool = False) -> str:
    """A plain-text table: parameter name, shape, role, optimizer, manifold (then the frozen parameters, if any)."""
    rows = plan(model, assignment, roles, split_qkv)
    table = [("name", "shape", "role", "optimizer", "manifold")] + [
        (r["name"], "x".join(map(str, r["shape"])), r["role"], r["optimizer"],
         (r["manifold"] or "-") + (f" (split {r['options']['split']})" if "split" in r["options"] else ""))
        for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    return text + (f"\nfrozen (requires_grad=False), no optimizer: {', '.join(frozen)}" if frozen else "")
