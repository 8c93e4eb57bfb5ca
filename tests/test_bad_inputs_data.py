"""Bad inputs that were accepted silently or ended in a traceback: damaged data files, empty, duplicated or
non-UTF-8 presets, a killed preparation, a silent one. Each now ends in one sentence saying what to do
(exit code 2 from the command line, ``RunError`` / ``ValueError`` from Python) with nothing written
where it should not be.

Small synthetic data (a few KB of byte tokens, prepared in ``tmp_path`` in a folder named ``kjv`` so that
a training config with ``data=kjv`` and ``data_dir=`` reads it); the command-line cases go through ``main``
in this process, as ``test_failing_well`` does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from manifold_muon_lab import data
from manifold_muon_lab import train as T
from manifold_muon_lab import config
from manifold_muon_lab.config import RunError, load_preset, read_yaml

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "runs" / "presets" / "training"
PROG = "python -m manifold_muon_lab.train: error: "
TINY = ["--set", "max_steps=2", "--set", "n_layer=1", "--set", "eval_every=2", "--set", "eval_batches=1",
        "--set", "spectrum_every=0", "--set", "probe_every=0", "--set", "checkpoint_every=-1"]

TEXT = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog, {i * 7919 % 1000}.\n" for i in range(160))


def prepare(tmp_path, name="kjv", **kw) -> Path:
    """A small prepared data set (about 9,000 train tokens, bytes) in ``tmp_path/data/<name>``."""
    src = tmp_path / "corpus.txt"
    src.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "data" / name
    data.prepare_from_text_files([src], out, tokenizer="bytes", val_fraction=0.2, **kw)
    return out


def main_error(capsys, args) -> str:
    """Run the command line on ``args``; it must exit 2 with one line on stderr, no traceback."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        T.main(["--preset", "cpu-tiny", "--preset-dir", str(PRESETS), "--no-progress", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith(PROG), err
    return err[len(PROG):].strip()


# ----------------------------------------------------------------------------- 1. a truncated train.bin

def test_a_truncated_train_bin_in_an_explicit_data_dir_is_refused_before_any_work(tmp_path, capsys):
    d = prepare(tmp_path)
    meta = json.loads((d / "meta.json").read_text())
    with open(d / "train.bin", "r+b") as f:
        f.truncate(1024)  # 512 tokens left: enough for block_size 32, so it used to train on them
    out = tmp_path / "run"
    err = main_error(capsys, [*TINY, "--set", f"data_dir={d}", "--out-dir", str(out)])
    assert f"{d / 'train.bin'} holds 512 tokens (1,024 bytes) but {d / 'meta.json'} records " \
           f"{meta['train_tokens']:,}" in err
    assert "truncated" in err and f"delete {d} and run again with --prepare-data (prepare_data=True)" in err
    assert not out.exists()
    # the Python API: the same sentence, as a RunError, from every reader of an explicit folder
    with pytest.raises(RunError, match="holds 512 tokens"):
        data.prepared_meta("kjv", d)
    with pytest.raises(RunError, match="holds 512 tokens"):
        data.Batches("kjv", 32, data_dir=d, prepare=False)
    with pytest.raises(RunError, match="holds 512 tokens"):
        data.get_batch("train", 2, 32, data_dir=d)
    with open(d / "train.bin", "r+b") as f:
        f.truncate(1023)  # half a token: still one sentence, not numpy's complaint about the memmap
    with pytest.raises(RunError, match=r"holds 511 tokens \(1,023 bytes\) but .* the file is truncated"):
        data.get_batch("train", 2, 32, data_dir=d)
    # preparing it again (as --prepare-data does through Batches) restores it
    src = tmp_path / "corpus.txt"
    assert data.prepare_from_text_files([src], d, tokenizer="bytes", val_fraction=0.2)["train_tokens"] == \
        meta["train_tokens"] == (d / "train.bin").stat().st_size // 2
    assert data.prepared_meta("kjv", d)["train_tokens"] == meta["train_tokens"]


