"""The figures' own tables, and every figure as one registered (prepare, draw) pair.

Two figures need more than the merged runs/steps/comparison/decomposition tables: the API-latency
CDF (every measured CUDA runtime call) and the step timeline (one step's spans, every thread).
Their per-run tables are written by the summarize rule next to the run's other tables
(``api_calls.parquet``, ``timeline.parquet``), so the figures rule reads tables only and never
reopens a trace.

A figure is a :class:`Figure`: ``prepare`` turns the tables (:class:`FigureInputs`) into the frame
the figure shows (pure, DataFrames in and out), ``draw`` is the plotting function of
``codl.analysis.plots`` that takes it. :data:`FIGURES` lists them in drawing order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from codl.analysis import compare as cmp
from codl.analysis import decompose as dec
from codl.analysis import figdata, plots
from codl.paths import DECOMPOSITION_FIGURE
from codl.spec import Mode
from codl.trace.schema import Table

# What a timeline table says about the step it shows, on every row (the title is built from it).
TIMELINE_KEYS = ("run_id", "mode", "policy", "workers", "step", "measured_steps")


def api_calls(
    tables: Mapping[str, pd.DataFrame], attrs: Mapping[str, Any], spec: Mapping[str, Any]
) -> pd.DataFrame:
    """Every measured CUDA runtime API call of one run, labelled as the CDF groups them."""
    cuda = tables[Table.CUDA]
    if not len(cuda):
        return figdata.api_latencies(cuda, "", warmup=0)
    mode = str(spec.get("mode"))
    label = "isolation" if mode == Mode.COMPUTE.value else mode
    label += f" / {spec['pinning']['policy']}"
    # The two sources perturb differently (Kineto far more): never pooled.
    label += " / callbacks" if spec["trace"].get("cuda_api") else " / Kineto"
    warm = int(attrs.get("warmup_steps", 0))
    return figdata.api_latencies(cuda, label, warmup=warm, run_id=str(attrs.get("run_id", "")))


def timeline(
    tables: Mapping[str, pd.DataFrame], attrs: Mapping[str, Any], spec: Mapping[str, Any]
) -> pd.DataFrame:
    """Rank 0's measured step closest to the run's median step time, as step-timeline bars,
    each row carrying :data:`TIMELINE_KEYS`; empty when the run has no measured step."""
    warm = int(attrs.get("warmup_steps", 0))
    app = tables[Table.APP]
    st = app[(app["phase"].astype(str) == "step") & (app["step"] >= warm) & (app["rank"] == 0)]
    if st.empty:
        return pd.DataFrame(columns=[*figdata.TIMELINE_COLUMNS, *TIMELINE_KEYS])
    dur = (st["end_ns"] - st["start_ns"]).to_numpy()
    pick = int(np.argmin(np.abs(dur - np.median(dur))))
    step = int(st["step"].to_numpy()[pick])
    bars = figdata.step_timeline(dict(tables), step=step)
    keys: dict[str, Any] = {
        "run_id": str(attrs.get("run_id", "")),
        "mode": str(spec.get("mode")),
        "policy": str(spec["pinning"]["policy"]),
        "workers": int(spec["loader"]["workers"]),
        "step": step,
        "measured_steps": len(st),
    }
    return bars.assign(**keys)


def timeline_title(bars: pd.DataFrame) -> str:
    if bars.empty:
        return ""
    k = bars.iloc[0]
    placed = "kind" in bars and bool((bars["kind"] == "offcpu").any())
    return (
        f"Run {k['run_id']} ({k['mode']}, policy {k['policy']}, {k['workers']} workers), rank 0, "
        f"step {k['step']} of {k['measured_steps']} measured: the step closest to the run's "
        "median step time,\nin the run closest to the median step time of its mode's runs "
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
) -> dict[Path, pd.DataFrame]:
    """Write one run's figure tables; returns them by path (for the caller's log)."""
    out = {
        api_calls_out: api_calls(tables, attrs, spec),
        timeline_out: timeline(tables, attrs, spec),
    }
    for path, df in out.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_parquet(path, index=False)
    return out


@dataclass(frozen=True)
class FigureInputs:
    """The tables figures are drawn from: the merged tables and the per-run figure tables."""

    runs: pd.DataFrame
    steps: pd.DataFrame
    comparison: pd.DataFrame
    decomposition: pd.DataFrame
    api_calls: pd.DataFrame = field(default_factory=pd.DataFrame)
    timelines: pd.DataFrame = field(default_factory=pd.DataFrame)


@dataclass(frozen=True)
class Figure:
    name: str
    prepare: Callable[[FigureInputs], pd.DataFrame]
    draw: Callable[..., None]
    # Keyword arguments of ``draw`` beyond the frame and the outputs, from the same inputs.
    options: Callable[[FigureInputs], dict[str, Any]] = lambda _: {}
    # Whether the merged tables alone suffice (result sets without per-run tables).
    merged_only: bool = True


def _chosen_timeline(t: FigureInputs) -> pd.DataFrame:
    chosen = figdata.timeline_run(t.runs)
    bars = t.timelines
    if bars.empty or not chosen:
        return pd.DataFrame(columns=figdata.TIMELINE_COLUMNS)
    return bars[bars["run_id"] == chosen].reset_index(drop=True)


FIGURES: tuple[Figure, ...] = (
    Figure(
        "component_durations",
        lambda t: figdata.with_arm_intervals(cmp.headline(t.comparison), t.steps),
        plots.component_durations,
    ),
    Figure("launch_wait_vs_compute", lambda t: t.steps, plots.launch_wait_vs_compute),
    Figure("step_time_distributions", lambda t: t.steps, plots.step_time_distributions),
    Figure(
        "policy_heatmap",
        lambda t: figdata.heatmap_table(t.runs, t.comparison),
        plots.policy_heatmap,
    ),
    Figure(
        DECOMPOSITION_FIGURE,
        lambda t: figdata.decomposition_runs(
            dec.decomposition_means(t.decomposition), t.decomposition
        ),
        plots.decomposition,
    ),
    Figure("api_latency_cdf", lambda t: t.api_calls, plots.api_latency_cdf, merged_only=False),
    Figure(
        "step_timeline",
        _chosen_timeline,
        plots.step_timeline,
        options=lambda t: {"title": timeline_title(_chosen_timeline(t))},
        merged_only=False,
    ),
)


def concat(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Per-run tables as one; runs without rows add nothing (and no column dtype of theirs)."""
    kept = [f for f in frames if len(f)]
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame()
