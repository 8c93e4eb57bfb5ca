"""Runs that fail well under torchrun (issue 22, item 4): ``python -m manifold_muon_lab.launch`` (torchrun's
launcher in-process) with 2 gloo ranks on cpu-tiny. A bad config is one sentence and exit 2; SIGINT/SIGTERM
stop every rank at one step boundary with a checkpoint, one sentence, exit 130/143, and the run resumes
bit-identically; a second SIGINT during the checkpoint write waits for it; a signal while starting is one
sentence and 130. The second-signal cases are also checked in this process, where the timing is exact.
"""

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

from manifold_muon_lab import checkpoint as C
from manifold_muon_lab import train as T
from manifold_muon_lab.config import load_preset

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "runs" / "presets" / "training"
LAUNCH = [sys.executable, "-m", "manifold_muon_lab.launch", "--nproc_per_node", "2"]
TRAIN = ["-m", "manifold_muon_lab.train"]
ARGS = ["--preset", "cpu-tiny", "--set", "max_steps=40", "--set", "n_layer=1", "--set", "eval_every=20",
        "--set", "spectrum_every=20", "--set", "probe_every=20", "--set", "checkpoint_every=0"]
ENV = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}

# The checkpoint write made slow (rank 0's checkpoint.pt: between the tmp file and os.replace), and said on
# stderr, so that a test can send its second signal while the write is in flight.
SLOW_SAVE = '''
import os, sys, time
from manifold_muon_lab import checkpoint

real = checkpoint.save_atomic

def slow(obj, path):
    if path.name != "checkpoint.pt":
        return real(obj, path)
    tmp = path.with_name(f".{path.name}.tmp")
    checkpoint.torch.save(obj, tmp)
    print("[slow save] writing checkpoint.pt", file=sys.stderr, flush=True)
    time.sleep(2.0)
    os.replace(tmp, path)

checkpoint.save_atomic = slow
from manifold_muon_lab.train import main
main()
'''