def test_a_damaged_default_folder_is_prepared_again_not_refused(tmp_path, monkeypatch):
    # the default folder (data_dir unset) is prepared on first use: a damaged one reads as not prepared
    monkeypatch.setenv("MANIFOLD_MUON_DATA_DIR", str(tmp_path / "data"))
    d = prepare(tmp_path)
    with open(d / "val.bin", "r+b") as f:
        f.truncate(100)
    assert data.prepared_meta("kjv") is None  # preflight then lets the preparation rewrite it
    with pytest.raises(RunError, match="holds 50 tokens"):  # the same folder given explicitly: refused
        data.prepared_meta("kjv", d)
    meta = data.prepare_from_text_files([tmp_path / "corpus.txt"], d, tokenizer="bytes", val_fraction=0.2)
    assert data.prepared_meta("kjv")["val_tokens"] == meta["val_tokens"] == (d / "val.bin").stat().st_size // 2


# ----------------------------------------------------------------------------- 2. an empty preset

@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}\n", "---\n"], ids=["empty", "comment", "braces", "doc"])
def test_an_empty_preset_is_refused_naming_the_file(tmp_path, capsys, text):
    preset = tmp_path / "empty.yml"
    preset.write_text(text)
    with pytest.raises(ValueError, match="sets no config keys"):
        load_preset(preset)
    out = tmp_path / "run"
    err = main_error(capsys, ["--preset", str(preset), "--out-dir", str(out)])
    assert err.startswith(f"{preset} is empty: it sets no config keys, so the run would use the built-in defaults")
    assert "give the preset's keys" in err and not out.exists()


def test_an_empty_scale_of_a_run_preset_is_refused_naming_the_file_and_the_scale(tmp_path):
    runs = tmp_path / "demo.yml"
    runs.write_text("smoke:\n  steps: 2\ncpu:\n# nothing under cpu\n")
    assert config.preset_scale(runs, "smoke") == {"steps": 2}
    with pytest.raises(ValueError, match=rf"{runs}: scale 'cpu' is empty \(it sets no keys\)"):
        config.preset_scale(runs, "cpu")
    with pytest.raises(ValueError, match="has no scale 'tpu'; choose one of: smoke, cpu"):
        config.preset_scale(runs, "tpu")
    runs.write_text("")
    with pytest.raises(ValueError, match=rf"{runs} is empty"):
        config.preset_scale(runs, "cpu")


# ----------------------------------------------------------------------------- 3. a duplicate key

def test_a_duplicate_key_in_a_preset_is_refused_naming_the_file_key_and_lines(tmp_path, capsys):
    preset = tmp_path / "dup.yml"
    preset.write_text("n_layer: 2\nlr: 0.01\n# a comment\nlr: 0.02\n")
    with pytest.raises(ValueError) as e:
        load_preset(preset)
    assert str(e.value) == f"{preset} gives the key 'lr' twice (line 2 and line 4); keep one of them"
    err = main_error(capsys, ["--preset", str(preset), "--out-dir", str(tmp_path / "run")])
    assert err == f"{preset} gives the key 'lr' twice (line 2 and line 4); keep one of them"
    assert not (tmp_path / "run").exists()
    # nested mappings too, and in every YAML file read through config (run presets, --set values)
    preset.write_text("n_layer: 2\noptimizer:\n  inner_steps: 2\n  inner_steps: 3\n")
    with pytest.raises(ValueError, match=r"gives the key 'inner_steps' twice \(line 3 and line 4\)"):
        load_preset(preset)
    with pytest.raises(ValueError, match=r"gives the key 'inner_steps' twice"):
        config.read_yaml_file(preset)
    err = main_error(capsys, ["--set", "optimizer={a: 1, a: 2}", "--out-dir", str(tmp_path / "run")])
    assert err == "--set 'optimizer={a: 1, a: 2}': the value gives the key 'a' twice; keep one of them"
    # merge keys (<<) override on purpose: not a duplicate
    preset.write_text("base: &b {lr: 0.1, n_layer: 2}\nother:\n  <<: *b\n  lr: 0.2\n")
    assert config.read_yaml_file(preset)["other"] == {"lr": 0.2, "n_layer": 2}


