"""``python -m bench [--quick] [--only NAME]... [--out BENCHMARKS.md]`` (``make bench``).

The harness is run from a checkout, not installed with memstream: it needs the ``bench``
extra (matplotlib, psutil), the LoCoMo-dev data in ``../shared/bench``
(``MEMSTREAM_SHARED_BENCH``) and the repository's sample files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.runner import BENCHMARKS, main


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small smoke run (CI): same code")
    parser.add_argument(
        "--only", action="append", choices=list(BENCHMARKS), help="run only this benchmark"
    )
    parser.add_argument("--out", type=Path, default=None, help="markdown path; JSON, plots beside")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse(sys.argv[1:])
    sys.exit(main(quick=args.quick, only=args.only, out=args.out))
