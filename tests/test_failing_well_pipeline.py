"""A stopped ``pipeline chapters`` leaves no files behind: a real process, a real kernel, a real signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SLOW_PAGE = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# A page that takes its time

```{code-cell} ipython3
import os, time
open(os.environ["PIPELINE_TEST_MARKER"], "w").write(str(os.getpid()))
time.sleep(300)
```
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_pipeline_leaves_no_files_and_no_kernel(tmp_path, sig):
    root = tmp_path / "book"
    (root / "chapters").mkdir(parents=True)
    (root / "runs").mkdir()
    (root / "_config.yml").write_text("title: t\n")
    (root / "chapters" / "slow.md").write_text(SLOW_PAGE)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    marker = tmp_path / "kernel.pid"  # written by the page once its kernel runs the cell
    proc = subprocess.Popen([sys.executable, "-m", "manifold_muon_book.pipeline", "chapters"], cwd=root,
                            env={**os.environ, "PIPELINE_TEST_MARKER": str(marker)}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while not marker.exists() or not marker.read_text():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "the kernel never started the cell"
        time.sleep(0.2)
    assert (root / "chapters" / ".slow.src.ipynb").exists()  # the hidden working notebook this test is about
    os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)  # Ctrl-C reaches the group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert f"stopped by {sig.name}" in err
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing left, nothing made
    kernel = int(marker.read_text())
    deadline = time.time() + 30
    while _alive(kernel) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(kernel), "the kernel outlived the pipeline"


@pytest.mark.parametrize("argv, expected", [
    (["runs", "--scale", "laptop"], "scale 'laptop' is not defined for the run(s) "),
    (["runs", "--only", "nope"], "no run 'nope'; runs are "),
    (["chapters", "--only", "chapters/99_none.md"], "not a book page: chapters/99_none.md; pages are chapters/01"),
], ids=["scale", "run", "page"])
def test_a_bad_pipeline_argument_is_one_sentence_and_exit_code_2(argv, expected, capsys):
    from manifold_muon_book import pipeline

    with pytest.raises(SystemExit) as e:
        pipeline.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


HANGING = """
import signal, subprocess, sys, time
from pathlib import Path
from manifold_muon_book import pipeline
pipeline.STOP_GRACE_S = 1.0
work = Path(sys.argv[1])
work.write_text("half-written")
pipeline._WORKING.add(work)
child = subprocess.Popen(["sleep", "300"])
Path(sys.argv[2]).write_text(str(child.pid))
signal.signal(signal.SIGINT, pipeline._stop)
while True:  # an unwinding that swallows the interrupt and never ends: what the watchdog is for
    try:
        time.sleep(100)
    except KeyboardInterrupt:
        pass
"""


def test_the_watchdog_ends_a_stop_that_hangs(tmp_path):
    """If the orderly unwinding after Ctrl-C hangs, the watchdog removes the working file, kills the child
    process (a kernel, here `sleep`) and exits with 130, STOP_GRACE_S after the signal."""
    work, marker = tmp_path / ".page.src.ipynb", tmp_path / "child.pid"
    proc = subprocess.Popen([sys.executable, "-c", HANGING, str(work), str(marker)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not marker.exists() or not marker.read_text():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err[-3000:]
    assert "did not shut down within 1 s and was killed" in err
    assert not work.exists()
    child = int(marker.read_text())
    deadline = time.time() + 10
    while _alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the child outlived the pipeline"
