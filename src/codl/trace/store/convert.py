"""A copy of a trace with another codec: ``codl convert`` writes a gzip copy that every HDF5
build reads without a plugin (h5dump, plain h5py, xarray, HDF5.jl), where the default Blosc
codec (HDF5 filter 32001) needs hdf5plugin or ``HDF5_PLUGIN_PATH``.

The copy is the same trace: every group, dataset, attribute and chunk shape, every column's
values and digests; only the table columns' filter pipeline and the root ``compression`` and
``hdf5_filter_id`` attributes differ, and the metadata digest is recomputed over them. It is
written as an output unit (``codl.outputs``) and checked with ``Trace.verify`` before it is
renamed into place, so a failed conversion leaves nothing at the output path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import h5py

from codl.errors import CodlError
from codl.outputs import OutputKind, check_output, output_unit
from codl.trace.store.layout import (
    CODEC_ATTR,
    DIGEST_ATTR,
    FILTER_ATTR,
    FILTER_IDS,
    metadata_digest,
)
from codl.trace.store.reader import open_trace
from codl.trace.store.writer import COMPRESSIONS, Compression, filter_options

# Rows copied per read/write: a whole number of chunks of every column (chunks are powers of
# two up to 2**17 rows), ~8 MiB of int64, so memory stays bounded on a 10^8-event trace.
_COPY_ROWS: Final = 1 << 20
# Filters that are not a codec: a dataset with only these (the chunk index) is copied as is.
_NOT_CODECS: Final = frozenset({"shuffle", "fletcher32", "scaleoffset", "nbit"})


def convert_trace(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    compression: str = "gzip",
    allow_incomplete: bool = False,
    option: str = "-o/--output",
) -> Path:
    """Write ``src`` to ``out`` with every table column stored with ``compression``.

    ``out`` is checked like every command's output (not the input, not a directory, device or
    existing trace); a stream (``/dev/stdout``, a pipe) is refused, as HDF5 needs a file it can
    seek in. CodlError for those and for an unknown codec; TraceFormatError for a bad input.
    """
    if compression not in COMPRESSIONS:
        raise CodlError(f"--compression {compression!r}: expected one of {', '.join(COMPRESSIONS)}")
    codec: Compression = compression  # narrowed by the membership test
    src_path, out_path = Path(src), Path(out)
    if check_output(out_path, inputs=(src_path,), option=option) is OutputKind.STREAM:
        raise CodlError(
            f"{option} {out_path} is a device or pipe; a trace is an HDF5 file, give a file path"
        )
    with (
        output_unit({option: out_path}, inputs=(src_path,)) as unit,
        open_trace(src_path, allow_incomplete=allow_incomplete) as source,
    ):
        # The input's columns against their digests first: a damaged input is named as the
        # input, not as the temporary copy that the check after the copy would read.
        source.verify()
        tmp = unit.path(out_path)
        with h5py.File(src_path, "r") as f, h5py.File(tmp, "w") as g:
            _copy_group(f, g, codec)
            g.attrs[CODEC_ATTR] = codec
            g.attrs[FILTER_ATTR] = FILTER_IDS[codec]
            if DIGEST_ATTR in f.attrs:
                del g.attrs[DIGEST_ATTR]
                g.attrs[DIGEST_ATTR] = metadata_digest(g)
        # Every chunk read back through the new codec and every column digest checked before
        # the copy takes the output's name.
        with open_trace(tmp, allow_incomplete=allow_incomplete) as copy:
            copy.verify()
    return out_path


def _copy_group(src: Any, dst: Any, codec: Compression) -> None:
    for name, value in src.attrs.items():
        dst.attrs[name] = value
    for name, item in src.items():
        if isinstance(item, h5py.Group):
            _copy_group(item, dst.create_group(name), codec)
        elif item.chunks and set(item._filters) - _NOT_CODECS:
            _recode(item, dst, name, codec)
        else:
            src.copy(item, dst, name=name)


def _recode(ds: Any, dst: Any, name: str, codec: Compression) -> None:
    out = dst.create_dataset(
        name,
        shape=ds.shape,
        maxshape=ds.maxshape,
        dtype=ds.dtype,
        chunks=ds.chunks,
        fletcher32=ds.fletcher32,
        **filter_options(codec),
    )
    for lo in range(0, ds.shape[0], _COPY_ROWS):
        hi = min(ds.shape[0], lo + _COPY_ROWS)
        out[lo:hi] = ds[lo:hi]
    for key, value in ds.attrs.items():
        out.attrs[key] = value
