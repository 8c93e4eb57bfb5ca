"""The training loop: schedule, config checks, metrics, divergence, kill-and-resume, two-process DDP.

The subprocess tests run the real command line (``python -m manifold_muon_lab.train``, and under
``torchrun``) on the cpu-tiny preset with the real models, data and optimizers.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import torchrun_train
from manifold_muon_lab import train as T
from manifold_muon_lab.config import RunError, TrainConfig, available_presets, parse_overrides, validate
from manifold_muon_lab.config import load_preset as _load_preset
from manifold_muon_lab.models import build_model

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "runs" / "presets" / "training"


def load_preset(name, **overrides):
    return _load_preset(name, PRESETS, **overrides)


def model_of(cfg, vocab_size):
    return build_model(cfg.family, **T.model_fields(cfg, vocab_size))


def tiny(tmp_path, **kw) -> TrainConfig:
    base = dict(max_steps=6, eval_every=3, spectrum_every=3, probe_every=3, checkpoint_every=0,
                out_dir=str(tmp_path / "run"))
    return load_preset("cpu-tiny", **{**base, **kw})


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def final_state(out_dir):
    return torch.load(Path(out_dir) / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]


# ----------------------------------------------------------------------------- schedule and config

def test_lr_ratio_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    r = [T.lr_ratio(s, warmup=4, max_steps=20, min_lr_ratio=0.1) for s in range(21)]
    assert r[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert r[4] == pytest.approx(1.0) and r[20] == pytest.approx(0.1)
    assert r[12] == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the decay
    assert all(a >= b for a, b in zip(r[4:], r[5:]))


def test_validate_names_the_closest_key_and_every_problem():
    with pytest.raises(ValueError, match="did you mean 'max_steps'"):
        TrainConfig.from_dict({"max_step": 10})
    with pytest.raises(ValueError, match="n_embd=30 is not divisible by n_head=4"):
        validate(TrainConfig(n_embd=30, n_head=4))
    with pytest.raises(ValueError, match="even head dimension"):
        validate(TrainConfig(family="qwen3", n_embd=30, n_head=2))
    with pytest.raises(ValueError, match="lr='fast' should be float"):
        validate(TrainConfig(lr="fast"))
    with pytest.raises(ValueError, match=r"unknown assignment 'herero' \(did you mean 'hetero'\?\); choose one of"):
        validate(TrainConfig(assignment="herero"))
    with pytest.raises(ValueError, match="block_size=64 needs at least 65 tokens"):
        validate(TrainConfig(block_size=64), data_len=50)
    with pytest.raises(ValueError, match="batch_size=6 is not divisible by world_size x gradient_accumulation"):
        validate(TrainConfig(batch_size=6, gradient_accumulation_steps=4))
    with pytest.raises(ValueError, match=r"assignment\['attn'\]: unknown manifold 'stiefle'; choose one of: .*stiefel"):
        validate(TrainConfig(assignment={"attn": ["manifold_muon", "stiefle"]}))
    with pytest.raises(ValueError, match=r"assignment\['mlp'\]: unknown optimizer 'adam'"):
        validate(TrainConfig(assignment={"mlp": "adam"}))
    validate(TrainConfig(assignment={"attn": ["manifold_muon", "stiefel"], "mlp": "muon"}))
    with pytest.raises(ValueError, match="bias and dropout apply to family gpt2 only"):
        validate(TrainConfig(family="qwen3", n_kv_head=2, dropout=0.1))
    with pytest.raises(ValueError, match=r"model_extra keys \['ffn_size'\] are not fields of Qwen3Config; remove them or use its fields: .*ffn_dim"):
        validate(TrainConfig(family="qwen3", model_extra={"ffn_size": 64}))
    assert model_of(TrainConfig(family="qwen3", model_extra={"ffn_dim": 48}), 32).config.ffn_dim == 48
    with pytest.raises(FileNotFoundError, match="choose one of: .*cpu-tiny"):
        load_preset("no-such-preset")


def test_every_preset_loads_and_validates():

    names = available_presets(PRESETS)
    assert {"cpu-tiny", "cpu", "gpt2-124m", "qwen3-120m", "qwen3-330m", "qwen3-1b"} <= set(names)
    for name in names:
        validate(load_preset(name))


@pytest.mark.parametrize("name", ["gpt2-124m", "qwen3-120m", "qwen3-330m", "qwen3-1b"])
def test_paper_presets_build_their_optimizers_for_every_listed_assignment(name):
    """Shrunk to a toy model: every per-assignment row must be accepted by the real builder."""
    from manifold_muon.assignments import build_optimizers

    cfg = load_preset(name)
    small = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, **({"n_kv_head": 1} if cfg.family == "qwen3" else {}))
    for a in {cfg.assignment, *cfg.per_assignment}:
        c = load_preset(name, assignment=a, **small)
        model = model_of(c, 64)
        opts = build_optimizers(model, c.assignment, lr=c.lr, adamw_lr=c.adamw_lr, **c.optimizer)
        assert opts and all(g["lr"] == c.lr for o in opts[:-1] for g in o.param_groups)
        assert opts[-1].param_groups[0]["lr"] == c.adamw_lr


def test_per_assignment_rows_fill_in_below_explicit_overrides():
    assert load_preset("qwen3-120m", assignment="muon").lr == 0.03  # Table 12, 120M
    assert load_preset("qwen3-1b", assignment="macro_spec").lr == 0.007
    assert load_preset("qwen3-1b", assignment="macro_spec").optimizer["split_qkv"] is True
    assert load_preset("qwen3-120m", assignment="muon", lr=0.05).lr == 0.05
    c = load_preset("gpt2-124m", assignment="hetero", optimizer={"inner_steps": 5})
    assert c.optimizer == {"inner": "post", "inner_steps": 5}  # the preset's row (the post's recipe), then the override
    assert load_preset("gpt2-124m", assignment="unconstrained").optimizer == {}


def test_parse_overrides_reads_yaml_values():
    assert parse_overrides(["lr=0.01", "bias=false", "optimizer={alpha: 0.1}"]) == {
        "lr": 0.01, "bias": False, "optimizer": {"alpha": 0.1}}
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["lr"])


# ----------------------------------------------------------------------------- one run in process

def test_a_run_records_step_eval_and_update_metrics(tmp_path):
    cfg = tiny(tmp_path)
    summary = T.train(cfg, progress=False)
    assert summary["status"] == "completed" and summary["step"] == 6
    recs = read_jsonl(Path(cfg.out_dir) / "metrics.jsonl")
    steps = [r for r in recs if r["kind"] == "step"]
    evals = [r for r in recs if r["kind"] == "eval"]
    updates = [r for r in recs if r["kind"] == "update"]
    assert [r["step"] for r in steps] == list(range(6))
    assert [r["step"] for r in evals] == [0, 3, 6] and [r["step"] for r in updates] == [0, 3]
    assert all(math.isfinite(r["loss"]) and r["time_opt_s"] > 0 and r["time_fb_s"] > 0 for r in steps)
    assert steps[0]["lr_ratio"] == pytest.approx(0.5)  # warmup 2
    for r in steps:  # the schedule reached every optimizer, as a ratio of its own base lr
        ratio = T.lr_ratio(r["step"], cfg.warmup, cfg.max_steps, cfg.min_lr_ratio)
        assert r["lr"]["AdamW"] == pytest.approx(cfg.adamw_lr * ratio)
        assert r["lr"]["ManifoldMuon"] == pytest.approx(cfg.lr * ratio)
    model_mats = {n for n, p in model_of(cfg, 32).named_parameters() if p.ndim == 2}
    e = evals[1]
    assert set(e["sigma_max"]) == model_mats and set(e["spectrum"]) == model_mats
    for name, s in e["spectrum"].items():
        assert s[0] == pytest.approx(e["sigma_max"][name], rel=1e-4) and s == sorted(s, reverse=True)
    assert set(e["attention"]) == {"0", "1"}
    for layer in e["attention"].values():
        assert 0 <= layer["jacobian_fro"]["min"] <= layer["jacobian_fro"]["max"] <= 0.5
    u = updates[0]
    assert set(u["rotation_angle"]) == model_mats
    assert all(0 <= a < 1 for a in u["rotation_angle"].values())
    assert all(v > 0 for v in u["grad_norm"].values())
    assert summary["final_val_loss"] == evals[-1]["val_loss"]
    status = json.loads((Path(cfg.out_dir) / "status.json").read_text())
    prov = json.loads((Path(cfg.out_dir) / "provenance.json").read_text())
    assert status["status"] == "completed" and prov["parameters"]["max_steps"] == 6 and prov["wall_time_s"] > 0


@pytest.mark.parametrize("rmsnorm_free", [False, True])
def test_a_qwen3_run_records_rmsnorm_gains_and_attention(tmp_path, rmsnorm_free):
    cfg = tiny(tmp_path, family="qwen3", n_head=2, n_kv_head=1, n_layer=1, max_steps=2, eval_every=2,
               spectrum_every=0, assignment="macro_spec", rmsnorm_free=rmsnorm_free)
    assert T.train(cfg, progress=False)["status"] == "completed"
    e = [r for r in read_jsonl(Path(cfg.out_dir) / "metrics.jsonl") if r["kind"] == "eval"][-1]
    assert set(e["attention"]) == {"0"} and e["attention"]["0"]["entropy"]["max"] > 0
    assert bool(e["norm_gains"]) != rmsnorm_free  # learnable gains only in the normed model
    # MACRO keeps every matrix on its spectral sphere
    assert e["constraint_residual"] and max(e["constraint_residual"].values()) < 1e-4


def test_the_command_line_refuses_a_bad_override_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        T.main(["--preset", "cpu-tiny", "--set", "n_head=3", "--out-dir", str(tmp_path / "x")])
    assert e.value.code == 2 and "n_embd=32 is not divisible by n_head=3" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_divergence_ends_the_run_cleanly_and_a_sweep_goes_on(tmp_path):
    bad = tiny(tmp_path, divergence_loss_threshold=0.5, out_dir=str(tmp_path / "bad"))
    good = tiny(tmp_path, max_steps=2, out_dir=str(tmp_path / "good"))
    results = T.sweep([bad, good], progress=False)
    assert results[0]["status"] == "diverged at step 0"
    assert json.loads((tmp_path / "bad" / "status.json").read_text())["status"] == "diverged at step 0"
    assert read_jsonl(tmp_path / "bad" / "metrics.jsonl")[-1]["kind"] == "step"  # metrics kept
    assert results[1]["status"] == "completed"


def test_a_sweep_refuses_a_bad_config_before_running_any(tmp_path):
    with pytest.raises(ValueError, match="unknown assignment"):
        T.sweep([tiny(tmp_path), tiny(tmp_path, assignment="nope")], progress=False)
    assert not (tmp_path / "run").exists()


def test_a_mismatched_or_corrupt_checkpoint_is_refused_with_advice(tmp_path):
    cfg = tiny(tmp_path, max_steps=2)
    T.train(cfg, progress=False)
    with pytest.raises(RunError, match=r"another config \(lr: 0.02 -> 0.03\).*resume=False"):
        T.train(cfg.replace(lr=0.03), progress=False)
    (Path(cfg.out_dir) / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RunError, match="unreadable.*resume=False"):
        T.train(cfg, progress=False)
    assert T.train(cfg, resume=False, progress=False)["status"] == "completed"


def test_a_trainer_stepped_by_hand_with_a_hook_takes_the_steps_of_train(tmp_path):
    """What benchmarks and probes use (bench.momenta): the loop's own setup and step, with hooks."""
    cfg = tiny(tmp_path, max_steps=4, eval_every=100, spectrum_every=0, probe_every=0, checkpoint_every=0)
    T.train(cfg, progress=False)
    seen = []
    hand = T.Trainer(cfg.replace(out_dir=str(tmp_path / "hand")),
                     hooks={"before_update": [lambda t, step: seen.append((step, t.params[0].grad is not None))],
                            "after_step": [lambda t, step, record: seen.append(record["loss"])]}).setup(resume=False)
    for _ in range(4):
        hand.step()
    hand.close()
    losses = [r["loss"] for r in read_jsonl(Path(cfg.out_dir) / "metrics.jsonl") if r["kind"] == "step"]
    assert seen == [x for s, loss in enumerate(losses) for x in ((s, True), loss)]
    a = hand.model.state_dict()
    T.Trainer(cfg, hooks={}).setup()  # resumes the finished run: its final weights
    b = final_state(cfg.out_dir)
    assert all(torch.equal(a[k], b[k]) for k in b)
    with pytest.raises(ValueError, match="unknown hook before_step"):
        T.Trainer(cfg, hooks={"before_step": []})


