"""The pipeline that `make` drives: stored outputs match their inputs, stale ones are refused."""

import json
import shutil
from pathlib import Path

import jupytext
import nbformat
import pytest
import yaml

from manifold_muon_book import pipeline

ROOT = Path(__file__).resolve().parents[1]


def test_every_run_has_presets_with_smoke_and_cpu():
    names = pipeline.run_templates(ROOT)
    assert "msign_accuracy" in names
    for name in names:
        for scale in ("smoke", "cpu"):
            assert pipeline.load_run_preset(name, scale, ROOT)


@pytest.mark.parametrize("name", pipeline.run_templates(ROOT))
def test_stored_cpu_outputs_were_made_from_todays_template(name):
    """Editing a run template or its presets without re-running it (`make runs`) fails here."""
    metrics = pipeline.load_run_metrics(name, "cpu", ROOT)
    assert metrics["provenance"]["commit"] and metrics["provenance"]["torch_version"]
    assert metrics["provenance"]["wall_time_s"] > 0


@pytest.mark.parametrize("md", pipeline.pages(ROOT), ids=lambda p: p.name)
def test_committed_notebook_has_the_cells_of_its_markdown(md):
    """The executed .ipynb next to each page is the pair of today's .md (`make chapters` re-pairs)."""
    ipynb = md.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb} missing: run `make chapters`"
    src = [(c.cell_type, c.source.strip()) for c in jupytext.read(md).cells]
    got = [(c.cell_type, c.source.strip()) for c in nbformat.read(ipynb, as_version=4).cells]
    assert src == got, f"{ipynb.name} was executed from another version of {md.name}: run `make chapters`"
    nb = nbformat.read(ipynb, as_version=4)
    assert all(c.get("outputs") is not None for c in nb.cells if c.cell_type == "code")


def test_unknown_scale_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="choose one of: smoke, cpu"):
        pipeline.load_run_preset("msign_accuracy", "tpu", ROOT)
    with pytest.raises(ValueError, match="no scale"):
        pipeline.do_runs(ROOT, "tpu", force=False)


def test_stale_metrics_are_refused(tmp_path):
    root = tmp_path / "book"
    (root / "runs" / "presets").mkdir(parents=True)
    (root / "_config.yml").write_text("title: t\n")
    shutil.copy(ROOT / "runs" / "msign_accuracy.md", root / "runs")
    shutil.copy(ROOT / "runs" / "presets" / "msign_accuracy.yml", root / "runs" / "presets")
    out = pipeline.run_dir("msign_accuracy", "cpu", root)
    out.mkdir(parents=True)
    sha = pipeline.run_inputs_sha("msign_accuracy", "cpu", root)
    (out / "metrics.json").write_text(json.dumps({"inputs_sha": sha, "x": 1}))
    assert pipeline.load_run_metrics("msign_accuracy", "cpu", root)["x"] == 1
    with open(root / "runs" / "presets" / "msign_accuracy.yml", "a") as f:
        f.write("\n# a comment changes nothing\n")
    assert pipeline.load_run_metrics("msign_accuracy", "cpu", root)["x"] == 1
    with open(root / "runs" / "presets" / "msign_accuracy.yml", "a") as f:
        f.write("\nnew_scale: {shapes: [[4, 4]]}\n")   # another scale: the cpu outputs stay valid
    assert pipeline.load_run_metrics("msign_accuracy", "cpu", root)["x"] == 1
    path = root / "runs" / "presets" / "msign_accuracy.yml"
    path.write_text(path.read_text().replace("repeats: 3", "repeats: 4", 1))   # the cpu entry itself
    with pytest.raises(RuntimeError, match="re-run it"):
        pipeline.load_run_metrics("msign_accuracy", "cpu", root)
    with pytest.raises(FileNotFoundError, match="make runs SCALE=gpu"):
        pipeline.load_run_metrics("msign_accuracy", "gpu", root)


def test_repo_root_outside_a_checkout_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="run from inside the repository"):
        pipeline.repo_root(tmp_path)


