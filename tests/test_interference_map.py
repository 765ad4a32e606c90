"""The interference map on planted runs: regimes, inflation and lost throughput are known."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from codl.advisor import interference_map as imap
from codl.analysis import compare as cmp
from codl.config import build_plan
from codl.errors import CodlError
from codl.figures import draw as plots

BATCH = 8
COMPUTE_MS = 100.0
SPEC_CELLS: dict[str, Any] = {
    "device": "cpu",
    "model": "resnet_tiny",
    "batch_size": BATCH,
    "image_size": 32,
    "precision": "fp32",
    "launch_cores": "auto",
    "nodes": 1,
    "ranks_per_node": 1,
    "backend": "gloo",
    "comm_pattern": "buckets",
    "tier": "default",
    "cupti": False,
    "cuda_api": False,
    "world_size": 1,
}
# (cost, policy, workers) -> (compute inflation, data wait ms per step): the planted truth.
PLANTED: dict[tuple[str, str, int], tuple[float, float]] = {
    ("light", "none", 1): (1.0, 40.0),  # one worker cannot feed compute: data-bound
    ("light", "none", 2): (1.0, 0.0),  # keeps up, no competition: balanced, the best
    ("light", "none", 4): (1.4, 0.0),  # keeps up, workers take the launch thread's CPU
    ("light", "shared", 2): (1.2, 0.0),  # launch-bound under the worst placement
    ("heavy", "none", 2): (1.0, 300.0),  # starved
    ("heavy", "none", 4): (1.3, 150.0),  # starved and inflated: the wait hides it
}
REGIMES = {
    ("light", "none", 1): "data-bound",
    ("light", "none", 2): "balanced",
    ("light", "none", 4): "launch-bound",
    ("light", "shared", 2): "launch-bound",
    ("heavy", "none", 2): "data-bound",
    ("heavy", "none", 4): "data-bound",
}


def _run(run_id: str, mode: str, policy: str, workers: int, cost: str, step: float) -> dict:
    return {
        "run_id": run_id,
        "mode": mode,
        "policy": policy,
        "workers": workers,
        "prefetch_factor": 2 if workers else None,
        "pin_memory": False if workers else None,
        "cost": cost,
        **SPEC_CELLS,
        "step_ms_mean": step,
        "throughput_samples_s": BATCH * 1000 / step,
    }


def planted(steps_per_run: int = 60, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    runs, steps = [], []

    def add(run: dict, compute: float, wait: float) -> None:
        c = compute * (1 + 0.01 * rng.standard_normal(steps_per_run))
        run["data_wait_ms_mean"] = wait
        runs.append(run)
        steps.append(pd.DataFrame({"run_id": run["run_id"], "compute_eff_ms": c, "outlier": False}))

    for policy in ("none", "shared"):  # compute twins: no loader, no cost
        add(_run(f"twin-{policy}", "compute", policy, 0, "standard", COMPUTE_MS), COMPUTE_MS, 0)
    for (cost, policy, workers), (infl, wait) in PLANTED.items():
        for rep in range(2):
            rid = f"{cost}-{policy}-{workers}-{rep}"
            step = COMPUTE_MS * infl + wait
            add(_run(rid, "data+compute", policy, workers, cost, step), COMPUTE_MS * infl, wait)
    return pd.DataFrame(runs), pd.concat(steps, ignore_index=True)


def _cell(table: pd.DataFrame, cost: str, policy: str, workers: int) -> pd.Series:
    hit = table[(table.cost == cost) & (table.policy == policy) & (table.workers == workers)]
    assert len(hit) == 1
    return hit.iloc[0]


def test_the_map_finds_the_planted_regimes_and_inflation() -> None:
    runs, steps = planted()
    table = imap.build_map(runs, steps, boot=300)
    assert list(table.columns) == list(imap.MAP_COLUMNS)
    assert len(table) == len(PLANTED)
    for (cost, policy, workers), (infl, wait) in PLANTED.items():
        row = _cell(table, cost, policy, workers)
        assert row.regime == REGIMES[(cost, policy, workers)], (cost, policy, workers)
        assert row.n_runs == 2 and row.twin_runs == f"twin-{policy}"
        assert row.inflation_mean == pytest.approx(infl, rel=0.01)
        assert row.inflation_mean_lo <= infl <= row.inflation_mean_hi
        assert row.inflation_p95 == pytest.approx(infl, rel=0.03)
        assert row.data_wait_share == pytest.approx(wait / (COMPUTE_MS * infl + wait))


def test_throughput_lost_is_against_the_best_of_the_same_cost() -> None:
    runs, steps = planted()
    table = imap.build_map(runs, steps, boot=50)
    light = table[table.cost == "light"]
    heavy = table[table.cost == "heavy"]
    # Each cost is its own slice: its best setting loses nothing.
    assert _cell(table, "light", "none", 2).throughput_lost == 0
    assert _cell(table, "heavy", "none", 4).throughput_lost == 0
    assert (light.best_throughput == BATCH * 1000 / COMPUTE_MS).all()
    assert (heavy.best_throughput == BATCH * 1000 / (COMPUTE_MS * 1.3 + 150)).all()
    over = _cell(table, "light", "none", 4)
    assert over.throughput_lost == pytest.approx(1 - 1 / 1.4)


def test_a_missing_twin_keeps_the_row_and_the_data_bound_label() -> None:
    runs, steps = planted()
    runs = runs[runs.run_id != "twin-shared"]
    table = imap.build_map(runs, steps, boot=50)
    row = _cell(table, "light", "shared", 2)
    assert np.isnan(row.inflation_mean) and row.twin_runs == ""
    assert row.regime == "balanced"  # no evidence of inflation without a twin
    assert _cell(table, "light", "none", 1).regime == "data-bound"


def test_the_map_pairs_runs_by_the_ids_summarize_wrote() -> None:
    runs, steps = planted()
    ids = runs.assign(
        **{
            cmp.GROUP_ID: runs["run_id"].str.replace(r"-\d$", "", regex=True),
            **dict.fromkeys(cmp.TWIN_COLUMNS),
        }
    )
    loads = ids["mode"] == "data+compute"
    ids.loc[loads, cmp.twin_column("compute")] = "twin-" + ids.loc[loads, "policy"]
    # The same pairs as the spec columns give: the same map.
    by_ids = imap.build_map(ids, steps, boot=50)
    pd.testing.assert_frame_equal(by_ids, imap.build_map(runs, steps, boot=50))
    # An id, not the columns, names the twin.
    ids.loc[ids["run_id"].str.startswith("light-none-2"), cmp.twin_column("compute")] = (
        "twin-shared"
    )
    assert _cell(imap.build_map(ids, steps, boot=50), "light", "none", 2).twin_runs == "twin-shared"


def test_thresholds_move_the_labels() -> None:
    runs, steps = planted()
    strict = imap.build_map(runs, steps, rule=imap.RegimeRule(inflation=1.3), boot=100)
    assert _cell(strict, "light", "none", 4).regime == "launch-bound"  # 1.4 > 1.3
    assert _cell(strict, "light", "shared", 2).regime == "balanced"  # 1.2 is not
    with pytest.raises(ValueError, match="data_wait_share"):
        imap.RegimeRule(data_wait_share=1.5)


def test_costs_come_from_the_plan_and_an_unknown_run_is_an_error() -> None:
    experiments = [
        {"name": cost, "base": {"dataset": {"name": cost, "cost": cost}}}
        for cost in ("light", "heavy")
    ]
    plan = build_plan(
        {
            "defaults": {"workload": {"batch_size": 4}, "dataset": {"samples": 8}},
            "experiments": experiments,
        }
    )
    specs = dict(plan.specs)
    runs = pd.DataFrame({"run_id": list(specs)})
    assert sorted(imap.with_costs(runs, specs)["cost"]) == ["heavy", "light"]
    with pytest.raises(CodlError, match=r"1 run\(s\) not in the config's plan"):
        imap.with_costs(pd.DataFrame({"run_id": ["feedfacecafe"]}), specs)
    no_cost = runs.assign(mode="compute", throughput_samples_s=1.0, step_ms_mean=1.0)
    with pytest.raises(CodlError, match=r"missing column\(s\) \['cost'\]"):
        imap.build_map(no_cost, pd.DataFrame(columns=["run_id", "compute_eff_ms"]))


def test_the_figure_grid_orders_slices_and_carries_the_regimes(tmp_path: Path) -> None:
    runs, steps = planted()
    table = imap.build_map(runs, steps, boot=50)
    grid = imap.map_grid(table, "none", "throughput_lost")
    assert grid.rows == (f"light, batch {BATCH}", f"heavy, batch {BATCH}")
    assert grid.workers == (1, 2, 4)
    assert list(grid.regimes[0]) == ["data-bound", "balanced", "launch-bound"]
    assert list(grid.regimes[1]) == ["", "data-bound", "data-bound"]
    assert np.isnan(grid.values[1, 0]) and grid.values[0, 1] == 0
    out = tmp_path / "map ü.png"
    plots.interference_map(table, [out])
    assert out.stat().st_size > 0
