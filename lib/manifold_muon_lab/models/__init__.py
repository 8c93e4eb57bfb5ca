"""The models the two papers train, one readable file each.

* ``gpt2``  GPT-2 (nanoGPT's names): the blog post's model, and ``attention_probe`` (any model here)
* ``qwen3`` Qwen3-like (RoPE, GQA, SwiGLU, QK-norm, tied embeddings), with the RMSNorm-free variant
  of the paper's Section 4.2

Both have ``forward(idx, targets=None) -> (logits, loss)``, ``num_params()`` and
``param_roles() -> {parameter name: role}`` with roles from ``ROLES``, which is how the optimizer
assignment decides that a 2-D block weight goes to a manifold optimizer and an embedding, head, norm
or bias goes to AdamW. ``build_model(family, **fields)`` is the one way to build either.
"""

import dataclasses

from .gpt2 import GPT, ROLES, GPTConfig, attention_probe
from .qwen3 import Qwen3, Qwen3Config

__all__ = ["GPT", "GPTConfig", "Qwen3", "Qwen3Config", "ROLES", "FAMILIES", "attention_probe", "build_model"]

FAMILIES = {"gpt2": (GPT, GPTConfig), "qwen3": (Qwen3, Qwen3Config)}


def build_model(family: str, **fields):
    """The model of ``family`` ("gpt2" or "qwen3") built from its config's ``fields``; an unknown field is
    refused with the list of valid ones."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; choose one of: {', '.join(FAMILIES)}")
    model_cls, config_cls = FAMILIES[family]
    valid = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(fields) - set(valid))
    if unknown:
        raise ValueError(f"{config_cls.__name__} has no field(s) {unknown}; its fields are {', '.join(valid)}")
    return model_cls(config_cls(**fields))
