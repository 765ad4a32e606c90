"""Isolation vs combined: match every multi-component run with its single-component twins.

Two runs match when their specs are equal once mode and repeat are set aside and fields the
isolation mode never reads are normalised (the `compute` twin of a `combined` run has no loader,
so its loader settings do not matter). Ratios are combined / isolation of the mean over runs of
each run's median, with a two-level bootstrap (runs, then steps within runs) for the confidence
interval, so one repeat still gets an honest interval from its step-to-step spread.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

# What each component is judged by, and whether larger is worse.
COMPONENT_METRICS: dict[str, tuple[str, ...]] = {
    "compute": ("compute_eff_ms", "launch_wait_ms", "launch_kernel_us_mean", "step_ms"),
    "data": ("data_wait_ms", "loader_items_per_step_ms"),
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
# Spec columns that identify a group of repeats; `workers`/`prefetch_factor`/`pin_memory` are
# zeroed for modes that do not load (see summarize.spec_columns), which is the normalisation.
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
)
LOADER_COLUMNS = ("workers", "prefetch_factor", "pin_memory")
BOOTSTRAP = 2000


def _key(row: pd.Series, mode: str) -> tuple[Any, ...]:
    loads = mode in {"data", "data+compute", "combined", "data+sleep"}
    loader = tuple(row[c] for c in LOADER_COLUMNS) if loads else (0, None, None)
    return (mode, *(row[c] for c in GROUP_COLUMNS), *loader)


def _normal_key(row: pd.Series) -> tuple[Any, ...]:
    return _key(row, str(row["mode"]))


def bootstrap_ratio(
    num: list[np.ndarray], den: list[np.ndarray], *, n: int = BOOTSTRAP, seed: int = 0
) -> tuple[float, float, float]:
    """Ratio of means of per-run medians, and its 95 % two-level bootstrap interval."""
    num = [a[~np.isnan(a)] for a in num]
    den = [a[~np.isnan(a)] for a in den]
    num = [a for a in num if len(a)]
    den = [a for a in den if len(a)]
    if not num or not den:
        return (np.nan, np.nan, np.nan)
    point = float(np.mean([np.median(a) for a in num]) / np.mean([np.median(a) for a in den]))
    rng = np.random.default_rng(seed)

    def draw(groups: list[np.ndarray]) -> float:
        picks = rng.integers(0, len(groups), len(groups))
        return float(np.mean([np.median(rng.choice(groups[i], len(groups[i]))) for i in picks]))

    ratios = np.array([draw(num) / d if (d := draw(den)) else np.nan for _ in range(n)])
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return (point, np.nan, np.nan)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return (point, float(lo), float(hi))


def add_derived(steps: pd.DataFrame) -> pd.DataFrame:
    steps = steps.copy()
    if "loader_items" in steps:
        # Data component's speed as time per item: larger is worse, like every other metric.
        steps["loader_items_per_step_ms"] = steps["step_ms"] / steps["loader_items"]
    return steps


def compare(steps: pd.DataFrame, summaries: pd.DataFrame) -> pd.DataFrame:
    """One row per (multi-component run group, component, metric) with ratio and CI.

    Groups whose isolation twin is missing get a row with ``status`` naming what is missing
    rather than silently disappearing.
    """
    steps = add_derived(steps)
    by_key: dict[tuple[Any, ...], list[str]] = {}
    for _, r in summaries.iterrows():
        by_key.setdefault(_normal_key(r), []).append(str(r["run_id"]))
    values = {rid: g for rid, g in steps.groupby("run_id")}
    rows: list[dict[str, Any]] = []
    done: set[tuple[Any, ...]] = set()
    for _, r in summaries.iterrows():
        mode = str(r["mode"])
        key = _normal_key(r)
        if mode in {"data", "compute", "comm"} or key in done:
            continue
        done.add(key)
        runs = by_key[key]
        comps = [c for c in MODE_COMPONENTS[mode] if not (c == "comm" and int(r["world_size"]) < 2)]
        for comp in comps:
            twin_key = _key(r, comp)
            twins = by_key.get(twin_key, [])
            for metric in COMPONENT_METRICS[comp]:
                base: dict[str, Any] = {
                    "mode": mode,
                    **{c: r[c] for c in GROUP_COLUMNS},
                    **{c: r[c] for c in LOADER_COLUMNS},
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
                            "status": f"missing isolation run: mode={comp} with the same "
                            "workload, policy and layout is not in the config",
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
                iso = _mean_median(den)
                comb = _mean_median(num)
                status = "ok" if np.isfinite(point) else "metric not measured"
                rows.append(
                    base
                    | {
                        "status": status,
                        "isolation": iso,
                        "combined": comb,
                        "ratio": point,
                        "ci_low": lo,
                        "ci_high": hi,
                    }
                )
    return pd.DataFrame(rows)


def _col(values: dict[Any, pd.DataFrame], rid: str, metric: str) -> np.ndarray:
    g = values.get(rid)
    if g is None or metric not in g:
        return np.array([], dtype=float)
    return g[metric].to_numpy(dtype=float)


def _mean_median(groups: list[np.ndarray]) -> float:
    meds = [np.nanmedian(a) for a in groups if len(a) and not np.all(np.isnan(a))]
    return float(np.mean(meds)) if meds else np.nan


def missing_runs(expected: list[str], present: list[str]) -> list[str]:
    return sorted(set(expected) - set(present))
