"""A Qwen3-like model in one file: the model of "Demystifying Manifold Constraints in LLM Pre-training".

The paper (Appendix D.3) trains "QWEN3-like architectures ... with SwiGLU activations, Grouped-Query
Attention (GQA), Rotary Positional Embeddings (RoPE), and pre-normalization RMSNorm", tied embeddings,
at the sizes of its Table 10. Like Qwen3 it also normalises queries and keys per head (QK-norm).

* ``Qwen3Config``      sizes; presets ``qwen3_120m``, ``qwen3_330m``, ``qwen3_1b`` (Table 10) and small ones
* ``RMSNorm``          x / rms(x), times a learnable gain unless ``learnable=False``
* ``Rotary``           RoPE cos/sin tables, computed once for ``block_size`` positions
* ``Attention``        ``q_proj``, ``k_proj``, ``v_proj`` (n_kv_head heads), ``o_proj``; QK-norm; RoPE
* ``SwiGLU``           ``down_proj(silu(gate_proj x) * up_proj x)``, or the paper's Norm-Gated SwiGLU
* ``DecoderLayer``     one residual block, standard or RMSNorm-free
* ``Qwen3``            ``embed``, ``layers``, ``norm``, ``lm_head`` tied to ``embed``

Choices the paper leaves open (stated here, and checked in tests/test_models.py):

* head_dim = n_embd / n_head (128, 64, 128 for the three presets), as in the nanochat code base
  the paper trains with. Qwen3 itself fixes head_dim = 128, but that would make the "330M" preset
  405M parameters, so the paper's count points to n_embd / n_head.
* ffn_dim = 8/3 n_embd rounded up to a multiple of 64 (2048, 2752, 5504): the LLaMA convention that
  gives a SwiGLU MLP (three matrices) the 8 d^2 weights of a 4x GELU MLP (two matrices). With it the
  presets have 116.5M, 330.0M and 1.031B parameters (tied embedding counted once), the closest of the
  usual conventions to the paper's 120M / 330M / 1B; Qwen3's own ratio (3 d) gives 123.6M, 353.6M and 1.110B.
* RoPE base 10000 (Qwen3 uses 10^6 for long contexts; at 1024 positions 10^4 is the usual choice).
* Linear weights start at N(0, sigma^2), sigma = min(sqrt(D_out / D_in), 1) / sqrt(D_in): the
  initialisation of the paper's Appendix D.2; the embedding starts at N(0, 0.02^2) as in GPT-2.

``rmsnorm_free=True`` is the architecture of the paper's Section 4.2 and Table 2: no learnable
normalisation anywhere. What remains, all parameter-free:

* an RMSNorm right after the embedding ("guarantees the Theta(1) input scale for the first block");
* an RMSNorm on the output of the attention block, before it joins the residual stream (Table 2's
  "Attn:Norm"; we read "immediately after the attention block" as normalising the block's output);
* QK-norm, without gains;
* the Norm-Gated SwiGLU of eq (3), Y = (Swish(X W1^T) / ||Swish(X W1^T)||_RMS) * (X W2^T), where the RMS
  is taken over the ffn features of each token separately (W1 = gate_proj, W2 = up_proj);
* an RMSNorm before the tied output head. The paper does not mention the final norm; without it the
  logits would scale with the residual stream, and nanochat (the paper's code base) has a
  parameter-free one there, so we keep it.

Blocks then read ``x = x + norm(attn(x)); x = x + mlp(x)`` with no pre-norms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .gpt2 import attention_probe  # works on any model of this package; here for models.qwen3 users

__all__ = ["Qwen3Config", "Qwen3", "RMSNorm", "attention_probe"]


def default_ffn_dim(n_embd: int, multiple_of: int = 64) -> int:
    """8/3 n_embd rounded up to a multiple of ``multiple_of``."""
    return multiple_of * math.ceil(8 * n_embd / 3 / multiple_of)


@dataclass
class Qwen3Config:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 6
    n_kv_head: int = 3
    n_embd: int = 768
    head_dim: int | None = None  # None: n_embd // n_head
    ffn_dim: int | None = None  # None: default_ffn_dim(n_embd)
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    rmsnorm_free: bool = False

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Qwen3Config.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.head_dim is None:
            if self.n_embd % self.n_head != 0:
                raise ValueError(
                    f"Qwen3Config: n_embd={self.n_embd} is not divisible by n_head={self.n_head}; choose n_head "
                    f"among the divisors of n_embd, or set head_dim explicitly"
                )
            self.head_dim = self.n_embd // self.n_head
        if self.head_dim % 2 != 0:
            raise ValueError(f"Qwen3Config: head_dim={self.head_dim} must be even, RoPE rotates pairs of features")
        if self.n_head % self.n_kv_head != 0:
            raise ValueError(
                f"Qwen3Config: n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}; grouped-query "
                f"attention shares each key/value head among n_head // n_kv_head query heads, so pick n_kv_head "
                f"among the divisors of n_head"
            )
        if self.ffn_dim is None:
            self.ffn_dim = default_ffn_dim(self.n_embd)
        if self.ffn_dim < 1:
            raise ValueError(f"Qwen3Config.ffn_dim must be positive, got {self.ffn_dim}")

    # Presets. Table 10 of the paper: the three sizes of its Section 5 (sequence 1024, vocabulary 50304).
    @classmethod
    def qwen3_120m(cls, **kw) -> "Qwen3Config":
        return cls(**{"n_embd": 768, "n_layer": 12, "n_head": 6, "n_kv_head": 3, **kw})

    @classmethod
    def qwen3_330m(cls, **kw) -> "Qwen3Config":
        """Also the size of the RMSNorm-free experiment (Table 5): add ``rmsnorm_free=True``."""
        return cls(**{"n_embd": 1024, "n_layer": 24, "n_head": 16, "n_kv_head": 8, **kw})

    @classmethod
    def qwen3_1b(cls, **kw) -> "Qwen3Config":
        return cls(**{"n_embd": 2048, "n_layer": 20, "n_head": 16, "n_kv_head": 8, **kw})

    @classmethod
    def nano(cls, **kw) -> "Qwen3Config":
        """For CPU tests and laptop runs: 3 layers, 4 query heads sharing 2 key/value heads, 64 wide."""
        return cls(**{"block_size": 128, "vocab_size": 256, "n_layer": 3, "n_head": 4, "n_kv_head": 2,
                      "n_embd": 64, **kw})



class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) over the last dimension, times a gain when ``learnable``."""

    def __init__(self, dim: int, eps: float, learnable: bool = True):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if learnable else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the gain in x's dtype: under bfloat16 autocast x is bfloat16 and the float32 gain would send rms_norm to
        # its slower unfused path (with a warning every call); float32 training is unchanged (the cast is a no-op)
        w = self.weight if self.weight is None or self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        return F.rms_norm(x, (self.dim,), w, self.eps)


