"""HDF5's shuffle + deflate + fletcher32 filter pipeline, done in Python for whole chunks.

The trace writer compresses its columns' chunks itself and hands HDF5 the finished bytes
(``write_direct_chunk``): zlib and hashlib release the GIL, so the columns of a block compress
on all cores at once, where HDF5's own filter pipeline runs one chunk at a time in the calling
thread. The bytes are what the dataset's declared pipeline (shuffle, deflate, fletcher32, in
that order) expects: HDF5's shuffle, a standard zlib stream, HDF5's fletcher32, so every HDF5
reader - h5py, C, Julia - reads the file as before and checks the same checksums. Only the
deflate stream differs from the one HDF5 would write: byte planes that are noise go in stored
blocks instead of being compressed for nothing (``deflate_planes``).

Hand-written rather than numcodecs' C ``Shuffle`` and ``Fletcher32``, for a measured reason
(``benchmarks/chunkcodec_cost.py``, CPU time per 0.5 MiB chunk on the 2-core CI machine, two
runs): the numpy shuffle costs no more (0.19-0.21 ms against numcodecs' 0.25-0.52 ms), numcodecs'
fletcher32 saves 0.05-0.15 ms of a chunk's 1.0-3.1 ms, and ``encode_chunk`` with numcodecs' pair
is no cheaper (1.43-1.81 against 1.58-1.63 ms for int64 timestamps; within 5 % for the int32
columns), with identical stored bytes. A dependency for no gain, and numcodecs' fletcher32 holds
the GIL, which the writer's thread pool relies on the pipeline to release. ``deflate_planes`` has
no library equivalent: on timestamps it costs 1.0-1.2 ms where one zlib stream at level 1 (HDF5's
filter, numcodecs' Zlib) costs 4.0 ms, at +4 % bytes.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import numpy.typing as npt


def shuffle(values: npt.NDArray[Any]) -> bytes:
    """HDF5's shuffle filter: byte k of every element, for k = 0 .. itemsize-1, in turn."""
    a = np.ascontiguousarray(values)
    if a.itemsize == 1:
        return a.tobytes()
    octets = a.view(np.uint8).reshape(-1, a.itemsize)
    # One strided copy per byte plane: twice as fast as a transposed copy of the whole.
    planes = np.empty((a.itemsize, len(a)), dtype=np.uint8)
    for k in range(a.itemsize):
        planes[k] = octets[:, k]
    return planes.tobytes()


def unshuffle(raw: bytes, dtype: np.dtype[Any], rows: int) -> npt.NDArray[Any]:
    """The inverse of ``shuffle``: ``rows`` values of ``dtype`` from their byte planes."""
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(dtype.itemsize, rows)
    octets = np.empty((rows, dtype.itemsize), dtype=np.uint8)
    for k in range(dtype.itemsize):
        octets[:, k] = planes[k]
    return octets.view(dtype).reshape(rows)


def _fletcher_sum(x: int) -> int:
    # HDF5 folds its sums (x & 0xffff) + (x >> 16), which keeps them congruent modulo 65535
    # and positive once positive; its final fold lands in 1..65535 (0 only for all-zero data).
    return 0 if x == 0 else (x - 1) % 65535 + 1


def fletcher32(data: bytes) -> int:
    """HDF5's ``H5_checksum_fletcher32`` of ``data``, bit for bit.

    HDF5 sums big-endian 16-bit words (an odd last byte as the high byte of one more word),
    folding both sums every 360 words; 360 keeps its uint32 sums from overflowing, so the
    result is the exact sums reduced as ``_fletcher_sum`` says, computed here without a loop.
    """
    n_words = len(data) // 2
    words = np.frombuffer(data, dtype=">u2", count=n_words).astype(np.int64)
    if len(data) % 2:
        words = np.append(words, data[-1] << 8)
    weights = np.arange(len(words), 0, -1, dtype=np.int64)
    # Bounded by 2**63: a word is < 2**16 and a chunk (<= 2**20 words) squared is 2**40.
    sum1 = int(words.sum())
    sum2 = int(words @ weights)
    return (_fletcher_sum(sum2) << 16) | _fletcher_sum(sum1)


