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
import ctypes
import functools
import itertools
import multiprocessing as mp
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.analysis.columns import (
    API_STEP_COLUMNS,
    KEYS,
    LOADER_STAGES,
    SUMMARY_TABLES,
    warmup_steps,
)
from codl.analysis.intervals import UnionOverlap, interval_union
from codl.analysis.latency import ExactLatency, NameHistogram
from codl.analysis.load import core_sample_rows
from codl.trace.schema import LOADER_ITEM_STAGES, TABLES, Phase, Table
from codl.trace.store import Trace, empty_frame, open_trace

LOADER_SUM_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    **{f"loader_{s}_ms": "float64" for s in LOADER_STAGES},
}
# Partial sums of blocks: per (rank, step, sub) group, the summed duration (int64 ns) and the
# row count, as parallel arrays (rank, step, sub, sum, n); a group recurs in each block it spans.
_Ints = npt.NDArray[np.int64]
_Part = tuple[_Ints, _Ints, _Ints, _Ints, _Ints]
_PARTIAL_COLUMNS = ["rank", "step", "sub", "sum", "n"]
# The rows of one quantity in a block: a row mask, _EVERY_ROW, or None (no row can have it).
_EVERY_ROW: Final = "every row"
_Rows = npt.NDArray[np.bool_] | str | None


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


class OneBehind:
    """Runs a stream's calls on a thread of ``pool``'s, in order, at most one call behind the
    caller: a reduction whose state only it touches (the latency sketches, the loader's item
    counts) or a file's writes run beside the caller's next piece of work (numpy, Arrow and
    HDF5 let go of the GIL in theirs). A call's error is raised by the next ``submit`` or by
    ``wait``; the arrays a call takes must be its own (not a reused block's or scratch's), as
    the caller moves on at once."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._last: Future[None] | None = None

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self.wait()
        self._last = self._pool.submit(fn, *args)

    def wait(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            last.result()


# A table's block reducer: (block's columns, warm-up steps, scratch) -> the block's partials.
_BlockReducer = Callable[[dict[str, npt.NDArray[Any]], int, _Scratch], list[_Part]]


# A block whose (rank, step) changes less often than once per _MIN_RUN rows (rows are written
# in time order, so a step's rows mostly follow each other) is reduced run by run: a quantity's
# rows are picked once (np.flatnonzero), and np.add.reduceat sums each run's share of them,
# ~1 ns per row and quantity. Blocks whose rows alternate between keys fall back to bincount
# over dense bins, ~10 ns per row.
_MIN_RUN = 16


def _empty_partial() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in _PARTIAL_COLUMNS})


def _partial_frame(parts: Sequence[_Part] | Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The partials (of blocks, or workers' frames) added up: one row per (rank, step, sub)
    group, sums in int64 ns."""
    if not parts:
        return _empty_partial()
    frames = [p for p in parts if isinstance(p, pd.DataFrame)]
    blocks = [p for p in parts if not isinstance(p, pd.DataFrame)]
    if blocks:
        columns = zip(_PARTIAL_COLUMNS, zip(*blocks, strict=True), strict=True)
        frames.append(pd.DataFrame({c: np.concatenate(arrays) for c, arrays in columns}))
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return frame.groupby(["rank", "step", "sub"]).sum().reset_index()


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
    starts: npt.NDArray[np.intp],
    rows: npt.NDArray[np.bool_] | str,
    dur: npt.NDArray[np.int64],
    work: _Scratch,
) -> tuple[_Ints, _Ints]:
    """Per run of rows (first rows ``starts``): the summed ``dur`` of its ``rows`` (_EVERY_ROW:
    all its rows) and their count; a run without rows has count 0."""
    if isinstance(rows, str):
        return np.add.reduceat(dur, starts), np.diff(starts, append=len(dur))
    picked = np.flatnonzero(rows)
    m = len(picked)
    # Where each run's first row falls among the picked rows: its share is bounds[i]..bounds[i+1].
    bounds = np.searchsorted(picked, starts)
    # The picked durations and one 0 after them: reduceat gives an empty share the value at its
    # bound, which is then that 0 or a later share's first value (its count, 0, drops it).
    values = work.get("picked", m + 1, np.int64)
    np.take(dur, picked, out=values[:m], mode="clip")
    values[m] = 0
    return np.add.reduceat(values, bounds), np.diff(bounds, append=m)


def _group_sums(
    rank: npt.NDArray[Any],
    step: npt.NDArray[Any],
    dur: npt.NDArray[np.int64],
    keep: npt.NDArray[np.bool_],
) -> tuple[_Ints, _Ints, _Ints, _Ints]:
    """Per (rank, step) over the rows where ``keep``: rank, step, the summed ``dur`` and the
    row count of the groups that have rows.

    A block holds a few steps of a few ranks, so each row gets a dense bin number from the
    block's smallest rank and step (no sort, no hashing) and two bincounts do the rest; rows
    not kept go to one extra bin that is dropped. Sparse blocks fall back to np.unique.
    """
    r0, s0 = int(rank.min()), int(step.min())
    n_r, n_s = int(rank.max()) - r0 + 1, int(step.max()) - s0 + 1
    bins = n_r * n_s
    # In place on one int64 array: a block is ~10^6 rows, and each temporary costs a pass.
    gid = step.astype(np.int64)
    gid -= s0
    if n_r > 1:  # a rank's own trace has one rank: no rank term
        gid += (rank.astype(np.int64) - r0) * n_s
    if bins > 4 * len(gid) + 1024:
        uniq, gid = np.unique(gid[keep], return_inverse=True)
        counts = np.bincount(gid, minlength=len(uniq))
        sums = np.bincount(gid, weights=dur[keep], minlength=len(uniq))
    else:
        gid[~keep] = bins
        counts = np.bincount(gid, minlength=bins + 1)[:bins]
        sums = np.bincount(gid, weights=dur, minlength=bins + 1)[:bins]
        uniq = np.flatnonzero(counts)
        counts, sums = counts[uniq], sums[uniq]
    pr, ps = np.divmod(uniq, n_s)
    # bincount sums in float64: exact for integer sums below 2**53 ns (104 days).
    return pr + r0, ps + s0, np.rint(sums).astype(np.int64), counts


