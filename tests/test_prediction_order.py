"""Predictions before measurements: the verification table says per setting whether the
predictions file scored is the one the verification config recorded (sha256) and was planned
before the setting's runs started (runs.csv ``start_time``); a prediction edited after the runs
started is flagged."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pandas as pd
import pytest

from codl.advisor import verify
from codl.steps import advisor as advisor_steps

PLANNED = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.UTC)


def _predictions() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "policy": ["none", "none"],
            "workers": [4, 8],
            "launch_cores": ["-", "-"],
            "throughput": [900.0, 1500.0],
            "throughput_lo": [950.0, 1400.0],
            "throughput_hi": [1050.0, 1600.0],
            "pred_lo": [900.0, 1300.0],
            "pred_hi": [1100.0, 1700.0],
            "bound": ["loader", "compute"],
            "inflation": [1.1, 1.2],
            "advised": [False, True],
        }
    )


def _runs(start: datetime.datetime) -> pd.DataFrame:
    # Two runs per setting, a minute apart; the 8-worker runs start an hour after the 4-worker.
    rows = []
    for i, (w, x) in enumerate([(4, 1010.0), (4, 990.0), (8, 1480.0), (8, 1520.0)]):
        when = start + datetime.timedelta(hours=(w == 8), minutes=i)
        rows.append(
            {
                "run_id": f"r{i}",
                "mode": "data+compute",
                "policy": "none",
                "workers": w,
                "launch_cores": "auto",
                "batch_size": 128,
                "world_size": 1,
                "throughput_samples_s": x,
                "start_time": when.isoformat(),
            }
        )
    return pd.DataFrame(rows)


def _score(tmp_path: Path, runs: pd.DataFrame, planned_sha: str) -> pd.DataFrame:
    runs_csv = tmp_path / "runs.csv"
    runs.to_csv(runs_csv, index=False)
    return advisor_steps.predicted_vs_measured_to(
        predictions=tmp_path / "predictions.csv",
        runs=runs_csv,
        table=tmp_path / "pvm.csv",
        figures=[tmp_path / "pvm.png"],
        planned_sha256=planned_sha,
        planned_at=PLANNED.isoformat(),
    )


def _write(path: Path, table: pd.DataFrame, when: datetime.datetime) -> str:
    table.to_csv(path, index=False)
    os.utime(path, (when.timestamp(), when.timestamp()))
    return verify.file_sha256(path)


def test_predictions_planned_before_the_runs_are_proven_first(tmp_path: Path) -> None:
    sha = _write(tmp_path / "predictions.csv", _predictions(), PLANNED)
    t = _score(tmp_path, _runs(PLANNED + datetime.timedelta(minutes=5)), sha)
    assert list(t["order"]) == [verify.Order.PREDICTED_FIRST.value] * 2
    assert (t["predictions_sha256"] == sha).all() and (t["planned_sha256"] == sha).all()
    # The table written is the one returned: the proof travels with the scores.
    assert list(pd.read_csv(tmp_path / "pvm.csv")["order"]) == list(t["order"])


def test_a_prediction_edited_after_the_runs_started_is_flagged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    start = PLANNED + datetime.timedelta(minutes=5)
    path = tmp_path / "predictions.csv"
    sha = _write(path, _predictions(), PLANNED)
    # After the 4-worker runs started and before the 8-worker ones: the 4-worker prediction
    # (900) moved to the measured mean (1000).
    edited = _predictions()
    edited.loc[0, "throughput"] = 1000.0
    edit_time = start + datetime.timedelta(minutes=30)
    assert _write(path, edited, edit_time) != sha
    with caplog.at_level("WARNING"):
        t = _score(tmp_path, _runs(start), sha)
    order = dict(zip(t["workers"], t["order"], strict=True))
    assert order[4] == verify.Order.CHANGED_AFTER_RUNS.value
    # The file changed, but before these runs started: not the recorded prediction either.
    assert order[8] == verify.Order.CHANGED.value
    assert "not provably predicted before their runs" in caplog.text


def test_predictions_planned_after_the_runs_started_are_not_first(tmp_path: Path) -> None:
    sha = _write(tmp_path / "predictions.csv", _predictions(), PLANNED)
    # The 4-worker runs predate the plan (reused measurements), the 8-worker ones follow it.
    t = _score(tmp_path, _runs(PLANNED - datetime.timedelta(minutes=30)), sha)
    order = dict(zip(t["workers"], t["order"], strict=True))
    assert order[4] == verify.Order.PLANNED_AFTER_RUNS.value
    assert order[8] == verify.Order.PREDICTED_FIRST.value


def test_without_a_recorded_hash_or_start_times_nothing_is_proven(tmp_path: Path) -> None:
    sha = _write(tmp_path / "predictions.csv", _predictions(), PLANNED)
    runs = _runs(PLANNED + datetime.timedelta(minutes=5))
    assert set(_score(tmp_path, runs, "")["order"]) == {verify.Order.UNPROVEN.value}
    no_start = runs.drop(columns=["start_time"])
    assert set(_score(tmp_path, no_start, sha)["order"]) == {verify.Order.UNPROVEN.value}


def test_the_recorded_hash_is_checked_by_the_schema() -> None:
    from codl.config import build_plan, load_yaml
    from codl.errors import ConfigError

    cfg = load_yaml(Path(__file__).resolve().parent.parent / "config" / "loop-cpu.yaml")
    cfg["advisor"] = {"predictions": "p.csv", "predictions_sha256": "a" * 64}
    build_plan(cfg, source="verify.yaml")
    cfg["advisor"]["predictions_sha256"] = "not-a-hash"
    with pytest.raises(ConfigError, match=r"advisor\.predictions_sha256"):
        build_plan(cfg, source="verify.yaml")


def test_codl_advise_records_the_predictions_of_its_verification_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from codl.cli import advise as advise_cli
    from codl.config import build_plan, load_yaml
    from test_advise import _write_results
    from test_model import planted_tables

    runs, steps = planted_tables(repeats=2, steps=20)
    results = _write_results(tmp_path / "r", runs, steps, config=True)
    out, pred = tmp_path / "verify.yaml", tmp_path / "predictions.csv"
    argv = [str(results), "--boot", "0", "--out", str(out), "--predictions", str(pred)]
    assert advise_cli.main(argv) == 0
    cfg = load_yaml(out)
    assert cfg["advisor"]["predictions"] == str(pred)
    assert cfg["advisor"]["predictions_sha256"] == verify.file_sha256(pred)
    combined = {
        (s.pinning.policy.value, s.loader.workers)
        for s in build_plan(cfg).specs.values()
        if s.mode.value == "data+compute"
    }
    table = pd.read_csv(pred)
    assert set(zip(table["policy"], table["workers"], strict=True)) == combined
    assert table["advised"].sum() == 1
    capsys.readouterr()
    assert advise_cli.main([str(results), "--predictions", str(pred)]) == 2
    assert "--predictions needs --out" in capsys.readouterr().err
