"""The models the two papers train, one readable file each.

* ``gpt2``  GPT-2 (nanoGPT's names): the blog post's model. Also ``attention_probe`` and ``generate``,
  which work on both models.
* ``qwen3`` Qwen3-like (RoPE, GQA, SwiGLU, QK-norm, tied embeddings), with the RMSNorm-free variant
  of the paper's Section 4.2.

Both have ``forward(idx, targets=None) -> (logits, loss)``, ``num_params()`` and
``param_roles() -> {parameter name: role}`` with roles from ``ROLES``, which is how the optimizer
assignment decides that a 2-D block weight goes to a manifold optimizer and an embedding, head, norm
or bias goes to AdamW.
"""

from .gpt2 import GPT, ROLES, GPTConfig, attention_probe, generate
from .qwen3 import Qwen3, Qwen3Config

__all__ = ["GPT", "GPTConfig", "Qwen3", "Qwen3Config", "ROLES", "attention_probe", "generate", "build_model"]


def build_model(config):
    """The model for a config: ``GPTConfig`` -> ``GPT``, ``Qwen3Config`` -> ``Qwen3``."""
    if isinstance(config, GPTConfig):
        return GPT(config)
    if isinstance(config, Qwen3Config):
        return Qwen3(config)
    raise TypeError(f"build_model takes a GPTConfig or a Qwen3Config, got {type(config).__name__}")
