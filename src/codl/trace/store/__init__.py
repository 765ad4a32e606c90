"""The per-run HDF5 trace: a writer that never leaves a valid-looking partial file, and a reader.

Layout (schema v1, see ``codl.trace.schema`` and ``docs/trace-format.md``): one group per table
(``/events/app``, ``/samples/sched``, ``/threads`` ...) holding parallel 1-D datasets, one per
column; interned strings in ``/strings``; provenance in root attributes.

Crash safety: the writer works on ``<final>.partial`` and only ``finish()`` renames it to the final
name, after ``complete=True`` was written last and the file was fsync'ed. A failed or interrupted
run is renamed to ``<stem>.incomplete.h5`` (its measurements are kept), and a killed process
leaves only ``<final>.partial``. So a file at the final name is always a complete trace, and
``open_trace`` refuses everything else unless asked explicitly.

The store's rooms; this module re-exports what the rest of codl uses:

- ``files``: the names of unfinished traces (partial, incomplete), ``check_trace_target``, and
  ``set_aside_stale``, the one way a trace of an earlier attempt is moved aside
  (``<stem>.stale-<mtime_ns><suffix>``); locks, held-back signals and fsync are ``codl.files``'.
- ``writer``: ``TraceWriter``, its compression filters, block and chunk sizing, the disk-space
  reservation and ``TraceDiskFullError``.
- ``reader``: ``open_trace``, ``Trace`` (tables, blocks, windows, ``verify``), ``empty_frame``.
- ``layout``: what writer and reader share: names in the file, the digests, ``schema_markdown``.
- ``merge``: merging a multi-rank run's per-rank traces into one (``merge_rank_traces``,
  ``merge_incomplete_ranks``, ``rank_trace_path``); import it as ``codl.trace.store.merge``.
- ``convert``: ``convert_trace``, a copy of a trace with another codec (``codl convert``).
"""

from __future__ import annotations

from codl.trace.store.files import (
    check_trace_target,
    incomplete_path,
    partial_path,
    set_aside_stale,
)
from codl.trace.store.layout import DIGEST_ATTR, schema_markdown
from codl.trace.store.reader import Trace, empty_frame, open_trace
from codl.trace.store.writer import (
    COMPRESSIONS,
    DEFAULT_COMPRESSION,
    RESERVED_ATTRS,
    Compression,
    TraceDiskFullError,
    TraceWriter,
    block_rows,
    buffer_bound_bytes,
    chunk_rows,
    row_bytes,
)

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_COMPRESSION",
    "DIGEST_ATTR",
    "RESERVED_ATTRS",
    "Compression",
    "Trace",
    "TraceDiskFullError",
    "TraceWriter",
    "block_rows",
    "buffer_bound_bytes",
    "check_trace_target",
    "chunk_rows",
    "empty_frame",
    "incomplete_path",
    "open_trace",
    "partial_path",
    "row_bytes",
    "schema_markdown",
    "set_aside_stale",
]
