"""Assignments: which optimizer and manifold each parameter gets, on a mock GPT-2 (names only), the
package's GPT-2 / Qwen3 (param_roles), and plain torch modules (roles by module and shape: an MLP,
nn.TransformerEncoder, a tied / untied embedding and head, a conv net, roles= overrides)."""

import hashlib
import json
import math

import pytest
import torch
from torch import nn

from manifold_muon.assignments import (ADAMW_ROLES, ASSIGNMENTS, MATRIX_ROLES, build_optimizers, describe,
                                       param_roles, plan, retract_parameters)
from manifold_muon.manifolds import get_manifold
from manifold_muon.optim import MatrixOptimizer


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
    odd.mixer = nn.Module()
    odd.mixer.weight = nn.Parameter(torch.randn(4, 4))  # 2-D, of no Linear / Embedding / attention: no role by shape
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


# --- the book's models: their plans are those of before roles by module and shape (the book's results
# depend on them). The digests are of every plan (name, shape, role, optimizer, manifold, options) of every
# named assignment, with and without split_qkv, computed with the name-only code of commit e7943f5.

_PLAN_NAMES = ("unconstrained", "all_stiefel", "all_dgram", "hetero", "hetero_inv", "muon", "macro_fro",
               "macro_spec", "muonh_fro", "muonh_spec", "sso", "fso")
_PLAN_DIGESTS = {"gpt2_small": "fe6b9ce00b9f9a4f", "gpt2": "6f2a47cc26d5e821", "gpt2_nobias": "255ef5412057147b",
                 "qwen3": "2f800aa1aee4140f", "qwen3_rmsnorm_free": "8577d12513ed5461", "mock_gpt2": "79dbab1e925d601e"}


def _plan_digest(model):
    out = []
    for a in _PLAN_NAMES:
        for split in (False, True):
            try:
                rows = [[r["name"], list(r["shape"]), r["role"], r["optimizer"], r["manifold"],
                         sorted((k, repr(v)) for k, v in r["options"].items())]
                        for r in plan(model, a, split_qkv=split)]
            except ValueError:
                rows = "refused"
            out.append([a, split, rows])
    return hashlib.sha256(json.dumps(out).encode()).hexdigest()[:16]


def _books_models():
    from manifold_muon_lab.models import build_model

    small = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=64)
    with torch.device("meta"):
        return {"gpt2_small": build_model("gpt2", n_layer=12, n_head=12, n_embd=768, block_size=1024,
                                          vocab_size=50257, bias=True),
                "gpt2": build_model("gpt2", **small, bias=True),
                "gpt2_nobias": build_model("gpt2", **small, bias=False),
                "qwen3": build_model("qwen3", **small, n_kv_head=1),
                "qwen3_rmsnorm_free": build_model("qwen3", **small, n_kv_head=1, rmsnorm_free=True),
                "mock_gpt2": MockGPT2()}