def test_every_preset_of_the_repository_has_no_duplicate_key():
    for path in sorted((ROOT / "runs" / "presets").rglob("*.yml")):
        assert config.read_yaml_file(path), path


# ----------------------------------------------------------------------------- 4. a non-UTF-8 preset

def test_a_non_utf8_preset_is_one_sentence_naming_the_file(tmp_path, capsys):
    preset = tmp_path / "latin1.yml"
    preset.write_bytes("n_layer: 2\n# caf\xe9 au lait\nlr: 0.02\n".encode("latin-1"))
    expected = (f"{preset} is not UTF-8 text (byte 0xe9 at line 2, column 6); save it as UTF-8")
    with pytest.raises(ValueError) as e:
        load_preset(preset)
    assert str(e.value) == expected
    err = main_error(capsys, ["--preset", str(preset), "--out-dir", str(tmp_path / "run")])
    assert err == expected and not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        config.read_yaml_file(preset)


# ----------------------------------------------------------------------------- 5. out-of-vocabulary ids

def _poison(path: Path, every: int = 50, value: int = 300) -> None:
    ids = np.fromfile(path, dtype=np.uint16)
    ids[::every] = value  # the file keeps its size: only a look at the ids finds it
    ids.tofile(path)


def test_out_of_vocabulary_ids_are_refused_before_any_work(tmp_path, capsys):
    d = prepare(tmp_path)
    _poison(d / "train.bin")
    out = tmp_path / "run"
    err = main_error(capsys, [*TINY, "--set", f"data_dir={d}", "--out-dir", str(out)])
    assert err == (f"{d / 'train.bin'} holds token id 300, outside the vocabulary of its data set (vocab_size 256 in "
                   f"{d / 'meta.json'}, ids 0..255): the file is corrupt or from another tokenizer; delete {d} and "
                   f"run again with --prepare-data (prepare_data=True) to prepare it afresh")
    assert not out.exists()
    with pytest.raises(RunError, match="holds token id 300"):
        data.Batches("kjv", 32, data_dir=d, prepare=False)


def test_out_of_vocabulary_ids_are_caught_at_batch_time_too(tmp_path):
    # get_batch does not scan the file (a file changed after the run's start): each batch is checked
    d = prepare(tmp_path)
    _poison(d / "train.bin", every=3)
    with pytest.raises(RunError, match=rf"{d / 'train.bin'} holds token id 300, outside the vocabulary .*256"):
        data.get_batch("train", 4, 32, data_dir=d)
    data.get_batch("val", 4, 32, data_dir=d)  # the clean split still reads


def test_a_poisoned_default_folder_is_prepared_again(tmp_path):
    d = prepare(tmp_path)
    _poison(d / "val.bin")
    meta = data.prepare_from_text_files([tmp_path / "corpus.txt"], d, tokenizer="bytes", val_fraction=0.2)
    assert np.fromfile(d / "val.bin", dtype=np.uint16).max() < 256 and meta["vocab_size"] == 256


# ----------------------------------------------------------------------------- 6. a killed preparation

_KILLED = r"""
import sys, time
from manifold_muon_lab import data
slow = data._encode_documents
def encode(args):  # a slow tokeniser: the parent has time to see the temporary file and kill this process
    time.sleep(0.3)
    return slow(args)
data._encode_documents = encode
data.prepare_from_text_files([sys.argv[1]], sys.argv[2], tokenizer="bytes", progress=False)
"""


