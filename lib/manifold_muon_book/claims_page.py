r"""The claims page (``book/claims.md``): the ledger as a reader uses it.

    ledger = load_ledger(root / "book" / "claims.yml")
    status_by_source(ledger)          # a DataFrame: claims per status (rows) and source (columns), with totals

    ```{claims-table}
    ```                               # in book/claims.md: every claim, filterable, linked to its evidence

The table of every claim is made when the book is built, not when the page is executed, so it always
shows the chapters as they are (this module is also a Sphinx extension, listed in ``_config.yml``, that
provides the ``claims-table`` directive). Each claim links to the verdict that holds its evidence: the
admonition ``show_verdict`` writes, whose label is ``verdict-<id>`` (``verdicts.verdict_anchor``). The link
goes to that anchor when the chapter has it, else to the top of the chapter. Sources are named by their
titles, chapters by their headings, never by file names. The filter (by source, chapter and status) is
``book/_static/claims_filter.js``, a few lines run in the reader's browser; without it every claim shows.

A claim is shown in its ``tex`` version where the ledger has one (``claim_html``): each ``$...$`` becomes a
``<span class="math">\(...\)</span>``, which the book's MathJax typesets (its configuration processes the
class ``math`` only), and the directive marks the page as holding math so that Sphinx loads MathJax there.
The table sits in a wrapper (``claims-table-wrapper``): the stylesheet (``book/_static/book.css``) gives the
page the width of the margin beside the text (its one-entry contents list goes) and each column its width,
and the wrapper scrolls sideways where a narrow window cannot hold the table.
"""

from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path

from .claims import STATUSES, source_of
from .verdicts import verdict_anchor

__all__ = ["chapter_title", "verdict_anchors", "notebook_links", "status_by_source", "formula_pieces", "claim_html",
           "claims_table_html", "setup"]

NOT_CHECKED = "not checked yet"


def chapter_title(root: Path, chapter: str) -> str:
    """The first ``# `` heading of a chapter's source, without MyST markup."""
    for line in (Path(root) / chapter).read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return re.sub(r"[`*]", "", line[2:]).strip()
    raise ValueError(f"{chapter} has no '# ' title line")


def verdict_anchors(root: Path, chapter: str) -> set[str]:
    """The verdict anchors present in the stored outputs of a chapter's executed notebook."""
    ipynb = (Path(root) / chapter).with_suffix(".ipynb")
    if not ipynb.exists():
        return set()
    found = set()
    for cell in json.loads(ipynb.read_text(encoding="utf-8")).get("cells", []):
        for output in cell.get("outputs", []):
            text = (output.get("data") or {}).get("text/markdown", "")
            text = "".join(text) if isinstance(text, list) else text
            found.update(re.findall(r"^:name: (verdict-[a-z0-9-]+)$", text, flags=re.M))
    return found


def status_by_source(ledger: dict):
    """Claims per status (rows, in the order of ``STATUSES``) and source (columns by kind), with a total column."""
    import pandas as pd

    columns = {key: source["kind"] for key, source in ledger["sources"].items()}
    table = pd.DataFrame(0, index=pd.Index(list(STATUSES), name="status"), columns=list(columns.values()))
    for c in ledger["claims"]:
        table.loc[c["status"], columns[c["id"].split("-", 1)[0]]] += 1
    table["all"] = table.sum(axis=1)
    table.loc["all claims"] = table.sum(axis=0)
    return table


# Where a long formula may break across lines in the table's narrow column: before a relation or a product sign
# outside every bracket (MathJax 3 does not break inline math itself).
_RELATION = re.compile(r" (?==|<|>|\\le\b|\\ge\b|\\lesssim\b|\\approx\b|\\to\b|\\odot\b|\\Rightarrow\b)")
LONG_FORMULA = 40  # characters of TeX: a formula this long is broken at its relations,
SHORT_PIECE = 12  # into pieces no shorter than this (a lone "\\Delta" or "> 0" stays with its neighbour)


