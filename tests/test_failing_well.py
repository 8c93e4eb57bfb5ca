"""Runs that fail well (issue 10): a bound on memory, a lock on the output folder, one sentence per error,
a clean stop on SIGINT/SIGTERM, numbers as people write them, honest records, progress without a terminal.

The memory, lock and signal cases run the real command line (``python -m manifold_muon_lab.train``) in
real processes; the error sentences go through ``main`` in this process (the same code, without paying
for a torch start-up per case).
"""

from __future__ import annotations

import json
import os
import signal
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from manifold_muon_lab import train as T
from manifold_muon_lab.checkpoint import LOCK, OutDirLock
from manifold_muon_lab.config import (RunError, TrainConfig, available_memory, check_memory, estimate_memory,
                                      parse_overrides, read_yaml, validate)
from manifold_muon_lab.config import load_preset as _load_preset

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "runs" / "presets" / "training"
PROG = "python -m manifold_muon_lab.train: error: "


def load_preset(name, **overrides):
    return _load_preset(name, PRESETS, **overrides)


def tiny(tmp_path, name="run", **kw) -> TrainConfig:
    base = dict(max_steps=4, eval_every=2, spectrum_every=0, probe_every=0, n_layer=1, checkpoint_every=0)
    return load_preset("cpu-tiny", **{**base, **kw, "out_dir": str(tmp_path / name)})


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _cli(args, **kw):
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "manifold_muon_lab.train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


# ----------------------------------------------------------------------------- 1. an upper bound on work

def test_the_memory_estimate_is_the_formula_of_its_docstring():
    cfg = load_preset("cpu-tiny", batch_size=12, gradient_accumulation_steps=3)
    est = estimate_memory(cfg, vocab_size=256)
    P, d, L, T_, V, f = 33952, 32, 2, 32, 256, 128  # cpu-tiny: 2 layers of width 32, byte vocabulary
    assert est["parameters"] == P and est["micro_batch"] == 4
    assert (est["weights"], est["gradients"], est["optimizer"]) == (4 * P, 4 * P, 8 * P)
    train_act = 4 * T_ * (4 * L * (8 * d + 2 * f) + 4 * (2 * d + 3 * V))
    eval_act = 4 * T_ * 4 * (3 * V + f + 2 * d)
    assert est["activations"] == max(train_act, eval_act)
    assert est["batch"] == 20 * 12 * T_
    assert est["total"] == 16 * P + est["activations"] + est["batch"]
    # linear in the micro-batch; two processes halve it; bfloat16 autocast halves the layers' part on CUDA
    assert estimate_memory(cfg.replace(batch_size=24), 256)["activations"] == 2 * est["activations"]
    assert estimate_memory(cfg, 256, world_size=2)["micro_batch"] == 2
    bf16 = estimate_memory(load_preset("gpt2-124m"), 50304, cuda=True)
    fp32 = estimate_memory(load_preset("gpt2-124m", dtype="float32"), 50304, cuda=True)
    assert bf16["activations"] < fp32["activations"] and bf16["parameters"] == fp32["parameters"] == 124373760


def test_check_memory_refuses_with_the_estimate_and_what_to_do():
    cfg = load_preset("cpu-tiny", batch_size=4096)
    est = check_memory(cfg, 256, available={"host": 2**40})  # fits: returns the estimate
    with pytest.raises(RunError) as e:
        check_memory(cfg, 256, available={"host": est["total"] - 1})
    msg = str(e.value)
    assert f"needs about {est['total'] / 2**30:.1f} GiB of host memory" in msg
    assert "33,952 parameters" in msg and "micro-batch of 4,096 sequences x 32 tokens" in msg
    assert "lower batch_size or block_size, raise gradient_accumulation_steps" in msg and "\n" not in msg
    with pytest.raises(RunError, match="2 runs of this config needs"):
        check_memory(cfg, 256, concurrent=2, available={"host": est["total"] + 1})
    with pytest.raises(RunError, match="of GPU memory"):  # on CUDA the batch is host memory, the rest device memory
        check_memory(cfg, 256, device="cuda:0", available={"host": 2**40, "device": est["total"] - est["batch"] - 1})


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="Linux: /proc/meminfo")
def test_available_memory_is_what_the_os_reports():
    mem = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in open("/proc/meminfo")}
    have = available_memory("cpu")
    assert 0 < have <= mem["MemTotal"]
    assert abs(have - mem["MemAvailable"]) < 0.25 * mem["MemAvailable"] or have < mem["MemAvailable"]  # cgroup caps


