"""The `launch_sleeps` rule on real CPU runs with the kernel's scheduler record: the GIL
experiment's per-run table (tables/gil_runs.csv) made by the workflow alone, in its default
target, for the runs that record the scheduler's events and no other."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from codl.config import build_plan
from codl.paths import ResultPaths
from codl.spec import Mode
from codl.steps.gil import GIL_RUNS_COLUMNS
from codl.steps.workflow import gil_targets, sched_event_runs
from test_sched_events import live_reason
from test_workflow import snakemake

pytestmark = pytest.mark.slow

CONFIG = {
    "name": "gil-cpu",
    "defaults": {
        "workload": {"batch_size": 4, "image_size": 32},
        "dataset": {"name": "gil-jpeg", "samples": 32, "height": 40, "width": 48},
        "loader": {"workers": 2, "pin_memory": True},
        "steps": {"warmup": 1, "measured": 3},
    },
    "experiments": [
        {
            "name": "gil",
            "base": {"trace": {"sched_events": True}},
            "factors": {"mode": ["compute", "data+compute"]},
        },
        # No scheduler record: a row of zero sleeps would read as no GIL wait.
        {"name": "plain", "factors": {"mode": ["data"]}},
    ],
}


def test_only_runs_with_the_record_get_a_row_and_no_record_no_target() -> None:
    specs = build_plan(CONFIG).specs
    recorded = sched_event_runs(specs, list(specs))
    assert sorted(specs[r].mode.value for r in recorded) == ["compute", "data+compute"]
    paths = ResultPaths(Path("w"), set_name="x")
    assert gil_targets(paths, recorded) == [str(paths.gil_runs_table)]
    assert gil_targets(paths, []) == []


def test_the_workflow_tables_every_recorded_run_beside_its_twin(tmp_path: Path) -> None:
    reason = live_reason()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path / "work dir é"
    workdir.mkdir()
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(CONFIG))
    paths = ResultPaths(workdir, set_name=CONFIG["name"])
    _, jobs = snakemake(workdir, cfg_path)  # the default target
    assert jobs["launch_sleeps"] == 1

    runs = pd.read_csv(paths.gil_runs_table)
    assert tuple(runs.columns) == GIL_RUNS_COLUMNS
    specs = build_plan(CONFIG).specs
    assert sorted(runs["run_id"]) == sorted(r for r, s in specs.items() if s.trace.sched_events)
    by_mode = runs.set_index("mode")
    loaded, twin = by_mode.loc[Mode.DATA_COMPUTE.value], by_mode.loc[Mode.COMPUTE.value]
    assert loaded["twin_id"] == twin["run_id"] and loaded["repeat"] == twin["repeat"] == 0
    for _, row in runs.iterrows():
        assert row["steps"] == CONFIG["defaults"]["steps"]["measured"]  # type: ignore[index]
        assert row["throughput_samples_s"] > 0 and row["compute_eff_ms_mean"] > 0
        assert math.isfinite(row["gil_wait_ms_per_step"]) and row["gil_wait_ms_per_step"] >= 0
        assert row["gil_wait_ms_per_step"] == pytest.approx(
            row["timer_sleep_ms_per_step"] + row["pin_memory_sleep_ms_per_step"]
        )
    assert "wrote " in paths.log("launch_sleeps").read_text()
