"""Assignments: which optimizer and manifold each parameter gets, on a mock GPT-2 (names only) and the
package's GPT-2 / Qwen3 (param_roles)."""

import pytest
import torch
from torch import nn

from manifold_muon.assignments import (ASSIGNMENTS, build_optimizers, describe, param_roles, plan,
                                       retract_parameters)
from manifold_muon.manifolds import get_manifold


class MockGPT2(nn.Module):
    """nanoGPT's parameter names and shapes (d=8, 2 layers, vocab 32), tied head, no param_roles()."""

    def __init__(self, d=8, n_layer=2, vocab=32, block=4):
        super().__init__()

        def block_():
            b = nn.Module()
            b.ln_1, b.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            b.attn, b.mlp = nn.Module(), nn.Module()
            b.attn.c_attn, b.attn.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            b.mlp.c_fc, b.mlp.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            return b

        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(vocab, d), wpe=nn.Embedding(block, d),
                                              h=nn.ModuleList([block_() for _ in range(n_layer)]), ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight


EXPECTED = {  # assignment -> role -> (optimizer, manifold)
    "unconstrained": dict.fromkeys(("attn_qkv", "attn_o", "mlp_up", "mlp_down"), ("muon", None)),
    "all_stiefel": dict.fromkeys(("attn_qkv", "attn_o", "mlp_up", "mlp_down"), ("manifold_muon", "stiefel")),
    "all_dgram": dict.fromkeys(("attn_qkv", "attn_o", "mlp_up", "mlp_down"), ("manifold_muon", "dgram")),
    "hetero": {"attn_qkv": ("manifold_muon", "stiefel"), "attn_o": ("manifold_muon", "stiefel"),
               "mlp_up": ("manifold_muon", "dgram"), "mlp_down": ("manifold_muon", "dgram")},
    "hetero_inv": {"attn_qkv": ("manifold_muon", "dgram"), "attn_o": ("manifold_muon", "dgram"),
                   "mlp_up": ("manifold_muon", "stiefel"), "mlp_down": ("manifold_muon", "stiefel")},
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_post_assignments_on_mock_gpt2(name):
    model = MockGPT2()
    rows = {r["name"]: r for r in plan(model, name)}
    assert "lm_head.weight" not in rows, "the tied head is one parameter (wte)"
    assert rows["transformer.wte.weight"]["optimizer"] == "adamw"
    assert rows["transformer.h.1.ln_2.bias"]["role"] == "norm" and rows["transformer.h.0.mlp.c_fc.bias"]["role"] == "bias"
    matrices = {n: r for n, r in rows.items() if r["optimizer"] != "adamw"}
    assert len(matrices) == 2 * 4
    for r in matrices.values():
        assert (r["optimizer"], r["manifold"]) == EXPECTED[name][r["role"]]
    assert rows["transformer.h.0.attn.c_attn.weight"]["shape"] == (24, 8)  # fused qkv: one matrix
    opts = build_optimizers(model, name, lr=0.01)
    assert isinstance(opts[-1], torch.optim.AdamW)
    seen = [p for o in opts for g in o.param_groups for p in g["params"]]
    assert len(seen) == len(set(map(id, seen))) == len(list(model.parameters())), "every parameter exactly once"
    by_manifold = {g["manifold"].name if g["manifold"] is not None else None:
                   len(g["params"]) for o in opts[:-1] for g in o.param_groups}
    want = {}
    for role, (_, m) in EXPECTED[name].items():
        want[m] = want.get(m, 0) + 2
    assert by_manifold == want


@pytest.mark.parametrize("name", ["muon", "macro_fro", "macro_spec", "muonh_fro", "muonh_spec", "sso", "fso"])
def test_paper_assignments_step_and_keep_constraints(name):
    torch.manual_seed(0)
    model = MockGPT2()
    opts = (build_optimizers(model, name, lr=0.01, manifold_args={"r": 2.0}) if name != "muon"
            else build_optimizers(model, name))
    retract_parameters(opts)
    x = torch.randint(0, 32, (2, 4))
    loss = model.lm_head(model.transformer.h[0].mlp.c_proj(torch.relu(model.transformer.h[0].mlp.c_fc(
        model.transformer.h[0].attn.c_proj(model.transformer.h[0].attn.c_attn(model.transformer.wte(x))[..., :8]))))).sum()
    loss.backward()
    for o in opts:
        o.step()
    assert opts[-1].param_groups[0]["lr"] == 5e-3, "the paper's AdamW settings"
    if name == "muon":
        return
    group = opts[0].param_groups[0]
    M = group["manifold"]
    assert M.r == 2.0
    for p in group["params"]:
        assert float(M.residual(p.detach())) < 1e-5


def test_real_models_use_param_roles_and_split_qkv():
    from manifold_muon_lab.models import GPT, GPTConfig, Qwen3, Qwen3Config

    gpt = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=64, block_size=8))
    rows = {r["name"]: r for r in plan(gpt, "macro_spec", split_qkv=True)}
    assert rows["transformer.h.1.attn.c_attn.weight"]["options"] == {"split": 3}
    assert "split 3" in describe("macro_spec", gpt, split_qkv=True)
    qwen = Qwen3(Qwen3Config(n_layer=2, n_head=2, n_kv_head=1, n_embd=16, vocab_size=64, block_size=8))
    roles = param_roles(qwen)
    assert {roles[n] for n in roles if ".0." in n and "proj" in n} == {"attn_q", "attn_k", "attn_v", "attn_o",
                                                                       "mlp_gate", "mlp_up", "mlp_down"}
    rows = plan(qwen, "hetero")
    assert all(r["manifold"] == ("stiefel" if r["role"].startswith("attn") else "dgram")
               for r in rows if r["optimizer"] != "adamw")


