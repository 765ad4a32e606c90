"""Per-step metrics of the big event tables computed block by block, without the whole table.

A trace of an hour's training holds ~10^8 loader and CUDA API events per rank. These functions
read a table a block of rows at a time (the chunk index's blocks, ``Trace.block_ranges``),
reduce each block with numpy to per-(rank, step) partial sums and counts, and add the partials
up; the blocks can be spread over a process pool. Memory stays at one block per process plus
the per-step result, and the results equal ``summarize.loader_metrics`` (the per-stage sums)
and ``summarize.api_metrics`` up to float summation order (tests/test_chunked.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.analysis.summarize import (
    API_STEP_COLUMNS,
    KEYS,
    LOADER_ITEM_STAGES,
    SUMMARY_TABLES,
    warmup_steps,
)
from codl.trace.store import Trace, empty_frame, open_trace

LOADER_STAGES = (*LOADER_ITEM_STAGES, "collate")
LOADER_SUM_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    **{f"loader_{s}_ms": "float64" for s in LOADER_STAGES},
}
# Partial sums of one block: per (rank, step), a sum and a count per quantity.
_Partial = pd.DataFrame
_Reducer = Callable[[dict[str, npt.NDArray[Any]], list[str], int], _Partial]


_PARTIAL_COLUMNS = ["rank", "step", "sub", "sum", "n"]


def _empty_partial() -> _Partial:
    return pd.DataFrame(
        {c: pd.Series(dtype="float64" if c == "sum" else "int64") for c in _PARTIAL_COLUMNS}
    )


def _group_sums(
    rank: npt.NDArray[Any],
    step: npt.NDArray[Any],
    sub: npt.NDArray[np.int64],
    n_sub: int,
    weights: npt.NDArray[np.float64],
    keep: npt.NDArray[np.bool_],
) -> _Partial:
    """Per (rank, step, sub) over the rows where ``keep``: the sum of ``weights`` and the row
    count, as a partial frame of the groups that have rows.

    A block holds a few steps of a few ranks, so each row gets a dense bin number from the
    block's smallest rank and step (no sort, no hashing) and two bincounts do the rest; rows
    not kept go to one extra bin that is dropped. Sparse blocks fall back to np.unique.
    """
    if not keep.any():
        return _empty_partial()
    r0, s0 = int(rank.min()), int(step.min())
    n_r, n_s = int(rank.max()) - r0 + 1, int(step.max()) - s0 + 1
    bins = n_r * n_s * n_sub
    # In place on one int64 array: a block is ~10^6 rows, and each temporary costs a pass.
    gid = step.astype(np.int64)
    gid -= s0
    if n_r > 1:  # a rank's own trace has one rank: no rank term
        gid += (rank.astype(np.int64) - r0) * n_s
    gid *= n_sub
    gid += sub
    if bins > 4 * len(gid) + 1024:
        uniq, gid = np.unique(gid[keep], return_inverse=True)
        counts = np.bincount(gid, minlength=len(uniq))
        sums = np.bincount(gid, weights=weights[keep], minlength=len(uniq))
    else:
        gid[~keep] = bins
        counts = np.bincount(gid, minlength=bins + 1)[:bins]
        sums = np.bincount(gid, weights=weights, minlength=bins + 1)[:bins]
        uniq = np.flatnonzero(counts)
        counts, sums = counts[uniq], sums[uniq]
    rs, psub = np.divmod(uniq, n_sub)
    pr, ps = np.divmod(rs, n_s)
    return pd.DataFrame({"rank": pr + r0, "step": ps + s0, "sub": psub, "sum": sums, "n": counts})


def _code_lookup(strings: list[str], labels: Sequence[str]) -> npt.NDArray[np.int64]:
    """Per string-table code: the index of its string in ``labels``, or -1."""
    out = np.full(len(strings), -1, dtype=np.int64)
    for i, label in enumerate(labels):
        if label in strings:
            out[strings.index(label)] = i
    return out


def _loader_block(cols: dict[str, npt.NDArray[Any]], strings: list[str], warmup: int) -> _Partial:
    stage = _code_lookup(strings, LOADER_STAGES)[cols["stage"]]
    keep = (cols["step"] >= warmup) & (stage >= 0)
    ms = (cols["end_ns"] - cols["start_ns"]).astype(np.float64) / 1e6
    return _group_sums(cols["rank"], cols["step"], np.maximum(stage, 0), 4, ms, keep)


def _api_block(cols: dict[str, npt.NDArray[Any]], strings: list[str], warmup: int) -> _Partial:
    runtime = strings.index("runtime") if "runtime" in strings else -1
    launch = np.array(["LaunchKernel" in s for s in strings], dtype=np.int64)
    keep = (cols["step"] >= warmup) & (cols["kind"] == runtime)
    us = (cols["end_ns"] - cols["start_ns"]).astype(np.float64) / 1e3
    # Bins per step: 0 other runtime calls, 1 cudaLaunchKernel and its variants; the partial's
    # sub 0 is every runtime call (both bins), sub 1 the launches alone.
    part = _group_sums(cols["rank"], cols["step"], launch[cols["name"]], 2, us, keep)
    every = part.groupby(["rank", "step"], as_index=False)[["sum", "n"]].sum()
    every.insert(2, "sub", 0)
    return pd.concat([every, part[part["sub"] == 1]], ignore_index=True)


_TABLES: dict[str, tuple[str, list[str], _Reducer]] = {
    "loader": ("events/loader", ["rank", "step", "stage", "start_ns", "end_ns"], _loader_block),
    "api": ("events/cuda", ["rank", "step", "kind", "name", "start_ns", "end_ns"], _api_block),
}


def _reduce_ranges(args: tuple[str, str, Sequence[tuple[int, int]], int, int]) -> _Partial:
    """One worker's share: the partial sums of its row ranges (opens the trace itself).

    With ``threads`` > 1 the next range's chunks are read and decoded on threads while this
    one is reduced (zlib and numpy release the GIL), so one process uses several cores.
    """
    path, which, ranges, warmup, threads = args
    table, columns, reducer = _TABLES[which]
    parts = []
    with open_trace(path, allow_incomplete=True) as t:
        strings = t.strings
        if threads <= 1:
            for lo, hi in ranges:
                parts.append(reducer(t.read_rows(table, lo, hi, columns), strings, warmup))
        else:
            with (
                ThreadPoolExecutor(threads, thread_name_prefix="codl-decode") as decode,
                ThreadPoolExecutor(1, thread_name_prefix="codl-read") as reader,
            ):

                def read(r: tuple[int, int]) -> Future[dict[str, npt.NDArray[Any]]]:
                    return reader.submit(t.read_rows, table, r[0], r[1], columns, pool=decode)

                ahead = [read(ranges[0])] if ranges else []
                for i in range(len(ranges)):
                    cols = ahead.pop().result()
                    if i + 1 < len(ranges):
                        ahead.append(read(ranges[i + 1]))
                    parts.append(reducer(cols, strings, warmup))
    if not parts:
        return _empty_partial()
    return pd.concat(parts, ignore_index=True).groupby(["rank", "step", "sub"]).sum().reset_index()


def default_threads() -> int:
    """Decoding threads per process: the cores this process may run on."""
    return len(os.sched_getaffinity(0))


def step_partials(
    path: Path, which: str, *, warmup: int, processes: int = 1, threads: int = 1
) -> tuple[pd.DataFrame, int]:
    """Per (rank, step, sub) sum and count of table ``which`` ("loader" or "api") over every
    block, with ``processes`` worker processes (1: in this process) of ``threads`` decoding
    threads each; and the rows read."""
    table = _TABLES[which][0]
    with open_trace(path, allow_incomplete=True) as t:
        ranges = t.block_ranges(table)
    rows = sum(hi - lo for lo, hi in ranges)
    shares = [ranges[i::processes] for i in range(max(1, processes))]
    jobs = [(os.fspath(path), which, share, warmup, threads) for share in shares if share]
    if processes > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=processes) as pool:
            parts = list(pool.map(_reduce_ranges, jobs))
    else:
        parts = [_reduce_ranges(job) for job in jobs]
    if not parts:
        return _empty_partial(), rows
    total = pd.concat(parts, ignore_index=True).groupby(["rank", "step", "sub"]).sum()
    return total.reset_index(), rows


def loader_stage_sums(
    path: Path, *, warmup: int, processes: int = 1, threads: int = 1
) -> pd.DataFrame:
    """Per (rank, step): summed worker time per loader stage (``loader_<stage>_ms``), as
    ``summarize.loader_metrics`` has them; stages a step did not have are NaN."""
    partial, _ = step_partials(path, "loader", warmup=warmup, processes=processes, threads=threads)
    if partial.empty:
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in LOADER_SUM_COLUMNS.items()})
    wide = partial.pivot_table(index=KEYS, columns="sub", values="sum", aggfunc="sum")
    out = pd.DataFrame(index=wide.index)
    for i, stage in enumerate(LOADER_STAGES):
        out[f"loader_{stage}_ms"] = wide.get(i, np.nan)
    out = out.reset_index()
    return out.astype(LOADER_SUM_COLUMNS)[list(LOADER_SUM_COLUMNS)]


def api_step_metrics(
    path: Path, *, warmup: int, processes: int = 1, threads: int = 1
) -> pd.DataFrame:
    """``summarize.api_metrics`` computed block by block."""
    partial, _ = step_partials(path, "api", warmup=warmup, processes=processes, threads=threads)
    if partial.empty:
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in API_STEP_COLUMNS.items()})
    allc = partial[partial["sub"] == 0].set_index(KEYS)
    lk = partial[partial["sub"] == 1].set_index(KEYS)
    out = pd.DataFrame(
        {"api_calls": allc["n"], "api_us_mean": allc["sum"] / allc["n"]}, index=allc.index
    )
    out["launch_kernel_calls"] = lk["n"].reindex(out.index).fillna(0)
    out["launch_kernel_us_mean"] = (lk["sum"] / lk["n"]).reindex(out.index)
    out = out.reset_index()
    return out.astype(API_STEP_COLUMNS)[list(API_STEP_COLUMNS)]


# What summarize reads of the two big tables: the rows of measured steps (the warm-up's are
# dropped by every metric) and these columns; of events/cuda only runtime calls and kernels.
SUMMARY_COLUMNS: dict[str, list[str]] = {
    "events/loader": ["rank", "step", "pid", "item", "stage", "start_ns", "end_ns"],
    "events/cuda": ["rank", "step", "kind", "name", "start_ns", "end_ns"],
}
_SUMMARY_KINDS = ("runtime", "kernel")


def _pruned_table(
    t: Trace, name: str, warmup: int, pool: ThreadPoolExecutor | None
) -> pd.DataFrame:
    """Table ``name`` read block by block, keeping only what summarize uses of it."""
    columns = SUMMARY_COLUMNS[name]
    strings = t.strings
    kinds = [strings.index(k) for k in _SUMMARY_KINDS if k in strings]
    pieces: dict[str, list[npt.NDArray[Any]]] = {c: [] for c in columns}
    for lo, hi in t.block_ranges(name):
        block = t.read_rows(name, lo, hi, columns, pool=pool)
        keep = block["step"] >= warmup
        if "kind" in block:
            keep &= np.isin(block["kind"], kinds)
        for c in columns:
            pieces[c].append(block[c][keep])
    if not pieces[columns[0]]:
        return empty_frame(name)[columns]
    categories = pd.Index(strings, dtype="str")
    data: dict[str, Any] = {}
    for c in columns:
        arr = np.concatenate(pieces[c])
        pieces[c].clear()  # each column's blocks freed once joined
        if c in ("kind", "name", "stage"):
            data[c] = pd.Categorical.from_codes(
                arr, categories=categories
            ).remove_unused_categories()
        else:
            data[c] = arr
    return pd.DataFrame(data)


def read_summary_tables(
    path: Path, *, threads: int = 1
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """What ``summarize.summarize_tables`` needs of a verified trace, and its root attributes.

    The small tables are read whole; events/loader and events/cuda block by block, keeping the
    measured steps' rows and the columns of ``SUMMARY_COLUMNS`` (and of events/cuda only the
    runtime calls and kernels), so neither table is ever in memory whole. ``threads`` > 1
    decodes their chunks on that many threads.
    """
    with open_trace(path) as t:
        t.verify()
        attrs = dict(t.attrs)
        warmup = warmup_steps(attrs)
        present = set(t.tables())
        with ThreadPoolExecutor(threads) if threads > 1 else contextlib.nullcontext() as pool:
            tables = {
                n: (
                    _pruned_table(t, n, warmup, pool)
                    if n in SUMMARY_COLUMNS and n in present
                    else t.table(n)
                )
                for n in SUMMARY_TABLES
            }
    return tables, attrs