def test_a_config_that_cannot_fit_is_refused_before_any_work(tmp_path):
    """The issue's command: it used to thrash for 15 minutes until the kernel killed it at 24 GB."""
    out = tmp_path / "b"
    t0 = time.perf_counter()
    proc = _cli(["--preset", "cpu-tiny", "--set", "batch_size=100000000", "--out-dir", str(out)])
    try:
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak memory, not this process's
    finally:
        if proc.poll() is None and proc.returncode is None:
            proc.kill()
    elapsed = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read()
    assert proc.returncode == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PROG + "this config needs about "), err
    assert "GiB of host memory" in err and "GiB is available" in err and "micro-batch of 100,000,000 sequences" in err
    assert usage.ru_maxrss < 1_500_000, f"peak RSS {usage.ru_maxrss} kB: it did work before refusing"
    assert elapsed < 120 and not out.exists()


# ----------------------------------------------------------------------------- 2. a lock on the output folder

def test_the_lock_refuses_a_second_holder_and_is_released(tmp_path):
    with OutDirLock(tmp_path) as lock:
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
        with pytest.raises(RunError, match=rf"is in use by another run \(pid {os.getpid()} on .*wait for it"):
            OutDirLock(tmp_path).acquire()  # another open file description: flock refuses it
        assert lock._fd is not None
    assert not (tmp_path / LOCK).exists()
    with OutDirLock(tmp_path):  # free again
        pass


def test_a_second_run_on_a_busy_out_dir_is_refused_and_a_dead_runs_lock_is_taken_over(tmp_path):
    out = tmp_path / "busy"
    first = _cli(["--preset", "cpu-tiny", "--no-progress", "--set", "max_steps=100000", "--set", "n_layer=1",
                  "--set", "eval_every=100000", "--out-dir", str(out)])
    try:
        deadline = time.time() + 120
        while not ((out / LOCK).exists() and (out / "metrics.jsonl").exists()
                   and (out / "metrics.jsonl").stat().st_size > 0):
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.time() < deadline
            time.sleep(0.1)
        second = _cli(["--preset", "cpu-tiny", "--no-progress", "--set", "max_steps=100000", "--set", "n_layer=1",
                       "--set", "eval_every=100000", "--out-dir", str(out)])
        _, err = second.communicate(timeout=180)
        assert second.returncode == 2, err[-3000:]
        assert err.count("\n") == 1 and err.startswith(PROG + f"{out} is in use by another run (pid {first.pid} on ")
        assert "-m manifold_muon_lab.train --preset cpu-tiny" in err and "--out-dir" in err
        assert first.poll() is None and not (out / "status.json").exists()  # the first one runs on, untouched
    finally:
        first.kill()
        first.communicate()
    assert (out / LOCK).exists()  # kill -9 leaves the file, but not the flock
    third = _cli(["--preset", "cpu-tiny", "--no-progress", "--no-resume", "--set", "max_steps=2",
                  "--set", "n_layer=1", "--out-dir", str(out)])
    _, err = third.communicate(timeout=180)
    assert third.returncode == 0, err[-3000:]
    assert f"taking over the lock of {out} from a run that is no longer running (pid {first.pid} " in err
    assert json.loads((out / "status.json").read_text())["status"] == "completed" and not (out / LOCK).exists()


# ----------------------------------------------------------------------------- 3. one sentence per error

def _read_only_dir(tmp_path) -> Path:
    d = tmp_path / "read-only"
    d.mkdir()
    d.chmod(0o555)
    if not os.access(d, os.W_OK) or not Path("/sys").is_dir():
        return d
    return Path("/sys")  # as root a chmod does not stop writes; sysfs does (EPERM / EACCES)


