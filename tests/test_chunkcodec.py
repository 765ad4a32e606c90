"""The writer's own shuffle + deflate + fletcher32: byte for byte what HDF5's filters store."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from codl.trace import chunkcodec


@pytest.mark.parametrize("length", [1, 2, 3, 719, 720, 721, 1001, 65537])
def test_fletcher32_is_hdf5s(tmp_path: Path, length: int) -> None:
    # Lengths around HDF5's 360-word fold and odd ones; bytes up to 0xff make the folds carry.
    data = np.random.default_rng(length).integers(200, 256, length).astype(np.uint8)
    with h5py.File(tmp_path / "f.h5", "w") as f:
        ds = f.create_dataset("x", data=data, chunks=(length,), fletcher32=True)
        _, stored = ds.id.read_direct_chunk((0,))
    assert stored[:-4] == data.tobytes()
    assert chunkcodec.fletcher32(data.tobytes()).to_bytes(4, "little") == stored[-4:]


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64])
@pytest.mark.parametrize("rows", [1000, 4096])
def test_encoded_chunks_are_what_hdf5_stores_and_reads(
    tmp_path: Path, dtype: type, rows: int
) -> None:
    chunk = 4096
    values = np.random.default_rng(rows).integers(-(2**14), 2**14, rows).astype(dtype)
    kw = {"chunks": (chunk,), "maxshape": (None,), "compression": "gzip", "shuffle": True}
    kw["compression_opts"] = 1
    with h5py.File(tmp_path / "f.h5", "w") as f:
        ref = f.create_dataset("ref", shape=(rows,), dtype=dtype, fletcher32=True, **kw)
        ref[:] = values
        _, stored = ref.id.read_direct_chunk((0,))
        mine = chunkcodec.encode_chunk(values, chunk, 1)
        assert mine == stored
        direct = f.create_dataset("direct", shape=(rows,), dtype=dtype, fletcher32=True, **kw)
        direct.id.write_direct_chunk((0,), mine)
    with h5py.File(tmp_path / "f.h5", "r") as f:
        np.testing.assert_array_equal(f["direct"][()], values)
