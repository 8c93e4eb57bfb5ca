"""Parallel sweeps: ``sweep(cfgs, workers=k)`` runs independent configs in k worker processes, keeps the
failure policy of the sequential sweep (a diverged or failed run is recorded, the others go on; every
config is checked before any starts) and returns the results in the order of the configs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from manifold_muon.optim import ManifoldMuon
from manifold_muon.optim.muon import Muon
from manifold_muon_lab import train as T
from manifold_muon_lab.config import RunError
from manifold_muon_lab.sweep import RUN_FAILURES, sweep
from manifold_muon_lab.config import load_preset as _load_preset

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "runs" / "presets" / "training"


def cfg(tmp_path, name, **kw):
    base = dict(max_steps=4, eval_every=2, spectrum_every=0, probe_every=0, n_layer=1, checkpoint_every=0)
    return _load_preset("cpu-tiny", PRESETS, **{**base, **kw, "out_dir": str(tmp_path / name)})


def weights(out_dir):
    return torch.load(Path(out_dir) / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]


def test_a_parallel_sweep_matches_the_sequential_one_in_order_and_failure_policy(tmp_path, capsys):
    good = [cfg(tmp_path / "par", f"seed{s}", seed=s) for s in (1, 2)]
    bad = cfg(tmp_path / "par", "diverges", divergence_loss_threshold=0.5)
    broken = cfg(tmp_path / "par", "broken")
    Path(broken.out_dir).mkdir(parents=True)
    (Path(broken.out_dir) / "checkpoint.pt").write_bytes(b"not a checkpoint")  # a run that fails (RunError)
    results = T.sweep([good[0], bad, broken, good[1]], progress=False, workers=2)
    assert [r["out_dir"] for r in results] == [c.out_dir for c in (good[0], bad, broken, good[1])]  # input order
    # one line per finished run, also with progress=False (the notebooks' setting), failed runs included
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[sweep] ")]
    assert [x.split(" (")[0] for x in lines] == [f"[sweep] {k} of 4 runs done" for k in range(1, 5)]
    assert any("diverged at step 0" in x for x in lines) and all("min left" in x for x in lines)
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


BUG_MARKER = "MANIFOLD_MUON_TEST_BUG_MARKER"  # a file BuggyMuon touches before it raises (where the variable is set)


class BuggyMuon(Muon):
    """A bug in a run (a TypeError at its first optimizer step): it must stop the sweep, not be recorded."""

    def step(self, closure=None):
        if os.environ.get(BUG_MARKER):
            Path(os.environ[BUG_MARKER]).touch()
        raise TypeError("a bug in BuggyMuon.step")


class WaitsForTheBug(ManifoldMuon):
    """ManifoldMuon whose first step waits until BuggyMuon has raised in another worker (its marker file, then half a
    second for the sweep to hear of it; at most a minute): so the run is still in flight when the bug arrives,
    whatever the two workers' start-up times (the test below raced on them: CI of 2026-12-07 saw the other run
    finish, and a third start, before the buggy worker had reached its first step)."""

    def step(self, closure=None):
        marker = os.environ.get(BUG_MARKER)
        if marker and not getattr(self, "_waited", False):
            deadline = time.monotonic() + 60
            while not Path(marker).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.5)
            self._waited = True
        return super().step(closure)


class DyingMuon(Muon):
    """A run whose process dies (as one killed by the OOM killer would)."""

    def step(self, closure=None):
        os._exit(3)


def test_an_explicit_optimizer_reaches_every_run_in_whichever_process_trains_it(tmp_path):
    """The msign-tolerance run trains Muon with a noisy matrix sign: ``optimizers={"muon": NoisyMuon}`` is
    used by every run, in this process and in the workers, and a worker's run gives the weights of the same
    run trained in this process, to the bit."""
    from manifold_muon_book.evidence import NoisyMuon

    noisy = [cfg(tmp_path / mode, f"eps{eps}", assignment="unconstrained", optimizer={"msign_noise": eps})
             for mode in ("seq", "par") for eps in (0.0, 0.5)]
    seq = T.sweep(noisy[:2], progress=False, workers=1, optimizers={"muon": NoisyMuon})
    par = sweep(noisy[2:], progress=False, workers=2, optimizers={"muon": NoisyMuon})
    assert [r["status"] for r in seq + par] == ["completed"] * 4
    for a, b in zip(noisy[:2], noisy[2:]):
        wa, wb = weights(a.out_dir), weights(b.out_dir)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    w0, w5 = weights(noisy[2].out_dir), weights(noisy[3].out_dir)
    assert not all(torch.equal(w0[k], w5[k]) for k in w0)   # the noise level reached the worker's optimizer
    plain = cfg(tmp_path, "plain", assignment="unconstrained")
    T.train(plain, progress=False)                          # Muon's own msign: other weights than eps = 0
    wp = weights(plain.out_dir)
    assert not all(torch.equal(wp[k], w0[k]) for k in wp)
    prov = json.loads((Path(noisy[3].out_dir) / "provenance.json").read_text())
    assert prov["parameters"]["optimizer_classes"] == {"muon": "manifold_muon_book.evidence.NoisyMuon"}
    with pytest.raises(ValueError, match="no optimizer of assignment 'unconstrained' takes msign_noise"):
        sweep([cfg(tmp_path, "x", assignment="unconstrained", optimizer={"msign_noise": 0.1})], progress=False)


def test_a_bad_optimizers_argument_is_refused_before_any_run_starts(tmp_path):
    class Local(Muon):
        pass

    runs = [cfg(tmp_path, "a"), cfg(tmp_path, "b")]
    for optimizers, message in [("muon", "must be a dict"), ({"muom": Muon}, "'muom' is not a name of the optimizer"),
                                ({"muon": len}, "must be an optimizer class"),
                                ({"muon": Local}, "cannot be imported by a worker process")]:
        with pytest.raises(ValueError, match=message):
            sweep(runs, progress=False, workers=2, optimizers=optimizers)
    assert not (tmp_path / "a").exists()


def test_run_errors_are_not_runtime_errors():
    assert not issubclass(RunError, RuntimeError) and RunError in RUN_FAILURES and RuntimeError not in RUN_FAILURES


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bug_stops_the_sweep_after_the_runs_in_flight_and_is_raised_with_its_traceback(tmp_path, capfd, workers,
                                                                                         monkeypatch):
    first = cfg(tmp_path, "first", max_steps=30, eval_every=30)
    buggy = cfg(tmp_path, "buggy", assignment="unconstrained")
    after = cfg(tmp_path, "after")
    order = [first, buggy, after] if workers == 1 else [buggy, first, after]
    optimizers = {"muon": BuggyMuon}
    if workers > 1:  # "first" (ManifoldMuon) is in flight when the bug arrives, by construction (``WaitsForTheBug``)
        monkeypatch.setenv(BUG_MARKER, str(tmp_path / "bug_raised"))
        optimizers["manifold_muon"] = WaitsForTheBug
    with pytest.raises(TypeError, match="a bug in BuggyMuon.step"):
        sweep(order, progress=False, workers=workers, optimizers=optimizers)
    assert json.loads((tmp_path / "first" / "status.json").read_text())["status"] == "completed"  # it ran to its end
    assert json.loads((tmp_path / "buggy" / "status.json").read_text())["status"].startswith("failed: TypeError")
    assert not (tmp_path / "after").exists()  # no run starts after a bug
    if workers > 1:
        err = capfd.readouterr().err
        assert "raised TypeError, a bug, not a run failure" in err and "BuggyMuon" in err and "Traceback" in err


def test_a_worker_that_dies_is_a_failed_run_and_the_others_go_on(tmp_path):
    dying = cfg(tmp_path, "dying", assignment="unconstrained")
    good = [cfg(tmp_path, f"good{s}", seed=s) for s in (1, 2)]
    results = sweep([dying, *good], progress=False, workers=2, optimizers={"muon": DyingMuon})
    assert results[0]["status"].startswith("failed: RunError: its process died")
    assert [r["status"] for r in results[1:]] == ["completed", "completed"]


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("import sys\nsys.path[:0] = " + repr([str(ROOT / "lib")]) + "\n"
                    "from manifold_muon_lab.config import load_preset\nfrom manifold_muon_lab.sweep import sweep\n"
                    f"cfgs = [load_preset('cpu-tiny', {str(PRESETS)!r}, max_steps=400, eval_every=400, n_layer=1, "
                    f"spectrum_every=0, probe_every=0, checkpoint_every=0, seed=s, out_dir={str(tmp_path)!r} + f'/s{{s}}') "
                    "for s in (1, 2)]\n" + body)
    return path


def test_a_parallel_sweep_outside_a_main_guard_is_refused_before_any_run(tmp_path):
    """A spawned worker imports a ``__main__`` file again: unguarded, the sweep would start anew in it."""
    script = _script(tmp_path, "unguarded.py", "sweep(cfgs, workers=2, progress=False)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "outside `if __name__ == \"__main__\":`" in out.stderr, out.stderr[-2000:]
    assert "unguarded.py:" in out.stderr and not (tmp_path / "s1").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signalled_parallel_sweep_stops_its_runs_at_a_checkpoint_and_resumes(tmp_path, sig):
    """Started from a script with its main guard: the signal reaches the sweep (the workers ignore SIGINT),
    which stops every run in flight at a step boundary with a checkpoint; sweeping again finishes them."""
    body = ("from manifold_muon_lab.train import Interrupted\nif __name__ == '__main__':\n"
            "    try:\n        sweep(cfgs, workers=2, progress=False)\n"
            "    except Interrupted as e:\n        print('INTERRUPTED', e.exit_code, flush=True)\n")
    script = _script(tmp_path, "guarded.py", body)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # even if this shell ignores it
    deadline = time.time() + 120
    while not all((tmp_path / s / "metrics.jsonl").exists() and (tmp_path / s / "metrics.jsonl").stat().st_size > 2000
                  for s in ("s1", "s2")):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert f"INTERRUPTED {128 + sig}" in out, err[-3000:]
    for s in ("s1", "s2"):
        status = json.loads((tmp_path / s / "status.json").read_text())["status"]
        assert status.startswith("interrupted at step ") and (tmp_path / s / "checkpoint.pt").exists()
    from manifold_muon_lab.config import load_preset

    again = [load_preset("cpu-tiny", PRESETS, max_steps=400, eval_every=400, n_layer=1, spectrum_every=0, probe_every=0,
                         checkpoint_every=0, seed=s, out_dir=str(tmp_path / f"s{s}")) for s in (1, 2)]
    assert [r["status"] for r in sweep(again, progress=False, workers=1)] == ["completed"] * 2
