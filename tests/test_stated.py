"""Numbers as the book states them (manifold_muon.stated) and the checks that keep the pages portable.

The page checks read the committed notebooks: every glued number is stored at the precision its
sentence shows, the prose uses the format the number was glued with, and no output carries a float
with more significant digits than a reader could use (those are what differ between CPUs).
The last test shows that nbval, with these settings, still fails on a real change.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from manifold_muon_book.stated import above_rounding, magnitude, stated, stated_table

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "chapters").glob("*.md")) + [ROOT / "book" / "claims.md"]
GLUE_PREFIX = "application/papermill.record/"
ROLE = re.compile(r"\{glue(?::text)?\}`([^`:]+)(?::([^`]+))?`")
FLOAT = re.compile(r"(?<![\w.])[-+]?(\d+\.\d+|\d+(?=[eE]))([eE][-+]?\d+)?(?![\w.])")
MAX_DIGITS = 8  # more significant digits than this in an output are rounding noise, not a result


# ----------------------------------------------------------------------------- the helpers


def test_stated_rounds_to_what_the_format_shows():
    assert stated(0.31849, ".3f") == 0.318
    assert repr(stated(0.14324464978553286, ".3f")) == "0.143"
    assert stated(6.6213e-3, ".2e") == 0.00662
    assert stated(0.1234, ".1%") == 0.123
    assert stated(12, "d") == 12 and isinstance(stated(12, "d"), int)
    assert math.isnan(stated(float("nan"), ".3f"))


@pytest.mark.parametrize("bad", ["", ".3s", ".3", None])
def test_stated_refuses_a_format_that_is_not_a_number_format(bad):
    with pytest.raises(ValueError, match="format spec"):
        stated(1.0, bad)


def test_stated_refuses_what_is_not_a_number():
    with pytest.raises(TypeError):
        stated("0.3", ".3f")
    with pytest.raises(ValueError, match="integers"):
        stated(0.5, "d")


def test_magnitude_is_the_power_of_ten_below():
    assert magnitude(6.6e-3) == 1e-3
    assert magnitude(-6.6e-3) == -1e-3
    assert magnitude(1.0) == 1.0
    assert magnitude(0.0) == 0.0


def test_stated_table_formats_each_column_and_keeps_integers():
    df = pd.DataFrame({"n": [8, 1024], "err": [0.0123456789, 1.5], "tiny": [3.2e-15, 7.7e-16], "name": ["a", "b"]})
    out = stated_table(df, {"err": ".3f", "tiny": "magnitude"})
    assert out.to_dict("list") == {"n": ["8", "1024"], "err": ["0.012", "1.500"], "tiny": ["1e-15", "1e-16"],
                                   "name": ["a", "b"]}
    with pytest.raises(KeyError, match="columns"):
        stated_table(df, {"missing": ".3f"})
    shown = stated_table(df, {"tiny": above_rounding(1e-12), "err": above_rounding(0.1, ".2f")})
    assert shown["tiny"].tolist() == ["< 1e-12", "< 1e-12"] and shown["err"].tolist() == ["< 1e-1", "1.50"]


# ----------------------------------------------------------------------------- the pages


def _notebook(md: Path) -> dict:
    ipynb = md.with_suffix(".ipynb")
    if not ipynb.exists():
        pytest.skip(f"{ipynb.name} is not executed yet")
    return json.loads(ipynb.read_text())


def _glued(nb: dict) -> dict:
    """name -> (text/plain, stated format or None) of every glued record."""
    out = {}
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            meta = o.get("metadata", {})
            name = meta.get("scrapbook", {}).get("name")
            if name is not None and meta["scrapbook"].get("mime_prefix") == GLUE_PREFIX:
                out[name] = (o["data"].get(GLUE_PREFIX + "text/plain"), meta.get("stated_fmt"))
    return out


def _significant_digits(token: str) -> int:
    """Digits a float repr carries: 0.14324464978553286 -> 17, 35200000000000.0 -> 3, 1.5e-07 -> 2."""
    mantissa = re.split(r"[eE]", token.lstrip("+-"))[0]
    return len(mantissa.replace(".", "").strip("0"))


def _long_floats(text: str) -> list[str]:
    return [m.group(0) for m in FLOAT.finditer(text) if _significant_digits(m.group(0)) > MAX_DIGITS]


@pytest.mark.parametrize("md", PAGES, ids=lambda p: p.name)
def test_prose_shows_each_number_with_the_format_it_was_glued_with(md):
    glued = _glued(_notebook(md))
    for name, spec in ROLE.findall(md.read_text()):
        assert name in glued, f"{md.name}: the prose pastes {name!r}, which no cell glues"
        _, fmt = glued[name]
        if fmt is not None and spec:
            assert spec == fmt, (f"{md.name}: {name!r} is glued with format {fmt!r} but the prose shows it with "
                                 f"{spec!r}; use the same format in both places")


@pytest.mark.parametrize("md", PAGES, ids=lambda p: p.name)
def test_no_glued_number_is_stored_as_a_long_float(md):
    for name, (text, fmt) in _glued(_notebook(md)).items():
        if text is None:
            continue
        long = _long_floats(text)
        assert not long, (f"{md.name}: {name!r} is glued as {text}; glue numbers with "
                          "manifold_muon_book.stated.glue_value(name, x, fmt) at the precision the prose uses")


@pytest.mark.parametrize("md", PAGES, ids=lambda p: p.name)
def test_no_output_shows_a_long_float(md):
    for i, cell in enumerate(_notebook(md)["cells"]):
        for o in cell.get("outputs", []):
            texts = [o.get("text", "")] + [v for k, v in (o.get("data") or {}).items()
                                            if k.endswith(("text/plain", "text/html", "text/markdown"))]
            for text in texts:
                text = "".join(text) if isinstance(text, list) else text
                long = _long_floats(text)
                assert not long, (f"{md.name}, cell {i}: an output shows {long[:3]}; show tables with "
                                  "manifold_muon_book.stated.stated_table and numbers at the precision the text claims")


# ----------------------------------------------------------------------------- teeth


def _nbval(notebook: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", str(notebook), "-p", "manifold_muon_book.nbval_figures",
         "--nbval-sanitize-with", str(ROOT / "chapters" / "nbval_sanitize.cfg"), "-p", "no:cacheprovider", "-q"],
        cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})


def _page_copy(tmp_path: Path, runs_copied: bool) -> Path:
    """A folder that chapter 01 runs in as in the repository: chapters/, book/ (the claims ledger), runs/."""
    (tmp_path / "chapters").mkdir()
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    os.symlink(ROOT / "book", tmp_path / "book")
    if runs_copied:
        shutil.copytree(ROOT / "runs" / "msign_accuracy", tmp_path / "runs" / "msign_accuracy")
        for f in ("msign_accuracy.md", "presets/msign_accuracy.yml"):
            (tmp_path / "runs" / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / "runs" / f, tmp_path / "runs" / f)
    else:
        os.symlink(ROOT / "runs", tmp_path / "runs")
    return tmp_path / "chapters"


def _tamper_glue(nb: dict, name: str, fmt: str, delta: float) -> str:
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            if o.get("metadata", {}).get("scrapbook", {}).get("name") == name:
                old = o["data"][GLUE_PREFIX + "text/plain"]
                o["data"][GLUE_PREFIX + "text/plain"] = format(float(old) + delta, fmt)
                return old
    raise AssertionError(f"chapter 01 no longer glues {name!r}; pick another glued value for this test")


@pytest.mark.slow
def test_nbval_passes_the_stored_chapter_and_fails_a_glued_value_changed_at_its_precision(tmp_path):
    """Chapter 01 glues the Newton-Schulz band half-width as 0.318 (format .3f): the stored notebook passes
    nbval, a copy whose stored value reads 0.319 fails it."""
    src = ROOT / "chapters" / "01_muon_msign.ipynb"
    chapters = _page_copy(tmp_path, runs_copied=False)
    shutil.copy(src, chapters / "untouched.ipynb")
    nb = json.loads(src.read_text())
    old = _tamper_glue(nb, "ns_eps", ".3f", 0.001)
    (chapters / "tampered.ipynb").write_text(json.dumps(nb))
    ok = _nbval(chapters / "untouched.ipynb", chapters)
    assert ok.returncode == 0, ok.stdout[-3000:]
    bad = _nbval(chapters / "tampered.ipynb", chapters)
    assert bad.returncode != 0 and old in bad.stdout, bad.stdout[-3000:]


@pytest.mark.slow
def test_nbval_fails_when_a_committed_metric_the_chapter_reads_changes(tmp_path):
    """Chapter 01 reads its timing ratios from runs/msign_accuracy/cpu/metrics.json; change the one it
    quotes (768x3072, Newton-Schulz, float32) in a copy by more than its stated precision and nbval fails."""
    chapters = _page_copy(tmp_path, runs_copied=True)
    shutil.copy(ROOT / "chapters" / "01_muon_msign.ipynb", chapters / "01.ipynb")
    path = tmp_path / "runs" / "msign_accuracy" / "cpu" / "metrics.json"
    metrics = json.loads(path.read_text())
    row = next(r for r in metrics["timing"] if (r["m"], r["n"], r["method"], r["dtype"])
               == (768, 3072, "newton_schulz", "float32"))
    row["ratio_to_svd"] += 0.05
    path.write_text(json.dumps(metrics))
    bad = _nbval(chapters / "01.ipynb", chapters)
    assert bad.returncode != 0 and "ns_ratio_768x3072" in bad.stdout, bad.stdout[-3000:]