# A byte plane whose first 4 KiB deflate to no fewer bytes is stored, not compressed: the low
# bytes of timestamps and durations are noise that deflate keeps at 100 % of its size while
# spending ~40 % of a chunk's compression time on it (docs/design.md, "Trace storage"). Planes
# that compress only over longer spans (a timestamp's second byte) already gain within 4 KiB.
_PROBE_BYTES = 4096
# The zlib stream header of deflate with a 32 KiB window (RFC 1950), and the empty final block.
_ZLIB_HEADER = b"\x78\x01"
_FINAL_BLOCK = zlib.compressobj(1, zlib.DEFLATED, -15).flush()


def _is_noise(plane: bytes) -> bool:
    probe = plane[:_PROBE_BYTES]
    return len(zlib.compress(probe, 1)) >= len(probe)


def deflate_planes(data: bytes, itemsize: int, level: int) -> bytes:
    """A zlib stream of shuffled ``data`` that deflates each byte plane at ``level`` unless it is
    noise (``_is_noise``), which goes in stored blocks (a copy, at no cost in size).

    Each plane is its own run of deflate blocks ending in a sync flush (no reference reaches
    into another), so any inflater, HDF5's deflate filter among them, reads the whole stream.
    """
    plane_bytes = max(1, len(data) // itemsize)
    noise = [_is_noise(data[lo : lo + plane_bytes]) for lo in range(0, len(data), plane_bytes)]
    parts = [_ZLIB_HEADER]
    lo = 0
    while lo < len(noise):
        # Neighbouring planes of one kind share a run: the zero high bytes of a column are one
        # long repeat for deflate, as in a single stream.
        hi = lo + 1
        while hi < len(noise) and noise[hi] == noise[lo]:
            hi += 1
        packer = zlib.compressobj(0 if noise[lo] else level, zlib.DEFLATED, -15)
        parts.append(packer.compress(data[lo * plane_bytes : hi * plane_bytes]))
        parts.append(packer.flush(zlib.Z_SYNC_FLUSH))
        lo = hi
    parts.append(_FINAL_BLOCK)
    parts.append(zlib.adler32(data).to_bytes(4, "big"))
    return b"".join(parts)


def encode_chunk(values: npt.NDArray[Any], chunk_rows: int, level: int) -> bytes:
    """The stored bytes of one chunk of ``chunk_rows`` elements holding ``values`` (fewer at a
    dataset's edge: the rest is zeros, HDF5's fill value) through shuffle, deflate at
    ``level`` (``deflate_planes``) and fletcher32."""
    if len(values) < chunk_rows:
        full = np.zeros(chunk_rows, dtype=values.dtype)
        full[: len(values)] = values
        values = full
    packed = deflate_planes(shuffle(values), values.dtype.itemsize, level)
    return packed + fletcher32(packed).to_bytes(4, "little")


class ChunkChecksumError(ValueError):
    """A stored chunk's fletcher32 does not match its bytes."""


def decode_chunk(stored: bytes, dtype: np.dtype[Any], chunk_rows: int) -> npt.NDArray[Any]:
    """The ``chunk_rows`` values of a chunk stored through shuffle, deflate and fletcher32: the
    checksum checked (ChunkChecksumError), inflated (zlib.error if damaged), unshuffled."""
    body, check = stored[:-4], stored[-4:]
    if len(stored) < 4 or fletcher32(body).to_bytes(4, "little") != check:
        raise ChunkChecksumError("fletcher32 checksum mismatch")
    raw = zlib.decompress(body)
    if len(raw) != chunk_rows * dtype.itemsize:
        raise ChunkChecksumError(
            f"chunk inflates to {len(raw)} bytes, expected {chunk_rows * dtype.itemsize}"
        )
    return unshuffle(raw, dtype, chunk_rows)