def formula_pieces(tex: str) -> list[str]:
    """``tex`` cut before each relation (``=``, ``\\le``, ``\\to``, ...) that lies outside every bracket, when it
    is longer than ``LONG_FORMULA``: shown side by side, the pieces read as the formula, and a line may break
    between them."""
    tex = tex.strip()
    if len(tex) <= LONG_FORMULA:
        return [tex]
    depth, cuts = 0, []
    for i, ch in enumerate(tex):
        depth += (ch in "({[") - (ch in ")}]")
        if ch == " " and depth == 0 and _RELATION.match(tex, i) and tex[:i].strip():
            cuts.append(i)
    pieces: list[str] = []
    for piece in (tex[a:b].strip() for a, b in zip([0] + cuts, cuts + [len(tex)])):
        if pieces and (len(pieces[-1]) < SHORT_PIECE or len(piece) < SHORT_PIECE):
            pieces[-1] += " " + piece
        else:
            pieces.append(piece)
    return pieces


def claim_html(c: dict) -> str:
    """A claim's sentence as HTML: its ``tex`` version where there is one, each ``$...$`` an inline math span for
    MathJax (``\\(...\\)`` inside ``<span class="math">``, as Sphinx writes inline math; a long formula as a few,
    ``formula_pieces``), a formula and the punctuation after it kept on one line; else its plain text."""
    text = " ".join((c.get("tex") or c["claim"]).split())
    if not c.get("tex"):
        return escape(text)
    parts = text.split("$")
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(escape(part))
            continue
        spans = [f'<span class="math notranslate nohighlight">\\({escape(piece)}\\)</span>'
                 for piece in formula_pieces(part)]
        after = parts[i + 1] if i + 1 < len(parts) else ""
        stuck = re.match(r"[.,;:)]+", after)  # no line break between a formula and its full stop
        if stuck:
            parts[i + 1] = after[stuck.end():]
            spans[-1] = f'<span class="claims-nowrap">{spans[-1]}{escape(stuck.group(0))}</span>'
        out.append(" ".join(spans))
    return "".join(out)


def _select(name: str, label: str, options: list[str]) -> str:
    items = "".join(f'<option value="{escape(o)}">{escape(o)}</option>' for o in options)
    return (f'<label>{escape(label)}<select data-filter="{name}"><option value="">all</option>{items}</select>'
            "</label>")


def notebook_links(root: Path):
    """A ``link(claim)`` for ``claims_table_html`` from the sources: the chapter's title from its ``.md``, the
    verdict anchor if the chapter's stored notebook holds it (the build uses Sphinx's labels instead)."""
    root = Path(root)
    titles, anchors = {}, {}

    def link(c: dict) -> tuple[str | None, str | None]:
        chapter = c["chapter"]
        if not chapter or not (root / chapter).exists():
            return None, None
        if chapter not in titles:
            titles[chapter], anchors[chapter] = chapter_title(root, chapter), verdict_anchors(root, chapter)
        href = "../" + str(Path(chapter).with_suffix(".html"))
        anchor = verdict_anchor(c["id"])
        return (href + "#" + anchor if anchor in anchors[chapter] else href), titles[chapter]

    return link