def test_plans_of_the_books_models_are_unchanged():
    from manifold_muon_lab.models import build_model

    got = {name: _plan_digest(model) for name, model in _books_models().items()}
    assert got == _PLAN_DIGESTS, "a plan of the book's GPT-2 / Qwen3 changed: its results depend on them"
    gpt = build_model("gpt2", n_layer=1, n_head=2, n_embd=8, block_size=4, vocab_size=16, bias=True)
    h = "transformer.h.0."
    assert param_roles(gpt) == {
        "transformer.wte.weight": "embedding", "transformer.wpe.weight": "pos_embedding",
        h + "ln_1.weight": "norm", h + "ln_1.bias": "norm", h + "attn.c_attn.weight": "attn_qkv",
        h + "attn.c_attn.bias": "bias", h + "attn.c_proj.weight": "attn_o", h + "attn.c_proj.bias": "bias",
        h + "ln_2.weight": "norm", h + "ln_2.bias": "norm", h + "mlp.c_fc.weight": "mlp_up",
        h + "mlp.c_fc.bias": "bias",
        h + "mlp.c_proj.weight": "mlp_down", h + "mlp.c_proj.bias": "bias",
        "transformer.ln_f.weight": "norm", "transformer.ln_f.bias": "norm"}
    qwen = build_model("qwen3", n_layer=1, n_head=2, n_kv_head=1, n_embd=8, block_size=4, vocab_size=16)
    q = "layers.0."
    assert param_roles(qwen) == {
        "embed.weight": "embedding", q + "attn.q_proj.weight": "attn_q", q + "attn.k_proj.weight": "attn_k",
        q + "attn.v_proj.weight": "attn_v", q + "attn.o_proj.weight": "attn_o", q + "attn.q_norm.weight": "norm",
        q + "attn.k_norm.weight": "norm", q + "mlp.gate_proj.weight": "mlp_gate", q + "mlp.up_proj.weight": "mlp_up",
        q + "mlp.down_proj.weight": "mlp_down", q + "attn_norm.weight": "norm", q + "mlp_norm.weight": "norm",
        "norm.weight": "norm"}
    # without their param_roles() (wrapped in a plain module), the nanoGPT / Qwen3 name presets give the same roles
    for model in (gpt, qwen):
        wrapper = nn.Module()
        wrapper.m = model
        assert param_roles(wrapper) == {"m." + n: r for n, r in param_roles(model).items()}


# --- any nn.Module: roles by module and shape

def _train(model, assignment, loss_fn, steps=3, **kwargs):
    """Build the optimizers, put the weights on their manifolds, take ``steps`` steps; check that every trainable
    parameter is in exactly one optimizer, the loss stays finite and every matrix stays on its manifold (by the
    manifold's own residual; a split weight per row block). Returns the optimizers and the plan's rows."""
    torch.manual_seed(0)
    rows = plan(model, assignment, kwargs.get("roles"), kwargs.get("split_qkv", False))
    opts = build_optimizers(model, assignment, **kwargs)
    held = [p for o in opts for g in o.param_groups for p in g["params"]]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(held) == len({id(p) for p in held}) == len(trainable) == len(rows), "every parameter exactly once"
    assert {id(p) for p in held} == {id(p) for p in trainable}
    retract_parameters(opts)
    for _ in range(steps):
        loss = loss_fn(model)
        assert math.isfinite(loss.item())
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()
    assert math.isfinite(loss_fn(model).item())
    checked = 0
    for o in opts:
        if not isinstance(o, MatrixOptimizer):
            continue
        for g in o.param_groups:
            M = g.get("manifold")
            if M is None:  # Muon: no constraint
                continue
            for p in g["params"]:
                W = p.detach().unflatten(0, (g["split"], -1))
                assert float(M.residual(W).max()) < 1e-4, (M.name, tuple(p.shape))
                checked += 1
    return opts, {r["name"]: r for r in rows}, checked


def _mse(x, y):
    return lambda model: (model(x) - y).pow(2).mean()


def test_a_plain_mlp_by_shape():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    roles = param_roles(mlp)
    assert roles == {"0.weight": "mlp_up", "0.bias": "bias", "2.weight": "norm", "2.bias": "norm",
                     "3.weight": "mlp_up", "3.bias": "bias", "5.weight": "mlp_down", "5.bias": "bias"}
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    for name in ("all_stiefel", "hetero", "macro_spec"):
        opts, rows, checked = _train(mlp, name, _mse(x, y), lr=0.02)
        assert checked == 3
        assert {rows[n]["optimizer"] for n in ("0.weight", "3.weight", "5.weight")} != {"adamw"}
        assert all(rows[n]["optimizer"] == "adamw" for n in roles if not n.endswith("weight") or n == "2.weight")
    text = describe("hetero", mlp)
    assert "5.weight" in text and "dgram" in text and "mlp_down" in text


