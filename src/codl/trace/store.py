"""The per-run HDF5 trace: a writer that never leaves a valid-looking partial file, and a reader.

Layout (schema v1, see ``codl.trace.schema`` and ``docs/trace-format.md``): one group per table
(``/events/app``, ``/samples/sched``, ``/threads`` ...) holding parallel 1-D datasets, one per
column; interned strings in ``/strings``; provenance in root attributes.

Crash safety: the writer works on ``<final>.partial`` and only ``finish()`` renames it to the final
name, after ``complete=True`` was written last and the file was fsync'ed. A failed or interrupted
run is renamed to ``<stem>.incomplete.h5`` (its measurements are kept), and a killed process
leaves only ``<final>.partial``. So a file at the final name is always a complete trace, and
``open_trace`` refuses everything else unless asked explicitly.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import json
import os
import secrets
import signal
import socket
import tempfile
import threading
import warnings
import zlib
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self

import h5py

# Registers the Blosc HDF5 filter (and hdf5plugin's others) with this process's HDF5: every
# reader of a trace goes through this module, so no user ever meets "filter not available".
import hdf5plugin
import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.errors import ConfigError, TraceFormatError
from codl.spec import RunSpec
from codl.trace import chunkcodec
from codl.trace.schema import SCHEMA_VERSION, TABLES, Column

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

STRINGS: Final = "strings"
# Group of the chunk index: /chunks/<table> is an int64 (blocks, 4) dataset.
CHUNK_INDEX: Final = "chunks"
INDEX_DOC: Final = (
    "chunk index: one row per block of rows written together (whole HDF5 chunks of every "
    "column): row_lo, row_hi (half-open), t_lo, t_hi (ns; events: earliest start_ns, latest "
    "end_ns or start_ns; samples: t_ns)"
)
PARTIAL_SUFFIX: Final = ".partial"
INCOMPLETE_SUFFIX: Final = ".incomplete.h5"

# Root attributes that always hold JSON text, whatever type they were given as.
JSON_ATTRS: Final[tuple[str, ...]] = ("spec", "versions", "anchors_start", "anchors_end")
# Written by the writer itself; set_attrs must not overwrite the completion protocol.
RESERVED_ATTRS: Final = frozenset(
    {"schema_version", "complete", "incomplete_reason", "json_attrs", "attrs_sha256"}
)
# Root attribute holding the sha256 of every root attribute, every table's row count, column
# digests, and every column's shape and dtype (see _metadata_digest). Written last.
DIGEST_ATTR: Final = "attrs_sha256"
# Group attribute of a table: JSON {column: sha256 of its first `rows` values}.
COLUMN_DIGESTS: Final = "sha256"
# What h5py raises on a damaged file, besides OSError: a flipped bit in a header can surface as
# any of these, and each must become a TraceFormatError naming the file.
H5_ERRORS: Final = (
    OSError,
    KeyError,
    RuntimeError,
    ValueError,
    TypeError,
    OverflowError,
    IndexError,
    AttributeError,
    UnicodeError,
)
# gzip's best ratio is ~1000:1; a row count claiming more data than that cannot be true.
_MAX_EXPANSION: Final = 2048

_VERIFY_BLOCK_ROWS: Final = 1 << 20
# Most compression threads a writer starts by default (a block has ~10 columns to share out).
_MAX_THREADS: Final = 4


def chunk_rows(column: Column) -> int:
    """Rows per HDF5 chunk for ``column``: ~``CHUNK_BYTES``, clamped to a sane row count."""
    itemsize = np.dtype(column.numpy_dtype).itemsize
    return max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, CHUNK_BYTES // itemsize))


def partial_path(final: str | os.PathLike[str], token: str = "") -> Path:
    """Where a trace is written on its way to ``final``: ``<final>[.<token>].partial``.

    Writers pass a token unique to them, so two writers of one path never write one file.
    """
    p = Path(final)
    return p.with_name(p.name + (f".{token}" if token else "") + PARTIAL_SUFFIX)


def lock_path(final: str | os.PathLike[str], purpose: str) -> Path:
    """The hidden lock file of ``final`` for ``purpose`` (``write``: TraceWriter; ``run``: a
    whole measured run): ``.<final name>.<purpose>.lock``."""
    p = Path(final)
    return p.with_name(f".{p.name}.{purpose}.lock")


@contextlib.contextmanager
def exclusive_lock(final: str | os.PathLike[str], purpose: str) -> Iterator[Path]:
    """Hold an exclusive lock on trace path ``final`` for ``purpose``, or fail at once.

    flock(2) on a lock file next to the trace: released by the kernel when the holder dies (a
    SIGKILLed run never blocks the next one), and honoured across nodes by Lustre and NFSv4.
    The file is removed on release; a holder re-checks after locking that the file it locked is
    still the one at the path, since the previous holder may have removed it in between.
    """
    lock = lock_path(final, purpose)
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise TraceFormatError(
                f"{final}: cannot create the lock file {lock} ({e.strerror or e}); is the "
                "directory writable?"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise TraceFormatError(
                f"{final}: another {purpose}r holds it ({holder}; lock {lock}); two runs must "
                "not share one trace path"
            ) from None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
        yield lock
    finally:
        # Unlink while still holding the lock, then release: see the docstring.
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def incomplete_path(final: str | os.PathLike[str]) -> Path:
    """Where an aborted trace is kept: ``<final stem>.incomplete.h5`` next to ``final``."""
    p = Path(final)
    return p.with_name(p.stem + INCOMPLETE_SUFFIX)


def check_trace_target(final: str | os.PathLike[str]) -> Path:
    """Check, before a run starts, that its trace can be written at ``final``.

    A run that measures for an hour and then finds its directory read-only or its name illegal
    has lost the hour; this creates the directory and a probe file in it, and raises a
    TraceFormatError naming the path otherwise.
    """
    p = Path(final)
    if p.name.endswith((INCOMPLETE_SUFFIX, PARTIAL_SUFFIX, ".lock")) or not p.name:
        raise TraceFormatError(
            f"{p}: a trace name must not end in {INCOMPLETE_SUFFIX!r}, {PARTIAL_SUFFIX!r} or "
            "'.lock'; those names mark unfinished traces and locks"
        )
    if p.is_dir():
        raise TraceFormatError(f"{p} is a directory, expected a trace file path")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=p.parent):
            pass
    except OSError as e:
        raise TraceFormatError(
            f"{p}: the trace cannot be written in {p.parent} ({e.strerror or e}); fix the "
            "path before the run, not after"
        ) from e
    return p


# The signals a run turns into exceptions (harness.runner); deferred while rows change hands.
DEFERRED_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM/SIGINT back for the block, and re-raise them after it.

    A Python signal handler that raises can fire between any two bytecodes; inside a block
    write or a recorder's hand-over that would leave columns of different lengths or a digest
    that hashed some rows twice. The handlers are swapped for one that only notes the signal
    (a thread mask would not do: the process's other threads would still take it), and a
    noted signal is raised again once the old handlers are back. Outside the main thread,
    where handlers cannot be set (and never run), the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old = {
        s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in DEFERRED_SIGNALS
    }
    try:
        yield
    finally:
        for s, handler in old.items():
            # None: a handler set outside Python, which cannot be put back; the default then.
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters bracketed, to match itself in ``Path.glob``."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_image(image: bytes, path: Path) -> None:
    """Write a finished in-memory HDF5 image and fsync it (OSError on a full disk)."""
    with path.open("wb") as fh:
        fh.write(image)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(directory: Path) -> None:
    # The rename is only durable once the directory entry is; without this a power loss can
    # bring back the .partial name (or nothing) after finish() returned.
    _fsync_path(directory)


def _strings_digest(strings: list[str]) -> str:
    # intern() rejects NUL, so joining on it is unambiguous.
    return hashlib.sha256("\0".join(strings).encode("utf-8")).hexdigest()


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _schema(table: str) -> tuple[Column, ...]:
    schema = TABLES.get(table)
    if schema is None:
        raise ValueError(
            f"unknown table {table!r}; schema v{SCHEMA_VERSION} has {', '.join(TABLES)}"
        )
    return schema


def _canonical_attr(value: Any) -> str:
    plain = _plain(value)
    return f"{type(plain).__name__}:{json.dumps(plain, sort_keys=True, default=str)}"


def _metadata_digest(f: Any) -> str:
    """sha256 over what decides a result besides the column data, which fletcher32 and the
    column digests cover: root attributes, row counts, column digests, shapes and dtypes.

    A single flipped bit in the spec attribute (a different worker count), in a row count (a
    shorter table) or in a dataspace (a longer one) then fails the check instead of reading as
    a different, valid-looking trace.
    """
    h = hashlib.sha256()
    for name in sorted(f.attrs):
        if name != DIGEST_ATTR:
            h.update(f"{name}={_canonical_attr(f.attrs[name])}\n".encode())
    for table, schema in TABLES.items():
        group = f.get(table)
        if not isinstance(group, h5py.Group):
            continue
        h.update(f"[{table}] rows={_canonical_attr(group.attrs.get('rows'))} ".encode())
        h.update(f"{COLUMN_DIGESTS}={_canonical_attr(group.attrs.get(COLUMN_DIGESTS))}\n".encode())
        for c in schema:
            ds = group.get(c.name)
            shape = ds.shape if isinstance(ds, h5py.Dataset) else None
            dtype = ds.dtype.str if isinstance(ds, h5py.Dataset) else None
            h.update(f"{c.name} {shape} {dtype}\n".encode())
    for table in TABLES:
        # Only traces with a chunk index add these lines: older traces keep their digest.
        ds = f.get(f"{CHUNK_INDEX}/{table}")
        if ds is not None:
            shape = ds.shape if isinstance(ds, h5py.Dataset) else None
            sha = _canonical_attr(ds.attrs.get("sha256"))
            h.update(f"[{CHUNK_INDEX}/{table}] {shape} {sha}\n".encode())
    return h.hexdigest()


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
    return max(chunk_rows(c) for c in _schema(table))


def row_bytes(table: str) -> int:
    return sum(np.dtype(c.numpy_dtype).itemsize for c in _schema(table))


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
        # sha256 of every column's committed values, updated as rows are written.
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
        _schema(table)
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
        schema = _schema(table)
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
            buf = _Buffer({c.name: np.empty(block, c.numpy_dtype) for c in _schema(table)})
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
        schema = _schema(table)
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
        self._chunks[table].append((start, start + n, *_time_range(table, buf.columns, n)))
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
                **_filter_options(self._compression),
            )
            ds.attrs["unit"] = c.unit
            ds.attrs["doc"] = c.doc
            # Lets a plain-h5py reader tell symbol columns from numbers without codl.
            ds.attrs["schema_dtype"] = c.dtype
        group.attrs["rows"] = 0
        self._rows[table] = 0
        self._chunks[table] = []
        self._hashes[table] = {c.name: hashlib.sha256() for c in schema}
        self._groups[table] = (group, datasets)
        return group

    def _write_strings(self, f: Any) -> None:
        if STRINGS in f:
            del f[STRINGS]
        data = np.array(self._strings, dtype=object)
        ds = f.create_dataset(STRINGS, data=data, dtype=h5py.string_dtype("utf-8"))
        # HDF5 filters do not cover variable-length data, so fletcher32 cannot protect this one.
        ds.attrs["sha256"] = _strings_digest(self._strings)
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
        f.attrs[DIGEST_ATTR] = _metadata_digest(f)

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
            _fsync_dir(self._path.parent)
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
            _fsync_dir(kept.parent)
        except (*H5_ERRORS, OSError) as e:
            self._discard()
            raise TraceFormatError(
                f"{self.incomplete_path}: could not keep the incomplete trace "
                f"({getattr(e, 'strerror', None) or e}); the measured data of this run is lost"
            ) from e
        return kept


def _filter_options(compression: Compression) -> dict[str, Any]:
    """h5py's create_dataset options of a column's filters (fletcher32 comes after them)."""
    if compression == "blosc-lz4":
        return dict(BLOSC)  # Blosc shuffles bytes itself
    return {
        "compression": compression,
        "compression_opts": GZIP_LEVEL if compression == "gzip" else None,
        "shuffle": True,
    }


def _time_range(table: str, columns: Mapping[str, npt.NDArray[Any]], n: int) -> tuple[int, int]:
    """(earliest, latest) time of the first ``n`` rows: start_ns..max(start_ns, end_ns) for
    events, t_ns for samples; what the chunk index stores per block."""
    if "start_ns" in columns:
        s, e = columns["start_ns"][:n], columns["end_ns"][:n]
        return int(s.min()), int(max(s.max(), e.max()))
    t = columns["t_ns"][:n]
    return int(t.min()), int(t.max())


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


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


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

    def chunk_index(self, table: str) -> npt.NDArray[np.int64] | None:
        """The table's chunk index, ``(blocks, 4)`` int64 rows of (row_lo, row_hi, t_lo, t_hi),
        checked against its sha256 and the row count; None for traces written without one."""
        if table in self._chunk_index:
            return self._chunk_index[table]
        n = self._row_count(table, _schema(table))
        try:
            ds = self._file.get(f"{CHUNK_INDEX}/{table}")
            if ds is None:
                self._chunk_index[table] = None
                return None
            data = np.asarray(ds[()], dtype=np.int64)
            digest = _plain(ds.attrs.get("sha256"))
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

    def _ranges(self, table: str, n: int, t0: int | None, t1: int | None) -> list[tuple[int, int]]:
        """Row ranges to read for the window [t0, t1): the index's blocks that can hold rows of
        it (adjacent ones merged), or everything when there is no index or no window."""
        index = self.chunk_index(table) if n else None
        if index is None:
            return [(lo, min(n, lo + _VERIFY_BLOCK_ROWS)) for lo in range(0, n, _VERIFY_BLOCK_ROWS)]
        keep = np.ones(len(index), dtype=bool)
        if t1 is not None:
            keep &= index[:, 2] < t1
        if t0 is not None:
            keep &= index[:, 3] >= t0
        ranges: list[tuple[int, int]] = []
        for lo, hi in index[keep, :2].tolist():
            if ranges and ranges[-1][1] == lo and hi - ranges[-1][0] <= _VERIFY_BLOCK_ROWS:
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
        return self._ranges(name, self._row_count(name, _schema(name)), None, None)

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
        schema = _schema(name)
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
        return got

    def _submit_chunks(
        self, pool: Executor, table: str, column: str, lo: int, hi: int
    ) -> tuple[int, list[Future[npt.NDArray[Any]]] | None]:
        """Read the stored chunks of rows [lo, hi) of a column and queue their decoding; None
        when the column is not stored in whole gzip chunks this reader can decode."""
        try:
            ds = self._file[table][column]
            chunk = ds.chunks[0] if ds.chunks else 0
            plain = ds.compression == "gzip" and ds.shuffle and ds.fletcher32 and chunk
            if not plain or lo == hi:
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
    ) -> Iterator[dict[str, Any]]:
        """Table ``name`` in row blocks (a chunk-index block, or up to 1 Mi rows), as dicts of
        column arrays, restricted to the window ``[t0, t1)`` like ``table``; only the blocks the
        window needs are read. ``decode=False`` leaves ``sym`` columns as int32 codes."""
        schema = _schema(name)
        if name not in self.tables():
            return
        n = self._row_count(name, schema)
        wanted = [c for c in schema if columns is None or c.name in columns]
        windowed = (t0 is not None or t1 is not None) and name != "threads"
        time_cols = [c for c in ("start_ns", "end_ns", "t_ns") if c in {x.name for x in schema}]
        for lo, hi in (
            self._ranges(name, n, t0, t1) if windowed else self._ranges(name, n, None, None)
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
            block: dict[str, Any] = {}
            for c in wanted:
                arr = cache[c.name] if c.name in cache else self._read(name, c.name, sel)
                arr = arr if mask is None else arr[mask]
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
        schema = _schema(name)
        if name in self.tables() and ((t0 is None and t1 is None) or name == "threads"):
            # No window: each column in one read, no per-block pieces to concatenate.
            n = self._row_count(name, schema)
            blocks = [self.read_rows(name, 0, n)] if n else []
        else:
            blocks = list(self.iter_blocks(name, t0=t0, t1=t1, decode=False))
        if not blocks:
            return empty_frame(name)
        data: dict[str, Any] = {}
        for c in schema:
            parts = [b[c.name] for b in blocks]
            arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
            data[c.name] = self._decode(name, c.name, arr) if c.is_symbol else arr
        return pd.DataFrame(data)

    def verify(self) -> None:
        """Check everything a result depends on; raise TraceFormatError naming the first problem.

        Every dataset belongs to the schema; row counts match the columns (bounded by the file
        size); dtypes are the schema's; every byte of every column is read, so its fletcher32
        checksum is checked, and hashed against the column digest written with it; no event
        ends before it starts; string indices are in the table; the chunk index describes the
        data; and the stored run_id is the hash of the stored spec.
        """
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
        for table in self.tables():
            self._verify_table(table)
        self._verify_identity()

    def _column_digests(self, table: str) -> dict[str, Any]:
        try:
            group = self._file[table]
            digests_text = group.attrs.get(COLUMN_DIGESTS)
            digests = json.loads(_plain(digests_text)) if digests_text is not None else {}
            if not isinstance(digests, dict):
                raise TypeError(f"{COLUMN_DIGESTS} is {type(digests).__name__}")
        except (*H5_ERRORS, json.JSONDecodeError) as e:
            raise self._corrupt(f"the column digests of /{table}", e) from e
        return digests

    def _verify_table(self, table: str) -> None:
        schema = _schema(table)
        n = self._row_count(table, schema)
        digests = self._column_digests(table)
        for c in schema:
            dtype = self._file[table][c.name].dtype
            if dtype != np.dtype(c.numpy_dtype):
                raise TraceFormatError(
                    f"{self._path}: dataset /{table}/{c.name} has dtype {dtype}, "
                    f"schema v{SCHEMA_VERSION} says {c.numpy_dtype}"
                )
        index = self.chunk_index(table)
        hashes = {c.name: hashlib.sha256() for c in schema}
        bad: tuple[int, int] | None = None  # (first row, count) of events ending before start
        # With an index, block by block, so that each entry is checked against its rows.
        ranges = self._ranges(table, n, None, None) if index is None else index[:, :2].tolist()

        def digest(block: dict[str, npt.NDArray[Any]]) -> None:
            for name, values in block.items():
                # The array's own buffer: hashlib reads it without the copy tobytes() makes.
                hashes[name].update(np.ascontiguousarray(values).data.cast("B"))

        # sha256 releases the GIL: block i is hashed on a thread while block i + 1 is read and
        # checked (HDF5 holds h5py's lock). At most two blocks are held, and the hashes see the
        # rows in order, since each block's hashing waits for the one before.
        hashing: Future[None] | None = None
        with ThreadPoolExecutor(1, thread_name_prefix="codl-verify") as pool:
            for i, (lo, hi) in enumerate(ranges):
                block = {c.name: self._read(table, c.name, slice(lo, hi)) for c in schema}
                if hashing is not None:
                    hashing.result()
                hashing = pool.submit(digest, block)
                self._check_block(table, block, lo, hi, None if index is None else index[i])
                if "start_ns" in block and bad is None:
                    late = np.flatnonzero(block["end_ns"] < block["start_ns"])
                    bad = (lo + int(late[0]), int(late.size)) if late.size else None
            if hashing is not None:
                hashing.result()
        for c in schema:
            expected = digests.get(c.name)
            if expected is not None and hashes[c.name].hexdigest() != expected:
                raise TraceFormatError(
                    f"{self._path}: dataset /{table}/{c.name} does not match its sha256; corrupt"
                )
        if bad is not None:
            raise TraceFormatError(
                f"{self._path}: /{table} has {bad[1]}+ event(s) ending before they start "
                f"(first at row {bad[0]}); corrupt"
            )

    def _check_block(
        self,
        table: str,
        block: dict[str, npt.NDArray[Any]],
        lo: int,
        hi: int,
        entry: npt.NDArray[np.int64] | None,
    ) -> None:
        """String codes in the table; the chunk index entry's time range is the block's."""
        for c in _schema(table):
            if c.is_symbol:
                self._check_codes(table, c.name, block[c.name])
        if entry is not None and tuple(entry[2:]) != _time_range(table, block, hi - lo):
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
    for c in _schema(table):
        if c.is_symbol:
            data[c.name] = pd.Categorical([], categories=pd.Index([], dtype="str"))
        else:
            data[c.name] = np.empty(0, dtype=c.numpy_dtype)
    return pd.DataFrame(data)


def _read_attrs(f: Any, path: Path) -> dict[str, Any]:
    raw = {name: _plain(f.attrs[name]) for name in f.attrs}
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
    if digest is not None and _plain(digest) != _strings_digest(strings):
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
        f = h5py.File(p, "r")
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
            digest = _metadata_digest(f) if DIGEST_ATTR in attrs else None
        except H5_ERRORS as e:
            raise TraceFormatError(f"{p}: metadata is unreadable ({e}); corrupt") from e
        if digest is not None and attrs[DIGEST_ATTR] != digest:
            raise TraceFormatError(
                f"{p}: metadata (attributes, row counts, shapes) does not match its sha256; "
                "the file is corrupt or was edited"
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


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _dtype_label(c: Column) -> str:
    if c.is_symbol:
        return "sym (int32 → `/strings`)"
    return np.dtype(c.dtype).name


def schema_markdown() -> str:
    """The column tables of ``docs/trace-format.md``, generated from ``TABLES``.

    The docs must contain this text verbatim (tests/test_trace_store.py checks it), so the prose
    cannot drift from the schema.
    """
    lines = [
        f"<!-- generated by codl.trace.store.schema_markdown() from codl.trace.schema "
        f"(schema v{SCHEMA_VERSION}); edit schema.py, then paste the output here -->",
        "",
    ]
    for table, columns in TABLES.items():
        lines += [f"### `/{table}`", "", "| column | dtype | unit | meaning |", "|---|---|---|---|"]
        lines += [
            f"| `{c.name}` | {_dtype_label(c)} | {c.unit} | {_md_cell(c.doc)} |" for c in columns
        ]
        lines.append("")
    return "\n".join(lines)