def _masked_sums(
    cols: dict[str, npt.NDArray[Any]], rows: Sequence[_Rows], warmup: int, work: _Scratch
) -> list[_Part]:
    """Per (rank, step, sub) of the measured steps: summed duration (ns) and count of the rows
    of each quantity ``sub`` (``rows[sub]``); a row of several quantities (a launch is also a
    runtime call) is counted once for each."""
    rank, step = cols["rank"], cols["step"]
    n = len(step)
    if n == 0:
        return []
    dur = np.subtract(cols["end_ns"], cols["start_ns"], out=work.get("dur", n, np.int64))
    starts = _run_starts(rank, step)
    if starts is not None:
        keys = (rank[starts].astype(np.int64), step[starts].astype(np.int64))
    parts: list[_Part] = []
    for sub, which in enumerate(rows):
        if which is None:
            continue
        if starts is not None:
            sums, counts = _run_sums(starts, which, dur, work)
            # Runs of one key that recur in the block are added up with the other blocks'.
            got: tuple[_Ints, ...] = (*keys, sums, counts)
        else:
            keep = np.ones(n, np.bool_) if isinstance(which, str) else which
            got = _group_sums(rank, step, dur, keep)
        # The warm-up's rows were reduced along (no per-row mask pass) and are dropped here.
        has = (got[3] > 0) & (got[1] >= warmup)
        k = int(np.count_nonzero(has))
        r, s, total, count = (a[has] for a in got)
        parts.append((r, s, np.full(k, sub, dtype=np.int64), total, count))
    return parts


def _code_of(strings: list[str], label: str) -> int | None:
    return strings.index(label) if label in strings else None


def _loader_reducer(strings: list[str]) -> _BlockReducer:
    codes = [_code_of(strings, s) for s in LOADER_STAGES]

    def reduce(cols: dict[str, npt.NDArray[Any]], warmup: int, work: _Scratch) -> list[_Part]:
        stage = cols["stage"]
        n = len(stage)
        masks = [
            None if c is None else np.equal(stage, c, out=work.get(f"mask{i}", n, np.bool_))
            for i, c in enumerate(codes)
        ]
        return _masked_sums(cols, masks, warmup, work)

    return reduce


def _api_reducer(strings: list[str]) -> _BlockReducer:
    runtime = _code_of(strings, "runtime")
    launch_codes = [i for i, s in enumerate(strings) if "LaunchKernel" in s]
    is_launch = np.zeros(len(strings), dtype=np.bool_)
    is_launch[launch_codes] = True

    def reduce(cols: dict[str, npt.NDArray[Any]], warmup: int, work: _Scratch) -> list[_Part]:
        if runtime is None:
            return []
        n = len(cols["kind"])
        # Quantities: 0 every runtime call, 1 cudaLaunchKernel and its variants among them.
        every = np.equal(cols["kind"], runtime, out=work.get("mask0", n, np.bool_))
        runtime_only = bool(every.all())  # the cuda_api level: one pass fewer per quantity
        launch: npt.NDArray[np.bool_] | None = None
        if launch_codes:
            launch = work.get("mask1", n, np.bool_)
            if len(launch_codes) <= 4:  # a few compares cost less than a lookup per row
                np.equal(cols["name"], launch_codes[0], out=launch)
                for code in launch_codes[1:]:
                    launch |= cols["name"] == code
            else:
                np.take(is_launch, cols["name"], out=launch)
            if not runtime_only:
                launch &= every
        return _masked_sums(cols, [_EVERY_ROW if runtime_only else every, launch], warmup, work)

    return reduce


# What step_partials reads of each table ("loader", "api"): the table and its columns.
STEP_TABLES: dict[str, tuple[str, list[str]]] = {
    "loader": ("events/loader", ["rank", "step", "stage", "start_ns", "end_ns"]),
    "api": ("events/cuda", ["rank", "step", "kind", "name", "start_ns", "end_ns"]),
}
_TABLES: dict[str, tuple[str, list[str], Callable[[list[str]], _BlockReducer]]] = {
    "loader": (*STEP_TABLES["loader"], _loader_reducer),
    "api": (*STEP_TABLES["api"], _api_reducer),
}


def _reduce_ranges(args: tuple[str, str, Sequence[tuple[int, int]], int, int]) -> pd.DataFrame:
    """One worker's share: the partial sums of its row ranges (opens the trace itself)."""
    path, which, ranges, warmup, threads = args
    with open_trace(path, allow_incomplete=True) as t:
        return _reduce_open(t, which, ranges, warmup, threads)


