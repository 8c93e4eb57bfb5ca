"""Run in a fresh virtualenv that has only the built manifold-muon wheel (and its dependencies):
the library imports from that install, not from the repository, and the README's example runs."""

import re
import sys
from pathlib import Path

import manifold_muon

readme = Path(sys.argv[1]).read_text()
installed = Path(manifold_muon.__file__).resolve()
assert "site-packages" in installed.parts, f"manifold_muon was imported from {installed}, not from the installed wheel"
for module in ("manifold_muon_lab", "manifold_muon_book"):
    try:
        __import__(module)
    except ModuleNotFoundError:
        continue
    raise AssertionError(f"{module} is importable here: the wheel must not need (or bring) the book's code")
blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
assert blocks, "the library README has no python example"
for code in blocks:
    exec(compile(code, "README.md", "exec"), {})
print(f"wheel OK: manifold_muon {manifold_muon.__version__} from {installed.parent}; README example ran")
