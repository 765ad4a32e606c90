"""The ``launch_sleeps`` rule (workflow/rules/gil.smk): every run with the kernel's scheduler
record (``trace.sched_events``) reduced to one row: its factors, its block (``repeat``: block b
runs repeat b), its compute and throughput, its launch roles' sleeps by what ended them and the
GIL wait per step (``codl.analysis.pooled.run_row``, from ``codl.analysis.sleeps``), written as
``tables/gil_runs.csv``. The per-setting inflation over blocks is the ``pooled`` rule's
(``tables/pooled_inflation.csv``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import pandas as pd

from codl.analysis.pooled import KNOBS
from codl.outputs import output_unit
from codl.steps.pooled import runs_rows

log = logging.getLogger(__name__)

#: The table's columns, in order: those of the gil_runs.csv tables committed under results/
#: (made by the retired scripts/gil_experiment.py), so that a regenerated table compares with
#: them column for column, with every knob of a loading setting (``pooled.KNOBS``: a knob
#: added since, such as ``copy_ahead``, comes with it).
GIL_RUNS_COLUMNS: Final = (
    "run_id",
    "mode",
    *KNOBS,
    "repeat",
    "twin_id",
    "switch_interval_s",
    "compute_eff_ms_mean",
    "throughput_samples_s",
    "steps",
    "timer_sleeps_per_step",
    "timer_sleep_ms_p10",
    "timer_sleep_ms_p50",
    "timer_sleep_ms_p90",
    "timer_sleep_ms_per_step",
    "pin_memory_sleeps_per_step",
    "pin_memory_sleep_ms_per_step",
    "loader_sleeps_per_step",
    "loader_sleep_ms_per_step",
    "gil_wait_ms_per_step",
)


def gil_runs(
    traces: Sequence[Path], summaries: Sequence[Path], steps: Sequence[Path]
) -> pd.DataFrame:
    """One row per run (``GIL_RUNS_COLUMNS``), the three lists in the same run order."""
    rows = runs_rows(traces, summaries, steps)
    missing = [c for c in GIL_RUNS_COLUMNS if c not in rows]
    if missing:
        raise ValueError(f"run rows: no column {missing} (codl.analysis.pooled.run_row)")
    return rows[list(GIL_RUNS_COLUMNS)]


def gil_runs_to(
    *, traces: Sequence[Path], summaries: Sequence[Path], steps: Sequence[Path], table: Path
) -> pd.DataFrame:
    """Write ``gil_runs`` to ``table`` as one unit and return it."""
    runs = gil_runs(traces, summaries, steps)
    with output_unit([table], inputs=[*traces, *summaries, *steps], mkdir=True) as unit:
        runs.to_csv(unit.path(table), index=False)
    log.info("wrote %s (%d runs x %d columns)", table, len(runs), runs.shape[1])
    return runs
