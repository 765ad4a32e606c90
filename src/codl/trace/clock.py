"""The run's single clock: CLOCK_MONOTONIC nanoseconds, tied to Unix time by anchor pairs.

Every level records ``time.monotonic_ns()`` (CLOCK_MONOTONIC on Linux, shared by all processes of
a node, so worker processes and ranks need no conversion). Unix-time sources (Kineto's
``baseTimeNanoseconds``, other nodes) are converted through an anchor: a (REALTIME, MONOTONIC)
pair read back to back. The pair with the tightest bracket out of several tries is kept and the
bracket width is stored as the anchor's error bound.

Ranks on other nodes read other CLOCK_MONOTONICs. They measure their offset to rank 0 at the
start and end of the run (``exchange``, below) and the merge of the rank traces moves their times
onto rank 0's clock (``Alignment``), storing each rank's offset, drift and error bound.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt


def now_ns() -> int:
    return time.monotonic_ns()


@dataclass(frozen=True)
class Anchor:
    realtime_ns: int
    monotonic_ns: int
    error_ns: int

    def to_monotonic(self, realtime_ns: int) -> int:
        return realtime_ns - self.realtime_ns + self.monotonic_ns

    def to_realtime(self, monotonic_ns: int) -> int:
        return monotonic_ns - self.monotonic_ns + self.realtime_ns

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def take_anchor(tries: int = 16) -> Anchor:
    """Read REALTIME between two MONOTONIC reads; keep the narrowest bracket.

    The REALTIME read happened somewhere inside [m0, m1]; taking the midpoint bounds the error by
    half the bracket, usually well under a microsecond.
    """
    best: Anchor | None = None
    for _ in range(max(1, tries)):
        m0 = time.monotonic_ns()
        r = time.time_ns()
        m1 = time.monotonic_ns()
        cand = Anchor(realtime_ns=r, monotonic_ns=(m0 + m1) // 2, error_ns=(m1 - m0 + 1) // 2)
        if best is None or cand.error_ns < best.error_ns:
            best = cand
    if best is None:  # pragma: no cover - loop runs at least once
        raise RuntimeError("no anchor taken")
    return best


# --- Ranks on one clock ---------------------------------------------------------------------
#
# Ranks of one node read one CLOCK_MONOTONIC; ranks of different nodes do not (each node's
# counts from its own boot), and tying them through CLOCK_REALTIME only inherits NTP's error
# (0.1-10 ms). So the ranks measure their offset to rank 0 themselves, over the process group,
# NTP-style: rank r stamps t0 and sends, rank 0 stamps t1 on receipt and t2 before replying, r
# stamps t3 on the reply. The message arrives after it was sent and the reply after it left,
# so for the offset o = clock_r - clock_0 causality alone gives
#     t1 >= t0 - o  and  t2 <= t3 - o,   i.e.  o in [t0 - t1, t3 - t2],
# an interval of width (t3 - t0) - (t2 - t1), the round trip minus rank 0's turnaround. Its
# midpoint is the estimate and half its width (plus the granularity of a clock read) a hard
# bound; the round with the shortest round trip (least queueing) gives the tightest one.

CLOCK_ROUNDS = 64
# Rounds run but not kept: the first exchanges set up connections and fault in code paths.
CLOCK_WARMUP_ROUNDS = 8
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_TIME_NS = "/proc/self/ns/time"


def clock_identity() -> str:
    """Names the CLOCK_MONOTONIC this process reads: kernel boot + time namespace.

    Two processes with the same identity read the very same clock (offset exactly 0); a time
    namespace (``unshare --time``) shifts CLOCK_MONOTONIC by a constant, and a different boot is
    a different node (or a different kernel run of it).
    """
    try:
        boot = Path(_BOOT_ID).read_text().strip()
    except OSError:
        boot = "?"
    try:
        # "time:[4026531834]"; absent before Linux 5.6, where no time namespace can shift it.
        namespace = os.readlink(_TIME_NS)
    except OSError:
        namespace = "time:?"
    return f"{boot} {namespace}"


def clock_granularity_ns() -> int:
    """The resolution of one CLOCK_MONOTONIC read (at least 1 ns)."""
    return max(1, round(time.clock_getres(time.CLOCK_MONOTONIC) * 1e9))


@dataclass(frozen=True)
class ClockSample:
    """One exchange's estimate of this rank's clock against rank 0's.

    ``offset_ns`` is this clock minus rank 0's (a time ``t`` here is ``t - offset_ns`` on rank
    0's clock), true to within ``bound_ns``; ``at_ns`` is when it was measured, on this clock.
    """

    offset_ns: int
    bound_ns: int
    at_ns: int
    rtt_ns: int
    rounds: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClockSample:
        return cls(**{k: int(d[k]) for k in ("offset_ns", "bound_ns", "at_ns", "rtt_ns", "rounds")})


def best_sample(stamps: Sequence[tuple[int, int, int, int]], granularity_ns: int) -> ClockSample:
    """The estimate from the round with the smallest round trip, out of (t0, t1, t2, t3) stamps
    (t0, t3 on this clock; t1, t2 on rank 0's)."""
    if not stamps:
        raise ValueError("no clock exchange rounds to estimate from")
    t0, t1, t2, t3 = min(stamps, key=lambda s: (s[3] - s[0]) - (s[2] - s[1]))
    lo, hi = t0 - t1, t3 - t2
    return ClockSample(
        offset_ns=(lo + hi) // 2,
        bound_ns=(hi - lo + 1) // 2 + granularity_ns,
        at_ns=(t0 + t3) // 2,
        rtt_ns=t3 - t0,
        rounds=len(stamps),
    )


def exchange(group: Any, rank: int, world: int, rounds: int = CLOCK_ROUNDS) -> ClockSample:
    """Measure this rank's clock against rank 0's over ``group`` (a CPU/gloo process group).

    Collective in effect: every rank of the group must call it. Rank 0 answers the other ranks
    one after the other; each of them keeps its own estimate (rank 0's is exactly 0).
    """
    import torch
    import torch.distributed as dist

    buf = torch.zeros(2, dtype=torch.int64)
    total = rounds + CLOCK_WARMUP_ROUNDS
    if rank == 0:
        for peer in range(1, world):
            for _ in range(total):
                dist.recv(buf, src=peer, group=group)
                t1 = time.monotonic_ns()
                buf[0] = t1
                t2 = time.monotonic_ns()
                buf[1] = t2
                dist.send(buf, dst=peer, group=group)
        t = time.monotonic_ns()
        return ClockSample(offset_ns=0, bound_ns=0, at_ns=t, rtt_ns=0, rounds=0)
    stamps: list[tuple[int, int, int, int]] = []
    for i in range(total):
        t0 = time.monotonic_ns()
        dist.send(buf, dst=0, group=group)
        dist.recv(buf, src=0, group=group)
        t3 = time.monotonic_ns()
        if i >= CLOCK_WARMUP_ROUNDS:
            stamps.append((t0, int(buf[0]), int(buf[1]), t3))
    return best_sample(stamps, clock_granularity_ns())


@dataclass(frozen=True)
class Alignment:
    """How to put one rank's times on rank 0's clock: ``aligned = t - offset(t)``.

    ``same_clock``: the rank read rank 0's very clock (same boot and time namespace), so the
    offset is exactly 0 whatever the exchange measured (its estimate then shows the method's
    error). Otherwise the offset is the start exchange's, moved linearly to the end exchange's
    (clock drift) when both exist; ``bound_ns`` bounds its error between the two exchanges.
    """

    rank: int
    same_clock: bool
    start: ClockSample | None
    end: ClockSample | None

    @property
    def drift_ppb(self) -> float:
        s, e = self.start, self.end
        if self.same_clock or s is None or e is None or e.at_ns == s.at_ns:
            return 0.0
        return (e.offset_ns - s.offset_ns) / (e.at_ns - s.at_ns) * 1e9

    @property
    def offset_ns(self) -> int:
        """The offset at the start exchange (0 on a shared clock)."""
        return 0 if self.same_clock or self.start is None else self.start.offset_ns

    @property
    def bound_ns(self) -> int:
        """The error bound of the aligned times; -1 when nothing was measured (not aligned)."""
        if self.same_clock:
            return 0
        return max((s.bound_ns for s in (self.start, self.end) if s is not None), default=-1)

    @property
    def measured(self) -> bool:
        return self.same_clock or self.start is not None

    def offset_at(self, t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The offset (ns) to subtract from each time ``t`` of this rank."""
        if self.same_clock or self.start is None:
            return np.zeros_like(t)
        slope = self.drift_ppb / 1e9
        rel = (t - self.start.at_ns).astype(np.float64)
        return (self.start.offset_ns + np.rint(rel * slope)).astype(np.int64)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "same_clock": self.same_clock,
            "offset_ns": self.offset_ns,
            "drift_ppb": self.drift_ppb,
            "bound_ns": self.bound_ns,
            "start": None if self.start is None else self.start.as_dict(),
            "end": None if self.end is None else self.end.as_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Alignment:
        return cls(
            rank=int(d["rank"]),
            same_clock=bool(d["same_clock"]),
            start=None if d.get("start") is None else ClockSample.from_dict(d["start"]),
            end=None if d.get("end") is None else ClockSample.from_dict(d["end"]),
        )


def alignment_of(rank: int, sync: Mapping[str, Any] | None, rank0_clock: str) -> Alignment:
    """The alignment of ``rank`` from the ``clock_sync`` attribute its run wrote."""
    sync = sync or {}
    same = rank == 0 or (bool(rank0_clock) and sync.get("clock_id") == rank0_clock)
    start, end = sync.get("start"), sync.get("end")
    return Alignment(
        rank=rank,
        same_clock=same,
        start=ClockSample.from_dict(start) if isinstance(start, Mapping) else None,
        end=ClockSample.from_dict(end) if isinstance(end, Mapping) else None,
    )


def rank_bounds(attrs: Mapping[str, Any]) -> dict[int, int] | None:
    """Per rank, the error bound (ns) of its times on the merged trace's clock; None when the
    trace's ranks were not put on one clock (single rank, or written before alignment)."""
    info = attrs.get("clock_alignment")
    if not isinstance(info, Mapping) or not info.get("applied"):
        return None
    return {int(a["rank"]): int(a["bound_ns"]) for a in info.get("ranks", [])}


# Columns of the trace schema that are points in time (not durations): the ones alignment moves.
TIME_COLUMNS = frozenset({"start_ns", "end_ns", "t_ns"})
