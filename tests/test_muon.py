"""Muon: the same steps as torch.optim.Muon, batching, state_dict, schedulers, refusals."""

import copy

import pytest
import torch

from manifold_muon.optim import TORCH_MUON, Muon

SHAPES = [(8, 4), (8, 4), (4, 8), (6, 6), (3, 10)]


def run_pair(ours_kw, torch_kw, steps=6, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=g, dtype=dtype) for s in SHAPES]
    grads = [[torch.randn(s, generator=g, dtype=dtype) for s in SHAPES] for _ in range(steps)]
    a = [p.clone().requires_grad_() for p in init]
    b = [p.clone().requires_grad_() for p in init]
    oa, ob = Muon(a, **{**TORCH_MUON, **ours_kw}), torch.optim.Muon(b, **torch_kw)
    for gs in grads:
        for x, y, gr in zip(a, b, gs):
            x.grad, y.grad = gr.clone(), gr.clone()
        oa.step()
        ob.step()
    return a, b, init


@pytest.mark.parametrize(
    "kw",
    [
        dict(lr=0.02),
        dict(lr=0.05, nesterov=False, momentum=0.9, weight_decay=0.0),
        dict(lr=0.01, weight_decay=0.3, adjust_lr_fn="match_rms_adamw"),
        dict(lr=0.01, ns_steps=3, eps=1e-5, ns_coefficients=(3.0, -3.2, 1.2)),
    ],
)
def test_matches_torch_muon(kw):
    a, b, init = run_pair(kw, kw)
    for x, y, p0 in zip(a, b, init):
        assert (x - p0).abs().max() > 1e-3  # the weights did move
        assert torch.allclose(x, y, atol=1e-6, rtol=0), (x - y).abs().max()


def test_state_dict_round_trip_continues_identically():
    g = torch.Generator().manual_seed(1)
    W = [torch.randn(6, 4, generator=g).requires_grad_() for _ in range(2)]
    grads = [[torch.randn(6, 4, generator=g) for _ in W] for _ in range(4)]
    opt = Muon(W, lr=0.02)
    for gs in grads[:2]:
        for p, gr in zip(W, gs):
            p.grad = gr
        opt.step()
    saved_w, saved_state = [p.detach().clone() for p in W], copy.deepcopy(opt.state_dict())
    for gs in grads[2:]:
        for p, gr in zip(W, gs):
            p.grad = gr
        opt.step()
    W2 = [w.clone().requires_grad_() for w in saved_w]
    opt2 = Muon(W2, lr=0.5)
    opt2.load_state_dict(saved_state)
    assert opt2.param_groups[0]["lr"] == 0.02
    for gs in grads[2:]:
        for p, gr in zip(W2, gs):
            p.grad = gr
        opt2.step()
    for p, q in zip(W, W2):
        assert torch.equal(p, q)


def test_lr_scheduler_drives_lr():
    W = torch.randn(4, 4, requires_grad=True)
    opt = Muon([W], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    W.grad = torch.randn(4, 4)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


@pytest.mark.parametrize("method", ["polar_express", "svd"])
def test_other_msign_methods_give_orthogonal_updates(method):
    W = torch.zeros(8, 4, requires_grad=True)
    opt = Muon([W], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False, msign=method,
               msign_dtype=torch.float32, ns_steps=8)
    W.grad = torch.randn(8, 4)
    opt.step()
    update = -W.detach() / (8 / 4) ** 0.5  # undo the 'original' lr adjustment
    assert torch.allclose(update.T @ update, torch.eye(4), atol=1e-4)


def test_momentum_buffer_is_torch_convention_an_ema():
    W = torch.zeros(3, 2, requires_grad=True)
    opt = Muon([W], lr=0.1, momentum=0.9, msign="svd")
    for g in (torch.ones(3, 2), torch.full((3, 2), 3.0)):
        W.grad = g
        opt.step()
    assert torch.allclose(opt.state[W]["momentum_buffer"], torch.full((3, 2), 0.9 * 0.1 + 0.1 * 3))


def test_vector_parameter_is_refused_with_advice():
    with pytest.raises(ValueError, match="AdamW"):
        Muon([torch.randn(5, requires_grad=True)])


def test_3d_parameter_is_refused_with_advice():
    with pytest.raises(ValueError, match="reshape"):
        Muon([torch.randn(2, 3, 4, requires_grad=True)])


def test_bad_config_is_refused():
    W = [torch.randn(3, 3, requires_grad=True)]
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        Muon(W, adjust_lr_fn="sqrt")
    with pytest.raises(ValueError, match="unknown msign 'qr'"):
        Muon(W, msign="qr")
    with pytest.raises(ValueError, match="lr"):
        Muon(W, lr=-1.0)


def test_default_muon_is_torch_optim_muon_bit_for_bit():
    """Muon() with default arguments takes exactly torch.optim.Muon()'s steps: several steps, tall, wide and square
    weights, two param groups (one with its own lr and weight decay), same-shape weights batched."""
    torch.manual_seed(0)
    shapes = [(32, 16), (16, 48), (16, 48), (20, 20)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    groups = lambda ps: [{"params": ps[:2]}, {"params": ps[2:], "lr": 0.01, "weight_decay": 0.0}]
    a, b = Muon(groups(ours)), torch.optim.Muon(groups(theirs))
    for _ in range(6):
        for p, q in zip(ours, theirs):
            g = torch.randn(p.shape)
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs))


def test_newton_schulz_settings_are_refused_where_they_would_do_nothing():
    W = torch.nn.Parameter(torch.randn(8, 4))
    with pytest.raises(ValueError, match="do nothing with msign='polar_express'"):
        Muon([W], msign="polar_express", ns_coefficients=(3.0, -3.0, 1.0))
    Muon([W], msign="polar_express")  # the defaults are fine
