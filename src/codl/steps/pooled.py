"""The ``pooled`` rule (workflow/rules/pooled.smk): a block experiment's runs reduced to the
per-run table, the compute inflation per loading setting over blocks, the ring hand-off's
throughput over the best torch setting of its block, the pipeline efficiency per setting
against the roofline of each block (``codl.analysis.pooled``), and the intervention and
efficiency figures (``codl.figures.intervention``, ``codl.figures.efficiency``), written as one
unit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from codl.analysis import chunked
from codl.analysis import efficiency as eff
from codl.analysis import pooled as pl
from codl.figures.efficiency import draw_efficiency, efficiency_points, lost_parts
from codl.figures.intervention import draw_intervention, host_blocked, inflation_points
from codl.outputs import output_unit
from codl.spec import RunSpec

log = logging.getLogger(__name__)


def _spec_of(attrs: Mapping[str, Any], trace: Path) -> RunSpec:
    spec = attrs.get("spec")
    data = json.loads(spec) if isinstance(spec, str) else spec
    if not isinstance(data, Mapping):
        raise ValueError(f"{trace}: the trace records no run spec (root attribute 'spec')")
    return RunSpec.from_dict(data, where=f"{trace}: spec")


def runs_rows(
    traces: Sequence[Path], summaries: Sequence[Path], steps: Sequence[Path]
) -> pd.DataFrame:
    """One ``codl.analysis.pooled.run_row`` per run, from its trace (the spec it ran, the
    scheduler record) and its summarize tables; the three lists are in the same run order."""
    if not len(traces) == len(summaries) == len(steps):
        raise ValueError(
            f"traces, summaries, steps: got {len(traces)}, {len(summaries)}, {len(steps)} "
            "paths, expected one of each per run"
        )
    rows = []
    for trace, summary, step in zip(traces, summaries, steps, strict=True):
        tables, attrs = chunked.read_summary_tables(trace)
        rows.append(
            pl.run_row(
                _spec_of(attrs, trace),
                summary=pd.read_parquet(summary),
                steps=pd.read_parquet(step),
                tables=tables,
                attrs=attrs,
            )
        )
    return pd.DataFrame(rows)


def pooled_to(
    *,
    traces: Sequence[Path],
    summaries: Sequence[Path],
    steps: Sequence[Path],
    decomposition: Path,
    runs_table: Path,
    inflation_table: Path,
    throughput_table: Path,
    efficiency_table: Path,
    figures: Sequence[Path],
    efficiency_figures: Sequence[Path],
    title: str = "",
) -> pd.DataFrame:
    """Reduce the runs (one results directory: ``source`` 0, a block per repeat) and write the
    four tables and the two figures (one file per path of ``figures`` and
    ``efficiency_figures``) as one unit; the inflation table is returned."""
    runs = runs_rows(traces, summaries, steps)
    table = pl.inflation(runs)
    versus = pl.throughput_versus_torch(runs)
    decomposed = pd.read_csv(decomposition)
    roofline = pl.efficiency(runs, eff.launch_delays(decomposed))
    points = inflation_points(table)
    blocked = host_blocked(decomposed, pl.with_knob_defaults(runs))
    tables = {
        runs_table: runs,
        inflation_table: table,
        throughput_table: versus,
        efficiency_table: roofline,
    }
    with output_unit(
        [*tables, *figures, *efficiency_figures],
        inputs=[*traces, *summaries, *steps, decomposition],
        mkdir=True,
    ) as unit:
        for path, df in tables.items():
            df.to_csv(unit.path(path), index=False)
        draw_intervention(points, blocked, [unit.path(f) for f in figures], title=title)
        draw_efficiency(
            efficiency_points(roofline),
            [unit.path(f) for f in efficiency_figures],
            parts=lost_parts(roofline),
        )
    for path, df in tables.items():
        log.info("wrote %s (%d rows x %d columns)", path, len(df), df.shape[1])
    log.info("wrote %s", ", ".join(str(f) for f in (*figures, *efficiency_figures)))
    return table
