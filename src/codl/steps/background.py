"""``python -m codl.steps.background RESULTS``: the background-load warnings of a results
directory (``analysis.load.load_warnings`` of its runs and comparison tables), printed on
stderr as the last lines of ``make demo``. Exit 0 whatever they say (a warning, not a failure);
2 with one line when the tables are missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from codl.analysis.load import load_warnings
from codl.paths import ResultPaths


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m codl.steps.background RESULTS_DIR", file=sys.stderr)
        return 2
    std = ResultPaths()
    tables = tuple(
        Path(args[0]) / t.relative_to(std.results) for t in (std.runs_table, std.comparison_table)
    )
    missing = [str(t) for t in tables if not t.is_file()]
    if missing:
        print(f"background load: error: {', '.join(missing)}: no such table", file=sys.stderr)
        return 2
    runs, comparison = (pd.read_csv(t, low_memory=False) for t in tables)
    for line in load_warnings(runs, comparison):
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
