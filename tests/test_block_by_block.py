"""The commands between a run and its summary, block by block (issue 36: a day-long run's
ranks hold 10^8 rows each, too many to read whole): merging rank traces (what the merged trace
holds, what a corrupt part leaves behind), `codl inspect` (every row counted and checked) and
the per-call table a user asks for (`codl summarize --calls`), and the compare's merged
attribution table (~10^6 rows per 10^8-event run), copied run by run."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from codl.cli import main
from codl.errors import CodlError, TraceFormatError
from codl.paths import RunFiles
from codl.spec import RunSpec
from codl.steps import analysis
from codl.steps.analysis import CALL_COLUMNS, write_calls
from codl.trace.store import TraceWriter, incomplete_path, open_trace
from codl.trace.store.merge import merge_incomplete_ranks, merge_rank_traces, rank_trace_path

SPEC = {"layout": {"ranks_per_node": 2}}
RUN_ID = RunSpec.from_dict(SPEC).run_id
# More rows than one block the merge reads (2^18), so that a rank's table comes in pieces.
ROWS = 300_000


def cuda_rows(rank: int, n: int) -> dict[str, object]:
    """``n`` runtime calls of rank ``rank``: rank 1 names them in another order, and its last
    name first appears after the merge's first block."""
    names = ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaEventRecord"]
    order = names if rank == 0 else names[::-1]
    idx = np.arange(n)
    name = np.where(idx < ROWS - 1000, idx % 2, 2)
    if rank == 1:
        name[: ROWS - 1000] = (idx[: ROWS - 1000] + 1) % 2
    start = 1_000_000 + idx * 10
    return {
        "rank": np.full(n, rank, np.int16),
        "step": (idx // 1000).astype(np.int32),
        "kind": ["runtime"] * n,
        "name": [order[i] for i in name],
        "tid": np.full(n, 100 + rank),
        "stream": np.full(n, -1),
        "correlation": idx,
        "start_ns": start,
        "end_ns": start + 5,
    }


def rank_part(trace: Path, rank: int, *, complete: bool = True) -> Path:
    path = rank_trace_path(trace, rank)
    with TraceWriter(path) as w:
        w.set_attrs(
            run_id=RUN_ID,
            spec=SPEC,
            rank=rank,
            world_size=2,
            t_begin_ns=0,
            t_end_ns=10**10,
        )
        w.append(
            "threads",
            {"t_ns": [0], "rank": [rank], "pid": [7], "tid": [100 + rank], "role": ["launch"],
             "name": [f"rank{rank}-main"], "cpus_planned": ["0-3"], "cpus_actual": ["0-3"]},
        )  # fmt: skip
        w.append("events/cuda", cuda_rows(rank, ROWS))
        if complete:
            w.finish()
        else:
            w.abort("killed by the test")
    return path if complete else incomplete_path(path)


def decoded(path: Path, table: str) -> pd.DataFrame:
    with open_trace(path, allow_incomplete=True) as t:
        df = t.table(table)
    return df.astype({c: str for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)})


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def corrupt_a_late_chunk(path: Path) -> None:
    """Flip bits inside events/cuda's data, past its first merge block: HDF5's checksum of
    that chunk fails when it is read."""
    import h5py

    with h5py.File(path, "r") as f:
        ds = f["events/cuda/correlation"]
        info = ds.id.get_chunk_info(ds.id.get_num_chunks() - 1)
        offset, size = info.byte_offset, info.size
    with path.open("r+b") as fh:
        fh.seek(offset + size // 2)
        flipped = bytes(b ^ 0x5A for b in fh.read(8))
        fh.seek(offset + size // 2)
        fh.write(flipped)


def test_merged_trace_holds_every_rank_in_order_with_its_own_strings(tmp_path: Path) -> None:
    trace = tmp_path / "trace.h5"
    parts = [rank_part(trace, r) for r in range(2)]
    want = {n: [decoded(p, n) for p in parts] for n in ("threads", "events/cuda")}
    merge_rank_traces(trace, 2, run_id=RUN_ID)
    with open_trace(trace) as t:
        t.verify()
        assert t.attrs["world_size"] == 2
    for name, frames in want.items():
        got = decoded(trace, name)
        pd.testing.assert_frame_equal(got, pd.concat(frames, ignore_index=True))
    # Rank 1's late name decodes as itself, not as whatever code it had in rank 1's file.
    cuda = decoded(trace, "events/cuda")
    late = cuda[(cuda["rank"] == 1) & (cuda["correlation"] >= ROWS - 1000)]
    assert set(late["name"]) == {"cudaLaunchKernel"}
    assert not any(p.exists() for p in parts)


def test_a_corrupt_rank_part_merges_nothing_and_stays(tmp_path: Path) -> None:
    trace = tmp_path / "trace.h5"
    parts = [rank_part(trace, r) for r in range(2)]
    corrupt_a_late_chunk(parts[1])
    before = {p: digest(p) for p in parts}
    with pytest.raises(TraceFormatError, match="nothing merged"):
        merge_rank_traces(trace, 2, run_id=RUN_ID)
    # No merged trace, complete or incomplete, whose digests would vouch for the damage.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in parts)
    assert {p: digest(p) for p in parts} == before


def test_an_incomplete_merge_leaves_a_rank_it_cannot_read_whole(tmp_path: Path) -> None:
    trace = tmp_path / "trace.h5"
    good = rank_part(trace, 0, complete=False)
    bad = rank_part(trace, 1, complete=False)
    want = decoded(good, "events/cuda")
    corrupt_a_late_chunk(bad)
    before = digest(bad)
    kept = merge_incomplete_ranks(trace, 2, reason="the test stopped it", run_id=RUN_ID)
    assert kept is not None
    # Rank 0 whole, none of rank 1's rows (not its first blocks either), rank 1's file as it was.
    pd.testing.assert_frame_equal(decoded(kept, "events/cuda"), want)
    with open_trace(kept, allow_incomplete=True) as t:
        assert [x["rank"] for x in t.attrs["ranks"]] == [0]
    assert not good.exists()
    assert digest(bad) == before


def test_inspect_counts_every_row_of_a_table_read_in_blocks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    part = rank_part(tmp_path / "trace.h5", 0)
    capsys.readouterr()
    assert main(["inspect", "--json", "--allow-incomplete", str(part)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["rows"] == {"events/cuda": ROWS, "threads": 1}


def test_inspect_refuses_a_late_corrupt_block_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    part = rank_part(tmp_path / "trace.h5", 0)
    corrupt_a_late_chunk(part)
    before = digest(part)
    capsys.readouterr()
    assert main(["--log-level", "WARNING", "inspect", "--allow-incomplete", str(part)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "/events/cuda/correlation" in lines[0], captured.err
    assert digest(part) == before


def calls_trace(path: Path, n: int, warmup: int) -> pd.DataFrame:
    """A one-rank trace of ``n`` events/cuda rows, every third a kernel (GPU activity, not a
    call), 10^5 rows a step; returns the table the calls should make of it."""
    idx = np.arange(n)
    is_kernel = idx % 3 == 2
    names = np.array(["cudaLaunchKernel", "cudaMemcpyAsync", "sgemm_kernel"])
    start = 1_000_000 + idx * 10
    rows = {
        "rank": np.zeros(n, np.int16),
        "step": (idx // 100_000).astype(np.int32),
        "kind": np.where(is_kernel, "kernel", "runtime").tolist(),
        "name": names[np.where(is_kernel, 2, idx % 2)].tolist(),
        "tid": np.full(n, 100),
        "stream": np.where(is_kernel, 7, -1),
        "correlation": idx,
        "start_ns": start,
        "end_ns": start + 5,
    }
    with TraceWriter(path) as w:
        w.set_attrs(run_id=RUN_ID, spec=SPEC, warmup_steps=warmup, t_begin_ns=0, t_end_ns=10**10)
        w.append("events/cuda", rows)
        w.finish()
    calls = pd.DataFrame(rows)[~is_kernel].drop(columns=["kind", "stream"])
    calls["warmup"] = calls["step"] < warmup
    return calls.reset_index(drop=True)


def test_calls_table_holds_every_runtime_call_in_row_groups(tmp_path: Path) -> None:
    trace = tmp_path / "trace.h5"
    # More rows than a block (2^18): the table is written in several pieces.
    want = calls_trace(trace, 600_000, warmup=2)
    out = tmp_path / "calls.parquet"
    assert write_calls(trace, out) == len(want) == 400_000
    import pyarrow.parquet as pq

    assert pq.ParquetFile(out).metadata.num_row_groups >= 2
    got = pd.read_parquet(out)
    assert list(got.columns) == list(CALL_COLUMNS)
    assert got["warmup"].sum() == 2 * 100_000 * 2 // 3 + 1  # steps 0 and 1, less kernels
    pd.testing.assert_frame_equal(got.astype({"name": str}), want, check_dtype=False)
    assert got.dtypes["rank"] == np.int16 and got.dtypes["start_ns"] == np.int64


def test_a_corrupt_trace_writes_no_calls_table_and_keeps_the_last(tmp_path: Path) -> None:
    trace = tmp_path / "trace.h5"
    calls_trace(trace, 300_000, warmup=0)
    out = tmp_path / "calls.parquet"
    write_calls(trace, out)
    before = digest(out)
    corrupt_a_late_chunk(trace)
    with pytest.raises(TraceFormatError, match="events/cuda"):
        write_calls(trace, out)
    assert digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls.parquet", "trace.h5"]


def test_summarize_writes_the_calls_table_only_where_asked(tmp_path: Path) -> None:
    import gzip
    import shutil

    trace = tmp_path / "trace.h5"
    golden = Path(__file__).parent / "golden" / "traces" / "r1_combined.h5.gz"
    with gzip.open(golden, "rb") as src, trace.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    plain, asked = RunFiles(tmp_path / "plain"), RunFiles(tmp_path / "asked")
    assert main(["summarize", str(trace), "--out-dir", str(plain.dir)]) == 0
    assert main(["summarize", str(trace), "--out-dir", str(asked.dir), "--calls"]) == 0
    assert not plain.calls.exists()
    # A CPU run makes no CUDA calls: the table has its columns and no rows; the summary's
    # tables are those written without the flag.
    calls = pd.read_parquet(asked.calls)
    assert list(calls.columns) == list(CALL_COLUMNS) and calls.empty
    for name, path in plain.tables().items():
        pd.testing.assert_frame_equal(
            pd.read_parquet(path), pd.read_parquet(asked.tables()[name]), obj=name
        )


def attribution_file(path: Path, run_id: str, rows: int, seed: int) -> Path:
    """A per-run attribution table as summarize writes it (pieces of one schema), ``rows``
    rows of ``run_id`` in row groups of 1,000."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "run_id": run_id,
            "rank": rng.integers(0, 4, rows),
            "step": np.arange(rows) // 7,
            "thread_rank": rng.integers(0, 4, rows),
            "tid": rng.integers(1, 1 << 22, rows),
            "pid": rng.integers(1, 1 << 22, rows),
            "role": rng.choice(["loader_worker", "pin_memory", "main", 'other, "quoted"'], rows),
            "name": rng.choice(["pt_data_worker", "python3", "nccl,proxy", "wörker"], rows),
            "share_ns": rng.random(rows) * 1e6 / 3,
            "launch_wait_ns": rng.integers(0, 10**9, rows),
            "attributed_wait_ns": np.where(rng.random(rows) < 0.1, np.nan, rng.random(rows) * 1e5),
        }
    )
    df.to_parquet(path, index=False, row_group_size=1000)
    return path


@pytest.mark.parametrize("name", ["attribution.csv", "attribution.csv.gz", "attribution.csv.xz"])
def test_compare_copies_the_attribution_table_run_by_run_as_the_join_reads(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches smaller than a run's table and its row groups, so each run comes in pieces.
    monkeypatch.setattr(analysis, "_COPY_ROWS", 700)
    paths = [
        attribution_file(tmp_path / "a.parquet", "run_a", 2_500, 0),
        attribution_file(tmp_path / "empty.parquet", "run_e", 0, 1),
        attribution_file(tmp_path / "b.parquet", "run_b", 3_001, 2),
    ]
    out = tmp_path / name
    assert analysis._copy_csv(paths, "attribution", {}, out) == 5_501
    expected = tmp_path / f"joined.{name}"
    analysis._read_all(paths, "attribution").to_csv(expected, index=False)
    assert pd.read_csv(out).shape == (5_501, 11)
    opener = {".gz": gzip.open, ".xz": __import__("lzma").open}.get(out.suffix, open)
    with opener(out, "rb") as got, opener(expected, "rb") as want:
        assert got.read() == want.read()


def test_compare_copies_no_rows_as_the_join_of_none(tmp_path: Path) -> None:
    paths = [attribution_file(tmp_path / "e.parquet", "run_e", 0, 0)]
    out = tmp_path / "attribution.csv"
    assert analysis._copy_csv(paths, "attribution", {}, out) == 0
    assert out.read_bytes() == b"\n" == analysis._read_all(paths, "x").to_csv(index=False).encode()


def test_compare_refuses_attribution_tables_of_other_columns_naming_both(tmp_path: Path) -> None:
    a = attribution_file(tmp_path / "a.parquet", "run_a", 10, 0)
    b = attribution_file(tmp_path / "b.parquet", "run_b", 10, 1)
    changed = pd.read_parquet(b).drop(columns="role").assign(step=0.5, extra=1)
    changed.to_parquet(b, index=False)
    with pytest.raises(
        CodlError,
        match=r"b\.parquet: its attribution columns differ from those of .*a\.parquet "
        r"\(no role; extra too; step double, not int64\)",
    ):
        analysis._copy_csv([a, b], "attribution", {}, tmp_path / "attribution.csv")
    with pytest.raises(CodlError, match=r"compressed as \.gz, \.bz2, \.xz .*'\.csv\.zip'"):
        analysis._copy_csv([a], "attribution", {}, tmp_path / "attribution.csv.zip")
