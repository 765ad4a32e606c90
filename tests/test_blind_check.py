"""scripts/blind_check.py end to end on CPU (the GPU node's blind check, without Snakemake):
a fit of another machine (planted), its probe measured here, the calibration, the verification
runs; then scripts/blind_table.py's blind error table with the proof of order."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from codl.config import build_plan, load_yaml
from test_calibrate_workflow import PROBE_CORES, planted_fit

REPO = Path(__file__).resolve().parents[1]


def script(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / name), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


@pytest.mark.slow
def test_blind_check_runs_the_probe_calibrates_then_verifies(tmp_path: Path) -> None:
    fit = planted_fit(tmp_path / "fit")
    out = tmp_path / "out"
    script("blind_check.py", str(fit), str(out), "--cores", str(PROBE_CORES), "--seconds", "300")
    # Five files come back from the node, nothing else.
    names = {"plan.tar", "probe_runs.csv", "probe_steps.csv.gz"}
    assert {p.name for p in out.iterdir()} == names | {"verify_runs.csv", "verify_steps.csv.gz"}
    with tarfile.open(out / "plan.tar") as tar:
        tar.extractall(tmp_path / "plan", filter="data")
    plan = tmp_path / "plan"
    probe = pd.read_csv(out / "probe_runs.csv")
    assert set(probe["run_id"]) == set(build_plan(load_yaml(plan / "probe.yaml")).specs)
    # Every combined run of the verification config, none of them a probe run.
    verify = build_plan(load_yaml(plan / "verify.yaml"))
    combined = {i for i, s in verify.specs.items() if s.mode.value == "data+compute"}
    runs = pd.read_csv(out / "verify_runs.csv")
    assert set(runs["run_id"]) == combined and not combined & set(probe["run_id"])

    table_csv = tmp_path / "blind.csv"
    script("blind_table.py", str(out), str(table_csv))
    table = pd.read_csv(table_csv)
    summary = pd.read_csv(tmp_path / "blind_summary.csv").set_index("predictions")
    assert (table["n_runs"] > 0).all() and table["advised"].sum() == 1
    # Both predictions were recorded before the runs started, and the errors are theirs.
    assert (table["order_calibrated"] == "predicted-first").all()
    assert (table["order_uncalibrated"] == "predicted-first").all()
    # The CSVs keep four significant digits: a value starting with 1 moves by up to 5e-4 of
    # itself, so the error recomputed from them moves by up to ~1e-3; the table's own error
    # column is rounded once, so its median is within 1e-4 of the summary's.
    err = table["predicted_calibrated"] / table["measured"] - 1
    assert err.to_numpy() == pytest.approx(table["error_calibrated"].to_numpy(), rel=2e-3, abs=2e-3)
    assert summary.loc["calibrated", "median_abs_error"] == pytest.approx(
        table["error_calibrated"].abs().median(), rel=1e-3, abs=1e-4
    )
    assert summary.loc["calibrated", "all_predicted_first"]
    # A prediction file changed after the runs is caught.
    with tarfile.open(out / "plan.tar") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    members["predictions.csv"] = members["predictions.csv"].replace(b"True", b"False", 1)
    with tarfile.open(out / "plan.tar", "w") as tar:
        for name, data in members.items():
            (tmp_path / name).write_bytes(data)
            tar.add(tmp_path / name, arcname=name)
    script("blind_table.py", str(out), str(tmp_path / "edited.csv"))
    edited = pd.read_csv(tmp_path / "edited.csv")
    assert (edited["order_calibrated"] == "changed-after-runs-started").all()
