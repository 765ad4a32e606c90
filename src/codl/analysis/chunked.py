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
from codl.trace.schema import TABLES
from codl.trace.store import Trace, empty_frame, open_trace

LOADER_STAGES = (*LOADER_ITEM_STAGES, "collate")
LOADER_SUM_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    **{f"loader_{s}_ms": "float64" for s in LOADER_STAGES},
}
# Partial sums of one block: per (rank, step), a sum and a count per quantity.
_Partial = pd.DataFrame


class _Scratch:
    """Arrays a reader reuses from block to block. A fresh array per block costs its page
    faults, ~2 ns per int64 value: as much as decoding it, or the reduction's passes."""

    def __init__(self) -> None:
        self._arrays: dict[str, npt.NDArray[Any]] = {}

    def get(self, key: str, n: int, dtype: npt.DTypeLike) -> npt.NDArray[Any]:
        """``n`` values of ``dtype``, in the array kept under ``key`` (grown when too short)."""
        arr = self._arrays.get(key)
        if arr is None or len(arr) < n or arr.dtype != np.dtype(dtype):
            arr = self._arrays[key] = np.empty(n, dtype=dtype)
        return arr[:n]


_Reducer = Callable[[dict[str, npt.NDArray[Any]], list[str], int, _Scratch], _Partial]


_PARTIAL_COLUMNS = ["rank", "step", "sub", "sum", "n"]
# A block whose (rank, step) changes less often than once per _MIN_RUN rows (rows are written
# in time order, so a step's rows mostly follow each other) is reduced run by run: a few
# passes over the rows and np.add.reduceat, ~2 ns per row and quantity. Blocks whose rows
# alternate between keys fall back to bincount over dense bins, ~10 ns per row.
_MIN_RUN = 16


def _empty_partial() -> _Partial:
    return pd.DataFrame(
        {c: pd.Series(dtype="float64" if c == "sum" else "int64") for c in _PARTIAL_COLUMNS}
    )


def _run_starts(rank: npt.NDArray[Any], step: npt.NDArray[Any]) -> npt.NDArray[np.intp] | None:
    """First row of every run of equal (rank, step) in a block, or None when the runs are
    shorter than _MIN_RUN rows on average."""
    change = step[1:] != step[:-1]
    if rank.min() != rank.max():  # a rank's own trace has one rank: no rank term
        change |= rank[1:] != rank[:-1]
    starts = np.flatnonzero(change)
    if (len(starts) + 1) * _MIN_RUN > len(step):
        return None
    return np.concatenate((np.zeros(1, dtype=starts.dtype), starts + 1))


def _run_sums(
    rank: npt.NDArray[Any],
    step: npt.NDArray[Any],
    starts: npt.NDArray[np.intp],
    masks: Sequence[npt.NDArray[np.bool_] | None],
    dur_ns: npt.NDArray[np.int64],
    scratch: npt.NDArray[np.int64],
) -> _Partial:
    """Per run and per quantity ``sub`` (the index of its row mask in ``masks``; None: no row):
    the summed ``dur_ns`` and the row count, for the (rank, step, sub) groups that have rows.
    Runs of one key that recur in the block are added up by the caller's groupby."""
    keys = {"rank": rank[starts].astype(np.int64), "step": step[starts].astype(np.int64)}
    parts = []
    for sub, mask in enumerate(masks):
        if mask is None:
            continue
        counts = np.add.reduceat(mask, starts, dtype=np.int64)
        np.multiply(dur_ns, mask, out=scratch)
        sums = np.add.reduceat(scratch, starts).astype(np.float64)
        has = counts > 0
        parts.append(
            pd.DataFrame(
                {
                    "rank": keys["rank"][has],
                    "step": keys["step"][has],
                    "sub": np.full(int(has.sum()), sub, dtype=np.int64),
                    "sum": sums[has],
                    "n": counts[has],
                }
            )
        )
    if not parts:
        return _empty_partial()
    return pd.concat(parts, ignore_index=True)


