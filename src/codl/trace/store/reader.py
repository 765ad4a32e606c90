"""The trace reader: ``open_trace`` checks that a file is a complete codl trace of this schema
version and returns a ``Trace``, which reads tables whole, by block or by time window, and
``verify()``s every byte against the digests the writer stored."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import h5py

# Registers the Blosc HDF5 filter (and hdf5plugin's others) with this process's HDF5: every
# reader of a trace goes through this module, so no user ever meets "filter not available".
import hdf5plugin  # noqa: F401
import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.errors import ConfigError, TraceFormatError
from codl.files import glob_escape
from codl.spec import RunSpec
from codl.trace import chunkcodec
from codl.trace.schema import SCHEMA_VERSION, TABLES, Column
from codl.trace.store.files import PARTIAL_SUFFIX, incomplete_path, partial_path
from codl.trace.store.layout import (
    CHUNK_INDEX,
    COLUMN_DIGEST_ATTR,
    COLUMN_DIGESTS,
    DIGEST_ATTR,
    H5_ERRORS,
    JSON_ATTRS,
    STRINGS,
    column_hasher,
    metadata_digest,
    plain_value,
    root_attrs_problem,
    stored_codec,
    strings_digest,
    table_schema,
    time_range,
)

# gzip's best ratio is ~1000:1; a row count claiming more data than that cannot be true.
_MAX_EXPANSION: Final = 2048
# The rows of one block of ``verified_table``'s read: its reused buffers' size.
_TABLE_BLOCK_ROWS: Final = 1 << 16
_VERIFY_BLOCK_ROWS: Final = 1 << 20
_TIME_COLUMNS: Final = frozenset({"start_ns", "end_ns", "t_ns"})


class Trace:
    """An open trace file; get one from ``open_trace`` and use it as a context manager."""

    def __init__(self, file: Any, path: Path, attrs: dict[str, Any], strings: list[str]) -> None:
        self._file = file
        self._path = path
        self._attrs = attrs
        self._strings = strings
        self._categories = pd.Index(strings, dtype="str")
        self._chunk_index: dict[str, npt.NDArray[np.int64] | None] = {}
        # Checked row counts and dataset handles, per table: the file is open read-only, and a
        # reader of a long trace asks for them once per block (h5py's lookups cost ~5 us each).
        self._rows: dict[str, int] = {}
        self._datasets: dict[tuple[str, str], Any] = {}
        self._gzip_chunks: dict[tuple[str, str], int] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def attrs(self) -> dict[str, Any]:
        """Root attributes, JSON ones (``json_attrs``) decoded; a copy."""
        return dict(self._attrs)

    @property
    def complete(self) -> bool:
        return bool(self._attrs.get("complete", False))

    @property
    def spec(self) -> dict[str, Any]:
        spec = self._attrs.get("spec")
        if not isinstance(spec, dict):
            raise TraceFormatError(f"{self._path}: no run spec (root attribute 'spec')")
        return spec

    @property
    def codec(self) -> str | None:
        """The codec of the table columns (``blosc-lz4``, ``gzip``, ``lzf``; None without one),
        from the ``compression`` attribute or, in older traces, the stored filter pipeline."""
        try:
            return stored_codec(self._file)
        except H5_ERRORS as e:
            raise self._corrupt("the filter pipeline", e) from e

    @property
    def column_digest(self) -> str:
        """The algorithm of the column digests (``crc32``; ``sha256`` in traces written before
        the ``column_digest`` attribute, which the attribute schema limits to these two)."""
        return str(self._attrs.get(COLUMN_DIGEST_ATTR, "sha256"))

    @property
    def strings(self) -> list[str]:
        """The interned string table; ``sym`` columns index it."""
        return list(self._strings)

    def tables(self) -> list[str]:
        """Names of the tables present in this file, in schema order."""
        try:
            return [name for name in TABLES if isinstance(self._file.get(name), h5py.Group)]
        except H5_ERRORS as e:
            raise self._corrupt("the group structure", e) from e

    def _corrupt(self, what: str, e: BaseException) -> TraceFormatError:
        return TraceFormatError(
            f"{self._path}: {what} is unreadable ({e}); the file is corrupt or truncated"
        )

    def _dataset(self, table: str, column: str) -> Any:
        """The column's h5py dataset, opened once per trace."""
        ds = self._datasets.get((table, column))
        if ds is None:
            ds = self._datasets[(table, column)] = self._file[table][column]
        return ds

    def _read(self, table: str, column: str, sel: slice) -> npt.NDArray[Any]:
        try:
            return np.asarray(self._dataset(table, column)[sel])
        except H5_ERRORS as e:
            raise self._corrupt(f"dataset /{table}/{column}", e) from e

    def _read_into(
        self, table: str, column: str, lo: int, hi: int, buf: npt.NDArray[Any]
    ) -> npt.NDArray[Any]:
        # h5py's low-level read checks neither the buffer's length nor its dtype: HDF5 would
        # write past a short buffer, or convert (clamp) into a narrower type.
        if buf.ndim != 1 or len(buf) < hi - lo or not buf.flags.c_contiguous:
            raise ValueError(
                f"out[{column!r}]: a contiguous 1-d array of at least {hi - lo} values expected, "
                f"got shape {buf.shape}"
            )
        view = buf[: hi - lo]
        if hi == lo:
            return view
        try:
            ds = self._dataset(table, column)
            dtype = ds.dtype
        except H5_ERRORS as e:
            raise self._corrupt(f"dataset /{table}/{column}", e) from e
        if buf.dtype != dtype:
            raise ValueError(f"out[{column!r}]: dtype {dtype} expected, got {buf.dtype}")
        try:
            # HDF5's own read through h5py's low-level calls: Dataset.read_direct builds its
            # selections in Python, ~80 us a call, as much as decoding 30 K rows.
            space = ds.id.get_space()
            space.select_hyperslab((lo,), (hi - lo,))
            ds.id.read(h5py.h5s.create_simple((hi - lo,)), space, view)
        except H5_ERRORS as e:
            raise self._corrupt(f"dataset /{table}/{column}", e) from e
        return view

    def _row_count(self, table: str, schema: tuple[Column, ...]) -> int:
        """The table's committed row count, checked against every column's extent.

        A complete trace's columns hold exactly ``rows`` values (the writer resizes them
        together); only an append interrupted by a kill leaves longer columns, in an incomplete
        trace. Bounded by the file size, so a damaged count never makes a reader loop or
        allocate without end.
        """
        if table in self._rows:
            return self._rows[table]
        try:
            group = self._file[table]
            rows = int(group.attrs["rows"])
            limit = max(1, self._path.stat().st_size) * _MAX_EXPANSION
            for c in schema:
                ds = group.get(c.name)
                if not isinstance(ds, h5py.Dataset):
                    raise TraceFormatError(f"{self._path}: dataset /{table}/{c.name} is missing")
                extent = ds.shape[0] if len(ds.shape) == 1 else -1
                if extent < 0:
                    raise TraceFormatError(
                        f"{self._path}: dataset /{table}/{c.name} has shape {ds.shape}, "
                        "expected one dimension"
                    )
                if extent < rows or (self.complete and extent != rows):
                    raise TraceFormatError(
                        f"{self._path}: dataset /{table}/{c.name} has {extent} rows, the "
                        f"table says {rows}"
                    )
                if extent * ds.dtype.itemsize > limit:
                    raise TraceFormatError(
                        f"{self._path}: dataset /{table}/{c.name} claims {extent} rows, more "
                        "than the file can hold"
                    )
        except H5_ERRORS as e:
            raise self._corrupt(f"attribute 'rows' of /{table}", e) from e
        if rows < 0:
            raise TraceFormatError(f"{self._path}: /{table} has {rows} rows")
        self._rows[table] = rows
        return rows

    def _check_codes(self, table: str, column: str, codes: npt.NDArray[Any]) -> None:
        if codes.size and (codes.min() < 0 or codes.max() >= len(self._strings)):
            raise TraceFormatError(
                f"{self._path}: dataset /{table}/{column} holds indices outside the "
                f"{len(self._strings)}-entry string table"
                + ("" if STRINGS in self._file else " (no /strings: the writer was killed)")
            )

    def _decode(self, table: str, column: str, codes: npt.NDArray[Any]) -> pd.Categorical:
        self._check_codes(table, column, codes)
        return pd.Categorical.from_codes(
            codes, categories=self._categories
        ).remove_unused_categories()

    def _events_out_of_order(
        self, table: str, block: Mapping[str, npt.NDArray[Any]], lo: int
    ) -> TraceFormatError | None:
        """The error for rows of an event block (first row ``lo``) that end before they start;
        None when there are none or the block lacks either time. Every read of both times
        checks them, so no command takes such an event for a negative duration."""
        if "start_ns" not in block or "end_ns" not in block:
            return None
        late = np.flatnonzero(block["end_ns"] < block["start_ns"])
        if not late.size:
            return None
        return TraceFormatError(
            f"{self._path}: /{table} has {late.size}+ event(s) ending before they start "
            f"(first at row {lo + int(late[0])}); corrupt"
        )

    def chunk_index(self, table: str) -> npt.NDArray[np.int64] | None:
        """The table's chunk index, ``(blocks, 4)`` int64 rows of (row_lo, row_hi, t_lo, t_hi),
        checked against its sha256 and the row count; None for traces written without one."""
        if table in self._chunk_index:
            return self._chunk_index[table]
        n = self._row_count(table, table_schema(table))
        try:
            ds = self._file.get(f"{CHUNK_INDEX}/{table}")
            if ds is None:
                self._chunk_index[table] = None
                return None
            data = np.asarray(ds[()], dtype=np.int64)
            digest = plain_value(ds.attrs.get("sha256"))
        except H5_ERRORS as e:
            raise self._corrupt(f"the chunk index /{CHUNK_INDEX}/{table}", e) from e
        ok = data.ndim == 2 and data.shape[1] == 4
        ok = ok and hashlib.sha256(data.tobytes()).hexdigest() == digest
        if ok and len(data):
            lo, hi = data[:, 0], data[:, 1]
            ok = lo[0] == 0 and hi[-1] == n and bool(np.all(hi > lo))
            ok = ok and bool(np.all(lo[1:] == hi[:-1])) and bool(np.all(data[:, 3] >= data[:, 2]))
        elif ok:
            ok = n == 0
        if not ok:
            raise TraceFormatError(
                f"{self._path}: the chunk index /{CHUNK_INDEX}/{table} does not describe the "
                f"table's {n} rows; corrupt"
            )
        self._chunk_index[table] = data
        return data

    def _ranges(
        self,
        table: str,
        n: int,
        t0: int | None,
        t1: int | None,
        rows: int | None = None,
    ) -> list[tuple[int, int]]:
        """Row ranges to read for the window [t0, t1): the index's blocks that can hold rows of
        it (adjacent ones merged), or everything when there is no index or no window."""
        rows = _VERIFY_BLOCK_ROWS if rows is None else rows
        index = self.chunk_index(table) if n else None
        if index is None:
            return [(lo, min(n, lo + rows)) for lo in range(0, n, rows)]
        keep = np.ones(len(index), dtype=bool)
        if t1 is not None:
            keep &= index[:, 2] < t1
        if t0 is not None:
            keep &= index[:, 3] >= t0
        ranges: list[tuple[int, int]] = []
        for lo, hi in index[keep, :2].tolist():
            if ranges and ranges[-1][1] == lo and hi - ranges[-1][0] <= rows:
                ranges[-1] = (ranges[-1][0], hi)
            else:
                ranges.append((lo, hi))
        return ranges

    def _window_mask(
        self, name: str, cols: Mapping[str, npt.NDArray[Any]], t0: int | None, t1: int | None
    ) -> npt.NDArray[np.bool_] | None:
        lo_t = np.iinfo(np.int64).min if t0 is None else t0
        hi_t = np.iinfo(np.int64).max if t1 is None else t1
        if "start_ns" in cols:
            s, e = cols["start_ns"], cols["end_ns"]
            return (s < hi_t) & ((e > lo_t) | (s >= lo_t))
        if "t_ns" in cols:
            t = cols["t_ns"]
            return (t >= lo_t) & (t < hi_t)
        return None

    def block_ranges(self, name: str) -> list[tuple[int, int]]:
        """Half-open row ranges covering table ``name``: its chunk-index blocks (adjacent ones
        merged up to 1 Mi rows), or 1 Mi-row ranges for traces without an index. What a
        reader splits a table by to process it in bounded memory or in parallel."""
        if name not in self.tables():
            return []
        return self._ranges(name, self._row_count(name, table_schema(name)), None, None)

    def read_rows(
        self,
        name: str,
        lo: int,
        hi: int,
        columns: list[str] | None = None,
        *,
        pool: Executor | None = None,
        out: Mapping[str, npt.NDArray[Any]] | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        """Raw column arrays of rows ``[lo, hi)`` of ``name`` (``sym`` columns as int32 codes
        into ``strings``), bounds-checked against the committed row count.

        With a ``pool``, chunks stored through the writer's gzip pipeline are read raw and
        checked, inflated and unshuffled on the pool's threads (``chunkcodec.decode_chunk``),
        where HDF5 would decode them one at a time under h5py's lock. ``out`` (column -> array
        of at least ``hi - lo`` values) has the other columns read into the caller's arrays,
        which come back as views: a reader of many blocks reuses its memory instead of paying
        the page faults of fresh arrays (~2 ns per 8-byte value, as much as decoding)."""
        schema = table_schema(name)
        n = self._row_count(name, schema)
        if not 0 <= lo <= hi <= n:
            raise ValueError(f"rows {lo}..{hi} of /{name}: the table has {n}")
        wanted = [c.name for c in schema if columns is None or c.name in columns]
        pending = (
            {c: self._submit_chunks(pool, name, c, lo, hi) for c in wanted}
            if pool is not None
            else {}
        )
        got: dict[str, npt.NDArray[Any]] = {}
        for c in wanted:
            first, futures = pending.get(c, (0, None))
            if futures is not None:
                got[c] = self._gather_chunks(name, c, lo, hi, first, futures)
            elif out is not None:
                got[c] = self._read_into(name, c, lo, hi, out[c])
            else:
                got[c] = self._read(name, c, slice(lo, hi))
        if (bad := self._events_out_of_order(name, got, lo)) is not None:
            raise bad
        return got

    def _submit_chunks(
        self, pool: Executor, table: str, column: str, lo: int, hi: int
    ) -> tuple[int, list[Future[npt.NDArray[Any]]] | None]:
        """Read the stored chunks of rows [lo, hi) of a column and queue their decoding; None
        when the column is not stored in whole gzip chunks this reader can decode."""
        try:
            ds = self._dataset(table, column)
            chunk = self._gzip_chunk(table, column, ds)
            if not chunk or lo == hi:
                return 0, None
            first = lo - lo % chunk
            futures = []
            for offset in range(first, hi, chunk):
                mask, stored = ds.id.read_direct_chunk((offset,))
                if mask:
                    return 0, None  # a filter was skipped for this chunk: let HDF5 read it
                futures.append(pool.submit(chunkcodec.decode_chunk, stored, ds.dtype, chunk))
        except H5_ERRORS as e:
            raise self._corrupt(f"dataset /{table}/{column}", e) from e
        return first, futures

    def _gzip_chunk(self, table: str, column: str, ds: Any) -> int:
        """Rows per chunk of a column stored through the writer's gzip pipeline (gzip, shuffle,
        fletcher32), which ``chunkcodec`` decodes; 0 for any other. Asked once per column:
        h5py reads the filter pipeline anew at each call, ~0.2 ms for the three (at 10^8 events,
        3,500 blocks' columns took 0.76 s)."""
        chunk = self._gzip_chunks.get((table, column))
        if chunk is None:
            rows = ds.chunks[0] if ds.chunks else 0
            plain = ds.compression == "gzip" and ds.shuffle and ds.fletcher32
            chunk = self._gzip_chunks[(table, column)] = int(rows) if plain else 0
        return chunk

    def _gather_chunks(
        self,
        table: str,
        column: str,
        lo: int,
        hi: int,
        first: int,
        futures: list[Future[npt.NDArray[Any]]],
    ) -> npt.NDArray[Any]:
        try:
            parts = [f.result() for f in futures]
        except (ValueError, zlib.error) as e:
            raise self._corrupt(f"dataset /{table}/{column}", e) from e
        whole = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return whole[lo - first : hi - first]

    def iter_blocks(
        self,
        name: str,
        columns: list[str] | None = None,
        *,
        t0: int | None = None,
        t1: int | None = None,
        decode: bool = True,
        rows: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Table ``name`` in row blocks (a chunk-index block, or up to 1 Mi rows), as dicts of
        column arrays, restricted to the window ``[t0, t1)`` like ``table``; only the blocks the
        window needs are read. ``decode=False`` leaves ``sym`` columns as int32 codes. ``rows``
        caps a block's rows below 1 Mi (adjacent index blocks are merged up to it), for a
        reader whose memory must stay smaller than a 1 Mi-row block."""
        schema = table_schema(name)
        if name not in self.tables():
            return
        n = self._row_count(name, schema)
        wanted = [c for c in schema if columns is None or c.name in columns]
        windowed = (t0 is not None or t1 is not None) and name != "threads"
        time_cols = [c for c in ("start_ns", "end_ns", "t_ns") if c in {x.name for x in schema}]
        for lo, hi in (
            self._ranges(name, n, t0, t1, rows)
            if windowed
            else self._ranges(name, n, None, None, rows)
        ):
            sel = slice(lo, hi)
            cache: dict[str, npt.NDArray[Any]] = {}
            mask = None
            if windowed:
                cache = {c: self._read(name, c, sel) for c in time_cols}
                mask = self._window_mask(name, cache, t0, t1)
                if mask is not None and not mask.any():
                    continue
                if mask is not None and mask.all():
                    mask = None
            raw: dict[str, npt.NDArray[Any]] = dict(cache)
            for c in wanted:
                if c.name not in raw:
                    raw[c.name] = self._read(name, c.name, sel)
            if (bad := self._events_out_of_order(name, raw, lo)) is not None:
                raise bad
            block: dict[str, Any] = {}
            for c in wanted:
                arr = raw[c.name] if mask is None else raw[c.name][mask]
                block[c.name] = self._decode(name, c.name, arr) if c.is_symbol and decode else arr
            yield block

    def table(self, name: str, *, t0: int | None = None, t1: int | None = None) -> pd.DataFrame:
        """Rows of table ``name`` within the half-open window ``[t0, t1)`` (ns, monotonic).

        Event tables (start_ns/end_ns) keep rows that overlap the window; a zero-length event
        counts as the instant ``start_ns``. Tables of instants (``t_ns``: ``samples/*``) keep
        ``t0 <= t_ns < t1``. ``threads`` is never filtered. ``sym`` columns come back as
        categoricals of str. A table absent from the file gives an empty frame with the
        schema's columns and dtypes. With a chunk index (traces written by the streaming
        writer) a window reads only the chunks it overlaps.
        """
        schema = table_schema(name)
        if name in self.tables() and ((t0 is None and t1 is None) or name == "threads"):
            # No window: each column in one read, no per-block pieces to concatenate.
            n = self._row_count(name, schema)
            blocks = [self.read_rows(name, 0, n)] if n else []
        else:
            blocks = list(self.iter_blocks(name, t0=t0, t1=t1, decode=False))
        return self._frame(name, blocks)

    def _frame(self, name: str, blocks: list[dict[str, npt.NDArray[Any]]]) -> pd.DataFrame:
        """Raw column blocks of table ``name`` joined into the frame ``table`` returns."""
        if not blocks:
            return empty_frame(name)
        data: dict[str, Any] = {}
        for c in table_schema(name):
            parts = [b[c.name] for b in blocks]
            arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
            data[c.name] = self._decode(name, c.name, arr) if c.is_symbol else arr
        # The columns as they are: pandas' default stacks same-dtype columns into one block,
        # a second copy of the table while it is made (a long run's scheduler samples are
        # ~0.3 GiB per 10^9 events).
        return pd.DataFrame(data, copy=False)

    def verify(self) -> None:
        """Check everything a result depends on; raise TraceFormatError naming the first problem.

        Every dataset belongs to the schema; row counts match the columns (bounded by the file
        size); dtypes are the schema's; every byte of every column is read, so its fletcher32
        checksum is checked, and hashed against the column digest written with it; no event
        ends before it starts; string indices are in the table; the chunk index describes the
        data; and the stored run_id is the hash of the stored spec.

        A reader that needs the tables too checks them as it reads them, in one pass over the
        data: ``verify_structure`` and each table's ``verified_blocks``.
        """
        self.verify_structure()
        for table in self.tables():
            for _ in self.verified_blocks(table):
                pass

    def verify_structure(self) -> None:
        """What ``verify`` checks besides the tables' rows: every dataset belongs to the
        schema, and the stored run_id is the hash of the stored spec."""
        datasets: list[str] = []
        try:
            self._file.visititems(
                lambda name, obj: datasets.append(name) if isinstance(obj, h5py.Dataset) else None
            )
        except H5_ERRORS as e:
            raise self._corrupt("the group structure", e) from e
        known = {f"{t}/{c.name}" for t, schema in TABLES.items() for c in schema} | {STRINGS}
        known |= {f"{CHUNK_INDEX}/{t}" for t in TABLES}
        unknown = sorted(set(datasets) - known)
        if unknown:
            raise TraceFormatError(
                f"{self._path}: datasets {unknown[:5]} are not in trace schema v{SCHEMA_VERSION}"
            )
        self._verify_identity()

    def verified_table(self, name: str, *, pool: Executor | None = None) -> pd.DataFrame:
        """``table(name)``, every row checked as ``verify`` checks it, in the same read."""
        if name not in self.tables():
            return empty_frame(name)
        schema = table_schema(name)
        n = self._row_count(name, schema)
        # Each block copied into its place in whole-table columns as it comes, the blocks read
        # into two small reused sets of arrays: the blocks kept and then joined were a second
        # copy of the table at its peak (a long run's small tables are ~0.6 GiB per 10^9
        # events).
        whole = {c.name: np.empty(n, dtype=c.numpy_dtype) for c in schema}
        blocks = self.verified_blocks(name, pool=pool, reuse=True, rows=_TABLE_BLOCK_ROWS)
        for lo, hi, block in blocks:
            for column, values in block.items():
                whole[column][lo:hi] = values
        return self._frame(name, [whole] if n else [])

    def _column_digests(self, table: str) -> dict[str, Any]:
        try:
            group = self._file[table]
            digests_text = group.attrs.get(COLUMN_DIGESTS)
            digests = json.loads(plain_value(digests_text)) if digests_text is not None else {}
            if not isinstance(digests, dict):
                raise TypeError(f"{COLUMN_DIGESTS} is {type(digests).__name__}")
        except (*H5_ERRORS, json.JSONDecodeError) as e:
            raise self._corrupt(f"the column digests of /{table}", e) from e
        return digests

    def _check_dtypes(self, table: str, schema: Sequence[Any]) -> None:
        for c in schema:
            dtype = self._file[table][c.name].dtype
            if dtype != np.dtype(c.numpy_dtype):
                raise TraceFormatError(
                    f"{self._path}: dataset /{table}/{c.name} has dtype {dtype}, "
                    f"schema v{SCHEMA_VERSION} says {c.numpy_dtype}"
                )

    def verified_blocks(
        self,
        table: str,
        *,
        pool: Executor | None = None,
        reuse: bool = False,
        rows: int | None = None,
    ) -> Iterator[tuple[int, int, dict[str, npt.NDArray[Any]]]]:
        """(lo, hi, every column of rows [lo, hi)) of ``table`` block by block (its chunk-index
        blocks, else 1 Mi rows), each checked as ``verify`` checks it as it is read: dtypes,
        string codes, the index entry's time range, events ending before they start, each
        column's digest (``column_digest``: crc32, sha256 in older traces) over all its rows.
        The digests are compared after the last block: a caller keeps nothing it made of the
        blocks unless the iteration ran to its end (it raises TraceFormatError there). The
        blocks are read-only: a thread hashes each one while the caller uses it (zlib and
        hashlib release the GIL), so the check costs ~no wall time
        where a second core is free. ``pool``: as ``read_rows``. ``reuse``: the blocks are read
        into two sets of arrays used in turn (a fresh array costs its page faults, ~2 ns per
        8-byte value), so a block's arrays are valid only until the next block is asked for.
        ``rows``: adjacent index blocks are joined up to this many rows (one block may hold
        more; default 1 Mi)."""
        schema = table_schema(table)
        n = self._row_count(table, schema)
        digests = self._column_digests(table)
        self._check_dtypes(table, schema)
        index = self.chunk_index(table)
        algorithm = self.column_digest
        hashes = {c.name: column_hasher(algorithm) for c in schema}
        # Adjacent index blocks read together (up to 1 Mi rows: the per-read costs are paid
        # per block), each entry then checked against its own rows.
        ranges = self._ranges(table, n, None, None, rows)
        # Block i's index entries: entries[ends[i]:ends[i + 1]].
        entries = index if index is not None else np.empty((0, 4), np.int64)
        ends = [0, *(int(np.searchsorted(entries[:, 1], hi, side="right")) for _, hi in ranges)]

        def check(i: int, block: dict[str, npt.NDArray[Any]]) -> None:
            for name, values in block.items():
                # The array's own buffer: hashlib reads it without the copy tobytes() makes.
                hashes[name].update(np.ascontiguousarray(values).data.cast("B"))
            self._check_entries(table, block, ranges[i][0], entries[ends[i] : ends[i + 1]])

        def load(i: int, sets: list[dict[str, npt.NDArray[Any]]]) -> dict[str, Any]:
            lo, hi = ranges[i]
            block = self.read_rows(table, lo, hi, pool=pool, out=sets[i % 2] if sets else None)
            for values in block.values():
                values.flags.writeable = False
            self._check_block(table, block, lo, hi, None)
            return block

        # While the caller uses block i, a thread hashes it and checks its index entries'
        # time ranges, and another reads and checks block i + 1 (h5py lets go of the GIL
        # while HDF5 reads and decodes; zlib and hashlib too). Block i + 1 is read into the
        # arrays of block i - 1 once that block's check is done (the caller, having asked for
        # block i, is done with it). The hashes see the rows in order, since each block's
        # check waits for the one before; a failed check is raised when the caller asks for
        # the next block, or at the end.
        checking: Future[None] | None = None
        with ThreadPoolExecutor(2, thread_name_prefix="codl-verify") as threads:
            size = max((hi - lo for lo, hi in ranges), default=0)
            sets = [
                {c.name: np.empty(size, dtype=c.numpy_dtype) for c in schema}
                for _ in range(2 if reuse else 0)
            ]
            loading: Future[dict[str, Any]] | None = None
            for i, (lo, hi) in enumerate(ranges):
                block = loading.result() if loading is not None else load(0, sets)
                if checking is not None:
                    checking.result()
                if i + 1 < len(ranges):
                    loading = threads.submit(load, i + 1, sets)
                checking = threads.submit(check, i, block)
                # Events ending before they start were refused by read_rows, before the caller
                # sees the block: a reducer would choke on a negative duration less tellingly.
                yield lo, hi, block
            if checking is not None:
                checking.result()
        got = {c: h.hexdigest() for c, h in hashes.items()}
        self._compare_digests(table, got, digests, algorithm)

    def _compare_digests(
        self, table: str, got: dict[str, str], stored: dict[str, Any], algorithm: str
    ) -> None:
        """Each column's digest over all its rows (``got``, in the schema's order) against the
        one the writer stored, where it stored one."""
        for column, digest in got.items():
            expected = stored.get(column)
            if expected is not None and digest != expected:
                raise TraceFormatError(
                    f"{self._path}: dataset /{table}/{column} does not match its {algorithm}; "
                    "corrupt"
                )

    def _check_entries(
        self,
        table: str,
        block: dict[str, npt.NDArray[Any]],
        lo: int,
        entries: npt.NDArray[np.int64],
    ) -> None:
        """Each chunk-index entry of a block (first row ``lo``) against its own rows."""
        for entry in entries:
            e_lo, e_hi = int(entry[0]) - lo, int(entry[1]) - lo
            times = {k: v[e_lo:e_hi] for k, v in block.items() if k in _TIME_COLUMNS}
            self._check_block(table, times, int(entry[0]), int(entry[1]), entry)

    def _check_block(
        self,
        table: str,
        block: dict[str, npt.NDArray[Any]],
        lo: int,
        hi: int,
        entry: npt.NDArray[np.int64] | None,
    ) -> None:
        """String codes in the table; the chunk index entry's time range is the block's."""
        for c in table_schema(table):
            if c.is_symbol and c.name in block:
                self._check_codes(table, c.name, block[c.name])
        if entry is not None and tuple(entry[2:]) != time_range(table, block, hi - lo):
            raise TraceFormatError(
                f"{self._path}: the chunk index /{CHUNK_INDEX}/{table} gives rows "
                f"{lo}..{hi} a time range they do not have; corrupt"
            )

    def _verify_identity(self) -> None:
        run_id, spec = self._attrs.get("run_id"), self._attrs.get("spec")
        if run_id is None or spec is None:
            return
        try:
            derived = RunSpec.from_dict(spec).run_id if isinstance(spec, dict) else None
        except ConfigError as e:
            raise TraceFormatError(
                f"{self._path}: the stored spec is not a valid run spec ({e.problems[:3]})"
            ) from e
        if derived != run_id:
            raise TraceFormatError(
                f"{self._path}: run_id {run_id!r} is not the hash of the stored spec "
                f"({derived!r}); the spec or the id was altered"
            )


def empty_frame(table: str) -> pd.DataFrame:
    """A zero-row frame with ``table``'s columns and the dtypes ``Trace.table`` returns."""
    data: dict[str, Any] = {}
    for c in table_schema(table):
        if c.is_symbol:
            data[c.name] = pd.Categorical([], categories=pd.Index([], dtype="str"))
        else:
            data[c.name] = np.empty(0, dtype=c.numpy_dtype)
    return pd.DataFrame(data)


def _read_attrs(f: Any, path: Path) -> dict[str, Any]:
    raw = {name: plain_value(f.attrs[name]) for name in f.attrs}
    json_names: set[str] = {n for n in JSON_ATTRS if n in raw}
    listed = raw.get("json_attrs")
    if listed is not None:
        try:
            decoded_list = json.loads(listed)
        except (TypeError, json.JSONDecodeError) as e:
            raise TraceFormatError(f"{path}: root attribute 'json_attrs' is not JSON ({e})") from e
        raw["json_attrs"] = decoded_list
        json_names.update(n for n in decoded_list if n in raw)
    for name in json_names:
        try:
            raw[name] = json.loads(raw[name])
        except (TypeError, json.JSONDecodeError) as e:
            raise TraceFormatError(f"{path}: root attribute {name!r} is not JSON ({e})") from e
    return raw


def _read_strings(f: Any, path: Path, complete: bool) -> list[str]:
    ds = f.get(STRINGS)
    if ds is None:
        if complete:
            raise TraceFormatError(f"{path}: the string table /{STRINGS} is missing")
        # A writer killed before abort() never wrote it; numeric columns are still readable.
        return [""]
    if not isinstance(ds, h5py.Dataset) or len(ds.shape) != 1:
        raise TraceFormatError(f"{path}: /{STRINGS} is not a 1-D dataset")
    # Each variable-length string takes at least a 16-byte heap reference in the file.
    if ds.shape[0] > path.stat().st_size // 16 + 1:
        raise TraceFormatError(f"{path}: /{STRINGS} claims {ds.shape[0]} strings; corrupt")
    try:
        strings = [s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in ds[()].tolist()]
        digest = ds.attrs.get("sha256")
    except OSError as e:
        raise TraceFormatError(f"{path}: dataset /{STRINGS} is unreadable ({e})") from e
    if digest is not None and plain_value(digest) != strings_digest(strings):
        raise TraceFormatError(f"{path}: dataset /{STRINGS} does not match its sha256; corrupt")
    if len(set(strings)) != len(strings) or not strings or strings[0] != "":
        raise TraceFormatError(f"{path}: dataset /{STRINGS} is not an interned string table")
    return strings


def open_trace(path: str | os.PathLike[str], *, allow_incomplete: bool = False) -> Trace:
    """Open a trace for reading, checking it is a complete codl trace of a supported version.

    ``allow_incomplete`` also opens aborted (``*.incomplete.h5``) and killed (``*.partial``)
    traces, for salvaging what they measured.
    """
    p = Path(path)
    if not p.is_file():
        candidates = [incomplete_path(p), partial_path(p)]
        with contextlib.suppress(OSError):
            candidates += sorted(p.parent.glob(f"{glob_escape(p.name)}.*{PARTIAL_SUFFIX}"))
        hints = [str(c) for c in dict.fromkeys(candidates) if c.exists()]
        hint = f" (found unfinished {', '.join(hints)})" if hints else ""
        raise TraceFormatError(f"{p}: no such trace file{hint}")
    try:
        is_hdf5 = h5py.is_hdf5(os.fspath(p))
    except H5_ERRORS as e:
        raise TraceFormatError(f"{p}: cannot read ({e})") from e
    if not is_hdf5:
        raise TraceFormatError(f"{p}: not an HDF5 file")
    try:
        # No HDF5 chunk cache: every read here decodes whole row ranges once, and the column
        # datasets stay open for the trace's life, each with its own cache (~0.25 GiB held at
        # 10^8 events by `codl summarize`, for no measured speed: benchmarks/summarize_cost.py).
        f = h5py.File(p, "r", rdcc_nbytes=0)
    except H5_ERRORS as e:
        raise TraceFormatError(f"{p}: cannot open as HDF5 ({e}); truncated or corrupt") from e
    try:
        try:
            attrs = _read_attrs(f, p)
        except H5_ERRORS as e:
            raise TraceFormatError(f"{p}: root attributes are unreadable ({e})") from e
        version = attrs.get("schema_version")
        if version is None:
            raise TraceFormatError(f"{p}: no 'schema_version' attribute; not a codl trace")
        if version != SCHEMA_VERSION:
            raise TraceFormatError(
                f"{p}: trace schema version {version!r}, this codl reads version {SCHEMA_VERSION}"
            )
        try:
            digest = metadata_digest(f) if DIGEST_ATTR in attrs else None
        except H5_ERRORS as e:
            raise TraceFormatError(f"{p}: metadata is unreadable ({e}); corrupt") from e
        if digest is not None and attrs[DIGEST_ATTR] != digest:
            raise TraceFormatError(
                f"{p}: metadata (attributes, row counts, shapes) does not match its sha256; "
                "the file is corrupt or was edited"
            )
        problem = root_attrs_problem(attrs)
        if problem is not None:
            raise TraceFormatError(
                f"{p}: root attribute {problem}; the file is damaged or was edited "
                "(docs/trace-format.md, Root attributes)"
            )
        complete = attrs.get("complete") is True
        if not complete and not allow_incomplete:
            reason = attrs.get(
                "incomplete_reason", "no reason recorded: the writer was killed or never finished"
            )
            raise TraceFormatError(
                f"{p}: incomplete trace ({reason}); pass allow_incomplete=True to read "
                "what it measured"
            )
        world = attrs.get("world_size", 1)
        if not allow_incomplete and isinstance(world, int) and world > 1 and "ranks" not in attrs:
            # A rank's own file of a multi-rank run: the run's trace is the merge of all ranks,
            # and a merge that was killed leaves these behind looking complete.
            raise TraceFormatError(
                f"{p}: rank {attrs.get('rank')!r} of a {world}-rank run, not the run's merged "
                "trace (the merge did not finish); pass allow_incomplete=True to read this rank"
            )
        try:
            strings = _read_strings(f, p, complete)
        except H5_ERRORS as e:
            raise TraceFormatError(f"{p}: dataset /{STRINGS} is unreadable ({e})") from e
    except BaseException:
        f.close()
        raise
    return Trace(f, p, attrs, strings)