# ----------------------------------------------------------------------------- real processes

def _cli(args, **kw):
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "manifold_muon_lab.train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_weights(tmp_path):
    common = ["--preset", "cpu-tiny", "--no-progress", "--set", "max_steps=30", "--set", "checkpoint_every=5",
              "--set", "eval_every=15", "--set", "n_layer=1"]
    whole = _cli([*common, "--out-dir", str(tmp_path / "whole")])
    killed_dir = tmp_path / "killed"
    killed = _cli([*common, "--out-dir", str(killed_dir)])
    deadline = time.time() + 60
    while not (killed_dir / "checkpoint.pt").exists():
        assert killed.poll() is None, killed.stderr.read().decode()
        assert time.time() < deadline
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    assert not (killed_dir / "status.json").exists(), "the run finished before it could be killed"
    ck = torch.load(killed_dir / "checkpoint.pt", weights_only=False)
    assert 0 < ck["step"] < 30 and not ck["done"]
    T.main([*common, "--out-dir", str(killed_dir)])  # the rerun, in this process (saves a start-up)
    _, err = whole.communicate(timeout=120)
    assert whole.returncode == 0, err.decode()[-3000:]
    a, b = final_state(tmp_path / "whole"), final_state(killed_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit-identical
    la = [(r["kind"], r["step"], r.get("loss"), r.get("val_loss")) for r in read_jsonl(tmp_path / "whole" / "metrics.jsonl")]
    lb = [(r["kind"], r["step"], r.get("loss"), r.get("val_loss")) for r in read_jsonl(killed_dir / "metrics.jsonl")]
    assert la == lb  # every record once, the same numbers


def test_two_gloo_processes_take_the_same_steps_as_one(tmp_path):
    """2 ranks x 4 sequences against 1 process x 2 micro-batches of the same 4 + 4 sequences.

    Both sum the same two half-batch gradients and halve them (exact in floating point), so the
    weights must agree to the bit; each rank steps only its own matrices and broadcasts them, so a
    missing broadcast or a rank stepping with the wrong gradient would show. (Against a single
    batch of 8 the gradients differ by rounding, and one msign of a nearly singular 32 x 32 gradient
    turns a 1e-7 relative difference into 1e-4 in the weights: too loose a test.)
    """
    sets = {"max_steps": 3, "warmup": 0, "eval_every": 100, "probe_every": 0, "spectrum_every": 0,
            "checkpoint_every": 0}
    args = ["--preset", "cpu-tiny", "--no-progress", *[f"--set={k}={v}" for k, v in sets.items()]]
    two = torchrun_train(args, tmp_path / "two", ROOT, timeout=180)
    assert two.returncode == 0, two.stderr[-3000:]
    T.train(load_preset("cpu-tiny", **sets, gradient_accumulation_steps=2, out_dir=str(tmp_path / "one")),
            progress=False)
    a, b = final_state(tmp_path / "one"), final_state(tmp_path / "two")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not torch.equal(a["transformer.h.0.mlp.c_fc.weight"],
                           model_of(load_preset("cpu-tiny"), 256).state_dict()["transformer.h.0.mlp.c_fc.weight"])
    losses = [[r["loss"] for r in read_jsonl(tmp_path / d / "metrics.jsonl") if r["kind"] == "step"] for d in ("one", "two")]
    assert losses[0] == losses[1] and len(losses[0]) == 3


def test_training_benchmark_times_an_assignment(tmp_path):
    from manifold_muon_book.bench.training import time_assignment

    r = time_assignment("cpu-tiny", "hetero", steps=2, out_dir=tmp_path, n_layer=1)
    assert r["status"] == "completed" and r["steps_timed"] == 1
    assert 0 < r["optimizer_share"] < 1 and r["tokens_per_s"] > 0
    assert r["step_s"] == pytest.approx(r["fb_s"] + r["opt_s"])
    assert not (tmp_path / "hetero" / "checkpoint.pt").exists()  # checkpoint_every=-1: timing runs save nothing


def test_common_val_loss_evaluates_final_weights_on_batches_shared_by_seeds(tmp_path):
    from manifold_muon_lab.evaluate import common_val_loss

    a = tiny(tmp_path / "a", seed=1, checkpoint_every=3)
    b = tiny(tmp_path / "b", seed=2, checkpoint_every=3)
    for cfg in (a, b):
        assert T.train(cfg, progress=False)["status"] == "completed"
    la, lb = common_val_loss(a.out_dir, batches=2), common_val_loss(b.out_dir, batches=2)
    assert math.isfinite(la) and la == common_val_loss(a.out_dir, batches=2)   # same batches every call
    assert la != lb                                                            # the weights differ
    assert la != common_val_loss(a.out_dir, batches=2, seed=7)                 # another draw of batches
    assert math.isnan(common_val_loss(tmp_path / "nothing"))                   # no finished weights: NaN


def test_common_val_loss_of_a_big_batch_is_evaluated_in_chunks(tmp_path, monkeypatch):
    """A paper preset's global batch (1024 sequences) is not one forward pass: the evaluation splits it into equal
    chunks of at most the micro-batch and EVAL_CHUNK sequences, and their mean is the whole batch's loss."""
    import manifold_muon_lab.evaluate as E

    a = tiny(tmp_path / "a", seed=1, checkpoint_every=3)
    assert T.train(a, progress=False)["status"] == "completed"
    whole = E.common_val_loss(a.out_dir, batches=2, batch_size=12)
    monkeypatch.setattr(E, "EVAL_CHUNK", 5)   # 12 sequences in chunks of 4 (the largest divisor of 12 up to 5)
    assert E.common_val_loss(a.out_dir, batches=2, batch_size=12) == pytest.approx(whole, rel=1e-5)


def test_recording_momenta_reports_its_progress(capsys, monkeypatch):
    """bench.momenta.record_momenta (dual_ascent_shapes' recording stage, minutes at GPT-2 width): a progress line
    with the step, rate and ETA, and the weights and momenta of exactly the steps asked for."""
    from manifold_muon_book.bench import momenta

    monkeypatch.setattr(momenta, "PROGRESS_EVERY_S", 0.0)
    rec = momenta.record_momenta([1, 2], "cpu-tiny", seed=3, max_steps=10)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[record]")]
    assert [x.split(" (")[0] for x in lines] == [f"[record] training step {k} of 3" for k in (1, 2, 3)]
    assert all("steps/s, ETA" in x for x in lines)
    assert sorted(rec) == [1, 2] and all(W.shape == G.shape for W, G, _ in rec[2].values())
    momenta.record_momenta([0], "cpu-tiny", seed=3, max_steps=10, progress=False)
    assert "[record]" not in capsys.readouterr().out


def test_a_cpu_run_under_torchrun_takes_gloo_on_a_machine_with_cuda_too(monkeypatch):
    """nccl cannot reduce CPU tensors: a ``device: cpu`` config (the gpu-dry presets) on a GPU box must get gloo."""
    from manifold_muon_lab import distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert distributed.backend("cpu") == "gloo"
    assert distributed.backend("auto") == distributed.backend("cuda") == "nccl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert {distributed.backend(d) for d in ("cpu", "auto", "cuda")} == {"gloo"}
