"""Numbered, captioned tables in a chapter, at the precision the text states.

    show_table(df, "Worst error per method; $\\|J\\|_F$ is the Frobenius norm.", "tab-msign-error",
               {"error": ".2e"})

shows ``stated_table(df, formats, ...)`` (the strings a reader sees: see ``stated``) as a MyST
``list-table`` with a caption and a label, so the prose refers to it with ``{numref}`tab-msign-error```
("Table 3") like a figure. The caption is MyST (math allowed); the column names and cells are shown as
written, except ``$...$`` math in a column name. The book's stylesheet spaces the columns.
"""

from __future__ import annotations

from .stated import stated_table
from .verdicts import escape_prose

__all__ = ["table_markdown", "show_table"]


def _cell(text: str) -> str:
    return escape_prose(text) if str(text).strip() else " "


def table_markdown(df, caption: str, name: str, formats: dict | None = None, default: str = ".3g",
                   index: bool = False) -> str:
    """The MyST ``list-table`` that ``show_table`` displays."""
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"a table's name is a label without spaces, such as 'tab-msign-error', got {name!r}")
    shown = stated_table(df, formats, default=default, index=index)
    header = [str(c) for c in shown.columns]
    rows = [[str(v) for v in row] for row in shown.itertuples(index=False)]
    if index:
        header = [str(shown.index.name or "")] + header
        rows = [[str(i)] + row for i, row in zip(shown.index, rows)]
    lines = [f":::{{list-table}} {' '.join(caption.split())}", ":header-rows: 1", f":name: {name}", ""]
    for row in [header] + rows:
        lines.append(f"* - {_cell(row[0])}")
        lines.extend(f"  - {_cell(v)}" for v in row[1:])
    lines.append(":::")
    return "\n".join(lines)


def show_table(df, caption: str, name: str, formats: dict | None = None, default: str = ".3g",
               index: bool = False) -> None:
    """Display ``df`` at its stated precision as a numbered table with ``caption``, labelled ``name``."""
    from IPython.display import Markdown, display

    display(Markdown(table_markdown(df, caption, name, formats, default=default, index=index)))
