"""What `make` executes: run notebooks (papermill) and chapters (Jupytext pairs), only when stale.

Layout this module relies on:

* ``runs/<name>.md``                 a run template (Jupytext MyST) with one ``parameters`` cell
                                     (``scale``, ``seed`` and the knobs of that run); paired with
                                     ``runs/<name>.ipynb`` (no outputs), the file papermill reads.
* ``runs/presets/<name>.yml``        scale -> parameters for that run (``smoke``, ``cpu``, paper scales).
* ``runs/<name>/<scale>/``           what one execution leaves: ``run.ipynb`` (executed) and
                                     ``metrics.json`` (numbers + provenance + ``inputs_sha``).
* ``chapters/*.md``, ``book/claims.md``  book pages (Jupytext MyST), paired with executed ``.ipynb``.

Staleness is decided by content hashes, not file times (a fresh clone has arbitrary times):
a run is stale when its ``metrics.json`` is missing or records another ``inputs_sha`` than the hash
of its template and the content of its presets (comments aside); a page is stale when its ``.ipynb`` records another hash than that of
its ``.md``, the run outputs it can read, the claims ledger and the source of the modules it imports
(found by reading its code cells' imports, followed through the book's own packages).

Executions see ``MANIFOLD_MUON_DATA_DIR=<root>/data``, so every run and page shares one prepared data folder.

Scales that check code rather than make the book's numbers (``SCRATCH_SCALES``: ``smoke`` and ``gpu-dry``)
are always executed and written under ``runs/_smoke/<name>/<scale>/`` (git-ignored, read by no page).
``gpu-dry`` is every run notebook's GPU path on the CPU, for ``make test``: each run preset with a ``gpu``
entry has a ``gpu-dry`` entry of the same studies and options, whose training presets are
``runs/presets/training/gpu-dry-<paper>.yml``, the paper preset ``<paper>.yml`` with only the keys of
``GPU_DRY_KEYS`` changed (sizes, step counts and cadences, ``device: cpu``, the local stand-in data
``kjv-books``). Their ``device: cpu`` is what lets the GPU check of ``preflight_scale`` pass without CUDA
(no ``--allow-cpu``); the same preflight refuses a gpu-dry preset that has drifted from its paper preset
(``gpu_dry_problems``).

Stopped by SIGINT (Ctrl-C) or SIGTERM, the pipeline removes its hidden working notebooks
(``.<name>.src.ipynb``, ``.<name>.tmp.ipynb``), shuts its kernel down and exits with 130 or 143: a killed
``pipeline chapters`` leaves no untracked files. A notebook that fails on an error is kept as
``<name>.failed.ipynb`` (git-ignored) to read the error in. Should the orderly unwinding (papermill asking
the kernel to shut down) hang, a watchdog ends it ``STOP_GRACE_S`` seconds after the signal: it removes the
working notebooks, kills the pipeline's child processes (the kernel) and exits with the same code.

Usage: ``python -m manifold_muon_book.pipeline {runs,chapters,smoke,status,estimate} [--scale S] [--force]``
(``estimate [--workers N]``: how long ``make reproduce`` takes on N cores, from the times the runs recorded).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import yaml

__all__ = ["repo_root", "run_dir", "load_run_preset", "load_run_metrics", "run_inputs_sha", "page_inputs_sha"]

SHA_KEY = "manifold_muon_inputs_sha"


PACKAGES = ("manifold_muon", "manifold_muon_lab", "manifold_muon_book")  # the book's own code, under lib/


def repo_root(start: str | os.PathLike | None = None) -> Path:
    """The book's root: the nearest folder at or above ``start`` (default: cwd) holding ``_config.yml`` and ``runs/``."""
    here = Path(start or os.getcwd()).resolve()
    for p in (here, *here.parents):
        if (p / "_config.yml").exists() and (p / "runs").is_dir():
            return p
    raise FileNotFoundError(
        f"no book root (a folder with _config.yml and runs/) at or above {here}; "
        "run from inside the repository checkout"
    )


def _sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


def run_templates(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "runs").glob("*.md") if (root / "runs" / "presets" / f"{p.stem}.yml").exists())


def load_run_preset(name: str, scale: str, root: Path | None = None) -> dict:
    """The parameters of run ``name`` at ``scale``; an unknown scale lists the valid ones."""
    root = root or repo_root()
    path = root / "runs" / "presets" / f"{name}.yml"
    if not path.exists():
        raise FileNotFoundError(f"no presets for run {name!r}: expected {path}")
    from manifold_muon_lab.config import preset_scale

    return preset_scale(path, scale)  # one sentence naming the file for an empty, duplicated or non-UTF-8 preset


def run_dir(name: str, scale: str, root: Path | None = None) -> Path:
    return (root or repo_root()) / "runs" / name / scale


def run_inputs_sha(name: str, scale: str, root: Path | None = None) -> str:
    """Hash of what a run's outputs at ``scale`` depend on: its template, that scale's entry of its
    presets, and the training preset (``runs/presets/training/<name>.yml``) that the entry names as
    ``training_preset``. Adding or editing another scale (a ``gpu`` entry) leaves the ``cpu`` outputs valid."""
    from manifold_muon_lab.config import read_yaml_file

    root = root or repo_root()
    presets_path = root / "runs" / "presets" / f"{name}.yml"
    entry = (read_yaml_file(presets_path) or {}).get(scale)
    parts = [(root / "runs" / f"{name}.md").read_bytes(), _canonical(entry)]
    training = entry.get("training_preset") if isinstance(entry, dict) else None
    if training:
        path = root / "runs" / "presets" / "training" / f"{training}.yml"
        if not path.exists():
            raise FileNotFoundError(f"runs/presets/{name}.yml names training preset {training!r}, but {path} does not exist")
        parts.append(_yaml_content(path))
    return _sha(*parts)


