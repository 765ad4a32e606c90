"""CPU cost of the gzip writer's chunk pipeline (``codl.trace.chunkcodec``) against numcodecs'
C codecs: HDF5's shuffle and fletcher32 per 0.5 MiB chunk, ``encode_chunk`` whole with either
pair, and ``deflate_planes`` against one plain zlib stream (what HDF5's deflate filter or
numcodecs' Zlib would write), for the column kinds a trace holds. CPU time of this process
(``process_time``), so other load on the machine does not count; the stored bytes of both
pipelines are checked equal.

numcodecs is not a codl dependency: ``pip install numcodecs`` to run this.

    python benchmarks/chunkcodec_cost.py [--repeats 30] [--csv PATH]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from codl.trace import chunkcodec

DEFAULT_CSV = Path(__file__).parent / "results" / "chunkcodec_cost.csv"


def columns() -> dict[str, np.ndarray[Any, Any]]:
    """One chunk of each kind of column the writer compresses (chunk_rows of each dtype)."""
    rng = np.random.default_rng(0)
    return {
        "timestamps_int64": (7 * 10**12 + np.cumsum(rng.integers(100, 5000, 65536))).astype(
            np.int64
        ),
        "steps_int32": np.repeat(np.arange(1024, dtype=np.int32), 128),
        "symbols_int32": rng.integers(0, 5, 131072).astype(np.int32),
    }


def cpu_ms(fn: Callable[[], object], repeats: int) -> float:
    t = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - t) / repeats * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    args = ap.parse_args()
    try:
        from numcodecs import Fletcher32, Shuffle
    except ImportError:
        sys.exit("chunkcodec_cost.py needs numcodecs: pip install numcodecs (no codl dependency)")
    f32 = Fletcher32()

    def nc_shuffle(values: np.ndarray[Any, Any]) -> bytes:
        a = np.ascontiguousarray(values)
        return a.tobytes() if a.itemsize == 1 else bytes(Shuffle(a.itemsize).encode(a))

    def nc_fletcher32(data: bytes) -> int:
        return int.from_bytes(bytes(f32.encode(np.frombuffer(data, np.uint8))[-4:]), "little")

    ours = (chunkcodec.shuffle, chunkcodec.fletcher32)
    rows = []
    for name, a in columns().items():
        shuffled = chunkcodec.shuffle(a)
        packed = chunkcodec.deflate_planes(shuffled, a.itemsize, 1)
        row: dict[str, object] = {"column": name, "rows": len(a), "bytes": a.nbytes}
        row["shuffle_ms"] = cpu_ms(lambda a=a: chunkcodec.shuffle(a), args.repeats)
        row["shuffle_numcodecs_ms"] = cpu_ms(lambda a=a: nc_shuffle(a), args.repeats)
        row["fletcher32_ms"] = cpu_ms(lambda p=packed: chunkcodec.fletcher32(p), args.repeats)
        row["fletcher32_numcodecs_ms"] = cpu_ms(lambda p=packed: nc_fletcher32(p), args.repeats)
        row["deflate_planes_ms"] = cpu_ms(
            lambda s=shuffled, k=a.itemsize: chunkcodec.deflate_planes(s, k, 1), args.repeats
        )
        # What any other pipeline (HDF5's own filter, numcodecs' Zlib) does: one zlib stream.
        row["zlib_level1_ms"] = cpu_ms(lambda s=shuffled: zlib.compress(s, 1), args.repeats)
        row["deflate_planes_bytes"] = len(packed)
        row["zlib_level1_bytes"] = len(zlib.compress(shuffled, 1))
        same = nc_shuffle(a) == shuffled and nc_fletcher32(packed) == chunkcodec.fletcher32(packed)
        row["encode_chunk_ms"] = cpu_ms(
            lambda a=a: chunkcodec.encode_chunk(a, len(a), 1), args.repeats
        )
        chunkcodec.shuffle, chunkcodec.fletcher32 = nc_shuffle, nc_fletcher32  # type: ignore[assignment]
        try:
            stored = chunkcodec.encode_chunk(a, len(a), 1)
            row["encode_chunk_numcodecs_ms"] = cpu_ms(
                lambda a=a: chunkcodec.encode_chunk(a, len(a), 1), args.repeats
            )
        finally:
            chunkcodec.shuffle, chunkcodec.fletcher32 = ours
        row["same_bytes"] = same and stored == chunkcodec.encode_chunk(a, len(a), 1)
        rows.append(row)
    keys = list(rows[0])
    print(f"{'column':18}" + "".join(f"{k.removesuffix('_ms'):>26}" for k in keys[3:]))
    for r in rows:
        cells = (
            f"{v:26.3f}" if isinstance(v, float) else f"{v!s:>26}" for v in list(r.values())[3:]
        )
        print(f"{r['column']!s:18}" + "".join(cells))
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as fh:
        w = csv.DictWriter(fh, keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()})


if __name__ == "__main__":
    main()
