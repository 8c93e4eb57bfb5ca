"""GPT-2 and Qwen3-like models: shapes, causality, tying, roles, parameter counts, the RMSNorm-free
variant, grouped-query attention, and the attention probe."""

import math

import pytest
import torch
import torch.nn.functional as F

from manifold_muon_lab.models import GPT, ROLES, GPTConfig, Qwen3, Qwen3Config, attention_probe, build_model
from manifold_muon_lab.models.qwen3 import Rotary

TINY = {
    "gpt2": GPTConfig.nano(n_layer=2, block_size=32),
    "gpt2_nobias": GPTConfig.nano(n_layer=2, block_size=32, bias=False),
    "qwen3": Qwen3Config.nano(n_layer=2, block_size=32),
    "qwen3_free": Qwen3Config.nano(n_layer=2, block_size=32, rmsnorm_free=True),
    "qwen3_mha": Qwen3Config.nano(n_layer=2, block_size=32, n_kv_head=4),
}


def make(config):
    """The model of a config object (the training loop builds from a family name: ``build_model``)."""
    return (GPT if isinstance(config, GPTConfig) else Qwen3)(config)


def test_build_model_builds_each_family_and_refuses_unknown_fields():
    model = build_model("qwen3", n_layer=1, n_head=2, n_kv_head=1, n_embd=16, block_size=8, vocab_size=32, ffn_dim=48)
    assert isinstance(model, Qwen3) and model.config.ffn_dim == 48
    assert isinstance(build_model("gpt2", n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32), GPT)
    with pytest.raises(ValueError, match=r"Qwen3Config has no field\(s\) \['ffn_size'\]; its fields are .*ffn_dim"):
        build_model("qwen3", ffn_size=64)
    with pytest.raises(ValueError, match="unknown model family 'llama'; choose one of: gpt2, qwen3"):
        build_model("llama")


def tokens(B=2, T=16, V=256, seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", TINY)
def test_forward_shapes_loss_and_gradients(name):
    model = make(TINY[name])
    idx, targets = tokens(), tokens(seed=1)
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 16, 256)
    assert loss.shape == () and torch.isfinite(loss)
    assert torch.allclose(loss, F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1)))
    assert model(idx)[1] is None
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
    # targets of -1 are left out of the mean
    masked = targets.clone()
    masked[:, :8] = -1
    _, loss_masked = model(idx, masked)
    expected = F.cross_entropy(logits[:, 8:].reshape(-1, 256), targets[:, 8:].reshape(-1))
    assert torch.allclose(loss_masked, expected, atol=1e-6)


@pytest.mark.parametrize("name", TINY)
def test_causal_a_future_token_does_not_change_earlier_logits(name):
    model = make(TINY[name]).eval()
    idx = tokens()
    changed = idx.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    a, _ = model(idx)
    b, _ = model(changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:], atol=1e-4)


@pytest.mark.parametrize("name", TINY)
def test_head_is_tied_to_embedding(name):
    model = make(TINY[name])
    emb = model.transformer.wte if isinstance(model, GPT) else model.embed
    assert model.lm_head.weight is emb.weight
    assert model.num_params() == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    # the head reads the embedding: changing one embedding row changes that token's logit
    idx = tokens()
    before, _ = model(idx)
    with torch.no_grad():
        emb.weight[7] += 1.0
    after, _ = model(idx)
    assert not torch.allclose(before[..., 7], after[..., 7])


@pytest.mark.parametrize("name", TINY)
def test_param_roles_cover_every_parameter_once(name):
    model = make(TINY[name])
    roles = model.param_roles()
    names = [n for n, _ in model.named_parameters()]
    assert sorted(roles) == sorted(names) and len(names) == len(set(names))
    assert set(roles.values()) <= set(ROLES)
    L = model.config.n_layer
    params = dict(model.named_parameters())
    for n, role in roles.items():
        if role in ("norm", "bias"):
            assert params[n].ndim == 1, n
        else:
            assert params[n].ndim == 2, n
    count = lambda r: sum(v == r for v in roles.values())  # noqa: E731
    if isinstance(model, GPT):
        assert (count("attn_qkv"), count("attn_o"), count("mlp_up"), count("mlp_down")) == (L, L, L, L)
        assert count("embedding") == 1 and count("pos_embedding") == 1
        assert count("bias") == (4 * L if model.config.bias else 0)
    else:
        for r in ("attn_q", "attn_k", "attn_v", "attn_o", "mlp_gate", "mlp_up", "mlp_down"):
            assert count(r) == L
        assert count("embedding") == 1
        assert count("norm") == (0 if model.config.rmsnorm_free else 4 * L + 1)


