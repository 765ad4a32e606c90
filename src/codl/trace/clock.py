"""The run's single clock: CLOCK_MONOTONIC nanoseconds, tied to Unix time by anchor pairs.

Every level records ``time.monotonic_ns()`` (CLOCK_MONOTONIC on Linux, shared by all processes of
a node, so worker processes and ranks need no conversion). Unix-time sources (Kineto's
``baseTimeNanoseconds``, other nodes) are converted through an anchor: a (REALTIME, MONOTONIC)
pair read back to back. The pair with the tightest bracket out of several tries is kept and the
bracket width is stored as the anchor's error bound.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass


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
