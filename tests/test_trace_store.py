"""The HDF5 trace store: round trips, the temp-name protocol, and rejection of bad files."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd
import pytest

from codl.errors import TraceFormatError
from codl.files import lock_path, signals_deferred
from codl.spec import RunSpec
from codl.trace.schema import SCHEMA_VERSION, TABLES
from codl.trace.store import (
    COMPRESSIONS,
    TraceWriter,
    block_rows,
    buffer_bound_bytes,
    chunk_rows,
    incomplete_path,
    open_trace,
    partial_path,
    reader,
    row_bytes,
    schema_markdown,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "trace-format.md"

# Directory names a cluster user can plausibly have; the store must not care.
DIR_NAMES = ["plain", "with space", "ünïcødé ✓ 跟踪"]
# The codecs a run can choose (trace.compression): every integrity test runs on both.
CODECS = ["blosc-lz4", "gzip"]

ANCHOR_START = {"realtime_ns": 1_700_000_000_000_000_000, "monotonic_ns": 5_000, "error_ns": 120}
ANCHOR_END = {"realtime_ns": 1_700_000_000_000_900_000, "monotonic_ns": 905_000, "error_ns": 80}
# A real spec and its run_id: verify() re-derives the id from the stored spec.
SPEC = RunSpec.from_dict({"mode": "combined", "loader": {"workers": 4}})
ATTRS: dict[str, Any] = {
    "run_id": SPEC.run_id,
    "spec": SPEC.to_dict(),
    "host": "node-07",
    "slurm_job_id": "123456",
    "git_revision": "0123abcd",
    "versions": {"torch": "2.14.1", "h5py": "3.16.0"},
    "anchors_start": ANCHOR_START,
    "anchors_end": ANCHOR_END,
    "t_begin_ns": 10_000,
    "t_end_ns": 900_000,
    "warmup_steps": 2,
    "clk_tck": 100,
}


def known_columns() -> dict[str, dict[str, list[Any]]]:
    """Three rows per table with distinct, recognisable values (strings for sym columns)."""
    strings = {
        "phase": ["forward", "backward", "optimizer"],
        "stage": ["fetch", "decode", "collate"],
        "kind": ["runtime", "kernel", "memcpy"],
        "name": ["cudaLaunchKernel", "sm90_xmma_gemm_ñ", "Memcpy HtoD"],
        "op": ["allreduce", "allreduce", "group_allreduce"],
        "role": ["launch", "pin_memory", "loader"],
        "cpus_planned": ["0-3", "", "8,9"],
        "cpus_actual": ["0-3", "0-63", "8,9"],
        "prev_state": ["R", "S", "R+"],
    }
    out: dict[str, dict[str, list[Any]]] = {}
    for t_i, (table, columns) in enumerate(TABLES.items()):
        cols: dict[str, list[Any]] = {}
        for c_i, c in enumerate(columns):
            if c.is_symbol:
                if table == "threads" and c.name == "name":
                    cols[c.name] = ["python3", "pt_autograd_0", "pt_data_worker"]
                else:
                    cols[c.name] = strings[c.name]
            elif c.name == "start_ns":
                cols[c.name] = [10_000, 20_000, 30_000]
            elif c.name == "end_ns":
                cols[c.name] = [15_000, 28_000, 30_500]
            elif c.name == "t_ns":
                cols[c.name] = [10_000, 20_000, 30_000]
            else:
                # Distinct per table and column, and negative in one row to catch sign bugs.
                cols[c.name] = [t_i * 100 + c_i, -(t_i * 100 + c_i + 1), 7]
        out[table] = cols
    return out


def write_trace(
    path: Path,
    columns: dict[str, dict[str, list[Any]]] | None = None,
    compression: str = "blosc-lz4",
) -> Path:
    with TraceWriter(path, compression=compression) as w:
        w.set_attrs(**ATTRS)
        for table, cols in (columns or known_columns()).items():
            w.append(table, cols)
        return w.finish()


@pytest.fixture(params=DIR_NAMES)
def trace_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    d = tmp_path / str(request.param)
    d.mkdir()
    return d


@pytest.mark.parametrize("compression", CODECS)
def test_round_trip_every_table(trace_dir: Path, compression: str) -> None:
    path = write_trace(trace_dir / "run ✓.h5", compression=compression)
    assert path == trace_dir / "run ✓.h5"
    assert sorted(p.name for p in trace_dir.iterdir()) == ["run ✓.h5"]
    expected = known_columns()
    with open_trace(path) as t:
        assert t.tables() == list(TABLES)
        for table, columns in TABLES.items():
            df = t.table(table)
            assert list(df.columns) == [c.name for c in columns]
            assert len(df) == 3
            for c in columns:
                if c.is_symbol:
                    assert isinstance(df[c.name].dtype, pd.CategoricalDtype)
                    assert df[c.name].tolist() == expected[table][c.name]
                else:
                    assert df[c.name].dtype == np.dtype(c.numpy_dtype), (table, c.name)
                    assert df[c.name].tolist() == expected[table][c.name], (table, c.name)


def test_root_attributes_round_trip(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.h5")
    with open_trace(path) as t:
        attrs = t.attrs
        assert t.spec == ATTRS["spec"]
        assert t.complete is True
    for name, value in ATTRS.items():
        assert attrs[name] == value, name
    assert attrs["schema_version"] == SCHEMA_VERSION
    assert attrs["complete"] is True
    assert "incomplete_reason" not in attrs
    assert attrs["json_attrs"] == ["anchors_end", "anchors_start", "spec", "versions"]
    # Plain h5py sees the JSON attributes as text, which is what the docs promise.
    with h5py.File(path, "r") as f:
        assert json.loads(f.attrs["spec"]) == ATTRS["spec"]
        assert json.loads(f.attrs["json_attrs"]) == attrs["json_attrs"]


def test_set_attrs_stores_any_dict_or_list_as_json(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "t.h5") as w:
        w.set_attrs(spec='{"already": "json"}', extra={"k": [1, np.int64(2)]}, tags=["a", "b"])
        w.set_attrs(tags="plain now")  # re-set as a plain str: no longer JSON
        w.finish()
    with open_trace(tmp_path / "t.h5") as t:
        assert t.spec == {"already": "json"}
        assert t.attrs["extra"] == {"k": [1, 2]}
        assert t.attrs["tags"] == "plain now"
        assert t.attrs["json_attrs"] == ["extra", "spec"]


@pytest.mark.parametrize("name", ["complete", "schema_version", "incomplete_reason", "json_attrs"])
def test_set_attrs_refuses_protocol_attributes(tmp_path: Path, name: str) -> None:
    with TraceWriter(tmp_path / "t.h5") as w:
        with pytest.raises(ValueError, match=name):
            w.set_attrs(**{name: 1})
        w.finish()


def test_set_attrs_rejects_bad_json_text(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "t.h5") as w:
        with pytest.raises(ValueError, match="spec"):
            w.set_attrs(spec="{not json")
        w.finish()


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_datasets_are_chunked_compressed_checksummed_with_units(
    tmp_path: Path, compression: Any
) -> None:
    path = tmp_path / "t.h5"
    with TraceWriter(path, compression=compression) as w:
        for table, cols in known_columns().items():
            w.append(table, cols)
        w.finish()
    with h5py.File(path, "r") as f:
        for table, columns in TABLES.items():
            group = f[table]
            assert group.attrs["rows"] == 3
            for c in columns:
                ds = group[c.name]
                assert ds.maxshape == (None,)
                assert ds.chunks == (chunk_rows(c),)
                assert 256 * 1024 <= chunk_rows(c) * ds.dtype.itemsize <= 1024 * 1024
                if compression == "blosc-lz4":
                    # Blosc (32001) then fletcher32, so the checksum covers the stored bytes;
                    # Blosc's own options end in (level 5, byte shuffle, LZ4).
                    assert list(ds._filters) == ["32001", "fletcher32"]
                    assert ds._filters["32001"][-3:] == (5, 1, 1)
                else:
                    assert ds.compression == compression
                    assert ds.shuffle is True
                assert ds.fletcher32 is True
                assert ds.attrs["unit"] == c.unit
                assert ds.attrs["doc"] == c.doc
                assert ds.attrs["schema_dtype"] == c.dtype
        assert f["events/app/start_ns"].attrs["unit"] == "ns"
        assert f["events/comm/bytes"].attrs["unit"] == "bytes"
        strings = [s.decode() for s in f["strings"][()]]
        assert strings[0] == ""
        assert "cudaLaunchKernel" in strings
        assert len(set(strings)) == len(strings)


def test_appends_extend_and_symbols_accept_ints(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    n = 250_000  # spans several chunks of every column
    rng = np.random.default_rng(1)
    start = np.cumsum(rng.integers(1, 1000, n)).astype(np.int64)
    with TraceWriter(path) as w:
        fwd, bwd = w.intern("forward"), w.intern("backward")
        assert w.intern("forward") == fwd
        assert w.intern("") == 0
        phase = np.where(np.arange(n) % 2 == 0, fwd, bwd)
        for lo in range(0, n, 100_000):
            sl = slice(lo, min(n, lo + 100_000))
            w.append(
                "events/app",
                {
                    "rank": np.zeros(sl.stop - lo, np.int16),
                    "step": np.arange(lo, sl.stop) // 10,
                    "phase": phase[sl],
                    "tid": np.full(sl.stop - lo, 77),
                    "start_ns": start[sl],
                    "end_ns": start[sl] + 5,
                    "gpu_ns": np.full(sl.stop - lo, -1),
                },
            )
        assert w.rows("events/app") == n
        w.finish()
    with open_trace(path) as t:
        df = t.table("events/app")
        t.verify()
    assert len(df) == n
    np.testing.assert_array_equal(df["start_ns"].to_numpy(), start)
    np.testing.assert_array_equal(df["step"].to_numpy(), np.arange(n) // 10)
    assert df["phase"].iloc[0] == "forward"
    assert df["phase"].iloc[1] == "backward"
    assert df["phase"].value_counts().to_dict() == {"forward": n // 2, "backward": n // 2}


def _window_trace(path: Path) -> Path:
    # Event i spans [starts[i], ends[i]]; event 4 is zero-length at 300.
    starts = [0, 100, 150, 250, 300, 400]
    ends = [90, 200, 160, 350, 300, 500]
    with TraceWriter(path) as w:
        w.append(
            "events/comm",
            {
                "rank": [0] * 6,
                "step": list(range(6)),
                "bucket": [0] * 6,
                "op": ["allreduce"] * 6,
                "bytes": [1 << 20] * 6,
                "start_ns": starts,
                "end_ns": ends,
                "gpu_ns": [-1] * 6,
            },
        )
        w.append(
            "samples/device",
            {
                "t_ns": [0, 100, 200, 300, 400],
                "rank": [0] * 5,
                "step": [0, 1, 2, 3, 4],
                "gpu": [0] * 5,
                "util_pct": [10, 20, 30, 40, 50],
                "mem_util_pct": [1] * 5,
                "mem_used": [1] * 5,
                "sm_clock": [1980] * 5,
                "power": [300_000] * 5,
            },
        )
        w.append(
            "threads",
            {
                "t_ns": [0, 450],
                "rank": [0, 0],
                "pid": [1, 1],
                "tid": [1, 2],
                "role": ["launch", "comm"],
                "name": ["python", "nccl"],
                "cpus_planned": ["", ""],
                "cpus_actual": ["0-7", "0-7"],
            },
        )
        return w.finish()


@pytest.mark.parametrize(
    ("t0", "t1", "steps"),
    [
        (None, None, [0, 1, 2, 3, 4, 5]),
        (100, 300, [1, 2, 3]),  # [100, 300): event 0 ended before, event 4 starts at t1
        (90, 100, []),  # event 0 ends exactly at 90: touching is not overlapping
        (300, 301, [3, 4]),  # the zero-length event at 300 is inside, event 3 overlaps
        (155, 156, [1, 2]),  # a window inside two events
        (None, 150, [0, 1]),
        (450, None, [5]),
        (600, 700, []),
    ],
)
def test_event_window_is_overlap(
    tmp_path: Path, t0: int | None, t1: int | None, steps: list[int]
) -> None:
    with open_trace(_window_trace(tmp_path / "w.h5")) as t:
        df = t.table("events/comm", t0=t0, t1=t1)
    assert df["step"].tolist() == steps
    assert list(df.columns) == [c.name for c in TABLES["events/comm"]]
    assert df["op"].tolist() == ["allreduce"] * len(steps)


def test_sample_window_is_half_open_and_threads_unfiltered(tmp_path: Path) -> None:
    with open_trace(_window_trace(tmp_path / "w.h5")) as t:
        assert t.table("samples/device", t0=100, t1=300)["t_ns"].tolist() == [100, 200]
        assert t.table("samples/device", t0=401)["util_pct"].tolist() == []
        assert t.table("threads", t0=100, t1=200)["name"].tolist() == ["python", "nccl"]


def test_missing_table_is_empty_with_schema_dtypes(tmp_path: Path) -> None:
    with open_trace(_window_trace(tmp_path / "w.h5")) as t:
        assert "events/cuda" not in t.tables()
        df = t.table("events/cuda")
        empty_window = t.table("events/comm", t0=10_000, t1=20_000)
    for frame, table in ((df, "events/cuda"), (empty_window, "events/comm")):
        assert len(frame) == 0
        assert list(frame.columns) == [c.name for c in TABLES[table]]
        for c in TABLES[table]:
            if c.is_symbol:
                assert isinstance(frame[c.name].dtype, pd.CategoricalDtype)
            else:
                assert frame[c.name].dtype == np.dtype(c.numpy_dtype)


def test_unknown_table_is_an_error(tmp_path: Path) -> None:
    with (
        open_trace(_window_trace(tmp_path / "w.h5")) as t,
        pytest.raises(ValueError, match="events/gpu"),
    ):
        t.table("events/gpu")


def test_constructor_does_no_io(tmp_path: Path) -> None:
    TraceWriter(tmp_path / "t.h5")
    TraceWriter(tmp_path / "missing-dir" / "t.h5")
    assert list(tmp_path.iterdir()) == []


def test_final_path_appears_only_at_finish(trace_dir: Path) -> None:
    final = trace_dir / "t.h5"
    with TraceWriter(final) as w:
        w.append("threads", known_columns()["threads"])
        assert not final.exists()
        # Streamed to the writer's own partial file, which never passes as a trace.
        assert w.partial_path.exists()
        assert w.partial_path.name.startswith("t.h5.") and w.partial_path.name.endswith(".partial")
        with pytest.raises(TraceFormatError, match=re.escape(str(final))):
            open_trace(final)
        w.finish()
    assert final.exists()
    assert not w.partial_path.exists()
    assert not incomplete_path(final).exists()


def test_missing_finish_keeps_data_as_incomplete(trace_dir: Path) -> None:
    final = trace_dir / "t.h5"
    with pytest.warns(RuntimeWarning, match="finish"), TraceWriter(final) as w:
        w.set_attrs(**ATTRS)
        w.append("threads", known_columns()["threads"])
    kept = trace_dir / "t.incomplete.h5"
    assert sorted(p.name for p in trace_dir.iterdir()) == [kept.name]
    with pytest.raises(TraceFormatError, match=r"no such trace file.*t\.incomplete\.h5"):
        open_trace(final)
    with pytest.raises(TraceFormatError, match=r"incomplete.*finish\(\) not called") as err:
        open_trace(kept)
    assert str(kept) in str(err.value)
    with open_trace(kept, allow_incomplete=True) as t:
        assert t.complete is False
        assert t.attrs["incomplete_reason"] == "finish() not called"
        assert t.table("threads")["name"].tolist() == known_columns()["threads"]["name"]


def test_exception_in_with_block_aborts_with_reason(trace_dir: Path) -> None:
    final = trace_dir / "run.h5"
    with pytest.raises(ZeroDivisionError), TraceWriter(final) as w:
        w.append("events/app", known_columns()["events/app"])
        _ = 1 / 0
    assert not final.exists()
    assert not partial_path(final).exists()
    with open_trace(trace_dir / "run.incomplete.h5", allow_incomplete=True) as t:
        assert "ZeroDivisionError" in t.attrs["incomplete_reason"]
        assert t.table("events/app")["phase"].tolist() == ["forward", "backward", "optimizer"]


@pytest.mark.parametrize("compression", CODECS)
def test_killed_writer_leaves_nothing_that_could_pass_as_a_trace(
    tmp_path: Path, compression: str
) -> None:
    final = tmp_path / "t.h5"
    script = f"""