def _canonical(value) -> bytes:
    return json.dumps(value, sort_keys=True, default=str).encode()


def _yaml_content(path: Path) -> bytes:
    """What a preset file says, without its comments and layout: editing a comment makes nothing stale."""
    from manifold_muon_lab.config import read_yaml_file

    return _canonical(read_yaml_file(path))


def load_run_metrics(name: str, scale: str = "cpu", root: Path | None = None) -> dict:
    """The metrics a run left at ``scale``, refusing ones produced from other inputs than today's."""
    root = root or repo_root()
    path = run_dir(name, scale, root) / "metrics.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; produce it with `make runs SCALE={scale}`")
    metrics = json.loads(path.read_text())
    if metrics.get("inputs_sha") != run_inputs_sha(name, scale, root):
        raise RuntimeError(
            f"{path} was produced from another version of runs/{name}.md or its presets; "
            f"re-run it with `make runs SCALE={scale}`"
        )
    return metrics


def _module_file(root: Path, module: str) -> Path | None:
    """The source file of one of the book's modules (a package's __init__.py), or None for anything else."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = root / "lib" / Path(*module.split("."))
    for f in (base / "__init__.py", base.with_suffix(".py")):
        if f.is_file():
            return f
    return None


def _imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of the modules ``source`` imports (relative imports resolved against ``module``);
    ``from X import y`` counts X and, if it is a module, X.y. A source that does not parse imports everything."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(PACKAGES)
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            found.add(name)
            found |= {f"{name}.{a.name}" for a in node.names}
    return found


def imported_sources(root: Path, source: str) -> list[Path]:
    """The files of the book's modules that ``source`` (a page's code) needs, transitively, parents included."""
    todo, seen = list(_imported_modules(source, "__page__", False)), set()
    while todo:
        name = todo.pop()
        for i in range(1, name.count(".") + 2):  # importing a.b.c runs a, a.b and a.b.c
            module = ".".join(name.split(".")[:i])
            f = _module_file(root, module)
            if f is None or module in seen:
                continue
            seen.add(module)
            todo += _imported_modules(f.read_text(), module, f.name == "__init__.py")
    return sorted({_module_file(root, m) for m in seen})


def _code_of(md: Path) -> str:
    import jupytext

    return "\n".join(c.source for c in jupytext.read(md).cells if c.cell_type == "code")


def _code_sha(md: Path, root: Path) -> bytes:
    files = imported_sources(root, _code_of(md))
    return b"".join(f.relative_to(root).as_posix().encode() + f.read_bytes() for f in files)


def _run_outputs_sha(md: Path, root: Path) -> bytes:
    """The metrics of the runs a page names (``runs/<name>/...`` or ``load_run_metrics("<name>"``): a new
    run of one experiment re-executes the pages that read it, not every page."""
    text = md.read_text()
    named = [n for n in run_templates(root) if re.search(rf"""(runs/|["']){re.escape(n)}(/|["'])""", text)]
    files = sorted(f for n in named for f in (root / "runs" / n).glob("*/metrics.json") if "_smoke" not in f.parts)
    files += sorted(f for f in (root / "runs" / "bench").glob("*.json") if f.name in text)   # `make bench` outputs
    return b"".join(f.relative_to(root).as_posix().encode() + f.read_bytes() for f in files)


_CLAIM_ID = re.compile(r"\b[A-Z]+-[A-Z0-9]+-\d+\b")


def _ledger_sha(md: Path, root: Path) -> bytes:
    """What a page reads of ``book/claims.yml``: the claims whose ids it names, and the sources and
    chapters; the claims page reads it all. Re-grading one claim re-executes the pages that show it."""
    claims = root / "book" / "claims.yml"
    if not claims.exists():
        return b""
    if md.parent.name != "chapters":
        return claims.read_bytes()
    ledger = yaml.safe_load(claims.read_text())
    ids = set(_CLAIM_ID.findall(md.read_text()))
    shown = [c for c in ledger.get("claims", []) if c.get("id") in ids]
    return _canonical({"sources": ledger.get("sources"), "chapters": ledger.get("chapters"), "claims": shown})


def pages(root: Path) -> list[Path]:
    return sorted((root / "chapters").glob("*.md")) + [p for p in [root / "book" / "claims.md"] if p.exists()]


def page_inputs_sha(md: Path, root: Path) -> str:
    """Hash of what a page's outputs depend on: its text, the code it imports (transitively, within the
    book's packages), the metrics of the runs it names and the ledger entries it shows."""
    return _sha(md.read_bytes(), _run_outputs_sha(md, root), _ledger_sha(md, root), _code_sha(md, root))


def _stored_sha(ipynb: Path) -> str | None:
    if not ipynb.exists():
        return None
    try:
        return json.loads(ipynb.read_text()).get("metadata", {}).get(SHA_KEY)
    except json.JSONDecodeError:
        return None


def _md_to_ipynb(md: Path, ipynb: Path, keep_outputs: bool) -> None:
    import jupytext

    nb = jupytext.read(md)
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    nb.metadata["jupytext"] = {"formats": "ipynb,md:myst"}
    for i, cell in enumerate(nb.cells):
        cell.id = hashlib.sha1(f"{i}:{cell.source}".encode()).hexdigest()[:8]  # stable ids: no git noise
        if cell.cell_type == "code" and not keep_outputs:
            cell.outputs, cell.execution_count = [], None
    text = jupytext.writes(nb, fmt="ipynb")
    if ipynb.exists() and ipynb.read_text() == text:
        return  # unchanged: leave the file (and its time) alone
    _write_via_tmp(ipynb, text)


def _write_via_tmp(path: Path, text: str) -> None:
    """Write ``path`` through a hidden temporary file and a rename; the temporary never outlives a failure."""
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _execute(src: Path, dst: Path, cwd: Path, parameters: dict | None, timeout: int = 3600) -> float:
    import papermill as pm

    os.environ.setdefault("MANIFOLD_MUON_DATA_DIR", str(repo_root(cwd) / "data"))  # the kernel inherits it
    import shutil
    import tempfile

    from jupyter_client.manager import KernelManager

    tmp = dst.with_name(f".{dst.stem}.tmp.ipynb")
    t0 = time.perf_counter()
    _WORKING.add(tmp)
    # the kernel talks over local sockets (IPC), not unencrypted TCP; what its cells print (a run's training
    # progress) is forwarded to this terminal as it comes
    sockets = tempfile.mkdtemp(prefix="manifold-muon-kernel-")
    km = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(sockets, "kernel"))
    try:
        with _forwarding_cell_output():
            pm.execute_notebook(
                str(src), str(tmp), parameters=parameters or {}, cwd=str(cwd), kernel_name="python3",
                progress_bar=False, execution_timeout=timeout, request_save_on_cell_execute=False,
                log_output=True, km=km,
            )
    except Exception:
        failed = dst.with_name(f"{dst.stem}.failed.ipynb")
        if tmp.exists():
            os.replace(tmp, failed)
            print(f"  the executed notebook with the error is in {failed}", file=sys.stderr)
        raise
    except BaseException:  # interrupted (SIGINT, or SIGTERM via _stop): nothing half-written stays
        tmp.unlink(missing_ok=True)
        raise
    finally:
        _WORKING.discard(tmp)
        _shutdown(km)
        shutil.rmtree(sockets, ignore_errors=True)
    os.replace(tmp, dst)
    return time.perf_counter() - t0


def _shutdown(km) -> None:
    """Stop the page's kernel now that it has run: papermill leaves a kernel it was handed (``km``) running,
    and each then lingered until this process exited (one per page, printing "Parent appears to have exited").
    A shutdown request, then (after jupyter_client's wait) a kill: not ``shutdown_kernel``, which interrupts the
    kernel first, so that every page printed "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel"."""
    try:
        if km.has_kernel:
            km.request_shutdown()
            km.finish_shutdown()
            km.cleanup_resources()
    except Exception:  # noqa: BLE001 - best effort: an interrupt may have taken the kernel down already
        pass


class _CellOutput(logging.Filter):
    """Keep papermill's log records of what cells print; drop its own bookkeeping lines and blank lines."""
    OWN = ("Input Notebook:", "Output Notebook:", "Executing notebook with kernel", "Executing Cell", "Ending Cell",
           "Working directory:", "Black is not installed", "Executing notebook", "Kernel")

    def filter(self, record):
        msg = record.getMessage()
        record.msg, record.args = msg.rstrip("\n"), None
        return bool(msg.strip()) and not msg.strip().startswith(self.OWN)


@contextlib.contextmanager
def _forwarding_cell_output():
    """While a notebook executes, what its cells print goes to stderr, indented, as it comes."""
    log = logging.getLogger("papermill")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("    %(message)s"))
    handler.addFilter(_CellOutput())
    saved = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]