class Rotary(nn.Module):
    """cos and sin of the angle t * base^(-2i / head_dim) for position t and frequency i."""

    def __init__(self, head_dim: int, block_size: int, base: float):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(block_size, dtype=torch.float32), inv_freq)  # (T, head_dim / 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate x of shape (B, heads, T, head_dim): its two halves are the two coordinates of each pair."""
        T = x.shape[-2]
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: Qwen3Config, rotary: Rotary):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        d, hd = config.n_embd, config.head_dim
        self.q_proj = nn.Linear(d, config.n_head * hd, bias=False)
        self.k_proj = nn.Linear(d, config.n_kv_head * hd, bias=False)
        self.v_proj = nn.Linear(d, config.n_kv_head * hd, bias=False)
        self.o_proj = nn.Linear(config.n_head * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, config.norm_eps, learnable=not config.rmsnorm_free)
        self.k_norm = RMSNorm(hd, config.norm_eps, learnable=not config.rmsnorm_free)
        self.rotary = [rotary]  # in a list: shared by all layers, registered once by the model

    def queries_keys_values(self, x: torch.Tensor):
        """q, k, v of shape (B, n_head, T, head_dim): QK-normed, rotated, keys and values repeated per group."""
        B, T, _ = x.shape
        rotary = self.rotary[0]
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = rotary(self.q_norm(q)), rotary(self.k_norm(k))
        group = self.n_head // self.n_kv_head
        return q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.queries_keys_values(x)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


