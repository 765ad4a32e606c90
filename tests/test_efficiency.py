"""Pipeline efficiency (codl.analysis.efficiency) on runs whose answer is worked out by hand, and
the runs table's twins: those of the run's own block, never silently another block's."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from codl.analysis import compare as cmp
from codl.analysis import efficiency as eff

BATCH = 100


def run(
    rid: str,
    mode: str,
    block: str,
    tput: float,
    *,
    wait: float = 0.0,
    h2d: float = float("nan"),
    compute: float = float("nan"),
    launch: float = float("nan"),
    twins: tuple[str, str] = ("", ""),
) -> dict[str, object]:
    return {
        "run_id": rid,
        "mode": mode,
        "block": block,
        "throughput_samples_s": tput,
        "samples_per_step": BATCH,
        "data_wait_ms_mean": wait,
        "h2d_ms_mean": h2d,
        "compute_eff_ms_mean": compute,
        "launch_delay_ms": launch,
        "data_twin": twins[0],
        "compute_twin": twins[1],
    }


def fixture() -> pd.DataFrame:
    """Block b0: compute is the roofline (data alone 2000/s, compute alone 1000/s, the pipeline
    800/s). Block b1: the loader is (data alone 500/s, compute alone 1000/s, pipeline 400/s)."""
    return pd.DataFrame(
        [
            run("d0", "data", "b0", 2000.0, wait=50.0),
            run("c0", "compute", "b0", 1000.0, compute=80.0),
            run(
                "x0",
                "data+compute",
                "b0",
                800.0,
                wait=5,
                h2d=3,
                compute=90,
                launch=4,
                twins=("d0", "c0"),
            ),
            run("d1", "data", "b1", 500.0, wait=200.0),
            run("c1", "compute", "b1", 1000.0, compute=80.0),
            run("x1", "data+compute", "b1", 400.0, wait=120, h2d=3, compute=90, twins=("d1", "c1")),
        ]
    )


def test_compute_roofline_by_hand() -> None:
    r = eff.run_efficiency(fixture()).loc["x0"]
    assert r["limiting_part"] == "compute"
    assert r["efficiency"] == pytest.approx(0.8)
    assert (r["over_data"], r["over_compute"]) == pytest.approx((0.4, 0.8))
    # 125 ms per step against the compute twin's 100 ms.
    assert (r["step_time_ms"], r["roofline_step_ms"], r["lost_ms"]) == pytest.approx((125, 100, 25))
    # All of the data wait is lost (a compute-bound pipeline never waits), the copy too; the
    # compute span's 10 ms of inflation is 4 ms launch delay and 6 ms of the rest.
    parts = [r[c] for c in eff.LOST_COLUMNS]
    assert parts == pytest.approx([5, 3, 6, 4, 7])


def test_data_roofline_by_hand_and_an_unmeasured_launch_delay() -> None:
    r = eff.run_efficiency(fixture()).loc["x1"]
    assert r["limiting_part"] == "data"
    assert r["efficiency"] == pytest.approx(0.8)
    # Both ratios: the loader alone is the roofline, compute alone is far above it.
    assert (r["over_data"], r["over_compute"]) == pytest.approx((0.8, 0.4))
    assert r["lost_ms"] == pytest.approx(250 - 200)
    # A perfect pipeline still waits 100 ms (200 - 100) for the loader; 20 ms more is lost.
    assert r["lost_data_wait_ms"] == pytest.approx(20)
    assert math.isnan(r["lost_launch_delay_ms"]) and r["lost_compute_ms"] == pytest.approx(10)
    assert r["lost_unattributed_ms"] == pytest.approx(50 - 20 - 3 - 10)


def test_the_parts_add_up_to_the_gap() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for b in range(20):
        d, c = rng.uniform(300, 3000, size=2)
        rows += [
            run(f"d{b}", "data", f"b{b}", d, wait=rng.uniform(10, 90)),
            run(f"c{b}", "compute", f"b{b}", c, compute=rng.uniform(20, 80)),
            run(
                f"x{b}",
                "combined",
                f"b{b}",
                min(d, c) * rng.uniform(0.5, 1.0),
                wait=rng.uniform(0, 30),
                h2d=rng.uniform(0, 5),
                compute=rng.uniform(20, 90),
                launch=rng.choice([np.nan, rng.uniform(0, 3)]),
                twins=(f"d{b}", f"c{b}"),
            ),
        ]
    out = eff.run_efficiency(pd.DataFrame(rows))
    total = out[list(eff.LOST_COLUMNS)].fillna(0).sum(axis=1)
    np.testing.assert_allclose(total, out["lost_ms"], rtol=0, atol=1e-9)
    assert set(out["limiting_part"]) == {"data", "compute"}


def test_a_missing_or_foreign_twin_gives_no_efficiency_and_says_so() -> None:
    runs = fixture()
    runs = runs[runs["run_id"] != "d0"]
    runs.loc[runs["run_id"] == "x1", "compute_twin"] = "c0"  # compute alone of block b0
    out = eff.run_efficiency(runs)
    assert math.isnan(out.loc["x0", "efficiency"])
    assert "no data-alone twin in block b0 (d0 did not run)" in out.loc["x0", "efficiency_note"]
    assert math.isnan(out.loc["x1", "efficiency"])
    assert "ran in another block (b0)" in out.loc["x1", "efficiency_note"]


def test_over_blocks_geometric_mean_with_interval_and_the_limiting_part() -> None:
    per_run = eff.run_efficiency(fixture()).assign(setting="s")
    per_run["block"] = ["b0", "b1"]
    per_run["throughput_samples_s"] = [800.0, 400.0]
    per_run.loc["x1", "efficiency"] = 0.9
    table = eff.efficiency_over_blocks(per_run, ["setting"])
    row = table.iloc[0]
    assert row["efficiency"] == pytest.approx(math.sqrt(0.8 * 0.9))
    assert row["efficiency_lo"] < row["efficiency"] < row["efficiency_hi"]
    assert (row["n_blocks"], row["n_runs"], row["n_missing"]) == (2, 2, 0)
    # One block each: the tie is said, not hidden.
    assert row["limiting_part"] == "mixed (compute 1, data 1 of 2 blocks)"
    assert row["lost_ms"] == pytest.approx((25 + 50) / 2)
    assert row["biggest_part"] == "data_wait"


def runs_table(blocks: int, *, drop: tuple[str, ...] = ()) -> pd.DataFrame:
    """A runs table as summarize writes it, of ``blocks`` repeats, each repeat a block: compute,
    data and data+compute runs whose ids are ``{mode}{repeat}``."""
    rows = []
    for b in range(blocks):
        for mode in ("compute", "data", "data+compute"):
            rid = f"{mode}{b}"
            if rid in drop:
                continue
            row = {
                "run_id": rid,
                "mode": mode,
                "repeat": b,
                "block": f"host#{b}",
                cmp.GROUP_ID: f"{mode}0",
                **dict.fromkeys(cmp.TWIN_COLUMNS),
                **dict.fromkeys(cmp.TWIN_GROUP_COLUMNS),
            }
            if mode == "data+compute":
                for twin in ("data", "compute"):
                    row[cmp.twin_column(twin)] = f"{twin}{b}"
                    row[cmp.twin_group_column(twin)] = f"{twin}0"
            rows.append(row)
    return pd.DataFrame(rows)


def test_twins_are_those_of_the_runs_own_block() -> None:
    out = cmp.own_block_twins(runs_table(2)).set_index("run_id")
    assert out.loc["data+compute1", "twin_compute"] == "compute1"
    assert out.loc["data+compute1", "twin_data"] == "data1"
    assert out.loc["data+compute0", "twin_compute"] == "compute0"
    assert (out[cmp.TWIN_NOTE] == "").all()


def test_a_runs_table_of_group_ids_gets_its_own_block_twins() -> None:
    # Runs tables written before the own-block ids held the twins' group ids (repeat 0's run).
    old = runs_table(2).drop(columns=list(cmp.TWIN_GROUP_COLUMNS))
    loads = old["mode"] == "data+compute"
    old.loc[loads, "twin_compute"] = "compute0"
    old.loc[loads, "twin_data"] = "data0"
    out = cmp.own_block_twins(old).set_index("run_id")
    assert out.loc["data+compute1", "twin_compute"] == "compute1"
    assert out.loc["data+compute1", cmp.TWIN_NOTE] == ""


def test_a_missing_own_block_twin_is_empty_and_noted(caplog: pytest.LogCaptureFixture) -> None:
    out = cmp.own_block_twins(runs_table(2, drop=("compute1",))).set_index("run_id")
    assert out.loc["data+compute1", "twin_compute"] is None
    note = out.loc["data+compute1", cmp.TWIN_NOTE]
    assert "no compute twin in block host#1 (compute1 did not run)" in note
    assert "its repeats ran in host#0" in note
    assert "compute1 did not run" in caplog.text
    # The comparison still pairs within blocks: block 1 has no pair, block 0 has.
    assert out.loc["data+compute0", "twin_compute"] == "compute0"


def test_runs_table_efficiency_columns_from_own_block_twins() -> None:
    table = runs_table(2)
    speed = {"compute": 1000.0, "data": 2000.0, "data+compute": 800.0}
    table["throughput_samples_s"] = table["mode"].map(speed)
    table["batch_size"], table["world_size"] = BATCH, 1
    table["data_wait_ms_mean"] = table["mode"].map({"data": 50.0, "data+compute": 5.0})
    table["h2d_ms_mean"] = table["mode"].map({"data+compute": 3.0})
    table["compute_eff_ms_mean"] = table["mode"].map({"compute": 80.0, "data+compute": 90.0})
    decomposition = pd.DataFrame(
        {"run_id": ["data+compute0", "data+compute1"], "host_launch_delay_ms": [4.0, 4.0]}
    )
    out = eff.with_run_efficiency(table, decomposition).set_index("run_id")
    assert out.loc["data+compute1", "efficiency"] == pytest.approx(0.8)
    assert out.loc["data+compute1", "lost_unattributed_ms"] == pytest.approx(7)
    assert np.isnan(out.loc["compute1", "efficiency"])
    comparison = pd.DataFrame({"runs": ["data+compute0 data+compute1", "compute0"]})
    got = eff.with_group_efficiency(comparison, out.reset_index())
    assert got.loc[0, "efficiency"] == pytest.approx(0.8)
    assert got.loc[0, "efficiency_blocks"] == 2 and got.loc[0, "limiting_part"] == "compute"
    assert np.isnan(got.loc[1, "efficiency"])


def test_the_advice_reports_the_best_settings_efficiency_and_its_roofline() -> None:
    from codl.advisor.advise import MeasuredSetting, efficiency_lines

    table = runs_table(2)
    speed = {"compute": 1000.0, "data": 500.0, "data+compute": 400.0}
    table["throughput_samples_s"] = table["mode"].map(speed)
    table["batch_size"], table["world_size"] = BATCH, 1
    table["data_wait_ms_mean"] = table["mode"].map({"data": 200.0, "data+compute": 120.0})
    table["h2d_ms_mean"] = table["mode"].map({"data+compute": 3.0})
    table["compute_eff_ms_mean"] = table["mode"].map({"compute": 80.0, "data+compute": 90.0})
    table["policy"], table["workers"] = "none", 4
    runs = eff.with_run_efficiency(table, pd.DataFrame())
    best = MeasuredSetting(policy="none", workers=4, launch_cores=None, throughput=400, runs=2)
    lines = efficiency_lines(runs, best, mode="data+compute")
    text = "\n".join(lines)
    assert "efficiency of the best setting measured: 0.80" in text and "over 2 blocks" in text
    assert "its roofline is data alone: 0.80x data alone, 0.40x compute alone" in text
    assert "the most of it data wait (20.0 ms)" in text
    # Runs without a roofline: nothing said.
    assert efficiency_lines(table, best, mode="data+compute") == []


@pytest.mark.parametrize("blocks", [0, 1, 2])
def test_the_efficiency_figure_draws_from_the_pooled_table(tmp_path: Path, blocks: int) -> None:
    from codl.figures import FigureName
    from codl.figures.registry import FigureInputs, draw_figure

    per_run = eff.run_efficiency(fixture()).assign(handoff="ring", policy="none", workers=12)
    per_run["block"] = ["b0", "b1"]
    per_run["throughput_samples_s"] = [800.0, 400.0]
    per_run = per_run.iloc[:blocks]
    table = eff.efficiency_over_blocks(per_run, ["handoff", "policy", "workers"])
    pngs = [tmp_path / "efficiency ü.png", tmp_path / "efficiency ü.pdf"]
    draw_figure(FigureName.EFFICIENCY, FigureInputs(efficiency=table), pngs)
    assert all(p.stat().st_size > 1000 for p in pngs)


def test_a_launch_delay_beyond_the_compute_inflation_is_not_time_lost() -> None:
    # A GPU ran queued kernels while the host was late: 6 ms of delay, 2 ms of inflation.
    runs = fixture()
    runs.loc[runs["run_id"] == "x0", ["compute_eff_ms_mean", "launch_delay_ms"]] = [82.0, 6.0]
    r = eff.run_efficiency(runs).loc["x0"]
    assert (r["lost_launch_delay_ms"], r["lost_compute_ms"]) == pytest.approx((2.0, 0.0))
    runs.loc[runs["run_id"] == "x0", "compute_eff_ms_mean"] = 78.0  # faster than alone
    r = eff.run_efficiency(runs).loc["x0"]
    assert (r["lost_launch_delay_ms"], r["lost_compute_ms"]) == pytest.approx((0.0, -2.0))
