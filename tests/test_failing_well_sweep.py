"""Parallel sweeps: ``sweep(cfgs, workers=k)`` runs independent configs in k worker processes, keeps the
failure policy of the sequential sweep (a diverged or failed run is recorded, the others go on; every
config is checked before any starts) and returns the results in the order of the configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from manifold_muon_lab import train as T
from manifold_muon_lab.config import RunError
from manifold_muon_lab.config import load_preset as _load_preset

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "runs" / "presets" / "training"


def cfg(tmp_path, name, **kw):
    base = dict(max_steps=4, eval_every=2, spectrum_every=0, probe_every=0, n_layer=1, checkpoint_every=0)
    return _load_preset("cpu-tiny", PRESETS, **{**base, **kw, "out_dir": str(tmp_path / name)})


def weights(out_dir):
    return torch.load(Path(out_dir) / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]


def test_a_parallel_sweep_matches_the_sequential_one_in_order_and_failure_policy(tmp_path):
    good = [cfg(tmp_path / "par", f"seed{s}", seed=s) for s in (1, 2)]
    bad = cfg(tmp_path / "par", "diverges", divergence_loss_threshold=0.5)
    broken = cfg(tmp_path / "par", "broken")
    Path(broken.out_dir).mkdir(parents=True)
    (Path(broken.out_dir) / "checkpoint.pt").write_bytes(b"not a checkpoint")  # a run that fails (RunError)
    results = T.sweep([good[0], bad, broken, good[1]], progress=False, workers=2)
    assert [r["out_dir"] for r in results] == [c.out_dir for c in (good[0], bad, broken, good[1])]  # input order
    assert results[1]["status"] == "diverged at step 0"
    assert results[2]["status"].startswith("failed: RunError: checkpoint") and "unreadable" in results[2]["status"]
    assert results[0]["status"] == results[3]["status"] == "completed"
    # each worker ran its config as a run in this process would: the same weights, to the bit
    for c in good:
        alone = c.replace(out_dir=str(tmp_path / "alone" / Path(c.out_dir).name))
        T.train(alone, progress=False)
        a, b = weights(alone.out_dir), weights(c.out_dir)
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert results[0]["final_val_loss"] != results[3]["final_val_loss"]  # two seeds, two runs
    status = json.loads((tmp_path / "par" / "diverges" / "status.json").read_text())
    assert status["status"] == "diverged at step 0"


@pytest.mark.parametrize("workers", [1, 2])
def test_every_config_is_checked_before_any_run_starts(tmp_path, workers):
    ok = cfg(tmp_path, "first")
    with pytest.raises(ValueError, match="did you mean 'inner_steps'"):
        T.sweep([ok, cfg(tmp_path, "typo", optimizer={"inner_step": 3})], progress=False, workers=workers)
    with pytest.raises(RunError, match="3 runs of this config needs about .* GiB"):
        T.sweep([ok, cfg(tmp_path, "b"), cfg(tmp_path, "c", batch_size=2**24)], progress=False, workers=3)
    assert not (tmp_path / "first").exists()


def test_workers_must_be_a_positive_count(tmp_path):
    with pytest.raises(ValueError, match="workers=0 must be a positive int"):
        T.sweep([cfg(tmp_path, "a")], workers=0)


NOISY = "manifold_muon_book.evidence:noisy_msign_muon"


def test_a_context_reaches_every_run_in_whichever_process_trains_it(tmp_path):
    """The msign-tolerance run trains Muon with a noisy matrix sign, swapped into the optimizer registry by a
    context manager; named as the sweep's ``context`` it reaches the worker processes too, and a worker's
    run gives the weights of the same run trained in this process, to the bit."""
    noisy = [cfg(tmp_path / mode, f"eps{eps}", assignment="unconstrained", optimizer={"msign_noise": eps})
             for mode in ("seq", "par") for eps in (0.0, 0.5)]
    seq = T.sweep(noisy[:2], progress=False, workers=1, context=NOISY)
    par = T.sweep(noisy[2:], progress=False, workers=2, context=NOISY)
    assert [r["status"] for r in seq + par] == ["completed"] * 4
    for a, b in zip(noisy[:2], noisy[2:]):
        wa, wb = weights(a.out_dir), weights(b.out_dir)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    w0, w5 = weights(noisy[2].out_dir), weights(noisy[3].out_dir)
    assert not all(torch.equal(w0[k], w5[k]) for k in w0)   # the noise level reached the worker's optimizer


@pytest.mark.parametrize("context, message", [
    ("manifold_muon_book.evidence.noisy_msign_muon", "must be 'module:function'"),
    ("no_such_module_here:f", "cannot import 'no_such_module_here'"),
    ("manifold_muon_book.evidence:no_such_function", "has no callable 'no_such_function'"),
])
def test_a_bad_context_is_refused_before_any_run_starts(tmp_path, context, message):
    with pytest.raises(ValueError, match=message):
        T.sweep([cfg(tmp_path, "a"), cfg(tmp_path, "b")], progress=False, workers=2, context=context)
    assert not (tmp_path / "a").exists()
