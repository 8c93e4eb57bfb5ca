"""Every figure of the book: one style, one way onto the page.

``book_style(seed)`` is the first line of a chapter's setup cell: it pins threads and seeds every generator
(``stated.reproducible``) and applies the book's plotting style (``book.mplstyle``, seaborn's whitegrid look
written out). ``publish(fig, name)`` is the last line of a figure's cell: it lays the figure out, glues it
under ``name`` for a ``{glue:figure}`` directive and closes it, so that no figure is shown twice and none
is left open to grow the notebook.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["STYLE", "book_style", "publish"]

STYLE = Path(__file__).with_name("book.mplstyle")


def book_style(seed: int = 0, threads: int = 1) -> None:
    """Seed and pin (``reproducible(seed, threads)``), then apply ``STYLE`` (seaborn's palette included)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from .stated import reproducible

    reproducible(seed=seed, threads=threads)
    sns.set_theme(style="whitegrid", context="notebook")  # seaborn's own defaults first (its palettes, rc)
    plt.style.use(STYLE)


def publish(fig, name: str) -> None:
    """``fig.tight_layout()``, glue ``fig`` as ``name`` (not displayed here: the page shows it where the
    ``{glue:figure}`` directive names it), close it."""
    import matplotlib.pyplot as plt
    from myst_nb import glue

    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a figure's glue name is an identifier such as 'fig_alpha_sweep', got {name!r}")
    fig.tight_layout()
    glue(name, fig, display=False)
    plt.close(fig)
