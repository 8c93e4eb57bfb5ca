"""The browser test has teeth: small pages with one defect each fail it, a clean page passes.

These open hand-written pages in headless Chromium (``make browser`` installs Debian's package; without it
the tests that need a browser are skipped, and ``make test`` installs it first). The whole book is checked
by ``make test-browser``; the static checks and the GitHub workflow are checked here too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from manifold_muon_book.browser_check import check_book, static_problems

ROOT = Path(__file__).resolve().parents[1]
MATHJAX = ROOT / "book" / "_static" / "mathjax" / "tex-svg-full.js"
needs_browser = pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium: run `make browser`")
needs_mathjax = pytest.mark.skipif(not MATHJAX.exists(), reason="no MathJax in book/_static: run `make install`")

PNG_1x1 = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                        "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201ff2dd0b8b40000000049454e44ae426082")


def _page(body: str, head: str = "") -> str:
    return f"<!doctype html><html><head><meta charset='utf-8'>{head}</head><body><main>{body}</main></body></html>"


def _book(tmp_path: Path, pages: dict[str, str]) -> Path:
    root = tmp_path / "html"
    (root / "_static").mkdir(parents=True)
    (root / "_static" / "dot.png").write_bytes(PNG_1x1)
    if MATHJAX.exists():
        shutil.copy(MATHJAX, root / "_static" / "tex-svg-full.js")
    for name, html in pages.items():
        (root / name).write_text(html)
    return root


def _problems(tmp_path, pages):
    reports = check_book(_book(tmp_path, pages), tmp_path / "out", screenshots={})
    return {r.page: r.problems for r in reports}


MATH_HEAD = ("<script>window.MathJax = {options: {processHtmlClass: 'math'}};</script>"
             "<script defer src='_static/tex-svg-full.js'></script>")


@needs_browser
@needs_mathjax
def test_a_clean_page_passes_and_each_defect_fails(tmp_path):
    good = _page("<p>Inline <span class='math'>\\(\\|J\\|_F \\le 1/2\\)</span> and "
                 "<span class='pasted-text'>0.250</span>.</p><img src='_static/dot.png'>"
                 "<table><tr><td style='padding: 0 8px'>1</td><td style='padding: 0 8px'>2</td></tr></table>"
                 # a table wider than the column is fine where it scrolls inside a wrapper within the column
                 "<div style='width: 300px; overflow-x: auto'><table style='width: 600px'><tr>"
                 "<td style='padding: 0 8px'>0.019</td><td style='padding: 0 8px'>1.931</td></tr></table></div>"
                 "<p><a href='index.html#here' id='here'>a link</a></p><pre>code with \\( and $$ is fine</pre>",
                 MATH_HEAD)
    problems = _problems(tmp_path, {
        "index.html": good,
        "raw_tex.html": _page("<p>Left as TeX: \\[ \\|J\\|_F \\]</p>"),
        "bad_tex.html": _page("<p><span class='math'>\\(\\frac{1}\\)</span></p>", MATH_HEAD),
        "image.html": _page("<img src='_static/missing.png'>"),
        "console.html": _page("<script>console.error('boom')</script>"),
        "exception.html": _page("<script>undefinedFunction()</script>"),
        "remote.html": _page("", "<script src='https://cdn.example.invalid/x.js'></script>"),
        "glue.html": _page("<p>n = <span class='pasted-text'></span> and {glue:text}`x`</p>"),
        "xref.html": _page("<p>See <span class='xref std std-ref'>ch-missing</span> and Fig. ??.</p>"),
        "anchor.html": _page("<p><a href='index.html#nowhere'>dead</a> <a href='gone.html'>gone</a></p>"),
        "table.html": _page("<table style='border-spacing: 0'><tr><td style='padding: 0'>2.100e-01</td>"
                            "<td style='padding: 0'>2.48</td></tr></table>"),
        # the first cells are spaced, the numbers of the next row run together: "0.0191.9311.967"
        "cramped_row.html": _page("<table style='border-collapse: collapse'>"
                                  "<tr><th style='padding: 0 8px'>std</th><th style='padding: 0 8px'>min</th></tr>"
                                  "<tr><td style='padding: 0 8px 0 0'>0.019</td><td style='padding: 0'>1.931</td>"
                                  "<td style='padding: 0'>1.967</td></tr></table>"),
        "wide.html": _page("<table style='width: 700px'><tr><td style='padding: 0 8px'>1</td>"
                           "<td style='padding: 0 8px'>2</td></tr></table>").replace("<main>",
                                                                                    "<main style='width: 400px'>"),
        "claims_scroll.html": _page("<div style='width: 400px; overflow-x: auto'><table class='claims-table' "
                                    "style='width: 700px'><tr><td style='padding: 0 8px'>B-XX-01</td></tr></table>"
                                    "</div>"),
        "formula.html": _page("<table style='table-layout: fixed; width: 200px'><tr><td style='width: 60px'>"
                              "<span class='math'>\\(a + b + c + d + e + f + g + h + i + j\\)</span></td><td>x</td>"
                              "</tr></table>", MATH_HEAD),
    })
    assert problems["index.html"] == []
    expected = {
        "raw_tex.html": "raw TeX", "bad_tex.html": "TeX error", "image.html": "image not loaded",
        "console.html": "console error: boom", "exception.html": "uncaught exception",
        "remote.html": "https://cdn.example.invalid/x.js", "glue.html": "glued value missing",
        "xref.html": "broken cross-reference", "anchor.html": "missing anchor",
        "table.html": "without space between columns", "cramped_row.html": "'1.931' | '1.967'",
        "wide.html": "past the text column", "claims_scroll.html": "must fit without scrolling sideways",
        "formula.html": "a formula",
    }
    for page, text in expected.items():
        assert any(text in p for p in problems[page]), (page, problems[page])
    assert any("'??'" in p for p in problems["xref.html"])
    assert any("missing file" in p for p in problems["anchor.html"])
    assert any("another host" in p for p in problems["remote.html"])  # the static check sees it too


@needs_browser
def test_a_script_that_fetches_from_another_host_is_refused_and_reported(tmp_path):
    page = _page("<img src='https://example.invalid/a.png'>"
                 "<script>fetch('http://example.invalid/data.json').catch(() => {});</script>")
    problems = _problems(tmp_path, {"index.html": page})["index.html"]
    assert any("example.invalid/data.json" in p for p in problems)
    assert any("example.invalid/a.png" in p for p in problems)


def test_static_check_finds_remote_assets_and_dead_links(tmp_path):
    root = _book(tmp_path, {
        "index.html": _page("<p id='top'><a href='#top'>self</a> <a href='other.html#x'>other</a> "
                            "<a href='https://example.org/'>outside links are fine</a></p>"),
        "other.html": _page("<p id='y'></p>", "<link rel='stylesheet' href='http://example.org/a.css'>"),
    })
    problems = static_problems(root)
    assert problems["index.html"] == ["link to a missing anchor: other.html#x"]
    assert problems["other.html"] == ["loads an asset from another host: <link> http://example.org/a.css"]


def test_the_built_book_loads_nothing_from_another_host():
    """On the built book (when there is one): no <script src="http..."> or <link href="http...">."""
    html = ROOT / "_build" / "html"
    if not (html / "index.html").exists():
        pytest.skip("no built book: run `make html`")
    remote = {page: [p for p in found if "another host" in p] for page, found in static_problems(html).items()}
    assert not {page: found for page, found in remote.items() if found}


def test_the_github_workflow_is_valid_and_builds_with_the_pinned_install():
    workflow = ROOT / ".github" / "workflows" / "book.yml"
    checker = Path(sys.executable).with_name("check-jsonschema")
    if not checker.exists():
        pytest.skip("check-jsonschema is not installed: run `make install`")
    done = subprocess.run([str(checker), "--builtin-schema", "vendor.github-workflows", str(workflow)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    text = workflow.read_text()
    assert "make html" in text and "upload-pages-artifact" in text and "deploy-pages" in text
    assert "branches: [main]" in text
