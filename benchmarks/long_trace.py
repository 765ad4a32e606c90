"""A synthetic long run through the streaming trace store: memory, write rate, size, summarize
rate and time-window query latency.

Generates ``--events`` events on the fly (CUDA runtime calls 70 %, loader stages 25 %, schedstat
samples 5 %, at ``--rate`` events per second of run time, i.e. 10^8 events is a ~1 h run),
appends them to a ``TraceWriter`` in batches, and reports:

- recorder memory: the writer's buffer bound and the process's RSS growth while writing;
- write rate (events/s over the time spent in ``append``/``finish`` only, not generation), and
  events per CPU-second of the writer (all its compression threads together), which does not
  depend on how many cores were idle;
- file size per event;
- summarize rate: ``chunked.read_summary``, what ``codl summarize`` and the workflow's rule
  read a trace with (every table verified, every byte hashed against its sha256, and reduced in
  the same pass), in one process and in one process of ``--processes`` decoding threads, in
  events/s and events per CPU-second; beside it the ns per event of reading the per-step
  columns alone (HDF5: decompression, checksums, copies), the floor of any reader;
- verify rate: ``Trace.verify`` alone (every byte read and hashed);
- the latency of a 1-second window query (``Trace.table(name, t0, t0 + 1 s)`` of all three
  tables), each of ``--windows`` random windows a round;

for each codec of ``--compression`` (by default Blosc/LZ4 and gzip, one after the other in one
run, side by side in the table), recorded through ``codl.measure`` (one CSV row per metric and
codec, with the machine, its load and the commit).

    .venv/bin/python benchmarks/long_trace.py [--events 100000000] [--csv PATH]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np

from codl.analysis import chunked
from codl.measure import Recorder
from codl.measure import table as render
from codl.trace.schema import TABLES
from codl.trace.store import COMPRESSIONS, TraceWriter, buffer_bound_bytes, open_trace

DEFAULT_CSV = Path(__file__).parent / "results" / "long_trace.csv"
SHARES = {"events/cuda": 0.70, "events/loader": 0.25, "samples/sched": 0.05}
STEP_NS = 100_000_000  # a 100 ms training step
T0 = 10**12
CUDA_NAMES = np.array(
    ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaEventRecord", "cudaStreamSynchronize"], object
)
STAGES = np.array(["fetch", "decode", "transform", "collate"], object)


def cpu_seconds() -> float:
    """CPU time of this process (every thread) and of its finished child processes."""
    own = os.times()
    return own.user + own.system + own.children_user + own.children_system


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _times(rng: np.random.Generator, lo: int, n: int, rate: float) -> np.ndarray:
    """Start times of events lo..lo+n of one table (nearly ordered, jittered)."""
    idx = np.arange(lo, lo + n, dtype=np.int64)
    return T0 + (idx * (1e9 / rate)).astype(np.int64) + rng.integers(0, 2_000, n)


def _batch(table: str, rng: np.random.Generator, lo: int, n: int, rate: float) -> dict[str, Any]:
    t = _times(rng, lo, n, rate)
    step = ((t - T0) // STEP_NS).astype(np.int32)
    small = rng.integers(0, 8, n)
    if table == "samples/sched":
        return {
            "t_ns": t,
            "rank": np.zeros(n, np.int16),
            "step": step,
            "pid": 4000 + small,
            "tid": 4000 + small,
            "run_ns": np.cumsum(rng.integers(0, 10**6, n)),
            "wait_ns": np.cumsum(rng.integers(0, 10**5, n)),
            "timeslices": np.arange(lo, lo + n),
            "voluntary": np.arange(lo, lo + n) // 3,
            "involuntary": np.arange(lo, lo + n) // 7,
            "cpu": small.astype(np.int16),
        }
    end = t + rng.integers(1_000, 50_000, n)
    if table == "events/cuda":
        return {
            "rank": np.zeros(n, np.int16),
            "step": step,
            "kind": np.full(n, 1, np.int32),  # interned "runtime" (see run)
            "name": 2 + (small % 4).astype(np.int32),
            "tid": np.full(n, 4000),
            "stream": np.full(n, -1),
            "correlation": np.arange(lo, lo + n),
            "start_ns": t,
            "end_ns": end,
        }
    return {
        "rank": np.zeros(n, np.int16),
        "step": step,
        "worker": small.astype(np.int16),
        "pid": 5000 + small,
        "tid": 5000 + small,
        "cpu": small.astype(np.int16),
        "item": np.arange(lo, lo + n) // 3,
        "stage": 6 + (np.arange(lo, lo + n) % 4).astype(np.int32),
        "start_ns": t,
        "end_ns": end,
    }


def batches(events: int, batch: int, rate: float) -> Iterator[tuple[str, dict[str, Any]]]:
    rng = np.random.default_rng(0)
    done = dict.fromkeys(SHARES, 0)
    goal = {t: round(events * s) for t, s in SHARES.items()}
    while any(done[t] < goal[t] for t in SHARES):
        for table, share in SHARES.items():
            n = min(round(batch * share), goal[table] - done[table])
            if n > 0:
                yield table, _batch(table, rng, done[table], n, rate * share)
                done[table] += n


def write(path: Path, args: argparse.Namespace, compression: str) -> tuple[float, float, float]:
    """Write the run; returns (seconds in the writer, its CPU seconds, RSS growth in bytes)."""
    base = rss_bytes()
    peak = base
    spent = cpu = 0.0
    with TraceWriter(path, compression=compression, threads=args.threads) as w:
        # The synthetic batches carry string codes; intern the strings at those codes.
        for s in ("runtime", *CUDA_NAMES, *STAGES):
            w.intern(str(s))
        for table, cols in batches(args.events, args.batch, args.rate):
            t, c = time.perf_counter(), cpu_seconds()
            w.append(table, cols)
            spent += time.perf_counter() - t
            cpu += cpu_seconds() - c
            peak = max(peak, rss_bytes())
        t, c = time.perf_counter(), cpu_seconds()
        w.finish()
        spent += time.perf_counter() - t
        cpu += cpu_seconds() - c
    return spent, cpu, peak - base


def summarize_rate(path: Path, events: int, threads: int) -> tuple[float, float]:
    """(events per second, events per CPU-second) of ``chunked.read_summary``: the trace
    verified and its big tables reduced in one pass, as ``codl summarize`` reads it."""
    t, c = time.perf_counter(), cpu_seconds()
    chunked.read_summary(path, threads=threads)
    return events / (time.perf_counter() - t), events / max(1e-9, cpu_seconds() - c)


def verify_rate(path: Path, events: int) -> tuple[float, float]:
    """(events per second, events per CPU-second) of ``Trace.verify``: every byte of every
    column read (HDF5's checksums) and hashed against its sha256, which ``codl summarize``
    does as it reads; the hashing runs on a thread beside the reading."""
    t, c = time.perf_counter(), cpu_seconds()
    with open_trace(path) as trace:
        trace.verify()
    return events / (time.perf_counter() - t), events / max(1e-9, cpu_seconds() - c)


def read_seconds(path: Path) -> tuple[int, float]:
    """(rows, seconds) of reading the per-step metrics' columns block by block into reused
    arrays, reducing and hashing nothing: the floor of reading what the summary uses."""
    rows, spent = 0, 0.0
    with open_trace(path) as t:
        for table, columns in chunked.STEP_TABLES.values():
            ranges = t.block_ranges(table)
            size = max((hi - lo for lo, hi in ranges), default=0)
            out = {
                c.name: np.empty(size, c.numpy_dtype) for c in TABLES[table] if c.name in columns
            }
            start = time.perf_counter()
            for lo, hi in ranges:
                t.read_rows(table, lo, hi, columns, out=out)
            spent += time.perf_counter() - start
            rows += sum(hi - lo for lo, hi in ranges)
    return rows, spent


def window_queries(path: Path, args: argparse.Namespace) -> tuple[list[float], list[int]]:
    rng = np.random.default_rng(1)
    run_ns = int(args.events / args.rate * 1e9)
    latencies, sizes = [], []
    with open_trace(path) as t:
        for _ in range(args.windows):
            t0 = T0 + int(rng.integers(0, max(1, run_ns - 10**9)))
            start = time.perf_counter()
            rows = sum(len(t.table(name, t0=t0, t1=t0 + 10**9)) for name in SHARES)
            latencies.append(time.perf_counter() - start)
            sizes.append(rows)
    return latencies, sizes


def run(rec: Recorder, directory: Path, args: argparse.Namespace, compression: str) -> None:
    """One codec's run, recorded: every metric a measurement of one round (the window query:
    one round per window), its target a setting so that the table shows it beside."""
    path = directory / f"long-{compression}.h5"
    rec.mark()
    write_s, write_cpu, growth = write(path, args, compression)
    size = path.stat().st_size
    rate_1, cpu_1 = summarize_rate(path, args.events, 1)
    read_rows, read_s = read_seconds(path)
    rate_t, cpu_t = summarize_rate(path, args.events, args.processes)
    verify, verify_cpu = verify_rate(path, args.events)
    query_s, query_rows = window_queries(path, args)
    path.unlink()  # two 10^8-event traces need not share the disk
    n = args.events

    def add(name: str, value: float, unit: str, target: str = "", how: str = "value") -> None:
        rec.add(name, [value], unit=unit, n=n, statistic=how, target=target,
                compression=compression)  # fmt: skip

    add("writer buffer bound", buffer_bound_bytes() / 2**20, "MiB", "bounded", "bound")
    add("RSS growth while writing", growth / 2**20, "MiB", "bounded", "peak - start")
    add("write rate", n / write_s, "events/s", ">= 10,000,000", "in append/finish")
    add("write, per CPU-s", n / write_cpu, "events/s", how="in append/finish, all threads")
    add("file size", size / n, "B/event", "<= 8")
    add("summarize, 1 process", rate_1, "events/s", ">= 50,000,000/core", "read_summary")
    add("  per CPU-s", cpu_1, "events/s", how="read_summary")
    add("  ns/event", 1e9 / rate_1, "ns", how="read_summary")
    add("read the columns alone", read_s / max(1, read_rows) * 1e9, "ns/event", how="read_rows")
    add(f"summarize, {args.processes} threads", rate_t, "events/s", how="read_summary")
    add(f"  per CPU-s ({args.processes} threads)", cpu_t, "events/s", how="read_summary")
    add("verify (every byte, sha256)", verify, "events/s", how="Trace.verify")
    add("  per CPU-s (verify)", verify_cpu, "events/s", how="Trace.verify")
    rec.add("1 s window query", query_s, unit="s", statistic="3 tables", target="< 1 s",
            compression=compression)  # fmt: skip
    rec.add("  rows per window", query_rows, unit="rows", statistic="3 tables",
            compression=compression)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000_000)
    parser.add_argument("--batch", type=int, default=1_000_000, help="events per round")
    parser.add_argument("--rate", type=float, default=30_000.0, help="events per run second")
    parser.add_argument(
        "--compression", nargs="+", choices=COMPRESSIONS, default=["blosc-lz4", "gzip"]
    )
    parser.add_argument(
        "--processes", type=int, default=os.cpu_count() or 1, help="decoding threads of a run"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="writer compression threads (default: cores)"
    )
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--tmpdir", type=Path, default=None)
    args = parser.parse_args(argv)
    if min(args.events, args.batch, args.processes, args.windows) <= 0 or args.rate <= 0:
        parser.error("--events, --batch, --rate, --processes and --windows must be positive")
    if args.threads is not None and args.threads <= 0:
        parser.error("--threads must be positive")
    rec = Recorder()
    with tempfile.TemporaryDirectory(dir=args.tmpdir, prefix="codl-long-") as tmp:
        for compression in args.compression:
            run(rec, Path(tmp), args, compression)
    print(
        f"# {args.events:,} events ({args.events / args.rate:,.0f} s of run at "
        f"{args.rate:,.0f} events/s); h5py {h5py.__version__}, HDF5 {h5py.version.hdf5_version}, "
        f"hdf5plugin {hdf5plugin.version}, writer threads {args.threads or 'cores'}"
    )
    print(render(rec.measurements, column="compression"))
    rec.write(args.csv)
    print(f"# wrote {args.csv}")


if __name__ == "__main__":
    main()
