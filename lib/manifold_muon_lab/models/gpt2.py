"""GPT-2 in one file: the model of the blog post "Different Layers, Different Manifolds".

Parameter names follow nanoGPT (``transformer.wte``, ``transformer.h.{i}.attn.c_attn``, ...), so a
reader who knows nanoGPT finds everything where they expect it and checkpoints line up.

* ``GPTConfig``           sizes, with presets up to GPT-2 small (``GPTConfig.gpt2_124m()``)
* ``CausalSelfAttention`` fused QKV projection ``c_attn``, output projection ``c_proj``
* ``MLP``                 ``c_fc`` (d -> 4d), GELU, ``c_proj`` (4d -> d)
* ``Block``               pre-LayerNorm residual block
* ``GPT``                 embeddings, blocks, final LayerNorm, ``lm_head`` tied to ``wte``
* ``attention_probe``     recomputes attention explicitly on a few rows and measures the softmax
                          (any model of this package; ``metrics.attention_summary`` condenses its output)

Training uses ``F.scaled_dot_product_attention``, which never materialises the attention matrix;
``attention_probe`` recomputes it for a sample of rows when the training loop wants to look.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["GPTConfig", "GPT", "attention_probe", "ROLES"]

# Every parameter of a model in this package has exactly one of these roles.
ROLES = ("attn_qkv", "attn_q", "attn_k", "attn_v", "attn_o", "mlp_up", "mlp_gate", "mlp_down",
         "embedding", "pos_embedding", "head", "norm", "bias")


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in the Linear layers and LayerNorms, as in GPT-2

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig: n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                f"choose n_head among the divisors of n_embd so that each head has n_embd // n_head dims"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")

    # Presets, smallest first. Each takes overrides, e.g. GPTConfig.nano(vocab_size=512).
    @classmethod
    def nano(cls, **kw) -> "GPTConfig":
        """A few seconds per hundred steps on a laptop CPU (0.2M non-embedding parameters)."""
        return cls(**{"block_size": 128, "vocab_size": 256, "n_layer": 3, "n_head": 4, "n_embd": 64, **kw})

    @classmethod
    def gpt2_124m(cls, **kw) -> "GPTConfig":
        """GPT-2 small: 12 layers, 12 heads, 768 wide, GPT-2's vocabulary of 50257 (124,439,808 parameters)."""
        return cls(**{"block_size": 1024, "vocab_size": 50257, "n_layer": 12, "n_head": 12, "n_embd": 768, **kw})



class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v fused
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def queries_keys_values(self, x: torch.Tensor):
        """q, k, v of shape (B, n_head, T, head_dim)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        return [t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.queries_keys_values(x)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# Role of each parameter, by the name of the module that owns it (the part before ".weight"/".bias").
_GPT_ROLES = {"wte": "embedding", "wpe": "pos_embedding", "c_attn": "attn_qkv", "attn.c_proj": "attn_o",
              "c_fc": "mlp_up", "mlp.c_proj": "mlp_down", "ln_1": "norm", "ln_2": "norm", "ln_f": "norm"}


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying: one matrix, two uses
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's initialisation: weights N(0, 0.02), residual projections (``c_proj``) N(0, 0.02 / sqrt(2 n_layer)),
        Linear biases 0, LayerNorm 1 and 0 (PyTorch's default)."""
        if self.transformer.wte.weight.is_meta:
            return  # built on the meta device (to count parameters): there are no values to set
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))
            elif name.endswith(".weight") and "ln_" not in name:
                nn.init.normal_(p, mean=0.0, std=0.02)
            elif name.endswith(".bias") and "ln_" not in name:
                nn.init.zeros_(p)

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Number of parameters, the tied lm_head counted once; optionally without wte and wpe."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.transformer.wte.weight.numel() + self.transformer.wpe.weight.numel()
        return n

    def param_roles(self) -> dict[str, str]:
        """Every parameter name -> its role (see ``ROLES``). Linear biases are "bias"; LayerNorm's are "norm"."""
        roles = {}
        for name, p in self.named_parameters():
            owner, kind = name.rsplit(".", 1)
            role = next((r for key, r in _GPT_ROLES.items() if owner.endswith(key)), None)
            if role is None:
                raise KeyError(f"GPT.param_roles: no role for parameter {name!r}; add its module to _GPT_ROLES")
            roles[name] = "bias" if kind == "bias" and role != "norm" else role
        return roles

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, vocab) for every position, and the mean cross-entropy if targets are given
        (targets equal to -1 are ignored)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}; crop the input")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


