"""The figures' own per-run tables, written by the summarize rule beside the run's other tables.

Two figures need more than the merged runs/steps/comparison/decomposition tables: the API-latency
CDF (every measured CUDA runtime call) and the step timeline (one step's spans, every thread).
Their tables (``api_calls.parquet``, ``timeline.parquet``) are made here from the trace's tables,
so the figures rule reads tables only and never reopens a trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from codl.analysis.chunked import ApiReduction
from codl.figures import data as figdata
from codl.spec import Mode
from codl.trace.schema import Phase, Table

# What a timeline table says about the step it shows, on every row (the title is built from it).
TIMELINE_KEYS = ("run_id", "mode", "policy", "workers", "step", "measured_steps", "pick")
# How the shown step was picked (``pick``): the step closest to the median step time; the
# closest of those in which a loader worker ran (a loader that keeps ahead idles through most
# steps, and a short run's loader has finished its batches before the last steps); or the
# closest, none of the nearest ``LOADER_CANDIDATES`` steps having a loader row.
MEDIAN, WITH_LOADER, NO_LOADER = "median", "with loader", "no loader"
LOADER_CANDIDATES = 50


def _cdf_label(spec: Mapping[str, Any]) -> str:
    mode = str(spec.get("mode"))
    label = "isolation" if mode == Mode.COMPUTE.value else mode
    label += f" / {spec['pinning']['policy']}"
    # The two sources perturb differently (Kineto far more): never pooled.
    return label + (" / callbacks" if spec["trace"].get("cuda_api") else " / Kineto")


def api_calls(
    tables: Mapping[str, pd.DataFrame],
    attrs: Mapping[str, Any],
    spec: Mapping[str, Any],
    api: ApiReduction | None = None,
) -> pd.DataFrame:
    """The measured CUDA runtime API calls of one run, labelled as the CDF groups them: one
    row per call from ``tables``, or, given the calls reduced (``api``), one row per name and
    latency bucket (``us`` its upper edge, ``calls`` how many), whose size does not grow with
    the run (``figdata.api_latencies`` says what the figure makes of either)."""
    run_id = str(attrs.get("run_id", ""))
    if api is not None:
        hist = api.names.frame()
        label = _cdf_label(spec) if len(hist) else ""
        return hist.assign(label=label, run_id=run_id)[["label", "run_id", "name", "us", "calls"]]
    cuda = tables[Table.CUDA]
    if not len(cuda):
        return figdata.api_latencies(cuda, "", warmup=0)
    warm = int(attrs.get("warmup_steps", 0))
    return figdata.api_latencies(cuda, _cdf_label(spec), warmup=warm, run_id=run_id)


def _rank0_steps(tables: Mapping[str, pd.DataFrame], attrs: Mapping[str, Any]) -> pd.DataFrame:
    warm = int(attrs.get("warmup_steps", 0))
    app = tables[Table.APP]
    return app[(app["phase"] == Phase.STEP.value) & (app["step"] >= warm) & (app["rank"] == 0)]


def _median_pick(st: pd.DataFrame) -> int:
    dur = (st["end_ns"] - st["start_ns"]).to_numpy()
    return int(np.argmin(np.abs(dur - np.median(dur))))


def timeline_window(
    tables: Mapping[str, pd.DataFrame], attrs: Mapping[str, Any]
) -> tuple[int, int] | None:
    """The [start, end) ns of the step closest to the median step time (None: no measured
    step): the rows of the big tables it needs, read by time window, are those."""
    steps = timeline_steps(tables, attrs)
    return (steps[0][1], steps[0][2]) if steps else None


def timeline_steps(
    tables: Mapping[str, pd.DataFrame], attrs: Mapping[str, Any]
) -> list[tuple[int, int, int]]:
    """Rank 0's measured steps as (step, start ns, end ns), closest to the median step time
    first (ties by step): the order in which ``timeline`` candidates are tried."""
    st = _rank0_steps(tables, attrs)
    if st.empty:
        return []
    dur = (st["end_ns"] - st["start_ns"]).to_numpy()
    off = np.abs(dur - np.median(dur))
    order = np.lexsort((st["step"].to_numpy(), off))
    cols = st[["step", "start_ns", "end_ns"]].to_numpy(dtype=np.int64)[order]
    return [(int(a), int(b), int(c)) for a, b, c in cols]


def timeline(
    tables: Mapping[str, pd.DataFrame],
    attrs: Mapping[str, Any],
    spec: Mapping[str, Any],
    *,
    step: int | None = None,
    pick: str = MEDIAN,
) -> pd.DataFrame:
    """Rank 0's measured ``step`` (default: the one closest to the run's median step time),
    as step-timeline bars, each row carrying :data:`TIMELINE_KEYS` (``pick``: how the step
    was chosen); empty when the run has no measured step."""
    st = _rank0_steps(tables, attrs)
    if st.empty:
        return pd.DataFrame(columns=[*figdata.TIMELINE_COLUMNS, *TIMELINE_KEYS])
    if step is None:
        step = int(st["step"].to_numpy()[_median_pick(st)])
    bars = figdata.timeline_bars(dict(tables), step=step)
    keys: dict[str, Any] = {
        "run_id": str(attrs.get("run_id", "")),
        "mode": str(spec.get("mode")),
        "policy": str(spec["pinning"]["policy"]),
        "workers": int(spec["loader"]["workers"]),
        "step": step,
        "measured_steps": len(st),
        "pick": pick,
    }
    return bars.assign(**keys)


def timeline_title(bars: pd.DataFrame) -> str:
    if bars.empty:
        return ""
    k = bars.iloc[0]
    placed = "kind" in bars and bool((bars["kind"] == "offcpu").any())
    pick = str(k.get("pick", MEDIAN))
    which = {
        WITH_LOADER: "of the steps in which a loader worker ran, the one closest to the run's "
        "median step time",
        NO_LOADER: "the step closest to the run's median step time (no loader worker ran in "
        f"it nor in the {LOADER_CANDIDATES} steps nearest the median)",
    }.get(pick, "the step closest to the run's median step time")
    return (
        f"Run {k['run_id']} ({k['mode']}, policy {k['policy']}, {k['workers']} workers), rank 0, "
        f"step {k['step']} of {k['measured_steps']} measured: {which},\n"
        "in the run closest to the median step time of its mode's runs "
        "(without CUDA tracing; with the kernel's scheduler record where one has it)"
        + ("\nhatched: the launch roles' time off their CPU, where it fell" if placed else "")
    )


def write_run_tables(
    tables: Mapping[str, pd.DataFrame],
    attrs: Mapping[str, Any],
    spec: Mapping[str, Any],
    *,
    api_calls_out: Path,
    timeline_out: Path,
    api: ApiReduction | None = None,
    step: int | None = None,
    pick: str = MEDIAN,
) -> dict[Path, pd.DataFrame]:
    """Write one run's figure tables (the timeline of ``step``, picked as ``pick`` says);
    returns them by path (for the caller's log)."""
    out = {
        api_calls_out: api_calls(tables, attrs, spec, api),
        timeline_out: timeline(tables, attrs, spec, step=step, pick=pick),
    }
    for path, df in out.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_parquet(path, index=False)
    return out