def test_gpt2_124m_has_gpt2_small_parameter_count():
    # GPT-2 small as published (and as HF/nanoGPT count it with the tied head once): 124,439,808
    config = GPTConfig.gpt2_124m()
    with torch.device("meta"):  # builds the modules without allocating or initialising memory
        model = GPT(config)
    assert model.num_params() == 124_439_808
    assert model.num_params(exclude_embeddings=True) == 124_439_808 - 50257 * 768 - 1024 * 768


@pytest.mark.parametrize("preset, nominal", [("qwen3_120m", 120e6), ("qwen3_330m", 330e6), ("qwen3_1b", 1e9)])
def test_qwen3_presets_land_near_the_papers_sizes(preset, nominal):
    config = getattr(Qwen3Config, preset)()
    assert (config.block_size, config.vocab_size) == (1024, 50304)
    assert config.n_embd == config.n_head * config.head_dim
    with torch.device("meta"):
        assert abs(Qwen3(config).num_params() / nominal - 1) < 0.05


def test_bad_configs_are_refused_with_a_sentence():
    with pytest.raises(ValueError, match="not divisible by n_head"):
        GPTConfig(n_embd=100, n_head=12)
    with pytest.raises(ValueError, match="not divisible by n_head"):
        Qwen3Config(n_embd=100, n_head=12, n_kv_head=4)
    with pytest.raises(ValueError, match="n_kv_head"):
        Qwen3Config(n_embd=96, n_head=6, n_kv_head=4)
    with pytest.raises(ValueError, match="even"):
        Qwen3Config(n_embd=60, n_head=4, n_kv_head=2)  # head_dim 15
    with pytest.raises(ValueError, match="block_size"):
        make(TINY["gpt2"])(tokens(T=33))


def test_rmsnorm_free_has_no_learnable_norm_and_stays_finite():
    model = Qwen3(Qwen3Config.nano(n_layer=4, rmsnorm_free=True))
    assert all(p.ndim == 2 for p in model.parameters())
    assert "norm" not in model.param_roles().values()
    with torch.no_grad():  # a large weight scale, as an unconstrained optimizer might produce
        for p in model.parameters():
            p.mul_(20.0)
    logits, loss = model(tokens(), tokens(seed=1))
    assert torch.isfinite(logits).all() and torch.isfinite(loss)


def test_norm_gated_swiglu_grows_linearly_and_swiglu_quadratically():
    # Eq (3) divides the Swish branch by its RMS, so for large inputs (where Swish ~ ReLU, which is
    # homogeneous) scaling X by 10 scales Y by ~10; plain SwiGLU multiplies two linear branches and
    # grows by ~100: the c^2-per-layer cascade of the paper's Section 4.2.
    torch.manual_seed(0)
    x = torch.randn(3, 5, 64)
    gated = Qwen3(Qwen3Config.nano(rmsnorm_free=True)).layers[0].mlp
    plain = Qwen3(Qwen3Config.nano()).layers[0].mlp
    with torch.no_grad():
        gated_ratio = gated(1000 * x).norm() / gated(100 * x).norm()
        plain_ratio = plain(1000 * x).norm() / plain(100 * x).norm()
        assert abs(gated_ratio - 10) < 0.1 and abs(plain_ratio - 100) < 1
        # and the normalised Swish branch has RMS 1 in every token
        g = F.silu(gated.gate_proj(x))
        g = F.rms_norm(g, (g.shape[-1],), eps=gated.eps)
        assert torch.allclose(g.pow(2).mean(-1).sqrt(), torch.ones(3, 5), atol=1e-4)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_free", "qwen3_mha", "gpt2"])
def test_attention_matches_an_explicit_softmax(name):
    # SDPA with grouped-query heads equals softmax(q k^T / sqrt(hd) + causal mask) v, each query head
    # h reading key/value head h // (n_head / n_kv_head)
    model = make(TINY[name]).eval()
    attn = model.transformer.h[0].attn if isinstance(model, GPT) else model.layers[0].attn
    x = torch.randn(2, 12, 64)
    q, k, v = attn.queries_keys_values(x)
    if not isinstance(model, GPT):
        group = model.config.n_head // model.config.n_kv_head
        assert torch.equal(k[:, ::group], k[:, group - 1::group])  # heads in a group share keys
        assert attn.k_proj.weight.shape == (model.config.n_kv_head * model.config.head_dim, 64)
    z = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    z = z.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf"))
    y = (torch.softmax(z, -1) @ v).transpose(1, 2).reshape(2, 12, -1)
    o_proj = attn.c_proj if isinstance(model, GPT) else attn.o_proj
    assert torch.allclose(attn(x), o_proj(y), atol=1e-5)