def _reduce_open(
    t: Trace, which: str, ranges: Sequence[tuple[int, int]], warmup: int, threads: int
) -> pd.DataFrame:
    """The partial sums of table ``which``'s row ranges ``ranges`` of the open trace ``t``.

    With ``threads`` > 1 the next range is read on a thread while this one is reduced (HDF5's
    reads, zlib and numpy release the GIL), its gzip chunks decoded on ``threads`` threads,
    so one process uses several cores.
    """
    table, columns, make_reducer = _TABLES[which]
    dtypes = {c.name: np.dtype(c.numpy_dtype) for c in TABLES[table]}
    work = _Scratch()
    parts: list[_Part] = []
    reducer = make_reducer(t.strings)

    def buffers(r: tuple[int, int], key: str) -> dict[str, npt.NDArray[Any]]:
        return {c: work.get(f"{key} {c}", r[1] - r[0], dtypes[c]) for c in columns}

    if threads <= 1:
        for lo, hi in ranges:
            cols = t.read_rows(table, lo, hi, columns, out=buffers((lo, hi), "read"))
            parts += reducer(cols, warmup, work)
        return _partial_frame(parts)
    with (
        ThreadPoolExecutor(threads, thread_name_prefix="codl-decode") as decode,
        ThreadPoolExecutor(1, thread_name_prefix="codl-read") as reader,
    ):

        def read(i: int) -> Future[dict[str, npt.NDArray[Any]]]:
            # Two sets of buffers: range i is read into one while range i - 1 is reduced from
            # the other (the partials keep no view of a block).
            lo, hi = ranges[i]
            out = buffers(ranges[i], f"read{i % 2}")
            return reader.submit(t.read_rows, table, lo, hi, columns, pool=decode, out=out)

        ahead = [read(0)] if ranges else []
        for i in range(len(ranges)):
            cols = ahead.pop().result()
            if i + 1 < len(ranges):
                ahead.append(read(i + 1))
            parts += reducer(cols, warmup, work)
    return _partial_frame(parts)


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
        if processes <= 1 or len(ranges) <= 1:
            # In this process, through the trace already open (opening it again checks its
            # metadata digest again: ~10 ms).
            total = _reduce_open(t, which, ranges, warmup, threads)
            return total.astype({"sum": np.float64}), rows
    shares = [ranges[i::processes] for i in range(processes)]
    jobs = [(os.fspath(path), which, share, warmup, threads) for share in shares if share]
    with ProcessPoolExecutor(max_workers=processes) as pool:
        total = _partial_frame(list(pool.map(_reduce_ranges, jobs)))
    return total.astype({"sum": np.float64}), rows


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
    return _api_frame(partial.astype({"sum": np.float64}))


def _api_frame(partial: pd.DataFrame) -> pd.DataFrame:
    """``summarize.api_metrics`` from the "api" partial sums (sum in float64 ns)."""
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
    return _frame(name, pieces, strings)


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


@dataclass
class ApiReduction:
    """The measured CUDA runtime calls of a run, reduced block by block: per-step metrics
    (``summarize.api_metrics``), exact latency statistics of every call and, flagged, of the
    launches (``summarize._latency_stats``), and each name's latency histogram (the CDF
    figure)."""

    steps: pd.DataFrame
    latency: ExactLatency
    names: NameHistogram


class _ApiPass:
    """Reduces events/cuda blocks; keeps the GPU activity rows (kernels, memcpy, memset) that
    the overlaps and the decomposition need."""

    def __init__(self, strings: list[str], warmup: int, keep_from: int, behind: OneBehind) -> None:
        self._reducer = _api_reducer(strings)
        self._behind = behind
        self._runtime = _code_of(strings, "runtime")
        self._is_launch = np.array(["LaunchKernel" in x for x in strings], dtype=np.bool_)
        self._gpu = [strings.index(k) for k in _GPU_KINDS if k in strings]
        self._warmup, self._keep_from = warmup, keep_from
        self._work = _Scratch()
        self._parts: list[_Part] = []
        self.latency = ExactLatency()
        self.names = NameHistogram(strings)
        self.kept: dict[str, list[npt.NDArray[Any]]] = {c: [] for c in SUMMARY_COLUMNS[_CUDA]}

    def add(self, cols: dict[str, npt.NDArray[Any]]) -> None:
        kind, step = cols["kind"], cols["step"]
        n = len(step)
        if not n:
            return
        self._parts += self._reducer(cols, self._warmup, self._work)
        runtime = 0
        if self._runtime is not None:
            is_rt = np.equal(kind, self._runtime, out=self._work.get("rt", n, np.bool_))
            runtime = int(np.count_nonzero(is_rt))
        flagged: npt.NDArray[np.bool_] | None = None
        if runtime == n and int(step.min()) >= self._warmup:
            # A cuda_api trace's block of measured steps: every row, no gathers; the durations
            # and launch flags are those the reducer just made (_masked_sums' scratch "dur",
            # _api_reducer's "mask1", every row a runtime call): not a second pass each. They
            # and the names are copied, as the next block reuses their arrays.
            ns = self._work.get("dur", n, np.int64).copy()
            names = cols["name"].copy()
            if self._is_launch.any():
                flagged = self._work.get("mask1", n, np.bool_).copy()
        elif runtime:
            rt = np.flatnonzero(is_rt & (step >= self._warmup))
            ns = cols["end_ns"][rt] - cols["start_ns"][rt]
            names = cols["name"][rt]
        else:
            ns = names = np.empty(0, np.int64)
        if len(ns):
            launch = np.take(self._is_launch, names) if flagged is None else flagged
            self._behind.submit(self._add_latency, ns, launch, names)
        if self._gpu and runtime < n:
            keep = np.isin(kind, self._gpu) & (step >= self._keep_from)
            if keep.any():
                for c, pieces in self.kept.items():
                    pieces.append(cols[c][keep])

    def _add_latency(self, ns: _Ints, launch: npt.NDArray[np.bool_], names: _Ints) -> None:
        self.latency.add(ns, launch)
        self.names.add(names, ns)

    def result(self) -> ApiReduction:
        self._behind.wait()
        partial = _partial_frame(self._parts).astype({"sum": np.float64})
        return ApiReduction(_api_frame(partial), self.latency, self.names)