def claims_table_html(ledger: dict, link) -> str:
    """Every claim as one row of an HTML table, with the filter controls above it.

    ``link(claim)`` returns the address of the claim's evidence and the title of its chapter, or
    ``(None, None)`` when no chapter holds it yet."""
    source_titles = {key: s["title"] for key, s in ledger["sources"].items()}
    rows, chapters = [], {}
    for c in ledger["claims"]:
        source = source_of(c, ledger)
        href, title = link(c)
        if title:
            where, chapter_name = f'<a href="{escape(href)}">{escape(title)}</a>', title
            chapters.setdefault(title, c["chapter"])
        else:
            where, chapter_name = f"<em>{NOT_CHECKED}</em>", NOT_CHECKED
        note = c.get("note") or ""
        note_html = (f"<details><summary>first-reading note</summary>{escape(' '.join(note.split()))}</details>"
                     if note else "")
        rows.append(
            f'<tr data-source="{escape(source["title"])}" data-chapter="{escape(chapter_name)}" '
            f'data-status="{escape(c["status"])}">'
            f'<td id="claim-{escape(c["id"].lower())}"><strong>{escape(c["id"])}</strong></td>'
            f'<td><em>{escape(source["kind"])}</em>, {escape(c["section"])}</td>'
            f'<td class="claims-text">{claim_html(c)}{note_html}</td>'
            f'<td>{escape(c["kind"])}</td>'
            f'<td class="claims-status">{escape(c["status"])}</td>'
            f"<td>{where}</td></tr>")
    used = [s for s in STATUSES if any(c["status"] == s for c in ledger["claims"])]
    controls = ('<div class="claims-filter" data-table="claims-table">'
                + _select("source", "Source", list(source_titles.values()))
                + _select("chapter", "Chapter", sorted(chapters, key=chapters.get) + [NOT_CHECKED])
                + _select("status", "Status", used)
                + f'<span class="claims-shown">{len(rows)} claims</span></div>')
    columns = ("claim", "where the source says it", "what it says", "check", "status", "evidence")
    cols = "".join(f'<col class="claims-col-{i}">' for i in range(len(columns)))
    head = "".join(f"<th>{h}</th>" for h in columns)
    return (controls + '<div class="claims-table-wrapper">'
            f'<table class="claims-table" id="claims-table"><colgroup>{cols}</colgroup>'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


# ----------------------------------------------------------------------------- the Sphinx directive

from docutils import nodes  # noqa: E402 - the directive's part of the module
from sphinx.util.docutils import SphinxDirective  # noqa: E402


class claims_table(nodes.General, nodes.Element):
    """Where the table goes; replaced by its HTML once every page has been read."""


class ClaimsTable(SphinxDirective):
    def run(self):
        self.env.note_dependency(str(Path(self.env.srcdir) / "book" / "claims.yml"))
        if not hasattr(self.env, "claims_table_docs"):
            self.env.claims_table_docs = set()
        self.env.claims_table_docs.add(self.env.docname)
        return [claims_table()]


def _resolve(app, doctree, fromdocname):
    from .claims import load_ledger

    env = app.env
    labels = env.domaindata["std"]["anonlabels"]  # name -> (docname, html id)
    ledger = load_ledger(Path(env.srcdir) / "book" / "claims.yml")

    def link(c):
        chapter = c["chapter"]
        docname = str(Path(chapter).with_suffix("")) if chapter else None
        if docname not in env.titles:
            return None, None
        href = app.builder.get_relative_uri(fromdocname, docname)
        target = labels.get(verdict_anchor(c["id"]))
        if target and target[0] == docname:
            href += "#" + target[1]
        return href, env.titles[docname].astext()

    for node in list(doctree.findall(claims_table)):
        node.replace_self(nodes.raw("", claims_table_html(ledger, link), format="html"))


def _has_math(app, doctree):
    """A page with the table holds math (the claims' ``tex``), though only as raw HTML: tell Sphinx's math
    domain, which decides whether a page loads MathJax, once the page has been read."""
    if any(True for _ in doctree.findall(claims_table)):
        app.env.get_domain("math").data["has_equations"][app.env.docname] = True


def _always_rewrite(app, env, added, changed, removed):
    """Pages with the table are re-read on every build: chapter titles and verdicts live in other pages."""
    return sorted(getattr(env, "claims_table_docs", set()) - set(removed))


def _skip(self, node):
    raise nodes.SkipNode


def setup(app):
    """Register the ``claims-table`` directive: the table of every claim, made at build time."""
    app.add_node(claims_table, html=(_skip, None), latex=(_skip, None), text=(_skip, None))
    app.add_directive("claims-table", ClaimsTable)
    app.connect("doctree-read", _has_math)
    app.connect("doctree-resolved", _resolve)
    app.connect("env-get-outdated", _always_rewrite)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
