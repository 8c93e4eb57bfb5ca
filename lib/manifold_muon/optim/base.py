"""The one step every optimizer of this package takes; each optimizer supplies only its direction and
its retraction.

For each 2-D weight W with gradient g (same-shape weights of a param group are stepped as one batch):

    M   <- momentum * M + (1 - momentum) * g             the momentum buffer, an EMA (torch.optim.Muon's)
    G   <- (1 - momentum) g + momentum M  if nesterov  else  M
    D   <- direction(W, G)                               what makes each optimizer itself
    W   <- retract((1 - lr * weight_decay) W - lr * step_scale * D)

Settings shared by all, named as ``torch.optim.Muon`` names them where it has them: ``lr``,
``momentum``, ``nesterov``, ``weight_decay``, ``ns_steps`` (steps of the iterative msign), and
``msign`` (one of ``msign.METHODS``), ``msign_dtype`` (None: the compute dtype), ``nonfinite``.
Defaults: the package's one msign, ``msign.DEFAULT`` (Polar Express, 5 steps, compute precision).

Precision: the step is computed in float32 for bfloat16/float16 weights (momentum kept in float32) and
in the weights' own dtype otherwise, then written back.

Non-finite gradients (one policy for every optimizer): with ``nonfinite="raise"`` (default) a NaN or inf
in any gradient raises ``FloatingPointError`` before any weight or buffer is touched; with ``"skip"``
those weights (and their momentum) are left unchanged and the others step.

A param group holds its manifold one way: a ``Manifold`` instance under ``"manifold"`` (given as a name,
a ``spec()`` dict or an instance); ``state_dict()`` stores its spec and ``load_state_dict`` rebuilds it.
An optimizer declares the family of manifolds it works on (``manifold_family``) and refuses others when
the group is added. ``split=k`` steps each (D_out, D_in) weight as k row blocks, each on its own manifold
(the paper's "qkv-split" of a fused attention matrix is ``split=3``).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from ..manifolds import Manifold, get_manifold
from ..msign import DEFAULT, METHODS, msign

__all__ = ["MatrixOptimizer", "NONFINITE"]

NONFINITE = ("raise", "skip")


def _manifold_specs(optimizer, state_dict) -> None:
    """A state_dict post-hook: each param group's manifold as its ``spec()``."""
    for g in state_dict["param_groups"]:
        if isinstance(g.get("manifold"), Manifold):
            g["manifold"] = g["manifold"].spec()


