"""Per-step metrics of the big event tables computed block by block, without the whole table.

A trace of an hour's training holds ~10^8 loader and CUDA API events per rank. These functions
read a table a block of rows at a time (the chunk index's blocks, ``Trace.block_ranges``),
reduce each block with numpy to per-(rank, step) partial sums and counts, and add the partials
up; the blocks can be spread over a process pool. Memory stays at one block per process plus
the per-step result, and the results equal ``summarize.loader_metrics`` (the per-stage sums)
and ``summarize.api_metrics`` up to float summation order (tests/test_chunked.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.analysis.summarize import API_STEP_COLUMNS, KEYS, LOADER_ITEM_STAGES
from codl.trace.store import open_trace

LOADER_STAGES = (*LOADER_ITEM_STAGES, "collate")
LOADER_SUM_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    **{f"loader_{s}_ms": "float64" for s in LOADER_STAGES},
}
# Partial sums of one block: per (rank, step), a sum and a count per quantity.
_Partial = pd.DataFrame
_Reducer = Callable[[dict[str, npt.NDArray[Any]], list[str], int], _Partial]


def _step_groups(
    rank: npt.NDArray[Any], step: npt.NDArray[Any], sub: npt.NDArray[np.int64], n_sub: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Group ids of (rank, step, sub) rows, and the groups' (rank, step, sub) keys packed in one
    int64 each: rank in bits 48.., step in 8..47, sub (< n_sub <= 256) in 0..7.

    A block holds a few steps of a few ranks, so the ids are dense offsets from the block's
    smallest rank and step (one pass, no sort); np.unique only when they would be sparse.
    """
    if rank.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    r = rank.astype(np.int64)
    st = step.astype(np.int64)
    r0, s0 = int(r.min()), int(st.min())
    n_r, n_s = int(r.max()) - r0 + 1, int(st.max()) - s0 + 1
    if n_r * n_s * n_sub <= 4 * rank.size + 1024:
        dense = ((r - r0) * n_s + (st - s0)) * n_sub + sub
        present = np.flatnonzero(np.bincount(dense, minlength=n_r * n_s * n_sub))
        remap = np.empty(n_r * n_s * n_sub, np.int64)
        remap[present] = np.arange(present.size)
        pr, rest = np.divmod(present, n_s * n_sub)
        ps, psub = np.divmod(rest, n_sub)
        keys = ((pr + r0) << 48) | (((ps + s0) & 0xFFFFFFFFFF) << 8) | psub
        return keys, remap[dense]
    key = (r << 48) | ((st & 0xFFFFFFFFFF) << 8) | sub
    uniq, inverse = np.unique(key, return_inverse=True)
    return uniq, inverse


def _unpack(uniq: npt.NDArray[np.int64]) -> tuple[npt.NDArray[Any], ...]:
    step = (uniq >> 8) & 0xFFFFFFFFFF
    step = np.where(step >= 1 << 39, step - (1 << 40), step)  # sign of a negative step
    return uniq >> 48, step, uniq & 0xFF


def _loader_block(cols: dict[str, npt.NDArray[Any]], strings: list[str], warmup: int) -> _Partial:
    keep = cols["step"] >= warmup
    stage_of_code = np.full(len(strings), -1, dtype=np.int64)
    for i, stage in enumerate(LOADER_STAGES):
        if stage in strings:
            stage_of_code[strings.index(stage)] = i
    stage = stage_of_code[cols["stage"][keep]]
    ok = stage >= 0
    ms = (cols["end_ns"][keep][ok] - cols["start_ns"][keep][ok]).astype(np.float64) / 1e6
    uniq, inv = _step_groups(cols["rank"][keep][ok], cols["step"][keep][ok], stage[ok], 4)
    rank, step, sub = _unpack(uniq)
    return pd.DataFrame(
        {
            "rank": rank,
            "step": step,
            "sub": sub,
            "sum": np.bincount(inv, weights=ms, minlength=len(uniq)),
            "n": np.bincount(inv, minlength=len(uniq)),
        }
    )