def _encoder(**kw):
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, **kw)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def test_a_torch_transformer_encoder():
    enc = _encoder()
    roles = param_roles(enc)
    assert {roles[f"layers.{i}.self_attn.in_proj_weight"] for i in (0, 1)} == {"attn_qkv"}
    assert roles["layers.0.self_attn.out_proj.weight"] == "attn_o"
    assert (roles["layers.0.linear1.weight"], roles["layers.0.linear2.weight"]) == ("mlp_up", "mlp_down")
    assert roles["layers.0.self_attn.in_proj_bias"] == "bias" and roles["layers.1.norm2.weight"] == "norm"
    x, y = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    opts, rows, checked = _train(enc, "hetero", _mse(x, y), lr=0.02)
    assert checked == 8
    assert rows["layers.1.self_attn.in_proj_weight"]["manifold"] == "stiefel"  # 48 x 16, one fused matrix
    assert rows["layers.1.linear2.weight"]["manifold"] == "dgram"
    # nn.MultiheadAttention's in_proj_weight is [W_q; W_k; W_v] by rows, as GPT-2's c_attn: split_qkv applies
    opts, rows, checked = _train(enc, "macro_spec", _mse(x, y), lr=0.01, split_qkv=True)
    assert rows["layers.0.self_attn.in_proj_weight"]["options"] == {"split": 3} and checked == 8
    assert "split 3" in describe("macro_spec", enc, split_qkv=True)
    with pytest.raises(ValueError, match="split_qkv"):
        plan(enc, "hetero", split_qkv=True)
    # kdim / vdim != d: separate q, k, v weights
    mha = nn.MultiheadAttention(16, 2, kdim=8, vdim=8, batch_first=True)
    assert {n: r for n, r in param_roles(mha).items() if r in MATRIX_ROLES} == {
        "q_proj_weight": "attn_q", "k_proj_weight": "attn_k", "v_proj_weight": "attn_v", "out_proj.weight": "attn_o"}


class _LM(nn.Module):
    """Embedding, an encoder layer, an output head to the vocabulary (tied or not, before or after the embedding)."""

    def __init__(self, tied, head_first=False, vocab=40, d=16):
        super().__init__()
        if head_first:
            self.head = nn.Linear(d, vocab, bias=False)
        self.emb = nn.Embedding(vocab, d)
        self.body = _encoder()
        if not head_first:
            self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(self.body(self.emb(idx)))


@pytest.mark.parametrize("tied,head_first", [(False, False), (True, False), (True, True)])
def test_embedding_and_output_head_go_to_adamw(tied, head_first):
    model = _LM(tied, head_first)
    idx = torch.randint(0, 40, (2, 6))

    def ce(m):
        return nn.functional.cross_entropy(m(idx).flatten(0, 1), idx.flatten())

    opts, rows, checked = _train(model, "all_stiefel", ce, lr=0.02)
    assert checked == 8, "the encoder's 8 matrices, not the embedding or the head"
    adamw = {n: r["role"] for n, r in rows.items() if r["optimizer"] == "adamw" and r["role"] in ("embedding", "head")}
    if not tied:
        assert adamw == {"emb.weight": "embedding", "head.weight": "head"}
    else:  # one tensor, listed once, under the name torch gives it first
        assert adamw == ({"head.weight": "embedding"} if head_first else {"emb.weight": "embedding"})
    decayed = [g for g in opts[-1].param_groups if g["weight_decay"] > 0][0]["params"]
    assert any(p is model.emb.weight for p in decayed)


