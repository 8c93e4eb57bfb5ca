"""How verdicts, claims, captioned tables and the claims page render (manifold_muon_book.verdicts, tables,
claims_page): prose is shown as written, markup (math, code, roles) passes through, the ledger decides."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin

from manifold_muon_book.claims import STATUSES, load_ledger
from manifold_muon_book.claims_page import claims_table_html, notebook_links, status_by_source, verdict_anchors
from manifold_muon_book.tables import table_markdown
from manifold_muon_book.verdicts import escape_prose, verdict_anchor, verdict_markdown

ROOT = Path(__file__).resolve().parents[1]


def _render(text: str) -> str:
    return MarkdownIt("commonmark").use(dollarmath_plugin).render(text)


@pytest.mark.parametrize("prose", [
    "||J||_F -> 1/2 while z_(1) - z_(2) > 0",
    "a * b * c and __init__ and <script>x</script>",
    "[not a link](http://x) # not a heading",
    "100% of 5,000 cases: {x} ~ y^2 | z",
])
def test_prose_is_shown_as_written(prose):
    html = _render(escape_prose(prose))
    text = re.sub(r"<[^>]+>", "", html).strip()
    unescaped = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").replace("&quot;", '"')
    assert unescaped == prose
    assert "<em>" not in html and "<strong>" not in html and "<a " not in html and "<h1>" not in html


def test_math_code_and_roles_pass_through():
    md = escape_prose(r"holds on {glue:text}`n_random:d` cases, $\|J\|_F \le 1/2$, see `make html`; a_b")
    assert r"{glue:text}`n_random:d`" in md and r"$\|J\|_F \le 1/2$" in md and "`make html`" in md
    assert md.endswith(r"a\_b")


def test_verdict_admonition_names_status_and_anchor():
    md = verdict_markdown("B-SJ-06", "refuted", "False: z_(1)")
    assert md.startswith(":::{admonition} Verdict on B-SJ-06: refuted\n")
    assert ":name: verdict-b-sj-06" in md and "verdict-refuted" in md and r"z\_\(1\)" in md
    assert verdict_anchor("P-FSO-03") == "verdict-p-fso-03"


def test_table_markdown_is_a_numbered_list_table_at_stated_precision():
    df = pd.DataFrame({r"$\|J\|_F$": [0.123456, 2.0], "name": ["a_b", "-x|y"]})
    md = table_markdown(df, "Caption with $x$.", "tab-test", {r"$\|J\|_F$": ".3f"})
    assert md.splitlines()[:3] == [":::{list-table} Caption with $x$.", ":header-rows: 1", ":name: tab-test"]
    assert r"* - $\|J\|_F$" in md and r"* - 0\.123" in md and r"  - a\_b" in md and r"  - \-x\|y" in md
    with pytest.raises(ValueError, match="label"):
        table_markdown(df, "c", "has space")


def test_status_counts_per_source_add_up():
    ledger = load_ledger(ROOT / "book" / "claims.yml")
    table = status_by_source(ledger)
    assert list(table.index) == list(STATUSES) + ["all claims"]
    assert table.loc["all claims", "all"] == len(ledger["claims"])
    for kind in (s["kind"] for s in ledger["sources"].values()):
        assert table.loc["all claims", kind] == table.loc[list(STATUSES), kind].sum()


def test_claims_table_names_titles_and_links_to_existing_verdicts():
    ledger = load_ledger(ROOT / "book" / "claims.yml")
    html = claims_table_html(ledger, notebook_links(ROOT))
    assert html.count("<tr data-source=") == len(ledger["claims"])
    for source in ledger["sources"].values():
        assert f'data-source="{source["title"]}"' in html or source["title"].replace("&", "&amp;") in html
    assert ".md" not in re.sub(r"<details>.*?</details>", "", html)   # chapters by title, not by file name
    for href in re.findall(r'href="([^"]+)"', html):
        page, _, anchor = href.partition("#")
        chapter = page.removeprefix("../").removesuffix(".html") + ".md"
        assert (ROOT / chapter).exists(), href
        if anchor:
            assert anchor in verdict_anchors(ROOT, chapter)


def test_every_run_preset_file_has_the_scales_the_readme_names():
    """`make test` runs `smoke`, the book shows `cpu`, and `make reproduce SCALE=gpu` runs `gpu` on a GPU box."""
    for path in sorted((ROOT / "runs" / "presets").glob("*.yml")):
        scales = set(yaml.safe_load(path.read_text()))
        missing = {"smoke", "cpu", "gpu"} - scales
        assert not missing, f"{path.relative_to(ROOT)} has no scale(s) {sorted(missing)}"


def test_a_registered_criterion_decides_the_verdict_and_is_printed(monkeypatch):
    import manifold_muon_book.verdicts as v

    crit = {"statistic": "d, the mean difference.", "scale": "cpu", "seeds": 3,
            "decide": [["confirmed at small scale", "d <= 0.1"], ["partly", "True"]]}
    history = [{"date": "2026-12-02", "old": "d <= 0.2", "new": "d <= 0.1", "why": "a reason"}]
    claim = {"id": "B-XX-01", "status": "partly", "criterion": crit, "criterion_history": history}
    monkeypatch.setattr(v, "claim", lambda cid: claim)
    shown = []
    monkeypatch.setattr(v, "_markdown", shown.append)
    v.show_verdict("B-XX-01", evidence={"d": 0.5}, reason="Measured.", study="3 seeds; it detects 0.1.")
    assert "Verdict on B-XX-01: partly" in shown[0] and "**Criterion**" in shown[0] and "**Criterion changed**" in shown[0]
    assert "**Study:** 3 seeds" in shown[0]  # the study and the criterion are both shown
    with pytest.raises(AssertionError, match="pre-registered criterion gives 'partly'"):
        v.show_verdict("B-XX-01", "confirmed at small scale", "Measured.", evidence={"d": 0.5})
    with pytest.raises(ValueError, match="pass evidence"):
        v.show_verdict("B-XX-01", "partly", "Measured.")
    with pytest.raises(AssertionError, match="book/claims.yml says 'partly'"):
        v.show_verdict("B-XX-01", evidence={"d": 0.05}, reason="Measured.")  # the criterion says confirmed


def test_a_claim_that_asks_for_its_study_is_refused_without_it_and_shows_it(monkeypatch):
    import manifold_muon_book.verdicts as v
    from manifold_muon_book.power import study_text

    claim = {"id": "B-XX-02", "status": "partly", "study": "required"}
    monkeypatch.setattr(v, "claim", lambda cid: claim)
    shown = []
    monkeypatch.setattr(v, "_markdown", shown.append)
    with pytest.raises(ValueError, match="asks for its study"):
        v.show_verdict("B-XX-02", "partly", "Measured.")
    text = study_text(3, "cpu preset, 300 steps", "xx", ".3f", "final validation loss", "paired t-test, 5%, power 80%",
                      "nats")
    v.show_verdict("B-XX-02", "partly", "Measured.", study=text)
    assert "**Study:** 3 seeds" in shown[0]
    assert "{glue:text}`xx_spread:.3f`" in shown[0] and "{glue:text}`xx_mde:.3f`" in shown[0]  # roles pass through


def test_every_claim_the_ledger_marks_study_required_states_its_study_in_its_chapter():
    """The executed chapter holds, for each such claim, a verdict with a Study line naming the detectable effect."""
    import json

    ledger = load_ledger(ROOT / "book" / "claims.yml")
    for c in ledger["claims"]:
        if c.get("study") != "required":
            continue
        nb = json.loads((ROOT / c["chapter"]).with_suffix(".ipynb").read_text())
        shown = [o.get("data", {}).get("text/markdown", "") for cell in nb["cells"] for o in cell.get("outputs", [])]
        shown = ["".join(t) if isinstance(t, list) else t for t in shown]
        verdict = [t for t in shown if f"Verdict on {c['id']}:" in t]
        assert verdict, f"{c['id']}: no verdict in the executed {c['chapter']}"
        assert "**Study:**" in verdict[0] and "detect" in verdict[0], f"{c['id']}: its verdict states no study"


# ---------------------------------------------------------------- claims quoted in TeX

from manifold_muon_book.claims_page import _has_math, claim_html, claims_table, formula_pieces  # noqa: E402
from manifold_muon_book.verdicts import claim_markdown  # noqa: E402

TEX_CLAIM = {"id": "B-XX-01", "section": "Gram_space (2)",
             "claim": "Stiefel forces ||W||_2 = 1 for W in R^{m x n}.",
             "tex": r"Stiefel forces $\|W\|_2 = 1$ for $W \in \mathbb{R}^{m \times n}$."}


def test_a_claim_box_quotes_the_tex_version_with_its_math_typeset():
    md = claim_markdown(TEX_CLAIM, "blog post")
    assert r"$\|W\|_2 = 1$" in md and r"$W \in \mathbb{R}^{m \times n}$" in md and "||W||" not in md
    assert r"*Gram\_space \(2\)*" in md  # the section is still prose
    html = _render(md)
    assert html.count('class="math inline"') == 2 and "<blockquote>" in html
    plain = claim_markdown({k: v for k, v in TEX_CLAIM.items() if k != "tex"}, "blog post")
    assert r"\|\|W\|\|\_2" in plain and "$" not in plain  # no tex: the plain sentence, shown as written


def test_the_claims_table_gives_mathjax_the_tex_version():
    html = claim_html(TEX_CLAIM)
    assert html == ('Stiefel forces <span class="math notranslate nohighlight">\\(\\|W\\|_2 = 1\\)</span> for '
                    '<span class="claims-nowrap"><span class="math notranslate nohighlight">'
                    '\\(W \\in \\mathbb{R}^{m \\times n}\\)</span>.</span>')
    assert claim_html({"claim": "a < b & ||W||_2"}) == "a &lt; b &amp; ||W||_2"
    ledger = load_ledger(ROOT / "book" / "claims.yml")
    table = claims_table_html(ledger, notebook_links(ROOT))
    cells = re.findall(r'<td class="claims-text">(.*?)(?:<details>|</td>)', table)
    assert len(cells) == len(ledger["claims"])
    with_tex = [c for c in ledger["claims"] if c.get("tex")]
    assert table.count('<span class="math notranslate nohighlight">\\(') >= sum(c["tex"].count("$") // 2
                                                                              for c in with_tex)
    assert not any("$" in cell for cell in cells)  # every formula became a math span
    assert '<div class="claims-table-wrapper"><table class="claims-table"' in table


def test_a_long_formula_is_cut_only_before_its_outer_relations():
    tex = r"\max(\|E V_0\|_2, \|E^\top U_0\|_2) / \Delta \le \|E\|_2 / \Delta \le \min_{i \le r} \sigma_i(x = y)"
    pieces = formula_pieces(tex)
    assert pieces == [r"\max(\|E V_0\|_2, \|E^\top U_0\|_2) / \Delta", r"\le \|E\|_2 / \Delta",
                      r"\le \min_{i \le r} \sigma_i(x = y)"]
    assert formula_pieces(r"\Delta = \min_{i \le r,\, j > r} |\sigma_i(A) - \sigma_j(\tilde A)| > 0") == [
        r"\Delta = \min_{i \le r,\, j > r} |\sigma_i(A) - \sigma_j(\tilde A)| > 0"]  # no lone "\Delta", "> 0"
    assert formula_pieces(r"\|W\|_2 = 1") == [r"\|W\|_2 = 1"]  # short: whole


def test_the_claims_page_is_marked_as_holding_math_so_that_mathjax_loads():
    from types import SimpleNamespace

    from docutils.utils import new_document

    data = {"has_equations": {}}
    app = SimpleNamespace(env=SimpleNamespace(docname="book/claims",
                                              get_domain=lambda name: SimpleNamespace(data=data)))
    doctree = new_document("claims")
    _has_math(app, doctree)
    assert data["has_equations"] == {}
    doctree += claims_table()
    _has_math(app, doctree)
    assert data["has_equations"] == {"book/claims": True}
