"""Cost of recording exact scheduler events (trace.sched_events: ftrace sched_switch and
sched_waking in a private instance), per context switch, side by side with recording off.

Two processes on one CPU ping-pong a byte through two pipes: every round trip is two context
switches and two wake-ups, the events the recorder keeps. Rounds alternate off / on (the order
flips every round) and each round's ratio on/off of the median round-trip time is summarised as
the median over rounds with a bootstrap 95 % interval. Needs root (tracefs).

    python benchmarks/sched_events_cost.py --rounds 9 --trips 20000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from codl.measure import Recorder, bootstrap_median, table
from codl.trace.ftrace import SchedEventRecorder, SchedEventsUnavailableError


def pingpong(trips: int) -> float:
    """Median round-trip time (ns) of ``trips`` round trips, in batches of 100."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        for _ in range(trips):
            os.read(r1, 1)
            os.write(w2, b"x")
        os._exit(0)
    per_batch = []
    for _ in range(trips // 100):
        t0 = time.perf_counter_ns()
        for _ in range(100):
            os.write(w1, b"x")
            os.read(r2, 1)
        per_batch.append((time.perf_counter_ns() - t0) / 100)
    for _ in range(trips - 100 * (trips // 100)):
        os.write(w1, b"x")
        os.read(r2, 1)
    os.waitpid(pid, 0)
    for fd in (r1, w1, r2, w2):
        os.close(fd)
    return statistics.median(per_batch)


def one(recorded: bool, trips: int) -> tuple[float, int]:
    if not recorded:
        return pingpong(trips), 0
    rec = SchedEventRecorder(pids=(os.getpid(),), buffer_kb=65536)
    rec.start()
    try:
        ns = pingpong(trips)
        rec.stop()
        tables, info = rec.collect()
    finally:
        rec.close()
    if info["events_lost"]:
        print(f"warning: {info['events_lost']} events lost (buffer full)", file=sys.stderr)
    return ns, len(tables["events/sched_switch"]["t_ns"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--trips", type=int, default=20_000)
    p.add_argument("--csv", type=Path, default=Path("benchmarks/results/sched_events_cost.csv"))
    args = p.parse_args(argv)
    cpu = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {cpu})  # both processes on one CPU: every trip switches twice
    try:
        one(True, 100)
    except SchedEventsUnavailableError as exc:
        print(f"scheduler events unavailable here: {exc}", file=sys.stderr)
        return 1
    trips: dict[bool, list[float]] = {False: [], True: []}
    switches: list[int] = []
    rec = Recorder()
    for r in range(args.rounds):
        for recorded in (False, True) if r % 2 == 0 else (True, False):
            ns, events = one(recorded, args.trips)
            trips[recorded].append(ns)
            if recorded:
                switches.append(events)
    off, on = (
        rec.add("round trip", trips[k], unit="ns", n=args.trips, statistic="median batch of 100",
                recording="on" if k else "off")
        for k in (False, True)
    )  # fmt: skip
    ratio = rec.paired(on, off, "on / off")
    lo, hi = bootstrap_median(ratio.values)
    # Two switches (and two wake-ups) per round trip.
    added = rec.add(
        "added per switch",
        ((a - b) / 2 for a, b in zip(on.values, off.values, strict=True)),
        unit="ns",
        statistic="paired difference / 2",
    )
    rec.add("switches recorded", switches, unit="events", n=args.trips, statistic="per on-round")
    print(table(rec.measurements, column="recording", baseline="off"))
    print(
        f"ratio on/off: {ratio.describe()}, bootstrap 95 % [{lo:.3f}, {hi:.3f}]; "
        f"{added.median:.0f} ns added per context switch (with its wake-up)"
    )
    rec.write(args.csv)
    print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
