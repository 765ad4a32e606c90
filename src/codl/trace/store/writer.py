"""The trace writer: ``TraceWriter`` buffers rows per table and writes them as whole chunks
into a partial file whose disk space it reserved ahead, and seals the file on ``finish()``."""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import os
import secrets
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self

import h5py
import hdf5plugin
import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.errors import TraceFormatError
from codl.files import exclusive_lock, fsync_path, signals_deferred
from codl.trace import chunkcodec
from codl.trace.schema import SCHEMA_VERSION, TABLES, Column
from codl.trace.store.files import INCOMPLETE_SUFFIX, PARTIAL_SUFFIX, incomplete_path, partial_path
from codl.trace.store.layout import (
    CHUNK_INDEX,
    CODEC_ATTR,
    COLUMN_DIGEST_ALGORITHM,
    COLUMN_DIGEST_ATTR,
    COLUMN_DIGESTS,
    DIGEST_ATTR,
    FILTER_ATTR,
    FILTER_IDS,
    H5_ERRORS,
    JSON_ATTRS,
    STRINGS,
    column_hasher,
    metadata_digest,
    strings_digest,
    table_schema,
    time_range,
)

Compression = Literal["blosc-lz4", "gzip", "lzf"]
COMPRESSIONS: Final[tuple[Compression, ...]] = ("blosc-lz4", "gzip", "lzf")
# Blosc with LZ4 and byte shuffle (hdf5plugin's filter 32001) writes ~2.5x more events per
# CPU-second than gzip-1 and reads ~2-3x more, at 7-18 % more bytes (benchmarks/long_trace.py,
# docs/design.md "Trace storage"): the tracer's CPU competes with the loader and launch threads
# it measures, so the cheap codec is the default. gzip is the portable choice (every HDF5
# build reads it without plugins); lzf, an h5py-only filter, is kept for the store benchmark.
DEFAULT_COMPRESSION: Final[Compression] = "blosc-lz4"
# The Blosc filter's own options: LZ4 at Blosc's default level 5, byte shuffle inside Blosc
# (so no HDF5 shuffle filter), one thread (the filter runs in the writing thread).
BLOSC: Final = hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE)
GZIP_LEVEL: Final = 1

# ~0.5 MiB chunks (docs/design.md, "Trace storage"): large enough for compression and few
# chunk-index entries at 10 M rows, small enough that one chunk per dataset fits HDF5's
# chunk cache while appending.
CHUNK_BYTES: Final = 512 * 1024
MIN_CHUNK_ROWS: Final = 1024
MAX_CHUNK_ROWS: Final = 131072
# The writer writes whole chunks (block_rows), so it needs no chunk cache; readers get one that
# holds a whole chunk.
_CHUNK_CACHE_BYTES: Final = 4 * CHUNK_BYTES
# Space kept reserved (fallocated) beyond HDF5's end of allocation at all times: what abort()
# and finish() write (attributes, digests, chunk index, group headers) must fit in it after the
# disk has filled. The string table is reserved on top, as it grows.
_META_RESERVE_BYTES: Final = 2 * 1024 * 1024
# Reserved per column per written block on top of the data: chunk B-tree entries and splits.
_CHUNK_OVERHEAD_BYTES: Final = 4096
# Heap and index bytes per interned string in /strings, on top of its UTF-8 text.
_STRING_OVERHEAD_BYTES: Final = 32
# HDF5's metadata cache (chunk B-trees, object headers) of the writer; part of its memory bound.
_MDC_MAX_BYTES: Final = 8 * 1024 * 1024

INDEX_DOC: Final = (
    "chunk index: one row per block of rows written together (whole HDF5 chunks of every "
    "column): row_lo, row_hi (half-open), t_lo, t_hi (ns; events: earliest start_ns, latest "
    "end_ns or start_ns; samples: t_ns)"
)
# Written by the writer itself; set_attrs must not overwrite the completion protocol.
RESERVED_ATTRS: Final = frozenset(
    {
        "schema_version",
        "complete",
        "incomplete_reason",
        "json_attrs",
        "attrs_sha256",
        CODEC_ATTR,
        FILTER_ATTR,
        COLUMN_DIGEST_ATTR,
    }
)
# Most compression threads a writer starts by default (a block has ~10 columns to share out).
_MAX_THREADS: Final = 4