def _api_block(cols: dict[str, npt.NDArray[Any]], strings: list[str], warmup: int) -> _Partial:
    runtime = strings.index("runtime") if "runtime" in strings else -1
    launch = np.array(["LaunchKernel" in s for s in strings], dtype=bool)
    keep = (cols["step"] >= warmup) & (cols["kind"] == runtime)
    us = (cols["end_ns"][keep] - cols["start_ns"][keep]).astype(np.float64) / 1e3
    sub = launch[cols["name"][keep]].astype(np.int64)
    rank, step = cols["rank"][keep], cols["step"][keep]
    frames = []
    # sub 0: every runtime call; sub 1: cudaLaunchKernel and its variants only.
    for s, sel in ((0, np.ones(len(us), dtype=bool)), (1, sub == 1)):
        uniq, inv = _step_groups(rank[sel], step[sel], np.full(int(sel.sum()), s), 2)
        r, st, sb = _unpack(uniq)
        frames.append(
            pd.DataFrame(
                {
                    "rank": r,
                    "step": st,
                    "sub": sb,
                    "sum": np.bincount(inv, weights=us[sel], minlength=len(uniq)),
                    "n": np.bincount(inv, minlength=len(uniq)),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


_TABLES: dict[str, tuple[str, list[str], _Reducer]] = {
    "loader": ("events/loader", ["rank", "step", "stage", "start_ns", "end_ns"], _loader_block),
    "api": ("events/cuda", ["rank", "step", "kind", "name", "start_ns", "end_ns"], _api_block),
}


def _reduce_ranges(args: tuple[str, str, Sequence[tuple[int, int]], int]) -> _Partial:
    """One worker's share: the partial sums of its row ranges (opens the trace itself)."""
    path, which, ranges, warmup = args
    table, columns, reducer = _TABLES[which]
    with open_trace(path, allow_incomplete=True) as t:
        strings = t.strings
        parts = [reducer(t.read_rows(table, lo, hi, columns), strings, warmup) for lo, hi in ranges]
    if not parts:
        return pd.DataFrame(columns=["rank", "step", "sub", "sum", "n"])
    return pd.concat(parts, ignore_index=True).groupby(["rank", "step", "sub"]).sum().reset_index()


def step_partials(
    path: Path, which: str, *, warmup: int, processes: int = 1
) -> tuple[pd.DataFrame, int]:
    """Per (rank, step, sub) sum and count of table ``which`` ("loader" or "api") over every
    block, with ``processes`` worker processes (1: in this process); and the rows read."""
    table = _TABLES[which][0]
    with open_trace(path, allow_incomplete=True) as t:
        ranges = t.block_ranges(table)
    rows = sum(hi - lo for lo, hi in ranges)
    shares = [ranges[i::processes] for i in range(max(1, processes))]
    jobs = [(os.fspath(path), which, share, warmup) for share in shares if share]
    if processes > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=processes) as pool:
            parts = list(pool.map(_reduce_ranges, jobs))
    else:
        parts = [_reduce_ranges(job) for job in jobs]
    if not parts:
        return pd.DataFrame(columns=["rank", "step", "sub", "sum", "n"]), rows
    total = pd.concat(parts, ignore_index=True).groupby(["rank", "step", "sub"]).sum()
    return total.reset_index(), rows


def loader_stage_sums(path: Path, *, warmup: int, processes: int = 1) -> pd.DataFrame:
    """Per (rank, step): summed worker time per loader stage (``loader_<stage>_ms``), as
    ``summarize.loader_metrics`` has them; stages a step did not have are NaN."""
    partial, _ = step_partials(path, "loader", warmup=warmup, processes=processes)
    if partial.empty:
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in LOADER_SUM_COLUMNS.items()})
    wide = partial.pivot_table(index=KEYS, columns="sub", values="sum", aggfunc="sum")
    out = pd.DataFrame(index=wide.index)
    for i, stage in enumerate(LOADER_STAGES):
        out[f"loader_{stage}_ms"] = wide.get(i, np.nan)
    out = out.reset_index()
    return out.astype(LOADER_SUM_COLUMNS)[list(LOADER_SUM_COLUMNS)]


def api_step_metrics(path: Path, *, warmup: int, processes: int = 1) -> pd.DataFrame:
    """``summarize.api_metrics`` computed block by block."""
    partial, _ = step_partials(path, "api", warmup=warmup, processes=processes)
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
