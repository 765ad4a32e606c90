"""What the writer and the reader of a trace share: names in the file, digests, the schema.

The metadata digest is computed by the writer when it seals a file and again by the reader that
opens it, so both must run this one function.
"""

from __future__ import annotations

import functools
import hashlib
import json
import zlib
from collections.abc import Mapping
from importlib import resources
from typing import Any, Final

import h5py
import numpy as np
import numpy.typing as npt

from codl.trace.schema import SCHEMA_VERSION, TABLES, Column

STRINGS: Final = "strings"
# Group of the chunk index: /chunks/<table> is an int64 (blocks, 4) dataset.
CHUNK_INDEX: Final = "chunks"

# Root attributes that always hold JSON text, whatever type they were given as.
JSON_ATTRS: Final[tuple[str, ...]] = ("spec", "versions", "anchors_start", "anchors_end")
# Root attributes naming the codec of every table column and its HDF5 filter id, so that a tool
# outside codl can tell what it needs without parsing `spec` (docs/trace-format.md,
# "Compression"). Traces written before them have neither: `stored_codec` reads the pipeline.
CODEC_ATTR: Final = "compression"
FILTER_ATTR: Final = "hdf5_filter_id"
# The registered HDF5 filter id of each codec (H5Zpublic.h; The HDF Group's filter registry).
FILTER_IDS: Final[dict[str, int]] = {"blosc-lz4": 32001, "gzip": 1, "lzf": 32000}
# Root attribute holding the sha256 of every root attribute, every table's row count, column
# digests, and every column's shape and dtype (see metadata_digest). Written last.
DIGEST_ATTR: Final = "attrs_sha256"
# Group attribute of a table: JSON {column: digest of its first `rows` values}, the digest
# of the algorithm the root attribute COLUMN_DIGEST_ATTR names (sha256 where it is absent: the
# attribute keeps the name it had when sha256 was the only one).
COLUMN_DIGESTS: Final = "sha256"
# Root attribute naming the column digests' algorithm; traces written before it have sha256.
COLUMN_DIGEST_ATTR: Final = "column_digest"
# What a writer uses now: CRC-32 (zlib's), over the same bytes as sha256 was. Measured on a
# 2^18-row events/cuda block (benchmarks/summarize_cost.py's mix, 54 bytes a row, one core):
# sha256 32 ns a row, crc32 13 ns, an index-weighted numpy sum 9 ns (not taken: narrow columns
# need a widening pass and it misses some swaps a CRC finds). The digest guards against data
# changed after the file was sealed (HDF5's per-chunk fletcher32 against flipped bits), not
# against forgery: an edit that recomputes it passes either way (docs/trace-format.md).
COLUMN_DIGEST_ALGORITHM: Final = "crc32"
COLUMN_DIGEST_ALGORITHMS: Final = ("sha256", "crc32")
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


class Crc32:
    """``zlib.crc32`` with hashlib's ``update``/``hexdigest`` (zlib releases the GIL over
    buffers of more than a few KiB, as hashlib does)."""

    def __init__(self) -> None:
        self._crc = 0

    def update(self, data: Any) -> None:
        self._crc = zlib.crc32(data, self._crc)

    def hexdigest(self) -> str:
        return f"{self._crc:08x}"


def column_hasher(algorithm: str) -> Any:
    """A fresh digest of ``algorithm`` (``COLUMN_DIGEST_ALGORITHMS``) over a column's bytes."""
    if algorithm == "crc32":
        return Crc32()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"column digest {algorithm!r}: expected one of {COLUMN_DIGEST_ALGORITHMS}")


def strings_digest(strings: list[str]) -> str:
    # intern() rejects NUL, so joining on it is unambiguous.
    return hashlib.sha256("\0".join(strings).encode("utf-8")).hexdigest()


def table_schema(table: str) -> tuple[Column, ...]:
    schema = TABLES.get(table)
    if schema is None:
        raise ValueError(
            f"unknown table {table!r}; schema v{SCHEMA_VERSION} has {', '.join(TABLES)}"
        )
    return schema


