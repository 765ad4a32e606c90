"""codl.analysis.pooled on small hand-made runs tables: every pair inside its block, a missing
twin reported, the run row from a run's tables."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd
import pytest

from codl.analysis import efficiency as eff
from codl.analysis import pooled
from codl.config import build_plan
from codl.figures.intervention import draw_intervention, inflation_points
from codl.trace.schema import Table

SETTING = {
    "policy": "none",
    "switch_interval_ms": 5.0,
    "sharing_strategy": "file_descriptor",
    "pin_memory": True,
    "pin_memory_place": "own",
}
SLEEPS = {
    "gil_wait_ms_per_step": 1.0,
    "throughput_samples_s": 100.0,
    "timer_sleep_ms_p50": 5.0,
    "timer_sleeps_per_step": 0.2,
    "timer_sleep_ms_per_step": 1.0,
    "pin_memory_sleep_ms_per_step": 0.0,
}


def _twin(run_id: str, repeat: int, compute: float) -> dict[str, object]:
    return {
        **SETTING,
        "run_id": run_id,
        "mode": "compute",
        "repeat": repeat,
        "twin_id": "",
        "compute_eff_ms_mean": compute,
    }


def _loaded(run_id: str, repeat: int, twin: str, compute: float) -> dict[str, object]:
    return {
        **SETTING,
        **SLEEPS,
        "run_id": run_id,
        "mode": "data+compute",
        "repeat": repeat,
        "twin_id": twin,
        "compute_eff_ms_mean": compute,
    }


def test_a_twin_missing_from_its_block_is_reported_not_taken_from_another(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Block 1's loading run names t0, the twin of block 0: it must not be paired with it.
    runs = pd.DataFrame(
        [
            _twin("t0", 0, 10.0),
            _loaded("l0", 0, "t0", 12.0),
            _loaded("l1", 1, "t0", 30.0),
            _twin("t2", 2, 10.0),
            _loaded("l2", 2, "t2", 13.0),
        ]
    )
    with caplog.at_level(logging.WARNING, logger="codl.analysis.pooled"):
        t = pooled.inflation(runs)
    assert list(t.columns) == list(pooled.INFLATION_COLUMNS)
    row = t.iloc[0]
    assert len(t) == 1 and row["n_blocks"] == 2 and row["n_runs"] == 4
    assert row["n_unpaired"] == 1 and row["unpaired_blocks"] == "0:1"
    assert row["per_block"] == "+20.0 +30.0"
    assert row["inflation"] == pytest.approx(math.sqrt(1.2 * 1.3) - 1)
    assert "no twin in block(s) 0:1" in caplog.text


def test_pooled_tables_pair_only_inside_their_own_source() -> None:
    # Two results directories, both repeat 0: table 1's loading run names table 0's twin.
    first = pd.DataFrame([_twin("a-t", 0, 10.0), _loaded("a-l", 0, "a-t", 11.0)])
    second = pd.DataFrame([_twin("b-t", 0, 20.0), _loaded("b-l", 0, "a-t", 22.0)])
    runs = pooled.pool_runs([first, second])
    assert sorted(set(runs["source"])) == [0, 1]
    row = pooled.inflation(runs).iloc[0]
    assert row["n_blocks"] == 1 and row["per_block"] == "+10.0"
    assert row["unpaired_blocks"] == "1:0"


def test_a_setting_with_no_paired_block_keeps_its_row_without_a_number() -> None:
    t = pooled.inflation(pd.DataFrame([_twin("t0", 0, 10.0), _loaded("l1", 1, "t0", 12.0)]))
    row = t.iloc[0]
    assert row["n_blocks"] == 0 and row["n_unpaired"] == 1 and math.isnan(row["inflation"])


def test_two_runs_of_one_setting_in_a_block_are_refused() -> None:
    runs = pd.DataFrame(
        [_twin("t0", 0, 10.0), _loaded("l0", 0, "t0", 12.0), _loaded("m0", 0, "t0", 13.0)]
    )
    with pytest.raises(ValueError, match="two runs in a block"):
        pooled.inflation(runs)


def test_the_same_run_in_two_tables_is_refused() -> None:
    t = pd.DataFrame([_twin("t0", 0, 10.0)])
    with pytest.raises(ValueError, match=r"\['t0'\] appear in two"):
        pooled.pool_runs([t, t])


def test_tables_without_ring_runs_or_loading_runs_keep_their_columns() -> None:
    runs = pd.DataFrame([_twin("t0", 0, 10.0)])
    assert list(pooled.throughput_versus_torch(runs).columns) == list(pooled.THROUGHPUT_COLUMNS)
    assert pooled.inflation(runs).empty
    assert list(pooled.inflation(runs).columns) == list(pooled.INFLATION_COLUMNS)


def test_the_run_row_holds_the_factors_and_zero_gil_wait_without_the_record() -> None:
    cfg = {"experiments": [{"name": "x", "factors": {"mode": ["compute", "data+compute"]}}]}
    specs = {s.mode.value: s for s in build_plan(cfg).specs.values()}
    loaded = specs["data+compute"]
    steps = pd.DataFrame({"step": [1, 2, 3], "compute_eff_ms": [10.0, 11.0, 12.0]})
    tables = {Table.THREADS: pd.DataFrame(), Table.APP: pd.DataFrame()}
    row = pooled.run_row(
        loaded,
        summary=pd.DataFrame({"throughput_samples_s": [50.0]}),
        steps=steps,
        tables=tables,
        attrs={"warmup_steps": 1},
    )
    assert row["twin_id"] == specs["compute"].run_id == pooled.twin_id(loaded)
    assert row["compute_eff_ms_mean"] == pytest.approx(11.0) and row["steps"] == 3
    assert row["throughput_samples_s"] == 50.0 and row["gil_wait_ms_per_step"] == 0.0
    assert row["mode"] == "data+compute" and row["repeat"] == 0


def test_the_figure_says_so_when_no_setting_is_paired(tmp_path: Path) -> None:
    t = pooled.inflation(pd.DataFrame([_twin("t0", 0, 10.0), _loaded("l1", 1, "t0", 12.0)]))
    png = tmp_path / "f ü.png"
    draw_intervention(inflation_points(t), pd.DataFrame(), [png])
    assert png.stat().st_size > 1000


def test_one_block_draws_its_point_without_an_interval(tmp_path: Path) -> None:
    # A config of one repeat (config/smoke.yaml): one block, a ratio and no t interval.
    t = pooled.inflation(pd.DataFrame([_twin("t0", 0, 10.0), _loaded("l0", 0, "t0", 12.0)]))
    assert t["n_blocks"].iloc[0] == 1 and math.isnan(t["inflation_lo"].iloc[0])
    png = tmp_path / "f.png"
    draw_intervention(inflation_points(t), pd.DataFrame(), [png])
    assert png.stat().st_size > 1000


def _roofline_runs(block: int, *, data: float, compute: float, loaded: float) -> list[dict]:
    """A block of compute alone, data alone and data+compute (batch 100) with the given
    throughputs; the loading run computes 10 ms more than its twin and waits 5 ms."""
    common = {**SETTING, "repeat": block, "samples_per_step": 100.0, "h2d_ms_mean": 0.0}
    twin, alone = f"c{block}", f"d{block}"
    return [
        {**_twin(twin, block, 80.0), **common, "throughput_samples_s": compute,
         "data_twin_id": "", "data_wait_ms_mean": 0.0},
        {**_twin(alone, block, float("nan")), **common, "mode": "data",
         "throughput_samples_s": data, "data_twin_id": "", "data_wait_ms_mean": 50.0},
        {**_loaded(f"l{block}", block, twin, 90.0), **common, "throughput_samples_s": loaded,
         "data_twin_id": alone, "data_wait_ms_mean": 5.0},
    ]  # fmt: skip


def test_efficiency_over_blocks_against_each_blocks_roofline() -> None:
    runs = pd.DataFrame(
        _roofline_runs(0, data=2000.0, compute=1000.0, loaded=800.0)
        + _roofline_runs(1, data=2000.0, compute=1250.0, loaded=1125.0)
    )
    row = pooled.efficiency(runs, {"l0": 4.0}).iloc[0]
    # Each block against its own compute alone: 0.8 and 0.9, never 800/1250.
    assert row["per_block"] == "0.800 0.900"
    assert row["efficiency"] == pytest.approx(math.sqrt(0.8 * 0.9))
    assert row["n_blocks"] == 2 and row["limiting_part"] == "compute"
    assert row["over_data"] == pytest.approx(math.sqrt(0.4 * 1125 / 2000))
    assert row["lost_launch_delay_ms"] == pytest.approx(4.0 / 2)  # block 1 has none measured
    parts = sum(row[c] for c in eff.LOST_COLUMNS)
    assert parts == pytest.approx(row["lost_ms"])


def test_a_loading_run_without_its_data_twin_in_its_block_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = pd.DataFrame(
        _roofline_runs(0, data=500.0, compute=1000.0, loaded=400.0)
        + _roofline_runs(1, data=500.0, compute=1000.0, loaded=400.0)[:1]
        + [_roofline_runs(1, data=500.0, compute=1000.0, loaded=400.0)[2]]
    )
    with caplog.at_level(logging.WARNING):
        row = pooled.efficiency(runs, {}).iloc[0]
    assert (row["n_blocks"], row["n_missing"], row["missing_blocks"]) == (1, 1, "0:1")
    assert row["limiting_part"] == "data" and row["efficiency"] == pytest.approx(0.8)
    assert "no roofline in block(s) 0:1" in caplog.text


def test_efficiency_needs_a_runs_table_of_the_roofline() -> None:
    old = pd.DataFrame([_twin("t0", 0, 10.0), _loaded("l0", 0, "t0", 12.0)])
    with pytest.raises(ValueError, match="data_twin_id"):
        pooled.efficiency(old, {})
