"""Throughput and size of the HDF5 trace store, per compression filter.

Writes N synthetic loader events (``events/loader``, 10 columns) in batches with ``TraceWriter``,
reads them back with ``Trace.table`` and reports events/s both ways and bytes per event, for every
codec the writer has (``store.COMPRESSIONS``); with ``benchmarks/long_trace.py`` it is what chose
``store.DEFAULT_COMPRESSION``. Re-run it when the store or the h5py/HDF5/hdf5plugin pins change.

    .venv/bin/python benchmarks/trace_store.py [--events 10000000] [--csv PATH]
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import h5py
import numpy as np

from codl.analysis.columns import LOADER_STAGES
from codl.trace.store import COMPRESSIONS, Compression, TraceWriter, open_trace

DEFAULT_CSV = Path(__file__).parent / "results" / "trace_store.csv"


@dataclass(frozen=True)
class Result:
    compression: str
    load_avg_1m: float
    rows: int
    batch: int
    write_s: float
    read_s: float
    write_events_per_s: float
    write_events_per_cpu_s: float
    read_events_per_s: float
    file_bytes: int
    bytes_per_event: float


def synthetic_batch(rng: np.random.Generator, first: int, n: int) -> dict[str, object]:
    """One batch of plausible loader events: monotone times, few workers, cycling stages."""
    idx = np.arange(first, first + n, dtype=np.int64)
    worker = (idx % 8).astype(np.int16)
    # ~20 us apart with jitter, like 8 workers' stages interleaving; durations 5-500 us.
    start = 1_000_000_000_000 + idx * 20_000 + rng.integers(0, 5_000, n)
    stages = np.asarray(LOADER_STAGES, dtype=object)[idx % len(LOADER_STAGES)]
    return {
        "rank": np.zeros(n, dtype=np.int16),
        "step": (idx // 1024).astype(np.int32),
        "worker": worker,
        "pid": 40_000 + worker.astype(np.int64),
        "tid": 40_000 + worker.astype(np.int64),
        "cpu": rng.integers(0, 64, n).astype(np.int16),
        "item": idx,
        "stage": stages,  # as str, so interning is part of the measured cost
        "start_ns": start,
        "end_ns": start + rng.integers(5_000, 500_000, n),
    }


def _cpu() -> float:
    """CPU seconds of this process, all its threads (the writer compresses on several)."""
    t = os.times()
    return t.user + t.system


def run_one(directory: Path, compression: Compression, events: int, batch: int) -> Result:
    rng = np.random.default_rng(0)
    # Generated up front so that the timing is the store's, not numpy's.
    batches = [
        synthetic_batch(rng, first, min(batch, events - first)) for first in range(0, events, batch)
    ]
    path = directory / f"trace-{compression}.h5"
    load = os.getloadavg()[0]
    t, c = time.perf_counter(), _cpu()
    with TraceWriter(path, compression=compression) as w:
        for columns in batches:
            w.append("events/loader", columns)  # type: ignore[arg-type]
        w.finish()
    write_s = time.perf_counter() - t
    write_cpu = _cpu() - c
    del batches
    t = time.perf_counter()
    with open_trace(path) as trace:
        df = trace.table("events/loader")
    read_s = time.perf_counter() - t
    if len(df) != events:
        raise RuntimeError(f"{path}: read {len(df)} rows, wrote {events}")
    size = path.stat().st_size
    return Result(
        compression=compression,
        load_avg_1m=round(load, 2),
        rows=events,
        batch=batch,
        write_s=round(write_s, 3),
        read_s=round(read_s, 3),
        write_events_per_s=round(events / write_s),
        write_events_per_cpu_s=round(events / write_cpu),
        read_events_per_s=round(events / read_s),
        file_bytes=size,
        bytes_per_event=round(size / events, 2),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000, help="events per file")
    parser.add_argument("--batch", type=int, default=100_000, help="events per append()")
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="where to write results")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per filter; the fastest is reported"
    )
    parser.add_argument("--tmpdir", type=Path, default=None, help="where the trace files go")
    args = parser.parse_args(argv)
    if min(args.events, args.batch, args.repeat) <= 0:
        parser.error("--events, --batch and --repeat must be positive")

    runs: dict[str, list[Result]] = {c: [] for c in COMPRESSIONS}
    with tempfile.TemporaryDirectory(dir=args.tmpdir, prefix="codl-bench-") as tmp:
        for i in range(args.repeat):
            # Alternate the order so neither filter always runs on a cold page cache.
            order = COMPRESSIONS if i % 2 == 0 else COMPRESSIONS[::-1]
            for compression in order:
                runs[compression].append(run_one(Path(tmp), compression, args.events, args.batch))
    # Best of N: on a shared machine the noise only ever slows a run down.
    results = [
        Result(
            **{
                **asdict(rs[0]),
                "load_avg_1m": max(r.load_avg_1m for r in rs),
                "write_s": min(r.write_s for r in rs),
                "read_s": min(r.read_s for r in rs),
                "write_events_per_s": max(r.write_events_per_s for r in rs),
                "write_events_per_cpu_s": max(r.write_events_per_cpu_s for r in rs),
                "read_events_per_s": max(r.read_events_per_s for r in rs),
            }
        )
        for rs in runs.values()
    ]

    print(
        f"# {args.events:,} events/loader rows, batches of {args.batch:,}, best of {args.repeat}; "
        f"h5py {h5py.__version__}, "
        f"HDF5 {h5py.version.hdf5_version}, {platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'compression':<12} {'rows':>12} {'write ev/s':>12} {'write ev/CPU-s':>15} "
        f"{'read ev/s':>12} {'B/event':>8}"
    )
    for r in results:
        print(
            f"{r.compression:<12} {r.rows:>12,} {r.write_events_per_s:>12,} "
            f"{r.write_events_per_cpu_s:>15,} {r.read_events_per_s:>12,} {r.bytes_per_event:>8.2f}"
        )
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(asdict(results[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in results)
    print(f"# wrote {args.csv}")


if __name__ == "__main__":
    main()
