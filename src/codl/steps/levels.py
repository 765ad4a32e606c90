"""Several invocations' pooled runs tables (one results directory each) reduced with the
invocation as a level (``codl.analysis.levels``) and written as one table: what ``codl
levels`` calls, and with the pooled tables the ``pool_invocations`` rule.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from codl.analysis import levels as lv
from codl.analysis import pooled as pl
from codl.errors import CodlError
from codl.outputs import output_unit

log = logging.getLogger(__name__)

# A workflow result set keeps its tables in tables/: the invocation is the set, not "tables".
_TABLES_DIR = "tables"


def invocation_name(table: Path) -> str:
    """The invocation a pooled runs table belongs to: the directory holding it
    (``results/nice-h200/a/tables/gil_runs.csv`` -> ``a``), above ``tables/`` in a result set
    (``results/x/tables/pooled_runs.csv`` -> ``x``)."""
    parent = table.resolve().parent
    return parent.parent.name if parent.name == _TABLES_DIR else parent.name


def read_invocations(tables: Sequence[Path]) -> dict[str, pd.DataFrame]:
    """Each table by its invocation's name; two tables of one name are refused (they would
    pool as one invocation)."""
    out: dict[str, pd.DataFrame] = {}
    for table in tables:
        if not table.is_file():
            raise CodlError(f"{table}: no such pooled runs table (pooled_runs.csv, gil_runs.csv)")
        name = invocation_name(table)
        if name in out:
            raise CodlError(
                f"{table}: a second table of invocation {name!r}; expected one table per "
                "results directory"
            )
        out[name] = pl.read_runs(table)
    return out


def levels_to(tables: Sequence[Path], out: Path) -> pd.DataFrame:
    """Write ``codl.analysis.levels.level_intervals`` of the invocations' ``tables`` to ``out``
    (CSV) and return it."""
    try:
        ratios = lv.invocation_ratios(read_invocations(tables))
        table = lv.level_intervals(ratios)
    except ValueError as e:
        raise CodlError(f"{', '.join(map(str, tables))}: {e}") from e
    with output_unit([out], inputs=list(tables), mkdir=True) as unit:
        table.to_csv(unit.path(out), index=False)
    log.info("wrote %s (%d rows x %d columns)", out, len(table), table.shape[1])
    return table


def invocations_to(
    tables: Sequence[Path], *, inflation_table: Path, throughput_table: Path, levels_table: Path
) -> pd.DataFrame:
    """A set's invocations pooled (the ``pool_invocations`` rule): their per-run tables as one
    (each invocation's blocks its own, ``codl.analysis.pooled.pool_runs``), the compute
    inflation per loading setting and the ring's throughput over the best torch setting of each
    block from it, and beside them the invocation as a level (``levels_to``'s table), written
    as one unit; the levels table is returned."""
    invocations = read_invocations(tables)
    if len(invocations) < 2:
        raise CodlError(
            f"{', '.join(map(str, tables))}: {len(invocations)} invocation(s); pooling over "
            "invocations needs at least 2"
        )
    try:
        runs = pl.pool_runs(list(invocations.values()))
        levels = lv.level_intervals(lv.invocation_ratios(invocations))
    except ValueError as e:
        raise CodlError(f"{', '.join(map(str, tables))}: {e}") from e
    made = {
        inflation_table: pl.inflation(runs),
        throughput_table: pl.throughput_versus_torch(runs),
        levels_table: levels,
    }
    with output_unit(list(made), inputs=list(tables), mkdir=True) as unit:
        for path, df in made.items():
            df.to_csv(unit.path(path), index=False)
    for path, df in made.items():
        log.info("wrote %s (%d rows x %d columns)", path, len(df), df.shape[1])
    return levels
