"""The calibration's blind check as a user runs it (docs/advisor.md, "Calibration on a new
machine"), on CPU with real Snakemake: a fit of another machine (planted), its probe measured
here and the calibration (one invocation, whose ``calibrate`` rule records both predictions),
the verification config's runs and their blind table (a second invocation, whose
``blind_error`` rule runs ``codl check blind``), with the proof of order."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from codl import cli
from codl.config import build_plan, load_yaml
from codl.paths import ResultPaths
from test_calibrate_workflow import PROBE_CORES, planted_fit
from test_workflow import snakemake


@pytest.mark.slow
def test_blind_error_probes_calibrates_then_verifies(tmp_path: Path) -> None:
    fit = planted_fit(tmp_path / "fit")
    work = tmp_path / "work"
    work.mkdir()
    config = tmp_path / "calibrate.yaml"
    # One repeat per verification setting: the check's logic, not its statistics.
    advisor = {"calibrate": str(fit), "cores": PROBE_CORES, "repeats": 1}
    config.write_text(yaml.safe_dump({"advisor": advisor}))
    cal = ResultPaths(root=work, set_name="calibrate")
    _, jobs = snakemake(work, config)
    assert jobs["run"] == 3 and jobs["calibrate"] == 1
    # Both predictions recorded before any verification run: the calibrated ones in the
    # verification config, the uncalibrated ones beside them.
    for path in (cal.verify_config, cal.uncalibrated_predictions_table, cal.uncalibrated_record):
        assert path.is_file()

    # The second invocation: the verification config the calibration wrote, in its own set,
    # whose blind_error rule scores both predictions on its runs.
    _, jobs = snakemake(work, cal.verify_config)
    assert jobs["blind_error"] == 1 and jobs["predicted_vs_measured"] == 1
    ver = ResultPaths(root=work, set_name="calibrate-verify")
    verify = build_plan(load_yaml(cal.verify_config))
    probe = pd.read_csv(cal.runs_table)
    runs = pd.read_csv(ver.runs_table)
    assert set(runs["run_id"]) == set(verify.specs) and not set(verify.specs) & set(probe["run_id"])

    out = tmp_path / "blind.csv"
    assert cli.main(["check", "blind", str(cal.set_dir), str(ver.set_dir), "--out", str(out)]) == 0
    # The rule's table is the command's, as a user types it.
    assert out.read_bytes() == ver.blind_table.read_bytes()
    assert (tmp_path / "blind_summary.csv").read_bytes() == ver.blind_summary.read_bytes()
    table = pd.read_csv(out)
    summary = pd.read_csv(tmp_path / "blind_summary.csv").set_index("predictions")
    assert (table["n_runs"] > 0).all() and table["advised"].sum() == 1
    assert (table["order_calibrated"] == "predicted-first").all()
    assert (table["order_uncalibrated"] == "predicted-first").all()
    # The CSVs keep four significant digits: the error recomputed from them moves by ~1e-3.
    err = table["predicted_calibrated"] / table["measured"] - 1
    assert err.to_numpy() == pytest.approx(table["error_calibrated"].to_numpy(), rel=2e-3, abs=2e-3)
    assert summary.loc["calibrated", "all_predicted_first"]
    assert summary.loc["calibrated", "median_abs_error"] == pytest.approx(
        table["error_calibrated"].abs().median(), rel=1e-3, abs=1e-4
    )

    # A prediction edited after the runs started is caught.
    edited = cal.uncalibrated_predictions_table
    edited.write_text(edited.read_text().replace("True", "False", 1))
    os.utime(edited)
    again = tmp_path / "edited.csv"
    args = ["check", "blind", str(cal.set_dir), str(ver.set_dir)]
    assert cli.main([*args, "--out", str(again)]) == 0
    assert (pd.read_csv(again)["order_uncalibrated"] == "changed-after-runs-started").all()