def test_a_stale_temporary_file_of_a_killed_preparation_is_removed_and_the_next_one_succeeds(tmp_path):
    out = tmp_path / "data" / "kjv"
    # a preparation killed (SIGKILL: no handler runs) while it writes train.bin
    many = tmp_path / "list"
    many.mkdir()
    paths = []
    for i in range(600):  # 600 documents: three chunks of 256, each slowed down
        p = many / f"{i}.txt"
        p.write_text(TEXT[: 200 + i])
        paths.append(p)
    script = _KILLED.replace("[sys.argv[1]]", f"{[str(p) for p in paths]!r}")
    proc = subprocess.Popen([sys.executable, "-c", script, "", str(out)], stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while not [p for p in out.glob(".train.bin.*") if p.stat().st_size > 0] and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    stale = list(out.glob(".train.bin.*"))
    assert stale and all(p.stat().st_size > 0 for p in stale)  # what a killed preparation leaves
    assert data.prepared_meta("kjv", out) is None  # not taken for a prepared data set
    # more leftovers of the same kind: a half-written meta.json, an older naming scheme's temp file
    (out / ".meta.json.abc123.tmp").write_text("{")
    (out / ".val.bin.x1y2z3.tmp").write_bytes(b"\0" * 700)
    (out / "notes.txt").write_text("not ours")  # anything else in the folder is left alone
    meta = data.prepare_from_text_files(paths, out, tokenizer="bytes", progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "notes.txt", "train.bin", "val.bin"]
    assert (out / "train.bin").stat().st_size == 2 * meta["train_tokens"]


def test_stale_temporary_files_are_removed_even_when_the_folder_is_already_prepared(tmp_path, capsys):
    d = prepare(tmp_path)
    stamp = (d / "train.bin").stat().st_mtime_ns
    (d / ".train.bin.deadbeef.tmp").write_bytes(b"\1" * 7000)
    capsys.readouterr()
    data.prepare_from_text_files([tmp_path / "corpus.txt"], d, tokenizer="bytes", val_fraction=0.2)
    assert not list(d.glob(".*.tmp")) and (d / "train.bin").stat().st_mtime_ns == stamp
    assert f"removed {d / '.train.bin.deadbeef.tmp'}" in capsys.readouterr().err


# ----------------------------------------------------------------------------- 7. progress

def test_preparation_reports_its_progress_on_stderr(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(data, "PROGRESS_BYTES", 4096)  # a line per 4 KB written (default: per 64 MB)
    capsys.readouterr()
    d = prepare(tmp_path, name="demo")
    err = capsys.readouterr().err.splitlines()
    meta = json.loads((d / "meta.json").read_text())
    assert err[0] == f"[data demo] preparing {d}: 1 text file ({len(TEXT.encode()):,} bytes of text), bytes tokenizer"
    lines = [line for line in err if line.startswith("[data demo] train.bin: ")]
    assert lines and all("tokens" in line and "MB" in line for line in lines)
    assert any(line.startswith(f"[data demo] train.bin done: {meta['train_tokens']:,} tokens") for line in err), err
    assert any(line.startswith("[data demo] val.bin done: ") for line in err), err
    assert err[-1].startswith(f"[data demo] done: {d} holds ") and err[-1].endswith("s)"), err
    assert all(line.startswith("[data demo] ") for line in err)
    # already prepared: nothing to say; progress=False: silent
    data.prepare_from_text_files([tmp_path / "corpus.txt"], d, tokenizer="bytes", val_fraction=0.2)
    assert capsys.readouterr().err == ""
    data.prepare_from_text_files([tmp_path / "corpus.txt"], tmp_path / "quiet", tokenizer="bytes", progress=False)
    assert capsys.readouterr().err == ""
    data.Batches("kjv", 32, data_dir=tmp_path / "quiet-kjv", progress=False)  # the training loop's sampler
    assert capsys.readouterr().err == ""


def test_read_yaml_still_reads_python_floats():
    assert read_yaml("1e-3") == 0.001 and read_yaml("a: 1\nb: 2") == {"a": 1, "b": 2}
