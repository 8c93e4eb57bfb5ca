"""A pytest plugin for nbval: figures are checked to exist, not compared byte for byte.

nbval already skips ``image/png`` outputs, but a figure glued with ``myst_nb.glue`` is stored under
``application/papermill.record/image/png``, which it compares byte for byte: another CPU, another
matplotlib or freetype, and the PNG differs while the figure says the same thing. The numbers behind a
figure are glued (at their stated precision) and compared; the figure itself must only be there.

Load it with ``pytest -p manifold_muon.nbval_figures --nbval ...``. For every cell, each figure output of
the stored notebook must have a non-empty counterpart in the re-executed one; then nbval compares every
other output as usual.
"""

from __future__ import annotations

FIGURE_KEYS = tuple(f"{prefix}image/{kind}" for prefix in ("", "application/papermill.record/")
                    for kind in ("png", "jpeg", "svg+xml"))


def _figures(outputs) -> list[str]:
    found = []
    for out in outputs:
        for key, value in (out.get("data") or {}).items():
            if key in FIGURE_KEYS:
                found.append(key if value else f"{key} (empty)")
    return found


def pytest_configure(config):
    try:
        from nbval.plugin import IPyNbCell, IPyNbFile
    except ImportError:  # nbval not installed: nothing to adapt
        return
    if getattr(IPyNbCell, "_figures_checked_to_exist", False):
        return
    original_compare = IPyNbCell.compare_outputs
    original_init = IPyNbFile.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.skip_compare = tuple(self.skip_compare) + tuple(k for k in FIGURE_KEYS if k not in self.skip_compare)

    def compare_outputs(self, test, ref, skip_compare=None):
        want, got = _figures(ref), _figures(test)
        missing = [k for k in want if not k.endswith("(empty)") and want.count(k) > got.count(k)]
        if missing:
            self.comparison_traceback = [f"figure output(s) missing from the re-executed cell: {sorted(set(missing))} "
                                         f"(stored: {want}, re-executed: {got})"]
            return False
        return original_compare(self, test, ref, skip_compare)

    IPyNbFile.__init__ = init
    IPyNbCell.compare_outputs = compare_outputs
    IPyNbCell._figures_checked_to_exist = True
