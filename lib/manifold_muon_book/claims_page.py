"""The claims page (``book/claims.md``): the ledger as a reader uses it.

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
"""

from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path

from .claims import STATUSES, source_of
from .verdicts import verdict_anchor

__all__ = ["chapter_title", "verdict_anchors", "notebook_links", "status_by_source", "claims_table_html", "setup"]

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
            f'<td>{escape(" ".join(c["claim"].split()))}{note_html}</td>'
            f'<td>{escape(c["kind"])}</td>'
            f'<td class="claims-status">{escape(c["status"])}</td>'
            f"<td>{where}</td></tr>")
    used = [s for s in STATUSES if any(c["status"] == s for c in ledger["claims"])]
    controls = ('<div class="claims-filter" data-table="claims-table">'
                + _select("source", "Source", list(source_titles.values()))
                + _select("chapter", "Chapter", sorted(chapters, key=chapters.get) + [NOT_CHECKED])
                + _select("status", "Status", used)
                + f'<span class="claims-shown">{len(rows)} claims</span></div>')
    head = "".join(f"<th>{h}</th>" for h in ("claim", "where the source says it", "what it says", "check",
                                            "status", "evidence"))
    return (controls + f'<table class="claims-table" id="claims-table"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


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


def _always_rewrite(app, env, added, changed, removed):
    """Pages with the table are re-read on every build: chapter titles and verdicts live in other pages."""
    return sorted(getattr(env, "claims_table_docs", set()) - set(removed))


def _skip(self, node):
    raise nodes.SkipNode


def setup(app):
    """Register the ``claims-table`` directive: the table of every claim, made at build time."""
    app.add_node(claims_table, html=(_skip, None), latex=(_skip, None), text=(_skip, None))
    app.add_directive("claims-table", ClaimsTable)
    app.connect("doctree-resolved", _resolve)
    app.connect("env-get-outdated", _always_rewrite)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