_CUDA = "events/cuda"
_GPU_KINDS = ("kernel", "memcpy", "memset")


def _frame(
    name: str, pieces: dict[str, list[npt.NDArray[Any]]], strings: list[str]
) -> pd.DataFrame:
    columns = list(pieces)
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


def read_summary(
    path: Path,
    *,
    threads: int = 1,
    warmup_rows: bool = False,
    loader_process: bool | None = None,
) -> tuple[dict[str, pd.DataFrame], dict[str, Any], ApiReduction, LoaderReduction]:
    """What ``summarize.summarize_tables`` needs of a trace, with the two big tables reduced
    as they are read, block by block: the CUDA runtime calls (``ApiReduction``) and the
    loader's rows (``LoaderReduction``). events/cuda comes back with its GPU activity rows
    only (none in a ``cuda_api`` trace; ``warmup_rows`` keeps the warm-up's), events/loader
    empty (the step timeline reads its window itself), samples/cpu with the rows
    ``load.outside_cpu_share`` reads (``load.core_sample_rows``). Memory does not grow with the
    calls, the loader's rows or the per-core samples.

    The trace is verified (``Trace.verify``) in the same pass: each table's blocks are
    checked and hashed as they are read (``Trace.verified_blocks``), so every byte is decoded
    once; a table that fails its check raises before anything made of it is returned.

    ``loader_process``: events/loader is reduced in a forked process of its own, beside this
    one's pass over events/cuda (``_LoaderProcess``); None (the default) does so where it
    pays (``_loader_process_pays``). Either way the result is the same.
    """
    apart = _loader_process_pays(loader_process, path)
    with (
        _LoaderProcess(path, threads) if apart else contextlib.nullcontext() as beside,
        open_trace(path) as t,
    ):
        t.verify_structure()
        attrs = dict(t.attrs)
        warmup = warmup_steps(attrs)
        present = t.tables()
        tables: dict[str, pd.DataFrame] = {}
        with (
            ThreadPoolExecutor(threads) if threads > 1 else contextlib.nullcontext() as pool,
            ThreadPoolExecutor(1, thread_name_prefix="codl-reduce") as reducing,
        ):
            api = _ApiPass(t.strings, warmup, 0 if warmup_rows else warmup, OneBehind(reducing))
            for name in present:
                if name == Table.CUDA:
                    blocks = t.verified_blocks(name, pool=pool, reuse=True, rows=_STREAM_ROWS)
                    for _, _, block in blocks:
                        api.add(block)
                    block = {}  # its arrays, and the reused buffers they are views of, freed
                elif name != Table.LOADER:
                    _read_small(t, name, tables, warmup, pool)
            tables[Table.CUDA] = _frame(Table.CUDA, api.kept, t.strings)
            for name in SUMMARY_TABLES:
                if name not in tables:
                    tables[name] = empty_frame(name)
            loader = beside.result() if beside is not None else None
            if loader is None:
                loader = _loader_here(t, tables, warmup, pool, OneBehind(reducing))
        tables[Table.LOADER] = empty_frame(Table.LOADER)
    out = {n: tables[n] for n in SUMMARY_TABLES}, attrs, api.result(), loader
    release_free_heap()
    return out


def _read_small(
    t: Trace, name: str, tables: dict[str, pd.DataFrame], warmup: int, pool: Any
) -> None:
    """A table other than the two big ones, verified: samples/cpu reduced as it is read, the
    summary's other tables whole, the rest only checked (the summary vouches for them too)."""
    if name == Table.CPU:
        cores = _CoreSamplePass(warmup)
        for _, _, block in t.verified_blocks(name, pool=pool, reuse=True, rows=_STREAM_ROWS):
            cores.add(block)
        tables[name] = cores.result()
    elif name in SUMMARY_TABLES:
        tables[name] = t.verified_table(name, pool=pool)
    else:
        for _ in t.verified_blocks(name, pool=pool, reuse=True, rows=_STREAM_ROWS):
            pass