import os, signal
from codl.trace.store import TraceWriter
w = TraceWriter({str(final)!r}, compression={compression!r}).__enter__()
w.append("samples/device", {{c: [1, 2] for c in {[c.name for c in TABLES["samples/device"]]!r}}})
w.append("threads", {known_columns()["threads"]!r})
w.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", script], check=False)
    assert proc.returncode == -signal.SIGKILL
    # The writer's partial file is left (the kernel released the lock with the process); it is
    # marked incomplete, so nothing takes it for a trace, but what was flushed can be salvaged.
    partials = [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    assert sorted(tmp_path.iterdir()) == sorted([lock_path(final, "write"), *partials])
    assert len(partials) == 1
    with pytest.raises(TraceFormatError, match=re.escape(str(final))):
        open_trace(final)
    with pytest.raises(TraceFormatError, match="incomplete"):
        open_trace(partials[0])
    with open_trace(partials[0], allow_incomplete=True) as t:
        assert not t.complete
        assert t.table("threads")["name"].tolist() == known_columns()["threads"]["name"]
    with TraceWriter(final) as w:
        w.finish()
    assert sorted(tmp_path.iterdir()) == sorted([final, *partials])


def test_a_partial_file_from_an_interrupted_write_is_refused(tmp_path: Path) -> None:
    final = tmp_path / "t.h5"
    with TraceWriter(final) as w:
        w.append("threads", known_columns()["threads"])
        w.finish()
    data = final.read_bytes()
    final.unlink()
    partial_path(final).write_bytes(data[: len(data) // 3])
    with pytest.raises(TraceFormatError, match=r"found unfinished .*t\.h5\.partial"):
        open_trace(final)
    with pytest.raises(TraceFormatError):
        open_trace(partial_path(final))


def test_abort_without_keep_deletes(tmp_path: Path) -> None:
    final = tmp_path / "t.h5"
    with TraceWriter(final) as w:
        w.append("threads", known_columns()["threads"])
        assert w.abort("dry run", keep=False) is None
    assert list(tmp_path.iterdir()) == []


def test_abort_after_finish_is_refused(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "t.h5") as w:
        w.finish()
        with pytest.raises(RuntimeError, match="finished"):
            w.abort("late")
    with open_trace(tmp_path / "t.h5") as t:
        assert t.complete


def test_reserved_final_names_are_refused(tmp_path: Path) -> None:
    for name in ("t.incomplete.h5", "t.h5.partial"):
        with pytest.raises(ValueError, match="unfinished"):
            TraceWriter(tmp_path / name)


@pytest.mark.parametrize(
    ("columns", "pattern"),
    [
        ({"rank": [0], "step": [0], "bucket": [0], "op": ["allreduce"], "bytes": [1],
          "start_ns": [0], "end_ns": [1]}, r"missing columns \['gpu_ns'\]"),
        ({"rank": [0], "step": [0], "bucket": [0], "op": ["allreduce"], "bytes": [1],
          "start_ns": [0], "end_ns": [1], "gpu_ns": [1], "size": [1]},
         r"unknown columns \['size'\]"),
        ({"rank": [0, 1], "step": [0], "bucket": [0], "op": ["allreduce"], "bytes": [1],
          "start_ns": [0], "end_ns": [1], "gpu_ns": [1]}, r"differ in length"),
        ({"rank": [40_000], "step": [0], "bucket": [0], "op": ["allreduce"], "bytes": [1],
          "start_ns": [0], "end_ns": [1], "gpu_ns": [1]}, r"'rank'.*do not fit int16"),
        ({"rank": [0], "step": [0], "bucket": [0], "op": ["allreduce"], "bytes": [1.5],
          "start_ns": [0], "end_ns": [1], "gpu_ns": [1]}, r"'bytes'.*expected integers"),
        ({"rank": [0], "step": [0], "bucket": [0], "op": [99], "bytes": [1],
          "start_ns": [0], "end_ns": [1], "gpu_ns": [1]}, r"'op'.*not all string indices"),
    ],
)  # fmt: skip
def test_append_rejects_bad_columns(tmp_path: Path, columns: dict[str, Any], pattern: str) -> None:
    with TraceWriter(tmp_path / "t.h5") as w:
        with pytest.raises(ValueError, match=pattern) as err:
            w.append("events/comm", columns)
        assert "events/comm" in str(err.value)
        assert w.rows("events/comm") == 0
        w.finish()


def test_append_rejects_unknown_table(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "t.h5") as w:
        with pytest.raises(ValueError, match="events/gpu"):
            w.append("events/gpu", {"x": [1]})
        w.finish()


def test_missing_file_and_non_hdf5_are_rejected(trace_dir: Path) -> None:
    missing = trace_dir / "nope.h5"
    with pytest.raises(TraceFormatError, match=re.escape(str(missing))):
        open_trace(missing)
    text = trace_dir / "text.h5"
    text.write_text("not hdf5\n" * 100)
    with pytest.raises(TraceFormatError, match=re.escape(str(text)) + ".*not an HDF5 file"):
        open_trace(text)


def test_schema_version_mismatch_is_rejected(trace_dir: Path) -> None:
    path = write_trace(trace_dir / "t.h5")
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(TraceFormatError) as err:
        open_trace(path, allow_incomplete=True)
    msg = str(err.value)
    assert str(path) in msg
    assert f"version {SCHEMA_VERSION + 1}" in msg
    assert f"reads version {SCHEMA_VERSION}" in msg


def _big_trace(path: Path, n: int = 300_000, compression: str = "gzip") -> Path:
    rng = np.random.default_rng(7)
    start = np.cumsum(rng.integers(1, 10_000, n)).astype(np.int64)
    with TraceWriter(path, compression=compression) as w:
        w.append(
            "events/loader",
            {
                "rank": np.zeros(n, np.int16),
                "step": np.arange(n) // 64,
                "worker": np.arange(n) % 8,
                "pid": 1000 + np.arange(n) % 8,
                "tid": 1000 + np.arange(n) % 8,
                "cpu": rng.integers(0, 64, n),
                "item": rng.permutation(n),
                "stage": np.asarray(["fetch", "decode", "transform"], dtype=object)[
                    np.arange(n) % 3
                ],
                "start_ns": start,
                "end_ns": start + rng.integers(0, 100_000, n),
            },
        )
        return w.finish()


@pytest.mark.parametrize("compression", CODECS)
def test_truncated_file_is_rejected(trace_dir: Path, compression: str) -> None:
    path = _big_trace(trace_dir / "t.h5", compression=compression)
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.truncate(size // 2)
    # Depending on where the cut falls, HDF5 refuses to open the file or a dataset read fails.
    with pytest.raises(TraceFormatError, match=re.escape(str(path))), open_trace(path) as t:
        t.verify()


@pytest.mark.parametrize("compression", CODECS)
def test_flipped_bytes_in_data_are_caught_by_checksum(trace_dir: Path, compression: str) -> None:
    path = _big_trace(trace_dir / "t.h5", compression=compression)
    with h5py.File(path, "r") as f:
        info = f["events/loader/item"].id.get_chunk_info(1)
    with path.open("r+b") as fh:
        # Inside the second compressed chunk of one column, away from its header: only the
        # fletcher32 checksum (or the decompressor) can notice.
        fh.seek(info.byte_offset + info.size // 2)
        chunk = bytearray(fh.read(16))
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes(b ^ 0xFF for b in chunk))
    with open_trace(path) as t:  # metadata is intact, so opening works
        assert len(t.table("events/loader", t0=0, t1=1)) == 0  # reads only the time columns
        with pytest.raises(TraceFormatError, match=re.escape(str(path)) + ".*/events/loader/item"):
            t.table("events/loader")
        with pytest.raises(TraceFormatError, match=re.escape(str(path)) + ".*/events/loader/item"):
            t.verify()


@pytest.mark.parametrize("compression", CODECS)
def test_verify_passes_on_a_good_file(tmp_path: Path, compression: str) -> None:
    with open_trace(_big_trace(tmp_path / "t.h5", compression=compression)) as t:
        t.verify()


def test_tampered_string_table_is_rejected(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.h5")
    with h5py.File(path, "r+") as f:
        strings = [s.decode() for s in f["strings"][()]]
        digest = f["strings"].attrs["sha256"]
        del f["strings"]
        strings[1] = strings[1] + "x"
        f.create_dataset("strings", data=strings, dtype=h5py.string_dtype())
        f["strings"].attrs["sha256"] = digest
    with pytest.raises(TraceFormatError, match="sha256"):
        open_trace(path)


def test_docs_contain_generated_schema_tables() -> None:
    generated = schema_markdown()
    for table, columns in TABLES.items():
        assert f"### `/{table}`" in generated
        for c in columns:
            assert f"| `{c.name}` |" in generated
    assert generated in DOCS.read_text(encoding="utf-8"), (
        "docs/trace-format.md is out of date: paste codl.trace.store.schema_markdown() into it"
    )


# --------------------------------------------------------------------------------------------
# Streaming: bounded buffers, a clean error on a full disk, and window reads by chunk index


def _comm_block(lo: int, n: int) -> dict[str, Any]:
    """``n`` events/comm rows from row ``lo``: event i starts at 1000 * i and lasts 500 ns."""
    i = np.arange(lo, lo + n, dtype=np.int64)
    return {
        "rank": np.zeros(n, np.int16),
        "step": (i // 100).astype(np.int32),
        "bucket": (i % 7).astype(np.int32),
        "op": np.full(n, "allreduce", dtype=object),
        "bytes": i * 3,
        "start_ns": i * 1000,
        "end_ns": i * 1000 + 500,
        "gpu_ns": np.full(n, -1, np.int64),
    }


def test_rows_are_written_in_blocks_while_the_run_goes(tmp_path: Path) -> None:
    block = block_rows("events/comm")
    assert buffer_bound_bytes() == sum(block_rows(t) * row_bytes(t) for t in TABLES)
    with TraceWriter(tmp_path / "t.h5") as w:
        w.append("events/comm", _comm_block(0, block + 10))
        # One block went to the partial file; 10 rows wait in the buffer, counted too.
        assert w.rows("events/comm") == block + 10
        w.append("events/comm", _comm_block(block + 10, 2 * block))
        w.finish()
    with open_trace(tmp_path / "t.h5") as t:
        t.verify()
        index = t.chunk_index("events/comm")
        assert index is not None
        assert index[:, :2].tolist() == [
            [0, block],
            [block, 2 * block],
            [2 * block, 3 * block],
            [3 * block, 3 * block + 10],
        ]
        # Each block's time range is its first start and its last end.
        assert index[1, 2:].tolist() == [block * 1000, (2 * block - 1) * 1000 + 500]
        df = t.table("events/comm")
    pd.testing.assert_frame_equal(
        df.drop(columns="op"), pd.DataFrame(_comm_block(0, 3 * block + 10)).drop(columns="op")
    )


@pytest.mark.parametrize(("threads", "compression"), [(1, "gzip"), (3, "gzip"), (2, "blosc-lz4")])
def test_rows_after_a_flush_complete_its_partly_filled_chunk(
    tmp_path: Path, threads: int, compression: str
) -> None:
    """flush() leaves a chunk half filled; the next block first completes it through HDF5, then
    writes whole chunks: every row reads back, checksums and digests hold, whatever the pool."""
    block = block_rows("events/comm")
    rows = [(0, 10), (10, block + 30), (block + 30, 3 * block + 7)]
    with TraceWriter(tmp_path / "t.h5", threads=threads, compression=compression) as w:
        for lo, hi in rows:
            w.append("events/comm", _comm_block(lo, hi - lo))
            w.flush()
        w.finish()
    with open_trace(tmp_path / "t.h5") as t:
        t.verify()
        df = t.table("events/comm")
    pd.testing.assert_frame_equal(
        df.drop(columns="op"), pd.DataFrame(_comm_block(0, 3 * block + 7)).drop(columns="op")
    )


def test_rows_decoded_on_threads_equal_hdf5s_and_damage_is_caught(tmp_path: Path) -> None:
    block = block_rows("events/comm")
    # gzip: the codec whose chunks the reader decodes on its own threads (chunkcodec).
    with TraceWriter(tmp_path / "t.h5", compression="gzip") as w:
        w.append("events/comm", _comm_block(0, 2 * block + 99))
        w.finish()
    ranges = [(0, 1), (5, block + 3), (block, 2 * block + 99), (7, 7)]
    with ThreadPoolExecutor(2) as pool, open_trace(tmp_path / "t.h5") as t:
        for lo, hi in ranges:
            want = t.read_rows("events/comm", lo, hi)
            got = t.read_rows("events/comm", lo, hi, pool=pool)
            assert got.keys() == want.keys()
            for name, values in want.items():
                np.testing.assert_array_equal(got[name], values)
                assert got[name].dtype == values.dtype
    # One flipped byte in the middle of the second chunk of start_ns.
    with h5py.File(tmp_path / "t.h5", "r") as f:
        ds = f["events/comm/start_ns"]
        info = ds.id.get_chunk_info_by_coord((ds.chunks[0],))
    with (tmp_path / "t.h5").open("r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        byte = fh.read(1)
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with (
        ThreadPoolExecutor(2) as pool,
        open_trace(tmp_path / "t.h5") as t,
        pytest.raises(TraceFormatError, match="start_ns"),
    ):
        t.read_rows("events/comm", 0, block, pool=pool)


@pytest.mark.parametrize(
    ("compression", "threads"), [("blosc-lz4", 0), ("blosc-lz4", 2), ("gzip", 2)]
)
def test_rows_read_into_the_callers_arrays_equal_a_plain_read(
    tmp_path: Path, compression: str, threads: int
) -> None:
    """With or without a decoding pool (gzip chunks decoded on it, the others read by HDF5
    into the caller's arrays), the rows equal a plain read, and a damaged chunk read into
    the caller's arrays is a TraceFormatError naming the column."""
    block = block_rows("events/comm")
    with TraceWriter(tmp_path / "t.h5", compression=compression) as w:
        w.append("events/comm", _comm_block(0, 2 * block + 99))
        w.finish()
    out = {c.name: np.full(2 * block, -7, dtype=c.numpy_dtype) for c in TABLES["events/comm"]}
    with ThreadPoolExecutor(max(1, threads)) as pool, open_trace(tmp_path / "t.h5") as t:
        for lo, hi in [(5, block + 3), (block, 2 * block + 99), (7, 7)]:
            want = t.read_rows("events/comm", lo, hi, ["start_ns", "op"])
            got = t.read_rows(
                "events/comm", lo, hi, ["start_ns", "op"], out=out, pool=pool if threads else None
            )
            assert got.keys() == want.keys()
            for name, values in got.items():
                np.testing.assert_array_equal(values, want[name])
                decoded_on_pool = bool(threads) and compression == "gzip"
                assert np.shares_memory(values, out[name]) != decoded_on_pool or hi == lo
    # HDF5's low-level read would write past a short array or clamp into a narrow one.
    with open_trace(tmp_path / "t.h5") as t:
        short = {"start_ns": np.zeros(4, dtype=np.int64)}
        with pytest.raises(ValueError, match=r"out\['start_ns'\]: .* at least 16 values"):
            t.read_rows("events/comm", 0, 16, ["start_ns"], out=short)
        narrow = {"start_ns": np.zeros(16, dtype=np.int8)}
        with pytest.raises(ValueError, match=r"out\['start_ns'\]: dtype int64 expected"):
            t.read_rows("events/comm", 0, 16, ["start_ns"], out=narrow)
    if compression == "gzip":
        return
    with h5py.File(tmp_path / "t.h5", "r") as f:
        info = f["events/comm/start_ns"].id.get_chunk_info(1)
    with (tmp_path / "t.h5").open("r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        byte = fh.read(1)
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with open_trace(tmp_path / "t.h5") as t, pytest.raises(TraceFormatError, match="start_ns"):
        t.read_rows("events/comm", 0, 2 * block, ["start_ns"], out=out)


@pytest.mark.parametrize(("compression", "threads"), [("blosc-lz4", 0), ("gzip", 2)])
def test_verified_blocks_read_ahead_and_each_block_holds_until_the_next_is_asked_for(
    tmp_path: Path, compression: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verified_blocks reads block i + 1 on a thread while the caller holds block i, into sets
    of arrays used in turn: a slow caller (the read-ahead long done) still sees its block's
    own rows, every block comes in order, and the digests hold. An event ending before it
    starts in block 3 is raised when block 3 is asked for, after blocks 0-2 were given."""
    block = block_rows("events/comm")
    n = 5 * block + 17
    path = tmp_path / "t.h5"
    with TraceWriter(path, compression=compression) as w:
        w.append("events/comm", _comm_block(0, n))
        w.finish()
    want = _comm_block(0, n)
    bounds = [(lo, min(n, lo + block)) for lo in range(0, n, block)]
    seen = []
    with ThreadPoolExecutor(max(1, threads)) as pool, open_trace(path) as t:
        for lo, hi, got in t.verified_blocks(
            "events/comm", pool=pool if threads else None, reuse=True, rows=block
        ):
            time.sleep(0.05)  # block i + 1 is read by now
            for name in ("step", "bytes", "start_ns", "end_ns"):
                np.testing.assert_array_equal(got[name], want[name][lo:hi])
            assert not got["start_ns"].flags.writeable
            seen.append((lo, hi))
    assert seen == bounds
    # An index entry's time range that its rows do not have (a misread made to look so, as
    # the index and the file's metadata are under their own sha256s): checked beside the
    # caller, raised before the iteration ends.
    real = reader.time_range  # type: ignore[attr-defined]

    def misread(table: str, rows: dict[str, Any], n: int) -> tuple[int, int]:
        t_lo, t_hi = real(table, rows, n)
        return (t_lo, t_hi + 1) if int(rows["start_ns"][0]) == 2 * block * 1000 else (t_lo, t_hi)

    monkeypatch.setattr(reader, "time_range", misread)
    with open_trace(path) as t, pytest.raises(TraceFormatError, match="time range"):
        for _ in t.verified_blocks("events/comm", reuse=True, rows=block):
            pass
    monkeypatch.undo()
    with h5py.File(path, "r+") as f:
        f["events/comm/end_ns"][3 * block + 5] = 0
    given = []
    with open_trace(path) as t, pytest.raises(TraceFormatError, match=f"row {3 * block + 5}\\)"):
        for lo, _, _ in t.verified_blocks("events/comm", reuse=True, rows=block):
            given.append(lo)
    assert given == [0, block, 2 * block]


@pytest.mark.parametrize("compression", CODECS)
def test_a_window_reads_only_the_chunks_it_overlaps(tmp_path: Path, compression: str) -> None:
    """Chunks outside the window are damaged on disk: the window still reads, a full read does
    not (fletcher32), so the window never touched them."""
    path = tmp_path / "t.h5"
    block = block_rows("events/comm")
    with TraceWriter(path, compression=compression) as w:
        w.append("events/comm", _comm_block(0, 4 * block))
        w.finish()
    data = bytearray(path.read_bytes())
    with h5py.File(path, "r") as f:
        for name in f["events/comm"]:
            info = f["events/comm"][name].id.get_chunk_info_by_coord((0,))
            data[info.byte_offset + info.size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    t0, t1 = (2 * block + 5) * 1000, (2 * block + 5) * 1000 + 1_000_000_000  # 1 s
    with open_trace(path) as t:
        window = t.table("events/comm", t0=t0, t1=t1)
        assert window["start_ns"].iloc[0] == t0
        assert len(window) == 2 * block - 5
        assert window["op"].tolist() == ["allreduce"] * len(window)
        with pytest.raises(TraceFormatError, match="unreadable"):
            t.table("events/comm", t0=0, t1=1000)
        with pytest.raises(TraceFormatError):
            t.verify()


def test_a_damaged_chunk_index_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    with TraceWriter(path) as w:
        w.append("events/comm", _comm_block(0, 2 * block_rows("events/comm")))
        w.finish()
    with h5py.File(path, "r+") as f:
        ds = f["chunks/events/comm"]
        data = ds[()]
        data[1, 2] += 1  # a later t_lo: a window query would miss the block's first event
        ds[...] = data
    with open_trace(path) as t, pytest.raises(TraceFormatError, match="chunk index"):
        t.table("events/comm", t0=0, t1=10**15)


FULL_DISK = """
import resource, sys
import numpy as np
from codl.trace.store import TraceDiskFullError, TraceWriter, block_rows
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
rng = np.random.default_rng(0)
n = block_rows("samples/sched")
cols = ("t_ns", "rank", "step", "pid", "tid", "run_ns", "wait_ns", "timeslices", "voluntary",
        "involuntary", "cpu")
try:
    with TraceWriter(sys.argv[1]) as w:
        for i in range(100):
            batch = {{c: rng.integers(0, 30000, n) for c in cols}}
            batch["t_ns"] = np.arange(i * n, (i + 1) * n)
            w.append("samples/sched", batch)
        w.finish()
except TraceDiskFullError as e:
    print("clean:", e)
"""


def test_a_full_disk_is_a_clean_error_and_keeps_what_was_written(tmp_path: Path) -> None:
    """RLIMIT_FSIZE fails writes the way a full disk does (EFBIG instead of ENOSPC); Python
    ignores SIGXFSZ. The writer finds out in posix_fallocate, before HDF5 writes."""
    final = tmp_path / "t.h5"
    limit = 48 * 1024 * 1024
    proc = subprocess.run(
        [sys.executable, "-c", FULL_DISK.format(limit=limit), str(final)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("clean:") and "no room for the trace" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert not final.exists()
    assert not any(p.name.endswith(".partial") for p in tmp_path.iterdir())
    kept = incomplete_path(final)
    assert kept.stat().st_size <= limit
    with pytest.raises(TraceFormatError, match="incomplete"):
        open_trace(kept)
    with open_trace(kept, allow_incomplete=True) as t:
        t.verify()
        assert "buffered rows not written" in t.attrs["incomplete_reason"]
        rows = len(t.table("samples/sched"))
    assert rows > 0 and rows % block_rows("samples/sched") == 0


def test_a_signal_during_a_block_write_is_delivered_after_it() -> None:
    import os

    class StopError(Exception):
        pass

    def stop(signum: int, frame: Any) -> None:
        raise StopError(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        done = []
        with pytest.raises(StopError), signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            done.append("rest of the block")
        assert done == ["rest of the block"]
        assert signal.getsignal(signal.SIGTERM) is stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_writers_memory_does_not_grow_with_the_rows_written(tmp_path: Path) -> None:
    """Python-side memory the writer keeps (numpy buffers, digests, chunk index) is the same
    after 2 and after 6 blocks: rows are on disk, not in the writer."""
    import tracemalloc

    block = block_rows("events/comm")
    held = []
    tracemalloc.start()
    try:
        with TraceWriter(tmp_path / "t.h5") as w:
            for i in range(6):
                batch = _comm_block(i * block, block)
                w.append("events/comm", batch)
                del batch
                held.append(tracemalloc.get_traced_memory()[0])
            w.finish()
    finally:
        tracemalloc.stop()
    assert held[-1] - held[1] < 64 * 1024, held
    # Whereas the rows of those 4 blocks are ~20 MB.
    assert 4 * block * row_bytes("events/comm") > 100 * (held[-1] - held[1])


def test_the_table_enum_names_every_table_of_the_schema() -> None:
    from codl.trace.schema import TABLES, Table

    assert [t.value for t in Table] == list(TABLES)
    # A member is its name: it indexes the schema, the readers and HDF5 paths unchanged.
    assert TABLES[Table.APP] is TABLES["events/app"] and f"/{Table.APP}" == "/events/app"


def test_traces_with_sha256_column_digests_are_still_verified(tmp_path: Path) -> None:
    """A trace written before crc32 (no ``column_digest`` attribute, sha256 digests) reads
    and verifies as before, and a value changed through HDF5 fails its sha256."""
    import hashlib
    import json

    from codl.trace.store import DIGEST_ATTR
    from codl.trace.store.layout import COLUMN_DIGEST_ATTR, COLUMN_DIGESTS, metadata_digest

    with TraceWriter(tmp_path / "t.h5") as w:
        w.append("events/comm", _comm_block(0, 500))
        w.finish()
    with open_trace(tmp_path / "t.h5") as t:
        assert t.column_digest == "crc32"
    with h5py.File(tmp_path / "t.h5", "r+") as f:
        group = f["events/comm"]
        group.attrs[COLUMN_DIGESTS] = json.dumps(
            {c: hashlib.sha256(group[c][()].data.cast("B")).hexdigest() for c in group},
            sort_keys=True,
        )
        del f.attrs[COLUMN_DIGEST_ATTR]
        f.attrs[DIGEST_ATTR] = metadata_digest(f)
    with open_trace(tmp_path / "t.h5") as t:
        assert t.column_digest == "sha256"
        t.verify()
    with h5py.File(tmp_path / "t.h5", "r+") as f:
        f["events/comm/bytes"][123] = 7  # through HDF5: its chunk checksum is valid
    with (
        open_trace(tmp_path / "t.h5") as t,
        pytest.raises(TraceFormatError, match="comm/bytes does not match its sha256"),
    ):
        t.verify()


@pytest.mark.parametrize("compression", CODECS)
def test_verify_reads_every_block_in_order(tmp_path: Path, compression: str) -> None:
    """Verification hashes blocks on a thread while it reads the next: a value rewritten in the
    last of three blocks (HDF5's own checksums still valid) fails the column's digest, and an
    event ending before it starts in the second block is found at its row."""
    block = block_rows("events/comm")
    rows = _comm_block(0, 2 * block + 99)
    rows["end_ns"][block + 5] = rows["start_ns"][block + 5] - 1
    with TraceWriter(tmp_path / "t.h5", compression=compression) as w:
        w.append("events/comm", rows)
        w.finish()
    with open_trace(tmp_path / "t.h5") as t:
        assert len(t.chunk_index("events/comm")) == 3  # type: ignore[arg-type]
        with pytest.raises(TraceFormatError, match=rf"1\+ event\(s\).*first at row {block + 5}"):
            t.verify()
    with TraceWriter(tmp_path / "u.h5", compression=compression) as w:
        w.append("events/comm", _comm_block(0, 2 * block + 99))
        w.finish()
    with h5py.File(tmp_path / "u.h5", "r+") as f:
        f["events/comm/bytes"][2 * block + 50] = 7  # through HDF5: its chunk checksum is valid
    with (
        open_trace(tmp_path / "u.h5") as t,
        pytest.raises(TraceFormatError, match="comm/bytes does not match its crc32"),
    ):
        t.verify()


@pytest.mark.parametrize("rows", [1, 2, 1 << 20])
@pytest.mark.parametrize(("t0", "t1"), [(None, None), (100, 300), (300, 301)])
def test_iter_blocks_with_a_row_cap_yields_the_windows_rows(
    tmp_path: Path, rows: int, t0: int | None, t1: int | None
) -> None:
    """``rows`` (a cap on merged blocks, for bounded-memory readers such as the Perfetto
    protobuf export) changes how the rows come, never which."""
    with open_trace(_window_trace(tmp_path / "w.h5")) as t:
        want = t.table("events/comm", t0=t0, t1=t1)["step"].tolist()
        blocks = list(t.iter_blocks("events/comm", ["step"], t0=t0, t1=t1, rows=rows))
        index = t.chunk_index("events/comm")
    assert [s for b in blocks for s in b["step"].tolist()] == want
    biggest = 0 if index is None else int((index[:, 1] - index[:, 0]).max())
    assert all(len(b["step"]) <= max(rows, biggest) for b in blocks)
