"""Numbers as the book states them: glued and tabulated at the precision the text claims.

nbval re-executes every chapter and compares what it stores. A number stored as a 17-digit repr
differs in its last digits between CPUs (other BLAS code paths, other vector kernels) although no
sentence of the book changes; a check that fails on such noise teaches people to ignore it. So a
chapter never glues or tabulates a raw float:

* ``glue_value(name, x, fmt)`` stores ``x`` rounded to the format spec its sentence uses
  (``{glue:text}`name:fmt``` in the prose shows exactly the stored digits);
* ``glue_magnitude(name, x)`` stores only the power of ten of a quantity that is unstable by nature
  (rounding amplified by an iteration, anything seed-chaotic); the chapter asserts the bound its
  prose states and says why only the order of magnitude is shown;
* ``stated_table(df, formats)`` turns a DataFrame into the strings a reader sees, one format per
  column; ``above_rounding(floor)`` is the format of a column whose small entries are rounding noise
  (shown as the bound "< floor", whose digits would differ from CPU to CPU);
* ``reproducible(seed)`` pins threads and seeds every generator at the top of a notebook, so a second
  execution on the same machine stores identical outputs.

A changed digit at the stated precision still fails nbval; a changed 16th digit does not.
"""

from __future__ import annotations

import math
import numbers
import random
import re

__all__ = ["glue_value", "glue_magnitude", "stated", "magnitude", "stated_table", "above_rounding", "reproducible"]


def _check_fmt(fmt: str) -> None:
    if not isinstance(fmt, str) or not fmt or fmt[-1] not in "efgd%":
        raise ValueError(f"fmt must be a format spec ending in e, f, g, d or % (such as '.3f'), got {fmt!r}")


def stated(value, fmt: str):
    """``value`` rounded to what ``format(value, fmt)`` shows: an int for 'd', else a float."""
    _check_fmt(fmt)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"a stated number is a real number, got {type(value).__name__}: {value!r}")
    if fmt.endswith("d"):
        if float(value) != int(value):
            raise ValueError(f"fmt {fmt!r} is for integers, got {value!r}")
        return int(value)
    x = float(value)
    if not math.isfinite(x):
        return x
    if fmt.endswith("%"):  # ".1%" shows 12.3% of 0.1234: keep three decimals, 0.123
        digits = re.search(r"\.(\d+)%$", fmt)
        return float(format(x, f".{int(digits.group(1)) + 2 if digits else 8}f"))
    return float(format(x, fmt))


def magnitude(value) -> float:
    """The power of ten at or below |value| (sign kept): 6.6e-3 -> 1e-3. 0, inf and nan are returned as they are."""
    x = float(value)
    if x == 0 or not math.isfinite(x):
        return x
    return math.copysign(10.0 ** math.floor(math.log10(abs(x))), x)


def _glue(name: str, x, fmt: str) -> None:
    """myst_nb's ``glue(name, x, display=False)``, with the format recorded in the output's metadata
    (``stated_fmt``) so that a test can check that the prose shows the number with that same format."""
    import IPython.core.formatters
    from IPython.display import display

    bundle, metadata = IPython.core.formatters.format_display_data(x)
    metadata["scrapbook"] = dict(name=name, mime_prefix=GLUE_PREFIX)
    metadata["stated_fmt"] = fmt
    display({GLUE_PREFIX + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)


GLUE_PREFIX = "application/papermill.record/"


def glue_value(name: str, value, fmt: str) -> None:
    """Glue ``value`` (not displayed) at the precision of ``fmt``. Write the sentence with the same spec:
    ``{glue:text}`name:fmt```. (It returns nothing, so it adds no output as a cell's last line.)"""
    _glue(name, stated(value, fmt), fmt)


def glue_magnitude(name: str, value) -> None:
    """Glue only the order of magnitude of an unstable quantity; show it with ``{glue:text}`name:.0e```.

    A quantity near a power of ten can change decade between CPUs: state an asserted bound instead."""
    _glue(name, magnitude(value), ".0e")


def above_rounding(floor: float, fmt: str = ".1e"):
    """A ``stated_table`` format: values below ``floor`` are rounding noise and shown as "< floor"; the others at ``fmt``."""
    _check_fmt(fmt)
    bound = "< " + format(floor, ".0e").replace("e-0", "e-").replace("e+0", "e+")

    def show(value) -> str:
        return format(float(value), fmt) if abs(float(value)) >= floor else bound

    return show


def _cell(value, fmt) -> str:
    """One cell as shown: ``fmt`` None means the column has no format of its own (integers stay integers)."""
    if value is None:
        return ""
    if isinstance(value, (str, bool)):
        return str(value)
    if callable(fmt):
        return fmt(value)
    if fmt == "magnitude":
        return format(magnitude(value), ".0e")
    if isinstance(value, numbers.Integral) and (fmt is None or fmt.endswith("d")):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return format(float(value), fmt or ".3g")
    return str(value)


def stated_table(df, formats: dict | None = None, default: str = ".3g", index: bool = False):
    """A copy of ``df`` whose cells are the strings a reader sees.

    ``formats`` maps a column to a format spec, ``"magnitude"`` or a function of the value (such as
    ``above_rounding(1e-12)``); other float columns use
    ``default``; strings, booleans and integer columns are shown as they are. ``index=True`` keeps the
    index (shown as it is: give tables a string or integer index), else it is dropped.
    """
    import pandas as pd

    formats = dict(formats or {})
    unknown = set(formats) - set(df.columns)
    if unknown:
        raise KeyError(f"formats name columns that the table does not have: {sorted(map(str, unknown))}; "
                       f"its columns are {list(map(str, df.columns))}")
    for fmt in formats.values():
        if fmt != "magnitude" and not callable(fmt):
            _check_fmt(fmt)
    out = pd.DataFrame({c: [_cell(v, formats.get(c, None) or _default_for(df[c], default)) for v in df[c]]
                        for c in df.columns})
    if index:
        out.index = pd.Index([_cell(v, None) for v in df.index], name=df.index.name)
    return out


def _default_for(column, default: str) -> str | None:
    """Integer columns keep their integers; other numeric columns get ``default``."""
    import pandas as pd

    return None if pd.api.types.is_integer_dtype(column) else default


def reproducible(seed: int = 0, threads: int = 1) -> None:
    """Pin torch to ``threads`` CPU threads and seed Python's, NumPy's and torch's global generators."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
