"""The writer's own shuffle + deflate + fletcher32: chunks HDF5's filters read as their own."""

from __future__ import annotations

import zlib
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
def test_encoded_chunks_are_read_by_hdf5_as_its_own(tmp_path: Path, dtype: type, rows: int) -> None:
    chunk = 4096
    # Timestamp-like: a noise low byte, a slowly varying second one, zero high bytes.
    rng = np.random.default_rng(rows)
    values = (np.arange(rows) * 7 + rng.integers(0, 256, rows)).astype(dtype)
    kw = {"chunks": (chunk,), "maxshape": (None,), "compression": "gzip", "shuffle": True}
    kw["compression_opts"] = 1
    with h5py.File(tmp_path / "f.h5", "w") as f:
        ref = f.create_dataset("ref", shape=(rows,), dtype=dtype, fletcher32=True, **kw)
        ref[:] = values
        _, stored = ref.id.read_direct_chunk((0,))
        mine = chunkcodec.encode_chunk(values, chunk, 1)
        # HDF5's shuffle (and its zero fill of an edge chunk), inflated from either stream.
        assert zlib.decompress(mine[:-4]) == zlib.decompress(stored[:-4])
        assert len(mine) <= 1.02 * len(stored) + 64
        direct = f.create_dataset("direct", shape=(rows,), dtype=dtype, fletcher32=True, **kw)
        direct.id.write_direct_chunk((0,), mine)
    with h5py.File(tmp_path / "f.h5", "r") as f:
        # HDF5 inflates the stream and checks its fletcher32 (a mismatch raises).
        np.testing.assert_array_equal(f["direct"][()], values)


def test_noise_planes_are_stored_and_the_rest_compressed() -> None:
    rows = 16384
    noise = np.random.default_rng(0).integers(0, 256, rows).astype(np.uint8)
    values = noise.astype(np.int64) + np.repeat(np.arange(rows // 256), 256) * 256
    shuffled = chunkcodec.shuffle(values)
    stream = chunkcodec.deflate_planes(shuffled, 8, 1)
    assert zlib.decompress(stream) == shuffled
    assert noise.tobytes() in stream  # plane 0 verbatim: stored, not deflated
    assert len(stream) < rows + rows // 4  # the other seven planes took little room