def test_custom_mapping_by_role_and_overrides():
    model = MockGPT2()
    rows = {r["name"]: r for r in plan(model, {"*": ("muon", None), "attn": ("macro", "output_oblique_sphere"),
                                               "attn_o": ("sso", "spectral_sphere")})}
    assert rows["transformer.h.0.mlp.c_fc.weight"]["optimizer"] == "muon"
    assert (rows["transformer.h.1.attn.c_attn.weight"]["optimizer"], rows["transformer.h.1.attn.c_attn.weight"]["manifold"]) \
        == ("macro", "output_oblique_sphere")
    assert rows["transformer.h.1.attn.c_proj.weight"]["optimizer"] == "sso", "a later entry overrides an earlier one"
    with pytest.raises(ValueError, match="does not take manifold_args"):
        build_optimizers(model, "hetero", manifold_args={"r": 2.0})
    opts = build_optimizers(model, "all_stiefel", inner_steps=3)
    assert opts[0].param_groups[0]["inner_steps"] == 3
    text = describe("hetero", model)
    assert "transformer.h.0.mlp.c_proj.weight" in text and "dgram" in text


def test_bad_input_names_the_valid_choices():
    model = MockGPT2()
    with pytest.raises(ValueError, match="hetero_inv"):
        plan(model, "heterogeneous")
    with pytest.raises(ValueError, match="stiefel"):
        plan(model, {"*": ("manifold_muon", "stiefle")})
    with pytest.raises(ValueError, match="manifold_muon"):
        plan(model, {"*": ("adam", None)})
    with pytest.raises(ValueError, match="attn_qkv"):
        plan(model, {"attention": ("muon", None)})
    with pytest.raises(ValueError, match="AdamW"):
        plan(model, {"embedding": ("muon", None)})
    with pytest.raises(ValueError, match="selects no optimizer"):
        plan(model, {"attn": ("muon", None)})
    with pytest.raises(ValueError, match="split_qkv"):
        plan(model, "hetero", split_qkv=True)
    with pytest.raises(ValueError, match="takes"):
        build_optimizers(model, "unconstrained", inner_steps=3)
    odd = nn.Module()
    odd.mixer = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="param_roles"):
        plan(odd, "unconstrained")
    assert plan(odd, "unconstrained", roles={"mixer.weight": "mlp_up"})[0]["optimizer"] == "muon"
    assert set(ASSIGNMENTS) >= {"unconstrained", "all_stiefel", "all_dgram", "hetero", "hetero_inv", "macro_fro",
                                "macro_spec", "muonh_fro", "muonh_spec", "sso", "fso", "muon"}


def test_overrides_win_over_the_assignments_own_options():
    """The post's Muon rule carries torch.optim.Muon's bfloat16 msign; a caller's msign_dtype must replace it
    (it once did not, and a benchmark's "Muon in float32" silently ran in bfloat16)."""
    model = MockGPT2()
    default = build_optimizers(model, "unconstrained")[0]
    assert all(g["msign_dtype"] == torch.bfloat16 for g in default.param_groups)
    fp32 = build_optimizers(model, "unconstrained", msign_dtype=torch.float32, ns_steps=7)[0]
    assert all(g["msign_dtype"] == torch.float32 and g["ns_steps"] == 7 for g in fp32.param_groups)


def test_a_manifold_override_is_refused_not_ignored():
    from torch import nn

    model = nn.Module()
    model.attn = nn.Module()
    model.attn.c_proj = nn.Linear(8, 8, bias=False)
    with pytest.raises(ValueError, match="would be ignored"):
        build_optimizers(model, "all_stiefel", manifold="nosuch")
