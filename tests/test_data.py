"""Token data: tokenizers, the prepare pipeline on small local text, get_batch, the embedded corpus."""

import json

import numpy as np
import pytest
import torch

from manifold_muon_lab import data

TEXT = ("First line of the first document.\n"
        "Zweite Zeile: Grüße, naïve café — ünïcödé ✓ and a long-ish line to have something to split.\n") * 40
OTHER = "Another document, shorter.\nWith two lines; and 中文 too.\n" * 25


@pytest.fixture
def corpus(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(TEXT, encoding="utf-8")
    b.write_text(OTHER, encoding="utf-8")
    return [a, b]


def test_byte_tokenizer_round_trips_any_text():
    tok = data.ByteTokenizer()
    for text in (TEXT, OTHER, "", "\U0001f600 emoji", "tab\tand\r\nCRLF"):
        ids = tok.encode(text)
        assert ids.dtype == np.uint16 and (ids < 256).all()
        assert len(ids) == len(text.encode("utf-8"))
        assert tok.decode(ids) == text
    with pytest.raises(ValueError, match="bytes"):
        tok.decode([300])


def test_prepare_from_text_files_writes_splits_that_decode_to_the_input(corpus, tmp_path):
    out = tmp_path / "prepared"
    meta = data.prepare_from_text_files(corpus, out, tokenizer="bytes", val_fraction=0.1)
    assert {p.name for p in out.iterdir()} == {"train.bin", "val.bin", "meta.json"}
    assert json.loads((out / "meta.json").read_text())["train_tokens"] == meta["train_tokens"]
    assert (meta["vocab_size"], meta["eot_token"], meta["tokenizer"]) == (256, 0, "bytes")
    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    val = np.fromfile(out / "val.bin", dtype=np.uint16)
    assert (len(train), len(val)) == (meta["train_tokens"], meta["val_tokens"])
    tok = data.ByteTokenizer()
    # documents end with eot: split each stream at eot; the train and val parts of each file join
    # back into the file (contiguous split, nothing lost, nothing shared)
    train_docs = tok.decode(train).split("\x00")[:-1]
    val_docs = tok.decode(val).split("\x00")[:-1]
    assert len(train_docs) == len(val_docs) == 2
    for text, head, tail in zip((TEXT, OTHER), train_docs, val_docs):
        assert head + tail == text
        assert 0.85 < len(head) / len(text) < 0.95 and head.endswith("\n")
    assert (np.count_nonzero(train == 0), np.count_nonzero(val == 0)) == (2, 2)


def test_prepare_is_idempotent_and_redoes_work_when_inputs_change(corpus, tmp_path):
    out = tmp_path / "prepared"
    meta = data.prepare_from_text_files(corpus, out, tokenizer="bytes")
    stamp = (out / "train.bin").stat().st_mtime_ns
    assert data.prepare_from_text_files(corpus, out, tokenizer="bytes") == meta
    assert (out / "train.bin").stat().st_mtime_ns == stamp  # not rewritten
    meta2 = data.prepare_from_text_files(corpus, out, tokenizer="bytes", val_fraction=0.5)
    assert meta2["val_tokens"] > meta["val_tokens"]
    (out / "val.bin").write_bytes(b"")  # a damaged folder is prepared again
    assert data.prepare_from_text_files(corpus, out, tokenizer="bytes", val_fraction=0.5)["val_tokens"] == \
        meta2["val_tokens"]
    assert len(np.fromfile(out / "val.bin", dtype=np.uint16)) == meta2["val_tokens"]
    assert not list(out.glob(".*.tmp"))  # no temporary files left behind


def test_parallel_tokenisation_gives_the_same_files(corpus, tmp_path):
    one = data.prepare_from_text_files(corpus * 150, tmp_path / "one", tokenizer="bytes", num_proc=1)
    two = data.prepare_from_text_files(corpus * 150, tmp_path / "two", tokenizer="bytes", num_proc=2)
    assert one["train_tokens"] == two["train_tokens"]  # 300 documents: more than one chunk of 256
    for split in ("train", "val"):
        assert (tmp_path / "one" / f"{split}.bin").read_bytes() == (tmp_path / "two" / f"{split}.bin").read_bytes()


def test_get_batch_shapes_shift_and_determinism(corpus, tmp_path):
    out = tmp_path / "prepared"
    data.prepare_from_text_files(corpus, out, tokenizer="bytes")
    train = np.fromfile(out / "train.bin", dtype=np.uint16).astype(np.int64)
    x, y = data.get_batch("train", 8, 32, torch.Generator().manual_seed(1), "cpu", data_dir=out)
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # the target is the input shifted by one token
    for row_x, row_y in zip(x.numpy(), y.numpy()):  # and both are windows of the file
        i = next(i for i in range(len(train) - 32) if (train[i:i + 32] == row_x).all() and train[i + 32] == row_y[-1])
        assert (train[i + 1:i + 33] == row_y).all()
    x2, y2 = data.get_batch("train", 8, 32, torch.Generator().manual_seed(1), "cpu", data_dir=out)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = data.get_batch("train", 8, 32, torch.Generator().manual_seed(2), "cpu", data_dir=out)
    assert not torch.equal(x, x3)
    # without data_dir: the data set prepared last in this process
    assert torch.equal(data.get_batch("train", 8, 32, torch.Generator().manual_seed(1))[0], x)


def test_get_batch_refuses_bad_requests(corpus, tmp_path):
    missing = tmp_path / "kjv"
    with pytest.raises(FileNotFoundError, match=r"prepare_kjv"):
        data.get_batch("train", 2, 8, data_dir=missing)
    with pytest.raises(FileNotFoundError, match=r"prepare_from_text_files"):
        data.get_batch("train", 2, 8, data_dir=tmp_path / "elsewhere")
    out = tmp_path / "prepared"
    meta = data.prepare_from_text_files(corpus, out, tokenizer="bytes")
    with pytest.raises(ValueError, match="split"):
        data.get_batch("test", 2, 8, data_dir=out)
    with pytest.raises(ValueError, match="too few"):
        data.get_batch("val", 2, meta["val_tokens"], data_dir=out)


def test_bad_prepare_arguments_fail_before_any_work(corpus, tmp_path):
    with pytest.raises(ValueError, match="tokenizer"):
        data.prepare_from_text_files(corpus, tmp_path / "x", tokenizer="chars")
    with pytest.raises(ValueError, match="val_fraction"):
        data.prepare_from_text_files(corpus, tmp_path / "x", tokenizer="bytes", val_fraction=1.0)
    with pytest.raises(FileNotFoundError, match="not a file"):
        data.prepare_from_text_files([tmp_path / "nope.txt"], tmp_path / "x", tokenizer="bytes")
    assert not (tmp_path / "x").exists()


def test_gpt2_tokenizer_offline_or_missing_says_what_to_do(corpus, tmp_path):
    try:
        tok = data.get_tokenizer("gpt2")
    except ImportError as e:
        assert "pip install tiktoken" in str(e)
    except RuntimeError as e:
        assert "TIKTOKEN_CACHE_DIR" in str(e) and "network" in str(e)
    else:  # tiktoken present with its BPE files: then the gpt2 path must work end to end
        assert (tok.vocab_size, tok.eot_token) == (50257, 50256)
        meta = data.prepare_from_text_files(corpus, tmp_path / "gpt2", tokenizer="gpt2")
        train = np.fromfile(tmp_path / "gpt2" / "train.bin", dtype=np.uint16)
        assert meta["vocab_size"] == 50257 and train[-1] == 50256
        return
    with pytest.raises((ImportError, RuntimeError)):
        data.prepare_from_text_files(corpus, tmp_path / "gpt2", tokenizer="gpt2")
    assert not (tmp_path / "gpt2" / "meta.json").exists()


def test_embedded_corpus_is_real_english_and_prepares(tmp_path):
    text = data.kjv_text()
    assert text.startswith("Genesis\n\n1:1 In the beginning God created the heaven and the earth.\n")
    assert len(text) > 4_000_000 and text.count("\n") > 31_000  # 31,102 verses of Genesis..Revelation
    assert "Revelation" in text[-200_000:]
    meta = data.prepare_kjv(tmp_path / "kjv")
    assert meta["vocab_size"] == 256
    assert meta["train_tokens"] + meta["val_tokens"] == len(text.encode("utf-8")) + 2  # + one eot per split
    assert abs(meta["val_tokens"] / (meta["train_tokens"] + meta["val_tokens"]) - 0.1) < 0.001
    x, y = data.get_batch("val", 2, 64, torch.Generator().manual_seed(0), data_dir=tmp_path / "kjv")
    assert data.ByteTokenizer().decode(x[0]) in text


class _FakeHFDataset:
    """The three things prepare_openwebtext asks of a Hugging Face dataset, on a list of texts."""

    def __init__(self, texts):
        self.texts = list(texts)

    def train_test_split(self, test_size, seed, shuffle):
        order = np.random.default_rng(seed).permutation(len(self.texts)) if shuffle else np.arange(len(self.texts))
        n_test = max(1, int(round(test_size * len(self.texts))))
        return {"train": _FakeHFDataset(self.texts[i] for i in order[n_test:]),
                "test": _FakeHFDataset(self.texts[i] for i in order[:n_test])}

    def iter(self, batch_size):
        for i in range(0, len(self.texts), batch_size):
            yield {"text": self.texts[i:i + batch_size]}


def test_prepare_openwebtext_end_to_end_with_a_stand_in_for_the_hub(tmp_path, monkeypatch):
    # Everything but the download: a fake `datasets` module serves 40 documents under the source name
    import sys
    import types

    docs = [f"Document {i}: " + "some words " * (i % 7 + 1) + "\n" for i in range(40)]
    requested = {}

    def load_dataset(source, num_proc):
        requested.update(source=source, num_proc=num_proc)
        return {"train": _FakeHFDataset(docs)}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    meta = data.prepare_openwebtext(tmp_path / "owt", source="stand-in", num_proc=1, val_fraction=0.1,
                                    tokenizer="bytes")
    assert requested == {"source": "stand-in", "num_proc": 1}
    tok = data.ByteTokenizer()
    train = tok.decode(np.fromfile(tmp_path / "owt" / "train.bin", dtype=np.uint16)).split("\x00")[:-1]
    val = tok.decode(np.fromfile(tmp_path / "owt" / "val.bin", dtype=np.uint16)).split("\x00")[:-1]
    assert (len(train), len(val)) == (36, 4)  # whole documents, split by document
    assert sorted(train + val) == sorted(docs) and not set(train) & set(val)
    assert meta["name"] == "openwebtext" and meta["source"] == "stand-in"
    # prepared already: a second call neither loads nor writes
    requested.clear()
    assert data.prepare_openwebtext(tmp_path / "owt", source="stand-in", num_proc=1, val_fraction=0.1,
                                    tokenizer="bytes") == meta
    assert requested == {}


def test_prepare_openwebtext_without_datasets_says_what_to_install(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ImportError, match="pip install datasets"):
        data.prepare_openwebtext(tmp_path / "owt", tokenizer="bytes")
