"""Repeats planned, not guessed: how many blocks a comparison needs for a target interval.

From a pilot's (or earlier results') runs table: per comparison (a multi-component run group
against its isolation twin, on the component's headline metric), the scatter of the per-block
log ratio of the per-run means, and the smallest number of blocks n whose 95 % Student-t
interval on the mean ratio (``runlevel.log_ratio_interval``) is at most +/- ``target_pp``
percentage points: ``100 * ratio * (exp(t(n-1) * sd / sqrt(n)) - 1) <= target_pp`` (the wider,
upper side). Where the pilot's runs share no block with their twins, the per-block scatter is
estimated unpaired, sd(log run) of both sides added in quadrature: what a block of one run and
one twin would scatter without the drift pairing removes, so an upper bound.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from codl.analysis.compare import (
    GROUP_ID,
    ISOLATION_MODES,
    LOADER_COLUMNS,
    MODE_COMPONENTS,
    groups_by_id,
    twin_runs,
    with_twin_ids,
)
from codl.analysis.runlevel import runs_blocks

# The metric each component's planned interval is on (the first of compare's metrics).
PLANNED_METRIC = {
    "compute": "compute_eff_ms",
    "data": "loader_item_ms",
    "comm": "allreduce_ms",
    "compute+comm": "compute_eff_ms",
}
MAX_REPEATS = 10_000
PLAN_COLUMNS = (
    "mode",
    "policy",
    *LOADER_COLUMNS,
    "component",
    "metric",
    "n_runs",
    "n_blocks",
    "paired",
    "ratio",
    "sd_log",
    "target_pp",
    "repeats",
    "run_s",
    "twin_run_s",
    "device_h",
)


def repeats_needed(
    sd_log: float, ratio: float, target_pp: float, *, level: float = 0.95
) -> int | None:
    """The fewest blocks (>= 2) whose t interval on the mean ratio is within +/- ``target_pp``
    percentage points, for per-block log ratios scattering ``sd_log`` around ``ratio``; None
    when not known (no scatter measured) or beyond ``MAX_REPEATS``."""
    if not (math.isfinite(sd_log) and math.isfinite(ratio) and ratio > 0 and target_pp > 0):
        return None
    for n in range(2, MAX_REPEATS + 1):
        half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd_log / math.sqrt(n)
        if 100 * ratio * math.expm1(half) <= target_pp:
            return n
    return None


def _run_seconds(runs: pd.DataFrame, ids: list[str]) -> float:
    """Mean step time of the runs (steps x mean step), seconds: start-up not counted."""
    rows = runs[runs["run_id"].astype(str).isin(ids)]
    if not {"steps", "step_ms_mean"} <= set(rows):
        return math.nan
    secs = pd.to_numeric(rows["steps"], errors="coerce") * pd.to_numeric(
        rows["step_ms_mean"], errors="coerce"
    )
    return float(secs.mean() / 1000) if secs.notna().any() else math.nan


def _values(
    runs: pd.DataFrame, ids: list[str], column: str, blocks: dict[str, str]
) -> list[tuple[str, float]]:
    rows = runs[runs["run_id"].astype(str).isin(ids)]
    vals = pd.to_numeric(rows[column], errors="coerce")
    return [
        (blocks.get(str(r), ""), float(v))
        for r, v in zip(rows["run_id"], vals, strict=True)
        if math.isfinite(v) and v > 0
    ]


def _scatter(
    comb: list[tuple[str, float]], twin: list[tuple[str, float]]
) -> tuple[float, float, int, bool]:
    """(geometric mean ratio, sd of the per-block log ratio, blocks, paired)."""
    both = sorted({b for b, _ in comb} & {b for b, _ in twin})
    if both:
        logs = [
            math.log(
                np.mean([v for b, v in comb if b == blk])
                / np.mean([v for b, v in twin if b == blk])
            )
            for blk in both
        ]
        sd = float(np.std(logs, ddof=1)) if len(logs) > 1 else math.nan
        return math.exp(float(np.mean(logs))), sd, len(both), True
    lc, lt = np.log([v for _, v in comb]), np.log([v for _, v in twin])
    if not len(lc) or not len(lt):
        return math.nan, math.nan, 0, False
    ratio = math.exp(float(lc.mean() - lt.mean()))
    if len(lc) < 2 or len(lt) < 2:
        return ratio, math.nan, 0, False
    return ratio, math.hypot(float(lc.std(ddof=1)), float(lt.std(ddof=1))), 0, False


def plan_repeats(runs: pd.DataFrame, target_pp: float, *, stat: str = "mean") -> pd.DataFrame:
    """One row per comparison of the runs table ``runs``: its ratio and per-block scatter on
    the component's ``PLANNED_METRIC`` (per-run ``stat`` column, e.g. ``compute_eff_ms_mean``),
    the blocks ``repeats`` needed for +/- ``target_pp`` points, and the device hours that
    costs (``repeats`` x (one run + one twin run), step time only)."""
    if runs.empty or "mode" not in runs:
        return pd.DataFrame(columns=list(PLAN_COLUMNS))
    ids = with_twin_ids(runs)
    groups = groups_by_id(ids)
    blocks = runs_blocks(ids)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _, r in ids.iterrows():
        mode, gid = str(r["mode"]), str(r[GROUP_ID])
        if mode in ISOLATION_MODES or mode not in MODE_COMPONENTS or gid in seen:
            continue
        seen.add(gid)
        world = r.get("world_size")
        for comp in MODE_COMPONENTS[mode]:
            if comp in ("comm", "compute+comm") and not (world and world > 1):
                continue
            column = f"{PLANNED_METRIC[comp]}_{stat}"
            twins = twin_runs(r, comp, groups)
            if column not in ids or not twins:
                continue
            comb = _values(ids, groups[gid], column, blocks)
            twin = _values(ids, twins, column, blocks)
            ratio, sd, n_blocks, paired = _scatter(comb, twin)
            n = repeats_needed(sd, ratio, target_pp)
            run_s, twin_s = _run_seconds(ids, groups[gid]), _run_seconds(ids, twins)
            rows.append(
                {
                    "mode": mode,
                    "policy": r.get("policy"),
                    **{c: r.get(c) for c in LOADER_COLUMNS},
                    "component": comp,
                    "metric": column,
                    "n_runs": len(comb),
                    "n_blocks": n_blocks,
                    "paired": paired,
                    "ratio": ratio,
                    "sd_log": sd,
                    "target_pp": target_pp,
                    "repeats": n,
                    "run_s": run_s,
                    "twin_run_s": twin_s,
                    "device_h": (n * (run_s + twin_s) / 3600) if n is not None else math.nan,
                }
            )
    return pd.DataFrame(rows, columns=list(PLAN_COLUMNS))