def takes_workers(template_md: Path) -> bool:
    """Whether a run template's parameters cell has ``workers`` (its independent jobs then run in parallel)."""
    return re.search(r"^workers\s*=", template_md.read_text(), re.M) is not None


SCRATCH_SCALES = ("smoke", "gpu-dry")  # they check code: always executed, written under runs/_smoke/ (git-ignored)


def default_workers() -> int:
    """Independent training runs at a time when ``--workers`` is not given: one per CPU core, but one where CUDA
    is present (the runs of a sweep would all share the first GPU, and each paper-scale run wants most of it)."""
    import torch

    if torch.cuda.is_available():
        return 1
    return os.cpu_count() or 1


def do_runs(root: Path, scale: str, force: bool, only: list[str] | None = None, out_root: Path | None = None,
            workers: int | None = None) -> list[str]:
    """Execute the run notebooks at ``scale`` whose outputs are missing or stale (all with ``force``). A
    template whose parameters cell has ``workers`` gets ``workers`` (default: ``default_workers()``): its
    independent training runs go that many at a time, each in its own single-threaded process. A scale of
    ``SCRATCH_SCALES`` is always executed, into ``runs/_smoke/`` unless ``out_root`` says otherwise."""
    if scale in SCRATCH_SCALES:
        force, out_root = True, out_root or root / "runs" / "_smoke"
    done = []
    workers = workers or default_workers()
    todo = []
    for name in _selected_runs(root, scale, only):
        metrics = (out_root or root / "runs") / name / scale / "metrics.json"
        if not force and metrics.exists() and json.loads(metrics.read_text()).get("inputs_sha") == run_inputs_sha(name, scale, root):
            print(f"[runs] {name} @ {scale}: up to date")
        else:
            todo.append(name)
    left = _plan(root, scale, todo, workers) if todo and scale not in SCRATCH_SCALES else {}
    for k, name in enumerate(todo, start=1):
        template_md, template_nb = root / "runs" / f"{name}.md", root / "runs" / f"{name}.ipynb"
        _md_to_ipynb(template_md, template_nb, keep_outputs=False)
        out = (out_root or root / "runs") / name / scale
        metrics = out / "metrics.json"
        sha = run_inputs_sha(name, scale, root)
        previous = _set_aside(out) if force and metrics.exists() else None
        out.mkdir(parents=True, exist_ok=True)
        print(f"[runs] {name} @ {scale}: executing ...", flush=True)
        params = {"scale": scale, "out_dir": str(out), "inputs_sha": sha}
        if takes_workers(template_md):
            params["workers"] = workers
        try:
            dt = _execute(template_nb, out / "run.ipynb", root / "runs", params)
            if not metrics.exists():
                raise RuntimeError(f"runs/{name}.md ran but wrote no {metrics}; it must end by writing its metrics")
        except BaseException:
            if previous is not None:  # the finished run that was set aside comes back; the new attempt's files go
                shutil.rmtree(out, ignore_errors=True)
                previous.rename(out)
            raise
        if previous is not None:
            shutil.rmtree(previous)
        print(f"[runs] {name} @ {scale}: done in {dt:.1f} s")
        done.append(name)
        if len(todo) > 1:
            rest = [left.get(n, float("nan")) for n in todo[k:]]
            eta = "" if any(x != x for x in rest) else f"; about {_duration(sum(rest))} left (estimated)"
            print(f"[runs] {k} of {len(todo)} runs done{eta}", flush=True)
    return done


