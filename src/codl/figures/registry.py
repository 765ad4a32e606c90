"""Every figure as one registered (prepare, draw) pair: the only way a figure is drawn.

A figure is a :class:`Figure`: ``prepare`` turns the tables (:class:`FigureInputs`) into the frame
the figure shows (pure, DataFrames in and out), ``draw`` is the plotting function of
``codl.figures.draw`` that takes it, ``options`` its keyword arguments beyond the frame and the
outputs. :data:`FIGURES` lists them in drawing order, one per :class:`codl.figures.FigureName`,
the advisor's included; :func:`draw_figure` draws one by name.

Two run figures need more than the merged runs/steps/comparison/decomposition tables: the
API-latency CDF and the step timeline read the per-run tables of ``codl.figures.run_tables``,
so the figures rule reads tables only and never reopens a trace.

A run figure of ``codl.figures.NEEDS_TRACE`` is drawn only for a run set in which some run records
its trace level (:func:`drawn_figures`, from the runs table): the same figures the workflow planned
as outputs from the specs (``codl.figures.plan_figures``), and no figure that only says it has
no data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from codl.advisor.verify import prediction_summary
from codl.analysis import compare as cmp
from codl.figures import NEEDS_TRACE, TRACE_LEVELS, FigureName, run_figures
from codl.figures import data as figdata
from codl.figures import draw as plots
from codl.figures.efficiency import draw_efficiency, efficiency_points, lost_parts
from codl.figures.run_tables import timeline_title
from codl.outputs import output_unit

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class FigureInputs:
    """The tables figures are drawn from: the merged tables, the per-run figure tables and the
    advisor's tables; each figure reads the ones its ``prepare`` names (the rest stay empty)."""

    runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    comparison: pd.DataFrame = field(default_factory=pd.DataFrame)
    decomposition: pd.DataFrame = field(default_factory=pd.DataFrame)
    api_calls: pd.DataFrame = field(default_factory=pd.DataFrame)
    timelines: pd.DataFrame = field(default_factory=pd.DataFrame)
    interference_map: pd.DataFrame = field(default_factory=pd.DataFrame)
    # advisor.verify.score_predictions of the verification runs
    predictions: pd.DataFrame = field(default_factory=pd.DataFrame)
    # steps.share.share_report of the shared-node runs, and its jobs in order
    share: pd.DataFrame = field(default_factory=pd.DataFrame)
    share_jobs: tuple[str, ...] = ()
    # codl.analysis.pooled.efficiency of a block experiment (tables/pooled_efficiency.csv)
    efficiency: pd.DataFrame = field(default_factory=pd.DataFrame)


def _no_options(_: FigureInputs) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Figure:
    name: FigureName
    prepare: Callable[[FigureInputs], pd.DataFrame]
    draw: Callable[..., None]
    # Keyword arguments of ``draw`` beyond the frame and the outputs, from the same inputs.
    options: Callable[[FigureInputs], dict[str, Any]] = _no_options
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
        FigureName.COMPONENT_DURATIONS,
        lambda t: figdata.with_arm_intervals(cmp.headline(t.comparison), t.steps),
        plots.component_durations,
    ),
    Figure(
        FigureName.LAUNCH_WAIT_VS_COMPUTE,
        lambda t: figdata.with_run_flags(t.steps, t.runs),
        plots.launch_wait_vs_compute,
    ),
    Figure(
        FigureName.STEP_TIME_DISTRIBUTIONS,
        lambda t: figdata.with_run_flags(t.steps, t.runs),
        plots.step_time_distributions,
    ),
    Figure(
        FigureName.POLICY_HEATMAP,
        lambda t: figdata.heatmap_table(t.runs, t.comparison),
        plots.policy_heatmap,
    ),
    Figure(
        FigureName.DECOMPOSITION,
        lambda t: figdata.decomposition_frame(t.decomposition, t.runs),
        plots.decomposition,
    ),
    Figure(
        FigureName.API_LATENCY_CDF, lambda t: t.api_calls, plots.api_latency_cdf, merged_only=False
    ),
    Figure(
        FigureName.STEP_TIMELINE,
        _chosen_timeline,
        plots.step_timeline,
        options=lambda t: {"title": timeline_title(_chosen_timeline(t))},
        merged_only=False,
    ),
    Figure(FigureName.INTERFERENCE_MAP, lambda t: t.interference_map, plots.interference_map),
    Figure(
        FigureName.PREDICTED_VS_MEASURED,
        lambda t: t.predictions,
        plots.predicted_vs_measured,
        options=lambda t: {"summary": prediction_summary(t.predictions)},
    ),
    Figure(
        FigureName.SHARE,
        lambda t: t.share,
        plots.share_throughput,
        options=lambda t: {"jobs": list(t.share_jobs)},
    ),
    Figure(
        FigureName.EFFICIENCY,
        lambda t: efficiency_points(t.efficiency),
        draw_efficiency,
        options=lambda t: {"parts": lost_parts(t.efficiency)},
    ),
)
BY_NAME: dict[FigureName, Figure] = {f.name: f for f in FIGURES}
_unbound = [n.value for n in FigureName if n not in BY_NAME]
if _unbound or len(BY_NAME) != len(FIGURES):
    raise RuntimeError(f"codl.figures.registry: every FigureName once in FIGURES; {_unbound}")


def drawn_figures(runs: pd.DataFrame) -> list[FigureName]:
    """The run figures of the run set of ``runs`` (the runs table): ``codl.figures.run_figures``
    of the trace levels its runs record, as its columns of those names say (summarize copies them
    from each run's spec, as ``plan_figures`` reads them)."""
    traced = [
        lvl
        for lvl in TRACE_LEVELS
        if lvl in runs and (runs[lvl].astype(str).str.lower() == "true").any()
    ]
    return run_figures(traced)


def draw_figure(name: FigureName, inputs: FigureInputs, outputs: Sequence[Path]) -> None:
    """Draw figure ``name`` from ``inputs`` into every path of ``outputs``; a figure of
    ``NEEDS_TRACE`` whose level no run of ``inputs.runs`` records is not drawn (no file)."""
    if name in NEEDS_TRACE and name not in drawn_figures(inputs.runs):
        log.info(
            "not drawing %s: no run records trace.%s", name, " or trace.".join(NEEDS_TRACE[name])
        )
        return
    # Logged before drawing: a figure that fails names itself as the last line of the log.
    log.info("drawing %s", ", ".join(str(p) for p in outputs))
    fig = BY_NAME[name]
    frame, options = fig.prepare(inputs), fig.options(inputs)
    # A figure's files (one per format) are one output unit: drawn into a temporary
    # directory, renamed into place together, or (a full disk) none of them and the old kept.
    with output_unit({f"figure {Path(p).name}": Path(p) for p in outputs}, mkdir=True) as unit:
        fig.draw(frame, [unit.path(Path(p)) for p in outputs], **options)
