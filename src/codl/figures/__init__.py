"""Every figure CoDL draws, by name: the one catalog the workflow's rules, the paths and the
registry read.

Light on purpose (no pandas, no matplotlib): the Snakefile imports it at every parse, and a Slurm
job parses the Snakefile again. ``codl.figures.registry`` binds each name to what it is drawn
from (``prepare``, pure: tables -> the frame shown, mostly ``codl.figures.data``) and how
(``draw``, ``codl.figures.draw``); a name without a binding fails at import.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FigureName(enum.StrEnum):
    """A figure's name: its file stem under ``results/figures/`` and its report entry."""

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


@dataclass(frozen=True)
class ReportLabels:
    """What the Snakemake report says of a run figure beside its caption, which is
    ``workflow/report/<name>.rst``."""

    subcategory: str  # "Interference" (how much) or "Mechanism" (why)
    shows: str
    statistic: str


#: Drawn for every result set by the `figures` rule, from the merged and per-run tables, in the
#: report's order; the rule's outputs and report entries are made from this (common.smk).
RUN_FIGURES: dict[FigureName, ReportLabels] = {
    FigureName.COMPONENT_DURATIONS: ReportLabels(
        "Interference", "isolation vs combined per component", "p95, 95 % CI per bar"
    ),
    FigureName.POLICY_HEATMAP: ReportLabels(
        "Interference",
        "throughput and compute inflation per policy x workers",
        "median; p95 ratio, 95 % CI",
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
