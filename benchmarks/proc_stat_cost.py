"""Per-core CPU ticks: codl's own ``/proc/stat`` reader against psutil's ``cpu_times``.

``SchedSampler._sample_cores`` (``samples/cpu``, every step) reads ``/proc/stat`` with one
``pread`` of an fd it keeps open and parses the ``cpuN`` lines as bytes; the library way is
``psutil.cpu_times(percpu=True)``, which opens and parses the file as text on every call and
returns seconds (floats) that have to be turned back into the ticks the trace stores. Both are
timed here on the same machine, in alternating rounds, and checked to give the same ticks.

    python benchmarks/proc_stat_cost.py [--rounds 9] [--calls 5000] [--csv PATH]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import psutil

from codl.measure import Recorder, table
from codl.trace.sched import SchedSampler

DEFAULT_CSV = Path(__file__).parent / "results" / "proc_stat_cost.csv"
TICKS = os.sysconf("SC_CLK_TCK")


def psutil_rows() -> list[tuple[int, int, int, int, int, int]]:
    """(cpu, user, system, idle, iowait, other) ticks as samples/cpu stores them."""
    return [
        (
            i,  # psutil numbers the cpuN lines in order: the line's own N is not returned
            round(c.user * TICKS),
            round(c.system * TICKS),
            round(c.idle * TICKS),
            round(c.iowait * TICKS),
            round((c.nice + c.irq + c.softirq + c.steal) * TICKS),
        )
        for i, c in enumerate(psutil.cpu_times(percpu=True))
    ]


def codl_rows() -> SchedSampler:
    s = SchedSampler(per_thread=False, per_core=True)
    s._sample_cores(0, 0)
    return s


def agree() -> bool:
    """Both readers give the same ticks (read back to back; a tick may pass in between)."""
    for _ in range(20):
        s = codl_rows()
        mine = list(
            zip(
                s.cpu_rows["cpu"],
                s.cpu_rows["user"],
                s.cpu_rows["system"],
                s.cpu_rows["idle"],
                s.cpu_rows["iowait"],
                s.cpu_rows["other"],
                strict=True,
            )
        )
        s.close()
        if mine == psutil_rows():
            return True
    return False


def per_call_us(fn: object, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()  # type: ignore[operator]
    return (time.perf_counter_ns() - t0) / calls / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    args = ap.parse_args()
    sampler = SchedSampler(per_thread=False, per_core=True)

    def ours() -> None:
        sampler._sample_cores(0, 0)
        for col in sampler.cpu_rows.values():
            col.clear()  # keep memory flat over many calls

    times: dict[str, list[float]] = {"codl": [], "psutil": []}
    rec = Recorder()
    for r in range(args.rounds):
        order = [("codl", ours), ("psutil", psutil_rows)]
        if r % 2:
            order.reverse()
        for name, fn in order:
            times[name].append(per_call_us(fn, args.calls))
    sampler.close()
    cores = len(psutil.cpu_times(percpu=True))
    same = agree()
    codl, ps = (
        rec.add("per call", v, unit="us", n=args.calls, statistic="mean call", reader=k,
                cores=cores, same_ticks=same)
        for k, v in times.items()
    )  # fmt: skip
    # Rounds alternate the readers, so round i of each is a pair that saw the same drift.
    rec.paired(ps, codl, "psutil / codl")
    print(f"{cores} cpuN lines, same ticks: {same}")
    print(table(rec.measurements, column="reader", baseline="codl"))
    rec.write(args.csv)


if __name__ == "__main__":
    main()
