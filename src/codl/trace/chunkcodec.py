"""HDF5's shuffle + deflate + fletcher32 filter pipeline, done in Python for whole chunks.

The trace writer compresses its columns' chunks itself and hands HDF5 the finished bytes
(``write_direct_chunk``): zlib and hashlib release the GIL, so the columns of a block compress
on all cores at once, where HDF5's own filter pipeline runs one chunk at a time in the calling
thread. The bytes are exactly what HDF5's filters would store for the dataset's declared
pipeline (shuffle, deflate, fletcher32, in that order), so every HDF5 reader - h5py, C, Julia
- reads the file as before and checks the same checksums.
"""

from __future__ import annotations

import zlib
from typing import Any, Final

import numpy as np
import numpy.typing as npt

# HDF5's H5_checksum_fletcher32 folds its sums every 360 16-bit words.
_FLETCHER_BLOCK_WORDS: Final = 360


def shuffle(values: npt.NDArray[Any]) -> bytes:
    """HDF5's shuffle filter: byte k of every element, for k = 0 .. itemsize-1, in turn."""
    a = np.ascontiguousarray(values)
    if a.itemsize == 1:
        return a.tobytes()
    return a.view(np.uint8).reshape(-1, a.itemsize).T.tobytes()


def _fold(x: int) -> int:
    return (x & 0xFFFF) + (x >> 16)


def fletcher32(data: bytes) -> int:
    """HDF5's ``H5_checksum_fletcher32`` of ``data``, bit for bit.

    Its sums are folded to 16 bits every 360 big-endian 16-bit words (not reduced modulo
    65535), so the block sums are computed with numpy and the folds replayed per block.
    """
    n_words = len(data) // 2
    words = np.frombuffer(data, dtype=">u2", count=n_words).astype(np.int64)
    full, tail = divmod(n_words, _FLETCHER_BLOCK_WORDS)
    if tail:
        # The short last block, padded with zeros at its start: there they add nothing to
        # either sum, and each real word keeps its weight (the words from it to the end).
        lead = np.zeros(_FLETCHER_BLOCK_WORDS - tail, np.int64)
        words = np.concatenate([words[: full * _FLETCHER_BLOCK_WORDS], lead, words[-tail:]])
    blocks = words.reshape(-1, _FLETCHER_BLOCK_WORDS)
    weights = np.arange(_FLETCHER_BLOCK_WORDS, 0, -1, dtype=np.int64)
    block_sum = blocks.sum(axis=1).tolist()
    block_weighted = (blocks @ weights).tolist()
    lengths = [_FLETCHER_BLOCK_WORDS] * full + ([tail] if tail else [])
    sum1 = sum2 = 0
    for s, w, t in zip(block_sum, block_weighted, lengths, strict=True):
        # Over a block of t words: sum1 gains the words; sum2 gains t copies of the block's
        # starting sum1 plus each word times its weight. uint32 arithmetic, as in C.
        sum2 = _fold((sum2 + t * sum1 + w) & 0xFFFFFFFF)
        sum1 = _fold((sum1 + s) & 0xFFFFFFFF)
    if len(data) % 2:
        sum1 += data[-1] << 8
        sum2 += sum1
        sum1, sum2 = _fold(sum1), _fold(sum2)
    sum1, sum2 = _fold(sum1), _fold(sum2)
    return ((sum2 << 16) | sum1) & 0xFFFFFFFF


def encode_chunk(values: npt.NDArray[Any], chunk_rows: int, level: int) -> bytes:
    """The stored bytes of one chunk of ``chunk_rows`` elements holding ``values`` (fewer at a
    dataset's edge: the rest is zeros, HDF5's fill value) through shuffle, deflate at
    ``level`` and fletcher32."""
    if len(values) < chunk_rows:
        full = np.zeros(chunk_rows, dtype=values.dtype)
        full[: len(values)] = values
        values = full
    packed = zlib.compress(shuffle(values), level)
    return packed + fletcher32(packed).to_bytes(4, "little")