def _set_aside(out: Path) -> Path:
    """Move a finished run's folder to ``<scale>.previous`` before a forced re-execution, so that the run starts
    from nothing: a run that keeps its finished parts to resume (``dual_ascent_scaling``'s ``sizes/``, which are
    committed) would otherwise only re-read them, and ``make reproduce`` would time and reproduce nothing. The
    caller puts it back if the new execution fails, and removes it once the new one has written its metrics.
    (Finished trainings under ``runs/_train/`` are not in this folder: a forced run still resumes those, which
    a fresh clone does not have.)"""
    previous = out.with_name(out.name + ".previous")
    if previous.exists():  # left by a run killed before it could clean up: the folder in place is the newer one
        shutil.rmtree(previous)
    out.rename(previous)
    return previous


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _plan(root: Path, scale: str, todo: list[str], workers: int) -> dict[str, float]:
    """Print what is about to run, with each run's estimated time (``estimate``: recorded times, else the cost
    model for the detected device); returns {run: seconds}, NaN where there is no estimate. Never fails a run:
    an estimate that cannot be made is said so."""
    try:
        rows = {r["run"]: r for r in estimate(root, scale, workers)}
    except Exception as e:  # noqa: BLE001 - the plan is information; the runs go on
        print(f"[runs] plan: {len(todo)} run(s) at {scale}: {', '.join(todo)} (no estimate: {type(e).__name__}: {e})")
        return {}
    secs = {n: float(rows.get(n, {}).get("estimate_s", float("nan"))) for n in todo}
    known = [v for v in secs.values() if v == v]
    device = next((r.get("device") for r in rows.values() if r.get("device") is not None), None)
    print(f"[runs] plan: {len(todo)} run(s) at scale {scale}, {workers} at a time where a run sweeps:")
    for n in todo:
        src = rows.get(n, {}).get("source", "no estimate")
        print(f"[runs]   {n:22s} " + (f"about {_duration(secs[n])} ({src})" if secs[n] == secs[n] else f"({src})"))
    if known:
        print(f"[runs] in all about {_duration(sum(known))}" + (f" ({len(todo) - len(known)} run(s) without an estimate)"
                                                             if len(known) < len(todo) else "")
              + (f"; model rows for {getattr(device, 'name', device)}" if device is not None else ""), flush=True)
    return secs


