"""The `blocks` section at run time: whether a block may start within the invocation's time
budget (the workflow's `block_start` checkpoint) and the table of the planned blocks (the
`block_progress` rule)."""

from __future__ import annotations

import csv
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codl.config import Block, held_of_planned
from codl.outputs import output_unit
from codl.paths import ResultPaths

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

BLOCK_COLUMNS = ["block", "runs", "analysed", "not_run", "held", "run_ids"]


def block_start_record(paths: ResultPaths, invocation: str, block: str) -> Path:
    """Where the `block_start` checkpoint records whether ``block`` started in ``invocation``:
    under logs/, per invocation, because every invocation decides afresh (a record Snakemake
    found from an earlier one would stand for this one's decision)."""
    return paths.logs / "block_start" / invocation / f"{block}.json"


def block_start_to(
    *, block: str, first: bool, deadline: float, budget_s: float, out: Path
) -> dict[str, Any]:
    """The `block_start` checkpoint: whether ``block`` may start, written to ``out``. The first
    block of an invocation always starts (a budget shorter than one block still measures one);
    a later one only while the clock is before ``deadline`` (the invocation's start plus its
    ``blocks.budget``, ``budget_s``). The workflow asks in block order, each after the block
    before it finished, so a block that does not start is followed by none."""
    now = time.time()
    started = first or now < deadline
    record = {
        "block": block,
        "started": started,
        "first": first,
        "budget_s": budget_s,
        "deadline": deadline,
        "checked_at": now,
    }
    with output_unit({"block start": out}, mkdir=True) as unit:
        unit.path(out).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if started:
        log.info("%s starts (%.0f s of the %g s budget left)", block, deadline - now, budget_s)
    else:
        log.info("%s does not start: the %g s budget is spent", block, budget_s)
    return record


def block_started(record: str | Path) -> bool:
    """Whether a `block_start` record lets its block start."""
    return bool(json.loads(Path(record).read_text(encoding="utf-8"))["started"])


def block_progress_to(rows: Sequence[dict[str, Any]], out: Path) -> pd.DataFrame:
    """The ``block_progress`` rule: the planned blocks (``codl.config.block_progress``) and
    whether each is analysed now and, if not, why (``not_run``), as one table whose ``held``
    column and log line say how many of the planned blocks the set's tables hold."""
    # Here, not at the top: the Snakefile imports this module at every parse, pandas ~0.7 s.
    import pandas as pd

    table = pd.DataFrame(list(rows), columns=BLOCK_COLUMNS)
    with output_unit({"blocks table": out}, mkdir=True) as unit:
        table.to_csv(unit.path(out), index=False)
    held = int(table["analysed"].sum())
    log.info(
        "%s analysed (%d of %d runs)%s",
        table["held"].iloc[0] if len(table) else "0 of 0 planned blocks",
        int(table.loc[table["analysed"], "runs"].sum()),
        int(table["runs"].sum()),
        "" if held == len(table) else "; the next invocation adds blocks and pools them again",
    )
    return table


def block_start_after(paths: ResultPaths, to_start: Sequence[Block], block: str) -> list[str]:
    """What the `block_start` checkpoint of ``block`` waits for: the last trace of the block
    before it among ``to_start`` (those the invocation may start, in order), so that the
    budget is checked when the block would start, not when the invocation does; none for the
    first, which always starts."""
    names = [b.name for b in to_start]
    i = names.index(block)
    return [str(paths.trace(to_start[i - 1].run_ids[-1]))] if i else []


def invocation_line(
    blocks: Sequence[Block],
    measured: int,
    to_start: int,
    *,
    per_invocation: int | None,
    budget_s: float | None,
) -> str:
    """What an invocation of the workflow says about its blocks as it starts."""
    limits = [f"blocks.per_invocation {per_invocation}"] if per_invocation is not None else []
    if budget_s is not None:
        limits.append(f"blocks.budget {budget_s:g} s, one after another")
    return (
        f"blocks: {held_of_planned(measured, len(blocks))} measured; this invocation may start "
        f"{to_start}" + (f" ({', '.join(limits)})" if limits else "")
    )


def held_line(table: Path) -> str:
    """The line an invocation ends with: what its blocks table says the tables hold."""
    with table.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    held = rows[0]["held"] if rows else "0 of 0 planned blocks"
    budget = sum(r["not_run"] == "budget" for r in rows)
    return f"{table}: the tables hold {held}" + (
        f"; {budget} not started, the budget spent (blocks.budget)" if budget else ""
    )