def _launch(args, **kw):
    return subprocess.Popen([*LAUNCH, *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def _messages(err: str) -> list[str]:
    """stderr without the progress lines (and the test's own slow-save notes)."""
    return [line for line in err.splitlines() if not line.startswith(("[train ", "[slow save]"))]


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _assert_same_run(a: Path, b: Path) -> None:
    ma = torch.load(a / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]
    mb = torch.load(b / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)  # bit-identical
    key = lambda r: (r["kind"], r["step"], r.get("loss"), r.get("val_loss"), r.get("sigma_max"))  # noqa: E731
    assert [key(r) for r in read_jsonl(a / "metrics.jsonl")] == [key(r) for r in read_jsonl(b / "metrics.jsonl")]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    proc = _launch([*TRAIN, *ARGS, "--no-progress", "--out-dir", str(out)])
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    assert err == "", err  # no warnings of torchrun's agent
    return out


# ----------------------------------------------------------------------------- (a) a bad config

@pytest.mark.parametrize("bad, expected", [
    (["--set", "n_layr=1"], "unknown config key 'n_layr'"),                   # refused while reading the preset
    (["--set", "lr=abc"], "bad training config: lr='abc' should be float"),  # refused by every rank's preflight
], ids=["unknown-key", "bad-value"])
def test_a_bad_config_under_the_launcher_is_one_sentence_and_exit_2(tmp_path, bad, expected):
    out = tmp_path / "run"
    proc = _launch([*TRAIN, "--preset", "cpu-tiny", *bad, "--out-dir", str(out)])
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    assert err.count("\n") == 1 and err.startswith("python -m manifold_muon_lab.train: error: ") and expected in err
    assert "Traceback" not in err and stdout == "" and not out.exists()


def test_a_busy_out_dir_is_refused_once_for_all_ranks(tmp_path):
    """Only rank 0 takes the lock; the other rank learns of the refusal instead of waiting for rank 0."""
    out = tmp_path / "busy"
    out.mkdir()
    with C.OutDirLock(out):
        proc = _launch([*TRAIN, *ARGS, "--out-dir", str(out)])
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    assert err.count("\n") == 1 and f"{out} is in use by another run (pid {os.getpid()} on " in err
    assert sorted(p.name for p in out.iterdir()) == []


def test_the_launcher_refuses_elastic_restarts_and_takes_torchruns_options():
    proc = _launch(["--max-restarts", "1", *TRAIN, "--preset", "cpu-tiny"])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err.count("\n") == 1 and "does not restart ranks" in err, err


# ----------------------------------------------------------------------------- (b) SIGINT / SIGTERM

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_launcher_stops_every_rank_with_a_checkpoint_and_the_run_resumes_bit_identically(
        tmp_path, sig, uninterrupted):
    out = tmp_path / "run"
    proc = _launch([*TRAIN, *ARGS, "--out-dir", str(out)])
    first = proc.stderr.readline()  # the progress lines come while the run runs (rank 0's only)
    assert first.startswith("[train run] step 2/40 loss ") and proc.poll() is None, first + proc.stderr.read()
    proc.send_signal(sig)  # as Ctrl-C does: the ranks are in sessions of their own, the launcher passes it on
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    status = json.loads((out / "status.json").read_text())
    n = int(status["status"].removeprefix("interrupted at step "))
    assert 2 <= n < 40 and status["step"] == n
    assert _messages(err) == [f"python -m manifold_muon_lab.train: {sig.name}: {out} interrupted at step {n}, a "
                              "checkpoint was written there; run the same command again to resume"], err
    assert stdout == ""
    ckpt = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert ckpt["step"] == n and not ckpt["done"] and ckpt["world_size"] == 2
    assert {p.name for p in out.glob("optim_rank*")} == {f"optim_rank{r}_step{n}.pt" for r in (0, 1)}
    assert not (out / C.LOCK).exists()

    again = _launch([*TRAIN, *ARGS, "--no-progress", "--out-dir", str(out)])  # the same command resumes
    _, err = again.communicate(timeout=180)
    assert again.returncode == 0 and err == "", err[-3000:]
    assert json.loads((out / "status.json").read_text())["status"] == "completed"
    _assert_same_run(uninterrupted, out)


# ----------------------------------------------------------------------------- (c) a second signal

def test_a_second_sigint_during_the_checkpoint_write_waits_for_it(tmp_path, uninterrupted):
    script = tmp_path / "slow_save.py"
    script.write_text(SLOW_SAVE)
    out = tmp_path / "run"
    proc = _launch([str(script), *ARGS, "--out-dir", str(out)])
    assert proc.stderr.readline().startswith("[train run] step 2/40 loss ")
    proc.send_signal(signal.SIGINT)
    lines = []
    while not (line := proc.stderr.readline()).startswith("[slow save]"):
        assert line, "".join(lines) + proc.stderr.read()
        lines.append(line)
    proc.send_signal(signal.SIGINT)  # while rank 0 writes checkpoint.pt (and rank 1 waits for it)
    _, err = proc.communicate(timeout=120)
    err = "".join(lines) + err
    assert proc.returncode == 130, err[-3000:]
    n = json.loads((out / "status.json").read_text())["step"]
    assert _messages(err) == [f"python -m manifold_muon_lab.train: SIGINT: {out} interrupted at step {n}, a "
                              "checkpoint was written there; run the same command again to resume"], err
    assert torch.load(out / "checkpoint.pt", weights_only=False)["step"] == n  # complete, and the one to resume

    again = _launch([*TRAIN, *ARGS, "--no-progress", "--out-dir", str(out)])
    _, err = again.communicate(timeout=180)
    assert again.returncode == 0, err[-3000:]
    _assert_same_run(uninterrupted, out)


def _tiny(tmp_path, name, **kw):
    base = dict(max_steps=8, eval_every=4, spectrum_every=0, probe_every=0, n_layer=1, checkpoint_every=3)
    return load_preset("cpu-tiny", PRESETS, **{**base, **kw, "out_dir": str(tmp_path / name)})


def _signal_self(times: int):
    for _ in range(times):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs at once, in this (the main) thread


def test_a_second_signal_mid_step_stops_at_once_and_the_last_checkpoint_resumes(tmp_path, monkeypatch):
    """In one process (the same code as each rank's): the second SIGINT at step 4, after the checkpoint of
    step 3, raises ``Interrupted(at_once)``; the status says so; the same config resumes from step 3."""
    cfg = _tiny(tmp_path, "once")
    real_emit = T.Recorder.emit

    def emit(self, record):
        real_emit(self, record)
        if record.get("kind") == "step" and record["step"] == 4:
            _signal_self(2)

    monkeypatch.setattr(T.Recorder, "emit", emit)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(T.Interrupted) as e:
        T.train(cfg, progress=False)
    assert e.value.at_once and e.value.exit_code == 130
    assert str(e.value) == (f"SIGINT again: {cfg.out_dir} stopped at once during step 4; its checkpoint of step 3 "
                            "is intact; run the same command again to resume from there")
    status = json.loads((Path(cfg.out_dir) / "status.json").read_text())
    assert status["status"].startswith("interrupted during step 4, stopped at once by a second signal")
    assert torch.load(Path(cfg.out_dir) / "checkpoint.pt", weights_only=False)["step"] == 3
    assert signal.getsignal(signal.SIGINT) is before  # the run's handlers are gone

    monkeypatch.setattr(T.Recorder, "emit", real_emit)
    assert T.train(cfg, progress=False)["status"] == "completed"
    whole = cfg.replace(out_dir=str(tmp_path / "whole"))
    T.train(whole, progress=False)
    _assert_same_run(Path(whole.out_dir), Path(cfg.out_dir))


@pytest.mark.parametrize("signals, expected_step", [(1, 4), (2, 3)], ids=["second-waits", "third-aborts"])
def test_signals_during_a_checkpoint_write(tmp_path, monkeypatch, signals, expected_step):
    """The first SIGINT after step 3's record; during the write of the step-4 checkpoint (the stop), one more
    waits for the write (the run stops there, at step 4), two more abort it: the step-3 checkpoint stays."""
    cfg = _tiny(tmp_path, "write")
    real_emit, real_save = T.Recorder.emit, C.save_atomic

    def emit(self, record):
        real_emit(self, record)
        if record.get("kind") == "step" and record["step"] == 3:
            _signal_self(1)

    def save(obj, path):
        if isinstance(obj, dict) and obj.get("step") == 4:
            _signal_self(signals)
        real_save(obj, path)

    monkeypatch.setattr(T.Recorder, "emit", emit)
    monkeypatch.setattr(C, "save_atomic", save)
    with pytest.raises(T.Interrupted) as e:
        T.train(cfg, progress=False)
    assert torch.load(Path(cfg.out_dir) / "checkpoint.pt", weights_only=False)["step"] == expected_step
    if signals == 1:
        assert not e.value.at_once and str(e.value).startswith(f"SIGINT: {cfg.out_dir} interrupted at step 4, a "
                                                                "checkpoint was written there")
    else:
        assert e.value.at_once and "its checkpoint of step 3 is intact" in str(e.value)
    monkeypatch.setattr(T.Recorder, "emit", real_emit)
    monkeypatch.setattr(C, "save_atomic", real_save)
    assert T.train(cfg, progress=False)["status"] == "completed"  # resumes from what the checkpoint says


# ----------------------------------------------------------------------------- (d) a signal while starting

def _wait_for_torch_import(pid: int, deadline: float) -> None:
    """Until the process maps torch's library: past Python's own start-up, in the project's imports."""
    while "libtorch" not in Path(f"/proc/{pid}/maps").read_text():
        assert time.time() < deadline
        time.sleep(0.01)


def _ranks(pid: int) -> list[int]:
    """The launcher's children that run the training module (the ranks)."""
    out = []
    for kid in _children(pid):
        try:
            if b"manifold_muon_lab.train" in Path(f"/proc/{kid}/cmdline").read_bytes():
                out.append(kid)
        except OSError:
            pass
    return out


def _children(pid: int) -> list[int]:
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
        except (OSError, IndexError):
            pass
    return kids


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux: /proc")
@pytest.mark.parametrize("where", ["train", "launcher", "ranks"])
def test_a_signal_while_starting_is_one_sentence_and_exit_130(tmp_path, where):
    out = tmp_path / "run"
    if where == "train":
        proc = subprocess.Popen([sys.executable, *TRAIN, *ARGS, "--out-dir", str(out)], cwd=ROOT, env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    else:
        proc = _launch([*TRAIN, *ARGS, "--out-dir", str(out)])
    deadline = time.time() + 60
    _wait_for_torch_import(proc.pid, deadline)
    if where == "ranks":  # the launcher has started both ranks: they are importing torch
        # every rank, not the first: the launcher forwards the signal to all, and a rank still in Python's own
        # start-up (compiling train.py, before its handler is in place) prints a traceback (seen under load)
        while len(kids := _ranks(proc.pid)) < 2:
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.01)
        for kid in kids:
            _wait_for_torch_import(kid, deadline)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    prog = "launch" if where == "launcher" else "train"
    what = "before any rank started" if where == "launcher" else "before any work"
    assert err == f"python -m manifold_muon_lab.{prog}: SIGINT while starting: stopped {what}, nothing was written\n"
    assert not out.exists()