def do_chapters(root: Path, force: bool, only: list[str] | None = None) -> list[str]:
    done = []
    for md in _selected_pages(root, only):
        ipynb = md.with_suffix(".ipynb")
        sha = page_inputs_sha(md, root)
        if not force and _stored_sha(ipynb) == sha:
            print(f"[pages] {md.relative_to(root)}: up to date")
            continue
        print(f"[pages] {md.relative_to(root)}: executing ...", flush=True)
        source = ipynb.with_name(f".{ipynb.stem}.src.ipynb")  # the stored .ipynb is replaced only on success
        _WORKING.add(source)
        try:
            _md_to_ipynb(md, source, keep_outputs=False)
            dt = _execute(source, ipynb, md.parent, None)
        finally:
            source.unlink(missing_ok=True)
            _WORKING.discard(source)
        nb = json.loads(ipynb.read_text())
        nb["metadata"][SHA_KEY] = sha
        nb["metadata"].pop("papermill", None)
        for cell in nb["cells"]:
            cell.get("metadata", {}).pop("papermill", None)
            cell.get("metadata", {}).pop("execution", None)
        _write_via_tmp(ipynb, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        print(f"[pages] {md.relative_to(root)}: done in {dt:.1f} s")
        done.append(str(md.relative_to(root)))
    return done


def do_smoke(root: Path) -> None:
    """Every run notebook at its ``smoke`` preset, into runs/_smoke/ (git-ignored); fails loudly."""
    names = run_templates(root)
    if not names:
        raise RuntimeError("no run notebooks found under runs/ (each needs runs/<name>.md and runs/presets/<name>.yml)")
    do_runs(root, "smoke", force=True, out_root=root / "runs" / "_smoke")
    print(f"[smoke] {len(names)} run notebook(s) executed at scale=smoke: {', '.join(names)}")


def status(root: Path, scale: str) -> None:
    for name in run_templates(root):
        m = (root / "runs" / "_smoke" / name / scale if scale in SCRATCH_SCALES else run_dir(name, scale, root)) \
            / "metrics.json"
        ok = m.exists() and json.loads(m.read_text()).get("inputs_sha") == run_inputs_sha(name, scale, root)
        print(f"run  {name:30s} {scale:8s} {'up to date' if ok else 'STALE'}")
    for md in pages(root):
        ok = _stored_sha(md.with_suffix(".ipynb")) == page_inputs_sha(md, root)
        print(f"page {str(md.relative_to(root)):30s} {'':8s} {'up to date' if ok else 'STALE'}")


def _job_seconds(metrics: dict) -> list[float]:
    """The single-process seconds of a run's independent jobs, as it recorded them: every training run's
    ``wall_time_s`` under ``runs`` (and ``lr_check``, solver_training's runs at other rates), or every shape's under
    ``shape_seconds``."""
    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "wall_time_s" and isinstance(x, (int, float)):
                    yield float(x)
                elif k != "provenance":
                    yield from walk(x)
        elif isinstance(v, list):
            for x in v:
                yield from walk(x)
    return list(walk(metrics.get("runs", {}))) + list(walk(metrics.get("lr_check", {}))) + [float(x) for x in metrics.get("shape_seconds", {}).values()]


def makespan(jobs: list[float], workers: int) -> float:
    """Wall time of independent ``jobs`` on ``workers`` processes, longest first to the least loaded one
    (a pool that hands the next job to whichever worker frees first does about as well)."""
    load = [0.0] * max(1, workers)
    for t in sorted(jobs, reverse=True):
        load[load.index(min(load))] += t
    return max(load)


def estimate(root: Path, scale: str, workers: int, device=None) -> list[dict]:
    """What ``make reproduce SCALE=scale`` would take on ``workers`` cores, from the times this build's runs
    recorded: per run, its independent jobs scheduled on ``workers`` processes plus the rest of its notebook
    (recording, analysis), which runs in one process. A notebook that resumed finished jobs recorded only
    its own time, which is then counted whole. An estimate: the recorded times are as good as the machine
    was idle when they were taken. A run that recorded no times at ``scale`` is estimated by
    ``cost_model.run_estimate`` (a FLOP and bandwidth model of its presets) on ``device`` (a
    ``cost_model.Device``; None: ``cost_model.target_device()``, MMB_DEVICE or the detected one); each row's
    ``source`` says which ("recorded", "model"; "no model" or "no entry": not estimated, ``reason`` says why)."""
    rows = []
    for name in run_templates(root):
        m = run_dir(name, scale, root) / "metrics.json"
        if not m.exists():
            nan = float("nan")
            row = dict(run=name, jobs=0, job_s=0.0, rest_s=nan, estimate_s=nan, source="no entry", reason="")
            if scale not in run_scales(root, name):
                row["reason"] = f"no {scale} entry in runs/presets/{name}.yml"
            else:
                from . import cost_model

                device = device or cost_model.target_device()
                try:
                    r = cost_model.run_estimate(root, name, scale, device, workers)
                except Exception as e:  # the estimate of the others goes on; the reason is printed
                    r = dict(estimate_s=nan, reason=f"the cost model failed ({type(e).__name__}: {e})")
                row.update({k: v for k, v in r.items() if k != "run"})
                row.update(source="model" if r["estimate_s"] == r["estimate_s"] else "no model", device=device)
            rows.append(row)
            continue
        metrics = json.loads(m.read_text())
        prov = metrics.get("provenance", {})
        wall = float(prov.get("wall_time_s") or 0.0)
        jobs = _job_seconds(metrics)
        then = int((prov.get("parameters") or {}).get("workers") or 1)
        done_then = makespan(jobs, then) if jobs else 0.0
        rest = wall - done_then if wall >= done_then else wall
        now = workers if takes_workers(root / "runs" / f"{name}.md") else 1
        rows.append(dict(run=name, jobs=len(jobs), job_s=sum(jobs), rest_s=rest,
                         estimate_s=(makespan(jobs, now) if jobs else 0.0) + rest, source="recorded"))
    return rows


def print_estimate(root: Path, scale: str, workers: int) -> None:
    """The table of ``estimate``: per run its source, jobs, training steps, times and (model rows) the largest
    term of the cost model; then the total and what the model assumed. ``MMB_DEVICE=<name>`` (e.g. h100) sets
    the device the cost model estimates for (default: the CUDA device torch sees, else this CPU); an unknown
    name is refused in one sentence listing the known ones."""
    from . import cost_model

    try:
        device = cost_model.device_named(os.environ["MMB_DEVICE"]) if os.environ.get("MMB_DEVICE") else None
        rows = estimate(root, scale, workers, device)
    except ValueError as e:  # an unknown MMB_DEVICE, or a GPU the model has no figures for
        raise SystemExit(f"pipeline estimate: {e}") from None

    def dur(s: float) -> str:
        return f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h  " if s < 3.6e6 else f"{s / 3600:,.0f} h  "

    print(f"{'run':20s} {'source':16s} {'jobs':>5s} {'steps':>9s} {'jobs, 1 process':>16s} {'rest':>11s} "
          f"{'estimate':>11s}  largest term")
    for r in rows:
        if r["source"] in ("no entry", "no model"):
            print(f"{r['run']:20s} {'-':16s} {'-':>5s}  " + (f"(no {scale} entry)" if r["source"] == "no entry" else
                                                              f"no recorded times and no model: {r['reason']}"))
            continue
        model = r["source"] == "model"
        source = f"model: {r['device'].key}" if model else "recorded"
        steps = f"{r['steps']:9,d}" if model else f"{'-':>9s}"
        print(f"{r['run']:20s} {source:16s} {r['jobs']:5d} {steps} {dur(r['job_s']):>16s} {dur(r['rest_s']):>11s} "
              f"{dur(r['estimate_s']):>11s}  {r['largest'] if model else ''}")
    recorded = [r for r in rows if r["source"] == "recorded"]
    modelled = [r for r in rows if r["source"] == "model"]
    missing = [f"{r['run']} ({r['reason']})" for r in rows if r["source"] == "no model"]
    for r in modelled:
        for note in r.get("notes", []):
            print(f"  note, {r['run']}: {note}")
    if not recorded and not modelled:
        print(f"make reproduce SCALE={scale}: no run has recorded its times at this scale yet, and the cost model "
              "has none of them either, so there is nothing to estimate from")
        return
    rec_s, mod_s = sum(r["estimate_s"] for r in recorded), sum(r["estimate_s"] for r in modelled)
    cpu_s = sum(r.get("cpu_s", 0.0) for r in modelled)
    parts = ([f"{rec_s / 3600:,.2f} h from the times the runs recorded, on {workers} core(s)"] if recorded else []) + \
        ([f"{mod_s / 3600:,.1f} h from the cost model" + (f" ({', '.join(r['run'] for r in modelled)}: no recorded "
          "times at this scale)" if recorded else " (no recorded times at this scale for any run)")
          + (f", of which {cpu_s / 3600:,.1f} h is work the notebooks do on the CPU, costed at this machine's measured "
             "speed" if cpu_s else "")] if modelled else [])
    total_h = (rec_s + mod_s) / 3600
    print(f"make reproduce SCALE={scale}: about {total_h:,.{2 if total_h < 10 else 1}f} h of runs ({'; '.join(parts)}), plus "
          "executing the pages (minutes)" + (f"; not counted: {'; '.join(missing)}" if missing else ""))
    if modelled:
        dev = modelled[0]["device"]
        print(f"the model rows are a model, not a measurement: device {dev.key} ({cost_model.assumptions(dev)}); "
              f"MMB_DEVICE=<name> estimates for another ({', '.join(cost_model.known_devices())}); the assumptions "
              "are the constants of manifold_muon_book/cost_model.py")


class _Stopped(BaseException):
    """SIGTERM, raised where the pipeline is, so that its ``finally`` clauses clean up as for Ctrl-C."""


STOP_GRACE_S = 30.0  # after a stop signal, how long the orderly unwinding may take before the watchdog ends it
_WORKING: set[Path] = set()  # the hidden working notebooks in use, removed on every way out


def _child_pids() -> list[int]:
    """The pipeline's child processes (a notebook's kernel), from /proc (Linux); none found elsewhere."""
    pids = []
    for task in Path("/proc/self/task").glob("*"):
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except (OSError, ValueError):
            pass
    return pids


def _force_exit(signum: int) -> None:
    """The watchdog: the orderly unwinding did not finish in time; do its work and leave."""
    for path in list(_WORKING):
        path.unlink(missing_ok=True)
    for pid in _child_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"[pipeline] stopped by {signal.Signals(signum).name}; the kernel did not shut down within "
          f"{STOP_GRACE_S:.0f} s and was killed; the working files are removed, the stored notebooks untouched",
          file=sys.stderr, flush=True)
    os._exit(128 + signum)


def _stop(signum, frame):
    """SIGINT and SIGTERM: arm the watchdog, then unwind (Ctrl-C as KeyboardInterrupt, SIGTERM as _Stopped)."""
    watchdog = threading.Timer(STOP_GRACE_S, _force_exit, args=(signum,))
    watchdog.daemon = True
    watchdog.start()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise _Stopped(signum)


def _selected_runs(root: Path, scale: str, only: list[str] | None) -> list[str]:
    """The runs to execute (``only``, else all), refusing an unknown run or scale before any work."""
    names = run_templates(root)
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise ValueError(f"no run {', '.join(map(repr, unknown))}; runs are {', '.join(names)}")
    selected = only or names
    for name in selected:
        load_run_preset(name, scale, root)
    return selected


def _selected_pages(root: Path, only: list[str] | None) -> list[Path]:
    """The pages to execute (``only``, as paths from the root, else all), refusing one that is not a page."""
    every = pages(root)
    if not only:
        return every
    unknown = [o for o in only if (root / o).resolve() not in {p.resolve() for p in every}]
    if unknown:
        raise ValueError(f"not a book page: {', '.join(unknown)}; pages are "
                         f"{', '.join(str(p.relative_to(root)) for p in every)}")
    wanted = {(root / o).resolve() for o in only}
    return [p for p in every if p.resolve() in wanted]


def run_scales(root: Path, name: str) -> list[str]:
    """The scales ``runs/presets/<name>.yml`` defines."""
    from manifold_muon_lab.config import read_yaml_file

    return list(read_yaml_file(root / "runs" / "presets" / f"{name}.yml") or {})


LOCAL_DATA = ("kjv", "kjv-books")  # data sets the package makes from what it ships, offline, in seconds

GPU_DRY = "gpu-dry"
# The keys in which a gpu-dry training preset (runs/presets/training/gpu-dry-<paper>.yml) may differ from its
# paper preset (<paper>.yml): the sizes, the step counts and measurement cadences, and what makes it run on the
# CPU of a CI machine (device cpu; the local stand-in data, with the bytes tokenizer). Every other key (family,
# architecture options, vocab_size, dtype, compile, lr and schedule shape, optimizer, per_assignment, ...) must
# be the paper preset's, present or absent alike.
GPU_DRY_KEYS = ("n_layer", "n_head", "n_kv_head", "n_embd", "batch_size", "gradient_accumulation_steps",
                "block_size", "max_steps", "warmup", "eval_every", "eval_batches", "spectrum_every",
                "probe_every", "probe_rows", "checkpoint_every", "device", "data")


def gpu_dry_problems(root: Path) -> list[str]:
    """What keeps the gpu-dry scale from being the GPU path on the CPU, one clause each (empty: nothing): a run
    with a ``gpu`` entry and no ``gpu-dry`` one, or whose ``gpu-dry`` entry names other training presets than
    the ``gpu-dry-<paper>`` twins of its ``gpu`` entry's (a CPU preset, as dual_ascent_shapes' recording,
    stays itself); a gpu-dry training preset without its paper preset, differing from it outside
    ``GPU_DRY_KEYS``, not on the CPU, not on local data, or with fewer than two micro-batches per step."""
    from manifold_muon_lab.config import read_yaml_file

    training = root / "runs" / "presets" / "training"
    problems = []

    def read(name):
        path = training / f"{name}.yml"
        return (read_yaml_file(path) or {}) if path.is_file() else None

    for name in run_templates(root):
        scales = run_scales(root, name)
        if "gpu" not in scales:
            continue
        if GPU_DRY not in scales:
            problems.append(f"runs/presets/{name}.yml has a gpu entry but no {GPU_DRY} entry")
            continue
        want = set()
        for t in set(_walk_training_presets(load_run_preset(name, "gpu", root))):
            cfg = read(t)
            want.add(t if cfg is not None and cfg.get("device", "auto") == "cpu" else f"{GPU_DRY}-{t}")
        got = set(_walk_training_presets(load_run_preset(name, GPU_DRY, root)))
        if got != want:
            problems.append(f"runs/presets/{name}.yml: its {GPU_DRY} entry names the training preset(s) "
                            f"{', '.join(sorted(got)) or 'none'}, its gpu entry's twins are {', '.join(sorted(want))}")
    for path in sorted(training.glob(f"{GPU_DRY}-*.yml")):
        paper_name = path.stem[len(GPU_DRY) + 1:]
        dry, paper = read(path.stem) or {}, read(paper_name)
        where = f"runs/presets/training/{path.name}"
        if paper is None:
            problems.append(f"{where} has no paper preset {paper_name}.yml to be the dry run of")
            continue
        drift = sorted(k for k in set(dry) | set(paper)
                       if k not in GPU_DRY_KEYS and (k in dry, dry.get(k)) != (k in paper, paper.get(k)))
        if drift:
            problems.append(f"{where} differs from {paper_name}.yml in {', '.join(drift)}, which only "
                            f"GPU_DRY_KEYS may change")
        if dry.get("device") != "cpu":
            problems.append(f"{where} has device {dry.get('device', 'auto')!r}, not cpu")
        if dry.get("data") not in LOCAL_DATA:
            problems.append(f"{where} trains on {dry.get('data')!r}, not on local data ({', '.join(LOCAL_DATA)})")
        if int(dry.get("gradient_accumulation_steps", 1)) < 2:
            problems.append(f"{where} has gradient_accumulation_steps {dry.get('gradient_accumulation_steps', 1)}, "
                            "fewer than the 2 that run the accumulation path")
    return problems


