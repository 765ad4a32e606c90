"""Per-step metrics computed block by block equal the whole-table ones."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from codl.analysis import chunked
from codl.analysis import summarize as sm
from codl.trace.store import TraceWriter, block_rows, open_trace

GOLDEN = Path(__file__).resolve().parent / "golden" / "traces"


def _compare(got: pd.DataFrame, want: pd.DataFrame) -> None:
    got = got.sort_values(sm.KEYS).reset_index(drop=True)
    want = want.sort_values(sm.KEYS).reset_index(drop=True)
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
        warmup = sm.warmup_steps(t.attrs)
    loader, api = _whole_table(trace, warmup)
    _compare(chunked.loader_stage_sums(trace, warmup=warmup), loader)
    _compare(chunked.api_step_metrics(trace, warmup=warmup), api)


def _synthetic(path: Path) -> Path:
    """Two ranks, steps -1..59, loader and CUDA API rows over several blocks, steps that
    straddle block boundaries, and stages/kinds some steps lack."""
    rng = np.random.default_rng(3)
    n = 2 * block_rows("events/loader") + 12_345
    step = np.sort(rng.integers(-1, 60, n))
    start = np.arange(n, dtype=np.int64) * 1000
    stages = np.array(["fetch", "decode", "transform", "collate"], dtype=object)
    stage = stages[rng.integers(0, 4, n)]
    stage[step == 7] = "fetch"  # a step with one stage only
    names = np.array(["cudaLaunchKernel", "cudaMemcpyAsync", "cuLaunchKernel", "k"], dtype=object)
    kinds = np.array(["runtime", "runtime", "runtime", "kernel"], dtype=object)
    pick = rng.integers(0, 4, n)
    with TraceWriter(path) as w:
        w.set_attrs(warmup_steps=2)
        for lo in range(0, n, 50_000):
            sl = slice(lo, min(n, lo + 50_000))
            m = sl.stop - lo
            common = {
                "rank": (np.arange(lo, sl.stop) % 2).astype(np.int16),
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
        return w.finish()


@pytest.mark.parametrize(("processes", "threads"), [(1, 1), (2, 1), (1, 3)])
def test_a_long_multi_block_trace_gives_the_same_per_step_metrics(
    tmp_path: Path, processes: int, threads: int
) -> None:
    trace = _synthetic(tmp_path / "t.h5")
    with open_trace(trace) as t:
        assert len(t.block_ranges("events/loader")) >= 1
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


def _assert_same_frames(got: tuple[pd.DataFrame, ...], want: tuple[pd.DataFrame, ...]) -> None:
    for g, w in zip(got, want, strict=True):
        pd.testing.assert_frame_equal(g, w, check_exact=False, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.h5.gz")))
def test_summarize_trace_reading_blocks_equals_the_whole_tables(name: str, tmp_path: Path) -> None:
    trace = tmp_path / name.removesuffix(".gz")
    with gzip.open(GOLDEN / name, "rb") as src, trace.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    want = sm.summarize_tables(*sm.read_tables(trace))
    _assert_same_frames(sm.summarize_trace(trace), want)


def test_pruned_tables_keep_the_measured_rows_summarize_reads(tmp_path: Path) -> None:
    # Decoding threads here; summarize_trace's own single-threaded read is the golden test's.
    trace = _synthetic(tmp_path / "t.h5")
    tables, attrs = chunked.read_summary_tables(trace, threads=2)
    whole, _ = sm.read_tables(trace)
    loader, cuda = whole["events/loader"], whole["events/cuda"]
    assert len(tables["events/loader"]) == int((loader["step"] >= 2).sum())
    runtime = cuda[(cuda["step"] >= 2) & cuda["kind"].astype(str).isin(["runtime", "kernel"])]
    assert len(tables["events/cuda"]) == len(runtime) > 0
    _assert_same_frames(sm.summarize_tables(tables, attrs), sm.summarize_tables(whole, attrs))
