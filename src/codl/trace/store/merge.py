"""Merging the per-rank traces of a multi-rank run into the run's one trace.

Each rank writes ``trace.rank<R>.h5``; rank 0 (or the local launcher) merges them onto rank 0's
clock, or, after a failed run, into one incomplete trace that keeps every rank's data.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.errors import TraceFormatError
from codl.trace.clock import TIME_COLUMNS, Alignment, alignment_of
from codl.trace.schema import TABLES
from codl.trace.store.files import incomplete_path
from codl.trace.store.layout import table_schema
from codl.trace.store.reader import Trace, open_trace
from codl.trace.store.writer import DEFAULT_COMPRESSION, RESERVED_ATTRS, TraceWriter

MERGE_TIMEOUT_S = 300.0
# Rows per block a merge reads: two sets of a block's arrays (54 B a row of events/cuda, one
# read into while the writer compresses the other) stay ~30 MiB.
_MERGE_ROWS: Final = 1 << 18


def rank_trace_path(trace_path: Path, rank: int) -> Path:
    return trace_path.with_name(f"{trace_path.stem}.rank{rank}{trace_path.suffix}")


# Per-rank provenance a merged trace keeps under ``ranks`` (as merge_rank_traces keeps it).
_RANK_ATTRS = ("host", "anchors_start", "anchors_end", "t_begin_ns", "t_end_ns", "placement")


def merge_incomplete_ranks(
    trace_path: Path,
    world: int,
    *,
    reason: str,
    run_id: str | None = None,
    compression: str = DEFAULT_COMPRESSION,
) -> Path | None:
    """After a multi-rank run stopped: every rank's data, from its complete or incomplete rank
    trace, in one trace marked incomplete (``<stem>.incomplete.h5``), whose reason names
    ``reason`` and each rank's own; the rank files it merged are removed. A rank file of
    another run (``run_id`` given) or of another rank is left in place, not merged. None when
    no rank left a readable file (killed before it could write: SIGKILL gives no say)."""
    parts = [
        (r, p)
        for r in range(world)
        for p in (rank_trace_path(trace_path, r), incomplete_path(rank_trace_path(trace_path, r)))
        if p.exists()
    ]
    base: dict[str, Any] = {}
    per_rank: list[dict[str, Any]] = []
    read: list[Path] = []
    writer = TraceWriter(trace_path, compression=compression)
    with writer:
        for r, p in parts:
            try:
                with open_trace(p, allow_incomplete=True) as t:
                    attrs = dict(t.attrs)
                    # Read through once before any row is appended: a file that fails part way
                    # is left whole for inspection, none of its rows merged (a rank's tables
                    # are too big to hold until they are known to be readable).
                    for _ in _rank_blocks(t, None):
                        pass
            except (OSError, TraceFormatError, KeyError, ValueError):
                continue  # unreadable: left in place for inspection, not merged
            if attrs.get("rank", r) != r or (run_id is not None and attrs.get("run_id") != run_id):
                continue  # not this run's rank r: left in place, not merged
            own = "complete" if attrs.get("complete") is True else attrs.get("incomplete_reason")
            kept_attrs = {k: attrs[k] for k in _RANK_ATTRS if k in attrs}
            per_rank.append(
                {**kept_attrs, "rank": r, "file": p.name, "stopped": str(own or "no reason")}
            )
            base = base or {k: v for k, v in attrs.items() if k not in RESERVED_ATTRS}
            with open_trace(p, allow_incomplete=True) as t:
                _append_rank(writer, t, None)
            read.append(p)
        if not read:
            writer.abort(reason, keep=False)
            return None
        ranks = "; ".join(f"rank {x['rank']}: {x['stopped']}" for x in per_rank)
        writer.set_attrs(**{**base, "ranks": per_rank, "world_size": world})
        kept = writer.abort(f"{reason} ({ranks})")
    for p in read:
        p.unlink()
    return kept


def _rank_blocks(
    t: Trace, alignment: Alignment | None
) -> Iterator[tuple[str, dict[str, npt.NDArray[Any]]]]:
    """(table, raw columns) of a rank trace, block by block in its row order, each block
    checked as ``Trace.verify`` checks it (codes, index ranges, the column digests after a
    table's last block, where the writer stored them), times moved onto rank 0's clock by
    ``alignment``. A rank of a day-long run holds 10^8 rows or more: never a table whole, and
    never a Python string per row (``sym`` columns stay codes into ``t.strings``)."""
    for name in TABLES:
        if name not in t.tables():
            continue
        for _, _, raw in t.verified_blocks(name, reuse=True, rows=_MERGE_ROWS):
            if alignment is None:
                yield name, raw
            else:
                yield (
                    name,
                    {
                        c: v - alignment.offset_at(v) if c in TIME_COLUMNS else v
                        for c, v in raw.items()
                    },
                )


def _append_rank(w: TraceWriter, t: Trace, alignment: Alignment | None) -> None:
    """Every row of rank trace ``t`` appended to ``w`` (``_rank_blocks``), its string codes
    turned into ``w``'s. Strings are interned in the order of their first row, table by table,
    as appending the decoded tables interned them."""
    ours = np.full(len(t.strings), -1, dtype=np.int64)
    for name, block in _rank_blocks(t, alignment):
        cols: dict[str, npt.NDArray[Any]] = {}
        for c in table_schema(name):
            values = block[c.name]
            if c.is_symbol:
                codes, firsts = pd.factorize(values)
                for code in firsts[ours[firsts] < 0]:
                    ours[code] = w.intern(t.strings[code])
                values = ours[firsts][codes]
            cols[c.name] = values
        if len(cols[table_schema(name)[0].name]):
            w.append(name, cols)


def check_rank_parts(parts: list[Path], *, run_id: str | None) -> None:
    """Refuse to merge rank traces that are not the ranks of one attempt of one run.

    Every part must be complete, be rank ``r`` of ``len(parts)``, carry the same run_id (the
    spec's, when given) and the same Slurm job (a stale part of an earlier attempt has another).
    Nothing is written or deleted when a check fails: the parts stay for inspection.
    """
    world = len(parts)
    first: dict[str, Any] = {}
    for r, p in enumerate(parts):
        with open_trace(p, allow_incomplete=True) as t:
            attrs = t.attrs
        if attrs.get("complete") is not True:
            reason = attrs.get("incomplete_reason", "no reason recorded")
            raise TraceFormatError(f"{p}: rank {r} did not finish ({reason}); nothing merged")
        if attrs.get("rank") != r or attrs.get("world_size") != world:
            raise TraceFormatError(
                f"{p}: holds rank {attrs.get('rank')!r} of {attrs.get('world_size')!r}, expected "
                f"rank {r} of {world}; nothing merged"
            )
        expected = run_id if run_id is not None else first.get("run_id")
        if expected is not None and attrs.get("run_id") != expected:
            raise TraceFormatError(
                f"{p}: rank {r} belongs to run {attrs.get('run_id')!r}, this run is {expected!r} "
                "(a rank trace of another run or an earlier attempt?); nothing merged"
            )
        if r == 0:
            first = attrs
        elif attrs.get("slurm_job_id", "") != first.get("slurm_job_id", ""):
            raise TraceFormatError(
                f"{p}: rank {r} ran in Slurm job {attrs.get('slurm_job_id')!r}, rank 0 in "
                f"{first.get('slurm_job_id')!r} (a stale rank trace of an earlier attempt); "
                "nothing merged"
            )


# Per-rank root attributes kept in the merged trace's ``ranks`` list.
RANK_ATTRS = (
    "rank",
    "host",
    "anchors_start",
    "anchors_end",
    "t_begin_ns",
    "t_end_ns",
    "placement",
    "placement_mismatches",
    "allowed_cpus",
    "job_cpus",
    "cpus_split",
    "sleep_ns",
    "cupti_alignment_ns",
    "clock_sync",
)


def _wait_for_parts(parts: list[Path]) -> None:
    deadline = time.monotonic() + MERGE_TIMEOUT_S
    while not all(p.exists() for p in parts):
        for r, p in enumerate(parts):
            aborted = incomplete_path(p)
            if not p.exists() and aborted.exists():
                # That rank failed and kept its data there: waiting for it is pointless.
                raise TraceFormatError(
                    f"rank {r} did not finish (its data is in {aborted}); nothing merged"
                )
        if time.monotonic() > deadline:
            missing = [str(p) for p in parts if not p.exists()]
            raise TraceFormatError(f"rank traces missing after {MERGE_TIMEOUT_S:.0f} s: {missing}")
        time.sleep(0.2)


def rank_alignments(per_rank: list[dict[str, Any]]) -> list[Alignment]:
    """Each rank's way onto rank 0's clock, from the ``clock_sync`` its run measured."""
    rank0 = per_rank[0].get("clock_sync") or {}
    clock0 = str(rank0.get("clock_id", ""))
    return [alignment_of(r, a.get("clock_sync"), clock0) for r, a in enumerate(per_rank)]


def merge_rank_traces(
    trace_path: Path,
    world: int,
    *,
    run_id: str | None = None,
    compression: str = DEFAULT_COMPRESSION,
) -> Path:
    """Merge the per-rank traces into one trace on rank 0's clock; per-rank provenance kept
    under ``ranks``, each rank's clock offset and its error bound under ``clock_alignment``."""
    parts = [rank_trace_path(trace_path, r) for r in range(world)]
    _wait_for_parts(parts)
    check_rank_parts(parts, run_id=run_id)
    per_rank: list[dict[str, Any]] = []
    for p in parts:
        with open_trace(p, allow_incomplete=True) as t:  # checked above; rank parts
            per_rank.append({k: v for k, v in t.attrs.items() if k in RANK_ATTRS})
    alignments = rank_alignments(per_rank)
    with TraceWriter(trace_path, compression=compression) as w:
        for r, p in enumerate(parts):
            with open_trace(p, allow_incomplete=True) as t:
                if r == 0:
                    # The writer's own (digest, completion) are written anew.
                    base = {k: v for k, v in t.attrs.items() if k not in RESERVED_ATTRS}
                try:
                    _append_rank(w, t, alignments[r])
                except TraceFormatError as e:
                    # A corrupt part: no merged trace (its digests would vouch for the damage),
                    # every part left as it is.
                    w.abort(str(e), keep=False)
                    raise TraceFormatError(f"{e}; nothing merged") from e
        for a, x in zip(alignments, per_rank, strict=True):
            for k in ("t_begin_ns", "t_end_ns"):
                x[k] = int(x[k] - a.offset_at(np.array([x[k]], dtype=np.int64))[0])
        base["t_begin_ns"] = min(int(x["t_begin_ns"]) for x in per_rank)
        base["t_end_ns"] = max(int(x["t_end_ns"]) for x in per_rank)
        base["ranks"] = per_rank
        base["world_size"] = world
        base["clock_alignment"] = {
            # Applied when every rank measured its offset (or shares rank 0's clock).
            "applied": all(a.measured for a in alignments),
            "reference": "CLOCK_MONOTONIC of rank 0",
            "ranks": [a.as_dict() for a in alignments],
        }
        w.set_attrs(**base)
        w.finish()
    for p in parts:
        p.unlink()
    return trace_path
