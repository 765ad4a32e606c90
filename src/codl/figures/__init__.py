"""Every figure CoDL draws, by name: the one catalog the workflow's rules, the paths and the
registry read, and which of them a run set gets (``plan_figures``: a figure whose data only a
tracing level records is drawn only where some run records it).

Light on purpose (no pandas, no matplotlib): the Snakefile imports it at every parse, and a Slurm
job parses the Snakefile again. ``codl.figures.registry`` binds each name to what it is drawn
from (``prepare``, pure: tables -> the frame shown, mostly ``codl.figures.data``) and how
(``draw``, ``codl.figures.draw``); a name without a binding fails at import.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from codl.spec import RunSpec


class FigureName(enum.StrEnum):
    """A figure's name: its file stem under ``results/<name>/figures/`` and its report entry."""

    COMPONENT_DURATIONS = "component_durations"
    API_LATENCY_CDF = "api_latency_cdf"
    LAUNCH_WAIT_VS_COMPUTE = "launch_wait_vs_compute"
    STEP_TIMELINE = "step_timeline"
    POLICY_HEATMAP = "policy_heatmap"
    STEP_TIME_DISTRIBUTIONS = "step_time_distributions"
    DECOMPOSITION = "decomposition"
    # The advisor's, drawn only when the config's `advisor` or `share` section asks for them.
    INTERFERENCE_MAP = "interference_map"
    PREDICTED_VS_MEASURED = "predicted_vs_measured"
    SHARE = "share"
    # A block experiment's, drawn by the `pooled` rule from its efficiency table.
    EFFICIENCY = "efficiency"


@dataclass(frozen=True)
class ReportLabels:
    """What the Snakemake report says of a run figure beside its caption, which is
    ``workflow/report/<name>.rst``."""

    subcategory: str  # "Interference" (how much) or "Mechanism" (why)
    shows: str
    statistic: str


#: Drawn by the `figures` rule, from the merged and per-run tables, in the report's order: each
#: for every result set but those of ``NEEDS_TRACE``, for a set whose runs record their data
#: (``plan_figures``). The rule's outputs and report entries are made from this (common.smk).
RUN_FIGURES: dict[FigureName, ReportLabels] = {
    FigureName.COMPONENT_DURATIONS: ReportLabels(
        "Interference",
        "isolation vs combined per component",
        "p95; 95 % CI on bars of >= 2 runs",
    ),
    FigureName.POLICY_HEATMAP: ReportLabels(
        "Interference",
        "throughput and compute inflation per policy x workers",
        "median; p95 ratio, 95 % CI where both arms have >= 2 runs",
    ),
    FigureName.STEP_TIME_DISTRIBUTIONS: ReportLabels(
        "Interference", "step-time distribution per mode and policy", "quartiles, p1-p99"
    ),
    FigureName.LAUNCH_WAIT_VS_COMPUTE: ReportLabels(
        "Mechanism", "launch-thread run-queue wait vs compute, per step", "every step"
    ),
    FigureName.DECOMPOSITION: ReportLabels(
        "Mechanism",
        "compute inflation and the parts that move with it",
        "mean, all and slowest 5 % steps",
    ),
    FigureName.STEP_TIMELINE: ReportLabels(
        "Mechanism", "one representative step, every thread", "one step"
    ),
    FigureName.API_LATENCY_CDF: ReportLabels(
        "Mechanism", "CUDA runtime API call latency", "empirical CDF"
    ),
}

#: The run figures whose data only some runs record, with the trace levels (``trace.<level>`` of a
#: spec, the runs table's column of that name) of which a run must record one for it. A run set
#: none of whose runs does gets no such figure: not an output of the `figures` rule, not drawn
#: (``run_figures``), rather than a figure that says it has nothing to show.
NEEDS_TRACE: dict[FigureName, tuple[str, ...]] = {
    # Per-call latencies come from the CUPTI callbacks or Kineto; a CPU run has neither.
    FigureName.API_LATENCY_CDF: ("cuda_api", "cupti"),
}
TRACE_LEVELS: tuple[str, ...] = tuple(dict.fromkeys(v for vs in NEEDS_TRACE.values() for v in vs))


def run_figures(traced: Collection[str]) -> list[FigureName]:
    """The run figures, in report order, of a run set whose runs record between them the trace
    levels ``traced`` (of ``TRACE_LEVELS``; others are ignored)."""
    return [
        n for n in RUN_FIGURES if n not in NEEDS_TRACE or not set(NEEDS_TRACE[n]).isdisjoint(traced)
    ]


def plan_figures(specs: Iterable[RunSpec]) -> list[FigureName]:
    """The run figures of a plan: ``run_figures`` of the levels its runs' specs switch on. Decided
    from the specs alone, before any run, so that the workflow's outputs are static."""
    return run_figures({lvl for s in specs for lvl in TRACE_LEVELS if getattr(s.trace, lvl)})