def chunk_rows(column: Column) -> int:
    """Rows per HDF5 chunk for ``column``: ~``CHUNK_BYTES``, clamped to a sane row count."""
    itemsize = np.dtype(column.numpy_dtype).itemsize
    return max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, CHUNK_BYTES // itemsize))


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class TraceDiskFullError(TraceFormatError):
    """The trace's disk (or the process's file-size limit) has no room for the next chunk.

    Raised by the writer *before* HDF5 writes anything that would not fit: the space every
    HDF5 write lands in was reserved ahead (``posix_fallocate``), because HDF5 can crash the
    process when a write fails inside its own cache flush.
    """


class _Disk:
    """The partial file, as the file object h5py's ``fileobj`` driver writes through.

    Space is reserved ahead of HDF5 with ``posix_fallocate`` (``reserve``), so every write HDF5
    makes lands in blocks the file system has already given the file: a full disk or an
    ``RLIMIT_FSIZE`` fails ``reserve`` with a clean OSError, never a write inside HDF5. The
    driver sees the *logical* size (the end of what HDF5 wrote or truncated to), so its EOA,
    ``FileID.get_filesize()``, is exact; ``close`` cuts the reserved tail off.
    """

    def __init__(self, path: Path) -> None:
        # "x": never write through a file that is not this writer's own.
        self._fh = path.open("xb+", buffering=0)
        self._logical = 0
        self._reserved = 0

    @property
    def logical(self) -> int:
        return self._logical

    def reserve(self, end: int) -> None:
        """Make sure the file has blocks up to byte ``end``; OSError when it cannot."""
        if end <= self._reserved:
            return
        # Grow by at least a quarter, so that a long run makes O(log size) fallocate calls.
        target = max(end, self._reserved + self._reserved // 4)
        os.posix_fallocate(self._fh.fileno(), self._reserved, target - self._reserved)
        self._reserved = target

    # The file-object protocol h5py's fileobj driver calls.
    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_END:
            return self._fh.seek(self._logical + offset)
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def readinto(self, buffer: Any) -> int | None:
        return self._fh.readinto(buffer)

    def read(self, size: int = -1) -> bytes:
        return self._fh.read(size)

    def write(self, data: Any) -> int:
        at = self._fh.tell()
        n = self._fh.write(data)
        if n is None:
            raise OSError(f"short write at {at}")
        self._logical = max(self._logical, at + n)
        return n

    def truncate(self, size: int | None = None) -> int:
        # HDF5 truncates to its EOA on every flush; the reserved blocks beyond it stay until
        # close(), which cuts the file to the logical size.
        self._logical = self._fh.tell() if size is None else size
        if self._logical > self._reserved:
            self._fh.truncate(self._logical)
        return self._logical

    def flush(self) -> None:
        pass

    def close(self, *, sync: bool) -> None:
        """Cut the reserved tail off, optionally fsync, and close."""
        try:
            os.ftruncate(self._fh.fileno(), self._logical)
            if sync:
                os.fsync(self._fh.fileno())
        finally:
            self._fh.close()


@dataclass
class _Buffer:
    """One table's rows not yet written: ``block`` rows per column, filled up to ``fill``."""

    columns: dict[str, npt.NDArray[Any]]
    fill: int = 0


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    FINISHED = "finished"
    ABORTED = "aborted"


def block_rows(table: str) -> int:
    """Rows the writer buffers per table before writing them: one whole HDF5 chunk of every
    column (chunk sizes are powers of two, so the largest is a multiple of the others); one
    chunk-index entry each."""
    return max(chunk_rows(c) for c in table_schema(table))


def row_bytes(table: str) -> int:
    return sum(np.dtype(c.numpy_dtype).itemsize for c in table_schema(table))


def buffer_bound_bytes() -> int:
    """The most the writer's row buffers hold, whatever the run's length: one block per table.

    Add HDF5's metadata cache (``_MDC_MAX_BYTES``), the string table, and 32 bytes per
    written block for the chunk index.
    """
    return sum(block_rows(t) * row_bytes(t) for t in TABLES)


class TraceWriter:
    """Writes one run's trace; use as ``with TraceWriter(path) as w: ...; w.finish()``.

    The constructor does no I/O. ``__enter__`` creates ``<path>.<token>.partial``; rows are
    buffered per table and written as whole HDF5 chunks while the run goes, so memory stays
    bounded (``buffer_bound_bytes``); ``finish()`` marks the file complete and renames it to
    ``path``; an exception in the ``with`` block, or leaving it without ``finish()``, keeps the
    data as ``<stem>.incomplete.h5`` (see ``abort``). Not thread-safe: one writer per process,
    fed by the recorders' flush.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        compression: str = DEFAULT_COMPRESSION,
        threads: int | None = None,
    ) -> None:
        self._path = Path(path)
        if self._path.name.endswith((INCOMPLETE_SUFFIX, PARTIAL_SUFFIX)):
            raise ValueError(
                f"{self._path}: a final trace name must not end in {INCOMPLETE_SUFFIX!r} or "
                f"{PARTIAL_SUFFIX!r}; those names mark unfinished traces"
            )
        # str(): a spec's TraceCompression is a str Enum whose str() is its value.
        name = str(compression)
        if name not in COMPRESSIONS:
            raise ValueError(
                f"compression {name!r}: expected one of {', '.join(COMPRESSIONS)} "
                "(trace.compression)"
            )
        self._compression: Compression = name
        if threads is not None and threads < 1:
            raise ValueError(f"threads={threads}: expected a positive number or None")
        # Compression threads (gzip; hashing only for the codecs HDF5 runs): by default one per
        # core this process may run on, so a pinned recorder never spreads onto cores it was
        # kept off.
        self._threads = threads or min(_MAX_THREADS, len(os.sched_getaffinity(0)))
        self._pool: ThreadPoolExecutor | None = None
        self._file: Any = None  # h5py.File while open
        self._disk: _Disk | None = None
        self._strings: list[str] = [""]
        self._strings_bytes = 0
        self._index: dict[str, int] = {"": 0}
        self._json_attrs: set[str] = set()
        self._rows: dict[str, int] = {}
        self._buffers: dict[str, _Buffer] = {}
        # Per table, one (row_lo, row_hi, t_lo, t_hi) per written block: the chunk index.
        self._chunks: dict[str, list[tuple[int, int, int, int]]] = {}
        # The digest of every column's committed values, updated as rows are written.
        self._hashes: dict[str, dict[str, Any]] = {}
        # Each table's group and column datasets, looked up once: h5py's lookup by name costs
        # as much per block as a small column's compression.
        self._groups: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._state = _State.NEW
        # Unique per writer (pid + random): two writers of one path never share a partial file.
        self._token = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._lock = contextlib.ExitStack()

    @property
    def path(self) -> Path:
        """The final path, which exists only after ``finish()``."""
        return self._path

    @property
    def partial_path(self) -> Path:
        return partial_path(self._path, self._token)

    @property
    def incomplete_path(self) -> Path:
        return incomplete_path(self._path)

    def rows(self, table: str) -> int:
        """Rows appended to ``table`` so far (written or still buffered)."""
        table_schema(table)
        buf = self._buffers.get(table)
        return self._rows.get(table, 0) + (buf.fill if buf else 0)

    def __enter__(self) -> Self:
        if self._state is not _State.NEW:
            raise RuntimeError(f"TraceWriter for {self._path} can be entered only once")
        if not self._path.parent.is_dir():
            raise FileNotFoundError(f"{self._path}: directory {self._path.parent} does not exist")
        # Held until finish()/abort() has put the file in place: a second writer of this path
        # fails here instead of one of them silently replacing the other's trace.
        self._lock.enter_context(exclusive_lock(self._path, "write"))
        try:
            self._disk = _Disk(self.partial_path)
            self._disk.reserve(_META_RESERVE_BYTES)
            self._file = h5py.File(self._disk, "w", rdcc_nbytes=0)
            self._limit_metadata_cache()
        except OSError as e:
            self._discard()
            self._lock.close()
            raise self._full_error(e) from e
        self._state = _State.OPEN
        self._file.attrs["schema_version"] = SCHEMA_VERSION
        self._file.attrs["complete"] = False
        self._file.attrs["json_attrs"] = "[]"
        self._file.attrs[CODEC_ATTR] = self._compression
        self._file.attrs[FILTER_ATTR] = FILTER_IDS[self._compression]
        self._file.attrs[COLUMN_DIGEST_ATTR] = COLUMN_DIGEST_ALGORITHM
        return self

    def _limit_metadata_cache(self) -> None:
        # HDF5's metadata cache grows with the chunk B-trees of a long run; capped, it keeps
        # the writer's memory bounded (the evicted entries are written into reserved space).
        config = self._file.id.get_mdc_config()
        config.max_size = _MDC_MAX_BYTES
        config.initial_size = min(config.initial_size, _MDC_MAX_BYTES)
        config.min_size = min(config.min_size, _MDC_MAX_BYTES)
        self._file.id.set_mdc_config(config)

    def _discard(self) -> None:
        """Close and delete the partial file without keeping anything."""
        self._stop_pool()
        if self._file is not None:
            with contextlib.suppress(*H5_ERRORS):
                self._file.close()
            self._file = None
        if self._disk is not None:
            with contextlib.suppress(OSError):
                self._disk.close(sync=False)
            self._disk = None
        self.partial_path.unlink(missing_ok=True)

    def _full_error(self, e: OSError) -> TraceDiskFullError:
        return TraceDiskFullError(
            f"{self._path}: no room for the trace in {self._path.parent} "
            f"({e.strerror or e}); the disk is full or the file-size limit was reached"
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state is not _State.OPEN:
            return
        if exc is None:
            warnings.warn(
                f"TraceWriter for {self._path}: finish() not called; "
                f"kept as {self.incomplete_path}",
                RuntimeWarning,
                stacklevel=2,
            )
            self.abort("finish() not called")
            return
        try:
            self.abort(repr(exc))
        except Exception as abort_exc:
            # The measurement's own exception is the one the user must see.
            exc.add_note(f"aborting trace {self._path} failed too: {abort_exc!r}")

    def _require_open(self) -> Any:
        if self._state is not _State.OPEN or self._file is None:
            raise RuntimeError(
                f"TraceWriter for {self._path} is {self._state.value}; "
                "use it inside its `with` block, before finish()/abort()"
            )
        return self._file

    def intern(self, s: str) -> int:
        """Index of ``s`` in the string table, adding it if new. Index 0 is ``""``."""
        idx = self._index.get(s)
        if idx is not None:
            return idx
        if not isinstance(s, str):
            raise TypeError(f"intern() takes str, got {type(s).__name__}: {s!r}")
        if "\0" in s:
            raise ValueError(f"cannot intern {s!r}: HDF5 strings cannot hold NUL")
        try:
            encoded = s.encode("utf-8")
        except UnicodeEncodeError as e:
            # Surrogate-escaped bytes (e.g. a /proc comm decoded with os.fsdecode) would only fail
            # at finish(), after the run; fail at the call that brought them in.
            raise ValueError(f"cannot intern {s!r}: not encodable as UTF-8 ({e})") from e
        idx = len(self._strings)
        self._strings.append(s)
        self._strings_bytes += len(encoded) + _STRING_OVERHEAD_BYTES
        self._index[s] = idx
        return idx

    def set_attrs(self, **attrs: object) -> None:
        """Set root provenance attributes.

        dict, list, tuple and None values, and every value of ``spec``, ``versions``,
        ``anchors_start`` and ``anchors_end``, are stored as JSON text and listed in the root
        attribute ``json_attrs`` (a str given for those four must already be JSON). Other values
        must be str, bool, int, float or numpy scalars.
        """
        f = self._require_open()
        for name, value in attrs.items():
            if name in RESERVED_ATTRS:
                raise ValueError(f"attribute {name!r} is written by TraceWriter itself")
            is_json = name in JSON_ATTRS or value is None or isinstance(value, dict | list | tuple)
            stored: object
            if is_json and isinstance(value, str):
                try:
                    json.loads(value)
                except json.JSONDecodeError as e:
                    raise ValueError(f"attribute {name!r}: str given but not JSON ({e})") from e
                stored = value
            elif is_json:
                try:
                    stored = json.dumps(value, ensure_ascii=False, default=_json_default)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"attribute {name!r}: not JSON serializable ({e})") from e
            elif isinstance(value, str | bool | int | float | np.generic):
                stored = value
            else:
                raise TypeError(
                    f"attribute {name!r}: {type(value).__name__} is not storable; "
                    "use str, bool, int, float, or dict/list (stored as JSON)"
                )
            self._reserve(_META_RESERVE_BYTES + len(str(stored).encode()))
            f.attrs[name] = stored
            if is_json:
                self._json_attrs.add(name)
            else:
                self._json_attrs.discard(name)
        f.attrs["json_attrs"] = json.dumps(sorted(self._json_attrs))

    def append(self, table: str, columns: Mapping[str, npt.ArrayLike]) -> None:
        """Append rows to ``table``; ``columns`` maps every column name of the table to values.

        ``sym`` columns take str sequences (interned here) or int indices from ``intern()``.
        Integers must fit the column's dtype; nothing is silently truncated. Rows are buffered
        and written a block (``block_rows``) at a time; TraceDiskFullError when the disk has
        no room for a block (the rows written before it are kept by ``abort``).
        """
        self._require_open()
        schema = table_schema(table)
        expected = [c.name for c in schema]
        missing = [n for n in expected if n not in columns]
        unknown = sorted(set(columns) - set(expected))
        if missing or unknown:
            raise ValueError(
                f"table {table!r}: missing columns {missing}, unknown columns {unknown}; "
                f"expected exactly {expected}"
            )
        arrays = {c.name: self._coerce(table, c, columns[c.name]) for c in schema}
        lengths = {name: len(a) for name, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"table {table!r}: columns differ in length: {lengths}")
        n = lengths[expected[0]]
        buf = self._buffer(table)
        block = block_rows(table)
        done = 0
        if table not in self._rows:
            self._create_table(self._file, table, schema)
        while done < n:
            take = min(n - done, block - buf.fill)
            for name, arr in arrays.items():
                buf.columns[name][buf.fill : buf.fill + take] = arr[done : done + take]
            buf.fill += take
            done += take
            if buf.fill == block:
                self._write_block(table)

    def _buffer(self, table: str) -> _Buffer:
        buf = self._buffers.get(table)
        if buf is None:
            block = block_rows(table)
            buf = _Buffer({c.name: np.empty(block, c.numpy_dtype) for c in table_schema(table)})
            self._buffers[table] = buf
        return buf

    def _reserve(self, nbytes: int) -> None:
        """Reserve room for ``nbytes`` more beyond HDF5's end of allocation, plus the standing
        reserve that abort() and finish() write their metadata into."""
        if self._disk is None:
            raise RuntimeError(f"TraceWriter for {self._path} has no open file")
        try:
            eoa = int(self._file.id.get_filesize()) if self._file is not None else 0
            self._disk.reserve(eoa + nbytes + _META_RESERVE_BYTES + self._strings_bytes)
        except OSError as e:
            raise self._full_error(e) from e

    def _write_block(self, table: str) -> None:
        """Write the table's buffered rows as whole chunks, then commit them."""
        with signals_deferred():
            self._write_block_now(table)

    def _write_block_now(self, table: str) -> None:
        buf = self._buffers[table]
        n = buf.fill
        if n == 0:
            return
        schema = table_schema(table)
        # Compressed chunks are at most a little larger than raw ones, plus fletcher32 and the
        # chunk B-tree entries.
        self._reserve(2 * n * row_bytes(table) + _CHUNK_OVERHEAD_BYTES * len(schema))
        group, datasets = self._groups[table]
        start = self._rows[table]
        hashes = self._hashes[table]
        values = {c.name: buf.columns[c.name][:n] for c in schema}
        pool = self._thread_pool()
        if self._compression == "gzip":
            # Every column's chunks compressed (and hashed) on the pool at once; HDF5 then gets
            # the finished bytes, in column order, from this thread only.
            jobs = [
                pool.submit(_encode_column, values[c.name], start, chunk_rows(c), hashes[c.name])
                for c in schema
            ]
            encoded = [job.result() for job in jobs]
        else:
            # HDF5 runs the filter (Blosc: ~1 GB/s per core) in this thread; the digests, which
            # cost about as much, are computed meanwhile on the pool (hashlib releases the GIL).
            hashed = [pool.submit(hashes[c.name].update, values[c.name].data) for c in schema]
        for i, c in enumerate(schema):
            ds = datasets[c.name]
            ds.resize((start + n,))
            if self._compression != "gzip":
                ds[start : start + n] = values[c.name]
                continue
            head, chunks = encoded[i]
            if head:
                # Rows that complete a chunk an earlier flush() left partly filled.
                ds[start : start + head] = values[c.name][:head]
            for offset, data in chunks:
                ds.id.write_direct_chunk((offset,), data)
        if self._compression != "gzip":
            for job in hashed:
                job.result()  # before `rows` commits them, and before the buffer is refilled
        # `rows` is the commit point: a reader ignores anything past it, e.g. the columns that an
        # append interrupted half-way had already extended.
        group.attrs["rows"] = start + n
        self._rows[table] = start + n
        self._chunks[table].append((start, start + n, *time_range(table, buf.columns, n)))
        buf.fill = 0

    def _thread_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="codl-trace")
        return self._pool

    def _stop_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _coerce(self, table: str, col: Column, values: npt.ArrayLike) -> npt.NDArray[Any]:
        where = f"table {table!r} column {col.name!r}"
        arr = np.asarray(values)
        if arr.ndim != 1:
            raise ValueError(f"{where}: expected a 1-D sequence, got shape {arr.shape}")
        if col.is_symbol and arr.dtype.kind in "UO":
            return self._intern_array(where, arr)
        target = np.dtype(col.numpy_dtype)
        if arr.size == 0:
            return np.empty(0, dtype=target)
        if arr.dtype.kind not in "iu":
            kinds = "integers or strings" if col.is_symbol else "integers"
            raise ValueError(f"{where}: expected {kinds}, got dtype {arr.dtype}")
        if arr.dtype != target:
            lo, hi = int(arr.min()), int(arr.max())
            info = np.iinfo(target)
            if lo < info.min or hi > info.max:
                raise ValueError(f"{where}: values {lo}..{hi} do not fit {target}")
        if col.is_symbol:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= len(self._strings):
                raise ValueError(
                    f"{where}: {lo}..{hi} are not all string indices (0..{len(self._strings) - 1})"
                )
        return arr.astype(target, copy=False)

    def _intern_array(self, where: str, arr: npt.NDArray[Any]) -> npt.NDArray[np.int32]:
        # Hash once per distinct label instead of a dict lookup per row: batches are 100k rows
        # of a handful of stage or phase names.
        codes, uniques = pd.factorize(arr)
        if codes.size and codes.min() < 0:
            raise ValueError(f"{where}: missing values (None/NaN) where strings were expected")
        ids = np.empty(len(uniques), dtype=np.int32)
        for i, label in enumerate(uniques):
            if not isinstance(label, str):
                raise ValueError(f"{where}: expected str labels, got {type(label).__name__}")
            ids[i] = self.intern(str(label))
        return ids[codes]

    def _create_table(self, f: Any, table: str, schema: tuple[Column, ...]) -> Any:
        self._reserve(_CHUNK_OVERHEAD_BYTES * len(schema))
        group = f.require_group(table)
        datasets = {}
        for c in schema:
            ds = datasets[c.name] = group.create_dataset(
                c.name,
                shape=(0,),
                maxshape=(None,),
                dtype=c.numpy_dtype,
                chunks=(chunk_rows(c),),
                fletcher32=True,
                **filter_options(self._compression),
            )
            ds.attrs["unit"] = c.unit
            ds.attrs["doc"] = c.doc
            # Lets a plain-h5py reader tell symbol columns from numbers without codl.
            ds.attrs["schema_dtype"] = c.dtype
        group.attrs["rows"] = 0
        self._rows[table] = 0
        self._chunks[table] = []
        self._hashes[table] = {c.name: column_hasher(COLUMN_DIGEST_ALGORITHM) for c in schema}
        self._groups[table] = (group, datasets)
        return group

    def _write_strings(self, f: Any) -> None:
        if STRINGS in f:
            del f[STRINGS]
        data = np.array(self._strings, dtype=object)
        ds = f.create_dataset(STRINGS, data=data, dtype=h5py.string_dtype("utf-8"))
        # HDF5 filters do not cover variable-length data, so fletcher32 cannot protect this one.
        ds.attrs["sha256"] = strings_digest(self._strings)
        ds.attrs["doc"] = "interned strings; sym columns index this, index 0 is ''"

    def _write_index(self, f: Any) -> None:
        """The chunk index of every table: ``/chunks/<table>``, see ``docs/trace-format.md``."""
        for table, entries in self._chunks.items():
            name = f"{CHUNK_INDEX}/{table}"
            if name in f:
                del f[name]
            data = np.asarray(entries, dtype=np.int64).reshape(-1, 4)
            ds = f.create_dataset(name, data=data, fletcher32=True, chunks=None)
            ds.attrs["sha256"] = hashlib.sha256(data.tobytes()).hexdigest()
            ds.attrs["doc"] = INDEX_DOC

    def _seal(self, f: Any) -> None:
        """Write the column digests and, last, the metadata digest over everything."""
        for table, hashes in self._hashes.items():
            f[table].attrs[COLUMN_DIGESTS] = json.dumps(
                {name: h.hexdigest() for name, h in hashes.items()}, sort_keys=True
            )
        if DIGEST_ATTR in f.attrs:
            del f.attrs[DIGEST_ATTR]
        f.attrs[DIGEST_ATTR] = metadata_digest(f)

    def flush(self) -> None:
        """Write every buffered row and HDF5's metadata, so that a process killed after this
        leaves a partial file whose rows so far ``open_trace(..., allow_incomplete=True)`` can
        read. Costs a partly filled chunk per table: call it rarely (every few minutes)."""
        f = self._require_open()
        self._flush_buffers()
        self._reserve(2 * self._strings_bytes)
        self._write_strings(f)
        f.flush()

    def _flush_buffers(self) -> None:
        for table in list(self._buffers):
            self._write_block(table)

    def _close_file(self, *, sync: bool) -> None:
        f, disk = self._file, self._disk
        self._file = None
        self._disk = None
        self._stop_pool()
        try:
            if f is not None:
                f.close()
        finally:
            if disk is not None:
                disk.close(sync=sync)

    def finish(self) -> Path:
        """Write the buffered rows, the string table and the chunk index, mark the trace
        complete, and move it to its final path."""
        f = self._require_open()
        self._flush_buffers()
        index_bytes = 32 * sum(len(e) for e in self._chunks.values())
        self._reserve(2 * self._strings_bytes + 2 * index_bytes)
        self._write_strings(f)
        self._write_index(f)
        f.attrs["complete"] = True  # last attribute written: everything before it is in
        self._seal(f)
        partial = self.partial_path
        try:
            self._close_file(sync=True)
            partial.replace(self._path)  # atomic rename (os.replace)
            # The rename is durable only once the directory entry is: without this a power loss
            # can bring back the .partial name (or nothing) after finish() returned.
            fsync_path(self._path.parent)
        except (*H5_ERRORS, OSError) as e:
            # Marked complete but not in place: remove it, so that no complete-looking trace
            # is left anywhere but at the final path.
            partial.unlink(missing_ok=True)
            self._state = _State.ABORTED
            self._lock.close()
            raise TraceFormatError(
                f"{self._path}: could not write the trace ({getattr(e, 'strerror', None) or e}); "
                "nothing was left at the final path"
            ) from e
        self._state = _State.FINISHED
        self._lock.close()
        return self._path

    def abort(self, reason: str, keep: bool = True) -> Path | None:
        """Give up on the trace: mark it incomplete with ``reason``.

        With ``keep`` the measured data moves to ``incomplete_path`` (never the final path) and
        that path is returned; without it the partial file is deleted. Calling it again is a
        no-op; calling it after ``finish()`` is an error (the trace is complete).
        """
        try:
            return self._abort(reason, keep)
        finally:
            self._lock.close()

    def _abort(self, reason: str, keep: bool) -> Path | None:
        if self._state is _State.FINISHED:
            raise RuntimeError(f"{self._path} is already finished; it cannot be aborted")
        if self._state is not _State.OPEN:
            self._state = _State.ABORTED
            return None
        self._state = _State.ABORTED
        if not keep:
            self._discard()
            return None
        partial = self.partial_path
        f = self._file
        try:
            try:
                self._flush_buffers()
            except TraceDiskFullError as e:
                lost = sum(b.fill for b in self._buffers.values())
                reason += f"; {lost} buffered rows not written: {e}"
            # Written into the standing reserve (_META_RESERVE_BYTES), which every reserve()
            # kept free beyond HDF5's end of allocation.
            f.attrs["complete"] = False
            f.attrs["incomplete_reason"] = reason
            self._write_strings(f)
            self._write_index(f)
            self._seal(f)
            self._close_file(sync=True)
            kept = self.incomplete_path
            partial.replace(kept)
            fsync_path(kept.parent)
        except (*H5_ERRORS, OSError) as e:
            self._discard()
            raise TraceFormatError(
                f"{self.incomplete_path}: could not keep the incomplete trace "
                f"({getattr(e, 'strerror', None) or e}); the measured data of this run is lost"
            ) from e
        return kept


def filter_options(compression: Compression) -> dict[str, Any]:
    """h5py's create_dataset options of a column's filters (fletcher32 comes after them)."""
    if compression == "blosc-lz4":
        return dict(BLOSC)  # Blosc shuffles bytes itself
    return {
        "compression": compression,
        "compression_opts": GZIP_LEVEL if compression == "gzip" else None,
        "shuffle": True,
    }


def _encode_column(
    values: npt.NDArray[Any], start: int, chunk: int, digest: Any
) -> tuple[int, list[tuple[int, bytes]]]:
    """One column's rows ``start..start+len(values)`` as stored chunks: the number of leading
    rows that belong to a chunk already in the file (written through HDF5), and (row offset,
    bytes) of every chunk from there on. Hashes the values into ``digest`` on the way."""
    digest.update(np.ascontiguousarray(values).tobytes())
    head = min(len(values), (-start) % chunk)
    out = [
        (start + lo, chunkcodec.encode_chunk(values[lo : lo + chunk], chunk, GZIP_LEVEL))
        for lo in range(head, len(values), chunk)
    ]
    return head, out