def _loader_here(
    t: Trace, tables: dict[str, pd.DataFrame], warmup: int, pool: Any, behind: OneBehind
) -> LoaderReduction:
    """events/loader reduced in this process. Its overlaps are measured against the compute
    spans (events/app) and the kernels (events/cuda), so it comes after both."""
    loader = _LoaderPass(t.strings, warmup, _loader_targets(tables, warmup), behind)
    if Table.LOADER in t.tables():
        marks = _Watermarks(t, Table.LOADER)
        blocks = t.verified_blocks(Table.LOADER, pool=pool, reuse=True, rows=_STREAM_ROWS)
        for _, hi, block in blocks:
            loader.add(block, functools.partial(marks.after, hi))
    return loader.result()


# Traces smaller than this (~4 x 10^6 events) are read in one process: below it the fork and
# the child's own opening of the trace cost about what the second process saves (10^6
# events: 2.05 s against 1.97 s on the H200 node, within the rounds' spread, +0.4 CPU-s).
_PROCESS_MIN_BYTES: Final = 32 << 20


def _loader_process_pays(wanted: bool | None, path: Path) -> bool:
    """Whether events/loader gets a process of its own: where asked, else on Linux with four
    cores or more, for a trace of _PROCESS_MIN_BYTES or more, from a process running no other
    Python thread. Its pass and the CUDA pass each hold the GIL (and h5py's lock) for much of
    their time, so on threads they take turns; in two processes they do not. On fewer cores
    they would only share the same cores; fork is Linux's to trust (macOS's system libraries
    are not fork-safe), and a fork while another thread holds a lock (h5py's, logging's)
    leaves the child waiting on it for ever."""
    if wanted is not None:
        return wanted and "fork" in mp.get_all_start_methods()
    if sys.platform != "linux" or default_threads() < 4 or threading.active_count() > 1:
        return False
    try:
        return path.stat().st_size >= _PROCESS_MIN_BYTES
    except OSError:  # open_trace says what is wrong with the path
        return False


def _loader_alone(path: Path, threads: int) -> LoaderReduction | None:
    """events/loader reduced on its own (``_LoaderProcess``'s child), or None where its
    overlaps need the kernels of events/cuda (the trace's strings name a GPU kind), which only
    the parent's pass has."""
    with open_trace(path) as t:
        if any(k in t.strings for k in _GPU_KINDS):
            return None
        warmup = warmup_steps(dict(t.attrs))
        # The compute spans, unchecked: the parent verifies events/app and refuses the trace
        # if it fails, whatever comes from here.
        tables: dict[str, pd.DataFrame] = {Table.APP: t.table(Table.APP)}
        with (
            ThreadPoolExecutor(threads) if threads > 1 else contextlib.nullcontext() as pool,
            ThreadPoolExecutor(1, thread_name_prefix="codl-reduce") as reducing,
        ):
            return _loader_here(t, tables, warmup, pool, OneBehind(reducing))


def _loader_child(path: Path, threads: int, conn: Connection) -> None:
    try:
        result: tuple[str, Any] = ("ok", _loader_alone(path, threads))
    except BaseException as e:  # every failure reaches the parent, which raises it
        result = ("error", e)
    try:
        conn.send(result)
    except Exception as e:  # an exception that does not pickle: its text does
        conn.send(("error", RuntimeError(f"{type(result[1]).__name__}: {result[1]} ({e})")))
    finally:
        conn.close()


class _LoaderProcess:
    """events/loader reduced in a forked child process (``_loader_alone``) while the caller
    reads the rest. Forked before the caller opens the trace or starts a thread of its own:
    the child inherits no open HDF5 file and no held lock, and opens the trace itself. Its
    result (a row per rank and step, two fractions) comes back through a pipe; leaving the
    ``with`` block ends a child whose result is no longer wanted."""

    def __init__(self, path: Path, threads: int) -> None:
        ctx = mp.get_context("fork")
        self._conn, child_conn = ctx.Pipe(duplex=False)
        self._child = ctx.Process(
            target=_loader_child, args=(path, threads, child_conn), name="codl-loader"
        )
        self._child.start()
        child_conn.close()

    def result(self) -> LoaderReduction | None:
        try:
            status, value = self._conn.recv()
        except EOFError:
            self._child.join()
            raise RuntimeError(
                "the loader's pass (a process of its own) ended without a result, exit code "
                f"{self._child.exitcode}"
            ) from None
        if status == "error":
            raise value
        return cast(LoaderReduction | None, value)

    def __enter__(self) -> _LoaderProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()
        if self._child.is_alive():
            # SIGKILL: the child only reads, and a SIGTERM handler it inherited (a caller's
            # deferral of signals around its outputs) would keep it alive.
            self._child.kill()
        self._child.join()


class _CoreSamplePass:
    """samples/cpu reduced block by block to the rows ``load.outside_cpu_share`` reads
    (``load.core_sample_rows``: one row per core, rank and step in a long run, of which the
    share needs a few per core), in the table's order."""

    def __init__(self, warmup: int) -> None:
        self._warmup = warmup
        self._pieces: list[pd.DataFrame] = []
        self._rows = 0

    def add(self, cols: dict[str, npt.NDArray[Any]]) -> None:
        block = pd.DataFrame({c.name: cols[c.name] for c in TABLES[Table.CPU]}, copy=False)
        keep = core_sample_rows(block, warmup=self._warmup)
        piece = block[keep]  # a copy: the next block reuses the arrays
        piece.index = np.flatnonzero(keep) + self._rows  # rows of the whole table
        self._rows += len(block)
        self._pieces.append(piece)

    def result(self) -> pd.DataFrame:
        if not self._pieces:
            return empty_frame(Table.CPU)
        kept = pd.concat(self._pieces) if len(self._pieces) > 1 else self._pieces[0]
        # The selection again over the blocks' picks: each block's first and last are
        # candidates for the table's.
        kept = kept[core_sample_rows(kept, warmup=self._warmup)]
        return kept.reset_index(drop=True)