class SwiGLU(nn.Module):
    """down_proj(silu(gate_proj x) * up_proj x); with ``norm_gated`` the silu branch is first divided by
    its RMS over the ffn features of each token (the paper's eq (3))."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.ffn_dim, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.ffn_dim, bias=False)
        self.down_proj = nn.Linear(config.ffn_dim, config.n_embd, bias=False)
        self.norm_gated, self.eps = config.rmsnorm_free, config.norm_eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.silu(self.gate_proj(x))
        if self.norm_gated:
            gate = F.rms_norm(gate, (gate.shape[-1],), eps=self.eps)
        return self.down_proj(gate * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config, rotary: Rotary):
        super().__init__()
        self.rmsnorm_free = config.rmsnorm_free
        self.attn = Attention(config, rotary)
        self.mlp = SwiGLU(config)
        if config.rmsnorm_free:
            self.attn_out_norm = RMSNorm(config.n_embd, config.norm_eps, learnable=False)
        else:
            self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
            self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rmsnorm_free:
            x = x + self.attn_out_norm(self.attn(x))
            return x + self.mlp(x)
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


# Role of each parameter, by the last part of the name of the module that owns it.
_QWEN3_ROLES = {"embed": "embedding", "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
                "o_proj": "attn_o", "gate_proj": "mlp_gate", "up_proj": "mlp_up", "down_proj": "mlp_down",
                "q_norm": "norm", "k_norm": "norm", "attn_norm": "norm", "mlp_norm": "norm", "norm": "norm"}


class Qwen3(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        self.rotary = Rotary(config.head_dim, config.block_size, config.rope_base)
        self.embed = nn.Embedding(config.vocab_size, config.n_embd)
        self.embed_norm = RMSNorm(config.n_embd, config.norm_eps, learnable=False) if config.rmsnorm_free else None
        self.layers = nn.ModuleList([DecoderLayer(config, self.rotary) for _ in range(config.n_layer)])
        self.norm = RMSNorm(config.n_embd, config.norm_eps, learnable=not config.rmsnorm_free)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight  # tied embeddings (Table 10: "Embedding Tie: True")
        self._init_weights()

    def _init_weights(self) -> None:
        """Linear weights N(0, sigma^2), sigma = min(sqrt(D_out / D_in), 1) / sqrt(D_in) (paper, Appendix D.2);
        embedding N(0, 0.02^2); norm gains 1."""
        if self.embed.weight.is_meta:
            return  # built on the meta device (to count parameters): there are no values to set
        for module in self.modules():
            if isinstance(module, nn.Linear) and module is not self.lm_head:
                d_out, d_in = module.weight.shape
                nn.init.normal_(module.weight, std=min(math.sqrt(d_out / d_in), 1.0) / math.sqrt(d_in))
        nn.init.normal_(self.embed.weight, std=0.02)

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Number of parameters, the tied lm_head counted once; optionally without the embedding."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed.weight.numel() if exclude_embeddings else n

    def param_roles(self) -> dict[str, str]:
        """Every parameter name -> its role (see ``manifold_muon.models.ROLES``). The tied head is ``embed.weight``."""
        roles = {}
        for name, _ in self.named_parameters():
            owner = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
            if owner not in _QWEN3_ROLES:
                raise KeyError(f"Qwen3.param_roles: no role for parameter {name!r}; add its module to _QWEN3_ROLES")
            roles[name] = _QWEN3_ROLES[owner]
        return roles

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, vocab) for every position, and the mean cross-entropy if targets are given
        (targets equal to -1 are ignored)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}; crop the input")
        x = self.embed(idx)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss
