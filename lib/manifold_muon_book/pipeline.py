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
        shutil.rmtree(sockets, ignore_errors=True)
    os.replace(tmp, dst)
    return time.perf_counter() - t0


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


def do_runs(root: Path, scale: str, force: bool, only: list[str] | None = None, out_root: Path | None = None,
            workers: int | None = None) -> list[str]:
    """Execute the run notebooks at ``scale`` whose outputs are missing or stale (all with ``force``). A
    template whose parameters cell has ``workers`` gets ``workers`` (default: one per CPU core): its
    independent training runs go that many at a time, each in its own single-threaded process."""
    done = []
    workers = workers or os.cpu_count() or 1
    for name in _selected_runs(root, scale, only):
        template_md, template_nb = root / "runs" / f"{name}.md", root / "runs" / f"{name}.ipynb"
        _md_to_ipynb(template_md, template_nb, keep_outputs=False)
        out = (out_root or root / "runs") / name / scale
        metrics = out / "metrics.json"
        sha = run_inputs_sha(name, scale, root)
        if not force and metrics.exists() and json.loads(metrics.read_text()).get("inputs_sha") == sha:
            print(f"[runs] {name} @ {scale}: up to date")
            continue
        out.mkdir(parents=True, exist_ok=True)
        print(f"[runs] {name} @ {scale}: executing ...", flush=True)
        params = {"scale": scale, "out_dir": str(out), "inputs_sha": sha}
        if takes_workers(template_md):
            params["workers"] = workers
        dt = _execute(template_nb, out / "run.ipynb", root / "runs", params)
        if not metrics.exists():
            raise RuntimeError(f"runs/{name}.md ran but wrote no {metrics}; it must end by writing its metrics")
        print(f"[runs] {name} @ {scale}: done in {dt:.1f} s")
        done.append(name)
    return done


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
        m = run_dir(name, scale, root) / "metrics.json"
        ok = m.exists() and json.loads(m.read_text()).get("inputs_sha") == run_inputs_sha(name, scale, root)
        print(f"run  {name:30s} {scale:8s} {'up to date' if ok else 'STALE'}")
    for md in pages(root):
        ok = _stored_sha(md.with_suffix(".ipynb")) == page_inputs_sha(md, root)
        print(f"page {str(md.relative_to(root)):30s} {'':8s} {'up to date' if ok else 'STALE'}")


def _job_seconds(metrics: dict) -> list[float]:
    """The single-process seconds of a run's independent jobs, as it recorded them: every training run's
    ``wall_time_s`` under ``runs``, or every shape's under ``shape_seconds``."""
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
    return list(walk(metrics.get("runs", {}))) + [float(x) for x in metrics.get("shape_seconds", {}).values()]


def makespan(jobs: list[float], workers: int) -> float:
    """Wall time of independent ``jobs`` on ``workers`` processes, longest first to the least loaded one
    (a pool that hands the next job to whichever worker frees first does about as well)."""
    load = [0.0] * max(1, workers)
    for t in sorted(jobs, reverse=True):
        load[load.index(min(load))] += t
    return max(load)


def estimate(root: Path, scale: str, workers: int) -> list[dict]:
    """What ``make reproduce SCALE=scale`` would take on ``workers`` cores, from the times this build's runs
    recorded: per run, its independent jobs scheduled on ``workers`` processes plus the rest of its notebook
    (recording, analysis), which runs in one process. A notebook that resumed finished jobs recorded only
    its own time, which is then counted whole. An estimate: the recorded times are as good as the machine
    was idle when they were taken."""
    rows = []
    for name in run_templates(root):
        m = run_dir(name, scale, root) / "metrics.json"
        if not m.exists():
            rows.append(dict(run=name, jobs=0, job_s=0.0, rest_s=float("nan"), estimate_s=float("nan")))
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
                         estimate_s=(makespan(jobs, now) if jobs else 0.0) + rest))
    return rows


def print_estimate(root: Path, scale: str, workers: int) -> None:
    rows = estimate(root, scale, workers)
    print(f"{'run':22s} {'jobs':>5s} {'jobs, 1 process':>16s} {'rest':>9s} {f'on {workers} core(s)':>14s}")
    for r in rows:
        if r["estimate_s"] != r["estimate_s"]:
            print(f"{r['run']:22s} {'-':>5s} {'no recorded times':>16s}")
            continue
        print(f"{r['run']:22s} {r['jobs']:5d} {r['job_s'] / 60:13.1f} min {r['rest_s'] / 60:5.1f} min "
              f"{r['estimate_s'] / 60:10.1f} min")
    known = [r for r in rows if r["estimate_s"] == r["estimate_s"]]  # not NaN: the run recorded its times here
    unknown = [r["run"] for r in rows if r not in known]
    total = sum(r["estimate_s"] for r in known)
    if not known:
        print(f"make reproduce SCALE={scale}: no run has recorded its times at this scale yet, so there is nothing to "
              "estimate from; run one (e.g. --only with the shortest) and ask again")
        return
    print(f"make reproduce SCALE={scale} on {workers} core(s): about {total / 3600:.2f} h of runs (estimated from "
          "the times they recorded), plus executing the pages (minutes)"
          + (f"; not counted, with no recorded times: {', '.join(unknown)}" if unknown else ""))


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


LOCAL_DATA = ("kjv",)  # data sets the package makes from what it ships, offline, in seconds


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
    return selected


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
                    help="runs: independent training runs at a time, one process each (default: one per CPU core)")
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