def canonical_attr(value: Any) -> str:
    plain = plain_value(value)
    return f"{type(plain).__name__}:{json.dumps(plain, sort_keys=True, default=str)}"


def metadata_digest(f: Any) -> str:
    """sha256 over what decides a result besides the column data, which fletcher32 and the
    column digests cover: root attributes, row counts, column digests, shapes and dtypes.

    A single flipped bit in the spec attribute (a different worker count), in a row count (a
    shorter table) or in a dataspace (a longer one) then fails the check instead of reading as
    a different, valid-looking trace.
    """
    h = hashlib.sha256()
    for name in sorted(f.attrs):
        if name != DIGEST_ATTR:
            h.update(f"{name}={canonical_attr(f.attrs[name])}\n".encode())
    for table, schema in TABLES.items():
        group = f.get(table)
        if not isinstance(group, h5py.Group):
            continue
        h.update(f"[{table}] rows={canonical_attr(group.attrs.get('rows'))} ".encode())
        h.update(f"{COLUMN_DIGESTS}={canonical_attr(group.attrs.get(COLUMN_DIGESTS))}\n".encode())
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
            sha = canonical_attr(ds.attrs.get("sha256"))
            h.update(f"[{CHUNK_INDEX}/{table}] {shape} {sha}\n".encode())
    return h.hexdigest()


def stored_codec(f: Any) -> str | None:
    """The codec of a trace's table columns: its ``compression`` attribute, or, in traces
    written before it, the filter pipeline of the first column dataset; None without one."""
    codec = f.attrs.get(CODEC_ATTR)
    if codec is not None:
        return str(plain_value(codec))
    by_id = {str(i): name for name, i in FILTER_IDS.items()}
    for table, schema in TABLES.items():
        ds = f.get(f"{table}/{schema[0].name}")
        if isinstance(ds, h5py.Dataset):
            # h5py names the filters it knows ("gzip", "lzf") and others by their id.
            for key in ds._filters:
                if key in FILTER_IDS:
                    return str(key)
                if key in by_id:
                    return by_id[key]
            return None
    return None


@functools.cache
def _attrs_validator() -> Any:
    # Imported on first use: `codl run` imports the store before torch, and pays for neither.
    import jsonschema
    import yaml

    text = resources.files("codl").joinpath("schemas/trace-attrs.schema.yaml").read_text()
    return jsonschema.Draft202012Validator(yaml.safe_load(text))


def root_attrs_problem(attrs: Mapping[str, Any]) -> str | None:
    """What breaks the root attributes' promises (schemas/trace-attrs.schema.yaml and the run's
    own times in order), naming the attribute, e.g. ``clock_alignment.ranks[1].bound_ns: 'x'
    is not of type 'integer'``; None when they keep them. ``attrs`` as the reader decodes
    them."""
    errors = sorted(
        _attrs_validator().iter_errors(dict(attrs)),
        key=lambda e: [str(x) for x in e.absolute_path],
    )
    if errors:
        err = errors[0]
        where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in err.absolute_path)
        return f"{where.lstrip('.') or 'the root'}: {err.message}"
    for who, a in [
        ("", attrs),
        *((f"ranks[{i}].", r) for i, r in enumerate(attrs.get("ranks", []))),
    ]:
        begin, end = a.get("t_begin_ns"), a.get("t_end_ns")
        if begin is not None and end is not None and end < begin:
            return f"{who}t_end_ns ({end}) is before {who}t_begin_ns ({begin})"
    return None


def time_range(table: str, columns: Mapping[str, npt.NDArray[Any]], n: int) -> tuple[int, int]:
    """(earliest, latest) time of the first ``n`` rows: start_ns..max(start_ns, end_ns) for
    events, t_ns for samples; what the chunk index stores per block."""
    if "start_ns" in columns:
        s, e = columns["start_ns"][:n], columns["end_ns"][:n]
        return int(s.min()), int(max(s.max(), e.max()))
    t = columns["t_ns"][:n]
    return int(t.min()), int(t.max())


def plain_value(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


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