def _files(code):
    return {p.relative_to(ROOT / "lib").as_posix() for p in pipeline.imported_sources(ROOT, code)}


def test_a_page_depends_on_the_code_it_imports_and_nothing_else():
    """A benchmark refactor must not make a chapter stale that never imports the benchmarks."""
    stated = _files("from manifold_muon_book.stated import glue_value")
    assert stated == {"manifold_muon_book/__init__.py", "manifold_muon_book/stated.py"}
    library = _files("import numpy\nfrom manifold_muon import msign as ms")
    assert "manifold_muon/msign.py" in library and "manifold_muon/optim/base.py" in library  # its __init__ imports all
    assert not any(f.startswith(("manifold_muon_lab/", "manifold_muon_book/")) for f in library)
    verdicts = _files("from manifold_muon_book.verdicts import show_verdict")
    assert {"manifold_muon_book/claims.py", "manifold_muon_book/pipeline.py"} <= verdicts
    assert not any("bench" in f for f in verdicts | library | stated)
    lab = _files("from manifold_muon_lab.metrics import read_metrics")
    assert "manifold_muon_lab/metrics.py" in lab and "manifold_muon/optim/base.py" in lab  # metrics imports manifold_muon


def test_editing_a_benchmark_leaves_chapter_01_fresh(tmp_path):
    page = ROOT / "chapters" / "01_muon_msign.md"
    before = pipeline.page_inputs_sha(page, ROOT)
    imported = pipeline.imported_sources(ROOT, pipeline._code_of(page))
    assert ROOT / "lib" / "manifold_muon_book" / "bench" / "common.py" not in imported
    assert ROOT / "lib" / "manifold_muon" / "msign.py" in imported
    assert pipeline.page_inputs_sha(page, ROOT) == before


def _mini_book(tmp_path):
    """A book of two pages, one run and a ledger of two claims, to see what makes which page stale."""
    root = tmp_path / "book"
    for d in ("chapters", "book", "runs/presets", "runs/exp/cpu", "lib"):
        (root / d).mkdir(parents=True)
    (root / "_config.yml").write_text("title: t\n")
    (root / "runs" / "exp.md").write_text("# a run\n")
    (root / "runs" / "presets" / "exp.yml").write_text("cpu: {n: 1}\n")
    (root / "runs" / "exp" / "cpu" / "metrics.json").write_text('{"x": 1}')
    (root / "book" / "claims.yml").write_text(yaml.safe_dump({
        "sources": {"B": {"title": "T"}}, "chapters": {},
        "claims": [{"id": "B-AA-01", "status": "confirmed"}, {"id": "B-BB-01", "status": "partly"}]}))
    reads = root / "chapters" / "a.md"
    reads.write_text('```{code-cell} ipython3\nload_run_metrics("exp")\nshow_verdict("B-AA-01", "confirmed", "r")\n```\n')
    other = root / "chapters" / "b.md"
    other.write_text('```{code-cell} ipython3\nshow_verdict("B-BB-01", "partly", "r")\n```\n')
    return root, reads, other


def test_a_page_is_stale_only_when_a_run_or_claim_it_names_changes(tmp_path):
    root, reads, other = _mini_book(tmp_path)
    before = {p: pipeline.page_inputs_sha(p, root) for p in (reads, other)}
    (root / "runs" / "exp" / "cpu" / "metrics.json").write_text('{"x": 2}')
    assert pipeline.page_inputs_sha(reads, root) != before[reads]
    assert pipeline.page_inputs_sha(other, root) == before[other]
    before = {p: pipeline.page_inputs_sha(p, root) for p in (reads, other)}
    ledger = root / "book" / "claims.yml"
    ledger.write_text(ledger.read_text().replace("status: partly", "status: not confirmed"))
    assert pipeline.page_inputs_sha(reads, root) == before[reads]
    assert pipeline.page_inputs_sha(other, root) != before[other]


