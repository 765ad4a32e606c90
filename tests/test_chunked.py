"""Per-step metrics computed block by block equal the whole-table ones."""

from __future__ import annotations

import gzip
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from codl.analysis import chunked, columns, intervals
from codl.analysis import decompose as dec
from codl.analysis import summarize as sm
from codl.analysis.intervals import interval_union
from codl.errors import CodlError, TraceFormatError
from codl.figures import data as figdata
from codl.figures import run_tables
from codl.paths import RunFiles
from codl.steps.analysis import summarize_to
from codl.trace.store import TraceWriter, block_rows, open_trace, reader

GOLDEN = Path(__file__).resolve().parent / "golden" / "traces"


def _compare(got: pd.DataFrame, want: pd.DataFrame) -> None:
    got = got.sort_values(columns.KEYS).reset_index(drop=True)
    want = want.sort_values(columns.KEYS).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12, atol=0)


def _whole_table(path: Path, warmup: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    with open_trace(path) as t:
        loader = sm.loader_metrics(t.table("events/loader"), warmup=warmup)
        api = sm.api_metrics(t.table("events/cuda"), warmup=warmup)
    return loader[list(chunked.LOADER_SUM_COLUMNS)], api


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.h5.gz")))
def test_golden_traces_give_the_same_per_step_metrics(name: str, tmp_path: Path) -> None:
    trace = tmp_path / name.removesuffix(".gz")
    with gzip.open(GOLDEN / name, "rb") as src, trace.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    with open_trace(trace) as t:
        warmup = columns.warmup_steps(t.attrs)
    loader, api = _whole_table(trace, warmup)
    _compare(chunked.loader_stage_sums(trace, warmup=warmup), loader)
    _compare(chunked.api_step_metrics(trace, warmup=warmup), api)


def _synthetic(
    path: Path,
    compression: str = "blosc-lz4",
    by_rank: bool = False,
    launch_names: int = 0,
    runtime_only: bool = False,
    app: bool = False,
) -> Path:
    """Two ranks, steps -1..59, loader and CUDA API rows over several blocks, steps that
    straddle block boundaries, and stages/kinds some steps lack. Rows alternate between the
    ranks (blocks reduced by bincount), or ``by_rank``: rank 0's rows, then rank 1's, each in
    step order, as a merged trace has them (blocks reduced run by run). ``launch_names`` more
    runtime calls whose names are launches (the reduction compares a few, looks up more).
    ``runtime_only``: events/cuda has runtime calls only, as a ``cuda_api`` trace (blocks of
    measured steps reduced without gathers). ``app``: each rank's compute span of every
    step in events/app (the first half of the step's time), which the loader's overlap is
    measured against."""
    rng = np.random.default_rng(3)
    n = 2 * block_rows("events/loader") + 12_345
    step = np.sort(rng.integers(-1, 60, n))
    rank = (np.arange(n) % 2).astype(np.int16)
    if by_rank:
        rank = (np.arange(n) >= (n + 1) // 2).astype(np.int16)
        step = np.concatenate([step[0::2], step[1::2]])[:n]
    start = np.arange(n, dtype=np.int64) * 1000
    stages = np.array(["fetch", "decode", "transform", "collate"], dtype=object)
    stage = stages[rng.integers(0, 4, n)]
    stage[step == 7] = "fetch"  # a step with one stage only
    names = np.array(
        ["cudaLaunchKernel", "cudaMemcpyAsync", "cuLaunchKernel", "k", "Memcpy HtoD", "sync"],
        dtype=object,
    )
    kinds = np.array(["runtime", "runtime", "runtime", "kernel", "memcpy", "overhead"], object)
    names = np.append(names, [f"cudaLaunchKernel_v{i}" for i in range(launch_names)])
    kinds = np.append(kinds, ["runtime"] * launch_names)
    pick = rng.integers(0, len(kinds), n)
    if runtime_only:
        pick = np.flatnonzero(kinds == "runtime")[pick % int((kinds == "runtime").sum())]
    with TraceWriter(path, compression=compression) as w:
        w.set_attrs(warmup_steps=2)
        for lo in range(0, n, 50_000):
            sl = slice(lo, min(n, lo + 50_000))
            m = sl.stop - lo
            common = {
                "rank": rank[sl],
                "step": step[sl],
                "start_ns": start[sl],
                "end_ns": start[sl] + rng.integers(1, 10**6, m),
            }
            w.append(
                "events/loader",
                {
                    **common,
                    "worker": np.zeros(m, np.int16),
                    "pid": np.full(m, 9),
                    "tid": np.full(m, 9),
                    "cpu": np.zeros(m, np.int16),
                    "item": np.arange(lo, sl.stop),
                    "stage": stage[sl],
                },
            )
            w.append(
                "events/cuda",
                {
                    **common,
                    "kind": kinds[pick[sl]],
                    "name": names[pick[sl]],
                    "tid": np.full(m, 9),
                    "stream": np.full(m, -1),
                    "correlation": np.arange(lo, sl.stop),
                },
            )
        if app:
            span = n * 1000 // 61
            steps = np.repeat(np.arange(60), 2)
            begin = (steps + 1) * span
            w.append(
                "events/app",
                {
                    "rank": np.tile(np.arange(2, dtype=np.int16), 60),
                    "step": steps,
                    "phase": np.full(120, "compute", dtype=object),
                    "tid": np.full(120, 9),
                    "start_ns": begin,
                    "end_ns": begin + span // 2,
                    "gpu_ns": np.full(120, -1),
                },
            )
        return w.finish()


@pytest.mark.parametrize(
    ("processes", "threads", "compression", "by_rank"),
    [
        (1, 1, "blosc-lz4", False),
        (2, 1, "gzip", False),
        (1, 3, "gzip", True),
        (2, 2, "blosc-lz4", True),
    ],
)
def test_a_long_multi_block_trace_gives_the_same_per_step_metrics(
    tmp_path: Path,
    processes: int,
    threads: int,
    compression: str,
    by_rank: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Blocks of at most 100 K rows (1 Mi by default): the 274 K-row tables come in 3 ranges, so
    # steps straddle blocks, the process pool and the alternating read buffers all run.
    # The reader owns the block size: patched there, where _ranges looks it up.
    monkeypatch.setattr(reader, "_VERIFY_BLOCK_ROWS", 100_000)
    trace = _synthetic(tmp_path / "t.h5", compression, by_rank)
    with open_trace(trace) as t:
        assert len(t.block_ranges("events/loader")) >= 3
        assert len(t.block_ranges("events/cuda")) >= 3
        assert len(t.chunk_index("events/loader")) == 3  # type: ignore[arg-type]
    loader, api = _whole_table(trace, 2)
    assert len(loader) == 2 * 58 and len(api) == 2 * 58
    got_loader = chunked.loader_stage_sums(trace, warmup=2, processes=processes, threads=threads)
    _compare(got_loader, loader)
    assert got_loader["loader_decode_ms"].isna().sum() == 2  # step 7 of both ranks
    _compare(chunked.api_step_metrics(trace, warmup=2, processes=processes, threads=threads), api)
    _, rows = chunked.step_partials(trace, "api", warmup=2, processes=processes, threads=threads)
    with open_trace(trace) as t:
        assert rows == len(t.table("events/cuda"))


@pytest.mark.parametrize("by_rank", [False, True])
def test_many_launch_names_give_the_same_api_metrics(tmp_path: Path, by_rank: bool) -> None:
    trace = _synthetic(tmp_path / "t.h5", by_rank=by_rank, launch_names=4)
    _, api = _whole_table(trace, 2)
    assert (api["launch_kernel_calls"] > 0).all()
    _compare(chunked.api_step_metrics(trace, warmup=2), api)


def test_both_codecs_give_identical_per_step_metrics(tmp_path: Path) -> None:
    blosc = _synthetic(tmp_path / "blosc.h5", "blosc-lz4", by_rank=True)
    gz = _synthetic(tmp_path / "gzip.h5", "gzip", by_rank=True)
    assert blosc.stat().st_size != gz.stat().st_size  # two codecs, not one file twice
    for metrics in (chunked.loader_stage_sums, chunked.api_step_metrics):
        pd.testing.assert_frame_equal(metrics(blosc, warmup=2), metrics(gz, warmup=2))
    with open_trace(blosc) as b, open_trace(gz) as g:
        for table in ("events/loader", "events/cuda"):
            window = {"t0": 10**8, "t1": 10**8 + 10**6}
            pd.testing.assert_frame_equal(b.table(table, **window), g.table(table, **window))
            want = g.read_rows(table, 0, g.block_ranges(table)[-1][1])
            for name, values in b.read_rows(table, 0, len(want["step"])).items():
                np.testing.assert_array_equal(values, want[name])


def _assert_same_frames(got: tuple[pd.DataFrame, ...], want: tuple[pd.DataFrame, ...]) -> None:
    for g, w in zip(got, want, strict=True):
        pd.testing.assert_frame_equal(g, w, check_exact=False, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.h5.gz")))
def test_summarize_trace_reading_blocks_equals_the_whole_tables(name: str, tmp_path: Path) -> None:
    trace = tmp_path / name.removesuffix(".gz")
    with gzip.open(GOLDEN / name, "rb") as src, trace.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    whole, attrs = sm.read_tables(trace)
    want = sm.summarize_tables(whole, attrs)
    _assert_same_frames(sm.summarize_trace(trace), want)
    # The workflow's reading (steps.analysis.summarize_to): warm-up rows kept for the step timeline;
    # the decomposition's inputs and the figure tables are those of the whole tables.
    pruned, _ = chunked.read_summary_tables(trace, warmup_rows=True)
    _assert_same_frames(sm.summarize_tables(pruned, attrs), want)
    kw = {"warmup": columns.warmup_steps(attrs), "ranks_per_node": sm.ranks_per_node(attrs)}
    _assert_same_frames((dec.step_parts(pruned, **kw),), (dec.step_parts(whole, **kw),))
    spec = attrs["spec"]
    for table in (run_tables.api_calls, run_tables.timeline):
        _assert_same_frames((table(pruned, attrs, spec),), (table(whole, attrs, spec),))


@pytest.mark.parametrize("name", ["r2_combined.h5.gz", "r1_combined.h5.gz"])
def test_summarize_to_writes_the_attribution_in_pieces_as_the_whole_table(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # summarize_to never holds the attribution: it writes each piece as it comes. In pieces of
    # a few rows each, every table it writes is that of pieces of the default size, and the
    # attribution is summarize_tables' whole table, row for row.
    trace = tmp_path / "t.h5"
    with gzip.open(GOLDEN / name, "rb") as src, trace.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    tables = ["steps", "summary", "attribution", "parts", "api_calls", "timeline"]

    def run(out: Path) -> dict[str, pd.DataFrame]:
        summarize_to(trace, **RunFiles(out).tables())
        return {t: pd.read_parquet(out / f"{t}.parquet") for t in tables}

    default = run(tmp_path / "default")
    monkeypatch.setattr(sm, "ATTRIBUTION_PIECE_ROWS", 5)
    small = run(tmp_path / "small")
    assert len(default["attribution"]) >= 20
    assert pq.ParquetFile(tmp_path / "small" / "attribution.parquet").num_row_groups > 2
    for t in tables:
        pd.testing.assert_frame_equal(small[t], default[t], check_exact=True)
    whole, attrs = sm.read_tables(trace)
    _, summary, attribution = sm.summarize_tables(whole, attrs)
    pd.testing.assert_frame_equal(default["attribution"], attribution, check_exact=True)
    pd.testing.assert_frame_equal(default["summary"], summary)


def test_a_failed_attribution_write_on_its_thread_leaves_no_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pieces are written on a thread: the third piece's failure there reaches the caller,
    # and the unit of outputs is not made (no summary beside a partial attribution).
    trace = tmp_path / "t.h5"
    with gzip.open(GOLDEN / "r2_combined.h5.gz", "rb") as src, trace.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    monkeypatch.setattr(sm, "ATTRIBUTION_PIECE_ROWS", 5)
    written = []
    real = pq.ParquetWriter.write_table

    def write_table(self: pq.ParquetWriter, table: object) -> None:
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        written.append(len(table))  # type: ignore[arg-type]
        real(self, table)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    out = RunFiles(tmp_path / "out").tables()
    # One line naming the output being written (codl.outputs turns the full disk into it).
    with pytest.raises(CodlError, match=r"attribution\.parquet: No space left on device"):
        summarize_to(trace, **out)
    assert len(written) == 2  # pieces of whole steps, >= 5 rows each
    assert not [p for p in out.values() if p.exists()]


def test_summarize_to_writes_an_empty_attribution_with_its_columns(tmp_path: Path) -> None:
    # A trace without scheduler samples (trace.sched off) has no attribution: the file is
    # written all the same, with the attribution's columns.
    trace = _synthetic(tmp_path / "t.h5")
    with open_trace(trace) as t:
        assert "samples/sched" not in t.tables()
    out = {k: tmp_path / f"{k}.parquet" for k in ("steps", "summary", "attribution", "parts")}
    summarize_to(trace, **out)
    got = pd.read_parquet(out["attribution"])
    assert got.empty
    _, attrs = sm.read_tables(trace)
    want = sm.empty_attribution(str(attrs.get("run_id", "")))
    pd.testing.assert_frame_equal(got, want, check_index_type=False)


def test_pruned_tables_keep_the_measured_rows_summarize_reads(tmp_path: Path) -> None:
    # Decoding threads here; summarize_trace's own single-threaded read is the golden test's.
    trace = _synthetic(tmp_path / "t.h5")
    tables, attrs = chunked.read_summary_tables(trace, threads=2)
    whole, _ = sm.read_tables(trace)
    loader, cuda = whole["events/loader"], whole["events/cuda"]
    assert len(tables["events/loader"]) == int((loader["step"] >= 2).sum())
    used = cuda["kind"].astype(str).isin(["runtime", "kernel", "memcpy"])  # not "overhead"
    assert len(tables["events/cuda"]) == int(((cuda["step"] >= 2) & used).sum()) > 0
    _assert_same_frames(sm.summarize_tables(tables, attrs), sm.summarize_tables(whole, attrs))
    # What the decomposition's GPU time and the API latency figure read of events/cuda.
    pruned_cuda = tables["events/cuda"]
    _assert_same_frames(
        (dec.gpu_parts(pruned_cuda, warmup=2), figdata.api_latencies(pruned_cuda, "", warmup=2)),
        (dec.gpu_parts(cuda, warmup=2), figdata.api_latencies(cuda, "", warmup=2)),
    )


class _Lagging(chunked.OneBehind):
    """A reduction thread as late as it can be: each call runs only when the next is submitted
    (or at ``wait``), after the caller has reduced, and the reader read, the next block."""

    _pending: tuple[Callable[..., None], tuple[Any, ...]] | None = None

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self.wait()
        self._pending = (fn, args)

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[0](*pending[1])


@pytest.mark.parametrize(
    ("by_rank", "stream_rows", "runtime_only", "lagging"),
    [
        (False, None, False, False),
        (True, None, False, False),
        (True, 5_000, False, True),
        (False, 5_000, True, False),
        (False, 5_000, True, True),
    ],
)
def test_reduced_runtime_calls_give_the_same_tables(
    tmp_path: Path,
    by_rank: bool,
    stream_rows: int | None,
    runtime_only: bool,
    lagging: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # summarize_to's reading: the runtime calls reduced as they are read (exact histograms),
    # the tables equal to those of the whole tables; the CDF table counts every call once.
    # Blocks of one chunk-index entry each (3 of each table; 2 by default): the third is read
    # into the first's arrays while the latencies and item counts of the second are reduced
    # on a thread.
    if stream_rows is not None:
        monkeypatch.setattr(chunked, "_STREAM_ROWS", stream_rows)
    if lagging:
        monkeypatch.setattr(chunked, "OneBehind", _Lagging)
    trace = _synthetic(
        tmp_path / "t.h5", by_rank=by_rank, launch_names=2, runtime_only=runtime_only
    )
    whole, attrs = sm.read_tables(trace)
    tables, _, api, loader = chunked.read_summary(trace, threads=2)
    assert len(tables["events/cuda"]) < len(whole["events/cuda"]) or runtime_only
    assert set(tables["events/cuda"]["kind"].astype(str)) <= {"kernel", "memcpy", "memset"}
    _assert_same_frames(
        sm.summarize_tables(tables, attrs, api=api, loader=loader),
        sm.summarize_tables(whole, attrs),
    )
    spec = {"mode": "combined", "pinning": {"policy": "none"}, "trace": {"cuda_api": True}}
    per_call = run_tables.api_calls(whole, attrs, spec)
    hist = run_tables.api_calls(tables, attrs, spec, api)
    assert hist["calls"].sum() == len(per_call) > len(hist)
    by_name = hist.groupby("name")["calls"].sum()
    pd.testing.assert_series_equal(
        by_name, per_call.groupby("name").size().astype("int64"), check_names=False
    )
    # The CDF from the buckets is exact at every bucket edge.
    for name, g in hist.groupby("name"):
        us = np.sort(per_call.loc[per_call["name"] == name, "us"].to_numpy())
        at_or_below = np.searchsorted(us, g["us"].to_numpy() + 1e-9, side="right")
        np.testing.assert_array_equal(at_or_below, np.cumsum(g["calls"].to_numpy()))


@pytest.mark.parametrize("loader_process", [False, True])
def test_an_error_in_a_reduction_on_its_thread_reaches_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loader_process: bool
) -> None:
    # The item counts run on a thread, one block behind: their failure in the 2nd of 3 blocks
    # is raised by read_summary, not lost with the thread, nor with the loader's process.
    monkeypatch.setattr(chunked, "_STREAM_ROWS", 5_000)
    trace = _synthetic(tmp_path / "t.h5")
    calls = []
    real = chunked._LoaderPass._count_items

    def count_items(self: chunked._LoaderPass, keys: list[np.ndarray]) -> None:
        calls.append(len(keys[0]))
        if len(calls) == 2:
            raise MemoryError("the 2nd block's keys")
        real(self, keys)

    monkeypatch.setattr(chunked._LoaderPass, "_count_items", count_items)
    with open_trace(trace) as t:
        assert len(t.chunk_index("events/loader")) == 3  # type: ignore[arg-type]
    with pytest.raises(MemoryError, match="2nd block"):
        chunked.read_summary(trace, loader_process=loader_process)
    if not loader_process:  # a forked child counts in its own copy of ``calls``
        assert len(calls) >= 2


@pytest.mark.parametrize("gpu_rows", [False, True])
def test_the_loader_pass_in_its_own_process_gives_the_same_reduction(
    tmp_path: Path, gpu_rows: bool
) -> None:
    # events/loader reduced in a forked child, beside the parent's pass over events/cuda:
    # the same per-step sums, item counts and overlaps as in one process. With GPU activity
    # rows the child declines (the kernel overlap needs events/cuda) and the parent does it.
    trace = _synthetic(tmp_path / "t.h5", runtime_only=not gpu_rows, app=True)
    with open_trace(trace) as t:
        assert any(k in t.strings for k in ("kernel", "memcpy", "memset")) == gpu_rows
    here = chunked.read_summary(trace, threads=2, loader_process=False)
    apart = chunked.read_summary(trace, threads=2, loader_process=True)
    pd.testing.assert_frame_equal(apart[3].steps, here[3].steps, check_exact=True)
    assert apart[3].overlaps == pytest.approx(here[3].overlaps, rel=0, abs=0, nan_ok=True)
    assert not np.isnan(here[3].overlaps["loader_compute_overlap"])
    assert np.isnan(here[3].overlaps["kernel_loader_overlap"]) != gpu_rows
    assert here[3].steps["loader_items"].sum() > 0
    for name in here[0]:
        pd.testing.assert_frame_equal(apart[0][name], here[0][name], check_exact=True)


def test_a_loader_table_that_fails_its_check_in_the_child_is_refused(tmp_path: Path) -> None:
    # The child verifies events/loader: a changed byte there is raised by read_summary in
    # the parent, as the one-process read raises it.
    trace = _synthetic(tmp_path / "t.h5", runtime_only=True)
    with h5py.File(trace, "r+") as f:
        ds = f["events/loader/item"]
        ds[3] = ds[3] + 1
    for loader_process in (False, True):
        with pytest.raises(TraceFormatError, match="events/loader/item"):
            chunked.read_summary(trace, loader_process=loader_process)


def test_a_loader_process_that_dies_is_an_error_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A child killed before it answers (here: it exits at once) is reported with its exit
    # code; the parent neither waits for ever nor goes on without the loader's numbers.
    trace = _synthetic(tmp_path / "t.h5", runtime_only=True)
    monkeypatch.setattr(chunked, "_loader_alone", lambda path, threads: os._exit(7))
    with pytest.raises(RuntimeError, match="ended without a result, exit code 7"):
        chunked.read_summary(trace, loader_process=True)


@pytest.mark.parametrize("item_offset", [0, 1 << 62])
def test_loader_items_counted_once_per_key_across_blocks(item_offset: int) -> None:
    # An item's stage rows may fall in two blocks: counted once, against the block before.
    # Keys too wide for one int64 (item_offset) take pandas' hashing, with the same counts.
    rng = np.random.default_rng(5)
    blocks = []
    for b in range(4):
        n = 5_000
        blocks.append(
            [
                rng.integers(0, 2, n),  # rank
                np.sort(rng.integers(3 * b, 3 * b + 4, n)),  # steps overlap the next block's
                rng.integers(100, 104, n),  # pid
                rng.integers(0, 300, n) + item_offset,  # item
            ]
        )
    counter = chunked._LoaderPass([""], 0, {})
    for keys in blocks:
        counter._count_items([k.astype(np.int64) for k in keys])
    got = pd.concat(counter._counts).groupby(level=["rank", "step"]).sum().sort_index()
    want_parts = []
    last = pd.DataFrame(columns=["rank", "step", "pid", "item"], dtype="int64")
    for keys in blocks:
        frame = pd.DataFrame(dict(zip(["rank", "step", "pid", "item"], keys, strict=True)))
        frame = frame.drop_duplicates()
        new = frame.merge(last, how="left", indicator=True)["_merge"] == "left_only"
        want_parts.append(frame[new.to_numpy()].groupby(["rank", "step"]).size())
        last = frame
    want = pd.concat(want_parts).groupby(level=["rank", "step"]).sum().sort_index()
    pd.testing.assert_series_equal(got, want, check_names=False, check_dtype=False)
    assert got.sum() > 0


def test_the_loader_gets_a_process_where_it_pays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Asked for, or on Linux with four cores or more for a trace of 32 MiB or more, from a
    # process with no other Python thread (a fork then could copy a lock another thread holds).
    big, small = tmp_path / "big.h5", tmp_path / "small.h5"
    with big.open("wb") as fh:
        fh.truncate(chunked._PROCESS_MIN_BYTES)
    small.write_bytes(b"x")
    monkeypatch.setattr(chunked.sys, "platform", "linux")
    monkeypatch.setattr(chunked, "default_threads", lambda: 4)
    assert chunked._loader_process_pays(None, big)
    assert not chunked._loader_process_pays(None, small)
    assert not chunked._loader_process_pays(None, tmp_path / "missing.h5")
    assert not chunked._loader_process_pays(False, big)
    assert chunked._loader_process_pays(True, small)
    monkeypatch.setattr(chunked, "default_threads", lambda: 3)
    assert not chunked._loader_process_pays(None, big)
    monkeypatch.setattr(chunked, "default_threads", lambda: 4)
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert not chunked._loader_process_pays(None, big)
    finally:
        release.set()
        other.join()
    monkeypatch.setattr(chunked.sys, "platform", "darwin")
    assert not chunked._loader_process_pays(None, big)


def test_a_failed_read_in_the_parent_ends_the_loader_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The parent's own read fails (a changed byte in events/cuda) while the child still works:
    # the parent raises at once and the child is ended, not waited for.
    trace = _synthetic(tmp_path / "t.h5", runtime_only=True)
    with h5py.File(trace, "r+") as f:
        ds = f["events/cuda/correlation"]
        ds[3] = ds[3] + 1
    children: list[int] = []
    real = chunked._LoaderProcess.__init__

    def start(self: chunked._LoaderProcess, path: Path, threads: int) -> None:
        real(self, path, threads)
        children.append(self._child.pid or 0)

    monkeypatch.setattr(chunked._LoaderProcess, "__init__", start)
    monkeypatch.setattr(chunked, "_loader_alone", lambda path, threads: time.sleep(120))
    began = time.monotonic()
    with pytest.raises(TraceFormatError, match="events/cuda/correlation"):
        chunked.read_summary(trace, loader_process=True)
    assert time.monotonic() - began < 60
    assert len(children) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(children[0], 0)


def _ranks_in_turn(path: Path, order: list[tuple[int, int, int]]) -> Path:
    """events/loader and events/app of three ranks that each ran over the same time, their
    rows written in the turns ``order`` gives ((rank, first step, last step), as a merged
    trace writes rank after rank, or as one whose rank 0 comes back, or in short turns):
    index entries of one rank and entries of several, workers' busy intervals with gaps
    between."""
    rng = np.random.default_rng(11)
    step_ns, per_step = 1_000_000, 2_000
    with TraceWriter(path, compression="gzip") as w:
        w.set_attrs(warmup_steps=1)
        for rank, first, last in order:
            steps = np.repeat(np.arange(first, last), per_step)
            m = len(steps)
            start = steps * step_ns + rng.integers(0, step_ns, m)
            end = start + rng.integers(1, 400, m)
            by_end = np.argsort(end, kind="stable")  # rows are written as they end
            w.append(
                "events/loader",
                {
                    "rank": np.full(m, rank, np.int16),
                    "step": steps[by_end],
                    "worker": np.zeros(m, np.int16),
                    "pid": np.full(m, 100 + rank),
                    "tid": np.full(m, 100 + rank),
                    "cpu": np.zeros(m, np.int16),
                    "item": np.arange(m),
                    "stage": np.full(m, "fetch", dtype=object),
                    "start_ns": start[by_end],
                    "end_ns": end[by_end],
                },
            )
            span = np.arange(first, last)
            w.append(
                "events/app",
                {
                    "rank": np.full(len(span), rank, np.int16),
                    "step": span,
                    "phase": np.full(len(span), "compute", dtype=object),
                    "tid": np.full(len(span), 100 + rank),
                    "start_ns": span * step_ns + step_ns // 4,
                    "end_ns": span * step_ns + 3 * step_ns // 4,
                    "gpu_ns": np.full(len(span), -1),
                },
            )
        return w.finish()


@pytest.mark.parametrize(
    "order",
    [
        [(0, 0, 150), (1, 0, 150), (2, 0, 150)],  # rank after rank: a merged trace
        [(0, 0, 80), (1, 0, 150), (0, 80, 150), (2, 0, 150)],  # rank 0 comes back
        [(r, s, s + 2) for s in range(0, 150, 2) for r in range(3)],  # turns: every entry mixed
    ],
)
def test_the_loaders_overlap_is_exact_and_its_union_stays_small_rank_after_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: list[tuple[int, int, int]]
) -> None:
    # The busy-time union closes its pieces at each rank's own watermark: the same fraction
    # as the whole tables give, with only the pieces the next rows can still reach held open.
    # With one watermark over the table (the next rank's first start is the run's start) a
    # rank's union held all of its pieces, and each block was joined to them all.
    trace = _ranks_in_turn(tmp_path / "t.h5", order)
    with open_trace(trace) as t:
        index = t.chunk_index("events/loader")
        assert index is not None and len(index) >= 6
        loader, app = t.table("events/loader"), t.table("events/app")
        marks = chunked._Watermarks(t, "events/loader")
        rank, start = loader["rank"].to_numpy(), loader["start_ns"].to_numpy()
        for hi in index[:, 1].tolist():
            for r in range(3):
                later = start[hi:][rank[hi:] == r]
                bound = int(later.min()) if len(later) else np.iinfo(np.int64).max
                assert marks.after(hi, r) == bound
    want = sm.overlaps(app, loader, reader.empty_frame("events/cuda"), warmup=1)
    held: list[int] = []
    add = intervals.UnionOverlap.add

    def add_held(self: Any, starts: Any, ends: Any, watermark: int) -> None:
        add(self, starts, ends, watermark)
        held.append(len(self._open))

    monkeypatch.setattr(intervals.UnionOverlap, "add", add_held)
    got = chunked.read_summary(trace, loader_process=False)[3].overlaps
    assert got["loader_compute_overlap"] == want["loader_compute_overlap"]
    assert 0.05 < got["loader_compute_overlap"] < 0.95
    pieces = len(interval_union(start, loader["end_ns"].to_numpy()))
    assert len(held) >= 6 and max(held) < pieces / 50
    # The loader's own process (4+ cores) builds its watermarks the same way.
    apart = chunked.read_summary(trace, loader_process=True)[3].overlaps
    assert apart["loader_compute_overlap"] == want["loader_compute_overlap"]
