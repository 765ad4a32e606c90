"""File-level steps behind the workflow's analysis rules (read files, call pure functions, write).

The Snakemake scripts are adapters that call exactly one function of this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from codl.analysis import compare as cmp
from codl.analysis import decompose as dec
from codl.analysis import figdata, plots
from codl.analysis import summarize as sm
from codl.analysis.steady import flag_outliers
from codl.errors import CodlError
from codl.paths import DECOMPOSITION_FIGURE, FIGURE_FORMATS
from codl.trace.clock import rank_bounds
from codl.trace.store import Trace, open_trace


def summarize_to(
    trace: Path, *, steps: Path, summary: Path, attribution: Path, parts: Path
) -> None:
    tables, attrs = sm.read_tables(trace)
    pt = dec.step_parts(
        tables,
        warmup=sm.warmup_steps(attrs),
        ranks_per_node=sm.ranks_per_node(attrs),
        clock_bound_ns=rank_bounds(attrs),
    )
    pt.insert(0, "run_id", str(attrs.get("run_id", "")))
    st, sm_, at = sm.summarize_tables(tables, attrs, parts=pt)
    for df, out in ((st, steps), (sm_, summary), (at, attribution), (pt, parts)):
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_parquet(out, index=False)


def _read_all(paths: Sequence[Path], kind: str) -> pd.DataFrame:
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise CodlError(f"missing {kind} files (their runs did not finish): {missing}")
    frames = [pd.read_parquet(p) for p in paths]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def compare_to(
    *,
    summaries: Sequence[Path],
    steps: Sequence[Path],
    attributions: Sequence[Path],
    parts: Sequence[Path],
    runs_table: Path,
    steps_table: Path,
    comparison_table: Path,
    attribution_table: Path,
    decomposition_table: Path,
) -> pd.DataFrame:
    summary = _read_all(summaries, "summary")
    step_df = _read_all(steps, "steps")
    attribution = _read_all(attributions, "attribution")
    part_df = _read_all(parts, "parts")
    comparison = cmp.compare(step_df, summary)
    decomposition = dec.decompose(step_df, part_df, summary)
    for df, out in (
        (summary, runs_table),
        (step_df, steps_table),
        (comparison, comparison_table),
        (attribution, attribution_table),
        (decomposition, decomposition_table),
    ):
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False)
    return comparison


def _outs(figdir: Path, name: str) -> list[Path]:
    return [figdir / f"{name}.{fmt}" for fmt in FIGURE_FORMATS]


def recompare_tables(
    *, runs_table: Path, steps_table: Path, comparison_table: Path, decomposition_table: Path
) -> pd.DataFrame:
    """Comparison and decomposition again from merged runs/steps tables alone (no traces).

    For result sets whose traces are not at hand (results/h200/): steps are flagged here when
    their table predates the flags, and the decomposition gets only what a steps table holds
    (``decompose.parts_from_steps``: the main thread's schedstat, not autograd, buckets or
    kernels).
    """
    summary = pd.read_csv(runs_table)
    steps = pd.read_csv(steps_table)
    if "outlier" not in steps:
        steps = flag_outliers(steps)
        steps.to_csv(steps_table, index=False)
    comparison = cmp.compare(steps, summary)
    decomposition = dec.decompose(steps, dec.parts_from_steps(steps), summary)
    comparison.to_csv(comparison_table, index=False)
    decomposition.to_csv(decomposition_table, index=False)
    return comparison


def table_figures_to(
    *,
    runs_table: Path,
    steps_table: Path,
    comparison_table: Path,
    decomposition_table: Path,
    figdir: Path,
) -> None:
    """The figures drawn from the merged tables alone."""
    summary = pd.read_csv(runs_table)
    steps = pd.read_csv(steps_table)
    comparison = pd.read_csv(comparison_table)
    decomposition = pd.read_csv(decomposition_table)
    plots.component_durations(
        figdata.with_arm_intervals(cmp.headline(comparison), steps),
        _outs(figdir, "component_durations"),
    )
    plots.launch_wait_vs_compute(steps, _outs(figdir, "launch_wait_vs_compute"))
    plots.step_time_distributions(steps, _outs(figdir, "step_time_distributions"))
    plots.policy_heatmap(
        figdata.heatmap_table(summary, comparison), _outs(figdir, "policy_heatmap")
    )
    plots.decomposition(
        figdata.decomposition_runs(dec.decomposition_means(decomposition), decomposition),
        _outs(figdir, DECOMPOSITION_FIGURE),
    )


def figures_to(
    *,
    runs_table: Path,
    steps_table: Path,
    comparison_table: Path,
    decomposition_table: Path,
    traces: Sequence[Path],
    figdir: Path,
) -> None:
    table_figures_to(
        runs_table=runs_table,
        steps_table=steps_table,
        comparison_table=comparison_table,
        decomposition_table=decomposition_table,
        figdir=figdir,
    )
    # The timeline's run is picked by a stated rule from the runs table, not by file order.
    chosen = figdata.timeline_run(pd.read_csv(runs_table))
    api_frames = []
    timeline = pd.DataFrame()
    title = ""
    names = (
        "events/app",
        "events/loader",
        "events/comm",
        "events/cuda",
        "samples/sched",
        "threads",
    )
    for path in traces:
        with open_trace(path) as t:
            spec = t.spec
            run_id = str(t.attrs.get("run_id", ""))
            warm = int(t.attrs.get("warmup_steps", 0))
            mode = str(spec.get("mode"))
            cuda = t.table("events/cuda")
            if len(cuda):
                label = "isolation" if mode == "compute" else mode
                label += f" / {spec['pinning']['policy']}"
                # The two sources perturb differently (Kineto far more): never pooled.
                label += " / callbacks" if spec["trace"].get("cuda_api") else " / Kineto"
                api_frames.append(figdata.api_latencies(cuda, label, warmup=warm, run_id=run_id))
            if run_id == chosen:
                timeline, title = _timeline_of(t, {n: t.table(n) for n in names}, warm)
    api = pd.concat(api_frames, ignore_index=True) if api_frames else pd.DataFrame()
    plots.api_latency_cdf(api, _outs(figdir, "api_latency_cdf"))
    plots.step_timeline(timeline, _outs(figdir, "step_timeline"), title=title)


def _timeline_of(t: Trace, tables: dict[str, pd.DataFrame], warm: int) -> tuple[pd.DataFrame, str]:
    """Rank 0's measured step closest to the run's median step time, and a title naming it."""
    app = tables["events/app"]
    st = app[(app["phase"].astype(str) == "step") & (app["step"] >= warm) & (app["rank"] == 0)]
    if st.empty:
        return pd.DataFrame(), ""
    dur = (st["end_ns"] - st["start_ns"]).to_numpy()
    pick = int(np.argmin(np.abs(dur - np.median(dur))))
    step = int(st["step"].to_numpy()[pick])
    spec = t.spec
    title = (
        f"Run {t.attrs.get('run_id')} ({spec.get('mode')}, policy {spec['pinning']['policy']}, "
        f"{spec['loader']['workers']} workers), rank 0, step {step} of {len(st)} measured: the "
        "step closest to the run's median step time,\nin the run closest to the median step "
        "time of its mode's runs (without CUDA tracing)"
    )
    return figdata.step_timeline(tables, step=step), title