def test_a_conv_kernel_goes_to_adamw():
    """4-D convolution kernels are not matrices: role "other", AdamW (with its weight decay, as nanoGPT decays
    every parameter of 2 or more dimensions); the Linear classifier after them is a hidden matrix."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    roles = param_roles(net)
    assert roles == {"0.weight": "other", "0.bias": "bias", "1.weight": "norm", "1.bias": "norm",
                     "4.weight": "mlp_down", "4.bias": "bias"}
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    opts, rows, checked = _train(net, "all_dgram", lambda m: nn.functional.cross_entropy(m(x), y), lr=0.02)
    assert checked == 1 and rows["0.weight"]["optimizer"] == "adamw"
    with pytest.raises(ValueError, match="block matrices are 2-D"):
        plan(net, "all_dgram", roles={"0.weight": "mlp_up"})


def test_roles_override_by_name_and_glob():
    enc = _encoder()
    # a glob for every layer's first MLP matrix; a later entry overrides an earlier one; an AdamW role takes a matrix
    # off the matrix optimizer
    roles = {"layers.*.linear1.weight": "mlp_gate", "layers.*.linear2.weight": "mlp_up",
             "layers.1.linear2.weight": "mlp_down", "layers.0.self_attn.out_proj.weight": "other"}
    got = param_roles(enc, roles)
    assert (got["layers.0.linear1.weight"], got["layers.1.linear1.weight"]) == ("mlp_gate", "mlp_gate")
    assert (got["layers.0.linear2.weight"], got["layers.1.linear2.weight"]) == ("mlp_up", "mlp_down")
    x, y = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    assignment = {"*": ("muon", None), "mlp_gate": ("manifold_muon", "stiefel"), "mlp_down": ("manifold_muon", "dgram")}
    opts, rows, checked = _train(enc, assignment, _mse(x, y), lr=0.02, roles=roles)
    assert checked == 3 and rows["layers.0.self_attn.out_proj.weight"]["optimizer"] == "adamw"
    assert rows["layers.0.linear2.weight"]["optimizer"] == "muon"
    # roles= wins over model.param_roles() and over the presets
    gpt = MockGPT2()
    assert param_roles(gpt, {"transformer.h.0.mlp.c_fc.weight": "head"})["transformer.h.0.mlp.c_fc.weight"] == "head"
    with pytest.raises(ValueError, match="matches no parameter.*did you mean 'layers.0.linear1.weight'"):
        param_roles(enc, {"layers.0.linear_1.weight": "mlp_up"})
    with pytest.raises(ValueError, match="unknown role 'hidden'"):
        param_roles(enc, {"layers.0.linear1.weight": "hidden"})


def test_an_unclassifiable_parameter_is_named_with_what_to_pass():
    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, 6) / 6)
            self.out = nn.Linear(6, 6)

        def forward(self, x):
            return self.out(x @ self.w)

    model = nn.Sequential(Mixer())
    with pytest.raises(ValueError, match=r"'0\.w' of shape \(6, 6\) \(of a Mixer\).*roles=\{'0\.w': role\}"):
        build_optimizers(model, "all_stiefel")
    with pytest.raises(ValueError, match="weight_ih_l0"):
        describe("hetero", nn.LSTM(4, 8))
    x = torch.randn(8, 6)
    _, rows, checked = _train(model, "all_stiefel", _mse(x, x), lr=0.02, roles={"0.w": "mlp_up"})
    assert checked == 2 and set(ADAMW_ROLES) >= {rows["0.out.bias"]["role"]}


def test_frozen_parameters_are_left_out():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    mlp[0].requires_grad_(False)
    before = mlp[0].weight.detach().clone()
    x = torch.randn(4, 8)
    _, rows, checked = _train(mlp, "all_stiefel", _mse(x, x), lr=0.02, roles={"0.weight": "mlp_up"})
    assert set(rows) == {"2.weight", "2.bias"} and checked == 1
    assert torch.equal(mlp[0].weight, before), "retract_parameters does not move a frozen weight"
    assert "frozen (requires_grad=False), no optimizer: 0.weight, 0.bias" in describe("all_stiefel", mlp)


def test_classes_replace_a_registry_entry_for_one_call_only():
    from manifold_muon import Muon
    from manifold_muon.assignments import OPTIMIZERS

    class Marked(Muon):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.ReLU(), torch.nn.Linear(16, 8, bias=False))
    opts = build_optimizers(model, "unconstrained", classes={"muon": Marked})
    assert any(type(o) is Marked for o in opts) and OPTIMIZERS["muon"] is Muon
    assert not any(type(o) is Marked for o in build_optimizers(model, "unconstrained"))
    with pytest.raises(ValueError, match="not a name of the optimizer registry"):
        build_optimizers(model, "unconstrained", classes={"nosuch": Marked})
    with pytest.raises(ValueError, match="must be an optimizer class"):
        build_optimizers(model, "unconstrained", classes={"muon": dict})
