"""Calibration against committed runs of another machine: each combined run predicted by a fit
calibrated on the machine's other runs (held out in turn), before and after
(docs/advisor.md, "Calibration on a new machine").

    python scripts/calibration_check.py FIT_RESULTS NEW_RESULTS OUT.csv

Made results/fit-h200-check/alloc-a/calibrated_loo.csv:
    python scripts/calibration_check.py results/fit-h200-light results/fit-h200-check/alloc-a \\
        results/fit-h200-check/alloc-a/calibrated_loo.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from codl.advisor.calibrate import leave_one_out
from codl.errors import CodlError
from codl.outputs import output_unit
from codl.paths import ResultPaths
from codl.steps.advisor import fit_results


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    fit_dir, new_dir, out = Path(argv[0]), Path(argv[1]), Path(argv[2])
    fit = fit_results(fit_dir, boot=0).fit
    runs_csv, steps_csv = ResultPaths.merged_tables_of(new_dir)
    table = leave_one_out(fit, pd.read_csv(runs_csv), pd.read_csv(steps_csv), cores=fit.cores)
    with output_unit([out], mkdir=True) as unit:
        table.to_csv(unit.path(out), index=False, float_format="%.4g")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    e0, e1 = table["error_before"].abs(), table["error_after"].abs()
    print(
        f"|error| before: median {100 * e0.median():.1f} %, worst {100 * e0.max():.1f} %; "
        f"after: median {100 * e1.median():.1f} %, worst {100 * e1.max():.1f} %"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except CodlError as exc:
        print(f"calibration_check: error: {exc}", file=sys.stderr)
        sys.exit(2)