# ---------------------------------------------------------------------------------------------
# Looking inside the softmax. Works for any model of this package: its attention modules have a
# method ``queries_keys_values(x, ...)`` that takes the attention module's forward arguments.


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "queries_keys_values")]


@torch.no_grad()
def attention_probe(model: nn.Module, idx: torch.Tensor, layers=None, max_rows: int = 64) -> dict:
    """Recompute causal attention explicitly on a sample of rows and measure each row's softmax.

    One forward pass of ``model`` on ``idx`` (in eval mode, so no dropout) records what enters each
    attention layer; then, for up to ``max_rows`` rows (batch b, head h, query position t; evenly
    spaced over t first, so short and long rows both appear), with logits z_j = q_t.k_j / sqrt(head_dim)
    for j <= t and s = softmax(z):

    * ``logit_range``  max_j z_j - min_j z_j
    * ``entropy``      -sum_j s_j log s_j             (<= log(t + 1), the uniform row)
    * ``jacobian_fro`` ||diag(s) - s s^T||_F, the Frobenius norm of the softmax Jacobian ds/dz.
      Expanding the square, ||J||_F^2 = sum s^2 - 2 sum s^3 + (sum s^2)^2; since sum s = 1,
      Cauchy-Schwarz gives sum s^3 >= (sum s^2)^2, so ||J||_F^2 <= a - a^2 <= 1/4 with a = sum s^2.
    * ``row_length``   t + 1

    Returns ``{layer_index: {name: tensor of shape (rows,)}}`` (float32, on idx's device). A model
    wrapped by torch.compile or DistributedDataParallel is unwrapped and probed eagerly.
    """
    model = getattr(model, "_orig_mod", model)  # torch.compile
    model = getattr(model, "module", model)  # DistributedDataParallel
    modules = _attention_modules(model)
    if not modules:
        raise ValueError("attention_probe: the model has no attention module with queries_keys_values()")
    layers = list(range(len(modules))) if layers is None else [int(i) for i in layers]
    for i in layers:
        if not 0 <= i < len(modules):
            raise ValueError(f"attention_probe: layer {i} does not exist; the model has {len(modules)} layers")
    if max_rows < 1:
        raise ValueError(f"attention_probe: max_rows must be >= 1, got {max_rows}")

    inputs = {}

    def record(i, module, args, kwargs):
        inputs[i] = (args, kwargs)

    hooks = [modules[i].register_forward_pre_hook(partial(record, i), with_kwargs=True) for i in layers]
    was_training = model.training
    model.eval()
    try:
        model(idx)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)

    stats = {}
    for i in layers:
        args, kwargs = inputs[i]
        q, k, _ = modules[i].queries_keys_values(*args, **kwargs)  # (B, H, T, hd), k already per query head
        B, H, T, hd = q.shape
        n_rows = min(max_rows, B * H * T)
        flat = torch.linspace(0, B * H * T - 1, n_rows, device=q.device).round().long()
        t, h, b = flat // (H * B), (flat // B) % H, flat % B
        z = torch.einsum("rd,rsd->rs", q[b, h, t].float(), k[b, h].float()) / math.sqrt(hd)  # (rows, T)
        valid = torch.arange(T, device=q.device)[None, :] <= t[:, None]
        z_max = z.masked_fill(~valid, float("-inf")).amax(dim=1)
        z_min = z.masked_fill(~valid, float("inf")).amin(dim=1)
        s = torch.softmax(z.masked_fill(~valid, float("-inf")), dim=1)
        sum_s2, sum_s3 = (s**2).sum(1), (s**3).sum(1)
        stats[i] = {
            "logit_range": z_max - z_min,
            "entropy": torch.special.entr(s).sum(1) + 0.0,  # entr(x) = -x log x, entr(0) = 0; + 0.0: no -0.0
            "jacobian_fro": (sum_s2 - 2 * sum_s3 + sum_s2**2).clamp_min(0).sqrt(),
            "row_length": (t + 1).float(),
        }
    return stats
