"""The interference map: where a node is data-bound, balanced or launch-bound.

One row per combined configuration of a sweep (loader workers x loader cost per sample x batch
size x policy, every other spec field as the runs had it): its per-rank throughput, the
throughput lost against the best setting of its slice of the sweep, the data-wait share of its
step, and the compute inflation against its compute twin at the mean and at p95, with the
two-level bootstrap intervals of ``compare.compare_stats`` (the statistics of
``comparison.csv``). A regime label says what limits the configuration:

- ``data-bound``: the training step waits for the loader (data wait >= ``data_wait_share`` of
  the step); any inflation of compute is hidden behind the wait;
- ``launch-bound``: the loader keeps up, and compute is slower than alone (the lower bound of
  the mean inflation's interval above ``inflation``): loader workers take the launch roles'
  CPU time;
- ``balanced``: neither.

A *slice* is what a user cannot choose when tuning the loader: the workload, its batch size and
its data set's cost; "best of the sweep" is the highest throughput over the workers, policies
and launch cores measured in that slice.

The data set's cost is not in the run tables (``summarize`` records no data set columns), so
callers add it from the plan: ``with_costs(runs, plan.specs)``. Pure functions: DataFrames in,
DataFrames out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.advisor.model import COMPUTE_TWIN
from codl.analysis import compare as cmp
from codl.errors import CodlError
from codl.spec import DatasetCost, RunSpec

#: Spec columns that do not split the sweep into slices: the settings the advisor chooses.
CHOSEN = ("policy", "launch_cores", "workers")
REGIMES = ("data-bound", "balanced", "launch-bound")
MAP_COLUMNS = (
    "mode",
    "cost",
    *cmp.GROUP_COLUMNS,
    *cmp.LOADER_COLUMNS,
    "runs",
    "twin_runs",
    "n_runs",
    "steps",
    "throughput",
    "best_throughput",
    "throughput_lost",
    "data_wait_share",
    "inflation_mean",
    "inflation_mean_lo",
    "inflation_mean_hi",
    "inflation_p95",
    "inflation_p95_lo",
    "inflation_p95_hi",
    "data_bound",
    "inflated",
    "regime",
)
_NEEDED_RUNS = ("run_id", "mode", "cost", "throughput_samples_s", "step_ms_mean")
_NEEDED_STEPS = ("run_id", "compute_eff_ms")


@dataclass(frozen=True, kw_only=True)
class RegimeRule:
    """Thresholds of the regime labels (module docstring)."""

    data_wait_share: float = 0.10
    inflation: float = 1.05

    def __post_init__(self) -> None:
        if not 0 < self.data_wait_share < 1:
            raise ValueError(f"data_wait_share: got {self.data_wait_share}, expected 0 < x < 1")
        if self.inflation < 1:
            raise ValueError(f"inflation: got {self.inflation}, expected >= 1")


def with_costs(runs: pd.DataFrame, specs: Mapping[str, RunSpec]) -> pd.DataFrame:
    """``runs`` with a ``cost`` column, the data set cost of each run's spec (``specs``:
    run_id -> spec, e.g. ``Plan.specs``); a run missing from ``specs`` is an error, since its
    cost would be a guess."""
    ids = runs["run_id"].astype(str)
    missing = sorted(set(ids) - set(specs))
    if missing:
        raise CodlError(
            f"runs.csv: {len(missing)} run(s) not in the config's plan ({', '.join(missing[:5])}"
            f"{'...' if len(missing) > 5 else ''}); map the results with the config they ran"
        )
    out = runs.copy()
    out["cost"] = [specs[i].dataset.cost.value for i in ids]
    return out


def _steady_arrays(steps: pd.DataFrame) -> dict[str, npt.NDArray[np.float64]]:
    """Per run: compute time of its steady-state steps (outliers out, as ``compare`` does)."""
    keep = ~steps["outlier"].fillna(False).astype(bool) if "outlier" in steps else True
    s = steps[keep]
    return {
        str(rid): g["compute_eff_ms"].dropna().to_numpy(np.float64)
        for rid, g in s.groupby("run_id")
    }


def _group_key(row: pd.Series) -> tuple[Any, ...]:
    # The cost too: a runs table without ids groups by its spec columns, which hold no cost.
    return (str(row[cmp.GROUP_ID]), row["cost"])


def _slice_key(row: pd.Series) -> tuple[Any, ...]:
    unchosen = row.copy()
    unchosen[list(CHOSEN)] = None
    return (*cmp.column_key(unchosen, str(row["mode"])), row["cost"])


def _inflation(
    arrays: Mapping[str, npt.NDArray[np.float64]],
    runs: list[str],
    twins: list[str],
    boot: int,
    seed: int,
) -> dict[str, float]:
    stats = cmp.compare_stats(
        [arrays.get(r, np.empty(0)) for r in runs],
        [arrays.get(r, np.empty(0)) for r in twins],
        n=boot,
        seed=seed,
    )
    out: dict[str, float] = {}
    for stat in ("mean", "p95"):
        row = stats.get(stat, {})
        out[f"inflation_{stat}"] = row.get("ratio", np.nan)
        out[f"inflation_{stat}_lo"] = row.get("ci_low", np.nan)
        out[f"inflation_{stat}_hi"] = row.get("ci_high", np.nan)
    return out


def _check(runs: pd.DataFrame, steps: pd.DataFrame) -> None:
    for table, df, cols in (("runs", runs, _NEEDED_RUNS), ("steps", steps, _NEEDED_STEPS)):
        missing = [c for c in cols if c not in df.columns]
        if missing:
            hint = " (add it with with_costs)" if "cost" in missing else ""
            raise CodlError(f"{table} table: missing column(s) {missing}{hint}")


def build_map(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    rule: RegimeRule | None = None,
    boot: int = cmp.BOOTSTRAP,
    seed: int = 0,
) -> pd.DataFrame:
    """The map table (``MAP_COLUMNS``): one row per combined configuration of ``runs`` (which
    carries a ``cost`` column, ``with_costs``), sorted by slice, policy and workers.
    A configuration without a compute twin keeps its row, its inflation NaN and its regime
    decided by the data wait alone."""
    rule = rule or RegimeRule()
    _check(runs, steps)
    r = cmp.with_twin_ids(runs[runs["mode"].isin([*COMPUTE_TWIN, *COMPUTE_TWIN.values()])])
    twin_groups = cmp.groups_by_id(r[r["mode"].isin(COMPUTE_TWIN.values())])
    combined = r[r["mode"].isin(COMPUTE_TWIN)]
    arrays = _steady_arrays(steps[steps["run_id"].isin(r["run_id"])])
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for index, row in combined.iterrows():
        groups.setdefault(_group_key(row), []).append(index)
    rows = []
    for labels in groups.values():
        members = combined.loc[labels]
        rows.append(_map_row(members.iloc[0], members, twin_groups, arrays, boot, seed))
    if not rows:
        return pd.DataFrame(columns=list(MAP_COLUMNS))
    table = pd.DataFrame(rows)
    return _label(_losses(table), rule)[list(MAP_COLUMNS)]


def _map_row(
    row: pd.Series,
    members: pd.DataFrame,
    twin_groups: Mapping[str, list[str]],
    arrays: Mapping[str, npt.NDArray[np.float64]],
    boot: int,
    seed: int,
) -> dict[str, Any]:
    mode = str(row["mode"])
    runs = members["run_id"].astype(str).tolist()
    twins = cmp.twin_runs(row, COMPUTE_TWIN[mode], twin_groups)
    world = members["world_size"].fillna(1) if "world_size" in members else 1
    wait = members.get("data_wait_ms_mean", np.nan)
    return {
        "mode": mode,
        "cost": row["cost"],
        **{c: row.get(c) for c in (*cmp.GROUP_COLUMNS, *cmp.LOADER_COLUMNS)},
        "runs": " ".join(runs),
        "twin_runs": " ".join(twins),
        "n_runs": len(runs),
        "steps": int(sum(len(arrays.get(x, ())) for x in runs)),
        # Per rank, as the model and advisor count it.
        "throughput": float(np.mean(members["throughput_samples_s"] / world)),
        "data_wait_share": float(np.mean(wait) / members["step_ms_mean"].mean()),
        **_inflation(arrays, runs, twins, boot, seed),
    }


def _losses(table: pd.DataFrame) -> pd.DataFrame:
    t = table.copy()
    keys = [_slice_key(x) for _, x in t.iterrows()]
    t["_slice"] = [str(k) for k in keys]
    t["best_throughput"] = t.groupby("_slice")["throughput"].transform("max")
    t["throughput_lost"] = 1 - t["throughput"] / t["best_throughput"]
    order = ["_slice", "policy", "workers"]
    return t.sort_values(order, kind="stable").drop(columns="_slice").reset_index(drop=True)


def _label(table: pd.DataFrame, rule: RegimeRule) -> pd.DataFrame:
    t = table.copy()
    t["data_bound"] = t["data_wait_share"] >= rule.data_wait_share
    t["inflated"] = t["inflation_mean_lo"].fillna(-np.inf) > rule.inflation
    t["regime"] = np.where(
        t["data_bound"], "data-bound", np.where(t["inflated"], "launch-bound", "balanced")
    )
    return t


def cost_order(cost: str) -> int:
    """Cheap to expensive, for axes and tables."""
    order = [c.value for c in DatasetCost]
    return order.index(cost) if cost in order else len(order)


#: The map's metrics as the figure shows them: column -> title.
MAP_METRICS = {
    "inflation_p95": "compute inflation, p95 (x alone)",
    "inflation_mean": "compute inflation, mean (x alone)",
    "throughput_lost": "throughput lost vs best of its slice",
}
#: Cell marks of the regimes in the figure (balanced cells carry none).
REGIME_MARKS = {"data-bound": "D", "launch-bound": "L", "balanced": ""}


@dataclass(frozen=True, kw_only=True)
class MapGrid:
    """One heat-map panel: rows are (cost, batch size) slices, columns loader workers."""

    rows: tuple[str, ...]
    workers: tuple[int, ...]
    values: npt.NDArray[np.float64]  # (rows, workers); NaN where not measured
    regimes: npt.NDArray[np.str_]  # (rows, workers); "" where not measured


def map_grid(table: pd.DataFrame, policy: str, metric: str) -> MapGrid:
    """The cells of one panel of the map figure: ``metric`` of ``policy``'s configurations.
    Slices are ordered cheap to expensive, then by batch size; a slice holding several modes or
    launch-core settings takes the first row of each cell (the table is sorted)."""
    t = table[table["policy"].astype(str) == policy].copy()
    t["_row"] = [f"{c}, batch {int(b)}" for c, b in zip(t["cost"], t["batch_size"], strict=True)]
    order = t.assign(_c=t["cost"].map(cost_order)).sort_values(["_c", "batch_size"])
    rows = tuple(dict.fromkeys(order["_row"]))
    workers = tuple(sorted(int(w) for w in t["workers"].unique()))
    values = np.full((len(rows), len(workers)), np.nan)
    regimes = np.full((len(rows), len(workers)), "", dtype=object)
    for _, r in t.iloc[::-1].iterrows():  # reversed: the first row of a cell is written last
        i, j = rows.index(r["_row"]), workers.index(int(r["workers"]))
        values[i, j] = float(r[metric])
        regimes[i, j] = str(r["regime"])
    return MapGrid(rows=rows, workers=workers, values=values, regimes=regimes.astype(str))