RUN_HEADER = """---
jupytext:
  text_representation: {extension: .md, format_name: myst}
kernelspec: {display_name: Python 3, language: python, name: python3}
---

```{code-cell} ipython3
:tags: [parameters]

scale = "cpu"
out_dir = None
inputs_sha = None
"""
RUN_TEMPLATE = RUN_HEADER + """%s
```

```{code-cell} ipython3
import json, pathlib
pathlib.Path(out_dir, "metrics.json").write_text(json.dumps({"inputs_sha": inputs_sha, "workers": %s}))
```
"""


@pytest.mark.parametrize("declares", [True, False])
def test_runs_get_workers_only_when_their_template_takes_it(tmp_path, declares):
    root = tmp_path / "book"
    (root / "runs" / "presets").mkdir(parents=True)
    (root / "_config.yml").write_text("title: t\n")
    (root / "runs" / "w.md").write_text(RUN_TEMPLATE % (("workers = 1", "workers") if declares else ("", "None")))
    (root / "runs" / "presets" / "w.yml").write_text("cpu: {n: 1}\n")
    pipeline.do_runs(root, "cpu", force=True, workers=3)
    written = json.loads((root / "runs" / "w" / "cpu" / "metrics.json").read_text())
    assert written == {"inputs_sha": pipeline.run_inputs_sha("w", "cpu", root), "workers": 3 if declares else None}


def test_makespan_schedules_the_longest_jobs_first():
    assert pipeline.makespan([], 2) == 0.0
    assert pipeline.makespan([2.0, 3.0, 4.0, 3.0], 2) == 6.0           # {4, 2} and {3, 3}
    assert pipeline.makespan([3.0, 3.0, 2.0, 2.0, 2.0], 2) == 7.0      # greedy, as a pool is: not the best split (6)
    assert pipeline.makespan([5.0, 1.0, 1.0], 4) == 5.0               # never below the longest job
    assert pipeline.makespan([1.0, 2.0, 3.0], 1) == 6.0


def test_the_estimate_parallelises_only_what_a_template_runs_in_parallel(tmp_path):
    """``estimate`` counts the recorded jobs of a template with ``workers`` on the cores and the rest of its
    notebook in one process; a template without ``workers`` runs its jobs one after the other; a notebook
    that resumed finished jobs (recorded wall below their schedule) is counted as jobs plus its own time."""
    root = tmp_path / "book"
    (root / "runs" / "presets").mkdir(parents=True)
    (root / "_config.yml").write_text("title: t\n")
    cases = {"par": ("workers = 1\n", 10 * 60.0 + 8 * 60.0, [240.0, 240.0, 240.0, 240.0], 1),
             "ser": ("", 4 * 60.0 + 60.0, [120.0, 120.0], 1),
             "resumed": ("workers = 1\n", 30.0, [600.0, 600.0], 2)}
    for name, (param, wall, jobs, then) in cases.items():
        (root / "runs" / f"{name}.md").write_text(f"# {name}\n\n```{{code-cell}} ipython3\n{param}```\n")
        (root / "runs" / "presets" / f"{name}.yml").write_text("cpu: {seed: 0}\n")
        out = pipeline.run_dir(name, "cpu", root)
        out.mkdir(parents=True)
        (out / "metrics.json").write_text(json.dumps({
            "runs": [{"wall_time_s": t} for t in jobs],
            "provenance": {"wall_time_s": wall, "parameters": {"workers": then}}}))
    rows = {r["run"]: r for r in pipeline.estimate(root, "cpu", workers=2)}
    assert rows["par"]["rest_s"] == 2 * 60.0 and rows["par"]["estimate_s"] == 8 * 60.0 + 2 * 60.0
    assert rows["ser"]["rest_s"] == 60.0 and rows["ser"]["estimate_s"] == 5 * 60.0
    assert rows["resumed"]["rest_s"] == 30.0 and rows["resumed"]["estimate_s"] == 600.0 + 30.0