def _group_sums(
    rank: npt.NDArray[Any],
    step: npt.NDArray[Any],
    sub: npt.NDArray[np.int64],
    n_sub: int,
    weights: npt.NDArray[Any],
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


def _masked_sums(
    cols: dict[str, npt.NDArray[Any]],
    masks: Sequence[npt.NDArray[np.bool_] | None],
    warmup: int,
    work: _Scratch,
) -> _Partial:
    """Per (rank, step, sub) of the measured steps: summed duration (ns) and count of the rows
    of each quantity ``sub`` (``masks[sub]``; None when no row can have it)."""
    rank, step = cols["rank"], cols["step"]
    n = len(step)
    if n == 0:
        return _empty_partial()
    dur = np.subtract(cols["end_ns"], cols["start_ns"], out=work.get("dur", n, np.int64))
    starts = _run_starts(rank, step)
    if starts is not None:
        part = _run_sums(rank, step, starts, masks, dur, work.get("tmp", n, np.int64))
    else:
        # Fragmented block: one bincount pass per sum over (rank, step, sub) bins; a row in
        # several masks (a launch is also a runtime call) is counted once per mask.
        one = np.zeros(len(step), dtype=np.int64)
        part = pd.concat(
            [
                _group_sums(rank, step, one, 1, dur, m).assign(sub=i)
                for i, m in enumerate(masks)
                if m is not None
            ]
            or [_empty_partial()],
            ignore_index=True,
        )
    # The warm-up's rows were reduced along (no per-row mask pass) and are dropped here.
    return part[part["step"] >= warmup]


def _code_of(strings: list[str], label: str) -> int | None:
    return strings.index(label) if label in strings else None


def _loader_block(
    cols: dict[str, npt.NDArray[Any]], strings: list[str], warmup: int, work: _Scratch
) -> _Partial:
    stage = cols["stage"]
    n = len(stage)
    codes = [_code_of(strings, s) for s in LOADER_STAGES]
    masks = [
        None if c is None else np.equal(stage, c, out=work.get(f"mask{i}", n, np.bool_))
        for i, c in enumerate(codes)
    ]
    return _masked_sums(cols, masks, warmup, work)


def _api_block(
    cols: dict[str, npt.NDArray[Any]], strings: list[str], warmup: int, work: _Scratch
) -> _Partial:
    runtime = _code_of(strings, "runtime")
    if runtime is None:
        return _empty_partial()
    n = len(cols["kind"])
    # Quantities: 0 every runtime call, 1 cudaLaunchKernel and its variants among them.
    every = np.equal(cols["kind"], runtime, out=work.get("mask0", n, np.bool_))
    launch_codes = np.array(["LaunchKernel" in s for s in strings], dtype=np.bool_)
    launch = np.take(launch_codes, cols["name"], out=work.get("mask1", n, np.bool_))
    launch &= every
    return _masked_sums(cols, [every, launch], warmup, work)


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
    dtypes = {c.name: np.dtype(c.numpy_dtype) for c in TABLES[table]}
    work = _Scratch()
    parts = []
    with open_trace(path, allow_incomplete=True) as t:
        strings = t.strings
        if threads <= 1:
            for lo, hi in ranges:
                out = {c: work.get(f"read {c}", hi - lo, dtypes[c]) for c in columns}
                cols = t.read_rows(table, lo, hi, columns, out=out)
                parts.append(reducer(cols, strings, warmup, work))
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
                    parts.append(reducer(cols, strings, warmup, work))
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
        out[f"loader_{stage}_ms"] = wide.get(i, np.nan) / 1e6  # partial sums are in ns
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
    # Partial sums are in ns.
    out = pd.DataFrame(
        {"api_calls": allc["n"], "api_us_mean": allc["sum"] / 1e3 / allc["n"]}, index=allc.index
    )
    out["launch_kernel_calls"] = lk["n"].reindex(out.index).fillna(0)
    out["launch_kernel_us_mean"] = (lk["sum"] / 1e3 / lk["n"]).reindex(out.index)
    out = out.reset_index()
    return out.astype(API_STEP_COLUMNS)[list(API_STEP_COLUMNS)]


# What summarize reads of the two big tables: the rows of measured steps (the warm-up's are
# dropped by every metric) and these columns; of events/cuda only the kinds it uses (runtime
# calls; kernels, memcpy and memset for the overlaps and the decomposition's GPU time). The
# workflow's per-run figure tables also read the loader's worker (the step timeline's tracks).
SUMMARY_COLUMNS: dict[str, list[str]] = {
    "events/loader": ["rank", "step", "worker", "pid", "item", "stage", "start_ns", "end_ns"],
    "events/cuda": ["rank", "step", "kind", "name", "start_ns", "end_ns"],
}
_SUMMARY_KINDS = ("runtime", "kernel", "memcpy", "memset")


def _pruned_table(
    t: Trace, name: str, warmup: int, pool: ThreadPoolExecutor | None
) -> pd.DataFrame:
    """Table ``name`` read block by block, keeping only what summarize uses of it (rows of
    steps from ``warmup`` on: 0 keeps the warm-up's too)."""
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
    path: Path, *, threads: int = 1, warmup_rows: bool = False
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """What ``summarize.summarize_tables`` needs of a verified trace, and its root attributes.

    The small tables are read whole; events/loader and events/cuda block by block, keeping the
    measured steps' rows (``warmup_rows``: the warm-up's too, which the step timeline may
    draw, as it picks loader rows by time) and the columns of ``SUMMARY_COLUMNS`` (of
    events/cuda only the kinds summarize uses), so neither table is ever in memory whole.
    ``threads`` > 1 decodes gzip chunks on that many threads.
    """
    with open_trace(path) as t:
        t.verify()
        attrs = dict(t.attrs)
        warmup = 0 if warmup_rows else warmup_steps(attrs)
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