def release_free_heap() -> None:
    """Hand the heap's free pages back to the OS (glibc's ``malloc_trim``; nothing elsewhere).

    The blocks' numpy temporaries are freed into glibc's heap, which keeps them: after the
    read of a 10^8-event trace ~320 MiB of the process's 560 MiB RSS is free heap, and what
    comes next does not fit in its holes, so the peak RSS was the two stacked (909 MiB;
    with the trim 760). A fixed ``M_MMAP_THRESHOLD`` would return each array as it is freed,
    but costs the read 50 % more CPU in page faults."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


# Rows per block of the streamed tables: two sets of every column's arrays (~54 B a row of
# events/cuda) stay ~30 MiB, and a block's fixed costs (~30 numpy calls) stay below 1 ns a row.
_STREAM_ROWS: Final = 1 << 18


class _Watermarks:
    """For the rows read so far (up to row ``hi``) and a rank, the earliest start of any later
    row of that rank; the int64 minimum, which keeps every union piece open, for traces
    without a chunk index.

    Per rank, not over the table: a merged trace is rank after rank, each rank's rows in
    time order, so the earliest later start over the table is the next rank's first, the
    run's start, until the last rank. Taken over the table, no rank's union piece closed
    before the end, and each block's busy intervals were joined to all of the rank's so far
    (time quadratic in the rows). Each index entry's ranks come from the rank column (2
    bytes a row, read once: ~40 ms per 10^8 events); an entry of one rank has that rank's
    earliest start in the index (t_lo), one of several ranks (where a rank's rows end and the
    next's begin, or every entry where the ranks take turns) has each rank's read from its
    rows."""

    def __init__(self, t: Trace, name: str) -> None:
        index = t.chunk_index(name)
        self._index = index if index is not None and len(index) else None
        if self._index is None:
            return
        starts, t_lo = self._index[:, 0], self._index[:, 2]
        entries: list[_Ints] = []
        ranks: list[_Ints] = []
        earliest: list[_Ints] = []
        for lo, hi in t.block_ranges(name):
            rank = t.read_rows(name, lo, hi, ["rank"])["rank"]
            first, last = (int(x) for x in np.searchsorted(starts, [lo, hi]))
            at = starts[first:last] - lo
            lowest = np.minimum.reduceat(rank, at)
            one = lowest == np.maximum.reduceat(rank, at)
            where = np.arange(first, last)
            entries.append(where[one])
            ranks.append(lowest[one].astype(np.int64))
            earliest.append(t_lo[first:last][one])
            for e, low in zip(where[~one].tolist(), lowest[~one].tolist(), strict=True):
                e_lo, e_hi = (int(x) for x in self._index[e, :2])
                cols = t.read_rows(name, e_lo, e_hi, ["rank", "start_ns"])
                r = cols["rank"].astype(np.int64) - low
                present = np.flatnonzero(np.bincount(r))
                own_first = np.full(int(r.max()) + 1, _NO_ROW)
                np.minimum.at(own_first, r, cols["start_ns"])  # O(rows), whatever their order
                entries.append(np.full(len(present), e))
                ranks.append(present + low)
                earliest.append(own_first[present])
        entry, rank_of, t_min = (np.concatenate(x) for x in (entries, ranks, earliest))
        # Per rank: the entries holding its rows, in order, and its earliest start from each on.
        self._own: dict[int, tuple[_Ints, _Ints]] = {}
        by = np.lexsort((entry, rank_of))
        entry, rank_of, t_min = entry[by], rank_of[by], t_min[by]
        turns = [0, *(np.flatnonzero(rank_of[1:] != rank_of[:-1]) + 1).tolist(), len(rank_of)]
        for a, b in itertools.pairwise(turns if len(rank_of) else []):
            self._own[int(rank_of[a])] = (entry[a:b], _suffix_min(t_min[a:b]))

    def after(self, hi: int, rank: int) -> int:
        if self._index is None:
            return int(np.iinfo(np.int64).min)
        own = self._own.get(rank)
        if own is None:
            return _NO_ROW
        at, earliest = own
        return int(earliest[int(np.searchsorted(at, np.searchsorted(self._index[:, 0], hi)))])


_NO_ROW: Final = np.iinfo(np.int64).max


def _suffix_min(x: _Ints) -> _Ints:
    """x's minimum from each position on, and _NO_ROW after the last."""
    return np.append(np.minimum.accumulate(x[::-1])[::-1], _NO_ROW)


_LOADER_READ = ["rank", "step", "pid", "item", "stage", "start_ns", "end_ns"]
# The columns read_summary reads of the two big tables (the others it reads whole).
READ_COLUMNS: dict[str, list[str]] = {
    Table.CUDA: SUMMARY_COLUMNS[Table.CUDA],
    Table.LOADER: _LOADER_READ,
}

LOADER_COLUMNS: dict[str, str] = {
    **LOADER_SUM_COLUMNS,
    "loader_items": "int64",
    "loader_item_ms": "float64",
}
_ITEM_KEYS = ["rank", "step", "pid", "item"]


@dataclass
class LoaderReduction:
    """The loader's rows reduced block by block: ``summarize.loader_metrics`` and the
    fractions of compute (host spans) and of kernel time with a worker busy
    (``summarize.overlaps``)."""

    steps: pd.DataFrame
    overlaps: dict[str, float]


def _rank_unions(df: pd.DataFrame) -> dict[int, npt.NDArray[np.int64]]:
    return {
        int(r): interval_union(g["start_ns"].to_numpy(), g["end_ns"].to_numpy())
        for r, g in df.groupby(df["rank"].astype("int64"))
    }


class _LoaderPass:
    """Reduces events/loader blocks (measured steps only). A worker's item has several stage
    rows; they are counted once per (rank, step, pid, item) against the keys of this block
    and the one before (rows are written as they end: an item's stages take milliseconds, a
    block holds a second or more of a run)."""

    def __init__(
        self,
        strings: list[str],
        warmup: int,
        targets: dict[str, dict[int, Any]],
        behind: OneBehind | None = None,
    ) -> None:
        self._behind = behind
        self._stage_codes = [_code_of(strings, s) for s in LOADER_STAGES]
        # The item stages are the first of LOADER_STAGES: their masks are the stages' own.
        self._item_masks = [i for i, s in enumerate(LOADER_STAGES) if s in LOADER_ITEM_STAGES]
        self._warmup = warmup
        self._work = _Scratch()
        self._parts: list[_Part] = []
        self._item_parts: list[_Part] = []
        self._counts: list[pd.Series] = []
        self._last: list[_Ints] = [np.empty(0, np.int64) for _ in _ITEM_KEYS]
        self._targets = targets
        self._unions: dict[str, dict[int, UnionOverlap]] = {k: {} for k in targets}
        self._ranks: set[int] = set()

    def add(self, cols: dict[str, npt.NDArray[Any]], watermark: Callable[[int], int]) -> None:
        """One block; ``watermark(rank)``: the earliest start of that rank's later rows."""
        stage, step, item = cols["stage"], cols["step"], cols["item"]
        n = len(stage)
        if not n:
            return
        work = self._work
        masks = [
            None if c is None else np.equal(stage, c, out=work.get(f"mask{i}", n, np.bool_))
            for i, c in enumerate(self._stage_codes)
        ]
        busy = np.greater_equal(step, self._warmup, out=work.get("busy", n, np.bool_))
        busy &= item >= 0
        is_item = np.zeros(n, dtype=np.bool_)
        for i in self._item_masks:
            mask = masks[i]
            if mask is not None:
                is_item |= mask
        is_item &= busy
        # The stages' sums and the items' in one reduction (one duration pass, one run split);
        # its last part is the items'.
        *stage_parts, item_part = _masked_sums(cols, [*masks, is_item], self._warmup, work)
        self._parts += stage_parts
        self._item_parts.append(item_part)
        rows = np.flatnonzero(is_item)
        # Gathered by index: copies, the thread's own while the next block is read.
        keys = [cols[k][rows].astype(np.int64, copy=False) for k in _ITEM_KEYS]
        if self._behind is not None:
            self._behind.submit(self._count_items, keys)
        else:
            self._count_items(keys)
        self._busy(cols, busy, watermark)

    def _count_items(self, keys: list[_Ints]) -> None:
        """Count this block's distinct (rank, step, pid, item) keys that the block before did
        not have, per (rank, step): each key as one int64 (``_pack``), sorted and compared."""
        m = len(self._last[0])
        both = [np.concatenate((last, k)) for last, k in zip(self._last, keys, strict=True)]
        packed = _pack(both)
        if packed is None:  # ranges too wide for 63 bits: pandas' hashing
            self._count_items_hashed(keys)
            return
        code, lows, bits = packed
        # The last block's keys were unique and sorted, and packing keeps their order.
        last, unique = code[:m], _sorted_unique(code[m:])
        at = np.minimum(np.searchsorted(last, unique), max(m - 1, 0))
        new = unique if not m else unique[last[at] != unique]
        # New keys sorted by (rank, step, ...): a (rank, step)'s are one run of the top bits.
        group = new >> (bits[2] + bits[3])
        starts = np.flatnonzero(np.diff(group, prepend=-1))
        counts = np.diff(starts, append=len(group))
        rank, step = _unpack(group[starts], lows[:2], bits[:2])
        index = pd.MultiIndex.from_arrays([rank, step], names=KEYS)
        self._counts.append(pd.Series(counts, index=index, dtype=np.int64))
        self._last = _unpack(unique, lows, bits)

    def _count_items_hashed(self, keys: list[_Ints]) -> None:
        frame = pd.DataFrame(dict(zip(_ITEM_KEYS, keys, strict=True))).drop_duplicates()
        last = pd.DataFrame(dict(zip(_ITEM_KEYS, self._last, strict=True)))
        new = frame.merge(last, how="left", indicator=True)["_merge"] == "left_only"
        self._counts.append(frame[new.to_numpy()].groupby(KEYS).size())
        order = frame.sort_values(_ITEM_KEYS)
        self._last = [order[k].to_numpy(np.int64) for k in _ITEM_KEYS]

    def _busy(
        self, cols: dict[str, npt.NDArray[Any]], busy: Any, watermark: Callable[[int], int]
    ) -> None:
        rows = np.flatnonzero(busy)
        rank = cols["rank"][rows]
        start = cols["start_ns"][rows].astype(np.int64)
        end = cols["end_ns"][rows].astype(np.int64)
        ranks = [int(rank[0])] if len(rank) and rank.min() == rank.max() else np.unique(rank)
        for r in [int(x) for x in ranks]:
            on = slice(None) if len(ranks) == 1 else rank == r
            self._ranks.add(r)
            mark = watermark(r)
            for name, by_rank in self._targets.items():
                target = by_rank.get(r)
                if target is not None:
                    u = self._unions[name].setdefault(r, UnionOverlap(target))
                    u.add(start[on], end[on], mark)

    def _overlap(self, name: str) -> float:
        total = covered = 0
        for r in self._ranks:
            target = self._targets[name].get(r)
            if target is None:
                continue
            total += int((target[:, 1] - target[:, 0]).sum())
            u = self._unions[name].get(r)
            covered += u.finish() if u is not None else 0
        return covered / total if total else np.nan

    def result(self) -> LoaderReduction:
        if self._behind is not None:
            self._behind.wait()
        overlaps = {"loader_compute_overlap": np.nan, "kernel_loader_overlap": np.nan}
        if self._ranks:
            overlaps["loader_compute_overlap"] = self._overlap("compute")
            if "kernel" in self._targets:
                overlaps["kernel_loader_overlap"] = self._overlap("kernel")
        return LoaderReduction(self._steps(), overlaps)

    def _steps(self) -> pd.DataFrame:
        if not self._parts:
            return pd.DataFrame({c: pd.Series(dtype=d) for c, d in LOADER_COLUMNS.items()})
        partial = _partial_frame(self._parts).astype({"sum": np.float64})
        wide = partial.pivot_table(index=KEYS, columns="sub", values="sum", aggfunc="sum")
        out = pd.DataFrame(index=wide.index)
        for i, stage in enumerate(LOADER_STAGES):
            out[f"loader_{stage}_ms"] = wide.get(i, np.nan) / 1e6  # partial sums are in ns
        items = _partial_frame(self._item_parts).set_index(KEYS)["sum"]
        counts = pd.concat(self._counts).groupby(level=KEYS).sum() if self._counts else None
        out = out.join(items.rename("item_ns"), how="outer")
        out["loader_items"] = counts.reindex(out.index) if counts is not None else 0
        out["loader_items"] = out["loader_items"].fillna(0)
        out["loader_item_ms"] = (
            out["item_ns"] / 1e6 / out["loader_items"].where(out["loader_items"] > 0)
        )
        out = out.reset_index()
        return out.astype(LOADER_COLUMNS)[list(LOADER_COLUMNS)]


def _pack(columns: list[_Ints]) -> tuple[_Ints, list[int], list[int]] | None:
    """Rows of int64 columns as one int64 each, in their lexicographic order: each column
    less its minimum (``lows``), in the bits its range needs (``bits``); None when the ranges
    need more than 63 bits."""
    if not len(columns[0]):
        return np.empty(0, np.int64), [0] * len(columns), [0] * len(columns)
    lows = [int(c.min()) for c in columns]
    bits = [(int(c.max()) - lo).bit_length() for c, lo in zip(columns, lows, strict=True)]
    if sum(bits) > 63:
        return None
    code = np.zeros(len(columns[0]), dtype=np.int64)
    for c, lo, b in zip(columns, lows, bits, strict=True):
        code <<= b
        code += c - lo
    return code, lows, bits


def _unpack(code: _Ints, lows: list[int], bits: list[int]) -> list[_Ints]:
    """The columns ``_pack`` packed into ``code``."""
    out = []
    rest = code.copy()
    for lo, b in zip(reversed(lows), reversed(bits), strict=True):
        out.append((rest & ((1 << b) - 1)) + lo)
        rest >>= b
    return out[::-1]


def _sorted_unique(x: _Ints) -> _Ints:
    """np.unique of int64 values: one sort, one compare (np.unique's own is ~10x slower).

    The stable sort (timsort for int64) finds the runs a block's keys come in (rows are in
    time order, so a block's (rank, step) prefixes mostly ascend): on a 2^18-row events/loader
    block of benchmarks/synth_trace.py it takes 16 ns a key where quicksort takes 49; on keys in
    random order ~10 % more."""
    x = np.sort(x, kind="stable")
    if len(x) < 2:
        return x
    first = np.empty(len(x), dtype=np.bool_)
    first[0] = True
    np.not_equal(x[1:], x[:-1], out=first[1:])
    return x[first]


def _loader_targets(tables: dict[str, pd.DataFrame], warmup: int) -> dict[str, dict[int, Any]]:
    """Per rank, the interval unions the loader's busy time is measured against."""
    app = tables[Table.APP]
    comp = app[(app["phase"] == Phase.COMPUTE.value) & (app["step"] >= warmup)]
    targets: dict[str, dict[int, Any]] = {"compute": _rank_unions(comp)}
    cuda = tables.get(Table.CUDA)
    if cuda is not None and len(cuda):
        k = cuda[(cuda["kind"] == "kernel") & (cuda["step"] >= warmup)]
        targets["kernel"] = _rank_unions(k)
    return targets