def _walk_training_presets(value):
    """The training presets a run preset's scale names (``training_preset`` keys at any depth)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "training_preset" and isinstance(v, str):
                yield v
            else:
                yield from _walk_training_presets(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk_training_presets(v)


def scale_needs(root: Path, name: str, scale: str) -> dict:
    """What run ``name`` at ``scale`` needs: {"gpu": bool, "data": set of data sets} from its training presets
    (a training preset whose ``device`` is not ``cpu`` wants a GPU)."""
    from manifold_muon_lab.config import read_yaml_file

    needs = {"gpu": False, "data": set()}
    for t in set(_walk_training_presets(load_run_preset(name, scale, root))):
        path = root / "runs" / "presets" / "training" / f"{t}.yml"
        if not path.is_file():
            raise ValueError(f"run {name!r} at scale {scale!r} names the training preset {t!r}, but there is no {path}")
        cfg = read_yaml_file(path) or {}
        needs["gpu"] |= cfg.get("device", "auto") != "cpu"
        if cfg.get("data") not in (None, "synthetic"):
            needs["data"].add(cfg["data"])
    return needs


def preflight_scale(root: Path, scale: str, only: list[str] | None, allow_cpu: bool = False) -> list[str]:
    """Refuse, in one sentence and before any run starts, a scale that some selected run lacks, a GPU scale on
    a machine without CUDA (unless ``allow_cpu``), or a data set that is not prepared; returns the runs."""
    names = run_templates(root)
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise ValueError(f"no run {', '.join(map(repr, unknown))}; runs are {', '.join(names)}")
    selected = only or names
    lacking = [n for n in selected if scale not in run_scales(root, n)]
    if lacking:
        have = sorted({k for n in names for k in run_scales(root, n)})
        raise ValueError(f"scale {scale!r} is not defined for the run(s) {', '.join(lacking)} (scales: {', '.join(have)}); "
                         f"choose another scale, or --only the runs that have it")
    if scale == GPU_DRY and (problems := gpu_dry_problems(root)):
        raise ValueError(f"the {GPU_DRY} scale is not the GPU path on the CPU: {'; '.join(problems)}; "
                         "fix the presets (see GPU_DRY_KEYS in manifold_muon_book/pipeline.py)")
    needs = {n: scale_needs(root, n, scale) for n in selected}
    gpu = [n for n, v in needs.items() if v["gpu"]]
    if gpu and not allow_cpu:
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"scale {scale!r} trains on a GPU ({', '.join(gpu)}) and this machine has none (no CUDA): "
                             "run it on a GPU box, or pass --allow-cpu (make reproduce ... ALLOW_CPU=1) to run it on "
                             "the CPU anyway, which takes days")
    from manifold_muon_lab.data import DATASETS, prepared_meta, preparation_problem

    # the embedded text (kjv) is prepared in seconds on first use; a downloaded corpus must be there before hours
    # of runs start, not when the fifth notebook reaches it
    missing = sorted({d for v in needs.values() for d in v["data"]
                      if d in DATASETS and d not in LOCAL_DATA and prepared_meta(d) is None})
    if missing:
        users = [n for n, v in needs.items() if v["data"] & set(missing)]
        how = "; ".join(preparation_problem(d) or f"python -c 'from manifold_muon_lab.data import "
                        f"{DATASETS[d].__name__}; {DATASETS[d].__name__}()'" for d in missing)
        raise ValueError(f"the data set(s) {', '.join(missing)} that {', '.join(users)} train on at scale {scale!r} "
                         f"are not prepared; prepare them first: {how}")
    check_disk(root, scale, selected)
    return selected


DISK_MARGIN = 1 << 30  # besides the checkpoints: metrics, executed notebooks, the interpreter's temporary files


def check_disk(root: Path, scale: str, selected: list[str], free: int | None = None) -> None:
    """Refuse, before any run starts, a scale whose trainings' checkpoints would not fit on the disk that holds
    ``runs/``: each training keeps its last checkpoint (``cost_model.disk_need``: 12 bytes a parameter), one
    more copy exists while a checkpoint is written, plus ``DISK_MARGIN``. Checkpoints already under a selected
    run's folder count as free (a re-run replaces them). Scratch scales (smoke, gpu-dry) are small and not
    checked. ``free``: the free bytes (default: ``shutil.disk_usage``)."""
    if scale in SCRATCH_SCALES:
        return
    import shutil

    from .cost_model import NoModel, disk_need

    need, largest, per_run = 0, 0, {}
    for name in selected:
        try:
            total, big = disk_need(root, name, scale)
        except NoModel:
            continue
        need, largest = need + total, max(largest, big)
        per_run[name] = total
    need += largest + DISK_MARGIN
    present = sum(f.stat().st_size for name in selected if (root / "runs" / name / scale).is_dir()
                  for f in (root / "runs" / name / scale).rglob("*.pt"))
    free = shutil.disk_usage(root / "runs").free if free is None else free
    if need > free + present:
        gib = lambda b: f"{b / 2 ** 30:.1f} GiB"  # noqa: E731
        big = ", ".join(f"{n} {gib(b)}" for n, b in sorted(per_run.items(), key=lambda kv: -kv[1]) if b)
        raise ValueError(f"scale {scale!r} needs about {gib(need)} of disk for its checkpoints ({big}; each training "
                         f"keeps its last one to resume from) and the disk holding {root / 'runs'} has "
                         f"{gib(free + present)} free: free some space, or run part of it with --only")


def _check_args(root: Path, args) -> None:
    """Refuse an unknown run, scale, page or worker count before anything executes."""
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers {args.workers} must be at least 1 (or left out: one per CPU core)")
    if args.what == "runs":
        preflight_scale(root, args.scale, args.only, allow_cpu=args.allow_cpu)
    elif args.what in ("status", "estimate"):
        scales = sorted({k for n in run_templates(root) for k in run_scales(root, n)})
        if args.scale not in scales:
            raise ValueError(f"no run has the scale {args.scale!r}; scales are {', '.join(scales)}")
    elif args.what == "chapters":
        _selected_pages(root, args.only)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m manifold_muon_book.pipeline", description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["runs", "chapters", "smoke", "status", "estimate"])
    ap.add_argument("--scale", default="cpu")
    ap.add_argument("--force", action="store_true", help="execute even what is up to date")
    ap.add_argument("--workers", type=int, default=None,
                    help="runs: independent training runs at a time, one process each (default: one per CPU core; 1 where CUDA is present)")
    ap.add_argument("--only", nargs="*", help="run names (runs) or page paths such as chapters/01_muon_msign.md (chapters)")
    ap.add_argument("--allow-cpu", action="store_true",
                    help="runs: run a GPU scale on a machine without CUDA anyway (days, not hours)")
    args = ap.parse_args(argv)
    try:
        root = repo_root()
        _check_args(root, args)
    except (ValueError, FileNotFoundError) as e:   # a bad argument: one sentence, exit code 2, before any work
        ap.error(str(e))
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if args.what == "runs":
            do_runs(root, args.scale, args.force, args.only, workers=args.workers)
        elif args.what == "chapters":
            do_chapters(root, args.force, args.only)
        elif args.what == "smoke":
            do_smoke(root)
        elif args.what == "estimate":
            print_estimate(root, args.scale, args.workers or os.cpu_count() or 1)
        else:
            status(root, args.scale)
    except (KeyboardInterrupt, _Stopped) as e:
        signum = e.args[0] if isinstance(e, _Stopped) else signal.SIGINT
        print(f"[pipeline] stopped by {signal.Signals(signum).name}; its working files are removed, the stored "
              "notebooks untouched", file=sys.stderr, flush=True)
        sys.exit(128 + signum)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    main()
