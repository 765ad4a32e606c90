"""Isolation vs combined: match every multi-component run with its single-component twins.

Two runs match when their specs are equal once mode and repeat are set aside and fields the
isolation mode never reads are normalised (the `compute` twin of a `combined` run has no loader,
so its loader settings do not matter). Ratios are combined / isolation of the mean over runs of
each run's median, with a two-level bootstrap (runs, then steps within runs) for the confidence
interval, so one repeat still gets an honest interval from its step-to-step spread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

# What each component is judged by; every metric is "larger is worse".
COMPONENT_METRICS: dict[str, tuple[str, ...]] = {
    "compute": ("compute_eff_ms", "launch_wait_ms", "launch_kernel_us_mean", "step_ms"),
    # Per-item worker service time, not data_wait_ms: in isolation `data` mode the whole step is
    # data wait, so its data wait measures loader capacity while a combined run's measures
    # how far the loader falls behind compute; the two are not the same quantity.
    "data": ("loader_item_ms",),
    "comm": ("allreduce_ms",),
}
COMPONENT_OF_MODE = {"data": "data", "compute": "compute", "comm": "comm"}
MODE_COMPONENTS: dict[str, tuple[str, ...]] = {
    "data": ("data",),
    "compute": ("compute",),
    "comm": ("comm",),
    "compute+comm": ("compute", "comm"),
    "data+compute": ("data", "compute"),
    "combined": ("data", "compute", "comm"),
    "data+sleep": ("data",),
}
ISOLATION_MODES = frozenset(COMPONENT_OF_MODE)
LOADING_MODES = frozenset({"data", "data+compute", "combined", "data+sleep"})
# Spec columns that identify a group of repeats.
GROUP_COLUMNS = (
    "device",
    "model",
    "batch_size",
    "image_size",
    "precision",
    "policy",
    "launch_cores",
    "nodes",
    "ranks_per_node",
    "backend",
    "comm_pattern",
    "tier",
    "cupti",
    "cuda_api",
)
# Read only by modes that load; replaced by NO_LOADER for the others (the normalisation).
LOADER_COLUMNS = ("workers", "prefetch_factor", "pin_memory")
NO_LOADER: tuple[Any, ...] = (0, None, None)
BOOTSTRAP = 2000
RESULT_COLUMNS = (
    "mode",
    *GROUP_COLUMNS,
    *LOADER_COLUMNS,
    "component",
    "metric",
    "runs",
    "isolation_runs",
    "n_runs",
    "n_isolation_runs",
    "status",
    "isolation",
    "combined",
    "ratio",
    "ci_low",
    "ci_high",
)


def _norm(value: Any) -> Any:
    """A hashable, comparable form of a spec cell.

    Tables come back from parquet or CSV: a missing value may be None, NaN or pd.NA, and an
    integer column with a gap turns into floats. NaN != NaN would make two identical specs
    never match, so every missing value becomes None and integral floats become ints.
    """
    if value is None or value is pd.NA:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return int(value)
    return value


def _key(row: pd.Series, mode: str) -> tuple[Any, ...]:
    loader = (
        tuple(_norm(row.get(c)) for c in LOADER_COLUMNS) if mode in LOADING_MODES else NO_LOADER
    )
    return (mode, *(_norm(row.get(c)) for c in GROUP_COLUMNS), *loader)


def _normal_key(row: pd.Series) -> tuple[Any, ...]:
    return _key(row, str(row["mode"]))


def _two_level_draws(
    groups: Sequence[npt.NDArray[np.float64]], n: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """n bootstrap replicates of the mean over runs of each run's median.

    Level 1 resamples runs with replacement; level 2 resamples the steps of every picked run
    independently (a run picked twice gets two different step resamples).
    """
    g = len(groups)
    picks = rng.integers(0, g, size=(n, g))
    total = np.zeros(n)
    for j in range(g):
        for k, a in enumerate(groups):
            sel = np.flatnonzero(picks[:, j] == k)
            if sel.size:
                resampled = a[rng.integers(0, len(a), size=(sel.size, len(a)))]
                total[sel] += np.median(resampled, axis=1)
    return total / g


def bootstrap_ratio(
    num: Sequence[npt.NDArray[Any]],
    den: Sequence[npt.NDArray[Any]],
    *,
    n: int = BOOTSTRAP,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Ratio of means of per-run medians, and its 95 % two-level bootstrap interval.

    ``num``/``den`` hold one array of per-step values per run; NaN steps and empty runs are
    dropped. Deterministic for a given seed.
    """
    numc = [a[~np.isnan(a)] for a in (np.asarray(x, dtype=np.float64) for x in num)]
    denc = [a[~np.isnan(a)] for a in (np.asarray(x, dtype=np.float64) for x in den)]
    numc = [a for a in numc if len(a)]
    denc = [a for a in denc if len(a)]
    if not numc or not denc:
        return (np.nan, np.nan, np.nan)
    d = float(np.mean([np.median(a) for a in denc]))
    if d == 0:
        return (np.nan, np.nan, np.nan)
    point = float(np.mean([np.median(a) for a in numc])) / d
    rng = np.random.default_rng(seed)
    top = _two_level_draws(numc, n, rng)
    bottom = _two_level_draws(denc, n, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = top / bottom
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return (point, np.nan, np.nan)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return (point, float(lo), float(hi))


def _describe_missing(row: pd.Series, comp: str) -> str:
    loader = "" if comp not in LOADING_MODES else f", workers={_norm(row.get('workers'))}"
    return (
        f"missing isolation run: mode={comp} with model={row.get('model')}, "
        f"batch_size={_norm(row.get('batch_size'))}, policy={row.get('policy')}{loader}, "
        f"layout {_norm(row.get('nodes'))}x{_norm(row.get('ranks_per_node'))} "
        f"({row.get('backend')}), cupti={row.get('cupti')}, "
        f"cuda_api={row.get('cuda_api')} is not in the run set"
    )


def compare(steps: pd.DataFrame, summaries: pd.DataFrame) -> pd.DataFrame:
    """One row per (multi-component run group, component, metric) with ratio and CI.

    Groups whose isolation twin is missing get a row with ``status`` naming what is missing
    rather than silently disappearing. Repeats (and nothing else) of one spec form a group.
    """
    if summaries.empty or "mode" not in summaries:
        return pd.DataFrame(columns=list(RESULT_COLUMNS))
    by_key: dict[tuple[Any, ...], list[str]] = {}
    for _, r in summaries.iterrows():
        by_key.setdefault(_normal_key(r), []).append(str(r["run_id"]))
    values: dict[str, pd.DataFrame] = (
        {str(rid): g for rid, g in steps.groupby("run_id")} if "run_id" in steps else {}
    )
    rows: list[dict[str, Any]] = []
    done: set[tuple[Any, ...]] = set()
    for _, r in summaries.iterrows():
        mode = str(r["mode"])
        key = _normal_key(r)
        if mode in ISOLATION_MODES or mode not in MODE_COMPONENTS or key in done:
            continue
        done.add(key)
        runs = by_key[key]
        world = _norm(r.get("world_size"))
        # Single-rank runs do no collective, so there is no comm component to compare.
        comps = [c for c in MODE_COMPONENTS[mode] if not (c == "comm" and (world or 1) < 2)]
        for comp in comps:
            twins = by_key.get(_key(r, comp), [])
            for metric in COMPONENT_METRICS[comp]:
                base: dict[str, Any] = {
                    "mode": mode,
                    **{c: r.get(c) for c in GROUP_COLUMNS},
                    **{c: r.get(c) for c in LOADER_COLUMNS},
                    "component": comp,
                    "metric": metric,
                    "runs": " ".join(runs),
                    "isolation_runs": " ".join(twins),
                    "n_runs": len(runs),
                    "n_isolation_runs": len(twins),
                }
                if not twins:
                    rows.append(
                        base
                        | {
                            "status": _describe_missing(r, comp),
                            "isolation": np.nan,
                            "combined": np.nan,
                            "ratio": np.nan,
                            "ci_low": np.nan,
                            "ci_high": np.nan,
                        }
                    )
                    continue
                num = [_col(values, rid, metric) for rid in runs]
                den = [_col(values, rid, metric) for rid in twins]
                point, lo, hi = bootstrap_ratio(num, den)
                status = "ok" if np.isfinite(point) else "metric not measured"
                rows.append(
                    base
                    | {
                        "status": status,
                        "isolation": _mean_median(den),
                        "combined": _mean_median(num),
                        "ratio": point,
                        "ci_low": lo,
                        "ci_high": hi,
                    }
                )
    return pd.DataFrame(rows, columns=list(RESULT_COLUMNS))


def _col(values: dict[str, pd.DataFrame], rid: str, metric: str) -> npt.NDArray[np.float64]:
    g = values.get(rid)
    if g is None or metric not in g:
        return np.array([], dtype=np.float64)
    return pd.to_numeric(g[metric], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _mean_median(groups: Sequence[npt.NDArray[np.float64]]) -> float:
    meds = [float(np.nanmedian(a)) for a in groups if len(a) and not np.all(np.isnan(a))]
    return float(np.mean(meds)) if meds else np.nan


def missing_runs(expected: list[str], present: list[str]) -> list[str]:
    return sorted(set(expected) - set(present))