def test_rope_scores_depend_only_on_the_offset():
    rotary = Rotary(head_dim=8, block_size=16, base=10000.0)
    q, k = torch.randn(8), torch.randn(8)
    rot = lambda v: rotary(v.expand(1, 1, 16, 8))[0, 0]  # noqa: E731  (the vector placed at every position)
    rq, rk = rot(q), rot(k)
    scores = rq @ rk.T  # scores[m, n] = <R_m q, R_n k>
    for offset in (0, 3, -5):
        diagonal = torch.diagonal(scores, offset=offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-5)


@pytest.mark.parametrize("name", ["gpt2", "qwen3", "qwen3_free"])
def test_attention_probe_statistics_are_consistent(name):
    model = make(TINY[name])
    idx = tokens(B=2, T=20)
    model.train()
    stats = attention_probe(model, idx, max_rows=48)
    assert model.training  # the probe restores the mode it found
    assert sorted(stats) == list(range(model.config.n_layer))
    for layer in stats.values():
        n = layer["row_length"]
        assert n.shape == (48,) and n.min() == 1 and n.max() == 20
        assert (layer["jacobian_fro"] <= 0.5 + 1e-6).all() and (layer["jacobian_fro"] >= 0).all()
        assert (layer["entropy"] <= torch.log(n) + 1e-5).all() and (layer["entropy"] >= -1e-6).all()
        assert (layer["logit_range"] >= 0).all()
        one = n == 1  # a row of length 1 is the constant softmax
        assert (layer["entropy"][one].abs() < 1e-6).all() and (layer["jacobian_fro"][one] == 0).all()
    assert set(attention_probe(model, idx, layers=[1])) == {1}
    compiled_like = torch.nn.Module()  # what torch.compile returns: the model under _orig_mod
    compiled_like._orig_mod = model
    again = attention_probe(compiled_like, idx, max_rows=48)
    assert all(torch.equal(again[i]["entropy"], stats[i]["entropy"]) for i in stats)
    with pytest.raises(ValueError, match="does not exist"):
        attention_probe(model, idx, layers=[5])


def test_attention_probe_agrees_with_the_explicit_jacobian():
    model = GPT(TINY["gpt2"]).eval()
    idx = tokens(B=1, T=10)
    H, T = model.config.n_head, 10
    stats = attention_probe(model, idx, layers=[0], max_rows=H * T)  # every row
    with torch.no_grad():
        x = model.transformer.h[0].ln_1(model.transformer.wte(idx) + model.transformer.wpe(torch.arange(T)))
        q, k, _ = model.transformer.h[0].attn.queries_keys_values(x)
        z = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))[0]  # (H, T, T)
    fro, ent, rng = [], [], []
    for h in range(H):
        for t in range(T):
            s = torch.softmax(z[h, t, : t + 1], 0)
            fro.append(torch.linalg.matrix_norm(torch.diag(s) - torch.outer(s, s)))
            ent.append(-(s * s.log()).sum())
            rng.append(z[h, t, : t + 1].max() - z[h, t, : t + 1].min())
    for got, want in ((stats[0]["jacobian_fro"], fro), (stats[0]["entropy"], ent), (stats[0]["logit_range"], rng)):
        assert torch.allclose(got.sort().values, torch.stack(want).sort().values, atol=1e-5)


def test_attention_probe_on_uniform_attention():
    # zero queries and keys: every row attends uniformly, so entropy = log n, ||J||_F^2 = 1/n - 1/n^2, range 0
    model = GPT(TINY["gpt2"])
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[: 2 * 64].zero_()
            block.attn.c_attn.bias[: 2 * 64].zero_()
    stats = attention_probe(model, tokens(T=16), max_rows=32)
    for layer in stats.values():
        n = layer["row_length"]
        assert torch.allclose(layer["entropy"], torch.log(n), atol=1e-5)
        assert torch.allclose(layer["jacobian_fro"], (1 / n - 1 / n**2).sqrt(), atol=1e-6)
        assert torch.allclose(layer["logit_range"], torch.zeros_like(n))


def test_rmsnorm_under_bf16_autocast_takes_the_fused_path_and_keeps_float32_exact():
    """A float32 gain on a bfloat16 input sends rms_norm to its unfused path with a warning on every call
    (issue 22's dry run); the gain is cast to the input's dtype, which leaves float32 training bit-identical."""
    import warnings

    import torch.nn.functional as F

    from manifold_muon_lab.models.qwen3 import RMSNorm

    norm = RMSNorm(8, 1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 8)
    assert torch.equal(norm(x), F.rms_norm(x, (8,), norm.weight, 1e-6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = norm(torch.nn.functional.linear(x, torch.eye(8)))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert norm.weight.grad is not None and norm.weight.grad.dtype == torch.float32
