"""File-level steps behind the workflow's analysis rules (read files, call pure functions, write).

The Snakemake scripts are adapters that call exactly one function of this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from codl.analysis import compare as cmp
from codl.analysis import figdata, plots
from codl.analysis.summarize import summarize_trace
from codl.errors import CodlError
from codl.paths import FIGURE_FORMATS
from codl.trace.store import open_trace


def summarize_to(trace: Path, *, steps: Path, summary: Path, attribution: Path) -> None:
    st, sm, at = summarize_trace(trace)
    for df, out in ((st, steps), (sm, summary), (at, attribution)):
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
    runs_table: Path,
    steps_table: Path,
    comparison_table: Path,
    attribution_table: Path,
) -> pd.DataFrame:
    summary = _read_all(summaries, "summary")
    step_df = _read_all(steps, "steps")
    attribution = _read_all(attributions, "attribution")
    comparison = cmp.compare(step_df, summary)
    for df, out in (
        (summary, runs_table),
        (step_df, steps_table),
        (comparison, comparison_table),
        (attribution, attribution_table),
    ):
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False)
    return comparison


def _outs(figdir: Path, name: str) -> list[Path]:
    return [figdir / f"{name}.{fmt}" for fmt in FIGURE_FORMATS]


def figures_to(
    *,
    runs_table: Path,
    steps_table: Path,
    comparison_table: Path,
    traces: Sequence[Path],
    figdir: Path,
) -> None:
    summary = pd.read_csv(runs_table)
    steps = pd.read_csv(steps_table)
    comparison = pd.read_csv(comparison_table)
    plots.component_durations(comparison, _outs(figdir, "component_durations"))
    plots.launch_wait_vs_compute(steps, _outs(figdir, "launch_wait_vs_compute"))
    plots.step_time_distributions(steps, _outs(figdir, "step_time_distributions"))
    plots.policy_heatmap(
        figdata.heatmap_table(summary, comparison), _outs(figdir, "policy_heatmap")
    )
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
            warm = int(t.attrs.get("warmup_steps", 0))
            mode = str(spec.get("mode"))
            cuda = t.table("events/cuda")
            if len(cuda):
                label = "isolation" if mode == "compute" else mode
                label += f" / {spec['pinning']['policy']}"
                # The two sources perturb differently (Kineto far more): never pooled.
                label += " / callbacks" if spec["trace"].get("cuda_api") else " / Kineto"
                api_frames.append(figdata.api_latencies(cuda, label, warmup=warm))
            if timeline.empty and mode in {"combined", "data+compute"}:
                tables = {n: t.table(n) for n in names}
                # The median-length measured step is the representative one.
                app = tables["events/app"]
                st = app[(app["phase"].astype(str) == "step") & (app["step"] >= warm)]
                if len(st):
                    dur = (st["end_ns"] - st["start_ns"]).to_numpy()
                    pick = int(np.argmin(np.abs(dur - np.median(dur))))
                    step = int(st["step"].to_numpy()[pick])
                    timeline = figdata.step_timeline(tables, step=step)
                    title = (
                        f"One {mode} step (run {t.attrs.get('run_id')}, step {step}, policy "
                        f"{spec['pinning']['policy']}, {spec['loader']['workers']} workers)"
                    )
    api = pd.concat(api_frames, ignore_index=True) if api_frames else pd.DataFrame()
    plots.api_latency_cdf(api, _outs(figdir, "api_latency_cdf"))
    plots.step_timeline(timeline, _outs(figdir, "step_timeline"), title=title)
