"""`python -m manifold_muon_book.bench [--quick] [--only NAME ...]`: run the benchmarks into runs/bench/."""

import argparse
import importlib
from pathlib import Path

from . import BENCHMARKS


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("runs/bench"))
    ap.add_argument("--quick", action="store_true", help="small shapes and few repeats (seconds)")
    ap.add_argument("--only", nargs="*", choices=BENCHMARKS, default=None)
    args = ap.parse_args(argv)
    for name in args.only or BENCHMARKS:
        mod = importlib.import_module(f"{__package__}.{name}")
        print(f"[bench] {name} ...", flush=True)
        mod.main(args.out, quick=args.quick)


if __name__ == "__main__":
    main()