@pytest.mark.parametrize("argv, message", [
    (["runs", "--scale", "gpt2-124m"], "is not defined for the run"),
    (["status", "--scale", "nosuch"], "no run has the scale 'nosuch'"),
    (["estimate", "--workers", "0"], "must be at least 1"),
    (["runs", "--scale", "cpu", "--workers", "-1"], "must be at least 1"),
])
def test_a_bad_scale_or_worker_count_is_one_sentence_and_exit_2(argv, message, capsys):
    from manifold_muon_book.pipeline import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine with CUDA may run the GPU scale")
def test_the_gpu_scale_is_refused_without_cuda_and_then_asks_for_its_data(capsys):
    from manifold_muon_book.pipeline import main

    with pytest.raises(SystemExit) as e:
        main(["runs", "--scale", "gpu"])
    assert e.value.code == 2 and "has none (no CUDA)" in capsys.readouterr().err
    from manifold_muon_lab.data import prepared_meta

    if prepared_meta("openwebtext") is None:  # with --allow-cpu, the next check: the corpus is not there
        with pytest.raises(SystemExit) as e:
            main(["runs", "--scale", "gpu", "--allow-cpu"])
        assert e.value.code == 2 and "openwebtext" in capsys.readouterr().err


def test_a_scale_whose_checkpoints_do_not_fit_on_the_disk_is_refused_before_any_run(monkeypatch, capsys):
    import shutil

    from manifold_muon_book import cost_model, pipeline

    root = pipeline.repo_root()
    total, largest = cost_model.disk_need(root, "five_assignments", "cpu")
    cfgs = [t.cfg for t in cost_model.trainings(root, "five_assignments", "cpu")]
    # the estimate is 12 bytes a parameter for every training that keeps a checkpoint
    assert total == sum(12 * cost_model._parameters(c.family, tuple(sorted(
        __import__("manifold_muon_lab.config", fromlist=["model_fields"]).model_fields(c, cost_model._vocab(c)).items())))
        for c in cfgs if c.checkpoint_every >= 0) > 0
    pipeline.check_disk(root, "cpu", ["five_assignments"], free=total + largest + pipeline.DISK_MARGIN)  # just fits
    with pytest.raises(ValueError, match=r"needs about .* GiB of disk for its checkpoints \(five_assignments"):
        pipeline.check_disk(root, "cpu", ["five_assignments"], free=total)
    pipeline.check_disk(root, "smoke", ["five_assignments"], free=0)  # scratch scales are not checked
    usage = shutil.disk_usage(root / "runs")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=1 << 20))
    with pytest.raises(SystemExit) as e:  # the command line: one sentence, exit 2, nothing executed
        pipeline.main(["runs", "--scale", "cpu", "--only", "five_assignments", "--force"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "free some space, or run part of it with --only" in err and "Traceback" not in err
    assert "executing" not in err


def test_the_estimate_of_a_scale_without_records_says_so(capsys):
    from manifold_muon_book.pipeline import main

    main(["estimate", "--scale", "qwen3-120m"])
    out = capsys.readouterr().out
    assert "nan" not in out and ("no recorded times" in out or "nothing to estimate" in out)


def test_a_notebook_s_output_is_forwarded_and_the_kernel_uses_local_sockets(tmp_path, capfd):
    import nbformat

    from manifold_muon_book.pipeline import _execute

    (tmp_path / "_config.yml").write_text("title: t\n")
    (tmp_path / "runs").mkdir()
    nb = nbformat.v4.new_notebook()
    pid_file = tmp_path / "kernel.pid"
    nb.cells = [nbformat.v4.new_code_cell("import os, sys, torch\nprint('[train] step 1/2')\nprint('[train] step 2/2', file=sys.stderr)\n"
                                          f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))")]
    nbformat.write(nb, tmp_path / "runs" / "t.ipynb")
    _execute(tmp_path / "runs" / "t.ipynb", tmp_path / "runs" / "out.ipynb", tmp_path / "runs", None)
    err = capfd.readouterr().err
    assert "[train] step 1/2" in err and "[train] step 2/2" in err
    assert "without encryption" not in err and "Executing Cell" not in err
    # the page's kernel is shut down when it has run (it used to linger until the pipeline exited)
    import os
    import time

    pid, deadline = int(pid_file.read_text()), time.time() + 10
    def alive():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return not open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z"  # a zombie is gone
    while alive() and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(), "the kernel outlived its page"
    # shut down by request, not by an interrupt (which, with torch imported as every page does, printed
    # "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel" after every page)
    assert "KeyboardInterrupt" not in err + capfd.readouterr().err


def test_runs_share_no_gpu_unless_told(monkeypatch):
    """On a GPU box the default is one training run at a time (they would all land on the first GPU); on a CPU
    machine one per core."""
    import os

    import torch

    from manifold_muon_book.pipeline import default_workers

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_workers() == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_workers() == (os.cpu_count() or 1)


def test_make_reproduce_prints_its_plan_and_survives_a_failing_estimate(monkeypatch, capsys):
    """Before the first run: each run with its estimated time and where that number comes from, and the total;
    an estimate that cannot be made is said, and the runs still go."""
    from manifold_muon_book import pipeline

    rows = [dict(run="a", estimate_s=120.0, source="recorded"), dict(run="b", estimate_s=float("nan"), source="no model")]
    monkeypatch.setattr(pipeline, "estimate", lambda root, scale, workers: rows)
    secs = pipeline._plan(ROOT, "cpu", ["a", "b"], 2)
    out = capsys.readouterr().out
    assert "a" in out and "about 2 min (recorded)" in out and "(no model)" in out and "1 run(s) without an estimate" in out
    assert secs["a"] == 120.0 and secs["b"] != secs["b"]

    def broken(root, scale, workers):
        raise KeyError("x")
    monkeypatch.setattr(pipeline, "estimate", broken)
    assert pipeline._plan(ROOT, "cpu", ["a"], 1) == {}
    assert "no estimate: KeyError" in capsys.readouterr().out


RESUMING_TEMPLATE = RUN_HEADER + """```

```{code-cell} ipython3
import json, pathlib
part = pathlib.Path(out_dir, "part.json")
kept = part.exists()                          # a finished part is kept, as dual_ascent_scaling's sizes are
if not kept:
    part.write_text("{}")
if pathlib.Path(out_dir).parent.joinpath("fail").exists():
    raise RuntimeError("told to fail")
pathlib.Path(out_dir, "metrics.json").write_text(json.dumps({"inputs_sha": inputs_sha, "kept_part": kept}))
```
"""


def test_a_forced_run_starts_from_nothing_and_a_failed_one_gives_back_what_was_there(tmp_path):
    """``make reproduce`` (``--force``) must not re-read the finished parts of the run it re-executes (committed parts
    would make it reproduce nothing); if the new execution fails, the finished run it replaced is back, whole."""
    root = tmp_path / "book"
    (root / "runs" / "presets").mkdir(parents=True)
    (root / "_config.yml").write_text("title: t\n")
    (root / "runs" / "r.md").write_text(RESUMING_TEMPLATE)
    (root / "runs" / "presets" / "r.yml").write_text("cpu: {n: 1}\n")
    out = root / "runs" / "r" / "cpu"
    pipeline.do_runs(root, "cpu", force=False, workers=1)
    assert json.loads((out / "metrics.json").read_text())["kept_part"] is False
    pipeline.do_runs(root, "cpu", force=True, workers=1)        # a re-execution: the part is made again
    assert json.loads((out / "metrics.json").read_text())["kept_part"] is False
    assert not (root / "runs" / "r" / "cpu.previous").exists()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (root / "runs" / "r" / "fail").write_text("")
    with pytest.raises(Exception):
        pipeline.do_runs(root, "cpu", force=True, workers=1)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the finished run, as it was
    assert not (root / "runs" / "r" / "cpu.previous").exists()
