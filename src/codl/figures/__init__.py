"""Every figure CoDL draws, by name: the one catalog the workflow's rules, the paths and the
registry read.

Light on purpose (no pandas, no matplotlib): the Snakefile imports it at every parse, and a Slurm
job parses the Snakefile again. ``codl.figures.registry`` binds each name to what it is drawn
from (``prepare``, pure: tables -> the frame shown, mostly ``codl.figures.data``) and how
(``draw``, ``codl.figures.draw``); a name without a binding fails at import.
"""

from __future__ import annotations

import enum


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


#: Drawn for every result set by the `figures` rule, from the merged and per-run tables; each
#: has its own report entry and caption (analysis.smk).
RUN_FIGURES: tuple[FigureName, ...] = (
    FigureName.COMPONENT_DURATIONS,
    FigureName.API_LATENCY_CDF,
    FigureName.LAUNCH_WAIT_VS_COMPUTE,
    FigureName.STEP_TIMELINE,
    FigureName.POLICY_HEATMAP,
    FigureName.STEP_TIME_DISTRIBUTIONS,
    FigureName.DECOMPOSITION,
)
