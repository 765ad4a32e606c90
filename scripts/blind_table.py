"""The blind error table of a calibration check (issue 35; docs/advisor.md, "Calibration on a
new machine"), from the five files ``scripts/blind_check.py`` left in OUT:

    python scripts/blind_table.py OUT TABLE.csv

Per verification setting (``TABLE.csv``): the measured per-rank throughput (mean over its runs,
95 % two-level bootstrap interval), the uncalibrated and the calibrated prediction and their
errors, how far it is from the best measured setting, the advised setting's throughput ratio
to it (with interval), and per prediction table the proof of order (``verify.prediction_order``:
``predicted-first`` when the file scored has the sha256 recorded before the runs and that
record's time precedes the setting's first run). ``TABLE_summary.csv``: per prediction table,
median and worst |error|, the advised setting against the best measured one, and whether every
measured setting was predicted first. Both are printed, with the probe's table.
"""

from __future__ import annotations

import datetime
import json
import sys
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

from codl.advisor.verify import (
    Order,
    file_sha256,
    prediction_order,
    prediction_summary,
    score_predictions,
)
from codl.config import load_yaml
from codl.errors import CodlError
from codl.outputs import output_unit

KEY = ["policy", "workers", "launch_cores"]


def scored(
    plan: Path, name: str, runs: pd.DataFrame, steps: pd.DataFrame, sha: str, at: str
) -> pd.DataFrame:
    """One prediction table of the plan scored against the runs, with its proof of order; its
    modification time is the one the tar kept (the node's clock, as the runs')."""
    path = plan / name
    t = score_predictions(pd.read_csv(path, dtype={"launch_cores": str}), runs, steps)
    mtime = datetime.datetime.fromtimestamp(path.stat().st_mtime, tz=datetime.UTC)
    return prediction_order(
        t,
        runs,
        sha256=file_sha256(path),
        modified_at=mtime.isoformat(),
        planned_sha256=sha,
        planned_at=at,
    )


def blind_table(out: Path, plan: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    for name in ("verify_runs.csv", "verify_steps.csv.gz", "probe_runs.csv"):
        if not (out / name).is_file():
            raise CodlError(f"{out / name}: missing (no verification run measured?)")
    runs = pd.read_csv(out / "verify_runs.csv")
    steps = pd.read_csv(out / "verify_steps.csv.gz")
    probe = pd.read_csv(out / "probe_runs.csv")
    reused = set(runs["run_id"]) & set(probe["run_id"])
    if reused:
        raise CodlError(f"verification runs {sorted(reused)} are probe runs: not blind")
    recorded = load_yaml(plan / "verify.yaml")["advisor"]
    uncal = json.loads((plan / "uncalibrated.json").read_text())
    cal = scored(
        plan,
        "predictions.csv",
        runs,
        steps,
        recorded["predictions_sha256"],
        recorded["predicted_at"],
    )
    unc = scored(
        plan,
        "predictions_uncalibrated.csv",
        runs,
        steps,
        uncal["predictions_sha256"],
        uncal["predicted_at"],
    )
    table = cal[
        [
            *KEY,
            "advised",
            "n_runs",
            "measured",
            "measured_lo",
            "measured_hi",
            "vs_best",
            "advice_ratio",
            "advice_ratio_lo",
            "advice_ratio_hi",
            "first_run_start",
        ]
    ].copy()
    for label, t in (("uncalibrated", unc), ("calibrated", cal)):
        table[f"predicted_{label}"] = t["throughput"].to_numpy()
        table[f"error_{label}"] = t["error"].to_numpy()
        table[f"order_{label}"] = t["order"].to_numpy()
        table[f"planned_at_{label}"] = t["planned_at"].to_numpy()
    rows = []
    for label, t in (("uncalibrated", unc), ("calibrated", cal)):
        measured = t[t["n_runs"] > 0]
        s = prediction_summary(measured)
        s["all_predicted_first"] = bool(
            len(measured) and (measured["order"] == Order.PREDICTED_FIRST.value).all()
        )
        rows.append({"predictions": label, "runs": int(measured["n_runs"].sum()), **s})
    return table, pd.DataFrame(rows)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, dest = Path(argv[0]), Path(argv[1])
    summary_path = dest.with_name(f"{dest.stem}_summary.csv")
    if not (out / "plan.tar").is_file():
        raise CodlError(f"{out / 'plan.tar'}: missing (blind_check.py stopped before it)")
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp)
        with tarfile.open(out / "plan.tar") as tar:
            tar.extractall(plan, filter="data")  # keeps each member's modification time
        print((plan / "calibration.csv").read_text())
        table, summary = blind_table(out, plan)
    with output_unit([dest, summary_path], mkdir=True) as unit:
        table.to_csv(unit.path(dest), index=False, float_format="%.4g")
        summary.to_csv(unit.path(summary_path), index=False, float_format="%.4g")
    cols = [
        *KEY,
        "advised",
        "n_runs",
        "measured",
        "predicted_uncalibrated",
        "error_uncalibrated",
        "predicted_calibrated",
        "error_calibrated",
        "vs_best",
        "order_calibrated",
    ]
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except CodlError as exc:
        print(f"blind_table: error: {exc}", file=sys.stderr)
        sys.exit(2)