def _main_error(capsys, args) -> str:
    with pytest.raises(SystemExit) as e:
        T.main(["--preset", "cpu-tiny", "--no-progress", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith(PROG), err
    return err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    args = ["--set", "max_steps=2", "--set", "n_layer=1", "--set", "eval_every=2", "--out-dir", str(out)]
    T.main(["--preset", "cpu-tiny", "--no-progress", *args])
    return out, args


def test_a_truncated_checkpoint_is_one_sentence(tmp_path, capsys, finished_run):
    src, args = finished_run
    out = tmp_path / "run"
    out.mkdir()
    data = (src / "checkpoint.pt").read_bytes()
    (out / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    args = [a if a != str(src) else str(out) for a in args]
    err = _main_error(capsys, args)
    assert f"checkpoint {out / 'checkpoint.pt'} is unreadable, truncated or corrupt" in err
    assert "delete it to start over, or pass resume=False (--no-resume)" in err
    with pytest.raises(RunError, match="truncated or corrupt"):  # --debug: the exception, with its traceback
        T.main(["--preset", "cpu-tiny", "--no-progress", "--debug", *args])


def test_a_checkpoint_of_another_config_is_one_sentence(capsys, finished_run):
    out, args = finished_run
    before = (out / "status.json").read_bytes()
    err = _main_error(capsys, [*args, "--set", "lr=0.03"])
    assert "was written by another config (lr: 0.02 -> 0.03); use another out_dir" in err
    assert (out / "status.json").read_bytes() == before  # the finished run's record is left alone


@pytest.mark.parametrize("case", ["file", "under-a-file", "read-only"])
def test_an_out_dir_that_cannot_be_written_is_one_sentence(tmp_path, capsys, case):
    (tmp_path / "a-file").write_text("x")
    out = {"file": tmp_path / "a-file", "under-a-file": tmp_path / "a-file" / "run",
           "read-only": _read_only_dir(tmp_path) / "run"}[case]
    err = _main_error(capsys, ["--set", "max_steps=2", "--out-dir", str(out)])
    if case == "read-only":
        assert f"out_dir {out} is not writable" in err or f"cannot write in out_dir {out}" in err
        assert "give a writable --out-dir" in err and not out.exists()
    else:
        assert f"out_dir {out} cannot be a folder: {tmp_path / 'a-file'} is a file; give another --out-dir" in err


@pytest.mark.parametrize("args, expected", [
    (["--set", "block_size=500000"], "block_size=500000 needs at least 500001 tokens per split, the data has"),
    (["--set", "optimizer={inner_step: 3}"], "no optimizer of assignment 'hetero' takes inner_step; they take"
                                             " alpha, certify_first, inner, inner_steps"),
    (["--set", "optimizer={inner_step: 3}"], "(did you mean 'inner_steps' for 'inner_step'?)"),
    (["--set", "model_extra={n_ffn: 3}"], "model_extra keys ['n_ffn'] are not fields of GPTConfig; remove them"),
    (["--set", "optimizer={inner_steps: 3"], "--set 'optimizer={inner_steps: 3': the value is not valid YAML "
                                             "(expected ',' or '}', but got '<stream end>'"),
    (["--set", "lr"], "--set takes key=value, got 'lr'"),
    (["--set", "data_dir=/nonexistent/manifold-muon-data"], "data_dir=/nonexistent/manifold-muon-data holds no "
                                                            "prepared kjv data set; pass --prepare-data"),
], ids=["block_size", "optimizer-key", "did-you-mean", "model_extra", "yaml-set", "no-equals", "data_dir"])
def test_bad_inputs_are_one_sentence_before_any_work(tmp_path, capsys, args, expected):
    err = _main_error(capsys, [*args, "--out-dir", str(tmp_path / "run")])
    assert expected in err
    assert not (tmp_path / "run").exists() and not Path("/nonexistent/manifold-muon-data").exists()


def test_bad_yaml_in_a_preset_is_one_sentence(tmp_path, capsys):
    preset = tmp_path / "broken.yml"
    preset.write_text("n_layer: 2\nlr: [0.1, 0.2\nbatch_size: 8\n")
    with pytest.raises(SystemExit) as e:
        T.main(["--preset", str(preset), "--out-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert f"{preset} is not valid YAML (expected ',' or ']', but got ':' at line 3, column 11); fix the file" in err


def test_openwebtext_without_its_tokenizer_is_one_sentence(tmp_path, capsys, monkeypatch):
    import importlib.util

    if all(importlib.util.find_spec(m) for m in ("tiktoken", "datasets")):
        pytest.skip("tiktoken and datasets are installed here")
    monkeypatch.setenv("MANIFOLD_MUON_DATA_DIR", str(tmp_path / "data"))  # no prepared openwebtext there
    err = _main_error(capsys, ["--set", "data=openwebtext", "--out-dir", str(tmp_path / "run")])
    assert f"data=openwebtext is not prepared in {tmp_path / 'data' / 'openwebtext'}, and preparing openwebtext " \
           "needs" in err and "pip install tiktoken datasets" in err
    assert not (tmp_path / "data").exists()


def test_an_explicit_data_dir_is_prepared_only_when_asked(tmp_path):
    cfg = tiny(tmp_path, max_steps=2, data_dir=str(tmp_path / "kjv"))
    with pytest.raises(RunError, match="holds no prepared kjv data set; pass --prepare-data"):
        T.train(cfg, progress=False)
    assert not (tmp_path / "kjv").exists() and not (tmp_path / "run").exists()
    assert T.train(cfg, progress=False, prepare_data=True)["status"] == "completed"
    assert {p.name for p in (tmp_path / "kjv").iterdir()} == {"train.bin", "val.bin", "meta.json"}
    assert T.train(cfg.replace(out_dir=str(tmp_path / "again")), progress=False)["status"] == "completed"


# ----------------------------------------------------------------------------- 4. signals

_SIGNAL_ARGS = ["--preset", "cpu-tiny", "--set", "max_steps=60", "--set", "n_layer=1", "--set", "eval_every=20",
                "--set", "spectrum_every=20", "--set", "probe_every=20", "--set", "checkpoint_every=0"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    T.main([*_SIGNAL_ARGS, "--no-progress", "--out-dir", str(out)])
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_at_a_step_boundary_with_a_checkpoint_and_the_run_resumes_bit_identically(
        tmp_path, sig, uninterrupted):
    out = tmp_path / "run"
    # stderr is a pipe, not a terminal: the progress lines must still come, one by one, while the run runs
    proc = _cli([*_SIGNAL_ARGS, "--out-dir", str(out)],
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # even if this shell ignores it
    first = proc.stderr.readline()
    assert first.startswith("[train run] step 3/60 loss ") and proc.poll() is None, first + proc.stderr.read()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + sig, err[-3000:]
    status = json.loads((out / "status.json").read_text())
    n = int(status["status"].removeprefix("interrupted at step "))
    assert 3 <= n < 60 and status["step"] == n and not any(k.startswith("final_") for k in status)
    assert f"{sig.name}: {out} interrupted at step {n}, a checkpoint was written there; run the same command " \
           "again to resume" in err and "Traceback" not in err
    ckpt = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert ckpt["step"] == n and not ckpt["done"]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "step"] == list(range(n))
    assert not (out / LOCK).exists()

    summary = T.main([*_SIGNAL_ARGS, "--no-progress", "--out-dir", str(out)])  # resume, in this process
    assert summary["status"] == "completed" and summary["step"] == 60
    a = torch.load(uninterrupted / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]
    b = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit-identical
    key = lambda r: (r["kind"], r["step"], r.get("loss"), r.get("val_loss"), r.get("sigma_max"))  # noqa: E731
    assert [key(r) for r in read_jsonl(uninterrupted / "metrics.jsonl")] == [key(r) for r in read_jsonl(out / "metrics.jsonl")]


# ----------------------------------------------------------------------------- 5. numbers as people write them

@pytest.mark.parametrize("text, value", [("1e-3", 1e-3), (".5", 0.5), ("1E5", 1e5), ("-2.5e-3", -2.5e-3),
                                         ("+3e2", 300.0), ("1_000.5", 1000.5), ("6.0e-4", 6e-4), ("2.", 2.0)])
def test_float_literals_are_floats_in_set_and_in_presets(tmp_path, text, value):
    assert read_yaml(text) == value and isinstance(read_yaml(text), float)
    assert parse_overrides([f"lr={text}"]) == {"lr": value}
    preset = tmp_path / "p.yml"
    preset.write_text(f"lr: {text}\nadamw_lr: {text}\n")
    cfg = _load_preset(preset)
    assert (cfg.lr, cfg.adamw_lr) == (value, value) and isinstance(cfg.lr, float)


def test_quoted_numbers_stay_strings_and_integers_stay_integers(tmp_path):
    assert read_yaml('"1e-3"') == "1e-3" and read_yaml("'.5'") == ".5"
    cfg = load_preset("cpu-tiny", **parse_overrides(['out_dir="1e-3"', "max_steps=10", "assignment='1e5'"]))
    assert cfg.out_dir == "1e-3" and cfg.max_steps == 10 and isinstance(cfg.max_steps, int)
    validate(cfg.replace(assignment="hetero"))  # a string where a string is expected
    with pytest.raises(ValueError, match="out_dir=0.001 should be str or NoneType"):  # unquoted: a number
        validate(load_preset("cpu-tiny", **parse_overrides(["out_dir=1e-3"])))
    with pytest.raises(ValueError, match=r"max_steps=1000.0 should be int"):  # 1e3 is a float, as in Python
        validate(load_preset("cpu-tiny", **parse_overrides(["max_steps=1e3"])))


# ----------------------------------------------------------------------------- 6. honest records

def test_a_diverged_run_reports_no_final_losses(tmp_path):
    cfg = tiny(tmp_path, divergence_loss_threshold=0.5)
    summary = T.train(cfg, progress=False)
    status = json.loads((Path(cfg.out_dir) / "status.json").read_text())
    assert summary["status"] == status["status"] == "diverged at step 0"
    assert not [k for k in (*summary, *status) if k.startswith("final_")]
    assert [r["kind"] for r in read_jsonl(Path(cfg.out_dir) / "metrics.jsonl")] == ["eval", "step"]


def test_rerunning_a_finished_run_keeps_its_records(tmp_path):
    cfg = tiny(tmp_path)
    first = T.train(cfg, progress=False)
    out = Path(cfg.out_dir)
    records = {f: (out / f).read_bytes() for f in ("status.json", "provenance.json", "metrics.jsonl")}
    time.sleep(0.05)
    again = T.train(cfg, progress=False)
    assert {f: (out / f).read_bytes() for f in records} == records  # nothing rewritten
    assert again["wall_time_s"] == first["wall_time_s"] == json.loads(records["status.json"])["wall_time_s"]
    assert again["final_val_loss"] == first["final_val_loss"]


def test_a_resumed_run_records_the_wall_time_of_all_its_sessions(tmp_path, monkeypatch):
    cfg = tiny(tmp_path, max_steps=6, checkpoint_every=3)
    calls = {"n": 0}
    real = T.Recorder.emit

    def crash_after_the_checkpoint(self, record):  # a run that dies after its step-3 checkpoint
        real(self, record)
        if record.get("kind") == "step" and record["step"] == 4:
            calls["n"] += 1
            raise RuntimeError("simulated crash")

    monkeypatch.setattr(T.Recorder, "emit", crash_after_the_checkpoint)
    with pytest.raises(RuntimeError, match="simulated crash"):
        T.train(cfg, progress=False)
    status = json.loads((Path(cfg.out_dir) / "status.json").read_text())
    assert status["status"] == "failed: RuntimeError: simulated crash"  # a run that started says how it ended
    first = torch.load(Path(cfg.out_dir) / "checkpoint.pt", weights_only=False)["wall_time_s"]
    monkeypatch.setattr(T.Recorder, "emit", real)
    summary = T.train(cfg, progress=False)
    assert summary["status"] == "completed" and summary["wall_time_s"] > first > 0
    # and it ends where a run never stopped ends (ManifoldMuon's float64 warm-start state included)
    whole = cfg.replace(out_dir=str(tmp_path / "whole"))
    T.train(whole, progress=False)
    a, b = (torch.load(Path(c.out_dir) / "checkpoint.pt", weights_only=False)["model"] for c in (whole, cfg))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_progress_lines_come_every_n_steps_or_every_so_many_seconds(tmp_path, capsys, monkeypatch):
    T.train(tiny(tmp_path, "a", max_steps=40, eval_every=40), progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[3] for line in lines] == [f"{s}/40" for s in range(2, 41, 2)]  # every max_steps / 20
    monkeypatch.setattr(T, "PROGRESS_SECONDS", 0.0)  # slow steps: a line at least every PROGRESS_SECONDS
    T.train(tiny(tmp_path, "b", max_steps=40, eval_every=40), progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[3] for line in lines] == [f"{s}/40" for s in range(1, 41)]
    assert all(line.startswith("[train b] step ") and " loss " in line for line in lines)


def test_an_empty_out_dir_is_refused_and_writes_nothing(tmp_path):
    before = sorted(p.name for p in ROOT.iterdir())
    proc = _cli(["--preset", "cpu-tiny", "--set", "max_steps=1", "--out-dir", ""])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-2000:]
    assert err.strip().splitlines() == [PROG + err.strip()[len(PROG):]] and "--out-dir ''" in err
    assert sorted(p.name for p in ROOT.iterdir()) == before


def test_a_diverged_run_exits_3_with_one_sentence(tmp_path):
    proc = _cli(["--preset", "cpu-tiny", "--set", "lr=1e6", "--set", "adamw_lr=1e3", "--set", "max_steps=6",
                 "--set", "eval_every=3", "--set", "n_layer=1", "--set", "checkpoint_every=0", "--no-progress",
                 "--out-dir", str(tmp_path / "d")])
    out, err = proc.communicate(timeout=300)
    status = json.loads((tmp_path / "d" / "status.json").read_text())["status"]
    assert status.startswith("diverged"), status
    assert proc.returncode == 3, err[-2000:]
    assert "diverged at step" in err and "lower lr" in err


def test_the_progress_line_gives_rate_eta_and_when_val_was_measured(tmp_path, capfd):
    from manifold_muon_lab.train import train

    train(tiny(tmp_path, max_steps=4, eval_every=2), progress=True)
    lines = [l for l in capfd.readouterr().err.splitlines() if l.startswith("[train run] step")]
    assert lines, "no progress line"
    last = lines[-1]
    assert re.search(r"\(val \d+\.\d{4} at step [0-9]+\)", last), last
    assert ("steps/s" in last or "s/step" in last) and "ETA" in last, last