class MatrixOptimizer(torch.optim.Optimizer):
    """Base class. Subclasses set ``manifold_family`` (None: no manifold) and ``default_manifold``,
    implement ``direction``, and may override ``retract``, ``step_scale`` and ``check_group``. A subclass's
    ``__init__`` names every setting it takes and passes its own ones on as keywords (``own``), so that a
    misspelt argument is a TypeError, never a silently ignored group key."""

    manifold_family: type[Manifold] | None = None
    default_manifold: str | None = None

    def __init__(self, params, lr: float, momentum: float, nesterov: bool, weight_decay: float,
                 msign: str = DEFAULT.method, ns_steps: int = DEFAULT.steps, msign_dtype: torch.dtype | None = None,
                 nonfinite: str = "raise", manifold=None, split: int = 1, **own):
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, msign=msign,
                        ns_steps=ns_steps, msign_dtype=msign_dtype, nonfinite=nonfinite,
                        manifold=manifold if manifold is not None else self.default_manifold, split=split, **own)
        self._guards = []  # made here, not in the step: torch.compile loses an optimizer attribute set in a step
        super().__init__(params, defaults)

    def __setstate__(self, state):  # unpickling and load_state_dict come here
        super().__setstate__(state)
        self.__dict__.setdefault("_guards", [])

    # ------------------------------------------------------------------ what a subclass supplies

    def direction(self, W: torch.Tensor, G: torch.Tensor, group: dict, states: list[dict]) -> torch.Tensor:
        """The step direction D for a batch of weights W (momentum directions G), same shape as W."""
        raise NotImplementedError

    def retract(self, X: torch.Tensor, group: dict) -> torch.Tensor:
        """Back onto the group's manifold (the identity without one)."""
        return X if group["manifold"] is None else group["manifold"].retract(X)

    def step_scale(self, shape, group: dict) -> float:
        """A per-shape factor on the learning rate (Muon's shape adjustment); 1 by default."""
        return 1.0

    def check_group(self, group: dict) -> None:
        """Refuse a subclass's own bad settings (raise ValueError with what to do instead)."""

    def update(self, W: torch.Tensor, G: torch.Tensor, group: dict, states: list[dict], shape) -> torch.Tensor:
        """The new weights retract((1 - lr * weight_decay) W - lr * step_scale * D), D = direction(W, G).
        A subclass that can fuse the direction and the retraction (``ManifoldMuon``) overrides this."""
        D = self.direction(W, G, group, states)
        lr = group["lr"]
        X = W.mul(1 - lr * group["weight_decay"]).add_(D, alpha=-(lr * self.step_scale(shape, group)))
        return self.retract(X, group)

    # ------------------------------------------------------------------ the shared machinery

    def msign_fn(self, group: dict):
        """The group's msign as a function of one (batched) matrix argument."""
        method, steps, dtype = group["msign"], group["ns_steps"], group["msign_dtype"]
        return lambda X: msign(X, method, steps, dtype)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        name = type(self).__name__
        try:
            self._check_common(group, name)
            self.check_group(group)
        except ValueError:
            self.param_groups.pop()
            raise

    def _check_common(self, group: dict, name: str) -> None:
        for p in group["params"]:
            if p.ndim != 2:
                raise ValueError(
                    f"{name} steps 2-D weight matrices, got a parameter of shape {tuple(p.shape)}; "
                    + ("give 1-D parameters (biases, norm gains) and embeddings to torch.optim.AdamW instead"
                       if p.ndim < 2 else "reshape it into a matrix (e.g. a conv kernel as (out, in*k*k)) or "
                                          "give it to AdamW"))
            if p.is_complex() or not p.is_floating_point():
                raise ValueError(f"{name} needs real floating-point parameters, got {p.dtype}")
        lr = group["lr"]
        if isinstance(lr, torch.Tensor) or not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
            raise ValueError(f"{name}: lr must be a finite float >= 0, got {lr!r}")
        if not (isinstance(group["momentum"], (int, float)) and 0 <= group["momentum"] < 1):
            raise ValueError(f"{name}: momentum must be in [0, 1), got {group['momentum']!r}")
        if not (isinstance(group["weight_decay"], (int, float)) and group["weight_decay"] >= 0):
            raise ValueError(f"{name}: weight_decay must be >= 0, got {group['weight_decay']!r}")
        if group["msign"] not in METHODS:
            raise ValueError(f"{name}: unknown msign {group['msign']!r}; choose one of {', '.join(METHODS)}")
        if not (isinstance(group["ns_steps"], int) and 1 <= group["ns_steps"] < 100):
            raise ValueError(f"{name}: ns_steps must be an int in 1..99, got {group['ns_steps']!r}")
        if group["nonfinite"] not in NONFINITE:
            raise ValueError(f"{name}: nonfinite must be 'raise' or 'skip' (skip leaves those weights and their "
                             f"momentum unchanged), got {group['nonfinite']!r}")
        k = group["split"]
        for p in group["params"]:
            if not (isinstance(k, int) and k >= 1 and p.shape[0] % k == 0):
                raise ValueError(f"{name}: split={k!r} must be a positive int dividing D_out={p.shape[0]} "
                                 "(e.g. 3 for GPT-2's fused c_attn = [W_q; W_k; W_v]); use split=1 for one matrix")
        if self.manifold_family is None:
            if group["manifold"] is not None:
                raise ValueError(f"{name} has no manifold, got manifold={group['manifold']!r}; leave it out")
            return
        group["manifold"] = get_manifold(group["manifold"])  # an unknown name lists the valid ones
        if not isinstance(group["manifold"], self.manifold_family):
            raise ValueError(f"{name} works on the {self.manifold_family.__name__} family, got "
                             f"{group['manifold']!r}; choose another manifold or another optimizer")

    def state_dict(self):
        """``torch.optim.Optimizer.state_dict`` with each manifold as its ``spec()`` (plain data, loadable with
        ``weights_only=True``), done as the first state_dict post-hook so that the user's post-hooks see it too."""
        handle = self.register_state_dict_post_hook(_manifold_specs, prepend=True)
        try:
            return super().state_dict()
        finally:
            handle.remove()

    def load_state_dict(self, state_dict):
        """Restore state saved by ``state_dict``, keeping each state tensor's saved dtype.

        ``torch.optim.Optimizer.load_state_dict`` casts floating-point state to its weight's dtype; these
        optimizers keep some state in higher precision (ManifoldMuon's float64 warm-start multipliers,
        float32 momentum of bfloat16 weights), and a cast would make a resumed run differ from one never
        stopped. The manifolds are rebuilt and the dtypes restored as the first load_state_dict post-hook (from
        the state dict as the pre-hooks left it), so that the user's post-hooks see the optimizer fully loaded."""
        loaded = {}
        handles = [self.register_load_state_dict_pre_hook(lambda opt, sd: loaded.update(sd=sd)),
                   self.register_load_state_dict_post_hook(lambda opt: opt._restore(loaded["sd"]), prepend=True)]
        try:
            super().load_state_dict(state_dict)
        finally:
            for handle in handles:
                handle.remove()

    def _restore(self, state_dict) -> None:
        for g in self.param_groups:
            if g.get("manifold") is not None:
                g["manifold"] = get_manifold(g["manifold"])
        params = {i: p for g_saved, g in zip(state_dict["param_groups"], self.param_groups)
                  for i, p in zip(g_saved["params"], g["params"])}
        for i, saved in state_dict["state"].items():
            live = self.state.get(params.get(i), {})
            for key, value in saved.items():
                if torch.is_tensor(value) and torch.is_tensor(live.get(key)) and live[key].dtype != value.dtype:
                    live[key] = value.to(device=live[key].device, copy=True)

    @torch.no_grad()
    def retract_parameters(self) -> None:
        """Put every weight on its group's manifold (call once after initialisation). A weight the retraction
        cannot put there (an all-zero matrix has no nearest point on a sphere) is refused with a ValueError
        before any weight is written. Reads the host once, at the end: this is not a per-step call."""
        new = []
        for group in self.param_groups:
            if group["manifold"] is None:
                continue
            M = group["manifold"]
            for p in group["params"]:
                W = self._blocks(p.to(self._compute_dtype(p)), group)
                R = self.retract(W, group)
                new.append((p, R.reshape(p.shape), M, R))
        if not new:
            return
        off = torch.stack([M.residual(R).amax() for _, _, M, R in new]).tolist()
        for (p, _, M, _), r in zip(new, off):
            if not r <= 0.5:  # a gross miss only (NaN included): rounding at any size is far below
                zero = not bool(p.detach().any())
                raise ValueError(f"{type(self).__name__}.retract_parameters: a weight of shape {tuple(p.shape)} does not "
                                 f"land on {M!r} (relative residual {r:.3g})"
                                 + ("; it is all zero, and a sphere has no nearest point to 0: initialise it "
                                    "(e.g. torch.nn.init.normal_) before retracting" if zero else
                                    "; initialise it with a full-rank random matrix before retracting"))
        for p, R, _, _ in new:
            p.copy_(R)

    def blocks(self, X: torch.Tensor, group: dict) -> torch.Tensor:
        """X (shaped like a weight of ``group``) as the matrices its manifold constrains: (k, D_out/k, D_in)
        row blocks with ``split=k``, else X itself."""
        return self._blocks(X, group)

    @staticmethod
    def _blocks(X: torch.Tensor, group: dict) -> torch.Tensor:
        k = group["split"]
        return X if k == 1 else X.reshape(*X.shape[:-2], k, X.shape[-2] // k, X.shape[-1])

    @staticmethod
    def _compute_dtype(p: torch.Tensor) -> torch.dtype:
        return torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype

    def _nonfinite_error(self, shape) -> FloatingPointError:
        return FloatingPointError(
            f"{type(self).__name__}: a gradient of shape {tuple(shape)} has NaN or inf; no weight was changed. "
            "Lower the lr, fix the loss, or pass nonfinite='skip' to leave such weights unchanged")

    def guard(self, ok: torch.Tensor, fix) -> None:
        """Called by ``update``: ``ok`` (a bool per matrix of the batch, a tensor) says where a fast path landed
        where it should; ``fix(bad)`` recomputes the batch's new weights the safe way where ``bad``. The
        optimizer reads every guard of a step, and every gradient's finiteness, in one host synchronisation."""
        self._guards.append((ok, fix))

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every parameter with a gradient. Nothing is written until the whole step is computed:
        then one host synchronisation reads, for all parameters at once, whether a gradient was non-finite
        (policy 'raise': raise, nothing changed; 'skip': those weights and their momentum stay) and whether
        every fast path's guard held (``guard``); then weights, momenta and state are written. The price is
        one transient copy of the stepped weights and their momenta."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        pending = []
        for group in self.param_groups:
            batches = defaultdict(list)  # same shape, dtype, device -> one batched step
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                batches[(p.shape, p.dtype, p.device)].append(p)
            pending += [self._step_batch(group, params) for params in batches.values()]
        flags = [torch.stack([~b["finite"].all() for b in pending])] if pending else []
        flags += [(~ok).any().reshape(1) for b in pending for ok, _ in b["guards"]]
        if flags and bool(torch.cat(flags).any()):  # the step's one host synchronisation
            for b in pending:
                if b["group"]["nonfinite"] == "raise" and not bool(b["finite"].all()):
                    raise self._nonfinite_error(b["params"][0].shape)
                for ok, fix in b["guards"]:
                    if not bool(ok.all()):
                        b["W_new"] = fix(~ok)
        for b in pending:
            self._commit(**b)
        return loss

    def _step_batch(self, group: dict, params: list) -> dict:
        """The new weights, momenta and state of one batch of same-shape weights, computed and not written."""
        dtype = self._compute_dtype(params[0])
        momentum = group["momentum"]
        states = [dict(self.state[p]) if p in self.state else {} for p in params]  # written in ``_commit``
        grads = torch.stack([p.grad.to(dtype) for p in params])
        finite = torch.isfinite(grads).flatten(1).all(dim=1)
        grads = torch.where(finite.view(-1, *[1] * (grads.dim() - 1)), grads, 0)  # a skipped one steps nowhere
        directions = []
        for p, state, grad in zip(params, states, grads):
            buf = state.get("momentum_buffer")
            buf = torch.zeros_like(p, dtype=dtype) if buf is None else buf
            state["momentum_buffer"] = buf.lerp(grad, 1 - momentum)
            directions.append(grad.lerp(state["momentum_buffer"], momentum) if group["nesterov"] else state["momentum_buffer"])
        W = self._blocks(torch.stack([p.to(dtype) for p in params]), group)
        G = self._blocks(torch.stack(directions), group)
        self._guards.clear()  # ``guard`` appends to it (a list kept from __init__: see there)
        W_new = self.update(W, G, group, states, params[0].shape)
        guards = list(self._guards)
        zero = G.flatten(1).abs().amax(dim=1) == 0  # a zero direction leaves a constrained weight as it was
        keep = ~finite | (zero & (group["manifold"] is not None))
        return dict(group=group, params=params, states=states, W_new=W_new, finite=finite, keep=keep,
                    guards=guards)

    def _commit(self, group, params, states, W_new, finite, keep, guards) -> None:
        for p, state, w, ok, stay in zip(params, states, W_new, finite, keep):
            old = self.state[p].get("momentum_buffer") if p in self.state else None  # a skipped one keeps its momentum
            state["momentum_buffer"] = torch.where(ok, state["momentum_buffer"], 0 if old is None else old)
            self.state[p].clear()  # the batch's copy is the whole new state: a key the update removed goes too
            self.state[p].update(state)
            p.copy_(torch.where(stay, p, w.reshape(p.shape).to(p.dtype)))
