"""The metric functions against cases whose answers are known in closed form."""

import json
import math

import pytest
import torch

from manifold_muon_lab import metrics


def test_sigma_max_and_spectrum_of_a_rotated_diagonal():
    Q1, _ = torch.linalg.qr(torch.randn(5, 5))
    Q2, _ = torch.linalg.qr(torch.randn(3, 3))
    s = torch.tensor([3.0, 2.0, 0.5])
    W = Q1[:, :3] @ torch.diag(s) @ Q2.T
    assert metrics.sigma_max(W) == pytest.approx(3.0, rel=1e-5)
    assert metrics.singular_values(W) == pytest.approx([3.0, 2.0, 0.5], rel=1e-5)
    with pytest.raises(ValueError, match="expected a matrix"):
        metrics.sigma_max(torch.ones(3))


@pytest.mark.parametrize("theta", [1e-7, 1e-3, 0.3, 1.2, math.pi - 1e-3])
def test_rotation_angle_is_the_angle_in_the_plane_of_two_orthonormal_matrices(theta):
    A = torch.randn(6, 4, dtype=torch.float64)
    B = torch.randn(6, 4, dtype=torch.float64)
    A = A / A.norm()
    B = B - (B * A).sum() * A
    B = B / B.norm()
    W_old = 2.5 * A
    W_new = 0.7 * (math.cos(theta) * A + math.sin(theta) * B)  # the scale must not matter
    assert metrics.rotation_angle(W_new, W_old) == pytest.approx(theta, rel=1e-6)
    # the definition in the brief, arccos of the cosine, agrees where it is accurate
    if theta > 1e-3:
        cos = (W_new * W_old).sum() / (W_new.norm() * W_old.norm())
        assert metrics.rotation_angle(W_new, W_old) == pytest.approx(math.acos(cos.item()), rel=1e-6)


def test_rotation_angle_of_a_zero_matrix_is_nan():
    assert math.isnan(metrics.rotation_angle(torch.zeros(2, 2), torch.eye(2)))


def test_relative_update():
    W_old = torch.tensor([[3.0, 0.0], [0.0, 4.0]])  # |W_old|_F = 5
    W_new = W_old + torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    assert metrics.relative_update(W_new, W_old) == pytest.approx(0.2)


def test_grad_norms_by_module_groups_weight_and_bias():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1, bias=False))
    model[0].weight.grad = torch.full((2, 3), 1.0)
    model[0].bias.grad = torch.full((2,), 2.0)
    model[2].weight.grad = torch.tensor([[3.0, 4.0]])
    g = metrics.grad_norms_by_module(model)
    assert g == pytest.approx({"0": math.sqrt(6 + 8), "2": 5.0})


class _UnitSphere:
    """Stand-in manifold: matrices of unit Frobenius norm."""

    def residual(self, W):
        return (W.norm() - 1).abs()


def test_constraint_residual_uses_the_manifold():
    W = torch.eye(2) / math.sqrt(2)
    assert metrics.constraint_residual(_UnitSphere(), W) == pytest.approx(0.0, abs=1e-7)
    assert metrics.constraint_residual(_UnitSphere(), 3 * W) == pytest.approx(2.0)


class RMSNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))


def test_norm_gains_finds_layernorm_and_rmsnorm_and_nothing_else():
    model = torch.nn.ModuleDict({"ln": torch.nn.LayerNorm(4), "rms": RMSNorm(3), "fc": torch.nn.Linear(3, 3)})
    with torch.no_grad():
        model["rms"].weight.copy_(torch.tensor([0.5, 1.0, 3.0]))
    g = metrics.norm_gains(model)
    assert set(g) == {"ln", "rms"}
    assert g["rms"] == pytest.approx({"mean": 1.5, "min": 0.5, "max": 3.0})


def test_is_diverged():
    assert metrics.is_diverged(float("nan"), 10.0)
    assert metrics.is_diverged(float("inf"), 10.0)
    assert metrics.is_diverged(10.5, 10.0)
    assert not metrics.is_diverged(9.9, 10.0)


def test_jsonable_gives_strict_json():
    x = {"a": torch.tensor(1.5), "b": torch.tensor([1.0, 2.0]), 3: (float("nan"), float("inf"))}
    s = json.dumps(metrics.jsonable(x), allow_nan=False)
    assert json.loads(s) == {"a": 1.5, "b": [1.0, 2.0], "3": ["nan", "inf"]}


def test_attention_summary_reduces_rows_per_layer_and_statistic():
    stats = {0: {"logit_range": torch.tensor([1.0, 3.0]), "jacobian_fro": torch.tensor([0.5, 0.1])},
             3: {"logit_range": torch.tensor([2.0])}}
    s = metrics.attention_summary(stats)
    assert s["0"]["logit_range"] == pytest.approx({"mean": 2.0, "min": 1.0, "max": 3.0})
    assert s["0"]["jacobian_fro"]["min"] == pytest.approx(0.1)
    assert s["3"]["logit_range"] == pytest.approx({"mean": 2.0, "min": 2.0, "max": 2.0})


def test_read_metrics_filters_by_kind_and_restores_non_finite_numbers(tmp_path):
    lines = [{"kind": "step", "step": 0, "loss": 2.0}, {"kind": "eval", "step": 0, "val_loss": float("nan")},
             {"kind": "step", "step": 1, "loss": float("inf")}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(metrics.jsonable(r)) + "\n" for r in lines))
    steps = metrics.read_metrics(tmp_path, "step")
    assert [r["loss"] for r in steps] == [2.0, float("inf")]
    assert math.isnan(metrics.read_metrics(tmp_path / "metrics.jsonl", "eval")[0]["val_loss"])
    assert len(metrics.read_metrics(tmp_path)) == 3
    with pytest.raises(FileNotFoundError, match="run manifold_muon_lab.train first"):
        metrics.read_metrics(tmp_path / "nothing")
